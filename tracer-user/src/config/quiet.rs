//! `[[alerts.quiet]]`: quiet periods. An alert whose victim (or an aggressor, per `role`)
//! matches an entry's comm, cgroup or pod glob while the entry's period holds is quiet: it is
//! still printed, archived and exported (`quiet="true"`), but not sent to Alertmanager or the
//! webhook.
use serde::Deserialize;

use super::{
    period::{Period, PeriodKeys},
    ConfigError,
};

/// Which processes of an alert an entry's patterns are matched against.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The victim or any aggressor (a batch job's own alerts, and the slowdowns it causes).
    #[default]
    Any,
    /// The victim only.
    Victim,
    /// An aggressor only (the entry needs a cgroup or pod glob: a comm is the tenant's choice).
    Aggressor,
}

/// One `[[alerts.quiet]]` entry as written.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QuietEntry {
    /// Its name: the `quiet` field of the alert record.
    #[serde(default)]
    pub name: String,
    /// Glob on the process's comm (`train*`); alone, it matches only the alert's victim.
    pub comm: Option<String>,
    /// Glob on the process's cgroup path (`*/batch.slice/*`).
    pub cgroup: Option<String>,
    /// Glob on `NAMESPACE/POD` (`batch/*`), or the pod UID until the pod list names it.
    pub pod: Option<String>,
    /// Whose names the globs are matched against.
    #[serde(default)]
    pub role: Role,
    /// Weekdays; none: every day.
    #[serde(default)]
    pub days: Vec<String>,
    /// `"HH:MM-HH:MM"`; none: the whole day.
    pub hours: Option<String>,
    /// `"YYYY-MM-DD..YYYY-MM-DD"`; none: any date.
    pub dates: Option<String>,
    /// `"+HH:MM"` of the days, hours and dates (default UTC).
    pub utc_offset: Option<String>,
}

/// Longest glob taken (the config is the operator's, but a glob's cost grows with it).
const MAX_GLOB: usize = 256;

impl QuietEntry {
    /// Checks the entry; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.comm.is_none() && self.cgroup.is_none() && self.pod.is_none() {
            return Err(
                "give comm, cgroup or pod (a glob), or the entry would quiet every alert".into(),
            );
        }
        if self.role == Role::Aggressor && self.cgroup.is_none() && self.pod.is_none() {
            return Err(
                "role = \"aggressor\" needs a cgroup or pod glob: any process can take \
                        a comm, so a comm alone would let a tenant quiet the alerts it causes"
                    .into(),
            );
        }
        for (key, glob) in [
            ("comm", &self.comm),
            ("cgroup", &self.cgroup),
            ("pod", &self.pod),
        ] {
            if let Some(g) = glob {
                if g.len() > MAX_GLOB {
                    return Err(format!(
                        "{key}: a glob of {} bytes: give at most {MAX_GLOB}",
                        g.len()
                    ));
                }
                glob::Pattern::new(g).map_err(|e| format!("{key} = {g:?}: not a glob ({e})"))?;
            }
        }
        self.period().map(|_| ())
    }

    pub fn period(&self) -> Result<Period, String> {
        Period::parse(PeriodKeys {
            days: &self.days,
            hours: self.hours.as_deref(),
            dates: self.dates.as_deref(),
            utc_offset: self.utc_offset.as_deref(),
        })
    }
}

/// Checks `[[alerts.quiet]]`: names, patterns and periods; the error is the whole line.
pub fn validate(entries: &[QuietEntry]) -> Result<(), ConfigError> {
    super::entries::check("alerts.quiet", entries.iter().map(|e| e.name.as_str()))?;
    for e in entries {
        e.validate().map_err(|why| {
            ConfigError::invalid("alerts.quiet", format!("alerts.quiet {:?}: {why}", e.name))
        })?;
    }
    Ok(())
}
