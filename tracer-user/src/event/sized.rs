//! The records of memsets and of the copies whose sizes the entry probe read from memory (2-D,
//! 3-D and batch copies): their bytes, direction and stream.
use tracer_common::{
    api::Shape,
    params::{self, ARG_STREAM},
    Api,
};

use super::Detail;

/// The detail of a call of `api` (a memset, a 2-D, 3-D or batch copy) with arguments `a`.
pub fn detail(api: Api, a: &[u64; 6]) -> Detail {
    let info = api.info();
    let stream_at = |i: usize| info.has_stream.then_some(a[i]);
    match info.shape {
        // A memset is queued like an asynchronous copy even without a stream argument: on the
        // (legacy or per-thread) default stream, 0.
        Shape::Memset => Detail::Copy {
            dst: a[0],
            src: 0,
            bytes: a[2].saturating_mul(api.element_bytes()),
            direction: "memset",
            stream: Some(stream_at(3).unwrap_or(0)),
        },
        Shape::Memset2D => Detail::Copy {
            dst: a[0],
            src: 0,
            bytes: a[3]
                .saturating_mul(api.element_bytes())
                .saturating_mul(a[4]),
            direction: "memset",
            stream: Some(stream_at(5).unwrap_or(0)),
        },
        Shape::CopyBatch => Detail::Copy {
            dst: 0,
            src: 0,
            bytes: params::copy_bytes(true, a).0,
            direction: "default",
            stream: Some(a[ARG_STREAM]),
        },
        _ => Detail::Copy {
            dst: 0,
            src: 0,
            bytes: params::copy_bytes(false, a).0,
            direction: params::direction(a[0]).as_str(),
            stream: stream_at(ARG_STREAM),
        },
    }
}
