/* Stand-in libcuda.so.1 for cudatrace's tests: the driver entry points cudatrace probes, with the
 * real prototypes, over a simulated device.
 *
 * The device: launches enqueue simulated kernel time and return at once; waits and synchronous
 * copies block until the work they wait for is done. One device is shared by every process on
 * the host through a shared-memory file, so a busy second process makes the first one wait.
 *
 * Every exported function is its own body and calls only static helpers, never another exported
 * function, so that one call is one probe hit (as in NVIDIA's library).
 *
 * Environment (read once):
 *   CUDA_STANDIN_CALL_NS          CPU time each call spends before returning (default 1000)
 *   CUDA_STANDIN_LAUNCH_NS        more CPU time each launch spends (default 0): a launch blocked
 *                                 in the driver, with set-up calls as fast as CALL_NS
 *   CUDA_STANDIN_NS_PER_BLOCK     device time per launched block, grid x*y*z (default 100)
 *   CUDA_STANDIN_GRAPH_NS         device time of a graph launch (default 10000)
 *   CUDA_STANDIN_COPY_BYTES_PER_US copy-engine bandwidth (default 10000, i.e. 10 GB/s)
 *   CUDA_STANDIN_DEVICE           shared device file (default /dev/shm/cudatrace-standin-device)
 *   CUDA_STANDIN_OUTLIER_PPM      calls per million, drawn at random, whose CPU time and launched
 *                                 device time are 10x (default 0: none)
 *   CUDA_STANDIN_MEMORY_BYTES     device memory shared by every process: an allocation past it
 *                                 fails with CUDA_ERROR_OUT_OF_MEMORY (default 0: unlimited)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuda.h"

#define EXPORT __attribute__((visibility("default"), noinline))

/* ---- configuration and clock ---------------------------------------------------------------- */

static uint64_t cfg_launch_ns = 0;
static uint64_t cfg_call_ns = 1000, cfg_ns_per_block = 100, cfg_graph_ns = 10000, cfg_bytes_per_us = 10000;
static uint64_t cfg_outlier_ppm, cfg_outlier_every, cfg_memory_bytes;

struct device {
    uint64_t compute_busy_until; /* CLOCK_MONOTONIC ns when queued kernels finish */
    uint64_t copy_busy_until;    /* same for the copy engine */
    uint64_t launches;           /* launches by every process, ever */
    uint64_t memory_used;        /* bytes allocated by every process (frees are not subtracted) */
};
static struct device *dev;
static struct device local_dev; /* used when the shared file cannot be opened */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CUDA_STANDIN_FRESH_HANDLES=1: cuModuleGetFunction answers every lookup with a new made-up
 * handle, remembering nothing (a tenant's own library, growing the tracer's name tables). */
static uint64_t cfg_fresh_handles;
static int cfg_fault;
/* Read at load, so that cuCtxSynchronize can test it before anything else. */
__attribute__((constructor)) static void read_fault(void) {
    const char *v = getenv("CUDA_STANDIN_FAULT");
    cfg_fault = v && *v && strcmp(v, "0") != 0;
}
static uint64_t fresh_handles_given;
/* CUDA_STANDIN_CALL_CPU=1: a call's cost is counted in the thread's CPU time, not the clock's
 * (a Python loop: a CPU cap slows it in proportion, where a clock-timed spin would not). */
static uint64_t cfg_call_cpu;


static uint64_t env_u64(const char *name, uint64_t dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    return *end ? dflt : (uint64_t)x;
}

