//! Discovery without polling: the kernel names each process that opened a file called like
//! libcuda (`OPENS`, written by the `sys_enter` raw tracepoint program), and only that process's
//! maps are read: at once, then again 2, 10, 50, 200 and 1,000 ms later until it maps a libcuda
//! (the loader maps a file right after opening it), in the order and within the budget that
//! [`super::queue`] sets. A full pass over every process runs at start, and later in steps
//! ([`super::sweep`]) when user space asks (a library waits for a slot, the kernel lost opens)
//! or a tenant's opens overflowed its share.
use std::{
    collections::HashSet,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{mpsc as std_mpsc, Arc},
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use tokio::sync::mpsc;
use tracer_common::opens::{OpenEvent, EXEC_WAKE_GAP_NS, OPEN_KIND_EXEC, OPEN_KIND_LOADED};

use super::{
    loaders::Loaders,
    queue::{thread_cpu, Queue},
    sweep::Sweep,
    Pass, Scanner, Settled,
};

/// Longest sleep of the thread with nothing to do: the kernel's opens and the loop's [`Bell`]
/// wake it before.
const IDLE_WAIT: Duration = Duration::from_secs(10);
/// While opens come, the loop hears from the thread at least this often (an empty pass).
const HEARD_EVERY: Duration = Duration::from_secs(1);

/// Wakes the discovery thread when the event loop sends it a request (an eventfd), so that the
/// thread sleeps while nothing happens.
#[derive(Clone)]
pub struct Bell(Arc<OwnedFd>);

impl Bell {
    /// A new eventfd.
    pub fn new() -> std::io::Result<Bell> {
        // SAFETY: eventfd takes no pointers; a negative return is an error, checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd was just opened and nothing else owns it.
        Ok(Bell(Arc::new(unsafe { OwnedFd::from_raw_fd(fd) })))
    }

    /// Wakes the thread (a full counter only means it is woken already).
    pub fn ring(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to an fd this Bell owns.
        unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Resets the counter after a wake.
    fn clear(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live buffer from an fd this Bell owns
        // (non-blocking: nothing to read returns EAGAIN).
        unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    }
}

/// What the event loop asks of the discovery thread.
pub struct Request {
    /// What the loop settled.
    pub settled: Settled,
    /// Read every process's maps (a full pass) and say what each maps.
    pub full: bool,
}

/// The thread's loop: kernel events in, passes out, until the event loop goes. The first full
/// pass (before `ready`) runs whole; a later one runs in steps under the reads' budget. With
/// `loaders`, every loader in the maps read is hooked, and each execution of a new file is read
/// once for its loader (its process read again, as a named one, when that loader was new: it
/// may have loaded a libcuda before the hook was there).
pub fn run(
    mut scanner: Scanner,
    mut loaders: Option<Loaders>,
    mut opens: RingBuf<MapData>,
    incoming: std_mpsc::Receiver<Request>,
    bell: Bell,
    out: mpsc::UnboundedSender<Pass>,
) {
    if let Some(l) = loaders.as_mut() {
        l.say_unsaid();
    }
    let mut settled = Settled::default();
    let mut queue = Queue::new(scanner.stats.clone(), Instant::now());
    let mut sweep: Option<Sweep> = None;
    let mut first = true;
    // When the loop last heard from this thread: while opens come, at least once a
    // [`HEARD_EVERY`], so that it can look at what the kernel lost (it keeps no timer of its
    // own while discovery is quiet).
    let mut told = Instant::now();
    loop {
        let mut full = false;
        loop {
            match incoming.try_recv() {
                Ok(r) => {
                    settled = r.settled;
                    full |= r.full;
                }
                Err(std_mpsc::TryRecvError::Empty) => break,
                Err(std_mpsc::TryRecvError::Disconnected) => return,
            }
        }
        if full && first {
            first = false;
            queue.clear();
            if out.send(scanner.pass(&settled)).is_err() {
                return;
            }
        }
        let now = Instant::now();
        let mut heard = false;
        let mut execs = Vec::new();
        while let Some(item) = opens.next() {
            heard = true;
            if item.len() < std::mem::size_of::<OpenEvent>() {
                continue;
            }
            // SAFETY: the kernel wrote an OpenEvent (plain integers), length checked above.
            let ev: OpenEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            match ev.kind {
                OPEN_KIND_EXEC => execs.push(ev),
                OPEN_KIND_LOADED => queue.offer_now(ev.pid, ev.cgroup, now),
                _ => queue.offer(ev.pid, ev.cgroup, now),
            }
        }
        // A full pass asked for (a slot given back, opens lost or dropped): read every process
        // in steps; what waits is read by it.
        if (full || queue.take_overflow()) && sweep.is_none() {
            queue.clear();
            sweep = Sweep::start(&mut scanner);
        }
        // The named processes, tenants taking turns, while the budget lasts; with a full pass
        // under way, half of what the budget holds is left to it, so that a flood of named
        // processes cannot hold it off.
        let keep = match sweep {
            Some(_) => queue.budget.held(now) / 2,
            None => Duration::ZERO,
        };
        let (mut found, mut tried, mut mapped) = (Vec::new(), HashSet::new(), HashSet::new());
        for pid in queue.due(now) {
            if !queue.budget.left_over(Instant::now(), keep) {
                break;
            }
            let cpu = thread_cpu();
            let maps = scanner.scan(pid, &settled, now, &mut tried, &mut mapped, &mut found);
            queue.budget.spend(thread_cpu().saturating_sub(cpu));
            queue.done(pid, maps, now);
        }
        let executed = !execs.is_empty();
        if let Some(l) = loaders.as_mut() {
            for ev in execs {
                if !queue.budget.left_over(Instant::now(), keep) {
                    l.forget(ev.exe);
                    continue;
                }
                let cpu = thread_cpu();
                let maps = scanner.scan(ev.pid, &settled, now, &mut tried, &mut mapped, &mut found);
                queue.budget.spend(thread_cpu().saturating_sub(cpu));
                scanner
                    .stats
                    .execs_read
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if maps.is_none() {
                    l.again(ev.exe);
                }
                let seen = std::mem::take(scanner.loaders.get_or_insert_with(Vec::new));
                for (pid, m) in seen {
                    if l.watch(pid, &m) && maps.is_some() {
                        queue.offer(pid, ev.cgroup, now);
                    }
                }
            }
        }
        let mut passes = Vec::new();
        if !found.is_empty() {
            passes.push(Pass {
                found,
                mapped: None,
            });
        }
        if let Some(done) = sweep
            .as_mut()
            .and_then(|s| s.step(&mut scanner, &settled, &mut queue.budget, Duration::ZERO))
        {
            sweep = None;
            passes.push(done);
        }
        if passes.is_empty() && heard && told.elapsed() >= HEARD_EVERY {
            passes.push(Pass::default());
        }
        if !passes.is_empty() {
            told = Instant::now();
        }
        // The loaders in every other read (the first pass, named processes, a sweep's step).
        if let (Some(l), Some(seen)) = (loaders.as_mut(), scanner.loaders.as_mut()) {
            for (pid, m) in std::mem::take(seen) {
                l.watch(pid, &m);
            }
        }
        for pass in passes {
            settled.skip.extend(pass.found.iter().map(|p| {
                use std::os::unix::fs::MetadataExt as _;
                (p.meta.dev(), p.meta.ino())
            }));
            if out.send(pass).is_err() {
                return;
            }
        }
        // Asleep until a named process is due or a full pass may go on, and the budget holds
        // something again.
        let now = Instant::now();
        let mut wait = queue.next_due(now).unwrap_or(IDLE_WAIT).min(IDLE_WAIT);
        if sweep.is_some() {
            wait = Duration::ZERO;
        }
        // Executions after the one that woke this thread wake nobody for a while: read them
        // within that while.
        if executed {
            wait = wait.min(Duration::from_nanos(EXEC_WAKE_GAP_NS));
        }
        wait = wait.max(queue.budget.wait(now, Duration::ZERO));
        let mut fds = [opens.as_raw_fd(), bell.0.as_raw_fd()].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: two valid pollfds for the duration of the call.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, wait.as_millis().max(1) as i32) };
        if fds[1].revents != 0 {
            bell.clear();
        }
    }
}
