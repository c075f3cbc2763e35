extern crate std;
use super::*;

#[test]
fn ids_are_positions() {
    for (i, api) in Api::ALL.iter().enumerate() {
        assert_eq!(*api as usize, i);
        assert_eq!(Api::from_id(i as u32), Some(*api));
    }
    assert_eq!(Api::from_id(Api::ALL.len() as u32), None);
}

#[test]
fn per_thread_variants_are_named() {
    assert!(Api::LaunchKernelPtsz.info().per_thread);
    assert!(Api::MemcpyHtoDPtds.info().per_thread);
    assert!(!Api::LaunchKernel.info().per_thread);
    assert_eq!(Api::ALL.iter().filter(|a| a.info().per_thread).count(), 44);
}

#[test]
fn memsets_know_their_element_and_batches_their_layout() {
    let bytes = |a: Api| a.element_bytes();
    assert_eq!(bytes(Api::MemsetD8), 1);
    assert_eq!(bytes(Api::MemsetD16AsyncPtsz), 2);
    assert_eq!(bytes(Api::MemsetD32Ptds), 4);
    assert_eq!(bytes(Api::MemsetD2D8Async), 1);
    assert_eq!(bytes(Api::MemsetD2D16), 2);
    assert_eq!(bytes(Api::MemsetD2D32AsyncPtsz), 4);
    let flags = |a: Api| a.cookie() & !COOKIE_API_MASK;
    assert_eq!(
        flags(Api::MemcpyBatchAsync),
        COOKIE_BATCH | COOKIE_BATCH_FAIL_IDX
    );
    assert_eq!(
        flags(Api::MemcpyBatchAsyncPtsz),
        COOKIE_BATCH | COOKIE_BATCH_FAIL_IDX | COOKIE_PER_THREAD
    );
    assert_eq!(flags(Api::MemcpyBatchAsyncV2), COOKIE_BATCH);
    assert_eq!(
        flags(Api::Memcpy2D),
        COOKIE_PARAMS_2D | COOKIE_CLOSES_DEFAULT_STREAM
    );
    assert_eq!(
        flags(Api::Memcpy3DAsyncPtsz),
        COOKIE_PARAMS_3D | COOKIE_PER_THREAD
    );
    // A memset does not block its caller: it closes nothing.
    assert_eq!(flags(Api::MemsetD32), 0);
}

#[test]
fn cookies_round_trip() {
    assert_eq!(
        Api::ModuleGetFunction.cookie() & COOKIE_API_MASK,
        Api::ModuleGetFunction as u64
    );
    assert_ne!(Api::ModuleGetFunction.cookie() & COOKIE_READ_NAME, 0);
    assert_eq!(Api::MemAlloc.cookie() & COOKIE_READ_NAME, 0);
    assert_ne!(Api::MemAlloc.cookie() & COOKIE_READ_OUT, 0);
    assert_eq!(Api::LaunchKernel.cookie(), COOKIE_LAUNCH);
    assert_eq!(
        Api::LaunchKernelExPtsz.cookie() & !COOKIE_API_MASK,
        COOKIE_LAUNCH | COOKIE_PER_THREAD
    );
    assert_eq!(
        Api::GraphLaunch.cookie() & COOKIE_LAUNCH,
        0,
        "graph launches keep one record each"
    );
    assert_eq!(
        Api::StreamSynchronize.cookie() & !COOKIE_API_MASK,
        COOKIE_CLOSES_ARG_STREAM
    );
    assert_eq!(
        Api::CtxSynchronize.cookie() & !COOKIE_API_MASK,
        COOKIE_CLOSES_ALL
    );
    assert_eq!(
        Api::MemcpyDtoHPtds.cookie() & !COOKIE_API_MASK,
        COOKIE_CLOSES_DEFAULT_STREAM | COOKIE_PER_THREAD
    );
    assert_eq!(Api::MemcpyDtoHAsync.cookie() & !COOKIE_API_MASK, 0);
}