static void init_once(void) {
    cfg_call_ns = env_u64("CUDA_STANDIN_CALL_NS", cfg_call_ns);
    cfg_launch_ns = env_u64("CUDA_STANDIN_LAUNCH_NS", 0);
    cfg_ns_per_block = env_u64("CUDA_STANDIN_NS_PER_BLOCK", cfg_ns_per_block);
    cfg_graph_ns = env_u64("CUDA_STANDIN_GRAPH_NS", cfg_graph_ns);
    cfg_bytes_per_us = env_u64("CUDA_STANDIN_COPY_BYTES_PER_US", cfg_bytes_per_us);
    cfg_outlier_ppm = env_u64("CUDA_STANDIN_OUTLIER_PPM", 0);
    cfg_outlier_every = env_u64("CUDA_STANDIN_OUTLIER_EVERY", 0);
    cfg_memory_bytes = env_u64("CUDA_STANDIN_MEMORY_BYTES", 0);
    cfg_fresh_handles = env_u64("CUDA_STANDIN_FRESH_HANDLES", 0);
    cfg_call_cpu = env_u64("CUDA_STANDIN_CALL_CPU", 0);
    if (cfg_bytes_per_us == 0) cfg_bytes_per_us = 1;
    const char *path = getenv("CUDA_STANDIN_DEVICE");
    if (!path || !*path) path = "/dev/shm/cudatrace-standin-device";
    dev = &local_dev;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return;
    if (ftruncate(fd, 4096) == 0) {
        void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) dev = p;
    }
    close(fd);
}

static void init(void) { pthread_once(&once, init_once); }

/* 10 for every CUDA_STANDIN_OUTLIER_EVERY-th call of a thread (a periodic workload), or for a
 * random CUDA_STANDIN_OUTLIER_PPM share of calls (xorshift per thread); else 1. */
static uint64_t outlier_factor(void) {
    static __thread uint64_t x, calls;
    if (cfg_outlier_every) return ++calls % cfg_outlier_every == 0 ? 10 : 1;
    if (!cfg_outlier_ppm) return 1;
    if (!x) x = now_ns() ^ ((uint64_t)pthread_self() << 1) ^ 0x9E3779B97F4A7C15ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x % 1000000 < cfg_outlier_ppm ? 10 : 1;
}

/* The spin-wait hint of the architecture. */
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("pause");
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Spends `ns` of CPU time, as the driver's own work in a call would. */
static void spin(uint64_t ns) {
    uint64_t (*clock)(void) = cfg_call_cpu ? thread_cpu_ns : now_ns;
    uint64_t end = clock() + ns;
    while (clock() < end) cpu_relax();
}

/* Blocks until CLOCK_MONOTONIC reaches `t`: sleeps, then spins the last stretch for precision. */
static void wait_until(uint64_t t) {
    for (;;) {
        uint64_t n = now_ns();
        if (n >= t) return;
        if (t - n > 200000) {
            struct timespec ts = {.tv_sec = (time_t)((t - 100000) / 1000000000ull),
                                  .tv_nsec = (long)((t - 100000) % 1000000000ull)};
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        } else {
            cpu_relax();
        }
    }
}

