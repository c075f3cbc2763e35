//! Restart loops: a workload whose process keeps exiting and starting again (an OOM, a crash,
//! a liveness probe killing it). The workload is the pod's container (pod UID and container
//! name) in Kubernetes, else the executable and command name. A new process of a workload one of
//! whose processes exited within `restart_loop_s` is a restart; `restart_loop_count` restarts
//! within `restart_loop_s` fire `CudatraceRestartLoop` (critical) with the exit statuses seen
//! (from the kernel's exit records); it resolves once `restart_loop_s` pass without a restart.
//! Only crashes count (see [`crashed`]): a job that finishes (`exit 0`), a process stopped by
//! SIGTERM, and one whose status was not read start no restart.
use std::{
    collections::{HashMap, VecDeque},
    time::SystemTime,
};

use super::{fact, Detector, Processes};
use crate::{
    alert::{AlertChange, Cause, Evidence, Party, Severity},
    config::DetectConfig,
    identity::{Identity, ProcessRef},
};

/// Workloads remembered at most (the quietest without an alert goes first).
const MAX_WORKLOADS: usize = 4096;
/// Exits and restarts remembered per workload at most.
const MAX_EVENTS: usize = 64;
/// Processes remembered as seen at most (the oldest sighting goes first).
const MAX_KNOWN: usize = 65_536;
/// Exits one tenant adds at most a window (a tenant ending thousands of short processes a
/// window cannot crowd out another tenant's crash).
const MAX_EXITS_PER_TENANT: usize = 256;

/// Restart bookkeeping of every workload.
#[derive(Default)]
pub struct Restarts {
    /// Processes already seen, by (pid, start time), in the order seen: a process is counted
    /// once, however late or often the table shows it.
    known: std::collections::HashSet<(u32, u64)>,
    known_order: VecDeque<(u32, u64)>,
    workloads: HashMap<String, Workload>,
    /// Exits since the last window: (pid, start time, workload, status).
    exited: Vec<(u32, u64, String, Option<i32>)>,
    /// Exits since the last window by tenant.
    exited_by_tenant: HashMap<String, usize>,
    /// Exits not counted since start: their tenant's share of a window was full.
    pub exits_dropped: u64,
}

#[derive(Default)]
struct Workload {
    /// (when, pid, start time, status) of its processes' exits within the span.
    exits: VecDeque<(f64, u32, u64, Option<i32>)>,
    /// When its restarts were seen, within the span.
    restarts: VecDeque<f64>,
    /// Kubernetes: the container's restart count at its latest process, and how the instances
    /// before ended, within the span.
    kube_restarts: Option<u32>,
    kube_exits: VecDeque<(f64, String)>,
    /// Its latest process (the one started last), as alerts name it, and its start time.
    latest: Option<Party>,
    latest_start: u64,
    /// When it last changed.
    last: f64,
    /// The alert, while firing.
    record: Option<AlertChange>,
}

/// The workload a process belongs to, for restarts: the pod's container, else the built-in
/// workload rule (unit, container, user, executable: never the config's `[[workloads]]`, which
/// may join processes of several tenants), so that a process elsewhere cannot count as another
/// tenant's restart.
pub fn workload_key(id: &Identity, comm: &str) -> String {
    let container = id
        .kube
        .as_ref()
        .map(|k| k.container.as_str())
        .filter(|c| !c.is_empty());
    let exe = id.exe.as_deref().unwrap_or("?");
    match (&id.pod_uid, container) {
        (Some(uid), Some(c)) => format!("pod {uid} container {c}"),
        (Some(uid), None) => format!("pod {uid} exe {exe} comm {comm}"),
        (None, _) => format!("workload {}", crate::identity::workload::by_rule(id, comm)),
    }
}

/// The tenant of a restart key: the pod, else the workload name's tenant.
fn key_tenant(key: &str) -> &str {
    if let Some(rest) = key.strip_prefix("pod ") {
        return rest.split(' ').next().unwrap_or(rest);
    }
    crate::identity::workload::tenant_of(key.strip_prefix("workload ").unwrap_or(key))
}

