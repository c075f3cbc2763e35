//! Kernel names for launches: handles returned by `cuModuleGetFunction`, `cuLibraryGetKernel` and
//! `cuKernelGetFunction` are remembered per process, so that every later launch of that handle
//! carries the kernel's name. The table lives in the process's registry entry and dies with it.
use foldhash::HashMap;
use std::sync::Arc;

use tracer_common::api::Shape;

use crate::pipeline::decode::{Detail, Event};

/// A kernel's name as the module declares it and as a person reads it.
#[derive(Debug, PartialEq, Eq)]
pub struct KernelName {
    /// The symbol as looked up (C++-mangled for C++ kernels).
    pub mangled: String,
    /// The demangled form, or the symbol itself when it is not a mangled C++ name; shared so
    /// that metric labels reuse it without a copy per event.
    pub demangled: Arc<str>,
}

impl KernelName {
    /// Builds both forms from the looked-up symbol.
    pub fn new(mangled: &str) -> Self {
        let demangled = cpp_demangle::Symbol::new(mangled)
            .ok()
            .and_then(|s| s.demangle(&Default::default()).ok())
            .unwrap_or_else(|| mangled.to_owned());
        KernelName { mangled: mangled.to_owned(), demangled: demangled.into() }
    }
}

/// One process's handle-to-name table.
#[derive(Default)]
pub struct KernelNames {
    by_handle: HashMap<u64, Arc<KernelName>>,
}

impl KernelNames {
    /// Learns from lookups; returns the kernel a launch runs, when its handle is known.
    pub fn observe(&mut self, ev: &Event) -> Option<Arc<KernelName>> {
        match &ev.detail {
            Detail::Launch { function, .. } => self.by_handle.get(function).cloned(),
            Detail::Lookup { handle, source, name } if ev.result == 0 && *handle != 0 => {
                let name = match ev.api.info().shape {
                    Shape::KernelGetFunction => self.by_handle.get(source).cloned()?,
                    _ => Arc::new(KernelName::new(name.as_deref()?)),
                };
                self.by_handle.insert(*handle, name.clone());
                Some(name)
            }
            _ => None,
        }
    }

    /// Handles known.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_handle.len()
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::Api;

    use super::*;

    fn launch(pid: u32, function: u64) -> Event {
        Event::launch(Api::LaunchKernel, pid, function, 0)
    }

    #[test]
    fn demangles_and_keeps_mangled() {
        let k = KernelName::new("_Z11hidden_gemmPfS_i");
        assert_eq!(&*k.demangled, "hidden_gemm(float*, float*, int)");
        assert_eq!(k.mangled, "_Z11hidden_gemmPfS_i");
        assert_eq!(&*KernelName::new("plain_c_kernel").demangled, "plain_c_kernel");
    }

    #[test]
    fn names_follow_handles() {
        let mut t = KernelNames::default();
        let lookup = Detail::Lookup { handle: 0x10, source: 0x1, name: Some("_Z3addv".into()) };
        t.observe(&Event::of(Api::ModuleGetFunction, 1, lookup));
        assert_eq!(&*t.observe(&launch(1, 0x10)).unwrap().demangled, "add()");
        assert_eq!(KernelNames::default().observe(&launch(2, 0x10)), None, "handles are per process");
        let lib = Detail::Lookup { handle: 0x20, source: 0x2, name: Some("_Z3mulv".into()) };
        t.observe(&Event::of(Api::LibraryGetKernel, 1, lib));
        let conv = Detail::Lookup { handle: 0x30, source: 0x20, name: None };
        t.observe(&Event::of(Api::KernelGetFunction, 1, conv));
        assert_eq!(t.observe(&launch(1, 0x30)).unwrap().mangled, "_Z3mulv");
        assert_eq!(t.observe(&launch(1, 0x20)).unwrap().mangled, "_Z3mulv", "a CUkernel launched as a CUfunction");
        assert_eq!(t.len(), 3);
    }
}
