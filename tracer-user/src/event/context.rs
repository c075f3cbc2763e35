//! The records of the calls that say which device later calls go to: a thread's current context
//! set, pushed or popped, a context or stream created, a device's UUID read.
use serde::Serialize;
use tracer_common::api::Shape;

/// One context call's meaning.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ContextCall {
    /// The thread's current context replaced (`cuCtxSetCurrent`; 0 unbinds).
    Set {
        /// `CUcontext`.
        context: u64,
    },
    /// Pushed on the thread's stack: current until popped.
    Push {
        /// `CUcontext`.
        context: u64,
    },
    /// Popped: the one under it is current again.
    Pop {
        /// `CUcontext` popped (0 when the call failed).
        context: u64,
    },
    /// A device's context (primary, or created: a created one is also made current).
    Bind {
        /// `CUcontext` (0 when the call failed).
        context: u64,
        /// The CUDA ordinal (not NVML's index).
        device: i32,
        /// Created, not retained: made the thread's current context.
        created: bool,
    },
    /// Destroyed.
    Destroy {
        /// `CUcontext`.
        context: u64,
    },
    /// A device's UUID (`cuDeviceGetUuid`).
    Uuid {
        /// The CUDA ordinal.
        device: i32,
        /// The 16 bytes as `8-4-4-4-12` hex digits, as NVML writes them after `GPU-` or `MIG-`
        /// ("" when the call failed).
        uuid: String,
    },
    /// A stream created in the thread's current context.
    Stream {
        /// `CUstream` (0 when the call failed).
        stream: u64,
    },
}

impl ContextCall {
    /// One line for the terminal.
    pub fn text(&self) -> String {
        match self {
            ContextCall::Set { context } => format!("current={context:#x}"),
            ContextCall::Push { context } => format!("push {context:#x}"),
            ContextCall::Pop { context } => format!("pop {context:#x}"),
            ContextCall::Bind {
                context, device, ..
            } => format!("device {device} -> context {context:#x}"),
            ContextCall::Destroy { context } => format!("destroy {context:#x}"),
            ContextCall::Uuid { device, uuid } => format!("device {device} uuid {uuid}"),
            ContextCall::Stream { stream } => format!("stream={stream:#x}"),
        }
    }
}

/// Decodes a context call of `shape` from its arguments `a` and out-parameter `out` (for a UUID
/// the first 8 bytes; the eBPF return probe puts the other 8 in `a[2]`).
pub fn decode(shape: Shape, a: &[u64; 6], out: u64) -> ContextCall {
    let device = |i: usize| a[i] as i32;
    match shape {
        Shape::CtxSet => ContextCall::Set { context: a[0] },
        Shape::CtxPush => ContextCall::Push { context: a[0] },
        Shape::CtxPop => ContextCall::Pop { context: out },
        Shape::CtxRetain => ContextCall::Bind {
            context: out,
            device: device(1),
            created: false,
        },
        Shape::CtxCreate => ContextCall::Bind {
            context: out,
            device: device(2),
            created: true,
        },
        Shape::CtxCreateV4 => ContextCall::Bind {
            context: out,
            device: device(3),
            created: true,
        },
        Shape::CtxDestroy => ContextCall::Destroy { context: a[0] },
        Shape::DeviceUuid => ContextCall::Uuid {
            device: device(1),
            uuid: if out == 0 && a[2] == 0 {
                String::new()
            } else {
                uuid_text(out, a[2])
            },
        },
        _ => ContextCall::Stream { stream: out },
    }
}

/// `CUuuid` bytes (two little-endian halves as read) as NVML prints them, less the prefix.
pub fn uuid_text(low: u64, high: u64) -> String {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&low.to_le_bytes());
    b[8..].copy_from_slice(&high.to_le_bytes());
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// A UUID as NVML writes it (`GPU-…` or `MIG-…`), less its prefix and in lower case: what
/// [`uuid_text`] gives for the same device.
pub fn nvml_uuid_key(nvml: &str) -> String {
    let s = nvml
        .strip_prefix("GPU-")
        .or_else(|| nvml.strip_prefix("MIG-"))
        .unwrap_or(nvml);
    s.to_ascii_lowercase()
}
