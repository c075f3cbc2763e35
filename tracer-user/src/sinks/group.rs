//! Grouping for the webhook (`[alerts] webhook_group_s`): the changes of one incident (GPU,
//! cause, aggressor set) that arrive within `webhook_group_s` of its first are sent as one body
//! listing every victim, as Alertmanager's `group_wait` does; later changes of the same incident
//! open a new group. A trainer slowing ten model servers is then one POST, not ten.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::alert::{AlertChange, AlertState, Incident};

/// Victims one group lists at most (the newest change of each); past it the rest are counted.
pub const MAX_VICTIMS: usize = 256;

/// One incident's changes waiting to be sent.
struct Group {
    incident: Incident,
    /// When it is sent.
    due: Instant,
    /// The latest change of each victim, by alert key.
    victims: BTreeMap<(u32, &'static str, &'static str), AlertChange>,
    /// Victims past [`MAX_VICTIMS`], counted.
    left_out: u64,
}

impl Group {
    /// The webhook's body for it.
    fn body(self) -> Value {
        body(
            &self.incident,
            self.victims.into_values().collect(),
            self.left_out,
        )
    }
}

/// Groups waiting to be sent, by incident.
#[derive(Default)]
pub struct Groups {
    open: Vec<Group>,
}

impl Groups {
    /// Adds a change at `now`; a new group is due `wait` later.
    pub fn add(&mut self, change: AlertChange, now: Instant, wait: Duration) {
        let i = match self.open.iter().position(|g| g.incident == change.incident) {
            Some(i) => i,
            None => {
                self.open.push(Group {
                    incident: change.incident.clone(),
                    due: now + wait,
                    victims: BTreeMap::new(),
                    left_out: 0,
                });
                self.open.len() - 1
            }
        };
        let g = &mut self.open[i];
        if g.victims.len() >= MAX_VICTIMS && !g.victims.contains_key(&change.key()) {
            g.left_out += 1;
            return;
        }
        g.victims.insert(change.key(), change);
    }

    /// When the next group is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.open.iter().map(|g| g.due).min()
    }

    /// Takes the groups due at `now`, as the webhook's bodies.
    pub fn take_due(&mut self, now: Instant) -> Vec<Value> {
        let (due, open): (Vec<Group>, Vec<Group>) = std::mem::take(&mut self.open)
            .into_iter()
            .partition(|g| g.due <= now);
        self.open = open;
        due.into_iter().map(Group::body).collect()
    }

    /// Takes every group (at shutdown).
    pub fn take_all(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.open)
            .into_iter()
            .map(Group::body)
            .collect()
    }
}

/// One group's body: the incident, its state (the most advanced of its victims': firing over
/// pending over resolved), and each victim's latest record.
fn body(incident: &Incident, victims: Vec<AlertChange>, left_out: u64) -> Value {
    let rank = |s: AlertState| match s {
        AlertState::Firing => 2,
        AlertState::Pending => 1,
        AlertState::Resolved => 0,
    };
    let state = victims
        .iter()
        .map(|v| v.state)
        .max_by_key(|s| rank(*s))
        .unwrap_or(AlertState::Resolved);
    let names: Vec<String> = victims
        .iter()
        .map(|v| format!("{} (pid {})", v.victim.comm, v.victim.pid))
        .collect();
    json!({
        "incident": incident,
        "state": state,
        "summary": format!(
            "{} on GPU {} by {}: {}",
            incident.cause.as_str(),
            incident.gpu,
            if incident.aggressors.is_empty() { "no aggressor seen" } else { incident.aggressors.as_str() },
            names.join(", ")
        ),
        "victims": victims,
        "victims_left_out": left_out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::tests::record;

    #[test]
    fn victims_of_one_incident_within_the_wait_are_one_body() {
        let mut g = Groups::default();
        let t0 = Instant::now();
        let wait = Duration::from_secs(10);
        let a = record(AlertState::Pending);
        let mut b = record(AlertState::Firing);
        b.victim.pid = 11;
        b.victim.comm = "server-b".into();
        let mut other = record(AlertState::Firing);
        other.incident.gpu = "1".into();
        g.add(a.clone(), t0, wait);
        g.add(b, t0 + Duration::from_secs(3), wait);
        g.add(other, t0 + Duration::from_secs(4), wait);
        // The first victim's alert fires within the wait: its newest change is the one listed.
        let mut a_firing = a;
        a_firing.state = AlertState::Firing;
        g.add(a_firing, t0 + Duration::from_secs(5), wait);
        assert!(g.take_due(t0 + Duration::from_secs(9)).is_empty());
        assert_eq!(g.next_due(), Some(t0 + wait));
        let due = g.take_due(t0 + wait);
        assert_eq!(due.len(), 1);
        let v = &due[0];
        assert_eq!(
            (v["state"].as_str(), v["incident"]["aggressors"].as_str()),
            (Some("firing"), Some("20:trainer"))
        );
        let victims: Vec<(u64, &str)> = v["victims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["victim"]["pid"].as_u64().unwrap(),
                    r["state"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(victims, vec![(10, "firing"), (11, "firing")]);
        assert_eq!(
            v["summary"],
            "compute_contention on GPU 0 by 20:trainer: server (pid 10), server-b (pid 11)"
        );
        // GPU 1's incident is its own group, due 4 s later.
        assert_eq!(g.take_all().len(), 1);
    }

    #[test]
    fn a_flood_of_victims_is_bounded() {
        let mut g = Groups::default();
        let now = Instant::now();
        for pid in 0..1000 {
            let mut r = record(AlertState::Firing);
            r.victim.pid = pid;
            g.add(r, now, Duration::ZERO);
        }
        let due = g.take_due(now);
        assert_eq!(
            (
                due[0]["victims"].as_array().unwrap().len(),
                due[0]["victims_left_out"].as_u64()
            ),
            (MAX_VICTIMS, Some(744))
        );
    }
}
