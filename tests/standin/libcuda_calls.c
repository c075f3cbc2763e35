/* The stand-in libcuda's copy, memory and kernel-name entry points, over the static helpers of
 * libcuda.c (which includes this file: one translation unit). */

/* ---- copies --------------------------------------------------------------------------------- */

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) { (void)d; (void)h; return copy(n, 0, 0, 1); }
EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void *h, size_t n) { (void)d; (void)h; return copy(n, 0, 1, 1); }
EXPORT CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) { (void)d; (void)h; return copy(n, 0, 0, 1); }
EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *h, CUdeviceptr d, size_t n) { (void)d; (void)h; return copy(n, 0, 1, 1); }
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { (void)d; (void)s; return copy(n, 0, 0, 1); }
EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr d, CUdeviceptr s, size_t n) { (void)d; (void)s; return copy(n, 0, 1, 1); }
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream s) { (void)d; (void)h; return copy(n, s, 0, 0); }
EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void *h, size_t n, CUstream s) { (void)d; (void)h; return copy(n, s, 1, 0); }
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream s) { (void)d; (void)h; return copy(n, s, 0, 0); }
EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *h, CUdeviceptr d, size_t n, CUstream s) { (void)d; (void)h; return copy(n, s, 1, 0); }
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr x, size_t n, CUstream s) { (void)d; (void)x; return copy(n, s, 0, 0); }
EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr d, CUdeviceptr x, size_t n, CUstream s) { (void)d; (void)x; return copy(n, s, 1, 0); }
EXPORT CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr x, size_t n) { (void)d; (void)x; return copy(n, 0, 0, 1); }
EXPORT CUresult cuMemcpy_ptds(CUdeviceptr d, CUdeviceptr x, size_t n) { (void)d; (void)x; return copy(n, 0, 1, 1); }
EXPORT CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr x, size_t n, CUstream s) { (void)d; (void)x; return copy(n, s, 0, 0); }
EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr x, size_t n, CUstream s) { (void)d; (void)x; return copy(n, s, 1, 0); }
EXPORT CUresult cuMemcpyPeer(CUdeviceptr d, CUcontext dc, CUdeviceptr x, CUcontext xc, size_t n) {
    (void)d; (void)dc; (void)x; (void)xc;
    return copy(n, 0, 0, 1);
}
EXPORT CUresult cuMemcpyPeer_ptds(CUdeviceptr d, CUcontext dc, CUdeviceptr x, CUcontext xc, size_t n) {
    (void)d; (void)dc; (void)x; (void)xc;
    return copy(n, 0, 1, 1);
}
EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr d, CUcontext dc, CUdeviceptr x, CUcontext xc, size_t n, CUstream s) {
    (void)d; (void)dc; (void)x; (void)xc;
    return copy(n, s, 0, 0);
}
EXPORT CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr d, CUcontext dc, CUdeviceptr x, CUcontext xc, size_t n,
                                       CUstream s) {
    (void)d; (void)dc; (void)x; (void)xc;
    return copy(n, s, 1, 0);
}

/* ---- memory ------------------------------------------------------------------------------------ */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return mem_alloc(p, n); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { return mem_free(p); }
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return mem_alloc(p, n); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return mem_alloc(p, n); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return mem_free(p); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { (void)s; return mem_free(p); }
/* VMM: physical memory by handle (the device's memory limit counts it), released by handle. */
static unsigned long long vmm_handles;
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    (void)flags;
    if (!h || !prop) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr p;
    CUresult r = mem_alloc(&p, n);
    *h = r == CUDA_SUCCESS ? 0x5000 + __atomic_add_fetch(&vmm_handles, 1, __ATOMIC_RELAXED) : 0;
    return r;
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return mem_free(h); }
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    (void)s;
    return pool ? mem_alloc(p, n) : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    (void)s;
    return pool ? mem_alloc(p, n) : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int flags) { (void)flags; return mem_alloc(p, n); }
/* The pitch is the width itself here (a real driver rounds it up). */
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned int elem) {
    (void)elem;
    if (!pitch) return CUDA_ERROR_INVALID_VALUE;
    *pitch = width;
    return mem_alloc(p, width * height);
}
/* Not probed: the pool cuMemAllocFromPoolAsync takes. */
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d) {
    (void)d;
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    *pool = (CUmemoryPool)(uintptr_t)0x9000;
    return CUDA_SUCCESS;
}

/* ---- kernel names ----------------------------------------------------------------------------- */

EXPORT CUresult cuModuleGetFunction(CUfunction *out, CUmodule m, const char *name) {
    init();
    spin(cfg_call_ns);
    if (!out || !m || !name) return CUDA_ERROR_INVALID_VALUE;
    if (strstr(name, "missing")) return CUDA_ERROR_NOT_FOUND;
    if (cfg_fresh_handles) {
        *out = (CUfunction)(uintptr_t)(0x7e0000000000ull + 16ull * __atomic_add_fetch(&fresh_handles_given, 1, __ATOMIC_RELAXED));
        return CUDA_SUCCESS;
    }
    *out = function_named(name, current_device());
    return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuLibraryGetKernel(CUkernel *out, CUlibrary l, const char *name) {
    init();
    spin(cfg_call_ns);
    if (!out || !l || !name) return CUDA_ERROR_INVALID_VALUE;
    if (strstr(name, "missing")) return CUDA_ERROR_NOT_FOUND;
    *out = kernel_named(name);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuKernelGetFunction(CUfunction *out, CUkernel k) {
    init();
    spin(cfg_call_ns);
    if (!out || !k) return CUDA_ERROR_INVALID_VALUE;
    *out = function_named(k->name, current_device());
    return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
