/* cuda-workload: drives a libcuda (the stand-in, or NVIDIA's with --real) through function pointers
 * from dlsym, as the CUDA runtime does after cuGetProcAddress, with known arguments, and prints
 * what it did as one JSON line on stdout so that tests can compare it with what was traced.
 *
 *   cuda-workload [--lib PATH] [--real] [--threads T] SCENARIO [ARGS]
 *     basic LAUNCHES COPIES     launches and copies split over T threads (see below for arguments)
 *     each N                    every entry point the library exports, N calls each
 *     loop SECONDS GRID SYNC_EVERY [CALL_LIMIT]
 *                               launches of GRID blocks, a cuStreamSynchronize every SYNC_EVERY
 *     wait-for-lib N            once stdin closes: dlopen, then call cuLaunchKernel N times
 *     die-in-call               exit while a thread is blocked inside cuStreamSynchronize
 *     calls N [SECONDS]         N timed cuLaunchKernel calls per thread (benchmarks)
 *     copy-calls N [SECONDS]    N timed 64-byte cuMemcpyHtoD_v2 calls per thread (benchmarks)
 *     kernels K                 K distinct kernel names looked up and launched once each
 *     handles N HOLD            N launches of N made-up kernel handles, then HOLD seconds idle
 *     lookups N HOLD            N cuModuleGetFunction calls of N distinct 254-byte names, then HOLD
 *     crowd MAPPINGS SECONDS    no driver at all: MAPPINGS separate mappings, then SECONDS asleep (a
 *                               crowded node's process, for the discovery benchmark)
 *     syscalls N                N getppid() system calls, timed (the cost of a sys_enter hook)
 *     graph, evented, polled, join: the serving-stack scenarios (workload_serving.c)
 *     two-devices L0 L1 COPIES HOLD  one process driving two devices (workload_devices.c; set
 *                               CUDA_STANDIN_DEVICES=2)
 *                               seconds idle (with CUDA_STANDIN_FRESH_HANDLES=1, a handle each)
 *     allocs BYTES N HOLD       N allocations of BYTES each (failures go on), then HOLD seconds idle;
 *                               WORKLOAD_ALLOC picks the entry point (see alloc_by_kind)
 *     grow BYTES EVERY_MS SECONDS  a cuMemAlloc_v2 of BYTES every EVERY_MS for SECONDS, none freed
 *     copies SECONDS BYTES GAP_US
 *                               synchronous host-to-device copies of BYTES, GAP_US apart
 *     huge-copies N             N host-to-device copies of 2^63 bytes, each refused by the library
 *     headless SECONDS          loop SECONDS 1 1 in a second thread, after main calls pthread_exit
 *     lookup NAME               cuModuleGetFunction of NAME (any bytes, from a tenant), one launch
 *     rename NAME N             N launches, then prctl(PR_SET_NAME, NAME), then N launches
 *     unpaged-config N          N cuLaunchKernelEx calls whose CUlaunchConfig sits in a file
 *                               mapping not yet paged in (grid N+1 x 2 x 3): a probe cannot read
 *                               it without faulting, the driver's own read faults it in
 *   WORKLOAD_RESOLVE=procaddress resolves every entry point through cuGetProcAddress_v2.
 *   --settle MS sleeps between dlopen and the first call.
 *   --hold waits, after dlopen, until stdin closes before the first call.
 *   --exit CODE exits with CODE once the scenario is done (a crashing server, for restart loops).
 *
 * basic: thread t's launch i uses grid (1 + i % 1000, 2 + t, 3), block (32, 1 + i % 8, 2),
 * sharedMemBytes i, and thread t's stream; its copy j moves 1024 + 16 * j + t bytes, host to device
 * when j is even, device to host when odd.
 */
#include <fcntl.h>

#include "workload.h"

