#!/usr/bin/env python3
"""The PyTorch part of scripts/device-check.sh: what a real serving stack calls, against
torch.profiler's ground truth, on a machine with an NVIDIA GPU.

    device_check_torch.py LIBCUDA METRICS_URL OUT_DIR

1. Whether cuGetProcAddress_v2 hands out the dlsym address of every probed entry point, with and
   without the per-thread default-stream flag (if not, calls through it reach no probe).
2. Under the `cudatrace run` serving METRICS_URL (started by device-check.sh with top_kernels
   high enough to name every kernel), four workloads, each in its own process, each phase
   measured as the difference of two scrapes around it and compared with torch.profiler's
   trace of the same phase:
   - eager: matmuls and element-wise kernels, a synchronize per iteration;
   - graph: a CUDA graph of 50 kernels, captured while traced, replayed 1,000 times;
   - vllm: vLLM's loop: kernels, a non-blocking copy to pinned memory, event record, event
     synchronize;
   - cpu: `.cpu()` copies (an asynchronous copy, then a wait on its stream).
   Checked: kernel runs and copies within 1% of the profiler's counts, kernel names matched for
   at least 95% of runs, batch_span between 0.8 and 1.3 of the profiler's kernel (and copy) time;
   NVML's per-process SM utilization (as cudatrace samples it) reported beside them.
Prints one JSON object per check and writes OUT_DIR/torch.json; exits 1 when a check fails.
"""
import ctypes
import json
import multiprocessing as mp
import re
import sys
import time
import urllib.request

PER_THREAD = 2  # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} ([0-9.eE+-]+|NaN)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def probed_symbols():
    text = open("tracer-common/src/api.rs").read()
    return sorted(set(re.findall(r'= "(cu[A-Za-z0-9_]+)":', text)))


def proc_address_check(lib):
    cuda = ctypes.CDLL(lib)
    assert cuda.cuInit(0) == 0, "cuInit failed"
    get = cuda.cuGetProcAddress_v2
    get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                    ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
    version = ctypes.c_int()
    cuda.cuDriverGetVersion(ctypes.byref(version))
    rows = []
    for name in probed_symbols():
        try:
            exported = ctypes.cast(getattr(cuda, name), ctypes.c_void_p).value
        except AttributeError:
            exported = None
        # The runtime asks by the plain name; with the flag it gets the _ptsz/_ptds variant.
        plain = re.sub(r'_(ptsz|ptds)$', '', name)
        flags = PER_THREAD if plain != name else 0
        pfn, status = ctypes.c_void_p(), ctypes.c_int(-1)
        rc = get(plain.encode(), ctypes.byref(pfn), version.value, flags, ctypes.byref(status))
        rows.append({"symbol": name, "asked": plain, "flags": flags, "rc": rc,
                     "status": status.value, "dlsym": exported, "proc_address": pfn.value,
                     "same": exported is not None and pfn.value == exported})
    found = [r for r in rows if r["dlsym"] is not None and r["rc"] == 0]
    # What the driver does is reported, not judged: where it differs, cudatrace names the
    # entry points (cudatrace_unprobed_entry_points) and the workloads below show the cost.
    return {"check": "cuGetProcAddress_v2 against dlsym", "driver_version": version.value,
            "exported": len(found), "same": sum(r["same"] for r in found),
            "different": [r["symbol"] for r in found if not r["same"]], "ok": True, "rows": rows}


