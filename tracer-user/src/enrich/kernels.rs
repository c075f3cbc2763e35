//! Kernel names for launches: handles returned by `cuModuleGetFunction`, `cuLibraryGetKernel` and
//! `cuKernelGetFunction` are remembered per process, so that every later launch of that handle
//! carries the kernel's name. The table lives in the process's registry entry and dies with it.
use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use foldhash::HashMap;

use tracer_common::api::Shape;

use crate::event::{Detail, Event};

/// A kernel's name as the module declares it and as a person reads it.
#[derive(Debug, PartialEq, Eq)]
pub struct KernelName {
    /// The symbol as looked up (C++-mangled for C++ kernels).
    pub mangled: String,
    /// The demangled form, or the symbol itself when it is not a mangled C++ name; shared so
    /// that metric labels reuse it without a copy per event.
    pub demangled: Arc<str>,
}

/// Longest demangled name kept, in bytes: a crafted name of a few hundred bytes whose
/// back-references expand to gigabytes is cut here (and so is the time spent on it).
pub const MAX_DEMANGLED: usize = 1024;
/// How deep the demangler may recurse, parsing and printing.
const RECURSION_LIMIT: u32 = 64;

/// A demangler sink that refuses everything past [`MAX_DEMANGLED`] bytes.
struct Capped {
    out: String,
    full: bool,
}

impl std::fmt::Write for Capped {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = MAX_DEMANGLED.saturating_sub(self.out.len());
        if s.len() <= room {
            self.out.push_str(s);
            return Ok(());
        }
        let mut end = room;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.out.push_str(&s[..end]);
        self.full = true;
        Err(std::fmt::Error)
    }
}

/// The demangled form of `mangled`, at most [`MAX_DEMANGLED`] bytes (cut names end in `...`);
/// the symbol itself when it is not a mangled C++ name, or too deep to demangle.
pub fn demangle(mangled: &str) -> String {
    demangled(mangled).0
}

/// [`demangle`], and whether what it returns is cut (so that two names may share it).
fn demangled(mangled: &str) -> (String, bool) {
    let parse = cpp_demangle::ParseOptions::default().recursion_limit(RECURSION_LIMIT);
    let Ok(symbol) = cpp_demangle::Symbol::new_with_options(mangled, &parse) else {
        return (cut(mangled), mangled.len() > MAX_DEMANGLED);
    };
    let options = cpp_demangle::DemangleOptions::default().recursion_limit(RECURSION_LIMIT);
    let mut sink = Capped {
        out: String::new(),
        full: false,
    };
    match symbol.structured_demangle(&mut sink, &options) {
        Ok(()) => (sink.out, false),
        Err(_) if sink.full => {
            while sink.out.len() > MAX_DEMANGLED - 3 {
                sink.out.pop();
            }
            (sink.out + "...", true)
        }
        Err(_) => (cut(mangled), mangled.len() > MAX_DEMANGLED),
    }
}