const char *MANGLED = "_Z11hidden_gemmPfS_i";
const char *LIB_KERNEL = "_Z8lib_axpyfPKfPf";
/* A kernel with the signature of MANGLED that does nothing: enough for a real driver to launch. */
const char *PTX =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry _Z11hidden_gemmPfS_i(.param .u64 a, .param .u64 b, .param .u32 n) { ret; }\n";

void *lib;
const char *lib_path = "libcuda.so.1";
int real_driver;
uint64_t loaded_ns; /* CLOCK_MONOTONIC when dlopen returned */

/* WORKLOAD_RESOLVE=procaddress: every entry point through cuGetProcAddress_v2, as the CUDA
 * runtime gets them, instead of dlsym. */
void *sym(const char *name, int required) {
    static PFN_cuGetProcAddress resolve;
    static int mode = -1;
    if (mode < 0) {
        const char *m = getenv("WORKLOAD_RESOLVE");
        mode = m && !strcmp(m, "procaddress");
        if (mode) resolve = (PFN_cuGetProcAddress)dlsym(lib, "cuGetProcAddress_v2");
    }
    void *p = NULL;
    if (mode && resolve) {
        int status = -1;
        if (resolve(name, &p, 12000, 0, &status) != CUDA_SUCCESS) p = NULL;
    } else {
        p = dlsym(lib, name);
    }
    if (!p && required) {
        fprintf(stderr, "cuda-workload: %s does not export %s\n", "the library", name);
        exit(2);
    }
    return p;
}

uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- shared set-up ---------------------------------------------------------------------------- */

CUcontext ctx;
CUmodule module;
CUfunction function;
CUdeviceptr dev_a, dev_b;
char *host_buf;
void *kernel_params[3];
unsigned int kernel_n = 1;

void setup(size_t buf_bytes) {
    CUdevice d;
    CHECK(((PFN_cuInit)sym("cuInit", 1))(0));
    CHECK(((PFN_cuDeviceGet)sym("cuDeviceGet", 1))(&d, 0));
    /* The primary context, as the CUDA runtime uses: cuCtxCreate's signature changed in CUDA 13. */
    CHECK(((PFN_cuDevicePrimaryCtxRetain)sym("cuDevicePrimaryCtxRetain", 1))(&ctx, d));
    CHECK(((PFN_cuCtxSetCurrent)sym("cuCtxSetCurrent", 1))(ctx));
    CHECK(((PFN_cuModuleLoadData)sym("cuModuleLoadData", 1))(&module, PTX));
    CHECK(((PFN_cuModuleGetFunction)sym("cuModuleGetFunction", 1))(&function, module, MANGLED));
    PFN_cuMemAlloc alloc = (PFN_cuMemAlloc)sym("cuMemAlloc_v2", 1);
    CHECK(alloc(&dev_a, buf_bytes));
    CHECK(alloc(&dev_b, buf_bytes));
    host_buf = calloc(1, buf_bytes);
    kernel_params[0] = &dev_a;
    kernel_params[1] = &dev_b;
    kernel_params[2] = &kernel_n;
}

/* A real driver's context is current per thread: each worker thread makes the primary context
 * current, as the CUDA runtime does. The stand-in keeps one for the process. */
void thread_ctx(void) {
    if (real_driver) CHECK(((PFN_cuCtxSetCurrent)sym("cuCtxSetCurrent", 1))(ctx));
}

CUstream new_stream(void) {
    CUstream s;
    CHECK(((PFN_cuStreamCreate)sym("cuStreamCreate", 1))(&s, 0));
    return s;
}
/* ---- basic ------------------------------------------------------------------------------------ */

struct basic_args {
    int t;
    long launches, copies;
    CUstream stream;
};