/// Whether a `wait(2)` status is a crash: a non-zero exit, or death by a signal other than the
/// polite requests to stop (SIGTERM, SIGINT, SIGHUP: a pod's deletion, a Ctrl-C). An unknown
/// status is no crash.
pub fn crashed(status: Option<i32>) -> bool {
    let Some(s) = status else {
        return false;
    };
    match s & 0x7f {
        0 => (s >> 8) & 0xff != 0,
        1 | 2 | 15 => false,
        _ => true,
    }
}

/// A `wait(2)` status in words: `exit 3`, `killed by SIGKILL`, `killed by SIGSEGV (core dumped)`.
pub fn status_text(status: Option<i32>) -> String {
    let Some(s) = status else {
        return "unknown".to_owned();
    };
    let signal = s & 0x7f;
    if signal == 0 {
        return format!("exit {}", (s >> 8) & 0xff);
    }
    let name = match signal {
        1 => "SIGHUP".to_owned(),
        2 => "SIGINT".to_owned(),
        3 => "SIGQUIT".to_owned(),
        4 => "SIGILL".to_owned(),
        6 => "SIGABRT".to_owned(),
        7 => "SIGBUS".to_owned(),
        8 => "SIGFPE".to_owned(),
        9 => "SIGKILL".to_owned(),
        11 => "SIGSEGV".to_owned(),
        13 => "SIGPIPE".to_owned(),
        14 => "SIGALRM".to_owned(),
        15 => "SIGTERM".to_owned(),
        n => format!("signal {n}"),
    };
    let core = if s & 0x80 != 0 { " (core dumped)" } else { "" };
    format!("killed by {name}{core}")
}

impl Restarts {
    /// A process exited with `status` (its workload's key given).
    pub fn exited(&mut self, pid: u32, start: u64, key: String, status: Option<i32>) {
        let tenant = key_tenant(&key).to_owned();
        let n = self.exited_by_tenant.entry(tenant).or_default();
        if *n >= MAX_EXITS_PER_TENANT || self.exited.len() >= MAX_WORKLOADS {
            if self.exits_dropped == 0 {
                log::warn!(
                    target: "cudatrace::restart",
                    "restarts: a tenant ended more than {MAX_EXITS_PER_TENANT} processes in one window (or all more than {MAX_WORKLOADS}): the rest of its exits are not counted"
                );
            }
            self.exits_dropped += 1;
            return;
        }
        *n += 1;
        self.exited.push((pid, start, key, status));
    }
}

