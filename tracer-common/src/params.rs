//! Calls whose sizes sit in memory the first argument points to: 2-D and 3-D copies (a
//! `CUDA_MEMCPY2D` or `CUDA_MEMCPY3D`, cuda.h's layout on 64-bit Linux) and batches of copies
//! (an array of sizes). The entry program reads them into the record's six arguments, laid out
//! as the `ARG_*` constants say; user space decodes them with [`copy_bytes`] and [`direction`].
use crate::api::Direction;

/// `CUDA_MEMCPY2D`: `srcMemoryType` (a 32-bit enum), `dstMemoryType`, `WidthInBytes`, `Height`.
pub const MEMCPY2D_OFFSETS: [u64; 4] = [16, 72, 112, 120];
/// `CUDA_MEMCPY3D`: `srcMemoryType`, `dstMemoryType`, `WidthInBytes`, `Height`; `Depth` is
/// [`MEMCPY3D_DEPTH`].
pub const MEMCPY3D_OFFSETS: [u64; 4] = [32, 120, 176, 184];
/// `CUDA_MEMCPY3D`'s `Depth`.
pub const MEMCPY3D_DEPTH: u64 = 192;
/// Sizes of a batch summed at most: a larger batch's bytes are scaled from these.
pub const BATCH_SIZES_MAX: usize = 128;

/// A 2-D or 3-D copy's record: `src_type | dst_type << 32`, width in bytes, height, depth (1
/// for 2-D), the stream (0 when synchronous), the parameters' address.
/// A batch's record: the sum of the sizes read, `count`, how many sizes were read, 0, the
/// stream, the sizes' address.
pub const ARG_STREAM: usize = 4;

/// `CUmemorytype`: host memory.
pub const MEMORYTYPE_HOST: u32 = 1;
/// `CUmemorytype`: device memory.
pub const MEMORYTYPE_DEVICE: u32 = 2;
/// `CUmemorytype`: a CUDA array (device memory).
pub const MEMORYTYPE_ARRAY: u32 = 3;

/// The bytes a 2-D, 3-D or batch copy moves, from its record's arguments; whether it is an
/// estimate (a batch larger than [`BATCH_SIZES_MAX`], scaled from the sizes read).
pub fn copy_bytes(batch: bool, args: &[u64; 6]) -> (u64, bool) {
    if batch {
        let (sum, count, read) = (args[0], args[1], args[2]);
        if read >= count || read == 0 {
            return (sum, false);
        }
        let scaled = u128::from(sum) * u128::from(count) / u128::from(read);
        (u64::try_from(scaled).unwrap_or(u64::MAX), true)
    } else {
        let (w, h, d) = (args[1], args[2], args[3].max(1));
        (w.saturating_mul(h).saturating_mul(d), false)
    }
}

/// The direction of a 2-D or 3-D copy from its memory types (a CUDA array is device memory;
/// unified or unknown types are [`Direction::Default`]).
pub fn direction(types: u64) -> Direction {
    let device = |t: u32| t == MEMORYTYPE_DEVICE || t == MEMORYTYPE_ARRAY;
    let (src, dst) = (types as u32, (types >> 32) as u32);
    match (src, dst) {
        (MEMORYTYPE_HOST, d) if device(d) => Direction::HtoD,
        (s, MEMORYTYPE_HOST) if device(s) => Direction::DtoH,
        (s, d) if device(s) && device(d) => Direction::DtoD,
        _ => Direction::Default,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_of_each_copy() {
        assert_eq!(copy_bytes(false, &[0, 640, 480, 1, 0, 0]), (307_200, false));
        assert_eq!(copy_bytes(false, &[0, 64, 8, 4, 0, 0]), (2_048, false));
        assert_eq!(copy_bytes(false, &[0, 64, 8, 0, 0, 0]), (512, false));
        assert_eq!(
            copy_bytes(false, &[0, u64::MAX, 2, 1, 0, 0]),
            (u64::MAX, false)
        );
        assert_eq!(copy_bytes(true, &[4_096, 3, 3, 0, 0, 0]), (4_096, false));
        assert_eq!(
            copy_bytes(true, &[1_280, 1_000, 128, 0, 0, 0]),
            (10_000, true)
        );
    }

    #[test]
    fn directions_from_memory_types() {
        let t = |s: u32, d: u32| u64::from(s) | u64::from(d) << 32;
        assert_eq!(direction(t(1, 2)), Direction::HtoD);
        assert_eq!(direction(t(2, 1)), Direction::DtoH);
        assert_eq!(direction(t(3, 2)), Direction::DtoD);
        assert_eq!(direction(t(4, 2)), Direction::Default);
        assert_eq!(direction(t(1, 1)), Direction::Default);
    }
}