static void *basic_thread(void *p) {
    struct basic_args *a = p;
    thread_ctx();
    PFN_cuLaunchKernel launch = (PFN_cuLaunchKernel)sym("cuLaunchKernel", 1);
    PFN_cuMemcpyHtoD htod = (PFN_cuMemcpyHtoD)sym("cuMemcpyHtoD_v2", 1);
    PFN_cuMemcpyDtoH dtoh = (PFN_cuMemcpyDtoH)sym("cuMemcpyDtoH_v2", 1);
    long copies_done = 0;
    for (long i = 0; i < a->launches; i++) {
        CHECK(launch(function, 1 + i % 1000, 2 + a->t, 3, 32, 1 + i % 8, 2, (unsigned)i, a->stream, kernel_params,
                     NULL));
        /* Spread the copies among the launches. */
        long due = a->launches ? (i + 1) * a->copies / a->launches : a->copies;
        for (; copies_done < due; copies_done++) {
            size_t bytes = 1024 + 16 * copies_done + a->t;
            if (copies_done % 2 == 0) CHECK(htod(dev_a, host_buf, bytes));
            else CHECK(dtoh(host_buf, dev_a, bytes));
        }
    }
    for (; copies_done < a->copies; copies_done++) {
        size_t bytes = 1024 + 16 * copies_done + a->t;
        if (copies_done % 2 == 0) CHECK(htod(dev_a, host_buf, bytes));
        else CHECK(dtoh(host_buf, dev_a, bytes));
    }
    return NULL;
}

static void run_basic(int threads, long launches, long copies) {
    setup(1 << 20);
    pthread_t th[MAX_THREADS];
    struct basic_args args[MAX_THREADS];
    printf("{\"pid\":%d,\"loaded_ns\":%llu,\"function\":%llu,\"streams\":[", getpid(),
           (unsigned long long)loaded_ns, (unsigned long long)(uintptr_t)function);
    for (int t = 0; t < threads; t++) {
        args[t] = (struct basic_args){t, launches / threads + (t < launches % threads),
                                      copies / threads + (t < copies % threads), new_stream()};
        printf("%s%llu", t ? "," : "", (unsigned long long)(uintptr_t)args[t].stream);
    }
    printf("],\"launches_per_thread\":[");
    for (int t = 0; t < threads; t++) printf("%s%ld", t ? "," : "", args[t].launches);
    printf("],\"copies_per_thread\":[");
    for (int t = 0; t < threads; t++) printf("%s%ld", t ? "," : "", args[t].copies);
    printf("]}\n");
    fflush(stdout);
    for (int t = 0; t < threads; t++) pthread_create(&th[t], NULL, basic_thread, &args[t]);
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    CHECK(((PFN_cuCtxSynchronize)sym("cuCtxSynchronize", 1))());
}

/* ---- loop ------------------------------------------------------------------------------------- */

