//! Automatic degradation (`[mitigate]`, opt-in): a page-tier verdict is answered by a machine.
//! The victim's platform is told through a webhook, with the verdict, when it fires and when it
//! ends (so that the victim sheds load or falls back, or the platform moves the aggressor), and
//! with the actions cudatrace plans: a CPU cap (`cpu.max`) on each aggressor the verdict names as
//! having changed whose workload is marked preemptible, held at most `max_hold_s`, one action
//! per workload per `min_interval_s`. Never an unmarked workload, never a neighbour that did not
//! change, never a verdict without a named cause (`workload_change`, `unexplained`...). In a dry
//! run the caps are only said; else `cudatrace actuator` (a separate privileged process) is asked
//! to take and undo them, on a thread of their own, and the webhook is told what it answered.
use std::{
    collections::HashMap,
    sync::{mpsc, Arc, Mutex},
    time::Instant,
};

use serde::Serialize;
use serde_json::{json, Value};

use self::ledger::Ledger;
use super::{alerting::AlertSink, http::JsonPoster};
use crate::{
    actuator::{client::Client, Request},
    alert::{AlertChange, AlertState, Cause, Party, Severity},
    config::mitigate::MitigateConfig,
    text::printable,
};

/// Workloads whose last action is remembered at most (the rate limit's table).
const MAX_REMEMBERED: usize = 4096;

/// One planned action: a CPU cap on an aggressor's cgroup.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Action {
    /// The aggressor's workload (or `cgroup:PATH` for a CPU preemptor named by its cgroup).
    pub workload: String,
    /// Its pid in the verdict.
    pub pid: u32,
    /// Its cgroup, when the verdict names it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The `cpu.max` it would get.
    pub cpu_max: String,
    /// Seconds it would be held at most.
    pub max_hold_s: u64,
    /// Planned only: nothing was written.
    pub dry_run: bool,
    /// Whether the actuator did it (false in a dry run).
    pub done: bool,
    /// What the actuator answered (none in a dry run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

/// What the rate limit and the undo need to remember.
#[derive(Default)]
pub struct Plans {
    /// The actions of each firing page, by its alert's key.
    active: HashMap<(u32, &'static str, &'static str), Vec<Action>>,
    /// When each workload was last acted on, seconds on the caller's clock.
    last: HashMap<String, f64>,
}

/// The name an aggressor is matched by: its workload, else its cgroup as `cgroup:PATH`.
fn name_of(p: &Party) -> Option<String> {
    p.workload
        .clone()
        .or_else(|| p.cgroup.as_ref().map(|c| format!("cgroup:{c}")))
}

/// The causes whose aggressors did the harm: what may be acted on.
fn causal(cause: Cause) -> bool {
    matches!(
        cause,
        Cause::ComputeContention | Cause::CopyContention | Cause::Starvation | Cause::CpuContention
    )
}

impl Plans {
    /// The actions a change asks for, at `now` seconds: a page that fires plans caps on its
    /// preemptible aggressors that changed (each workload once per `min_interval_s`); its end
    /// gives back the actions its start planned. `None`: nothing to tell.
    pub fn on(
        &mut self,
        c: &AlertChange,
        cfg: &MitigateConfig,
        now: f64,
    ) -> Option<(&'static str, Vec<Action>)> {
        match c.state {
            AlertState::Resolved => self.active.remove(&c.key()).map(|a| ("undo", a)),
            AlertState::Firing
                if c.severity == Severity::Page && !self.active.contains_key(&c.key()) =>
            {
                let marked = |n: &str| {
                    cfg.preemptible
                        .iter()
                        .filter_map(|g| glob::Pattern::new(g).ok())
                        .any(|g| g.matches(n))
                };
                let mut actions = Vec::new();
                for a in c
                    .aggressors
                    .iter()
                    .filter(|a| causal(c.cause) && a.change.is_some())
                {
                    let Some(name) = name_of(a).filter(|n| marked(n)) else {
                        continue;
                    };
                    let recent = self
                        .last
                        .get(&name)
                        .is_some_and(|t| now - t < cfg.min_interval_s as f64);
                    if recent || actions.iter().any(|x: &Action| x.workload == name) {
                        continue;
                    }
                    if self.last.len() >= MAX_REMEMBERED && !self.last.contains_key(&name) {
                        self.last
                            .retain(|_, t| now - *t < cfg.min_interval_s as f64);
                    }
                    if self.last.len() < MAX_REMEMBERED || self.last.contains_key(&name) {
                        self.last.insert(name.clone(), now);
                    }
                    actions.push(Action {
                        workload: name,
                        pid: a.pid,
                        cgroup: a.cgroup.clone(),
                        cpu_max: cfg.cpu_max.clone(),
                        max_hold_s: cfg.max_hold_s,
                        dry_run: cfg.dry_run,
                        done: false,
                        outcome: None,
                    });
                }
                self.active.insert(c.key(), actions.clone());
                Some(("act", actions))
            }
            _ => None,
        }
    }
}

