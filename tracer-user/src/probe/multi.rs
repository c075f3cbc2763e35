//! uprobe_multi links (Linux 6.6+), and the one kprobe_multi link of discovery's open hook: one BPF link per library and program for all of its
//! symbols, with a cookie per symbol. Unlike a classic perf-event uprobe, creating one needs only
//! CAP_BPF and CAP_PERFMON (no CAP_SYS_ADMIN), and closing it removes every probe of the link at
//! once, where classic uprobes wait for an RCU grace period each.
//!
//! The kernel requires the programs to be loaded with the expected attach type
//! `BPF_TRACE_UPROBE_MULTI`, which aya 0.14 cannot set: this module parses the same object with
//! aya-obj, relocates it against the maps aya created, and loads the four uprobe programs with
//! `bpf(2)` itself. Everything else (maps, the exit tracepoint, reading) stays aya's.
use std::{
    collections::{HashMap, HashSet},
    ffi::CString,
    io,
    os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
    path::Path,
};

use aya::{maps::Map, Ebpf};
use thiserror::Error;
use tracer_common::{
    names::{PROG_LAUNCH, PROG_LAUNCH_EX, PROG_REGS, PROG_RETURN, PROG_SESSION, PROG_SESSION_EX},
    Layout,
};

use super::symbols::Resolved;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
const BPF_TRACE_KPROBE_MULTI: u32 = 42;
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;
/// Linux 6.13's attach type of uprobe sessions (`enum bpf_attach_type`, after
/// `BPF_TRACE_KPROBE_SESSION` = 56).
const BPF_TRACE_UPROBE_SESSION: u32 = 57;

/// What a uprobe_multi link runs its program on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The symbols' entries.
    Entry,
    /// Their returns.
    Return,
    /// Both, one program: the return only when the entry returned 0 (Linux 6.13+).
    Session,
}

/// Why the multi-uprobe path cannot be used, or a library not attached through it.
#[derive(Debug, Error)]
pub enum MultiError {
    /// The object could not be parsed or relocated.
    #[error("cannot prepare the eBPF programs for uprobe_multi: {0}")]
    Object(String),
    /// The kernel refused to load a program with the uprobe_multi attach type.
    #[error("the kernel refused program {program} for a multi link ({source})")]
    Load {
        /// Which program.
        program: &'static str,
        /// The errno.
        source: io::Error,
    },
    /// The kernel refused the link.
    #[error("cannot create a multi link for {program} in {path} ({source})")]
    Link {
        /// Which program.
        program: &'static str,
        /// The library.
        path: String,
        /// The errno.
        source: io::Error,
    },
}

impl MultiError {
    /// Whether the kernel lacks uprobe_multi (before 6.6), rather than refusing this attach.
    pub fn unsupported(&self) -> bool {
        let errno = match self {
            MultiError::Load { source, .. } | MultiError::Link { source, .. } => {
                source.raw_os_error()
            }
            MultiError::Object(_) => return false,
        };
        matches!(
            errno,
            Some(libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS | libc::E2BIG)
        )
    }
}

/// `union bpf_attr` for BPF_PROG_LOAD, as far as it is used (the kernel zero-fills the rest).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `union bpf_attr` for BPF_LINK_CREATE with its `uprobe_multi` member.
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    _pad: u32,
}

// The kernel's layout (include/uapi/linux/bpf.h), checked here.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(
        offset_of!(ProgLoadAttr, prog_name) == 48
            && offset_of!(ProgLoadAttr, expected_attach_type) == 68
    );
    assert!(size_of::<ProgLoadAttr>() == 72);
    assert!(offset_of!(LinkCreateAttr, path) == 16 && offset_of!(LinkCreateAttr, cookies) == 40);
    assert!(offset_of!(LinkCreateAttr, cnt) == 48 && offset_of!(LinkCreateAttr, pid) == 56);
};

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a live, initialised `#[repr(C)]` prefix of `union bpf_attr` for `cmd`,
    // and its size is passed with it; the pointers inside it outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *mut T).cast::<libc::c_void>(),
            size_of::<T>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: on success BPF_PROG_LOAD and BPF_LINK_CREATE return a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The uprobe programs, loaded for uprobe_multi links; the session programs of the launch
/// families where the kernel has uprobe sessions.
pub struct MultiPrograms {
    by_name: HashMap<&'static str, OwnedFd>,
    /// Why launches are probed by the classic pair (`None`: by the session programs).
    pair_because: Option<String>,
}

