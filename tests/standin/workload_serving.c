/* cuda-workload's serving-stack scenarios: CUDA graphs, event waits and polling, as vLLM,
 * PyTorch and NCCL drive the driver (see workload.c for the others).
 *
 *   graph K REPLAYS DIRECT     capture K named kernels on stream 1 (half of them on stream 2,
 *                              joined to the capture by events), instantiate, launch the graph
 *                              REPLAYS times with a stream wait each; meanwhile a second thread
 *                              makes DIRECT plain launches of another kernel on its own stream
 *   evented ITERS LAUNCHES GRID BYTES
 *                              vLLM's loop: per iteration LAUNCHES launches of GRID blocks, an
 *                              asynchronous device-to-host copy of BYTES, cuEventRecord, then
 *                              cuEventSynchronize
 *   polled ITERS LAUNCHES GRID event|stream
 *                              per iteration LAUNCHES launches, then cuEventQuery (after a
 *                              record) or cuStreamQuery until it answers success
 *   join ITERS LAUNCHES        launches on two streams joined by cuStreamWaitEvent, never a
 *                              host wait until the very end
 *   resolve N MAPPINGS         a tenant's flood: MAPPINGS one-page mappings (a long /proc/PID/maps),
 *                              then N cuGetProcAddress_v2 of cuLaunchKernel, then 5 s alive
 *   copysync SECONDS BYTES GAP_US
 *                              PyTorch's .cpu(): an asynchronous host-to-device copy of BYTES,
 *                              then cuStreamSynchronize of its stream, GAP_US apart
 *
 * Each prints one JSON line: what it did, and the device time it queued (blocks times
 * CUDA_STANDIN_NS_PER_BLOCK), for the tests to compare with what was traced.
 */
#include "workload.h"

static uint64_t ns_per_block(void) {
    const char *v = getenv("CUDA_STANDIN_NS_PER_BLOCK");
    return v && *v ? strtoull(v, NULL, 10) : 100;
}

/* The stand-in's copy time of BYTES (CUDA_STANDIN_COPY_BYTES_PER_US). */
static uint64_t copy_ns(size_t bytes) {
    const char *v = getenv("CUDA_STANDIN_COPY_BYTES_PER_US");
    uint64_t per_us = v && *v ? strtoull(v, NULL, 10) : 10000;
    return (uint64_t)bytes * 1000 / (per_us ? per_us : 1);
}

/* ---- graph ------------------------------------------------------------------------------------ */

struct direct_args {
    long n;
    CUfunction f;
    CUstream s;
};

static void *direct_thread(void *p) {
    struct direct_args *a = p;
    thread_ctx();
    PFN_cuLaunchKernel launch = (PFN_cuLaunchKernel)sym("cuLaunchKernel", 1);
    for (long i = 0; i < a->n; i++) CHECK(launch(a->f, 2, 1, 1, 64, 1, 1, 0, a->s, kernel_params, NULL));
    CHECK(((PFN_cuStreamSynchronize)sym("cuStreamSynchronize", 1))(a->s));
    return NULL;
}