/// One change's actions for the worker: the event, the verdict, the actions.
type Job = (&'static str, AlertChange, Vec<Action>);

/// The `[mitigate]` sink.
pub struct Mitigator {
    cfg: MitigateConfig,
    plans: Mutex<Plans>,
    jobs: Mutex<Option<mpsc::SyncSender<Job>>>,
    worker: Option<std::thread::JoinHandle<()>>,
    poster: Option<Arc<JsonPoster>>,
    started: Instant,
}

/// Jobs waiting for the worker, at most.
const JOBS: usize = 256;

/// The worker: asks the actuator (unless a dry run), says what was done, tells the webhook.
fn work(
    jobs: mpsc::Receiver<Job>,
    mut actuator: Option<Client>,
    poster: Option<Arc<JsonPoster>>,
    ledger: Option<Arc<Ledger>>,
    dry_run: bool,
) {
    for (event, c, mut actions) in jobs {
        for a in &mut actions {
            if let (Some(client), false) = (actuator.as_mut(), dry_run) {
                let key = format!("{}/{}/{}", c.victim.pid, c.evidence.signal, c.alert);
                let request = if event == "act" {
                    let named = c.aggressors.iter().find(|p| p.pid == a.pid);
                    Request::Cap {
                        key,
                        pid: a.pid,
                        comm: named.map(|p| p.comm.clone()).unwrap_or_default(),
                        start_time: named.map_or(0, |p| p.start_time),
                        cpu_max: a.cpu_max.clone(),
                        hold_s: a.max_hold_s,
                    }
                } else {
                    Request::Undo { key }
                };
                let reply = client.ask(&request);
                a.done = reply.ok;
                a.outcome = Some(reply.detail);
            }
            say(event, a, &c);
            if let (Some(l), "act") = (&ledger, event) {
                l.note(
                    c.key(),
                    json!({"event": event, "at": crate::text::rfc3339(std::time::SystemTime::now()), "workload": a.workload, "pid": a.pid, "cpu_max": a.cpu_max, "dry_run": a.dry_run, "done": a.done, "outcome": a.outcome}),
                );
            }
        }
        // The archive and Alertmanager read the page's entries when it resolved, before this
        // undo was queued.
        if let (Some(l), "undo") = (&ledger, event) {
            l.forget(&c.key());
        }
        if let Some(p) = &poster {
            p.send(body(event, &c, &actions, dry_run));
        }
    }
}

/// The log line of one action.
fn say(event: &str, a: &Action, c: &AlertChange) {
    log::warn!(
        "mitigate: {}{} {} (pid {}{}) at cpu.max {:?} for at most {} s: {} of {} (pid {}){}",
        if a.dry_run { "dry run: would " } else { "" },
        if event == "act" {
            "cap"
        } else {
            "undo the cap of"
        },
        printable(&a.workload),
        a.pid,
        a.cgroup
            .as_deref()
            .map(|g| format!(", cgroup {}", printable(g)))
            .unwrap_or_default(),
        a.cpu_max,
        a.max_hold_s,
        c.alert,
        printable(&c.victim.comm),
        c.victim.pid,
        a.outcome
            .as_deref()
            .map(|o| format!(
                ": {}: {}",
                if a.done { "done" } else { "refused" },
                printable(o)
            ))
            .unwrap_or_default()
    );
}

impl Mitigator {
    /// Starts it; an error when its webhook's client cannot be made.
    /// `ledger`: where each act is noted for the incident archive.
    pub fn start(
        cfg: &MitigateConfig,
        ca_file: Option<&std::path::Path>,
        ledger: Option<Arc<Ledger>>,
    ) -> anyhow::Result<Mitigator> {
        let poster = match &cfg.webhook {
            Some(url) => Some(Arc::new(JsonPoster::start(
                "mitigation webhook",
                url,
                ca_file,
            )?)),
            None => None,
        };
        let (tx, rx) = mpsc::sync_channel(JOBS);
        let actuator = cfg.actuator.as_deref().map(Client::new);
        let (p, dry_run) = (poster.clone(), cfg.dry_run);
        let worker = std::thread::Builder::new()
            .name("mitigate".into())
            .spawn(move || work(rx, actuator, p, ledger, dry_run))?;
        Ok(Mitigator {
            cfg: cfg.clone(),
            plans: Mutex::new(Plans::default()),
            jobs: Mutex::new(Some(tx)),
            worker: Some(worker),
            poster,
            started: Instant::now(),
        })
    }
}

/// The webhook's body: what happened, the verdict, the actions.
pub fn body(event: &str, c: &AlertChange, actions: &[Action], dry_run: bool) -> Value {
    json!({
        "kind": "mitigation",
        "event": event,
        "dry_run": dry_run,
        "alert": c.alert,
        "cause": c.cause.as_str(),
        "severity": c.severity.as_str(),
        "victim": c.victim,
        "actions": actions,
        "verdict": c,
    })
}

impl AlertSink for Mitigator {
    fn name(&self) -> &'static str {
        "mitigate"
    }

    fn publish(&self, changes: &[AlertChange]) {
        let now = self.started.elapsed().as_secs_f64();
        let mut plans = self
            .plans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let jobs = self
            .jobs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for c in changes {
            let Some((event, actions)) = plans.on(c, &self.cfg, now) else {
                continue;
            };
            let sent = jobs
                .as_ref()
                .is_some_and(|tx| tx.try_send((event, c.clone(), actions)).is_ok());
            if !sent {
                log::warn!(
                    "mitigate: {JOBS} actions wait already: {} of pid {} dropped",
                    c.alert,
                    c.victim.pid
                );
            }
        }
    }

    fn finish(
        self: Box<Self>,
        limit: std::time::Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> {
        let mut me = *self;
        Box::pin(async move {
            me.jobs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(w) = me.worker.take() {
                let _ = tokio::task::spawn_blocking(move || w.join()).await;
            }
            if let Some(p) = me.poster.take().and_then(|p| Arc::try_unwrap(p).ok()) {
                p.finish(limit).await;
            }
        })
    }
}

pub mod ledger;
#[cfg(test)]
mod tests;