/// The raw fd of a map aya created, for the map types this object declares.
fn map_fd(map: &Map) -> Option<RawFd> {
    match map {
        Map::Array(m)
        | Map::HashMap(m)
        | Map::LruHashMap(m)
        | Map::PerCpuArray(m)
        | Map::PerCpuHashMap(m)
        | Map::PerCpuLruHashMap(m)
        | Map::RingBuf(m) => Some(m.fd().as_fd().as_raw_fd()),
        _ => None,
    }
}

/// `object`'s maps relocated against those `ebpf` created (which must all still be in it).
fn relocated(object: &[u8], ebpf: &Ebpf) -> Result<aya_obj::Object, MultiError> {
    let mut obj = aya_obj::Object::parse(object).map_err(|e| MultiError::Object(e.to_string()))?;
    let fds: HashMap<&str, RawFd> = ebpf
        .maps()
        .filter_map(|(name, map)| Some((name, map_fd(map)?)))
        .collect();
    let maps: Vec<(String, aya_obj::Map)> = obj.maps.drain().collect();
    let mut with_fds = Vec::new();
    for (name, map) in &maps {
        let fd = fds
            .get(name.as_str())
            .ok_or_else(|| MultiError::Object(format!("map {name} was not created")))?;
        with_fds.push((name.as_str(), *fd, map));
    }
    let text_sections: HashSet<usize> = obj.functions.keys().map(|(section, _)| *section).collect();
    obj.relocate_maps(with_fds.into_iter(), &text_sections)
        .map_err(|e| MultiError::Object(e.to_string()))?;
    obj.relocate_calls(&text_sections)
        .map_err(|e| MultiError::Object(e.to_string()))?;
    Ok(obj)
}

/// Loads program `name` of a relocated object with the uprobe_multi attach type.
fn load_one(obj: &aya_obj::Object, name: &'static str) -> Result<OwnedFd, MultiError> {
    load_as(obj, name, BPF_TRACE_UPROBE_MULTI)
}

/// Loads program `name` of a relocated object with the expected attach type `attach_type`.
fn load_as(
    obj: &aya_obj::Object,
    name: &'static str,
    attach_type: u32,
) -> Result<OwnedFd, MultiError> {
    let prog = obj
        .programs
        .get(name)
        .ok_or_else(|| MultiError::Object(format!("no program {name}")))?;
    let function = &obj.functions[&prog.function_key()];
    let license: &CString = &prog.license;
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_KPROBE,
        insn_cnt: function.instructions.len() as u32,
        insns: function.instructions.as_ptr() as u64,
        license: license.as_ptr() as u64,
        expected_attach_type: attach_type,
        ..Default::default()
    };
    let bytes = name.as_bytes();
    attr.prog_name[..bytes.len().min(15)].copy_from_slice(&bytes[..bytes.len().min(15)]);
    bpf(BPF_PROG_LOAD, &mut attr).map_err(|source| MultiError::Load {
        program: name,
        source,
    })
}

/// `object` parsed and relocated against `ebpf`'s maps (which must all still be in it), to
/// load programs from later ([`load_uprobe_from`], [`load_kprobe_from`]).
pub fn relocate(object: &[u8], ebpf: &Ebpf) -> Result<aya_obj::Object, MultiError> {
    relocated(object, ebpf)
}

/// Program `name` of a relocated object, loaded for uprobe_multi links.
pub fn load_uprobe_from(obj: &aya_obj::Object, name: &'static str) -> Result<OwnedFd, MultiError> {
    load_one(obj, name)
}

/// Program `name` of a relocated object, loaded for kprobe_multi links.
pub fn load_kprobe_from(obj: &aya_obj::Object, name: &'static str) -> Result<OwnedFd, MultiError> {
    load_as(obj, name, BPF_TRACE_KPROBE_MULTI)
}

/// Loads one program of `object` for uprobe_multi links, relocated against `ebpf`'s maps.
pub fn load_program(object: &[u8], ebpf: &Ebpf, name: &'static str) -> Result<OwnedFd, MultiError> {
    load_one(&relocated(object, ebpf)?, name)
}