/* Queues `ns` of work on an engine no earlier than `after`; returns when it will be done. */
static uint64_t enqueue(uint64_t *busy_until, uint64_t after, uint64_t ns) {
    uint64_t old = __atomic_load_n(busy_until, __ATOMIC_ACQUIRE), done;
    do {
        uint64_t start = old;
        uint64_t n = now_ns();
        if (start < n) start = n;
        if (start < after) start = after;
        done = start + ns;
    } while (!__atomic_compare_exchange_n(busy_until, &old, done, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    return done;
}

/* ---- per-process streams --------------------------------------------------------------------- */

#define STREAM_LEGACY ((uintptr_t)1)
#define STREAM_PER_THREAD ((uintptr_t)2)
#define STREAM_SLOTS 256

struct stream_tail {
    uintptr_t handle;
    uint64_t tail; /* when the last work queued on the stream is done */
};
static struct stream_tail tails[STREAM_SLOTS];
static uint64_t process_tail;
static pthread_mutex_t tails_lock = PTHREAD_MUTEX_INITIALIZER;

static uintptr_t stream_key(CUstream s, int per_thread) {
    uintptr_t h = (uintptr_t)s;
    if (h == 0) return per_thread ? STREAM_PER_THREAD : STREAM_LEGACY;
    return h;
}

static struct stream_tail *slot(uintptr_t key) {
    size_t i = (key * 0x9E3779B97F4A7C15ull) >> 56;
    for (size_t n = 0; n < STREAM_SLOTS; n++, i = (i + 1) % STREAM_SLOTS) {
        if (tails[i].handle == key || tails[i].handle == 0) {
            tails[i].handle = key;
            return &tails[i];
        }
    }
    return &tails[0]; /* full: share a slot, which only makes waits longer */
}

static uint64_t stream_tail(uintptr_t key) {
    pthread_mutex_lock(&tails_lock);
    uint64_t t = slot(key)->tail;
    pthread_mutex_unlock(&tails_lock);
    return t;
}

static void stream_push(uintptr_t key, uint64_t done) {
    pthread_mutex_lock(&tails_lock);
    struct stream_tail *s = slot(key);
    if (done > s->tail) s->tail = done;
    if (done > process_tail) process_tail = done;
    pthread_mutex_unlock(&tails_lock);
}

static uint64_t all_tail(void) {
    pthread_mutex_lock(&tails_lock);
    uint64_t t = process_tail;
    pthread_mutex_unlock(&tails_lock);
    return t;
}

/* ---- objects ------------------------------------------------------------------------------------ */

struct CUctx_st { int device; };
struct CUmod_st { int is_library; };
/* Names kept whole (CUTLASS and FlashAttention names run to thousands of bytes). */
struct CUfunc_st { char *name; int device; };
struct CUkern_st { char *name; struct CUfunc_st *function; };
struct CUstream_st { int id; };
/* A graph: its kernel nodes (libcuda_serving.c). */
struct graph_node {
    CUfunction function;
    uint64_t blocks;
};
struct CUgraph_st {
    struct graph_node *nodes;
    size_t n, cap;
};
struct CUevent_st {
    uint64_t done_at;
    struct CUgraph_st *capture; /* recorded on a capturing stream: the capture's graph */
};
/* An executable graph: its kernel nodes (NULL for cuGraphInstantiateStandin's, which runs
 * CUDA_STANDIN_GRAPH_NS). */
struct CUgraphExec_st { int id; struct CUgraph_st *graph; };

static int initialized;
static uint64_t next_dptr = 0x700000000000ull;

/* Handles returned for one name are stable, as the driver's are. */
#define MAX_FUNCS 16384
static struct CUfunc_st funcs[MAX_FUNCS];
static struct CUkern_st kerns[MAX_FUNCS];
static size_t nfuncs, nkerns;
static pthread_mutex_t objs_lock = PTHREAD_MUTEX_INITIALIZER;

/* One handle per (name, device): a module's functions are its context's. */
static struct CUfunc_st *function_named(const char *name, int device) {
    pthread_mutex_lock(&objs_lock);
    struct CUfunc_st *f = NULL;
    for (size_t i = 0; i < nfuncs; i++)
        if (funcs[i].device == device && strcmp(funcs[i].name, name) == 0) f = &funcs[i];
    if (!f && nfuncs < MAX_FUNCS) {
        f = &funcs[nfuncs++];
        f->name = strdup(name);
        f->device = device;
    }
    pthread_mutex_unlock(&objs_lock);
    return f;
}

static struct CUkern_st *kernel_named(const char *name) {
    pthread_mutex_lock(&objs_lock);
    struct CUkern_st *k = NULL;
    for (size_t i = 0; i < nkerns; i++)
        if (strcmp(kerns[i].name, name) == 0) k = &kerns[i];
    if (!k && nkerns < MAX_FUNCS) {
        k = &kerns[nkerns++];
        k->name = strdup(name);
    }
    pthread_mutex_unlock(&objs_lock);
    return k;
}

/* Stream capture (libcuda_serving.c). */
static int capture_launch(uintptr_t key, CUfunction f, uint64_t blocks);
static int is_capturing(uintptr_t key);
static int capture_join(uintptr_t key, struct CUgraph_st *g);
static uint64_t graph_ns(const struct CUgraphExec_st *x);

/* ---- shared bodies -------------------------------------------------------------------------- */

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, CUstream s, int per_thread) {
    init();
    uint64_t factor = outlier_factor();
    spin(cfg_call_ns * factor + cfg_launch_ns);
    if (!f || !gx || !gy || !gz || !bx || !by || !bz) return CUDA_ERROR_INVALID_VALUE;
    uintptr_t key = stream_key(s, per_thread);
    uint64_t blocks = (uint64_t)gx * gy * gz;
    if (capture_launch(key, f, blocks)) return CUDA_SUCCESS; /* recorded, not run */
    uint64_t done = enqueue(&dev->compute_busy_until, stream_tail(key), blocks * cfg_ns_per_block * factor);
    stream_push(key, done);
    __atomic_add_fetch(&dev->launches, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

static CUresult graph_launch(CUgraphExec g, CUstream s, int per_thread) {
    init();
    spin(cfg_call_ns);
    if (!g) return CUDA_ERROR_INVALID_HANDLE;
    uintptr_t key = stream_key(s, per_thread);
    if (is_capturing(key)) {
        /* A graph launched into a capture: its nodes join the capture's graph. */
        for (size_t i = 0; g->graph && i < g->graph->n; i++)
            capture_launch(key, g->graph->nodes[i].function, g->graph->nodes[i].blocks);
        return CUDA_SUCCESS;
    }
    stream_push(key, enqueue(&dev->compute_busy_until, stream_tail(key), graph_ns(g)));
    return CUDA_SUCCESS;
}

/* A copy: queued on the copy engine after the stream's earlier work; synchronous ones wait. */
/* Larger than any device's memory (2^48 bytes): refused, as the driver refuses a copy past an
 * allocation, before any time is simulated. */
#define MAX_COPY_BYTES ((size_t)1 << 48)

static CUresult copy(size_t bytes, CUstream s, int per_thread, int synchronous) {
    init();
    spin(cfg_call_ns);
    if (bytes > MAX_COPY_BYTES) return CUDA_ERROR_INVALID_VALUE;
    uintptr_t key = stream_key(s, per_thread);
    if (!synchronous && is_capturing(key)) return CUDA_SUCCESS; /* a copy node, not run */
    uint64_t done = enqueue(&dev->copy_busy_until, stream_tail(key), (uint64_t)bytes * 1000 / cfg_bytes_per_us);
    stream_push(key, done);
    if (synchronous) wait_until(done);
    return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream s, int per_thread) {
    init();
    spin(cfg_call_ns);
    wait_until(stream_tail(stream_key(s, per_thread)));
    return CUDA_SUCCESS;
}

static CUresult stream_wait_event(CUstream s, CUevent e, int per_thread) {
    init();
    spin(cfg_call_ns);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    uintptr_t key = stream_key(s, per_thread);
    if (e->capture) {
        /* Waiting on an event of a capture: the stream joins it. */
        pthread_mutex_lock(&objs_lock);
        int joined = capture_join(key, e->capture);
        pthread_mutex_unlock(&objs_lock);
        return joined ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    }
    stream_push(key, e->done_at);
    return CUDA_SUCCESS;
}

static CUresult mem_alloc(CUdeviceptr *dptr, size_t bytes) {
    init();
    spin(cfg_call_ns);
    if (!dptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    uint64_t rounded = (bytes + 255) & ~(uint64_t)255;
    if (cfg_memory_bytes) {
        uint64_t used = __atomic_add_fetch(&dev->memory_used, rounded, __ATOMIC_RELAXED);
        if (used > cfg_memory_bytes) {
            __atomic_sub_fetch(&dev->memory_used, rounded, __ATOMIC_RELAXED);
            *dptr = 0;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    *dptr = __atomic_fetch_add(&next_dptr, rounded, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

static CUresult mem_free(CUdeviceptr p) {
    init();
    spin(cfg_call_ns);
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- set-up entry points (not probed) ------------------------------------------------------- */

EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
    *m = calloc(1, sizeof **m);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuLibraryLoadData(CUlibrary *l, const void *code, void *jo, void *jv, unsigned int nj,
                                  void *lo, void *lv, unsigned int nl) {
    (void)jo; (void)jv; (void)nj; (void)lo; (void)lv; (void)nl;
    if (!l || !code) return CUDA_ERROR_INVALID_VALUE;
    *l = (CUlibrary)calloc(1, sizeof(struct CUmod_st));
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags) {
    (void)flags;
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    *e = calloc(1, sizeof **e);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphInstantiateStandin(CUgraphExec *g) {
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    *g = calloc(1, sizeof **g);
    return CUDA_SUCCESS;
}

/* ---- launches ----------------------------------------------------------------------------- */

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                               unsigned int by, unsigned int bz, unsigned int smem, CUstream s, void **params,
                               void **extra) {
    (void)smem; (void)params; (void)extra;
    return launch(f, gx, gy, gz, bx, by, bz, s, 0);
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                    unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem,
                                    CUstream s, void **params, void **extra) {
    (void)smem; (void)params; (void)extra;
    return launch(f, gx, gy, gz, bx, by, bz, s, 1);
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                          unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem,
                                          CUstream s, void **params) {
    (void)smem; (void)params;
    return launch(f, gx, gy, gz, bx, by, bz, s, 0);
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                               unsigned int bx, unsigned int by, unsigned int bz,
                                               unsigned int smem, CUstream s, void **params) {
    (void)smem; (void)params;
    return launch(f, gx, gy, gz, bx, by, bz, s, 1);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)params; (void)extra;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ, c->hStream, 0);
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)params; (void)extra;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ, c->hStream, 1);
}
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { return graph_launch(g, s, 0); }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return graph_launch(g, s, 1); }

/* ---- waits ---------------------------------------------------------------------------------- */

EXPORT CUresult cuStreamSynchronize(CUstream s) { return stream_sync(s, 0); }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return stream_sync(s, 1); }
/* cuCtxSynchronize's work, out of line: what the entry point itself holds decides how far its
 * fault below sits from the entry (the function that calls spin() would save registers first). */
static __attribute__((noinline)) CUresult ctx_synchronize(void) {
    init();
    spin(cfg_call_ns);
    wait_until(all_tail());
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSynchronize(void) {
    /* CUDA_STANDIN_FAULT=1: an illegal instruction a few instructions past the entry, where a
     * probe that resumed at the wrong place would fault (the harm breaker's test). In assembly,
     * so that the compiler cannot move it out of line. */
#if defined(__x86_64__)
    __asm__ volatile("cmpl $0, %0\n\tje 1f\n\tud2\n1:" ::"m"(cfg_fault));
#elif defined(__aarch64__)
    __asm__ volatile("ldr w9, %0\n\tcbz w9, 1f\n\tudf #0\n1:" ::"m"(cfg_fault) : "x9");
#endif
    return ctx_synchronize();
}
EXPORT CUresult cuEventSynchronize(CUevent e) {
    init();
    spin(cfg_call_ns);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    wait_until(e->done_at);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) { (void)flags; return stream_wait_event(s, e, 0); }
EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned int flags) { (void)flags; return stream_wait_event(s, e, 1); }

/* ---- copies, memory, names; serving stacks; memsets, 2-D, 3-D and batch copies ---------------- */
#include "libcuda_devices.c"
#include "libcuda_calls.c"
#include "libcuda_serving.c"
#include "libcuda_sized.c"
