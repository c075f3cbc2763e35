#!/usr/bin/env python3
"""Memory, memsets, 2-D copies and several devices (issue 41) on a real GPU: a part of
scripts/device-check.sh, under the same `cudatrace run`.

    device_check_memory.py METRICS_URL OUT_DIR

Each check runs in its own process (spawned), measured as the difference of two scrapes of that
process's series around its phase:
1. expandable: PyTorch with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (VMM: cuMemCreate,
   cuMemMap) allocating 1 GiB in 64 tensors: cudatrace_device_memory_bytes against
   torch.cuda.memory_reserved(), within 1% (the gauge counts what the allocator reserved).
2. cupy: CuPy's cudaMemset (cuMemsetD8) 100 times of 1 MiB and cudaMemcpy2D (a 2-D copy) 100 times
   of 512 rows x 1024 bytes: cudatrace_memcpy_bytes_total with direction "memset" and the other
   directions' growth, exactly the bytes asked for.
3. devices (two or more GPUs): 300 launches on device 0 and 500 on device 1 from one process:
   cudatrace_device_launches_total per cuda_device at least those (PyTorch adds its own kernels,
   counted by the profiler), and each gpu label the NVML index of the device's UUID.
An MPS check needs the MPS control daemon started as root beside the driver; it is not run here.
Prints one JSON object per check and writes OUT_DIR/memory.json; exits 1 when a check fails.
"""
import json
import multiprocessing as mp
import os
import re
import sys
import time
import urllib.request

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} ([0-9.eE+-]+|NaN)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(url, pid):
    """The process's samples: {(name, frozenset(labels less pid)): value}."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        labels = dict(LABEL.findall(m.group(2)))
        if labels.pop("pid", None) != str(pid):
            continue
        out[(m.group(1), frozenset(labels.items()))] = float(m.group(3))
    return out


def total(samples, name, **want):
    return sum(v for (n, labels), v in samples.items()
               if n == name and all(dict(labels).get(k) == w for k, w in want.items()))


def phase(kind, conn):
    if kind == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch
    torch.cuda.init()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    conn.send("ready")
    conn.recv()
    truth = {}
    if kind == "expandable":
        held = [torch.empty(16 << 20, dtype=torch.uint8, device="cuda") for _ in range(64)]
        torch.cuda.synchronize()
        truth = {"reserved": torch.cuda.memory_reserved(), "allocated": len(held) << 24}
    elif kind == "cupy":
        import cupy
        buf = cupy.cuda.alloc(1 << 20)
        for _ in range(100):
            cupy.cuda.runtime.memset(buf.ptr, 0, 1 << 20)
        src, dst = cupy.cuda.alloc(1 << 20), cupy.cuda.alloc(1 << 20)
        for _ in range(100):
            cupy.cuda.runtime.memcpy2D(dst.ptr, 1024, src.ptr, 1024, 1024, 512,
                                       cupy.cuda.runtime.memcpyDeviceToDevice)
        cupy.cuda.runtime.deviceSynchronize()
        truth = {"memset_bytes": 100 << 20, "copy2d_bytes": 100 * 1024 * 512}
    elif kind == "devices":
        from torch.profiler import ProfilerActivity, profile
        xs = [torch.ones(1024, device=f"cuda:{d}") for d in (0, 1)]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for d, n in ((0, 300), (1, 500)):
                for _ in range(n):
                    xs[d].add_(1.0)
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)
        path = "/tmp/device-check-devices.json"
        prof.export_chrome_trace(path)
        kernels = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel"]
        per = {}
        for e in kernels:
            d = str(e.get("args", {}).get("device", "?"))
            per[d] = per.get(d, 0) + 1
        truth = {"kernels_per_device": per,
                 "uuids": [str(torch.cuda.get_device_properties(d).uuid) for d in (0, 1)]}
    conn.send(truth)
    conn.recv()


def nvml_index_of(uuids):
    """NVML's index of each UUID (nvidia-smi's order is NVML's)."""
    import subprocess
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout
    by_uuid = {}
    for line in out.splitlines():
        i, u = [x.strip() for x in line.split(",")]
        by_uuid[u.removeprefix("GPU-").lower()] = i
    return [by_uuid.get(u.removeprefix("GPU-").lower()) for u in uuids]


def run_one(kind, url):
    parent, child = mp.Pipe()
    p = mp.get_context("spawn").Process(target=phase, args=(kind, child))
    p.start()
    parent.recv()
    time.sleep(1.5)
    before = scrape(url, p.pid)
    parent.send("go")
    truth = parent.recv()
    time.sleep(1.5)
    after = scrape(url, p.pid)
    parent.send("bye")
    p.join(60)
    d = lambda name, **w: total(after, name, **w) - total(before, name, **w)
    got, checks = {}, {}
    if kind == "expandable":
        got = {"gauge": total(after, "cudatrace_device_memory_bytes")}
        checks["gauge within 1% of memory_reserved"] = (
            abs(got["gauge"] - truth["reserved"]) <= 0.01 * truth["reserved"])
    elif kind == "cupy":
        memset = d("cudatrace_memcpy_bytes_total", direction="memset")
        copies = d("cudatrace_memcpy_bytes_total") - memset
        got = {"memset_bytes": memset, "copy2d_bytes": copies}
        checks["memset bytes exact"] = memset == truth["memset_bytes"]
        checks["2-D copy bytes exact"] = copies == truth["copy2d_bytes"]
    elif kind == "devices":
        per = {dict(l).get("cuda_device"): (v - before.get((n, l), 0), dict(l).get("gpu"))
               for (n, l), v in after.items() if n == "cudatrace_device_launches_total"}
        nvml = nvml_index_of(truth["uuids"])
        got = {"per_device": per, "nvml_index": nvml}
        checks["launches split by device"] = all(
            per.get(str(i), (0, None))[0] >= want for i, want in ((0, 300), (1, 500)))
        checks["gpu label is NVML's index of the UUID"] = all(
            per.get(str(i), (0, None))[1] == nvml[i] for i in (0, 1))
    return {"check": kind, "pid": p.pid, "cudatrace": got, "truth": truth, "checks": checks,
            "ok": bool(checks) and all(checks.values())}


def main():
    url, out = sys.argv[1], sys.argv[2]
    import torch
    kinds = ["expandable", "cupy"] + (["devices"] if torch.cuda.device_count() >= 2 else [])
    results = []
    for kind in kinds:
        try:
            results.append(run_one(kind, url))
        except Exception as e:  # one failed phase is a failed check, the others still run
            results.append({"check": kind, "ok": False, "error": repr(e)})
    for r in results:
        print(json.dumps(r, default=str))
    json.dump(results, open(f"{out}/memory.json", "w"), indent=1, default=str)
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