void run_loop(double seconds, unsigned grid, long sync_every, long limit) {
    setup(1 << 20);
    CUstream s = new_stream();
    PFN_cuLaunchKernel launch = (PFN_cuLaunchKernel)sym("cuLaunchKernel", 1);
    PFN_cuStreamSynchronize ssync = (PFN_cuStreamSynchronize)sym("cuStreamSynchronize", 1);
    uint64_t start = now_ns(), end = start + (uint64_t)(seconds * 1e9);
    /* WORKLOAD_GRID_AFTER=S:GRID: from S seconds on, the same kernel with GRID blocks (its own
     * requests changed: the causal verdicts' workload_change). */
    const char *after = getenv("WORKLOAD_GRID_AFTER");
    uint64_t grow_at = UINT64_MAX;
    unsigned grown = grid;
    if (after && strchr(after, ':')) {
        grow_at = start + (uint64_t)(atof(after) * 1e9);
        grown = (unsigned)atol(strchr(after, ':') + 1);
    }
    /* WORKLOAD_SYNC=event: each wait is cuEventRecord then cuEventSynchronize (vLLM's way),
     * which closes no batch the tracer knows of. WORKLOAD_IDLE_AFTER=S: from S seconds on it
     * launches nothing and sleeps until the end (a server without requests). */
    const char *how = getenv("WORKLOAD_SYNC");
    int by_event = how && !strcmp(how, "event");
    PFN_cuEventCreate ecreate = (PFN_cuEventCreate)sym("cuEventCreate", 1);
    PFN_cuEventRecord erecord = (PFN_cuEventRecord)sym("cuEventRecord", 1);
    PFN_cuEventSynchronize esync = (PFN_cuEventSynchronize)sym("cuEventSynchronize", 1);
    CUevent ev = NULL;
    if (by_event) CHECK(ecreate(&ev, 0));
    const char *idle = getenv("WORKLOAD_IDLE_AFTER");
    uint64_t idle_at = idle && *idle ? start + (uint64_t)(atof(idle) * 1e9) : UINT64_MAX;
    long launches = 0, syncs = 0;
    while (now_ns() < end && (limit <= 0 || launches < limit)) {
        if (now_ns() >= idle_at) {
            while (now_ns() < end) {
                struct timespec ts = {0, 100000000};
                nanosleep(&ts, NULL);
            }
            break;
        }
        unsigned g = now_ns() >= grow_at ? grown : grid;
        CHECK(launch(function, g, 1, 1, 128, 1, 1, 0, s, kernel_params, NULL));
        launches++;
        if (sync_every > 0 && launches % sync_every == 0) {
            if (by_event) {
                CHECK(erecord(ev, s));
                CHECK(esync(ev));
            } else {
                CHECK(ssync(s));
            }
            syncs++;
        }
    }
    if (by_event) {
        CHECK(erecord(ev, s));
        CHECK(esync(ev));
    } else {
        CHECK(ssync(s));
    }
    syncs++;
    printf("{\"pid\":%d,\"function\":%llu,\"stream\":%llu,\"launches\":%ld,\"syncs\":%ld}\n", getpid(),
           (unsigned long long)(uintptr_t)function, (unsigned long long)(uintptr_t)s, launches, syncs);
}

/* ---- copies ----------------------------------------------------------------------------------- */

static void run_copies(double seconds, size_t bytes, long gap_us) {
    setup(bytes);
    PFN_cuMemcpyHtoD htod = (PFN_cuMemcpyHtoD)sym("cuMemcpyHtoD_v2", 1);
    uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
    long copies = 0;
    while (now_ns() < end) {
        CHECK(htod(dev_a, host_buf, bytes));
        copies++;
        if (gap_us > 0) {
            struct timespec ts = {gap_us / 1000000, (gap_us % 1000000) * 1000};
            nanosleep(&ts, NULL);
        }
    }
    printf("{\"pid\":%d,\"copies\":%ld,\"bytes\":%llu}\n", getpid(), copies, (unsigned long long)bytes * copies);
}

/* ---- calls (benchmark) ------------------------------------------------------------------------ */

struct calls_args { long n; double seconds; long done; uint64_t ns; int copies; };

static void *calls_thread(void *p) {
    struct calls_args *a = p;
    thread_ctx();
    PFN_cuLaunchKernel launch = (PFN_cuLaunchKernel)sym("cuLaunchKernel", 1);
    PFN_cuMemcpyHtoD htod = (PFN_cuMemcpyHtoD)sym("cuMemcpyHtoD_v2", 1);
    uint64_t start = now_ns(), end = a->seconds > 0 ? start + (uint64_t)(a->seconds * 1e9) : UINT64_MAX;
    long i = 0;
    for (; i < a->n; i++) {
        if (a->copies) CHECK(htod(dev_a, host_buf, 64));
        else CHECK(launch(function, 1, 1, 1, 32, 1, 1, 0, NULL, kernel_params, NULL));
        if ((i & 1023) == 1023 && now_ns() >= end) { i++; break; }
    }
    a->done = i;
    a->ns = now_ns() - start;
    return NULL;
}

/* N launches (or, with COPIES, 64-byte host-to-device copies) per thread, or fewer when SECONDS
 * pass, timed: the cost of one traced call. */
