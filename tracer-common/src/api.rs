//! Every probed driver entry point, with the facts both sides need about it.
//!
//! The id of an [`Api`] travels in the uprobe's attach cookie, so one eBPF program serves every
//! symbol of the same argument layout and each record names the exact symbol that was called.

/// What a call does, as reported in `kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A kernel launch (asynchronous: the duration is CPU-side launch latency).
    Launch,
    /// A CUDA graph launch.
    GraphLaunch,
    /// A memory copy.
    Memcpy,
    /// A memory set (`cuMemsetD*`): device work queued like an asynchronous copy.
    Memset,
    /// A host wait on a stream, context or event.
    Sync,
    /// A device allocation.
    Alloc,
    /// A device free.
    Free,
    /// A kernel-handle lookup by name, or kernel-to-function conversion.
    Lookup,
    /// An event recorded on a stream (marks the work queued so far).
    EventRecord,
    /// A non-blocking poll of an event or a stream (`CUDA_ERROR_NOT_READY` until done).
    Query,
    /// A stream made to wait for an event on the device: the host does not block.
    StreamWait,
    /// Stream capture begun or ended (launches in between are recorded into a graph).
    Capture,
    /// A graph instantiated, or an executable graph updated from one.
    GraphBuild,
    /// An entry point looked up by name (`cuGetProcAddress_v2`): how the CUDA runtime reaches
    /// the driver.
    Resolve,
    /// A thread's current context set, a context or stream created, a device's UUID read: which
    /// device the calls after it go to.
    Context,
}

impl Kind {
    /// The name used in JSON and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Launch => "launch",
            Kind::GraphLaunch => "graph_launch",
            Kind::Memcpy => "memcpy",
            Kind::Memset => "memset",
            Kind::Sync => "sync",
            Kind::Alloc => "alloc",
            Kind::Free => "free",
            Kind::Lookup => "lookup",
            Kind::EventRecord => "event_record",
            Kind::Query => "query",
            Kind::StreamWait => "stream_wait",
            Kind::Capture => "capture",
            Kind::GraphBuild => "graph_build",
            Kind::Resolve => "resolve",
            Kind::Context => "context",
        }
    }

    /// Whether the call waits for device work (blocking, or a poll that can tell it is done).
    pub const fn waits(self) -> bool {
        matches!(self, Kind::Sync | Kind::Query)
    }
}

/// Which entry program reads the arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `cuLaunchKernel`-shaped: six register arguments plus blockZ, sharedMem and stream on the stack.
    Launch,
    /// `cuLaunchKernelEx`: dimensions read from the `CUlaunchConfig` the first argument points to.
    LaunchEx,
    /// The six register arguments, kept as they are.
    Regs,
}

