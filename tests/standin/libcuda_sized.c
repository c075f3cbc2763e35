/* The stand-in libcuda's memsets and the copies whose sizes sit in memory (2-D, 3-D, batches),
 * over the static helpers of libcuda.c (which includes this file: one translation unit). A memset
 * is device work queued on its stream, never waited for by its caller (as NVIDIA's are for
 * device memory); 2-D and 3-D copies without a stream wait, like the 1-D ones. */

static CUresult memset_2d(size_t pitch, size_t width_bytes, size_t h, CUstream s, int per_thread) {
    if (pitch < width_bytes) return CUDA_ERROR_INVALID_VALUE;
    return copy(width_bytes * h, s, per_thread, 0);
}
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { (void)d; (void)v; return copy(n * sizeof v, 0, 0, 0); }
EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n) { (void)d; (void)v; return copy(n * sizeof v, 0, 1, 0); }
EXPORT CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { (void)d; (void)v; return copy(n * sizeof v, 0, 0, 0); }
EXPORT CUresult cuMemsetD16_v2_ptds(CUdeviceptr d, unsigned short v, size_t n) { (void)d; (void)v; return copy(n * sizeof v, 0, 1, 0); }
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) { (void)d; (void)v; return copy(n * sizeof v, 0, 0, 0); }
EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr d, unsigned int v, size_t n) { (void)d; (void)v; return copy(n * sizeof v, 0, 1, 0); }
EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { (void)d; (void)v; return copy(n * sizeof v, s, 0, 0); }
EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { (void)d; (void)v; return copy(n * sizeof v, s, 1, 0); }
EXPORT CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { (void)d; (void)v; return copy(n * sizeof v, s, 0, 0); }
EXPORT CUresult cuMemsetD16Async_ptsz(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { (void)d; (void)v; return copy(n * sizeof v, s, 1, 0); }
EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) { (void)d; (void)v; return copy(n * sizeof v, s, 0, 0); }
EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned int v, size_t n, CUstream s) { (void)d; (void)v; return copy(n * sizeof v, s, 1, 0); }
EXPORT CUresult cuMemsetD2D8_v2(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h) { (void)d; return memset_2d(p, w * sizeof v, h, 0, 0); }
EXPORT CUresult cuMemsetD2D8_v2_ptds(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h) { (void)d; return memset_2d(p, w * sizeof v, h, 0, 1); }
EXPORT CUresult cuMemsetD2D16_v2(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h) { (void)d; return memset_2d(p, w * sizeof v, h, 0, 0); }
EXPORT CUresult cuMemsetD2D16_v2_ptds(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h) { (void)d; return memset_2d(p, w * sizeof v, h, 0, 1); }
EXPORT CUresult cuMemsetD2D32_v2(CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h) { (void)d; return memset_2d(p, w * sizeof v, h, 0, 0); }
EXPORT CUresult cuMemsetD2D32_v2_ptds(CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h) { (void)d; return memset_2d(p, w * sizeof v, h, 0, 1); }
EXPORT CUresult cuMemsetD2D8Async(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h, CUstream s) {
    (void)d;
    return memset_2d(p, w * sizeof v, h, s, 0);
}
EXPORT CUresult cuMemsetD2D8Async_ptsz(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h, CUstream s) {
    (void)d;
    return memset_2d(p, w * sizeof v, h, s, 1);
}
EXPORT CUresult cuMemsetD2D16Async(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h, CUstream s) {
    (void)d;
    return memset_2d(p, w * sizeof v, h, s, 0);
}
EXPORT CUresult cuMemsetD2D16Async_ptsz(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h, CUstream s) {
    (void)d;
    return memset_2d(p, w * sizeof v, h, s, 1);
}
EXPORT CUresult cuMemsetD2D32Async(CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h, CUstream s) {
    (void)d;
    return memset_2d(p, w * sizeof v, h, s, 0);
}
EXPORT CUresult cuMemsetD2D32Async_ptsz(CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h, CUstream s) {
    (void)d;
    return memset_2d(p, w * sizeof v, h, s, 1);
}

static CUresult copy_2d(const CUDA_MEMCPY2D *p, CUstream s, int per_thread, int synchronous) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return copy(p->WidthInBytes * p->Height, s, per_thread, synchronous);
}
static CUresult copy_3d(const CUDA_MEMCPY3D *p, CUstream s, int per_thread, int synchronous) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return copy(p->WidthInBytes * p->Height * (p->Depth ? p->Depth : 1), s, per_thread, synchronous);
}
EXPORT CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *p) { return copy_2d(p, 0, 0, 1); }
EXPORT CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *p) { return copy_2d(p, 0, 1, 1); }
EXPORT CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *p) { return copy_2d(p, 0, 0, 1); }
EXPORT CUresult cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D *p) { return copy_2d(p, 0, 1, 1); }
EXPORT CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *p, CUstream s) { return copy_2d(p, s, 0, 0); }
EXPORT CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *p, CUstream s) { return copy_2d(p, s, 1, 0); }
EXPORT CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *p) { return copy_3d(p, 0, 0, 1); }
EXPORT CUresult cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D *p) { return copy_3d(p, 0, 1, 1); }
EXPORT CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *p, CUstream s) { return copy_3d(p, s, 0, 0); }
EXPORT CUresult cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D *p, CUstream s) { return copy_3d(p, s, 1, 0); }

/* A batch is queued as one copy of its summed sizes; the legacy default stream is refused. */
static CUresult copy_batch(const size_t *sizes, size_t count, size_t *fail, CUstream s, int per_thread) {
    if (fail) *fail = (size_t)-1;
    if (!s && !per_thread) return CUDA_ERROR_INVALID_VALUE;
    if (count && !sizes) return CUDA_ERROR_INVALID_VALUE;
    size_t bytes = 0;
    for (size_t i = 0; i < count; i++) bytes += sizes[i];
    return copy(bytes, s, per_thread, 0);
}
EXPORT CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                   CUmemcpyAttributes *attrs, size_t *idxs, size_t nattrs, size_t *fail, CUstream s) {
    (void)dsts; (void)srcs; (void)attrs; (void)idxs; (void)nattrs;
    return copy_batch(sizes, count, fail, s, 0);
}
EXPORT CUresult cuMemcpyBatchAsync_ptsz(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                        CUmemcpyAttributes *attrs, size_t *idxs, size_t nattrs, size_t *fail,
                                        CUstream s) {
    (void)dsts; (void)srcs; (void)attrs; (void)idxs; (void)nattrs;
    return copy_batch(sizes, count, fail, s, 1);
}
EXPORT CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                      CUmemcpyAttributes *attrs, size_t *idxs, size_t nattrs, CUstream s) {
    (void)dsts; (void)srcs; (void)attrs; (void)idxs; (void)nattrs;
    return copy_batch(sizes, count, NULL, s, 0);
}
EXPORT CUresult cuMemcpyBatchAsync_v2_ptsz(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                           CUmemcpyAttributes *attrs, size_t *idxs, size_t nattrs, CUstream s) {
    (void)dsts; (void)srcs; (void)attrs; (void)idxs; (void)nattrs;
    return copy_batch(sizes, count, NULL, s, 1);
}