static void run_calls(int threads, long n, double seconds, int copies) {
    setup(4096);
    pthread_t th[MAX_THREADS];
    struct calls_args args[MAX_THREADS];
    for (int t = 0; t < threads; t++) {
        args[t] = (struct calls_args){n, seconds, 0, 0, copies};
        pthread_create(&th[t], NULL, calls_thread, &args[t]);
    }
    long total = 0;
    uint64_t longest = 0, sum_ns = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        total += args[t].done;
        sum_ns += args[t].ns;
        if (args[t].ns > longest) longest = args[t].ns;
    }
    printf("{\"pid\":%d,\"calls\":%ld,\"ns_per_call\":%.2f,\"seconds\":%.3f,\"calls_per_second\":%.0f}\n", getpid(), total,
           total ? (double)sum_ns / (double)total : 0.0, (double)longest / 1e9, longest ? (double)total * 1e9 / (double)longest : 0.0);
}

/* K distinct kernels looked up by name, each launched once: for the tracer's memory at scale. */
static void run_kernels(long k) {
    setup(4096);
    PFN_cuModuleGetFunction getfn = (PFN_cuModuleGetFunction)sym("cuModuleGetFunction", 1);
    PFN_cuLaunchKernel launch = (PFN_cuLaunchKernel)sym("cuLaunchKernel", 1);
    char name[64];
    for (long i = 0; i < k; i++) {
        CUfunction f;
        snprintf(name, sizeof name, "_Z8kernel%05ldv", i);
        CHECK(getfn(&f, module, name));
        CHECK(launch(f, 1, 1, 1, 32, 1, 1, 0, NULL, kernel_params, NULL));
    }
    printf("{\"pid\":%d,\"kernels\":%ld}\n", getpid(), k);
}

/* N launches, each of its own made-up kernel handle (a tenant's way to fill the tracer's launch
 * map), then HOLD seconds alive without a call, so that the cells stay while the process does. */
static void run_handles(long n, double hold) {
    setup(4096);
    PFN_cuLaunchKernel launch = (PFN_cuLaunchKernel)sym("cuLaunchKernel", 1);
    for (long i = 0; i < n; i++)
        CHECK(launch((CUfunction)(uintptr_t)(0x7f0000000000ull + 16ull * (uint64_t)i), 1, 1, 1, 32, 1, 1, 0, NULL,
                     kernel_params, NULL));
    printf("{\"pid\":%d,\"launches\":%ld}\n", getpid(), n);
    fflush(stdout);
    usleep((useconds_t)(hold * 1e6));
}

/* N allocations of BYTES each, going on past failures, then HOLD seconds alive holding them. */
static void run_allocs(size_t bytes, long n, double hold) {
    setup(4096);
    long ok = 0, oom = 0;
    for (long i = 0; i < n; i++) {
        CUresult r = alloc_by_kind(bytes);
        ok += r == CUDA_SUCCESS;
        oom += r == CUDA_ERROR_OUT_OF_MEMORY;
    }
    printf("{\"pid\":%d,\"allocated\":%ld,\"out_of_memory\":%ld}\n", getpid(), ok, oom);
    fflush(stdout);
    usleep((useconds_t)(hold * 1e6));
}

/* A leak: BYTES more device memory every EVERY_MS for SECONDS, nothing freed. */
static void run_grow(size_t bytes, long every_ms, double seconds) {
    setup(4096);
    uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
    long ok = 0;
    while (now_ns() < end) {
        ok += alloc_by_kind(bytes) == CUDA_SUCCESS;
        usleep((useconds_t)(every_ms * 1000));
    }
    printf("{\"pid\":%d,\"allocated\":%ld}\n", getpid(), ok);
}

/* N lookups of N distinct 254-byte names (a tenant's way to grow the tracer's name tables), then
 * HOLD seconds alive without a call, so that the tables stay while the process does. */
