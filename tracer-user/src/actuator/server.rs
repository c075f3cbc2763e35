//! `cudatrace actuator`'s loop: the socket, the holds, their deadlines and their undo.
use std::{
    collections::HashSet,
    os::unix::fs::PermissionsExt as _,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader},
    net::{UnixListener, UnixStream},
    sync::{Notify, Semaphore},
};

use super::{
    cgroup::{self, Roots, Target},
    journal::{Hold, Journal},
    Reply, Request, MAX_CONNECTIONS, MAX_HOLDS, MAX_HOLD_S, MAX_LINE,
};
use crate::text::printable;

/// What `serve` needs.
pub struct Options {
    /// The socket cudatrace connects to.
    pub socket: PathBuf,
    /// The journal of held caps.
    pub journal: PathBuf,
    /// The uids whose connections are served.
    pub allow_uid: Vec<u32>,
    /// Executables besides this one whose processes are served.
    pub allow_exe: Vec<PathBuf>,
    /// The cgroup hierarchies.
    pub roots: Roots,
}

/// The holds, by connection.
struct State {
    holds: Vec<(u64, Hold)>,
    journal: Journal,
    roots: Roots,
    own: Option<Target>,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Restores one hold's files; says what it did.
fn restore(h: &Hold, why: &str) {
    match cgroup::write_all(&h.dir, &h.restore) {
        Ok(()) => log::warn!(
            "actuator: undid the cap of {} (pid {}) {why}: {}",
            printable(&h.dir.display().to_string()),
            h.pid,
            h.restore
                .iter()
                .map(|(f, v)| format!("{f} = {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Err(e) => log::warn!("actuator: could not undo a cap {why}: {}", printable(&e)),
    }
}

impl State {
    fn save(&self) -> Result<(), String> {
        let holds: Vec<Hold> = self.holds.iter().map(|(_, h)| h.clone()).collect();
        self.journal.save(&holds)
    }

    /// Undoes the holds `which` picks, journals what is left.
    fn undo(&mut self, which: impl Fn(u64, &Hold) -> bool, why: &str) -> usize {
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.holds)
            .into_iter()
            .partition(|(c, h)| which(*c, h));
        self.holds = kept;
        for (_, h) in &gone {
            restore(h, why);
        }
        if !gone.is_empty() {
            if let Err(e) = self.save() {
                log::warn!("actuator: {}", printable(&e));
            }
        }
        gone.len()
    }

    fn cap(&mut self, conn: u64, peer: Option<&Target>, r: Request) -> Reply {
        let refuse = |detail: String| Reply { ok: false, detail };
        let Request::Cap {
            key,
            pid,
            comm,
            start_time,
            cpu_max,
            hold_s,
        } = r
        else {
            return refuse("not a cap".into());
        };
        if self.holds.len() >= MAX_HOLDS {
            return refuse(format!("{MAX_HOLDS} caps are held already"));
        }
        if pid == 0 {
            return refuse("give the aggressor's pid".into());
        }
        let now_comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let short = |s: &str| s.trim_end().bytes().take(15).collect::<Vec<u8>>();
        if short(&now_comm) != short(&comm) {
            return refuse(format!(
                "pid {pid} is not {} now (it is {:?}): it ended",
                printable(&comm),
                printable(now_comm.trim_end())
            ));
        }
        // The process itself, not its pid: a pidfd, then its start time, then its cgroup, then
        // the pidfd again (a process that ended meanwhile, its pid taken by another, fails).
        let pidfd = match super::target::Pidfd::open(pid, start_time) {
            Ok(fd) => fd,
            Err(e) => return refuse(e),
        };
        let t = match cgroup::proc_cgroup(pid).and_then(|text| cgroup::target(&self.roots, &text)) {
            Ok(t) => t,
            Err(e) => return refuse(format!("pid {pid}: {e}")),
        };
        if let Err(e) = pidfd.still_there() {
            return refuse(e);
        }
        let protected: Vec<Target> = self.own.iter().chain(peer).cloned().collect();
        if let Err(e) = cgroup::check_protected(&t, &protected) {
            return refuse(e);
        }
        if let Some((_, h)) = self.holds.iter().find(|(_, h)| h.dir == t.dir) {
            return Reply {
                ok: true,
                detail: format!(
                    "{} is capped already (for {})",
                    t.dir.display(),
                    printable(&h.key)
                ),
            };
        }
        let writes = match cgroup::cap_writes(&t, &cpu_max) {
            Ok(w) => w,
            Err(e) => return refuse(e),
        };
        let restore_to = match cgroup::current(&t) {
            Ok(r) => r,
            Err(e) => return refuse(e),
        };
        let hold_s = hold_s.clamp(1, MAX_HOLD_S);
        let h = Hold {
            key,
            pid,
            dir: t.dir.clone(),
            restore: restore_to,
            cpu_max,
            until_unix: now_unix() + hold_s,
        };
        self.holds.push((conn, h.clone()));
        if let Err(e) = self.save() {
            self.holds.pop();
            return refuse(format!("not capped, the journal failed: {e}"));
        }
        if let Err(e) = cgroup::write_all(&t.dir, &writes) {
            let _ = cgroup::write_all(&t.dir, &h.restore);
            self.holds.pop();
            let _ = self.save();
            return refuse(e);
        }
        let was = h
            .restore
            .iter()
            .map(|(f, v)| format!("{f} = {v}"))
            .collect::<Vec<_>>();
        log::warn!(
            "actuator: capped {} (pid {pid}) at cpu.max {:?} for at most {hold_s} s (was {})",
            t.dir.display(),
            h.cpu_max,
            was.join(", ")
        );
        Reply {
            ok: true,
            detail: format!(
                "capped {} at {:?} for at most {hold_s} s (was {})",
                t.dir.display(),
                h.cpu_max,
                was.join(", ")
            ),
        }
    }
}

/// Undoes what a killed actuator left in `journal`: the number undone.
pub fn restore_left(journal: &Journal) -> Result<usize, String> {
    let left = journal.load()?;
    for h in &left {
        restore(h, "left by a previous run");
    }
    journal.save(&[])?;
    Ok(left.len())
}

/// Serves until `stop` completes, then undoes every cap it holds.
pub async fn serve(
    opts: Options,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let journal = Journal::new(&opts.journal);
    let left = restore_left(&journal).map_err(|e| anyhow::anyhow!("actuator: {e}"))?;
    let own = cgroup::proc_cgroup(std::process::id())
        .and_then(|t| cgroup::target(&opts.roots, &t))
        .ok();
    let state = Arc::new(Mutex::new(State {
        holds: Vec::new(),
        journal,
        roots: opts.roots,
        own,
    }));
    let _ = std::fs::remove_file(&opts.socket);
    let listener = UnixListener::bind(&opts.socket).map_err(|e| {
        anyhow::anyhow!(
            "actuator: cannot listen on {}: {e}; give --socket a writable path",
            opts.socket.display()
        )
    })?;
    std::fs::set_permissions(&opts.socket, std::fs::Permissions::from_mode(0o600))?;
    if let Some(uid) = opts.allow_uid.iter().find(|u| **u != 0) {
        std::os::unix::fs::chown(&opts.socket, Some(*uid), None)?;
    }
    log::info!(
        target: "cudatrace::ready", left = left;
        "ready: actuator listening on {} for uid {:?}; {left} cap(s) left by a previous run undone",
        opts.socket.display(),
        opts.allow_uid
    );
    let allow: HashSet<u32> = opts.allow_uid.into_iter().collect();
    let exes: Arc<Vec<Exe>> = Arc::new(
        std::iter::once(PathBuf::from("/proc/self/exe"))
            .chain(opts.allow_exe)
            .map(|p| Exe::of(&p))
            .collect(),
    );
    let woken = Arc::new(Notify::new());
    let expiry = tokio::spawn(expire(state.clone(), woken.clone()));
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(stop);
    let mut next_conn = 0u64;
    loop {
        tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    log::warn!("actuator: {MAX_CONNECTIONS} connections open already: one refused");
                    continue;
                };
                next_conn += 1;
                let (state, woken, allow) = (state.clone(), woken.clone(), allow.clone());
                let (conn, exes) = (next_conn, exes.clone());
                tokio::spawn(async move {
                    connection(stream, conn, &state, &woken, &allow, &exes).await;
                    let n = lock(&state).undo(|c, _| c == conn, "as cudatrace's connection ended");
                    if n > 0 {
                        log::warn!("actuator: cudatrace went away holding {n} cap(s): undone");
                    }
                    drop(permit);
                });
            }
        }
    }
    expiry.abort();
    lock(&state).undo(|_, _| true, "as the actuator stops");
    let _ = std::fs::remove_file(&opts.socket);
    Ok(())
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Undoes each hold at its deadline; sleeps while none is held.
async fn expire(state: Arc<Mutex<State>>, woken: Arc<Notify>) {
    loop {
        let empty = lock(&state).holds.is_empty();
        if empty {
            woken.notified().await;
            continue;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = now_unix();
        lock(&state).undo(|_, h| h.until_unix <= now, "at its time limit");
    }
}

/// An executable, by its path and by its file.
#[derive(Clone, Debug, PartialEq)]
pub struct Exe(Option<PathBuf>, Option<(u64, u64)>);

impl Exe {
    /// What `link` (an executable, or a `/proc/PID/exe`) names.
    pub fn of(link: &std::path::Path) -> Exe {
        use std::os::unix::fs::MetadataExt as _;
        let path = std::fs::read_link(link)
            .ok()
            .or_else(|| link.canonicalize().ok());
        Exe(
            path,
            std::fs::metadata(link).ok().map(|m| (m.dev(), m.ino())),
        )
    }

    /// Whether both name one program: the same path, or the same file.
    fn same(&self, other: &Exe) -> bool {
        (self.0.is_some() && self.0 == other.0) || (self.1.is_some() && self.1 == other.1)
    }
}

/// Whether process `pid` runs one of the allowed executables.
fn allowed_program(pid: Option<i32>, exes: &[Exe]) -> bool {
    let Some(pid) = pid else { return false };
    let theirs = Exe::of(std::path::Path::new(&format!("/proc/{pid}/exe")));
    exes.iter().any(|e| e.same(&theirs))
}

/// One client: its uid and program checked, then one reply per request line.
async fn connection(
    stream: UnixStream,
    conn: u64,
    state: &Mutex<State>,
    woken: &Notify,
    allow: &HashSet<u32>,
    exes: &[Exe],
) {
    let cred = stream.peer_cred().ok();
    let (rd, mut wr) = stream.into_split();
    let answer = |r: Reply| {
        let mut line = serde_json::to_vec(&r).unwrap_or_default();
        line.push(b'\n');
        line
    };
    let refused = match cred {
        None => Some("its credentials are unknown".to_owned()),
        Some(c) if !allow.contains(&c.uid()) => {
            Some(format!("uid {} is not allowed: give --allow-uid", c.uid()))
        }
        Some(c) if !allowed_program(c.pid(), exes) => Some(format!(
            "pid {} does not run cudatrace (give --allow-exe for another build)",
            c.pid().map_or("unknown".into(), |p| p.to_string())
        )),
        Some(_) => None,
    };
    let (Some(cred), None) = (cred, &refused) else {
        let why = refused.unwrap_or_default();
        log::warn!("actuator: a connection refused: {}", printable(&why));
        let _ = wr
            .write_all(&answer(Reply {
                ok: false,
                detail: why,
            }))
            .await;
        return;
    };
    let peer = {
        let roots = lock(state).roots.clone();
        cred.pid()
            .and_then(|p| u32::try_from(p).ok())
            .and_then(|p| cgroup::proc_cgroup(p).ok())
            .and_then(|t| cgroup::target(&roots, &t).ok())
    };
    let mut rd = BufReader::new(rd);
    loop {
        let mut line = String::new();
        match (&mut rd)
            .take(MAX_LINE as u64 + 1)
            .read_line(&mut line)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if !line.ends_with('\n') {
            let _ = wr
                .write_all(&answer(Reply {
                    ok: false,
                    detail: format!("a request is one line of at most {MAX_LINE} bytes"),
                }))
                .await;
            return;
        }
        let reply = match serde_json::from_str::<Request>(&line) {
            Err(e) => Reply {
                ok: false,
                detail: format!("not a request: {e}"),
            },
            Ok(r @ Request::Cap { .. }) => {
                let reply = lock(state).cap(conn, peer.as_ref(), r);
                woken.notify_one();
                reply
            }
            Ok(Request::Undo { key }) => {
                let n =
                    lock(state).undo(|c, h| c == conn && h.key == key, "as its verdict resolved");
                Reply {
                    ok: true,
                    detail: format!("{n} cap(s) undone"),
                }
            }
        };
        if wr.write_all(&answer(reply)).await.is_err() {
            return;
        }
    }
}