static void run_graph(long k, long replays, long direct) {
    setup(4096);
    PFN_cuModuleGetFunction getfn = (PFN_cuModuleGetFunction)sym("cuModuleGetFunction", 1);
    PFN_cuLaunchKernel launch = (PFN_cuLaunchKernel)sym("cuLaunchKernel", 1);
    PFN_cuEventCreate ecreate = (PFN_cuEventCreate)sym("cuEventCreate", 1);
    PFN_cuEventRecord erecord = (PFN_cuEventRecord)sym("cuEventRecord", 1);
    PFN_cuStreamWaitEvent wait = (PFN_cuStreamWaitEvent)sym("cuStreamWaitEvent", 1);
    PFN_cuStreamBeginCapture begin = (PFN_cuStreamBeginCapture)sym("cuStreamBeginCapture_v2", 1);
    PFN_cuStreamEndCapture end = (PFN_cuStreamEndCapture)sym("cuStreamEndCapture", 1);
    PFN_cuGraphInstantiateWithFlags inst = (PFN_cuGraphInstantiateWithFlags)sym("cuGraphInstantiateWithFlags", 1);
    PFN_cuGraphLaunch glaunch = (PFN_cuGraphLaunch)sym("cuGraphLaunch", 1);
    PFN_cuStreamSynchronize ssync = (PFN_cuStreamSynchronize)sym("cuStreamSynchronize", 1);
    CUstream s1 = new_stream(), s2 = new_stream();
    CUevent fork, back;
    CHECK(ecreate(&fork, 0));
    CHECK(ecreate(&back, 0));
    CUfunction fs[64];
    if (k < 1 || k > 64) exit(64);
    for (long i = 0; i < k; i++) {
        char name[32];
        snprintf(name, sizeof name, "_Z7graphk%ldv", i);
        CHECK(getfn(&fs[i], module, name));
    }
    CUfunction df;
    CHECK(getfn(&df, module, "_Z6directv"));
    struct direct_args da = {direct, df, new_stream()};

    /* Capture: stream 1 forks to stream 2 by an event, stream 2 joins back before the end. The
     * second thread launches for real while the capture is open. */
    CHECK(begin(s1, 0));
    pthread_t t;
    pthread_create(&t, NULL, direct_thread, &da);
    pthread_join(t, NULL);
    long half = k / 2;
    for (long i = 0; i < half; i++) CHECK(launch(fs[i], 4, 1, 1, 128, 1, 1, 0, s1, kernel_params, NULL));
    CHECK(erecord(fork, s1));
    CHECK(wait(s2, fork, 0));
    for (long i = half; i < k; i++) CHECK(launch(fs[i], 4, 1, 1, 128, 1, 1, 0, s2, kernel_params, NULL));
    CHECK(erecord(back, s2));
    CHECK(wait(s1, back, 0));
    CUgraph g;
    CHECK(end(s1, &g));
    CUgraphExec x;
    CHECK(inst(&x, g, 0));
    for (long r = 0; r < replays; r++) {
        CHECK(glaunch(x, s1));
        CHECK(ssync(s1));
    }
    printf("{\"pid\":%d,\"kernels\":%ld,\"replays\":%ld,\"direct\":%ld,\"device_ns\":%llu}\n", getpid(), k, replays,
           direct, (unsigned long long)(replays * k * 4 * ns_per_block() + direct * 2 * ns_per_block()));
}

/* ---- evented, polled, join ------------------------------------------------------------------- */

static void run_evented(long iters, long launches, unsigned grid, size_t bytes) {
    setup(bytes < 4096 ? 4096 : bytes);
    PFN_cuLaunchKernel launch = (PFN_cuLaunchKernel)sym("cuLaunchKernel", 1);
    PFN_cuMemcpyDtoHAsync dtoh = (PFN_cuMemcpyDtoHAsync)sym("cuMemcpyDtoHAsync_v2", 1);
    PFN_cuEventRecord erecord = (PFN_cuEventRecord)sym("cuEventRecord", 1);
    PFN_cuEventSynchronize esync = (PFN_cuEventSynchronize)sym("cuEventSynchronize", 1);
    CUevent e;
    CHECK(((PFN_cuEventCreate)sym("cuEventCreate", 1))(&e, 0));
    CUstream s = new_stream();
    for (long i = 0; i < iters; i++) {
        for (long l = 0; l < launches; l++) CHECK(launch(function, grid, 1, 1, 128, 1, 1, 0, s, kernel_params, NULL));
        CHECK(dtoh(host_buf, dev_a, bytes, s));
        CHECK(erecord(e, s));
        CHECK(esync(e));
    }
    printf("{\"pid\":%d,\"stream\":%llu,\"iterations\":%ld,\"launches\":%ld,\"device_ns\":%llu}\n", getpid(),
           (unsigned long long)(uintptr_t)s, iters, iters * launches,
           (unsigned long long)(iters * (launches * grid * ns_per_block() + copy_ns(bytes))));
}

