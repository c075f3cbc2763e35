//! The victim's own work as a verdict shows it: its work per step before and now, and the
//! kernel whose launches grew the most (its grid then and now), e.g. `grid 64 → 320`.
use std::collections::{HashMap, HashSet};

use super::{
    change::WorkHistory,
    verdict::{self, Nows, Reference},
    ProcessSignals, Processes,
};
use crate::alert::change::VictimChange;

/// Pushes what every process submitted in the window [`start`, `now`) onto its history, and
/// learns the usual launches of those that breached nothing; returns every process's history
/// when some process breached (the verdicts read them), else none.
pub fn close_window(
    processes: &mut impl Processes,
    breaching: &HashSet<u32>,
    (start, now): (f64, f64),
) -> HashMap<u32, WorkHistory> {
    for (pid, _, _, slot) in processes.slots_mut() {
        let Some(s) = slot.as_deref_mut() else {
            continue;
        };
        let delay = s.run_delay.1.take();
        s.work
            .push(verdict::work_of(&s.window, start, now - start, delay));
        if !breaching.contains(&pid) && !s.alerting() {
            learn_usual(s);
        }
    }
    if breaching.is_empty() {
        return HashMap::new();
    }
    processes
        .tracked()
        .filter_map(|p| Some((p.pid, p.signals?.work.clone())))
        .collect()
}

/// Learns the usual launch of each kernel `s` launched this window.
fn learn_usual(s: &mut ProcessSignals) {
    for (f, (n, t)) in &s.window.kernels {
        if *n == 0 || (s.usual.len() >= super::signals::MAX_KERNELS && !s.usual.contains_key(f)) {
            continue;
        }
        s.usual.insert(
            *f,
            verdict::Usual {
                threads_per_launch: *t as f64 / *n as f64,
                grid: s.grids.get(f).map(|g| g.0),
            },
        );
    }
}

/// The kernel of `pid` whose threads per launch this window grew the most over its usual:
/// (its name, or its handle in hex; its usual grid; its grid now).
pub struct GrownKernel {
    name: String,
    before: Option<[u32; 3]>,
    now: Option<[u32; 3]>,
}

/// The kernel of `pid`'s that grew most this window against its usual launch, if one grew.
pub fn grown_kernel(processes: &impl Processes, pid: u32) -> Option<GrownKernel> {
    let p = processes.tracked().find(|p| p.pid == pid)?;
    let s = p.signals?;
    let (function, _) = s
        .window
        .kernels
        .iter()
        .filter(|(_, (n, _))| *n > 0)
        .filter_map(|(f, (n, t))| {
            let usual = s.usual.get(f)?.threads_per_launch;
            let now = *t as f64 / *n as f64;
            (usual > 0.0 && now > usual).then_some((*f, now / usual))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    let before = s.usual.get(&function).and_then(|u| u.grid);
    let now = s.grids.get(&function).map(|g| g.0);
    let name = processes
        .kernel_name(pid, function)
        .unwrap_or_else(|| format!("{function:#x}"));
    Some(GrownKernel {
        name: crate::text::printable(&name).to_string(),
        before,
        now,
    })
}

/// The victim's work per step, before and now, with the kernel that grew, when known.
pub fn victim_change(
    reference: &Reference,
    nows: &Nows,
    kernel: Option<GrownKernel>,
) -> Option<VictimChange> {
    let (b, n) = (&reference.victim, &nows.victim);
    let tpl = b.threads_per_launch.zip(n.threads_per_launch)?;
    let r = |x: f64| (x * 100.0).round() / 100.0;
    let pair = |p: Option<(f64, f64)>| p.map(|(x, y)| (r(x), r(y)));
    Some(VictimChange {
        threads_per_launch: (r(tpl.0), r(tpl.1)),
        launches_per_step: pair(b.launches_per_step.zip(n.launches_per_step)),
        bytes_per_copy: pair(b.bytes_per_copy.zip(n.bytes_per_copy)),
        grid: kernel.as_ref().and_then(|k| k.before.zip(k.now)),
        kernel: kernel.map(|k| k.name),
    })
}
