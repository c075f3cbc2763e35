/* A library that exports only two of the entry points cudatrace probes, to test how a partial
 * (or wrong) library is reported. Same prototypes as cuda.h. */
#include "cuda.h"

#define EXPORT __attribute__((visibility("default"), noinline))

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                               unsigned int by, unsigned int bz, unsigned int smem, CUstream s, void **params,
                               void **extra) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)smem; (void)s; (void)params; (void)extra;
    return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) {
    (void)d; (void)h;
    return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
