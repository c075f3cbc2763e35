//! Quiet periods at work: an alert whose victim (or an aggressor, per the entry's `role`) matches
//! a `[[alerts.quiet]]` entry while its period holds is quiet: printed, archived and exported
//! (`quiet="true"`), but not sent.
//!
//! A process chooses its own comm, so a comm glob alone never matches an aggressor: a tenant
//! naming itself `train-evil` must not silence the alert it causes. An aggressor matches only an
//! entry with a cgroup or pod glob (set by the kernel and the API server, not by the tenant); the
//! comm glob then only narrows it.
use std::time::SystemTime;

use crate::{
    alert::Party,
    config::{
        period::Period,
        quiet::{QuietEntry, Role},
    },
};

/// One entry, parsed.
#[derive(Clone, Debug)]
struct Rule {
    name: String,
    comm: Option<glob::Pattern>,
    cgroup: Option<glob::Pattern>,
    pod: Option<glob::Pattern>,
    role: Role,
    period: Period,
}

/// The quiet periods, parsed.
#[derive(Clone, Debug, Default)]
pub struct Quiet {
    rules: Vec<Rule>,
}

impl Quiet {
    /// The quiet periods of validated entries.
    pub fn new(entries: &[QuietEntry]) -> Quiet {
        let pattern = |g: &Option<String>| g.as_deref().and_then(|g| glob::Pattern::new(g).ok());
        let rules = entries
            .iter()
            .filter_map(|e| {
                Some(Rule {
                    name: e.name.clone(),
                    comm: pattern(&e.comm),
                    cgroup: pattern(&e.cgroup),
                    pod: pattern(&e.pod),
                    role: e.role,
                    period: e.period().ok()?,
                })
            })
            .collect();
        Quiet { rules }
    }

    /// The name of the first entry that quiets an alert of `victim` by `aggressors` at `t`;
    /// `cgroup` gives a process's cgroup path.
    pub fn find(
        &self,
        victim: &Party,
        aggressors: &[Party],
        cgroup: &dyn Fn(u32) -> Option<String>,
        t: SystemTime,
    ) -> Option<String> {
        self.rules
            .iter()
            .find(|r| r.period.holds(t) && r.quiets(victim, aggressors, cgroup))
            .map(|r| r.name.clone())
    }
}

impl Rule {
    fn quiets(
        &self,
        victim: &Party,
        aggressors: &[Party],
        cgroup: &dyn Fn(u32) -> Option<String>,
    ) -> bool {
        let victim_ok =
            matches!(self.role, Role::Any | Role::Victim) && self.matches(victim, cgroup);
        victim_ok
            || (matches!(self.role, Role::Any | Role::Aggressor)
                && self.names_tenants_by_what_they_cannot_set()
                && aggressors.iter().any(|a| self.matches(a, cgroup)))
    }

    /// Whether the rule has a glob a tenant cannot satisfy by naming itself (cgroup or pod).
    fn names_tenants_by_what_they_cannot_set(&self) -> bool {
        self.cgroup.is_some() || self.pod.is_some()
    }