/// How the arguments of a call are to be read (see [`crate::CallEvent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Launch record: function, grid, block, shared memory, stream.
    Launch,
    /// `(CUgraphExec, CUstream)`.
    Graph,
    /// `(dst, src, bytes[, stream])`.
    Copy,
    /// `(dst, dstCtx, src, srcCtx, bytes[, stream])`.
    CopyPeer,
    /// `(CUstream)`.
    StreamSync,
    /// `(void)`.
    CtxSync,
    /// `(CUevent)`.
    EventSync,
    /// `(CUstream, CUevent, flags)`.
    StreamWaitEvent,
    /// `(CUdeviceptr *dptr, bytes[, stream])`.
    Alloc,
    /// `(CUdeviceptr[, stream])`.
    Free,
    /// `(CUfunction *out, CUmodule, const char *name)`.
    ModuleGetFunction,
    /// `(CUkernel *out, CUlibrary, const char *name)`.
    LibraryGetKernel,
    /// `(CUfunction *out, CUkernel)`.
    KernelGetFunction,
    /// `(CUevent, CUstream[, flags])`.
    EventRecord,
    /// `(CUevent)`, polled.
    EventQuery,
    /// `(CUstream)`, polled.
    StreamQuery,
    /// `(CUstream, CUstreamCaptureMode)`.
    BeginCapture,
    /// `(CUstream, CUgraph *out)`.
    EndCapture,
    /// `(CUgraphExec *out, CUgraph, flags or params)`.
    Instantiate,
    /// `(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *)`.
    ExecUpdate,
    /// `(const char *symbol, void **pfn, int version, cuuint64_t flags, status *)`.
    ProcAddress,
    /// `(CUmemGenericAllocationHandle *out, size_t size, const CUmemAllocationProp *, flags)`:
    /// physical memory, held by handle until released.
    VmmCreate,
    /// `(CUmemGenericAllocationHandle)`.
    VmmRelease,
    /// `(CUdeviceptr *dptr, bytes, CUmemoryPool, CUstream)`.
    AllocFromPool,
    /// `(CUdeviceptr *dptr, size_t *pitch, widthInBytes, height, elementSize)`.
    AllocPitch,
    /// `(CUdeviceptr dst, value, size_t n[, stream])`: n elements of the symbol's size.
    Memset,
    /// `(CUdeviceptr dst, size_t pitch, value, size_t width, size_t height[, stream])`.
    Memset2D,
    /// `(const CUDA_MEMCPY2D *[, stream])`, read at entry (see [`COOKIE_PARAMS_2D`]).
    Copy2D,
    /// `(const CUDA_MEMCPY3D *[, stream])`, read at entry (see [`COOKIE_PARAMS_3D`]).
    Copy3D,
    /// `(CUcontext)`: made the thread's current context, replacing the top of its stack.
    CtxSet,
    /// `(CUcontext)`: pushed on the thread's context stack.
    CtxPush,
    /// `(CUcontext *out)`: popped off the thread's context stack.
    CtxPop,
    /// `(CUcontext *out, CUdevice)`: a device's primary context.
    CtxRetain,
    /// `(CUcontext *out, flags, CUdevice)`: a context created and made current.
    CtxCreate,
    /// `(CUcontext *out, CUctxCreateParams *, flags, CUdevice)`: likewise (CUDA 12.5+).
    CtxCreateV4,
    /// `(CUcontext)`: destroyed.
    CtxDestroy,
    /// `(CUuuid *out, CUdevice)`: the device's 16-byte UUID (see [`COOKIE_READ_OUT_16`]).
    DeviceUuid,
    /// `(CUstream *out, flags[, priority])`: a stream of the thread's current context.
    StreamCreate,
    /// `(dsts, srcs, size_t *sizes, size_t count, ...)`, the sizes summed at entry (see
    /// [`COOKIE_BATCH`]).
    CopyBatch,
}

/// Direction of a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Host to device.
    HtoD,
    /// Device to host.
    DtoH,
    /// Device to device.
    DtoD,
    /// Between two devices' contexts.
    Peer,
    /// Unified addressing: the driver works it out from the pointers.
    Default,
    /// Not a copy: device memory set to a value.
    Set,
}

impl Direction {
    /// The name used in JSON and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Direction::HtoD => "htod",
            Direction::DtoH => "dtoh",
            Direction::DtoD => "dtod",
            Direction::Peer => "peer",
            Direction::Default => "default",
            Direction::Set => "memset",
        }
    }
}

mod cookies;
pub use cookies::*;

/// Static facts about one entry point.
#[derive(Clone, Copy, Debug)]
pub struct ApiInfo {
    /// The exported symbol.
    pub symbol: &'static str,
    /// What the call does.
    pub kind: Kind,
    /// Which entry program reads it.
    pub layout: Layout,
    /// How to read its arguments.
    pub shape: Shape,
    /// Whether the call takes a stream argument.
    pub has_stream: bool,
    /// Whether this is a per-thread default-stream (`_ptsz`/`_ptds`) variant.
    pub per_thread: bool,
    /// Copy direction, for copies.
    pub direction: Option<Direction>,
}

