//! What the guest printed, checked exactly: each check passes with a line saying what it saw,
//! or fails saying what differed.
use std::collections::{BTreeMap, BTreeSet};

use integration_tests::exposition;
use serde_json::{json, Value};

use super::{COPIES, EACH, LAUNCHES, RUN_LAUNCHES};

/// A check's outcome: what was seen, or why it failed.
pub type Outcome = Result<String, String>;

/// The console's `@@@ BEGIN name` .. `@@@ END name` sections.
fn sections(console: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut open: Option<(String, String)> = None;
    for line in console.lines().map(|l| l.trim_end_matches('\r')) {
        if let Some(name) = line.strip_prefix("@@@ BEGIN ") {
            open = Some((name.to_owned(), String::new()));
        } else if let Some(name) = line.strip_prefix("@@@ END ") {
            if let Some((n, text)) = open.take().filter(|(n, _)| n == name) {
                out.insert(n, text);
            }
        } else if let Some((_, text)) = open.as_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    out
}

/// What a guest's kernel should show: uprobe_multi links (6.6 and later) or the classic
/// fallback, and the sites by path.
pub struct Expect {
    /// uprobe_multi links attach (else classic uprobes).
    pub multi: bool,
    /// `(emulated, stepped, refused)` sites of the stand-in, as objdump reads them.
    pub sites: (u64, u64, u64),
    /// `(emulated, stepped)` of the stand-in and its branch-protected copy together (step 2
    /// attaches both).
    pub both: (u64, u64),
}

/// Runs every check on the console's text.
pub fn run(console: &str, expect: &Expect) -> Vec<(&'static str, Outcome)> {
    let s = sections(console);
    let get = |name: &str| -> Result<&str, String> {
        s.get(name)
            .map(String::as_str)
            .ok_or_else(|| format!("the guest printed no {name} (see the console log)"))
    };
    let events = || -> Result<Vec<Value>, String> {
        get("trace.jsonl")?
            .lines()
            .map(|l| serde_json::from_str(l).map_err(|e| format!("trace line {l:?}: {e}")))
            .collect()
    };
    let json = |name: &str| -> Result<Value, String> {
        serde_json::from_str(get(name)?.trim()).map_err(|e| format!("{name}: {e}"))
    };
    vec![
        ("kernel", kernel(get("kernel"))),
        (
            "uprobe_multi or classic uprobes at start",
            classic(get("trace.err"), expect.multi),
        ),
        (
            "trace exits cleanly",
            trace_exit(get("trace.rc"), get("trace.err")),
        ),
        (
            "every entry point, exact counts",
            each_counts(events(), json("each.json")),
        ),
        (
            "every launch variant, exact arguments",
            each_launches(events(), json("each.json")),
        ),
        (
            "two threads' launches and copies, exact",
            basic(events(), json("basic.json")),
        ),
        ("dlopen after start discovered", discovered(get("run.err"))),
        (
            "discovery hooks the open path, not every system call",
            open_path(get("run.err"), get("syscalls")),
        ),
        (
            "launches counted in the kernel, in /metrics",
            counted(
                get("metrics.txt"),
                json("run.json"),
                get("run.err"),
                get("run.rc"),
            ),
        ),
        (
            "stop leaves no BPF object behind",
            left_behind(get("bpf-before"), get("bpf-during"), get("bpf-after")),
        ),
        (
            "probe sites by path, exact",
            super::harm::sites(get("sites"), expect.sites),
        ),
        (
            "cudatrace_probe_sites, exact",
            super::harm::metric(get("metrics.txt"), expect.both),
        ),
        (
            "a probe's harm opens the breaker, the workload's own fault does not",
            super::harm::breaker(
                json("own.json"),
                json("harmed.json"),
                get("breaker.err"),
                get("breaker.out"),
                get("breaker-metrics"),
            ),
        ),
        (
            "a traced process is unharmed",
            super::harm::unharmed(
                json("harm.json"),
                get("harm.rc"),
                get("cycles.txt"),
                if expect.multi { 10 } else { 3 },
            ),
        ),
    ]
}

fn kernel(text: Result<&str, String>) -> Outcome {
    let text = text?;
    let mut lines = text.lines();
    let (release, machine) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
    if machine != "aarch64" {
        return Err(format!("the guest is {machine:?}, not aarch64"));
    }
    Ok(format!("Linux {release} on {machine}"))
}

fn classic(err: Result<&str, String>, multi: bool) -> Outcome {
    let err = err?;
    let fallback = err.lines().any(|l| l.contains("using classic uprobes"));
    let attached = err.lines().find(|l| {
        l.contains(&format!(
            "aarch64-linux-gnu/libcuda.so.1: attached {ALL} of {ALL} entry points"
        ))
    });
    // Launches: both kernels predate uprobe sessions (6.13), so the pair, of the kind attached.
    let pair = if multi {
        "launch_probes=uprobe_multi_pair"
    } else {
        "launch_probes=classic_pair"
    };
    let paired = err
        .lines()
        .any(|l| l.starts_with("summary:") && l.contains(pair));
    match (fallback, attached) {
        (true, Some(line)) if !multi && paired => Ok(format!(
            "uprobe_multi refused, classic uprobes: {line}; {pair}"
        )),
        (false, Some(line)) if multi && paired => Ok(format!("uprobe_multi links: {line}; {pair}")),
        _ => Err(format!(
            "expected {} and {ALL} of {ALL} attached, {pair} in the summary; stderr:\n{err}",
            if multi {
                "uprobe_multi links"
            } else {
                "the classic fallback"
            }
        )),
    }
}

/// Entry points the stand-in exports, each probed.
const ALL: usize = tracer_common::Api::ALL.len();

/// The `summary:` line's `key=value` pairs.
fn summary(err: &str) -> BTreeMap<String, String> {
    err.lines()
        .rev()
        .find_map(|l| l.strip_prefix("summary: "))
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn trace_exit(rc: Result<&str, String>, err: Result<&str, String>) -> Outcome {
    let (rc, err) = (rc?.trim().to_owned(), err?);
    let sum = summary(err);
    let zero = [
        "dropped",
        "orphan_returns",
        "undecodable",
        "inflight_entries",
    ];
    let bad: Vec<_> = zero
        .iter()
        .filter(|k| sum.get(**k).map(String::as_str) != Some("0"))
        .collect();
    if rc != "0" || !bad.is_empty() {
        return Err(format!(
            "exit status {rc}, not zero in the summary: {bad:?} ({sum:?})"
        ));
    }
    Ok(format!(
        "exit 0; events={} dropped=0 orphan_returns=0 undecodable=0",
        sum["events"]
    ))
}

fn of_pid(events: &[Value], report: &Value) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["pid"] == report["pid"])
        .cloned()
        .collect()
}