/// `union bpf_attr` for BPF_LINK_CREATE with its `kprobe_multi` member.
#[repr(C)]
#[derive(Default)]
struct KprobeLinkAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    multi_flags: u32,
    cnt: u32,
    syms: u64,
    addrs: u64,
    cookies: u64,
}
const _: () = assert!(std::mem::offset_of!(KprobeLinkAttr, syms) == 24);

/// Program `name` of `object`, relocated against `ebpf`'s maps (which must all still be in it),
/// loaded for kprobe_multi links.
pub fn load_kprobe(object: &[u8], ebpf: &Ebpf, name: &'static str) -> Result<OwnedFd, MultiError> {
    load_as(&relocated(object, ebpf)?, name, BPF_TRACE_KPROBE_MULTI)
}

/// A kprobe_multi link of `prog` (named `program` in errors) on the kernel function `function`
/// (Linux 5.18+ with fprobe; CAP_BPF and CAP_PERFMON).
pub fn kprobe_link(
    prog: &OwnedFd,
    program: &'static str,
    function: &str,
) -> Result<OwnedFd, MultiError> {
    let symbol = CString::new(function)
        .map_err(|_| MultiError::Object(format!("{function:?} has a NUL byte")))?;
    let syms = [symbol.as_ptr() as u64];
    let mut attr = KprobeLinkAttr {
        prog_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_TRACE_KPROBE_MULTI,
        cnt: 1,
        syms: syms.as_ptr() as u64,
        ..Default::default()
    };
    bpf(BPF_LINK_CREATE, &mut attr).map_err(|source| MultiError::Link {
        program,
        path: format!("kernel function {function}"),
        source,
    })
}

/// `union bpf_attr` for BPF_RAW_TRACEPOINT_OPEN.
#[repr(C)]
#[derive(Default)]
struct RawTracepointAttr {
    name: u64,
    prog_fd: u32,
    pad: u32,
}

/// Attaches the loaded raw-tracepoint program `prog` to the raw tracepoint `name`; the link
/// holds it.
pub fn raw_tracepoint(prog: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    let name = CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
    let mut attr = RawTracepointAttr {
        name: name.as_ptr() as u64,
        prog_fd: prog.as_raw_fd() as u32,
        pad: 0,
    };
    bpf(BPF_RAW_TRACEPOINT_OPEN, &mut attr)
}

/// One uprobe_multi link of `prog` (named `program` in errors) on `offsets` of the library at
/// `path` (`shown` names it), a cookie each, run as `mode` says; `pid` restricts it.
#[allow(clippy::too_many_arguments)]
pub fn link(
    prog: &OwnedFd,
    program: &'static str,
    path: &Path,
    shown: &Path,
    offsets: &[u64],
    cookies: &[u64],
    mode: Mode,
    pid: Option<u32>,
) -> Result<OwnedFd, MultiError> {
    let c_path = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| MultiError::Object(format!("{} has a NUL byte", path.display())))?;
    let mut attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        attach_type: if mode == Mode::Session {
            BPF_TRACE_UPROBE_SESSION
        } else {
            BPF_TRACE_UPROBE_MULTI
        },
        path: c_path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        cookies: cookies.as_ptr() as u64,
        cnt: offsets.len() as u32,
        multi_flags: if mode == Mode::Return {
            BPF_F_UPROBE_MULTI_RETURN
        } else {
            0
        },
        pid: pid.unwrap_or(0),
        ..Default::default()
    };
    bpf(BPF_LINK_CREATE, &mut attr).map_err(|source| MultiError::Link {
        program,
        path: shown.display().to_string(),
        source,
    })
}

impl MultiPrograms {
    /// Loads the uprobe programs of `object` relocated against `ebpf`'s maps (which must all
    /// still be in it), and the session programs unless the kernel refuses them or `pair` asks
    /// for the classic pair.
    pub fn load(object: &[u8], ebpf: &Ebpf, pair: bool) -> Result<MultiPrograms, MultiError> {
        let obj = relocated(object, ebpf)?;
        let mut by_name = HashMap::new();
        for name in [PROG_LAUNCH, PROG_LAUNCH_EX, PROG_REGS, PROG_RETURN] {
            by_name.insert(name, load_one(&obj, name)?);
        }
        let pair_because = if pair {
            Some("asked for by CUDATRACE_ATTACH=pair".to_string())
        } else {
            let sessions = [PROG_SESSION, PROG_SESSION_EX]
                .into_iter()
                .map(|name| Ok((name, load_as(&obj, name, BPF_TRACE_UPROBE_SESSION)?)))
                .collect::<Result<Vec<_>, MultiError>>();
            match sessions {
                Ok(loaded) => {
                    by_name.extend(loaded);
                    None
                }
                Err(e) => Some(e.to_string()),
            }
        };
        Ok(MultiPrograms {
            by_name,
            pair_because,
        })
    }

