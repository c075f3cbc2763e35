//! Which processes the kernel named are read next, and what a flood of opens may cost. A tenant
//! (the opener's cgroup) has at most [`MAX_PER_TENANT`] processes waiting, and all together at
//! most [`MAX_PENDING`]: an open past either is counted and asks for a full pass instead. The
//! tenants waiting take turns. A process whose reads found no libcuda (it opened one that is
//! missing, or does not map it) is not read again for [`FIRST_QUIET`], doubling to
//! [`MAX_QUIET`]; an open meanwhile is remembered and read when that time is up. Every read, and
//! every step of a full pass, is paid from one [`Budget`] of the discovery thread's CPU time.
use std::{
    collections::{BTreeMap, HashMap},
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use super::Stats;

/// When a named process's maps are read again, after the first read found no libcuda.
const RETRIES: [Duration; 5] = [
    Duration::from_millis(2),
    Duration::from_millis(10),
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_millis(1000),
];
/// Processes waiting for a read at most, all tenants together.
pub const MAX_PENDING: usize = 4096;
/// Processes of one tenant waiting for a read at most.
pub const MAX_PER_TENANT: usize = 256;
/// How long a process whose reads found nothing is left alone the first time.
pub const FIRST_QUIET: Duration = Duration::from_secs(1);
/// The longest a process whose reads keep finding nothing is left alone.
pub const MAX_QUIET: Duration = Duration::from_secs(60);
/// Quiet processes remembered at most (past it, the one free soonest is forgotten).
const MAX_QUIET_PIDS: usize = 16_384;
/// CPU time discovery's reads may spend each second, on average.
pub const CPU_PER_SECOND: Duration = Duration::from_millis(20);
/// CPU time discovery's reads may spend at once, after a quiet spell.
pub const CPU_BURST: Duration = Duration::from_millis(100);

/// A token bucket of the discovery thread's CPU time.
pub struct Budget {
    tokens: f64,
    at: Instant,
}

impl Budget {
    /// A full bucket.
    pub fn new(now: Instant) -> Budget {
        Budget {
            tokens: CPU_BURST.as_secs_f64(),
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let gained = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens =
            (self.tokens + gained * CPU_PER_SECOND.as_secs_f64()).min(CPU_BURST.as_secs_f64());
        self.at = now;
    }

    /// Whether more than `keep` of the bucket is left now.
    pub fn left_over(&mut self, now: Instant, keep: Duration) -> bool {
        self.refill(now);
        self.tokens > keep.as_secs_f64()
    }

    /// What the bucket holds now (nothing when it is overdrawn).
    pub fn held(&mut self, now: Instant) -> Duration {
        self.refill(now);
        Duration::from_secs_f64(self.tokens.max(0.0))
    }

    /// Pays `cpu` (it may go below zero: the next reads wait the longer).
    pub fn spend(&mut self, cpu: Duration) {
        self.tokens -= cpu.as_secs_f64();
    }

    /// How long until the bucket holds more than `keep` again.
    pub fn wait(&mut self, now: Instant, keep: Duration) -> Duration {
        self.refill(now);
        let short = keep.as_secs_f64() - self.tokens;
        if short < 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(short / CPU_PER_SECOND.as_secs_f64()) + Duration::from_millis(1)
    }
}

/// The CPU time this thread has used.
pub fn thread_cpu() -> Duration {
    // SAFETY: timespec is plain data; clock_gettime writes it and takes no other pointer.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and a live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A process waiting for a read.
struct Named {
    next: Instant,
    reads: usize,
    tenant: u64,
}

/// A process whose reads found nothing, left alone until `until`.
struct Quiet {
    until: Instant,
    delay: Duration,
    /// It opened a libcuda again meanwhile: read it at `until`.
    wanted: bool,
    tenant: u64,
}

/// The processes waiting for a read, by tenant, and the quiet ones.
pub struct Queue {
    named: HashMap<u32, Named>,
    per_tenant: HashMap<u64, usize>,
    quiet: HashMap<u32, Quiet>,
    /// The tenant served last (the next turn goes to the one after it).
    last_tenant: u64,
    /// An open was dropped since the last full pass was asked for.
    overflowed: bool,
    /// What reads may spend.
    pub budget: Budget,
    stats: Arc<Stats>,
}

impl Queue {
    /// An empty queue with a full budget, counting into `stats`.
    pub fn new(stats: Arc<Stats>, now: Instant) -> Queue {
        Queue {
            named: HashMap::new(),
            per_tenant: HashMap::new(),
            quiet: HashMap::new(),
            last_tenant: 0,
            overflowed: false,
            budget: Budget::new(now),
            stats,
        }
    }

    /// The kernel named `pid` (of cgroup `tenant`): queued, remembered for when its quiet time
    /// is up, or dropped (counted; a full pass is then due).
    pub fn offer(&mut self, pid: u32, tenant: u64, now: Instant) {
        if self.named.contains_key(&pid) {
            return;
        }
        if let Some(q) = self.quiet.get_mut(&pid) {
            if now < q.until {
                q.wanted = true;
                self.stats.deferred.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        self.enqueue(pid, tenant, now);
    }

    /// The kernel saw `pid` load a libcuda: queued even if its reads found nothing a moment ago
    /// (they will now); its tenant's share still holds.
    pub fn offer_now(&mut self, pid: u32, tenant: u64, now: Instant) {
        if self.named.contains_key(&pid) {
            return;
        }
        self.quiet.remove(&pid);
        self.enqueue(pid, tenant, now);
    }

    fn enqueue(&mut self, pid: u32, tenant: u64, next: Instant) {
        let waiting = self.per_tenant.get(&tenant).copied().unwrap_or(0);
        if waiting >= MAX_PER_TENANT || self.named.len() >= MAX_PENDING {
            self.overflowed = true;
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        *self.per_tenant.entry(tenant).or_default() += 1;
        self.named.insert(
            pid,
            Named {
                next,
                reads: 0,
                tenant,
            },
        );
    }

    /// Whether an open was dropped since this was last asked (a full pass is then due).
    pub fn take_overflow(&mut self) -> bool {
        std::mem::take(&mut self.overflowed)
    }

    /// Forgets every waiting process (a full pass reads them all).
    pub fn clear(&mut self) {
        self.named.clear();
        self.per_tenant.clear();
    }

    /// The processes due for a read now, the tenants taking turns (the one after the tenant
    /// served last first); quiet processes that opened meanwhile join when their time is up.
    pub fn due(&mut self, now: Instant) -> Vec<u32> {
        let woken: Vec<(u32, u64, Instant)> = self
            .quiet
            .iter()
            .filter(|(_, q)| q.wanted && q.until <= now)
            .map(|(pid, q)| (*pid, q.tenant, q.until))
            .collect();
        for (pid, tenant, until) in woken {
            if let Some(q) = self.quiet.get_mut(&pid) {
                q.wanted = false;
            }
            if !self.named.contains_key(&pid) {
                self.enqueue(pid, tenant, until);
            }
        }
        let mut by_tenant: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
        for (pid, n) in &self.named {
            if n.next <= now {
                by_tenant.entry(n.tenant).or_default().push(*pid);
            }
        }
        // Tenants after the last one served first, then the rest; one process each a turn.
        let mut turns: Vec<Vec<u32>> = by_tenant
            .range(self.last_tenant.saturating_add(1)..)
            .chain(by_tenant.range(..=self.last_tenant))
            .map(|(_, pids)| pids.clone())
            .collect();
        let mut out = Vec::new();
        let mut round = 0;
        loop {
            let before = out.len();
            for pids in &mut turns {
                if let Some(pid) = pids.get(round) {
                    out.push(*pid);
                }
            }
            if out.len() == before {
                break;
            }
            round += 1;
        }
        out
    }

    /// `pid` was read: `maps` whether it maps a libcuda (`None`: it is gone).
    pub fn done(&mut self, pid: u32, maps: Option<bool>, now: Instant) {
        let Some(n) = self.named.get_mut(&pid) else {
            return;
        };
        self.last_tenant = n.tenant;
        if maps == Some(false) {
            if let Some(wait) = RETRIES.get(n.reads) {
                // Read, mapping none yet: the loader maps right after it opens.
                n.next = now + *wait;
                n.reads += 1;
                return;
            }
        }
        let tenant = n.tenant;
        self.named.remove(&pid);
        if let Some(w) = self.per_tenant.get_mut(&tenant) {
            *w -= 1;
            if *w == 0 {
                self.per_tenant.remove(&tenant);
            }
        }
        match maps {
            Some(false) => self.quiet_down(pid, tenant, now),
            _ => {
                self.quiet.remove(&pid);
            }
        }
    }

    /// Its reads found nothing: left alone, twice as long as the last time.
    fn quiet_down(&mut self, pid: u32, tenant: u64, now: Instant) {
        if self.quiet.len() >= MAX_QUIET_PIDS && !self.quiet.contains_key(&pid) {
            if let Some(first) = self
                .quiet
                .iter()
                .min_by_key(|(_, q)| q.until)
                .map(|(p, _)| *p)
            {
                self.quiet.remove(&first);
            }
        }
        let q = self.quiet.entry(pid).or_insert(Quiet {
            until: now,
            delay: FIRST_QUIET / 2,
            wanted: false,
            tenant,
        });
        q.delay = (q.delay * 2).min(MAX_QUIET);
        q.until = now + q.delay;
        q.wanted = false;
        q.tenant = tenant;
    }

    /// How long until a waiting process is due (`None`: none waits).
    pub fn next_due(&self, now: Instant) -> Option<Duration> {
        let named = self.named.values().map(|n| n.next);
        let woken = self.quiet.values().filter(|q| q.wanted).map(|q| q.until);
        named
            .chain(woken)
            .min()
            .map(|t| t.saturating_duration_since(now))
    }

    /// Processes waiting now.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.named.len()
    }
}

#[cfg(test)]
mod tests;