fn each_counts(events: Result<Vec<Value>, String>, report: Result<Value, String>) -> Outcome {
    let (events, report) = (events?, report?);
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for (api, n) in report["calls"]
        .as_object()
        .ok_or("each.json has no calls")?
    {
        // `name(why)`: more calls of `name`, made for set-up or at the end.
        let api = api.split('(').next().unwrap_or(api);
        *want.entry(api.to_owned()).or_default() += n.as_u64().unwrap_or(0);
    }
    let mut got: BTreeMap<String, u64> = BTreeMap::new();
    for e in of_pid(&events, &report) {
        *got.entry(e["api"].as_str().unwrap_or("?").to_owned())
            .or_default() += 1;
    }
    if want.len() != tracer_common::Api::ALL.len() || got != want {
        return Err(format!(
            "{} entry points called; events per entry point {got:?}, calls {want:?}",
            want.len()
        ));
    }
    Ok(format!(
        "{} entry points, {} calls in, {} events out",
        want.len(),
        want.values().sum::<u64>(),
        got.values().sum::<u64>()
    ))
}

fn each_launches(events: Result<Vec<Value>, String>, report: Result<Value, String>) -> Outcome {
    let (events, report) = (events?, report?);
    let events = of_pid(&events, &report);
    let gemm = ("hidden_gemm(float*, float*, int)", "_Z11hidden_gemmPfS_i");
    let axpy = ("lib_axpy(float, float const*, float*)", "_Z8lib_axpyfPKfPf");
    let variants = [
        ("cuLaunchKernel", gemm, "function"),
        ("cuLaunchKernel_ptsz", axpy, "kernel_function"),
        ("cuLaunchCooperativeKernel", axpy, "kernel"),
        ("cuLaunchCooperativeKernel_ptsz", axpy, "kernel"),
        ("cuLaunchKernelEx", gemm, "function"),
        ("cuLaunchKernelEx_ptsz", axpy, "kernel_function"),
    ];
    for (api, kernel, handle) in variants {
        let mut seen = BTreeSet::new();
        for e in events.iter().filter(|e| e["api"] == api) {
            let i = e["grid"][0].as_u64().unwrap_or(0).wrapping_sub(1);
            let ok = e["grid"] == json!([i + 1, 2, 3])
                && e["block"] == json!([4, 5, 6])
                && e["shared_mem_bytes"] == json!(7 + i)
                && e["stream"] == report["stream"]
                && e["function"] == report[handle]
                && (e["kernel"].as_str(), e["kernel_mangled"].as_str())
                    == (Some(kernel.0), Some(kernel.1));
            if !ok {
                return Err(format!(
                    "{api}: {e} (stream {}, {handle} {})",
                    report["stream"], report[handle]
                ));
            }
            seen.insert(i);
        }
        if seen != (0..EACH).collect() {
            return Err(format!("{api}: launches {seen:?}, not 0..{EACH}"));
        }
    }
    Ok(format!("6 variants x {EACH}: grid, block, shared memory, stream (on the stack), function, kernel name"))
}