macro_rules! apis {
    ($( $variant:ident = $sym:literal : $kind:ident, $layout:ident, $shape:ident, $stream:literal, $dir:expr; )*) => {
        /// A probed driver entry point; the discriminant is its id in cookies and records.
        #[repr(u16)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        pub enum Api { $( $variant, )* }

        impl Api {
            /// Every entry point, in id order.
            pub const ALL: &'static [Api] = &[ $( Api::$variant, )* ];

            /// Static facts of every entry point, by id, computed at compile time.
            const INFOS: &'static [ApiInfo] = &[ $( Api::$variant.compute_info(), )* ];

            /// Static facts about this entry point (a table read: decoding calls it per event).
            pub const fn info(self) -> ApiInfo {
                Self::INFOS[self as usize]
            }

            const fn compute_info(self) -> ApiInfo {
                match self {
                    $( Api::$variant => ApiInfo {
                        symbol: $sym,
                        kind: Kind::$kind,
                        layout: Layout::$layout,
                        shape: Shape::$shape,
                        has_stream: $stream,
                        per_thread: ends_with($sym.as_bytes(), b"_ptsz") || ends_with($sym.as_bytes(), b"_ptds"),
                        direction: $dir,
                    }, )*
                }
            }
        }
    };
}

const fn ends_with(s: &[u8], suffix: &[u8]) -> bool {
    if s.len() < suffix.len() {
        return false;
    }
    let mut i = 0;
    while i < suffix.len() {
        if s[s.len() - suffix.len() + i] != suffix[i] {
            return false;
        }
        i += 1;
    }
    true
}

