/* cuda-workload's `each` scenario, continued: memsets and the copies whose sizes sit in memory
 * (2-D, 3-D, batches), N calls of each variant with sizes that tell the calls apart:
 * - memset i writes 100 + i elements (1-D), or 10 + i elements by 4 rows (2-D, pitch 4 KiB);
 * - 2-D copy i moves 100 + i bytes by 3 rows: host to device (cuMemcpy2D_v2), device to host
 *   (Unaligned), device to device (Async);
 * - 3-D copy i moves 100 + i bytes by 2 rows by 3 slices: host to device (sync), device to
 *   device (Async);
 * - batch i copies 100 + i, 200 and 300 bytes on the stream. */
#include "workload.h"

static void memsets(long n, CUstream s, void (*count)(const char *, long)) {
    static const char *one[] = {"cuMemsetD8_v2", "cuMemsetD8_v2_ptds", "cuMemsetD16_v2", "cuMemsetD16_v2_ptds",
                                "cuMemsetD32_v2", "cuMemsetD32_v2_ptds"};
    static const char *one_async[] = {"cuMemsetD8Async", "cuMemsetD8Async_ptsz", "cuMemsetD16Async",
                                      "cuMemsetD16Async_ptsz", "cuMemsetD32Async", "cuMemsetD32Async_ptsz"};
    static const char *two[] = {"cuMemsetD2D8_v2", "cuMemsetD2D8_v2_ptds", "cuMemsetD2D16_v2",
                                "cuMemsetD2D16_v2_ptds", "cuMemsetD2D32_v2", "cuMemsetD2D32_v2_ptds"};
    static const char *two_async[] = {"cuMemsetD2D8Async", "cuMemsetD2D8Async_ptsz", "cuMemsetD2D16Async",
                                      "cuMemsetD2D16Async_ptsz", "cuMemsetD2D32Async", "cuMemsetD2D32Async_ptsz"};
    for (size_t v = 0; v < 6; v++) {
        void *p = sym(one[v], 0), *pa = sym(one_async[v], 0), *q = sym(two[v], 0), *qa = sym(two_async[v], 0);
        for (long i = 0; i < n; i++) {
            size_t e = 100 + (size_t)i, w = 10 + (size_t)i;
            switch (v / 2) {
            case 0:
                if (p) CHECK(((PFN_cuMemsetD8)p)(dev_a, 1, e));
                if (pa) CHECK(((PFN_cuMemsetD8Async)pa)(dev_a, 1, e, s));
                if (q) CHECK(((PFN_cuMemsetD2D8)q)(dev_a, 4096, 1, w, 4));
                if (qa) CHECK(((PFN_cuMemsetD2D8Async)qa)(dev_a, 4096, 1, w, 4, s));
                break;
            case 1:
                if (p) CHECK(((PFN_cuMemsetD16)p)(dev_a, 1, e));
                if (pa) CHECK(((PFN_cuMemsetD16Async)pa)(dev_a, 1, e, s));
                if (q) CHECK(((PFN_cuMemsetD2D16)q)(dev_a, 4096, 1, w, 4));
                if (qa) CHECK(((PFN_cuMemsetD2D16Async)qa)(dev_a, 4096, 1, w, 4, s));
                break;
            default:
                if (p) CHECK(((PFN_cuMemsetD32)p)(dev_a, 1, e));
                if (pa) CHECK(((PFN_cuMemsetD32Async)pa)(dev_a, 1, e, s));
                if (q) CHECK(((PFN_cuMemsetD2D32)q)(dev_a, 4096, 1, w, 4));
                if (qa) CHECK(((PFN_cuMemsetD2D32Async)qa)(dev_a, 4096, 1, w, 4, s));
                break;
            }
        }
        if (p) count(one[v], n);
        if (pa) count(one_async[v], n);
        if (q) count(two[v], n);
        if (qa) count(two_async[v], n);
    }
}

