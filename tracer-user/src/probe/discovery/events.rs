//! Discovery without polling: the kernel names each process that opened a file called like
//! libcuda (`OPENS`, written by the `sys_enter` raw tracepoint program), and only that process's
//! maps are read: at once, then again 2, 10, 50, 200 and 1,000 ms later until it maps a libcuda
//! (the loader maps a file right after opening it). A full pass over every process runs at
//! start, when user space asks (a library waits for a slot), and when the kernel lost opens.
use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{mpsc as std_mpsc, Arc},
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use tokio::sync::mpsc;
use tracer_common::opens::OpenEvent;

use super::{Pass, Scanner, Settled};

/// When a named process's maps are read again, after the first read found no libcuda.
const RETRIES: [Duration; 5] = [
    Duration::from_millis(2),
    Duration::from_millis(10),
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_millis(1000),
];
/// Processes waiting for a read at most (a flood of opens beyond is left to the next full pass).
const MAX_PENDING: usize = 4096;
/// One process's maps are read at most once in this long, however often it opens (a tenant
/// opening `libcuda.so` in a loop costs one read per gap, not one per open).
const MIN_GAP: Duration = Duration::from_millis(50);
/// Longest sleep of the thread with nothing to do: the kernel's opens and the loop's [`Bell`]
/// wake it before.
const IDLE_WAIT: Duration = Duration::from_secs(10);

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

/// A process named by the kernel: when its maps are read next, and how many reads it has had.
struct Named {
    next: Instant,
    reads: usize,
}

/// The thread's loop: kernel events in, passes out, until the event loop goes.
pub fn run(
    mut scanner: Scanner,
    mut opens: RingBuf<MapData>,
    incoming: std_mpsc::Receiver<Request>,
    bell: Bell,
    out: mpsc::UnboundedSender<Pass>,
) {
    let mut settled = Settled::default();
    let mut named: HashMap<u32, Named> = HashMap::new();
    let mut last_read: HashMap<u32, Instant> = HashMap::new();
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
        if full {
            named.clear();
            if out.send(scanner.pass(&settled)).is_err() {
                return;
            }
        }
        let now = Instant::now();
        while let Some(item) = opens.next() {
            if item.len() < std::mem::size_of::<OpenEvent>() {
                continue;
            }
            // SAFETY: the kernel wrote an OpenEvent (two u32), length checked above.
            let ev: OpenEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            // A process waiting for a read keeps its turn; another is read at once, or one
            // gap after its last read.
            if named.len() < MAX_PENDING && !named.contains_key(&ev.pid) {
                let next = last_read
                    .get(&ev.pid)
                    .map_or(now, |t| (*t + MIN_GAP).max(now));
                named.insert(ev.pid, Named { next, reads: 0 });
            }
        }
        last_read.retain(|_, t| now.duration_since(*t) < MIN_GAP);
        let due: Vec<u32> = named
            .iter()
            .filter(|(_, n)| n.next <= now)
            .map(|(pid, _)| *pid)
            .collect();
        let (mut found, mut tried, mut mapped) = (Vec::new(), HashSet::new(), HashSet::new());
        for pid in due {
            let maps_one = scanner.scan(pid, &settled, now, &mut tried, &mut mapped, &mut found);
            if last_read.len() < MAX_PENDING {
                last_read.insert(pid, now);
            }
            let n = named.get_mut(&pid).expect("due");
            match RETRIES.get(n.reads) {
                // Read, mapping none yet: the loader maps right after it opens.
                Some(wait) if maps_one == Some(false) => {
                    n.next = now + *wait;
                    n.reads += 1;
                }
                _ => {
                    named.remove(&pid);
                }
            }
        }
        if !found.is_empty() {
            settled.skip.extend(found.iter().map(|p| {
                use std::os::unix::fs::MetadataExt as _;
                (p.meta.dev(), p.meta.ino())
            }));
            let pass = Pass {
                found,
                mapped: None,
            };
            if out.send(pass).is_err() {
                return;
            }
        }
        let wait = named
            .values()
            .map(|n| n.next.saturating_duration_since(Instant::now()))
            .min()
            .unwrap_or(IDLE_WAIT)
            .min(IDLE_WAIT);
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