def scrape(url, pid):
    """Sums per metric (with a few labels kept) of process `pid`."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {"runs": {}, "calls": {}, "span": 0.0, "wait": 0.0, "replays": {}, "nvml_sm": None}
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), dict(LABEL.findall(m.group(2))), float(m.group(3))
        if labels.get("pid") != str(pid):
            continue
        if name == "cudatrace_kernel_runs_total":
            out["runs"][labels["kernel"]] = out["runs"].get(labels["kernel"], 0) + value
        elif name == "cudatrace_calls_total":
            key = labels["kind"]
            out["calls"][key] = out["calls"].get(key, 0) + value
        elif name == "cudatrace_device_time_seconds_total":
            out["span" if labels["measure"] == "batch_span" else "wait"] += value
        elif name == "cudatrace_graph_replays_total":
            out["replays"][labels["composition"]] = value
        elif name == "cudatrace_gpu_process_sm_utilization_ratio":
            out["nvml_sm"] = max(out["nvml_sm"] or 0.0, value)
    return out


def minus(after, before):
    runs = {k: v - before["runs"].get(k, 0) for k, v in after["runs"].items()}
    return {"runs": {k: v for k, v in runs.items() if v > 0},
            "calls": {k: v - before["calls"].get(k, 0) for k, v in after["calls"].items()},
            "span": after["span"] - before["span"], "wait": after["wait"] - before["wait"],
            "replays": {k: v - before["replays"].get(k, 0) for k, v in after["replays"].items()},
            "nvml_sm": after["nvml_sm"]}


def norm(name):
    name = re.sub(r'^void ', '', name)
    return re.sub(r'\s+', '', name)


# ---- the workloads (each in its own process) --------------------------------------------------

def workload(kind, conn):
    import torch
    from torch.profiler import ProfilerActivity, profile
    dev = torch.device("cuda")
    a = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
    pinned = torch.empty(4096, 4096, dtype=torch.float16, pin_memory=True)
    torch.cuda.synchronize()
    step = None
    if kind == "eager":
        def step():
            for _ in range(200):
                c = torch.relu(a @ b)
                c.add_(1.0)
            torch.cuda.synchronize()
    elif kind == "graph":
        x = torch.randn(2048, 2048, device=dev, dtype=torch.float16)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                y = x
                for _ in range(25):
                    y = torch.relu(y @ x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x
            for _ in range(25):
                y = torch.relu(y @ x)  # 50 kernels: 25 matmuls, 25 relus

        def step():
            for _ in range(1000):
                g.replay()
            torch.cuda.synchronize()
    elif kind == "vllm":
        event = torch.cuda.Event()

        def step():
            for _ in range(200):
                c = a @ b
                pinned.copy_(c, non_blocking=True)
                event.record()
                event.synchronize()
    elif kind == "cpu":
        def step():
            for _ in range(200):
                (a @ b).cpu()
    step()  # warm-up: libraries loaded, kernels named
    conn.send(("ready", None))
    conn.recv()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
    torch.cuda.synchronize()
    path = f"/tmp/device-check-{kind}.json"
    prof.export_chrome_trace(path)
    events = json.load(open(path))["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    names = {}
    for e in kernels:
        names[norm(e["name"])] = names.get(norm(e["name"]), 0) + 1
    conn.send(("done", {"kernels": len(kernels), "kernel_us": sum(e["dur"] for e in kernels),
                        "copies": len(copies), "copy_us": sum(e["dur"] for e in copies),
                        "names": names}))
    conn.recv()


def run_one(kind, url):
    parent, child = mp.Pipe()
    p = mp.get_context("spawn").Process(target=workload, args=(kind, child))
    p.start()
    what, _ = parent.recv()
    time.sleep(1.5)  # the daemon drains and harvests
    before = scrape(url, p.pid)
    parent.send("go")
    what, truth = parent.recv()
    time.sleep(1.5)
    after = scrape(url, p.pid)
    parent.send("bye")
    p.join(60)
    got = minus(after, before)
    runs = sum(got["runs"].values())
    copies = got["calls"].get("memcpy", 0)
    matched = sum(v for k, v in got["runs"].items() if norm(k) in truth["names"])
    device_s = (truth["kernel_us"] + truth["copy_us"]) / 1e6
    ratio = got["span"] / device_s if device_s else 0.0
    checks = {
        "kernel runs within 1%": abs(runs - truth["kernels"]) <= 0.01 * truth["kernels"],
        "copies within 1%": abs(copies - truth["copies"]) <= max(0.01 * truth["copies"], 0),
        "names matched for 95% of runs": runs > 0 and matched >= 0.95 * runs,
        "batch_span 0.8 to 1.3 of the profiler's time": 0.8 <= ratio <= 1.3,
    }
    # NVML's per-process SM utilization at the end of the phase, as an anchor beside the two
    # measures (reported, not judged: NVML samples, and averages over its own period).
    return {"check": kind, "pid": p.pid, "cudatrace": {"kernel_runs": runs, "copies": copies,
            "batch_span_s": got["span"], "host_wait_s": got["wait"], "replays": got["replays"],
            "named_runs": matched, "nvml_process_sm_utilization": got["nvml_sm"]},
            "profiler": {k: v for k, v in truth.items() if k != "names"},
            "batch_span_over_profiler": ratio, "checks": checks, "ok": all(checks.values())}


def main():
    lib, url, out = sys.argv[1], sys.argv[2], sys.argv[3]
    results = [proc_address_check(lib)]
    for kind in ["eager", "graph", "vllm", "cpu"]:
        try:
            results.append(run_one(kind, url))
        except Exception as e:  # one failed workload is a failed check, the others still run
            results.append({"check": kind, "ok": False, "error": repr(e)})
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k != "rows"}))
    json.dump(results, open(f"{out}/torch.json", "w"), indent=1)
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