fn basic(events: Result<Vec<Value>, String>, report: Result<Value, String>) -> Outcome {
    let (events, report) = (events?, report?);
    let events = of_pid(&events, &report);
    let streams = report["streams"]
        .as_array()
        .ok_or("basic.json has no streams")?;
    let mut launches = 0;
    for (t, stream) in streams.iter().enumerate() {
        let mut mine: Vec<&Value> = events
            .iter()
            .filter(|e| e["api"] == "cuLaunchKernel" && &e["stream"] == stream)
            .collect();
        mine.sort_by_key(|e| e["start_ns"].as_u64());
        let want = report["launches_per_thread"][t].as_u64().unwrap_or(0);
        if mine.len() as u64 != want {
            return Err(format!(
                "thread {t}: {} launches on stream {stream}, {want} made",
                mine.len()
            ));
        }
        for (i, e) in mine.iter().enumerate() {
            let i = i as u64;
            let ok = e["grid"] == json!([1 + i % 1000, 2 + t as u64, 3])
                && e["block"] == json!([32, 1 + i % 8, 2])
                && e["shared_mem_bytes"] == json!(i)
                && e["function"] == report["function"];
            if !ok {
                return Err(format!("thread {t} launch {i}: {e}"));
            }
        }
        launches += mine.len();
    }
    // Copy k of thread t moves 1024 + 16k + t bytes, host to device when k is even.
    let mut want = BTreeMap::new();
    for (t, n) in report["copies_per_thread"]
        .as_array()
        .ok_or("no copies_per_thread")?
        .iter()
        .enumerate()
    {
        for k in 0..n.as_u64().unwrap_or(0) {
            let api = if k % 2 == 0 {
                "cuMemcpyHtoD_v2"
            } else {
                "cuMemcpyDtoH_v2"
            };
            *want
                .entry((api.to_owned(), 1024 + 16 * k + t as u64))
                .or_insert(0) += 1;
        }
    }
    let mut got = BTreeMap::new();
    for e in events.iter().filter(|e| e["kind"] == "memcpy") {
        let api = e["api"].as_str().unwrap_or("?").to_owned();
        *got.entry((api, e["bytes"].as_u64().unwrap_or(0)))
            .or_insert(0) += 1;
    }
    if launches as u64 != LAUNCHES || got != want || want.values().sum::<u64>() != COPIES {
        return Err(format!(
            "{launches} launches of {LAUNCHES}; copies {got:?}, made {want:?}"
        ));
    }
    Ok(format!("{LAUNCHES} launches in, {launches} out on 2 streams in order; {COPIES} copies with their sizes"))
}

fn discovered(err: Result<&str, String>) -> Outcome {
    let err = err?;
    let after: Vec<&str> = err
        .lines()
        .skip_while(|l| !l.starts_with("ready:"))
        .collect();
    match after.iter().find(|l| {
        l.contains("/opt/cuda/libcuda.so.1") && l.contains(&format!("attached {ALL} of {ALL}"))
    }) {
        Some(line) => Ok(line.to_string()),
        None => Err(format!(
            "no attach of /opt/cuda/libcuda.so.1 after ready; stderr:\n{err}"
        )),
    }
}