    /// Whether every glob the rule has matches the process.
    fn matches(&self, p: &Party, cgroup_of: &dyn Fn(u32) -> Option<String>) -> bool {
        let comm = self.comm.as_ref().is_none_or(|g| g.matches(&p.comm));
        let cgroup = self
            .cgroup
            .as_ref()
            .is_none_or(|g| cgroup_of(p.pid).is_some_and(|c| g.matches(&c)));
        let pod = self.pod.as_ref().is_none_or(|g| {
            let name = match (&p.namespace, &p.pod) {
                (Some(ns), Some(pod)) => format!("{ns}/{pod}"),
                (None, Some(uid)) => uid.clone(),
                _ => return false,
            };
            g.matches(&name)
        });
        comm && cgroup && pod
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::config::{period::days_from_civil, Config, ConfigError};

    fn party(pid: u32, comm: &str, pod: Option<(&str, &str)>) -> Party {
        Party {
            workload: None,
            pid,
            comm: comm.into(),
            namespace: pod.map(|p| p.0.into()),
            pod: pod.map(|p| p.1.into()),
            container: None,
            share: None,
            change: None,
            cgroup: None,
            start_time: 0,
        }
    }

    #[test]
    fn entries_quiet_by_name_pod_role_and_hour() {
        let c = Config::parse(
            "[[alerts.quiet]]\nname = \"nightly-batch\"\ncomm = \"train*\"\nhours = \"01:00-05:00\"\n\
             [[alerts.quiet]]\nname = \"canary\"\npod = \"canary/*\"\nrole = \"victim\"\n",
        )
        .unwrap();
        let q = Quiet::new(&c.alerts.quiet);
        let r = |pid: u32| (pid == 2).then(|| "/batch.slice/train.scope".to_owned());
        let r: &dyn Fn(u32) -> Option<String> = &r;
        let at = |h: u64, m: u64| {
            UNIX_EPOCH
                + Duration::from_secs(
                    days_from_civil(2026, 12, 3) as u64 * 86_400 + h * 3600 + m * 60,
                )
        };
        let (server, trainer) = (
            party(1, "model-server", Some(("prod", "server-0"))),
            party(2, "trainer", None),
        );
        let canary = party(3, "model-server", Some(("canary", "server-1")));
        // A comm alone never quiets what an aggressor causes: any process can call itself
        // train-evil. The trainer's own alerts (as victim) are quiet from 01:00 to 05:00.
        assert_eq!(
            q.find(&server, std::slice::from_ref(&trainer), r, at(1, 0)),
            None
        );
        assert_eq!(q.find(&trainer, &[], r, at(5, 0)), None);
        assert_eq!(
            q.find(&trainer, &[], r, at(4, 59)).as_deref(),
            Some("nightly-batch")
        );
        // The canary pod's own alerts are quiet all day; it slowing others is not.
        assert_eq!(
            q.find(&canary, &[], r, at(12, 0)).as_deref(),
            Some("canary")
        );
        assert_eq!(
            q.find(&server, std::slice::from_ref(&canary), r, at(12, 0)),
            None
        );
        // By cgroup: the trainer's cgroup is under batch.slice.
        let q = Quiet::new(
            &Config::parse("[[alerts.quiet]]\nname = \"batch\"\ncgroup = \"/batch.slice/*\"\n")
                .unwrap()
                .alerts
                .quiet,
        );
        assert_eq!(
            q.find(&server, std::slice::from_ref(&trainer), r, at(12, 0))
                .as_deref(),
            Some("batch")
        );
        assert_eq!(q.find(&server, &[], r, at(12, 0)), None);
        // The comm narrows a cgroup entry: a process of that cgroup by another name is not quiet.
        let q = Quiet::new(
            &Config::parse(
                "[[alerts.quiet]]\nname = \"batch\"\ncgroup = \"/batch.slice/*\"\ncomm = \"train*\"\nrole = \"aggressor\"\n",
            )
            .unwrap()
            .alerts
            .quiet,
        );
        let evil = party(4, "train-evil", None);
        let renamed = party(2, "sampler", None);
        assert_eq!(
            q.find(&server, std::slice::from_ref(&trainer), r, at(12, 0))
                .as_deref(),
            Some("batch")
        );
        assert_eq!(q.find(&server, &[evil], r, at(12, 0)), None);
        assert_eq!(q.find(&server, &[renamed], r, at(12, 0)), None);
    }

    #[test]
    fn bad_entries_say_what_is_wrong() {
        // Every refusal of an entry is an invalid value of the list (or a syntax error).
        let e = |text: &str| match Config::parse(text) {
            Err(ConfigError::Invalid { key, message }) => {
                assert_eq!(key, "alerts.quiet", "{text:?}");
                message
            }
            Err(err @ ConfigError::Syntax(_)) => err.to_string(),
            other => panic!("{text:?}: expected a refusal, got {other:?}"),
        };
        assert_eq!(
            e("[[alerts.quiet]]\nname = \"x\"\nhours = \"01:00-05:00\"\n"),
            "alerts.quiet \"x\": give comm, cgroup or pod (a glob), or the entry would quiet every alert"
        );
        assert_eq!(
            e("[[alerts.quiet]]\nname = \"x\"\ncomm = \"[\"\n")
                .split(" (")
                .next()
                .unwrap(),
            "alerts.quiet \"x\": comm = \"[\": not a glob"
        );
        assert!(
            e("[[alerts.quiet]]\nname = \"x\"\ncomm = \"a\"\nrole = \"bystander\"\n")
                .contains("unknown variant `bystander`")
        );
        assert_eq!(
            e("[[alerts.quiet]]\nname = \"x\"\ncomm = \"train*\"\nrole = \"aggressor\"\n"),
            "alerts.quiet \"x\": role = \"aggressor\" needs a cgroup or pod glob: any process can \
             take a comm, so a comm alone would let a tenant quiet the alerts it causes"
        );
        assert_eq!(
            e("[[alerts.quiet]]\ncomm = \"a\"\n"),
            "alerts.quiet: give every entry a name"
        );
    }
}