static void run_lookups(long n, double hold) {
    setup(4096);
    PFN_cuModuleGetFunction getfn = (PFN_cuModuleGetFunction)sym("cuModuleGetFunction", 1);
    char name[255];
    memset(name, 'x', sizeof name - 1);
    name[sizeof name - 1] = 0;
    long found = 0;
    for (long i = 0; i < n; i++) {
        CUfunction f;
        char head[24];
        int len = snprintf(head, sizeof head, "k%018ld", i);
        memcpy(name, head, (size_t)len); /* the rest stays 'x' */
        found += getfn(&f, module, name) == CUDA_SUCCESS;
    }
    printf("{\"pid\":%d,\"lookups\":%ld,\"found\":%ld}\n", getpid(), n, found);
    fflush(stdout);
    usleep((useconds_t)(hold * 1e6));
}

/* MAPPINGS one-page mappings that cannot merge (alternating protections), then SECONDS asleep: the
 * /proc/PID/maps of a process on a crowded node. Loads no library. With OPEN_MS, it opens a missing
 * libcuda.so.1 every OPEN_MS ms meanwhile (a tenant flooding discovery). */
static void run_crowd(long mappings, double seconds, long open_ms) {
    long page = sysconf(_SC_PAGESIZE);
    char *base = mmap(NULL, (size_t)(page * mappings), PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) { perror("mmap"); exit(2); }
    for (long i = 0; i < mappings; i += 2) mprotect(base + i * page, (size_t)page, PROT_READ | PROT_WRITE);
    printf("{\"pid\":%d,\"mappings\":%ld}\n", getpid(), mappings);
    fflush(stdout);
    if (open_ms <= 0) {
        usleep((useconds_t)(seconds * 1e6));
        return;
    }
    long opens = 0;
    double end = (double)now_ns() + seconds * 1e9;
    while ((double)now_ns() < end) {
        int fd = open("/nonexistent-cudatrace/libcuda.so.1", O_RDONLY);
        if (fd >= 0) close(fd);
        opens++;
        usleep((useconds_t)(open_ms * 1000));
    }
    fprintf(stderr, "crowd: %ld opens\n", opens);
}

/* N getppid() calls back to back: ns per system call. */
static void run_syscalls(long n) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) (void)getppid();
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    printf("{\"pid\":%d,\"calls\":%ld,\"ns_per_call\":%.1f}\n", getpid(), n, ns / (double)n);
}