use Direction::*;
apis! {
    LaunchKernel = "cuLaunchKernel": Launch, Launch, Launch, true, None;
    LaunchKernelPtsz = "cuLaunchKernel_ptsz": Launch, Launch, Launch, true, None;
    LaunchCooperativeKernel = "cuLaunchCooperativeKernel": Launch, Launch, Launch, true, None;
    LaunchCooperativeKernelPtsz = "cuLaunchCooperativeKernel_ptsz": Launch, Launch, Launch, true, None;
    LaunchKernelEx = "cuLaunchKernelEx": Launch, LaunchEx, Launch, true, None;
    LaunchKernelExPtsz = "cuLaunchKernelEx_ptsz": Launch, LaunchEx, Launch, true, None;
    GraphLaunch = "cuGraphLaunch": GraphLaunch, Regs, Graph, true, None;
    GraphLaunchPtsz = "cuGraphLaunch_ptsz": GraphLaunch, Regs, Graph, true, None;
    MemcpyHtoD = "cuMemcpyHtoD_v2": Memcpy, Regs, Copy, false, Some(HtoD);
    MemcpyHtoDPtds = "cuMemcpyHtoD_v2_ptds": Memcpy, Regs, Copy, false, Some(HtoD);
    MemcpyDtoH = "cuMemcpyDtoH_v2": Memcpy, Regs, Copy, false, Some(DtoH);
    MemcpyDtoHPtds = "cuMemcpyDtoH_v2_ptds": Memcpy, Regs, Copy, false, Some(DtoH);
    MemcpyDtoD = "cuMemcpyDtoD_v2": Memcpy, Regs, Copy, false, Some(DtoD);
    MemcpyDtoDPtds = "cuMemcpyDtoD_v2_ptds": Memcpy, Regs, Copy, false, Some(DtoD);
    MemcpyHtoDAsync = "cuMemcpyHtoDAsync_v2": Memcpy, Regs, Copy, true, Some(HtoD);
    MemcpyHtoDAsyncPtsz = "cuMemcpyHtoDAsync_v2_ptsz": Memcpy, Regs, Copy, true, Some(HtoD);
    MemcpyDtoHAsync = "cuMemcpyDtoHAsync_v2": Memcpy, Regs, Copy, true, Some(DtoH);
    MemcpyDtoHAsyncPtsz = "cuMemcpyDtoHAsync_v2_ptsz": Memcpy, Regs, Copy, true, Some(DtoH);
    MemcpyDtoDAsync = "cuMemcpyDtoDAsync_v2": Memcpy, Regs, Copy, true, Some(DtoD);
    MemcpyDtoDAsyncPtsz = "cuMemcpyDtoDAsync_v2_ptsz": Memcpy, Regs, Copy, true, Some(DtoD);
    Memcpy = "cuMemcpy": Memcpy, Regs, Copy, false, Some(Default);
    MemcpyPtds = "cuMemcpy_ptds": Memcpy, Regs, Copy, false, Some(Default);
    MemcpyAsync = "cuMemcpyAsync": Memcpy, Regs, Copy, true, Some(Default);
    MemcpyAsyncPtsz = "cuMemcpyAsync_ptsz": Memcpy, Regs, Copy, true, Some(Default);
    MemcpyPeer = "cuMemcpyPeer": Memcpy, Regs, CopyPeer, false, Some(Peer);
    MemcpyPeerPtds = "cuMemcpyPeer_ptds": Memcpy, Regs, CopyPeer, false, Some(Peer);
    MemcpyPeerAsync = "cuMemcpyPeerAsync": Memcpy, Regs, CopyPeer, true, Some(Peer);
    MemcpyPeerAsyncPtsz = "cuMemcpyPeerAsync_ptsz": Memcpy, Regs, CopyPeer, true, Some(Peer);
    StreamSynchronize = "cuStreamSynchronize": Sync, Regs, StreamSync, true, None;
    StreamSynchronizePtsz = "cuStreamSynchronize_ptsz": Sync, Regs, StreamSync, true, None;
    CtxSynchronize = "cuCtxSynchronize": Sync, Regs, CtxSync, false, None;
    EventSynchronize = "cuEventSynchronize": Sync, Regs, EventSync, false, None;
    StreamWaitEvent = "cuStreamWaitEvent": StreamWait, Regs, StreamWaitEvent, true, None;
    StreamWaitEventPtsz = "cuStreamWaitEvent_ptsz": StreamWait, Regs, StreamWaitEvent, true, None;
    ModuleGetFunction = "cuModuleGetFunction": Lookup, Regs, ModuleGetFunction, false, None;
    LibraryGetKernel = "cuLibraryGetKernel": Lookup, Regs, LibraryGetKernel, false, None;
    KernelGetFunction = "cuKernelGetFunction": Lookup, Regs, KernelGetFunction, false, None;
    MemAlloc = "cuMemAlloc_v2": Alloc, Regs, Alloc, false, None;
    MemFree = "cuMemFree_v2": Free, Regs, Free, false, None;
    MemAllocAsync = "cuMemAllocAsync": Alloc, Regs, Alloc, true, None;
    MemAllocAsyncPtsz = "cuMemAllocAsync_ptsz": Alloc, Regs, Alloc, true, None;
    MemFreeAsync = "cuMemFreeAsync": Free, Regs, Free, true, None;
    MemFreeAsyncPtsz = "cuMemFreeAsync_ptsz": Free, Regs, Free, true, None;
    CtxSynchronizeV2 = "cuCtxSynchronize_v2": Sync, Regs, CtxSync, false, None;
    EventRecord = "cuEventRecord": EventRecord, Regs, EventRecord, true, None;
    EventRecordPtsz = "cuEventRecord_ptsz": EventRecord, Regs, EventRecord, true, None;
    EventRecordWithFlags = "cuEventRecordWithFlags": EventRecord, Regs, EventRecord, true, None;
    EventRecordWithFlagsPtsz = "cuEventRecordWithFlags_ptsz": EventRecord, Regs, EventRecord, true, None;
    EventQuery = "cuEventQuery": Query, Regs, EventQuery, false, None;
    StreamQuery = "cuStreamQuery": Query, Regs, StreamQuery, true, None;
    StreamQueryPtsz = "cuStreamQuery_ptsz": Query, Regs, StreamQuery, true, None;
    StreamBeginCapture = "cuStreamBeginCapture_v2": Capture, Regs, BeginCapture, true, None;
    StreamBeginCapturePtsz = "cuStreamBeginCapture_v2_ptsz": Capture, Regs, BeginCapture, true, None;
    StreamEndCapture = "cuStreamEndCapture": Capture, Regs, EndCapture, true, None;
    StreamEndCapturePtsz = "cuStreamEndCapture_ptsz": Capture, Regs, EndCapture, true, None;
    GraphInstantiateWithFlags = "cuGraphInstantiateWithFlags": GraphBuild, Regs, Instantiate, false, None;
    GraphInstantiateWithParams = "cuGraphInstantiateWithParams": GraphBuild, Regs, Instantiate, false, None;
    GraphInstantiateWithParamsPtsz = "cuGraphInstantiateWithParams_ptsz": GraphBuild, Regs, Instantiate, false, None;
    GraphExecUpdate = "cuGraphExecUpdate_v2": GraphBuild, Regs, ExecUpdate, false, None;
    GetProcAddress = "cuGetProcAddress_v2": Resolve, Regs, ProcAddress, false, None;
    MemCreate = "cuMemCreate": Alloc, Regs, VmmCreate, false, None;
    MemRelease = "cuMemRelease": Free, Regs, VmmRelease, false, None;
    MemAllocFromPoolAsync = "cuMemAllocFromPoolAsync": Alloc, Regs, AllocFromPool, true, None;
    MemAllocFromPoolAsyncPtsz = "cuMemAllocFromPoolAsync_ptsz": Alloc, Regs, AllocFromPool, true, None;
    MemAllocManaged = "cuMemAllocManaged": Alloc, Regs, Alloc, false, None;
    MemAllocPitch = "cuMemAllocPitch_v2": Alloc, Regs, AllocPitch, false, None;
    MemsetD8 = "cuMemsetD8_v2": Memset, Regs, Memset, false, Some(Set);
    MemsetD8Ptds = "cuMemsetD8_v2_ptds": Memset, Regs, Memset, false, Some(Set);
    MemsetD16 = "cuMemsetD16_v2": Memset, Regs, Memset, false, Some(Set);
    MemsetD16Ptds = "cuMemsetD16_v2_ptds": Memset, Regs, Memset, false, Some(Set);
    MemsetD32 = "cuMemsetD32_v2": Memset, Regs, Memset, false, Some(Set);
    MemsetD32Ptds = "cuMemsetD32_v2_ptds": Memset, Regs, Memset, false, Some(Set);
    MemsetD8Async = "cuMemsetD8Async": Memset, Regs, Memset, true, Some(Set);
    MemsetD8AsyncPtsz = "cuMemsetD8Async_ptsz": Memset, Regs, Memset, true, Some(Set);
    MemsetD16Async = "cuMemsetD16Async": Memset, Regs, Memset, true, Some(Set);
    MemsetD16AsyncPtsz = "cuMemsetD16Async_ptsz": Memset, Regs, Memset, true, Some(Set);
    MemsetD32Async = "cuMemsetD32Async": Memset, Regs, Memset, true, Some(Set);
    MemsetD32AsyncPtsz = "cuMemsetD32Async_ptsz": Memset, Regs, Memset, true, Some(Set);
    MemsetD2D8 = "cuMemsetD2D8_v2": Memset, Regs, Memset2D, false, Some(Set);
    MemsetD2D8Ptds = "cuMemsetD2D8_v2_ptds": Memset, Regs, Memset2D, false, Some(Set);
    MemsetD2D16 = "cuMemsetD2D16_v2": Memset, Regs, Memset2D, false, Some(Set);
    MemsetD2D16Ptds = "cuMemsetD2D16_v2_ptds": Memset, Regs, Memset2D, false, Some(Set);
    MemsetD2D32 = "cuMemsetD2D32_v2": Memset, Regs, Memset2D, false, Some(Set);
    MemsetD2D32Ptds = "cuMemsetD2D32_v2_ptds": Memset, Regs, Memset2D, false, Some(Set);
    MemsetD2D8Async = "cuMemsetD2D8Async": Memset, Regs, Memset2D, true, Some(Set);
    MemsetD2D8AsyncPtsz = "cuMemsetD2D8Async_ptsz": Memset, Regs, Memset2D, true, Some(Set);
    MemsetD2D16Async = "cuMemsetD2D16Async": Memset, Regs, Memset2D, true, Some(Set);
    MemsetD2D16AsyncPtsz = "cuMemsetD2D16Async_ptsz": Memset, Regs, Memset2D, true, Some(Set);
    MemsetD2D32Async = "cuMemsetD2D32Async": Memset, Regs, Memset2D, true, Some(Set);
    MemsetD2D32AsyncPtsz = "cuMemsetD2D32Async_ptsz": Memset, Regs, Memset2D, true, Some(Set);
    Memcpy2D = "cuMemcpy2D_v2": Memcpy, Regs, Copy2D, false, Some(Default);
    Memcpy2DPtds = "cuMemcpy2D_v2_ptds": Memcpy, Regs, Copy2D, false, Some(Default);
    Memcpy2DUnaligned = "cuMemcpy2DUnaligned_v2": Memcpy, Regs, Copy2D, false, Some(Default);
    Memcpy2DUnalignedPtds = "cuMemcpy2DUnaligned_v2_ptds": Memcpy, Regs, Copy2D, false, Some(Default);
    Memcpy2DAsync = "cuMemcpy2DAsync_v2": Memcpy, Regs, Copy2D, true, Some(Default);
    Memcpy2DAsyncPtsz = "cuMemcpy2DAsync_v2_ptsz": Memcpy, Regs, Copy2D, true, Some(Default);
    Memcpy3D = "cuMemcpy3D_v2": Memcpy, Regs, Copy3D, false, Some(Default);
    Memcpy3DPtds = "cuMemcpy3D_v2_ptds": Memcpy, Regs, Copy3D, false, Some(Default);
    Memcpy3DAsync = "cuMemcpy3DAsync_v2": Memcpy, Regs, Copy3D, true, Some(Default);
    Memcpy3DAsyncPtsz = "cuMemcpy3DAsync_v2_ptsz": Memcpy, Regs, Copy3D, true, Some(Default);
    MemcpyBatchAsync = "cuMemcpyBatchAsync": Memcpy, Regs, CopyBatch, true, Some(Default);
    MemcpyBatchAsyncPtsz = "cuMemcpyBatchAsync_ptsz": Memcpy, Regs, CopyBatch, true, Some(Default);
    MemcpyBatchAsyncV2 = "cuMemcpyBatchAsync_v2": Memcpy, Regs, CopyBatch, true, Some(Default);
    MemcpyBatchAsyncV2Ptsz = "cuMemcpyBatchAsync_v2_ptsz": Memcpy, Regs, CopyBatch, true, Some(Default);
    CtxSetCurrent = "cuCtxSetCurrent": Context, Regs, CtxSet, false, None;
    CtxPushCurrent = "cuCtxPushCurrent_v2": Context, Regs, CtxPush, false, None;
    CtxPopCurrent = "cuCtxPopCurrent_v2": Context, Regs, CtxPop, false, None;
    DevicePrimaryCtxRetain = "cuDevicePrimaryCtxRetain": Context, Regs, CtxRetain, false, None;
    CtxCreate = "cuCtxCreate_v2": Context, Regs, CtxCreate, false, None;
    CtxCreateV4 = "cuCtxCreate_v4": Context, Regs, CtxCreateV4, false, None;
    CtxDestroy = "cuCtxDestroy_v2": Context, Regs, CtxDestroy, false, None;
    DeviceGetUuid = "cuDeviceGetUuid": Context, Regs, DeviceUuid, false, None;
    DeviceGetUuidV2 = "cuDeviceGetUuid_v2": Context, Regs, DeviceUuid, false, None;
    StreamCreate = "cuStreamCreate": Context, Regs, StreamCreate, false, None;
    StreamCreateWithPriority = "cuStreamCreateWithPriority": Context, Regs, StreamCreate, false, None;
}