impl Detector {
    /// The window's restart loops: exits and new processes counted, alerts fired and resolved.
    pub(super) fn restart_loops(
        &mut self,
        processes: &impl Processes,
        (now, now_wall): (f64, SystemTime),
        cfg: &DetectConfig,
    ) {
        let span = cfg.restart_loop_s as f64;
        let r = &mut self.restarts;
        r.exited_by_tenant.clear();
        for (pid, start, key, status) in std::mem::take(&mut r.exited) {
            // Jobs that finish, and processes asked to stop, are no restart's cause.
            if !crashed(status) {
                continue;
            }
            let w = r.workloads.entry(key).or_default();
            push_bounded(&mut w.exits, (now, pid, start, status));
            w.last = now;
        }
        for p in processes.tracked() {
            let id = (p.pid, p.identity.start_time);
            if !r.known.insert(id) {
                continue;
            }
            r.known_order.push_back(id);
            if r.known_order.len() > MAX_KNOWN {
                let old = r.known_order.pop_front().expect("over the bound");
                r.known.remove(&old);
            }
            let key = workload_key(p.identity, p.comm);
            let w = r.workloads.entry(key).or_default();
            let start = p.identity.start_time;
            let kube = p
                .identity
                .kube
                .as_ref()
                .filter(|k| !k.container.is_empty())
                .and_then(|k| Some((k.restarts?, k.last_exit.clone())));
            if let Some((n, last_exit)) = kube {
                // Kubernetes counts the container's restarts: that count is the evidence.
                if let Some(prev) = w.kube_restarts.filter(|prev| n > *prev) {
                    for _ in 0..(n - prev).min(MAX_EVENTS as u32) {
                        push_bounded(&mut w.restarts, now);
                    }
                    let how = last_exit.unwrap_or_else(|| "unknown".into());
                    log::info!(
                        target: "cudatrace::restart",
                        pid = p.pid;
                        "restart: pid={} comm={} is its container's restart {n} (Kubernetes; the last ended: {})",
                        p.pid,
                        crate::text::printable(p.comm),
                        crate::text::printable(&how)
                    );
                    if w.kube_exits.len() >= MAX_EVENTS {
                        w.kube_exits.pop_front();
                    }
                    w.kube_exits.push_back((now, format!("Kubernetes: {how}")));
                }
                w.kube_restarts = Some(n.max(w.kube_restarts.unwrap_or(0)));
            } else if let Some((_, before, _, status)) =
                w.exits.iter().rev().find(|(t, x, s, _)| {
                    // Another process of it that started earlier (when both start times are known)
                    // and crashed within the span: this one replaced it.
                    *x != p.pid && now - t <= span && (*s == 0 || start == 0 || *s < start)
                })
            {
                log::info!(
                    target: "cudatrace::restart",
                    pid = p.pid,
                    after = *before;
                    "restart: pid={} comm={} started after pid={} exited ({})",
                    p.pid,
                    crate::text::printable(p.comm),
                    before,
                    status_text(*status)
                );
                push_bounded(&mut w.restarts, now);
            }
            if w.latest_start <= start {
                w.latest = Some(Party::of(p.view(), None));
                w.latest_start = start;
            }
            w.last = now;
        }
        for w in r.workloads.values_mut() {
            while w.exits.front().is_some_and(|(t, _, _, _)| now - t > span) {
                w.exits.pop_front();
            }
            while w.restarts.front().is_some_and(|t| now - t > span) {
                w.restarts.pop_front();
            }
            while w.kube_exits.front().is_some_and(|(t, _)| now - t > span) {
                w.kube_exits.pop_front();
            }
        }
        if r.workloads.len() > MAX_WORKLOADS {
            // The quietest of the tenant holding the most goes first, one at a time.
            let quiet = r
                .workloads
                .iter()
                .filter(|(_, w)| w.record.is_none())
                .map(|(k, w)| (key_tenant(k).to_owned(), w.last, k.clone()));
            let over = r.workloads.len() - MAX_WORKLOADS;
            for k in super::fair::longest_unseen_of_largest(quiet, over) {
                r.workloads.remove(&k);
            }
        }
        let count = cfg.restart_loop_count as usize;
        for w in r.workloads.values_mut() {
            let Some(victim) = w.latest.clone() else {
                continue;
            };
            let evidence = Evidence {
                exit_statuses: w
                    .exits
                    .iter()
                    .map(|(_, _, _, s)| status_text(*s))
                    .chain(w.kube_exits.iter().map(|(_, e)| e.clone()))
                    .collect(),
                ..fact::evidence(
                    ("restarts", "restarts"),
                    w.restarts.len() as f64,
                    w.restarts.len() as u64,
                    cfg.restart_loop_s,
                )
            };
            match w.record.as_mut() {
                Some(_) if w.restarts.is_empty() => {
                    let rec = w.record.take().expect("checked");
                    self.outbox
                        .push(fact::resolved(rec, "no_more_restarts", now_wall));
                }
                Some(rec) => {
                    rec.victim = victim;
                    rec.evidence = evidence;
                }
                None if w.restarts.len() >= count => {
                    let rec = fact::firing(
                        (Cause::RestartLoop, Severity::Critical),
                        String::new(),
                        (victim, Vec::new()),
                        evidence,
                        now_wall,
                    );
                    self.outbox.push(rec.clone());
                    w.record = Some(rec);
                }
                None => {}
            }
        }
    }

    /// Workloads the restart bookkeeping holds.
    #[cfg(test)]
    pub(super) fn restart_workloads(&self) -> usize {
        self.restarts.workloads.len()
    }

    /// Alerts of restart loops now firing.
    pub(super) fn restart_records(&self) -> impl Iterator<Item = &AlertChange> {
        self.restarts
            .workloads
            .values()
            .filter_map(|w| w.record.as_ref())
    }

    /// Counts a process's exit toward its workload's restarts.
    pub(super) fn restart_exited(&mut self, who: ProcessRef<'_>, status: Option<i32>) {
        let key = workload_key(who.identity, who.comm);
        self.restarts
            .exited(who.pid, who.identity.start_time, key, status);
    }
}

fn push_bounded<T>(q: &mut VecDeque<T>, v: T) {
    if q.len() >= MAX_EVENTS {
        q.pop_front();
    }
    q.push_back(v);
}