    /// The loaded program `name` (one of the programs loaded above).
    pub fn program(&self, name: &'static str) -> &OwnedFd {
        &self.by_name[name]
    }

    /// Why launches are probed by the classic uprobe and uretprobe pair (`None`: by uprobe
    /// sessions, the return only for the launches sampled).
    pub fn pair_because(&self) -> Option<&str> {
        self.pair_because.as_deref()
    }

    /// Attaches every resolved symbol of the library at `path` (`shown` names it in errors): one
    /// link per entry program (by argument layout) and one for the return program, each
    /// symbol's api in its cookie. `pid` restricts the probes to one process.
    /// A kernel that loads the session programs but refuses their links (before 6.13 the
    /// attach type is not checked at load) gets the pair, said once.
    pub fn attach(
        &mut self,
        path: &Path,
        shown: &Path,
        found: &[Resolved],
        pid: Option<u32>,
    ) -> Result<Vec<OwnedFd>, MultiError> {
        match self.attach_as_loaded(path, shown, found, pid) {
            Err(e) if self.pair_because.is_none() && e.unsupported() => {
                self.pair_because = Some(format!("a session link was refused: {e}"));
                super::session::say_pair(self.pair_because.as_deref().unwrap_or_default());
                self.attach_as_loaded(path, shown, found, pid)
            }
            attached => attached,
        }
    }

    fn attach_as_loaded(
        &self,
        path: &Path,
        shown: &Path,
        found: &[Resolved],
        pid: Option<u32>,
    ) -> Result<Vec<OwnedFd>, MultiError> {
        let mut links = Vec::new();
        // With sessions, the launch families' returns are their session programs'.
        let groups = if self.pair_because.is_none() {
            [
                (PROG_SESSION, Some(Layout::Launch), Mode::Session),
                (PROG_SESSION_EX, Some(Layout::LaunchEx), Mode::Session),
                (PROG_REGS, Some(Layout::Regs), Mode::Entry),
                (PROG_RETURN, Some(Layout::Regs), Mode::Return),
            ]
        } else {
            [
                (PROG_LAUNCH, Some(Layout::Launch), Mode::Entry),
                (PROG_LAUNCH_EX, Some(Layout::LaunchEx), Mode::Entry),
                (PROG_REGS, Some(Layout::Regs), Mode::Entry),
                // The launches' returns: `super::windows`.
                (PROG_RETURN, Some(Layout::Regs), Mode::Return),
            ]
        };
        for (program, layout, mode) in groups {
            let chosen: Vec<&Resolved> = found
                .iter()
                .filter(|r| layout.is_none_or(|l| r.api.info().layout == l))
                .collect();
            if chosen.is_empty() {
                continue;
            }
            let offsets: Vec<u64> = chosen.iter().map(|r| r.offset).collect();
            let cookies: Vec<u64> = chosen.iter().map(|r| r.cookie()).collect();
            links.push(link(
                &self.by_name[program],
                program,
                path,
                shown,
                &offsets,
                &cookies,
                mode,
                pid,
            )?);
        }
        Ok(links)
    }
}

/// Closes uprobe_multi links on a thread of its own: closing one waits for a grace period in
/// the kernel, so sixteen libraries detached at once stalled the event loop for 2.7 s (measured
/// here, in the one-off libraries test). The probes are gone a moment later instead of at once.
pub fn close_later(links: Vec<std::os::fd::OwnedFd>) {
    use std::sync::{mpsc, OnceLock};
    type Links = Vec<std::os::fd::OwnedFd>;
    static CLOSER: OnceLock<Option<mpsc::Sender<Links>>> = OnceLock::new();
    let closer = CLOSER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Links>();
        std::thread::Builder::new()
            .name("cudatrace-detach".into())
            .spawn(move || rx.into_iter().for_each(drop))
            .ok()
            .map(|_| tx)
    });
    if let Some(tx) = closer {
        // A closed channel hands the links back, and they are closed here.
        let _ = tx.send(links);
    }
}