impl Api {
    /// The api with this id, if any.
    pub fn from_id(id: u32) -> Option<Api> {
        Api::ALL.get(id as usize).copied()
    }

    /// The attach cookie for this api: its id plus what the return probe must read and do
    /// (the batches a wait closes follow the GPU-time estimate's model).
    pub const fn cookie(self) -> u64 {
        let info = self.info();
        let mut flags = match info.shape {
            Shape::VmmCreate => COOKIE_READ_OUT | COOKIE_READ_PROP_LOCATION,
            Shape::Alloc | Shape::KernelGetFunction | Shape::AllocFromPool | Shape::AllocPitch => {
                COOKIE_READ_OUT
            }
            Shape::ModuleGetFunction | Shape::LibraryGetKernel => {
                COOKIE_READ_OUT | COOKIE_READ_NAME
            }
            Shape::StreamSync => COOKIE_CLOSES_ARG_STREAM,
            Shape::CtxSync => COOKIE_CLOSES_ALL,
            Shape::EventSync => COOKIE_CLOSES_EVENT,
            Shape::EventQuery => COOKIE_POLL | COOKIE_CLOSES_EVENT,
            Shape::StreamQuery => COOKIE_POLL | COOKIE_CLOSES_ARG_STREAM,
            Shape::BeginCapture => COOKIE_CAPTURE_BEGIN,
            Shape::EndCapture => COOKIE_CAPTURE_END | COOKIE_READ_OUT_ARG1,
            Shape::Instantiate
            | Shape::CtxPop
            | Shape::CtxRetain
            | Shape::CtxCreate
            | Shape::CtxCreateV4
            | Shape::StreamCreate => COOKIE_READ_OUT,
            Shape::DeviceUuid => COOKIE_READ_OUT | COOKIE_READ_OUT_16,
            Shape::ProcAddress => COOKIE_READ_OUT_ARG1 | COOKIE_READ_NAME | COOKIE_NAME_ARG0,
            Shape::Copy2D => COOKIE_PARAMS_2D,
            Shape::Copy3D => COOKIE_PARAMS_3D,
            Shape::CopyBatch
                if ends_with(info.symbol.as_bytes(), b"BatchAsync")
                    || ends_with(info.symbol.as_bytes(), b"BatchAsync_ptsz") =>
            {
                COOKIE_BATCH | COOKIE_BATCH_FAIL_IDX
            }
            Shape::CopyBatch => COOKIE_BATCH,
            _ => 0,
        };
        if matches!(info.kind, Kind::Launch) {
            flags |= COOKIE_LAUNCH;
        }
        if matches!(info.kind, Kind::Memcpy) && !info.has_stream {
            flags |= COOKIE_CLOSES_DEFAULT_STREAM;
        }
        if info.per_thread {
            flags |= COOKIE_PER_THREAD;
        }
        self as u64 | flags
    }

    /// The exported symbol.
    pub const fn symbol(self) -> &'static str {
        self.info().symbol
    }

    /// Bytes of one element a memset writes: 2 for `cuMemsetD16*` and `cuMemsetD2D16*`, 4 for
    /// the `D32` ones, else 1.
    pub const fn element_bytes(self) -> u64 {
        let s = self.symbol().as_bytes();
        // "cuMemsetD" then "8", "16" or "32", after "2D" for the 2-D ones.
        let mut i = 9;
        if s.len() > i + 1 && s[i] == b'2' && s[i + 1] == b'D' {
            i += 2;
        }
        match s.len() > i {
            true if s[i] == b'1' => 2,
            true if s[i] == b'3' => 4,
            _ => 1,
        }
    }
}

#[cfg(test)]
mod tests;