static void run_polled(long iters, long launches, unsigned grid, const char *how) {
    setup(4096);
    PFN_cuLaunchKernel launch = (PFN_cuLaunchKernel)sym("cuLaunchKernel", 1);
    PFN_cuEventRecord erecord = (PFN_cuEventRecord)sym("cuEventRecord", 1);
    PFN_cuEventQuery equery = (PFN_cuEventQuery)sym("cuEventQuery", 1);
    PFN_cuStreamQuery squery = (PFN_cuStreamQuery)sym("cuStreamQuery", 1);
    int by_stream = !strcmp(how, "stream");
    CUevent e;
    CHECK(((PFN_cuEventCreate)sym("cuEventCreate", 1))(&e, 0));
    CUstream s = new_stream();
    long not_ready = 0;
    for (long i = 0; i < iters; i++) {
        for (long l = 0; l < launches; l++) CHECK(launch(function, grid, 1, 1, 128, 1, 1, 0, s, kernel_params, NULL));
        if (!by_stream) CHECK(erecord(e, s));
        for (;;) {
            CUresult r = by_stream ? squery(s) : equery(e);
            if (r == CUDA_SUCCESS) break;
            if (r != CUDA_ERROR_NOT_READY) CHECK(r);
            not_ready++;
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
    printf("{\"pid\":%d,\"stream\":%llu,\"iterations\":%ld,\"launches\":%ld,\"not_ready\":%ld,\"device_ns\":%llu}\n",
           getpid(), (unsigned long long)(uintptr_t)s, iters, iters * launches, not_ready,
           (unsigned long long)(iters * launches * grid * ns_per_block()));
}

static void run_join(long iters, long launches) {
    setup(4096);
    PFN_cuLaunchKernel launch = (PFN_cuLaunchKernel)sym("cuLaunchKernel", 1);
    PFN_cuEventRecord erecord = (PFN_cuEventRecord)sym("cuEventRecord", 1);
    PFN_cuStreamWaitEvent wait = (PFN_cuStreamWaitEvent)sym("cuStreamWaitEvent", 1);
    CUevent e;
    CHECK(((PFN_cuEventCreate)sym("cuEventCreate", 1))(&e, 0));
    CUstream a = new_stream(), b = new_stream();
    for (long i = 0; i < iters; i++) {
        for (long l = 0; l < launches; l++) CHECK(launch(function, 1, 1, 1, 32, 1, 1, 0, a, kernel_params, NULL));
        CHECK(erecord(e, a));
        CHECK(wait(b, e, 0));
        for (long l = 0; l < launches; l++) CHECK(launch(function, 1, 1, 1, 32, 1, 1, 0, b, kernel_params, NULL));
    }
    printf("{\"pid\":%d,\"iterations\":%ld,\"launches\":%ld}\n", getpid(), iters, 2 * iters * launches);
    fflush(stdout);
    CHECK(((PFN_cuCtxSynchronize)sym("cuCtxSynchronize", 1))());
}

static void run_copysync(double seconds, size_t bytes, long gap_us) {
    setup(bytes);
    PFN_cuMemcpyHtoDAsync htod = (PFN_cuMemcpyHtoDAsync)sym("cuMemcpyHtoDAsync_v2", 1);
    PFN_cuStreamSynchronize ssync = (PFN_cuStreamSynchronize)sym("cuStreamSynchronize", 1);
    CUstream s = new_stream();
    printf("{\"pid\":%d,\"stream\":%llu}\n", getpid(), (unsigned long long)(uintptr_t)s);
    fflush(stdout);
    uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
    while (now_ns() < end) {
        CHECK(htod(dev_a, host_buf, bytes, s));
        CHECK(ssync(s));
        struct timespec ts = {gap_us / 1000000, (gap_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
}

static void run_resolve(long n, long mappings) {
    long page = sysconf(_SC_PAGESIZE);
    char *base = mmap(NULL, (size_t)(page * mappings), PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) { perror("mmap"); exit(2); }
    for (long i = 0; i < mappings; i += 2) mprotect(base + i * page, (size_t)page, PROT_READ | PROT_WRITE);
    PFN_cuGetProcAddress resolve = (PFN_cuGetProcAddress)dlsym(lib, "cuGetProcAddress_v2");
    if (!resolve) exit(2);
    uint64_t start = now_ns();
    for (long i = 0; i < n; i++) {
        void *p = NULL;
        int status = -1;
        CHECK(resolve("cuLaunchKernel", &p, 12000, 0, &status));
    }
    printf("{\"pid\":%d,\"lookups\":%ld,\"mappings\":%ld,\"seconds\":%.3f}\n", getpid(), n, mappings,
           (double)(now_ns() - start) / 1e9);
    fflush(stdout);
    sleep(5);
}

/* Runs a serving scenario; 0 when `scenario` is none of them. */
int run_serving(const char *scenario, int argc, char **argv) {
    if (!strcmp(scenario, "graph") && argc == 3) run_graph(atol(argv[0]), atol(argv[1]), atol(argv[2]));
    else if (!strcmp(scenario, "evented") && argc == 4)
        run_evented(atol(argv[0]), atol(argv[1]), (unsigned)atoi(argv[2]), (size_t)atoll(argv[3]));
    else if (!strcmp(scenario, "polled") && argc == 4)
        run_polled(atol(argv[0]), atol(argv[1]), (unsigned)atoi(argv[2]), argv[3]);
    else if (!strcmp(scenario, "join") && argc == 2) run_join(atol(argv[0]), atol(argv[1]));
    else if (!strcmp(scenario, "resolve") && argc == 2) run_resolve(atol(argv[0]), atol(argv[1]));
    else if (!strcmp(scenario, "copysync") && argc == 3)
        run_copysync(atof(argv[0]), (size_t)atoll(argv[1]), atol(argv[2]));
    else return 0;
    return 1;
}