/* A 2-D copy's parameters: `types` 12 is host to device, 21 device to host, 22 device to device. */
static CUDA_MEMCPY2D params_2d(int types, size_t width, size_t height) {
    CUDA_MEMCPY2D p;
    memset(&p, 0, sizeof p);
    p.srcMemoryType = types / 10;
    p.dstMemoryType = types % 10;
    p.srcHost = host_buf;
    p.dstHost = host_buf;
    p.srcDevice = dev_a;
    p.dstDevice = dev_b;
    p.srcPitch = p.dstPitch = 512;
    p.WidthInBytes = width;
    p.Height = height;
    return p;
}

static void copies(long n, CUstream s, void (*count)(const char *, long)) {
    static const struct { const char *name; int types, stream; } twos[] = {
        {"cuMemcpy2D_v2", 12, 0}, {"cuMemcpy2D_v2_ptds", 12, 0}, {"cuMemcpy2DUnaligned_v2", 21, 0},
        {"cuMemcpy2DUnaligned_v2_ptds", 21, 0}, {"cuMemcpy2DAsync_v2", 22, 1}, {"cuMemcpy2DAsync_v2_ptsz", 22, 1}};
    for (size_t v = 0; v < sizeof twos / sizeof *twos; v++) {
        void *p = sym(twos[v].name, 0);
        if (!p) continue;
        for (long i = 0; i < n; i++) {
            CUDA_MEMCPY2D c = params_2d(twos[v].types, 100 + (size_t)i, 3);
            CHECK(twos[v].stream ? ((PFN_cuMemcpy2DAsync)p)(&c, s) : ((PFN_cuMemcpy2D)p)(&c));
        }
        count(twos[v].name, n);
    }
    static const struct { const char *name; int types, stream; } threes[] = {
        {"cuMemcpy3D_v2", 12, 0}, {"cuMemcpy3D_v2_ptds", 12, 0}, {"cuMemcpy3DAsync_v2", 22, 1},
        {"cuMemcpy3DAsync_v2_ptsz", 22, 1}};
    for (size_t v = 0; v < sizeof threes / sizeof *threes; v++) {
        void *p = sym(threes[v].name, 0);
        if (!p) continue;
        for (long i = 0; i < n; i++) {
            CUDA_MEMCPY3D c;
            memset(&c, 0, sizeof c);
            c.srcMemoryType = threes[v].types / 10;
            c.dstMemoryType = threes[v].types % 10;
            c.srcHost = host_buf;
            c.srcDevice = dev_a;
            c.dstDevice = dev_b;
            c.srcPitch = c.dstPitch = 512;
            c.srcHeight = c.dstHeight = 2;
            c.WidthInBytes = 100 + (size_t)i;
            c.Height = 2;
            c.Depth = 3;
            CHECK(threes[v].stream ? ((PFN_cuMemcpy3DAsync)p)(&c, s) : ((PFN_cuMemcpy3D)p)(&c));
        }
        count(threes[v].name, n);
    }
}

static void batches(long n, CUstream s, void (*count)(const char *, long)) {
    static const char *names[] = {"cuMemcpyBatchAsync", "cuMemcpyBatchAsync_ptsz", "cuMemcpyBatchAsync_v2",
                                  "cuMemcpyBatchAsync_v2_ptsz"};
    CUmemcpyAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = 1; /* CU_MEMCPY_SRC_ACCESS_ORDER_STREAM */
    size_t idx = 0, fail = 0;
    for (size_t v = 0; v < 4; v++) {
        void *p = sym(names[v], 0);
        if (!p) continue;
        for (long i = 0; i < n; i++) {
            CUdeviceptr dsts[3] = {dev_b, dev_b + 4096, dev_b + 8192};
            CUdeviceptr srcs[3] = {dev_a, dev_a + 4096, dev_a + 8192};
            size_t sizes[3] = {100 + (size_t)i, 200, 300};
            if (v < 2)
                CHECK(((PFN_cuMemcpyBatchAsync)p)(dsts, srcs, sizes, 3, &attr, &idx, 1, &fail, s));
            else
                CHECK(((PFN_cuMemcpyBatchAsync_v2)p)(dsts, srcs, sizes, 3, &attr, &idx, 1, s));
        }
        count(names[v], n);
    }
}

void each_sized(long n, CUstream s, void (*count)(const char *, long)) {
    memsets(n, s, count);
    copies(n, s, count);
    batches(n, s, count);
}
