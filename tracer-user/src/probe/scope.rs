//! Whose fault may open the node's breaker. A fault judged a probe's harm (`harm::judge`, and
//! not the process's own doing: `harm::self_made`) opens the library's breaker only when
//! something beyond the faulting tenant corroborates it: no other tenant uses the library, a
//! second tenant faulted the same way at it, the kernel's own uprobe log names the process, or
//! the breaker was half-open. Otherwise it is suspected (`CudatraceProbeHarmSuspected`, a
//! warning naming the tenant and the evidence) and nobody's probes are detached: one tenant
//! cannot switch tracing off for the others by faulting on purpose.
use super::{discovery::FileKey, harm::Basis};

/// Suspicions kept at most (the oldest forgotten first): a tenant faulting from many processes
/// cannot grow it.
pub const MAX_SUSPICIONS: usize = 256;

/// One suspected harm: which library, which tenant, in which way.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Suspicion {
    key: FileKey,
    tenant: String,
    way: &'static str,
    evidence: String,
}

/// What a judged harm does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The breaker opens, on this basis.
    Trip(Basis),
    /// Suspected only: the probes stay. `first`: the first suspicion of this tenant, way and
    /// library since start (the one alerted on; later ones are counted only, so a tenant
    /// faulting from many processes raises one alert, not one per process).
    Suspect {
        /// Whether it is new.
        first: bool,
    },
}

/// The suspicions seen since start (in memory only: a restart forgets them).
#[derive(Debug, Default)]
pub struct Scope {
    suspicions: Vec<Suspicion>,
}

/// A harm to decide on: the library, the faulting tenant, the way it faulted (`harm::Place`'s
/// kind), its evidence in a line.
pub struct Fault<'a> {
    /// The library's file.
    pub key: FileKey,
    /// The faulting process's tenant.
    pub tenant: &'a str,
    /// How it faulted: "entry" (at or just past the probed entry), "xol", "outside".
    pub way: &'static str,
    /// Its evidence.
    pub evidence: &'a str,
}

impl Scope {
    /// Decides on `f`, given the tenants whose live processes use the library (the faulting
    /// one among them or not) and whether its breaker is half-open.
    pub fn decide(&mut self, f: &Fault<'_>, users: &[String], half_open: bool) -> Decision {
        if half_open {
            return Decision::Trip(Basis::HalfOpen);
        }
        if let Some(first) = self
            .suspicions
            .iter()
            .find(|s| s.key == f.key && s.way == f.way && s.tenant != f.tenant)
        {
            return Decision::Trip(Basis::SecondTenant {
                first: first.tenant.clone(),
                evidence: first.evidence.clone(),
            });
        }
        if users.iter().all(|u| u == f.tenant) {
            return Decision::Trip(Basis::OnlyTenant);
        }
        Decision::Suspect {
            first: self.note(f),
        }
    }

    /// Keeps `f` as a suspicion (also where its library is not known and nothing can be
    /// decided); `true` when it is the first of its tenant, way and library.
    pub fn note(&mut self, f: &Fault<'_>) -> bool {
        let seen = self
            .suspicions
            .iter()
            .any(|s| s.key == f.key && s.way == f.way && s.tenant == f.tenant);
        if !seen {
            if self.suspicions.len() >= MAX_SUSPICIONS {
                self.suspicions.remove(0);
            }
            self.suspicions.push(Suspicion {
                key: f.key,
                tenant: f.tenant.to_owned(),
                way: f.way,
                evidence: f.evidence.to_owned(),
            });
        }
        !seen
    }

    /// Suspicions held now.
    pub fn len(&self) -> usize {
        self.suspicions.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.suspicions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault<'a>(tenant: &'a str, way: &'static str) -> Fault<'a> {
        Fault {
            key: (1, 2),
            tenant,
            way,
            evidence: "SIGILL 16 bytes past cuCtxSynchronize",
        }
    }

    #[test]
    fn one_tenant_alone_on_the_library_opens_it() {
        let mut s = Scope::default();
        let users = vec!["/a".to_owned()];
        assert_eq!(
            s.decide(&fault("/a", "entry"), &users, false),
            Decision::Trip(Basis::OnlyTenant)
        );
        assert_eq!(
            s.decide(&fault("/a", "entry"), &[], false),
            Decision::Trip(Basis::OnlyTenant)
        );
    }

    #[test]
    fn one_tenant_among_others_is_suspected_however_often_it_faults() {
        let mut s = Scope::default();
        let users = vec!["/a".to_owned(), "/b".to_owned()];
        assert_eq!(
            s.decide(&fault("/a", "entry"), &users, false),
            Decision::Suspect { first: true }
        );
        for _ in 0..1000 {
            assert_eq!(
                s.decide(&fault("/a", "entry"), &users, false),
                Decision::Suspect { first: false }
            );
        }
        assert_eq!(s.len(), 1, "one suspicion per tenant and way");
        // Another way of the same tenant is one more suspicion, still no trip.
        assert_eq!(
            s.decide(&fault("/a", "xol"), &users, false),
            Decision::Suspect { first: true }
        );
        // A second tenant faulting another way: suspected too.
        assert_eq!(
            s.decide(&fault("/b", "outside"), &users, false),
            Decision::Suspect { first: true }
        );
        // The second tenant faulting the same way as the first: open, naming the first.
        assert_eq!(
            s.decide(&fault("/b", "entry"), &users, false),
            Decision::Trip(Basis::SecondTenant {
                first: "/a".into(),
                evidence: "SIGILL 16 bytes past cuCtxSynchronize".into()
            })
        );
    }

    #[test]
    fn a_second_tenant_is_named_even_once_the_first_has_gone() {
        let mut s = Scope::default();
        let both = vec!["/a".to_owned(), "/b".to_owned()];
        assert_eq!(
            s.decide(&fault("/a", "entry"), &both, false),
            Decision::Suspect { first: true }
        );
        // A's process is gone: B alone uses the library now; the basis still names A.
        let only_b = vec!["/b".to_owned()];
        assert!(matches!(
            s.decide(&fault("/b", "entry"), &only_b, false),
            Decision::Trip(Basis::SecondTenant { first, .. }) if first == "/a"
        ));
    }

    #[test]
    fn another_library_or_a_half_open_breaker() {
        let mut s = Scope::default();
        let users = vec!["/a".to_owned(), "/b".to_owned()];
        assert_eq!(
            s.decide(&fault("/a", "entry"), &users, false),
            Decision::Suspect { first: true }
        );
        let other = Fault {
            key: (1, 3),
            ..fault("/b", "entry")
        };
        assert_eq!(
            s.decide(&other, &users, false),
            Decision::Suspect { first: true }
        );
        assert_eq!(
            s.decide(&fault("/a", "entry"), &users, true),
            Decision::Trip(Basis::HalfOpen)
        );
    }

    #[test]
    fn suspicions_are_bounded() {
        let mut s = Scope::default();
        let users = vec!["/x".to_owned()];
        let tenants: Vec<String> = (0..MAX_SUSPICIONS + 10).map(|i| format!("/t{i}")).collect();
        for (i, t) in tenants.iter().enumerate() {
            let f = Fault {
                key: (9, i as u64),
                ..fault(t, "entry")
            };
            assert_eq!(
                s.decide(&f, &users, false),
                Decision::Suspect { first: true }
            );
        }
        assert_eq!(s.len(), MAX_SUSPICIONS);
        assert!(!s.is_empty());
    }
}