/// Debian's kernels have kprobes: discovery's open hook is the open path's kprobe, and nothing
/// says it fell back to the `sys_enter` tracepoint.
fn open_path(err: Result<&str, String>, syscalls: Result<&str, String>) -> Outcome {
    let err = err?;
    // getppid() ns untraced, with the daemon's hook, untraced again: reported, not judged
    // (the guest's clock runs under emulation).
    let ns: Vec<f64> = syscalls?
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["ns_per_call"].as_f64())
        .collect();
    let timed = match ns.as_slice() {
        [bare, hooked, after] => format!(
            "; getppid {bare:.0} ns untraced, {hooked:.0} ns beside the daemon ({:+.1}% of the untraced mean), {after:.0} ns after",
            (hooked / ((bare + after) / 2.0) - 1.0) * 100.0
        ),
        other => return Err(format!("getppid timings: {other:?}")),
    };
    let said = err.lines().find(|l| l.starts_with("discovery: "));
    match said {
        Some(line)
            if line.contains("(kprobe:do_sys_openat2)") && !err.contains("every system call") =>
        {
            Ok(format!("{line}{timed}"))
        }
        _ => Err(format!(
            "discovery did not hook the open path; stderr:\n{err}"
        )),
    }
}

fn counted(
    metrics: Result<&str, String>,
    report: Result<Value, String>,
    err: Result<&str, String>,
    rc: Result<&str, String>,
) -> Outcome {
    let (metrics, report, err, rc) = (metrics?, report?, err?, rc?.trim().to_owned());
    let pid = report["pid"].to_string();
    let samples = exposition::parse(metrics);
    let calls = exposition::sum(
        &samples,
        "cudatrace_calls_total",
        &[("pid", &pid), ("api", "cuLaunchKernel")],
    );
    let sum = summary(err);
    let in_kernel = sum.get("launches_counted").cloned().unwrap_or_default();
    if calls != RUN_LAUNCHES as f64 || in_kernel != RUN_LAUNCHES.to_string() || rc != "0" {
        return Err(format!("cudatrace_calls_total={calls} launches_counted={in_kernel} exit {rc}, {RUN_LAUNCHES} launched"));
    }
    Ok(format!("{RUN_LAUNCHES} launches in; cudatrace_calls_total{{pid=\"{pid}\",api=\"cuLaunchKernel\"}} {calls}; launches_counted={in_kernel}; exit 0"))
}

fn left_behind(
    before: Result<&str, String>,
    during: Result<&str, String>,
    after: Result<&str, String>,
) -> Outcome {
    let (before, during, after) = (before?.trim(), during?.trim(), after?.trim());
    let programs = |s: &str| {
        s.split_whitespace()
            .find_map(|kv| kv.strip_prefix("programs="))
            .and_then(|v| v.parse::<u64>().ok())
    };
    if before != "programs=0 maps=0 links=0"
        || after != before
        || programs(during).unwrap_or(0) == 0
    {
        return Err(format!(
            "before: {before}; while running: {during}; after stop: {after}"
        ));
    }
    Ok(format!("while running: {during}; after stop: {after}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_survive_carriage_returns_and_kernel_lines() {
        let console = "noise\r\n@@@ BEGIN a\r\nx\r\ny\r\n@@@ END a\r\n@@@ BEGIN b\r\n@@@ END c\r\n";
        let s = sections(console);
        assert_eq!(s.get("a").map(String::as_str), Some("x\ny\n"));
        assert_eq!(
            s.get("b"),
            None,
            "a section closed by another name is dropped"
        );
    }

    #[test]
    fn stop_check_needs_programs_while_running_and_none_after() {
        let ok = left_behind(
            Ok("programs=0 maps=0 links=0"),
            Ok("programs=9 maps=12 links=0"),
            Ok("programs=0 maps=0 links=0"),
        );
        assert!(ok.is_ok(), "{ok:?}");
        let leak = left_behind(
            Ok("programs=0 maps=0 links=0"),
            Ok("programs=9 maps=12 links=0"),
            Ok("programs=1 maps=0 links=0"),
        );
        assert!(leak.is_err());
    }
}