/// FNV-1a, 64 bits: a stable hash of a name (the same label on every node and release).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `s` cut to at most [`MAX_DEMANGLED`] bytes, at a character boundary.
fn cut(s: &str) -> String {
    let mut end = s.len().min(MAX_DEMANGLED);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

impl KernelName {
    /// Builds both forms from the looked-up symbol. A readable form that is cut (past
    /// [`MAX_DEMANGLED`]), or of a symbol as long as a lookup record carries (it may have been
    /// cut there), ends in ` #` and a hash of the whole symbol read, so that two kernels never
    /// share a label because their names begin alike.
    pub fn new(mangled: &str) -> Self {
        let (mut readable, cut) = demangled(mangled);
        if cut || mangled.len() >= tracer_common::LONG_NAME_MAX - 1 {
            readable = format!("{readable} #{:016x}", fnv1a(mangled.as_bytes()));
        }
        KernelName {
            mangled: mangled.to_owned(),
            demangled: readable.into(),
        }
    }
}

/// Handles remembered per process at most: past it the oldest are forgotten (counted). A
/// forgotten handle keeps the label of any series it already has; a series made later for it is
/// labelled by handle.
pub const MAX_HANDLES: usize = 65_536;
/// Bytes of names one process may hold (as [`cost`] counts them); past it, its oldest go.
pub const MAX_PROCESS_BYTES: usize = 16 << 20;
/// Bytes of names all processes together may hold; past it the process holding the most
/// forgets its oldest, down to [`TRIM_TO`] of this.
pub const MAX_TOTAL_BYTES: usize = 64 << 20;
/// Share of [`MAX_TOTAL_BYTES`] a trim leaves, in percent (room before the next one).
const TRIM_TO: usize = 90;

/// What one remembered handle costs: both forms of its name (counted for each handle, also
/// when handles share a name) and the table's own bookkeeping.
fn cost(name: &KernelName) -> usize {
    64 + name.mangled.len() + name.demangled.len()
}

/// The bytes of names every process's table holds together, shared by the tables.
#[derive(Clone, Debug, Default)]
pub struct NameBytes(Arc<AtomicUsize>);

impl NameBytes {
    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// Whether the tables together hold more than [`MAX_TOTAL_BYTES`].
    pub fn over(&self) -> bool {
        self.held() > MAX_TOTAL_BYTES
    }

    /// How many bytes to forget to get back to [`TRIM_TO`] percent of the total.
    pub fn excess(&self) -> usize {
        self.held().saturating_sub(MAX_TOTAL_BYTES / 100 * TRIM_TO)
    }
}

/// One process's handle-to-name table.
#[derive(Default)]
pub struct KernelNames {
    by_handle: HashMap<u64, Arc<KernelName>>,
    /// Handles in the order they were first remembered (each once).
    order: VecDeque<u64>,
    /// What this table holds, by [`cost`].
    bytes: usize,
    /// What all the tables hold.
    total: NameBytes,
    /// Handles forgotten or never remembered, to stay within the bounds.
    pub overflowed: u64,
}

impl Drop for KernelNames {
    fn drop(&mut self) {
        self.total.0.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl KernelNames {
    /// An empty table counted in `total`.
    pub fn new(total: NameBytes) -> KernelNames {
        KernelNames {
            by_handle: HashMap::default(),
            order: VecDeque::new(),
            bytes: 0,
            total,
            overflowed: 0,
        }
    }

    /// The name of a kernel handle, when its lookup was seen.
    pub fn name(&self, handle: u64) -> Option<Arc<KernelName>> {
        self.by_handle.get(&handle).cloned()
    }

    /// Bytes this table holds, by [`cost`].
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Learns from lookups; returns the kernel a launch runs, when its handle is known.
    pub fn observe(&mut self, ev: &Event) -> Option<Arc<KernelName>> {
        match &ev.detail {
            Detail::Launch { function, .. } => self.by_handle.get(function).cloned(),
            Detail::Lookup {
                handle,
                source,
                name,
            } if ev.result == 0 && *handle != 0 => {
                let name = match ev.api.info().shape {
                    Shape::KernelGetFunction => self.by_handle.get(source).cloned()?,
                    _ => Arc::new(KernelName::new(name.as_deref()?)),
                };
                self.remember(*handle, name.clone());
                Some(name)
            }
            _ => None,
        }
    }

    /// Keeps `handle`'s name, forgetting the oldest handles to stay within the bounds.
    fn remember(&mut self, handle: u64, name: Arc<KernelName>) {
        let added = cost(&name);
        if added > MAX_PROCESS_BYTES {
            self.overflowed += 1;
            return;
        }
        match self.by_handle.insert(handle, name) {
            Some(old) => self.take_bytes(cost(&old)),
            None => self.order.push_back(handle),
        }
        self.give_bytes(added);
        while self.by_handle.len() > MAX_HANDLES || self.bytes > MAX_PROCESS_BYTES {
            self.forget_one();
        }
    }

    /// Forgets the oldest handles until at least `bytes` are given back (or none is left).
    pub fn forget_oldest(&mut self, bytes: usize) {
        let goal = self.bytes.saturating_sub(bytes);
        while self.bytes > goal && self.forget_one() {}
    }

    /// Forgets the oldest handle; `false` when there is none.
    fn forget_one(&mut self) -> bool {
        while let Some(h) = self.order.pop_front() {
            if let Some(name) = self.by_handle.remove(&h) {
                self.take_bytes(cost(&name));
                self.overflowed += 1;
                return true;
            }
        }
        false
    }

    fn give_bytes(&mut self, n: usize) {
        self.bytes += n;
        self.total.0.fetch_add(n, Ordering::Relaxed);
    }

    fn take_bytes(&mut self, n: usize) {
        self.bytes -= n;
        self.total.0.fetch_sub(n, Ordering::Relaxed);
    }

    /// Handles known.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_handle.len()
    }

    /// Whether it holds nothing.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.by_handle.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::Api;

    use super::*;

    fn launch(pid: u32, function: u64) -> Event {
        Event::launch(Api::LaunchKernel, pid, function, 0)
    }

    /// `_Z<n><ident>v`: a function `ident()` whose identifier is `len` bytes, `tail` last.
    fn long_name(len: usize, tail: char) -> String {
        let ident: String = std::iter::repeat_n('k', len - 1).chain([tail]).collect();
        format!("_Z{}{ident}v", ident.len())
    }

    #[test]
    fn long_names_are_whole_and_never_share_a_label() {
        // 600-byte names differing after byte 300: demangled whole, two labels.
        let (a, b) = (long_name(600, 'a'), long_name(600, 'b'));
        let (ka, kb) = (KernelName::new(&a), KernelName::new(&b));
        assert_eq!(&*ka.demangled, format!("{}()", &a[5..605]));
        assert_ne!(ka.demangled, kb.demangled);
        // Past MAX_DEMANGLED the readable forms are cut alike: the hash of the whole tells them
        // apart, and stays the same for the same name.
        let (c, d) = (long_name(2000, 'c'), long_name(2000, 'd'));
        let (kc, kd) = (KernelName::new(&c), KernelName::new(&d));
        assert!(kc.demangled.contains("... #"), "{}", kc.demangled);
        assert_ne!(kc.demangled, kd.demangled);
        assert_eq!(kc.demangled, KernelName::new(&c).demangled);
        assert_eq!(
            &kc.demangled[kc.demangled.len() - 16..],
            format!("{:016x}", fnv1a(c.as_bytes()))
        );
    }

    #[test]
    fn a_back_reference_bomb_is_cut_quickly() {
        // 24 levels: a 234-byte name (the eBPF side reads up to 256) that would print ~100 MB.
        let name = integration_tests::hostile::demangling_bomb(24);
        assert_eq!(name.len(), 234);
        let start = std::time::Instant::now();
        let out = demangle(&name);
        let took = start.elapsed();
        assert!(
            out.len() <= MAX_DEMANGLED && out.ends_with("..."),
            "{} bytes",
            out.len()
        );
        assert!(
            out.starts_with("f(A, A<A, A>, A<A<A, A>, A<A, A> >"),
            "{out}"
        );
        assert!(took < std::time::Duration::from_millis(1), "took {took:?}");
        // A name that is not C++ (or nests too deep) comes back as it is, also cut.
        assert_eq!(demangle(&"x".repeat(5000)).len(), MAX_DEMANGLED);
    }

    fn lookup(handle: u64, name: &str) -> Event {
        Event::of(
            Api::ModuleGetFunction,
            1,
            Detail::Lookup {
                handle,
                source: 1,
                name: Some(name.into()),
            },
        )
    }

    #[test]
    fn past_the_cap_the_oldest_handles_are_forgotten_and_counted() {
        let total = NameBytes::default();
        let mut t = KernelNames::new(total.clone());
        for h in 1..=(MAX_HANDLES as u64 + 5) {
            t.observe(&lookup(h, "k"));
        }
        assert_eq!((t.len(), t.overflowed), (MAX_HANDLES, 5));
        assert!(
            t.observe(&launch(1, 5)).is_none()
                && t.observe(&launch(1, 6)).is_some()
                && t.observe(&launch(1, MAX_HANDLES as u64 + 5)).is_some()
        );
        assert_eq!(total.held(), t.bytes());
        assert_eq!(t.bytes(), MAX_HANDLES * (64 + 2));
        drop(t);
        assert_eq!(total.held(), 0, "a dropped table gives its bytes back");
    }

    #[test]
    fn one_process_holds_at_most_its_bytes_and_all_together_are_counted() {
        let total = NameBytes::default();
        let mut a = KernelNames::new(total.clone());
        let mut b = KernelNames::new(total.clone());
        // 254-byte names, a new handle for each: 64 + 2 x 254 bytes a handle.
        let long = "x".repeat(254);
        for h in 1..=40_000u64 {
            a.observe(&lookup(h, &long));
        }
        let each = 64 + 2 * 254;
        assert_eq!(a.len(), MAX_PROCESS_BYTES / each);
        assert_eq!(a.overflowed, 40_000 - (MAX_PROCESS_BYTES / each) as u64);
        b.observe(&lookup(1, "_Z3addv"));
        assert_eq!(total.held(), a.bytes() + b.bytes());
        // A lookup of the same handle again replaces its name, not adds one.
        b.observe(&lookup(1, "_Z3mulv"));
        assert_eq!((b.len(), total.held()), (1, a.bytes() + b.bytes()));
        a.forget_oldest(each * 10);
        assert_eq!(a.len(), MAX_PROCESS_BYTES / each - 10);
        assert!(a.observe(&launch(1, 40_000)).is_some());
    }

    #[test]
    fn demangles_and_keeps_mangled() {
        let k = KernelName::new("_Z11hidden_gemmPfS_i");
        assert_eq!(&*k.demangled, "hidden_gemm(float*, float*, int)");
        assert_eq!(k.mangled, "_Z11hidden_gemmPfS_i");
        assert_eq!(
            &*KernelName::new("plain_c_kernel").demangled,
            "plain_c_kernel"
        );
        // A long name of multi-byte characters is cut by bytes, at a character boundary.
        let wide = "\u{00e9}".repeat(1000);
        assert_eq!(demangle(&wide).len(), MAX_DEMANGLED);
    }

    #[test]
    fn names_follow_handles() {
        let mut t = KernelNames::default();
        let lookup = Detail::Lookup {
            handle: 0x10,
            source: 0x1,
            name: Some("_Z3addv".into()),
        };
        t.observe(&Event::of(Api::ModuleGetFunction, 1, lookup));
        assert_eq!(&*t.observe(&launch(1, 0x10)).unwrap().demangled, "add()");
        assert_eq!(
            KernelNames::default().observe(&launch(2, 0x10)),
            None,
            "handles are per process"
        );
        let lib = Detail::Lookup {
            handle: 0x20,
            source: 0x2,
            name: Some("_Z3mulv".into()),
        };
        t.observe(&Event::of(Api::LibraryGetKernel, 1, lib));
        let conv = Detail::Lookup {
            handle: 0x30,
            source: 0x20,
            name: None,
        };
        t.observe(&Event::of(Api::KernelGetFunction, 1, conv));
        assert_eq!(t.observe(&launch(1, 0x30)).unwrap().mangled, "_Z3mulv");
        assert_eq!(
            t.observe(&launch(1, 0x20)).unwrap().mangled,
            "_Z3mulv",
            "a CUkernel launched as a CUfunction"
        );
        assert_eq!(t.len(), 3);
    }
}