/* ---- main ------------------------------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr, "usage: cuda-workload [--lib PATH] [--real] [--threads T] [--settle MS] [--hold] [--exit CODE] "
                    "basic LAUNCHES COPIES | each N | loop SECONDS GRID SYNC_EVERY [LIMIT] | wait-for-lib N | die-in-call | calls N [SECS] | copy-calls N [SECS] | kernels K | copies SECS BYTES GAP_US | unpaged-config N | huge-copies N | handles N HOLD | lookups N HOLD | crowd MAPPINGS SECS [OPEN_MS] | syscalls N | lookup NAME | rename NAME N | headless SECONDS | allocs BYTES N HOLD | grow BYTES EVERY_MS SECONDS | graph K REPLAYS DIRECT | evented ITERS LAUNCHES GRID BYTES | polled ITERS LAUNCHES GRID event|stream | join ITERS LAUNCHES | copysync SECONDS BYTES GAP_US | harm SECONDS | fault-in-call | fault-own | fault-self-noexec|raise|null | park THREADS GRID | churn-cgroups|churn-migrate|churn-leader-first N\n");
    exit(64);
}

int main(int argc, char **argv) {
    const char *path = "libcuda.so.1";
    int threads = 1, i = 1;
    long settle_ms = 0;
    int hold = 0, exit_code = 0;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (!strcmp(argv[i], "--lib") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--real")) real_driver = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--settle") && i + 1 < argc) settle_ms = atol(argv[++i]);
        else if (!strcmp(argv[i], "--hold")) hold = 1;
        else if (!strcmp(argv[i], "--exit") && i + 1 < argc) exit_code = atoi(argv[++i]);
        else usage();
    }
    if (i >= argc || threads < 1 || threads > MAX_THREADS) usage();
    const char *scenario = argv[i++];
    if (!strcmp(scenario, "wait-for-lib")) {
        /* Maps the library only after stdin closes, to test tracing of libraries loaded later. */
        char c;
        while (read(0, &c, 1) > 0) {}
    }
    /* Scenarios that load no driver: a crowded node's processes, and system calls alone. */
    if (!strcmp(scenario, "crowd") && (i + 2 == argc || i + 3 == argc)) {
        run_crowd(atol(argv[i]), atof(argv[i + 1]), i + 3 == argc ? atol(argv[i + 2]) : 0);
        return 0;
    }
    if (!strcmp(scenario, "syscalls") && i + 1 == argc) {
        run_syscalls(atol(argv[i]));
        return 0;
    }
    lib_path = path;
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "cuda-workload: cannot load %s: %s\n", path, dlerror());
        return 2;
    }
    loaded_ns = now_ns();
    /* Give a tracer that watches for newly mapped libraries time to attach before any call. */
    if (settle_ms > 0) {
        struct timespec ts = {settle_ms / 1000, (settle_ms % 1000) * 1000000};
        nanosleep(&ts, NULL);
    }
    if (hold) {
        char c;
        while (read(0, &c, 1) > 0) {}
    }
    if (!strcmp(scenario, "basic") && i + 2 == argc) run_basic(threads, atol(argv[i]), atol(argv[i + 1]));
    else if (!strcmp(scenario, "each") && i + 1 == argc) run_each(atol(argv[i]));
    else if (!strcmp(scenario, "loop") && (i + 3 == argc || i + 4 == argc))
        run_loop(atof(argv[i]), (unsigned)atoi(argv[i + 1]), atol(argv[i + 2]), i + 4 == argc ? atol(argv[i + 3]) : 0);
    else if (!strcmp(scenario, "wait-for-lib") && i + 1 == argc) run_basic(1, atol(argv[i]), 0);
    else if (!strcmp(scenario, "calls") && (i + 1 == argc || i + 2 == argc))
        run_calls(threads, atol(argv[i]), i + 2 == argc ? atof(argv[i + 1]) : 0, 0);
    else if (!strcmp(scenario, "copy-calls") && (i + 1 == argc || i + 2 == argc))
        run_calls(threads, atol(argv[i]), i + 2 == argc ? atof(argv[i + 1]) : 0, 1);
    else if (!strcmp(scenario, "kernels") && i + 1 == argc) run_kernels(atol(argv[i]));
    else if (!strcmp(scenario, "handles") && i + 2 == argc) run_handles(atol(argv[i]), atof(argv[i + 1]));
    else if (!strcmp(scenario, "lookups") && i + 2 == argc) run_lookups(atol(argv[i]), atof(argv[i + 1]));
    else if (!strcmp(scenario, "grow") && i + 3 == argc) run_grow((size_t)atoll(argv[i]), atol(argv[i + 1]), atof(argv[i + 2]));
    else if (!strcmp(scenario, "allocs") && i + 3 == argc) run_allocs((size_t)atoll(argv[i]), atol(argv[i + 1]), atof(argv[i + 2]));
    else if (!strcmp(scenario, "copies") && i + 3 == argc) run_copies(atof(argv[i]), (size_t)atol(argv[i + 1]), atol(argv[i + 2]));
    else if (!run_serving(scenario, argc - i, argv + i) && !run_misc(scenario, argc - i, argv + i) &&
             !run_devices(scenario, argc - i, argv + i) &&
             !run_harm_scenarios(scenario, threads, argc - i, argv + i))
        usage();
    fflush(stdout);
    return exit_code;
}
