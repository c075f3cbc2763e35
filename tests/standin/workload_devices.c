/* cuda-workload's context and device calls: the `each` scenario's share, and `two-devices`, one
 * process driving two GPUs as JAX or tensor parallelism in one process does (see workload.c). */
#include "workload.h"

/* N calls each of the context, UUID and stream entry points; the thread's current context is
 * the primary one of device 0 again afterwards. setup() retained it and made it current once,
 * and `streams` more streams were made by the scenario. */
void each_devices(long n, long streams, void (*count)(const char *, long)) {
    PFN_cuDevicePrimaryCtxRetain retain = (PFN_cuDevicePrimaryCtxRetain)sym("cuDevicePrimaryCtxRetain", 1);
    PFN_cuCtxSetCurrent set = (PFN_cuCtxSetCurrent)sym("cuCtxSetCurrent", 1);
    PFN_cuCtxPushCurrent push = (PFN_cuCtxPushCurrent)sym("cuCtxPushCurrent_v2", 1);
    PFN_cuCtxPopCurrent pop = (PFN_cuCtxPopCurrent)sym("cuCtxPopCurrent_v2", 1);
    PFN_cuCtxCreate create = (PFN_cuCtxCreate)sym("cuCtxCreate_v2", 0);
    PFN_cuCtxCreate_v4 create4 = (PFN_cuCtxCreate_v4)sym("cuCtxCreate_v4", 0);
    PFN_cuCtxDestroy destroy = (PFN_cuCtxDestroy)sym("cuCtxDestroy_v2", 1);
    PFN_cuDeviceGetUuid uuid = (PFN_cuDeviceGetUuid)sym("cuDeviceGetUuid", 0);
    PFN_cuDeviceGetUuid uuid2 = (PFN_cuDeviceGetUuid)sym("cuDeviceGetUuid_v2", 0);
    PFN_cuStreamCreate screate = (PFN_cuStreamCreate)sym("cuStreamCreate", 1);
    PFN_cuStreamCreateWithPriority sprio = (PFN_cuStreamCreateWithPriority)sym("cuStreamCreateWithPriority", 0);
    CUcontext c, popped;
    CUstream s;
    CUuuid u;
    for (long i = 0; i < n; i++) CHECK(retain(&c, 0));
    for (long i = 0; i < n; i++) CHECK(set(ctx));
    for (long i = 0; i < n; i++) {
        CHECK(push(ctx));
        CHECK(pop(&popped));
    }
    count("cuDevicePrimaryCtxRetain", n + 1);
    count("cuCtxSetCurrent", n + 1);
    count("cuCtxPushCurrent_v2", n);
    count("cuCtxPopCurrent_v2", n);
    long destroyed = 0;
    if (create) {
        for (long i = 0; i < n; i++) {
            CHECK(create(&c, 0, 0));
            CHECK(destroy(c));
        }
        count("cuCtxCreate_v2", n);
        destroyed += n;
    }
    if (create4) {
        CUctxCreateParams p = {0};
        for (long i = 0; i < n; i++) {
            CHECK(create4(&c, &p, 0, 0));
            CHECK(destroy(c));
        }
        count("cuCtxCreate_v4", n);
        destroyed += n;
    }
    count("cuCtxDestroy_v2", destroyed);
    if (uuid) {
        for (long i = 0; i < n; i++) CHECK(uuid(&u, 0));
        count("cuDeviceGetUuid", n);
    }
    if (uuid2) {
        for (long i = 0; i < n; i++) CHECK(uuid2(&u, 0));
        count("cuDeviceGetUuid_v2", n);
    }
    for (long i = 0; i < n; i++) CHECK(screate(&s, 0));
    count("cuStreamCreate", n + streams);
    if (sprio) {
        for (long i = 0; i < n; i++) CHECK(sprio(&s, 0, -1));
        count("cuStreamCreateWithPriority", n);
    }
}

/* ---- two-devices ------------------------------------------------------------------------------ */

struct second {
    CUcontext c1;
    CUfunction f1;
    CUdeviceptr buf;
    long launches, copies;
};

/* A worker that makes device 1 current and works on its default stream. */
static void *device1_thread(void *p) {
    struct second *s = p;
    CHECK(((PFN_cuCtxSetCurrent)sym("cuCtxSetCurrent", 1))(s->c1));
    PFN_cuLaunchKernel launch = (PFN_cuLaunchKernel)sym("cuLaunchKernel", 1);
    PFN_cuMemcpyHtoD htod = (PFN_cuMemcpyHtoD)sym("cuMemcpyHtoD_v2", 1);
    for (long i = 0; i < s->launches; i++)
        CHECK(launch(s->f1, 1, 1, 1, 32, 1, 1, 0, NULL, kernel_params, NULL));
    for (long i = 0; i < s->copies; i++) CHECK(htod(s->buf, host_buf, 2048));
    return NULL;
}

/* `two-devices L0 L1 COPIES HOLD_S`: from the main thread, with device 0's primary context
 * current, L0 launches on device 0 and L1 launches of device 1's function on device 1's stream,
 * COPIES copies of 4096 bytes on that stream and COPIES of 1024 on device 0's default stream;
 * then a thread with device 1 current launches L1 more and copies COPIES x 2048 bytes on its
 * default stream. Device 1's context, module, stream and 1 MiB buffer are made under a push, and
 * 2 MiB of VMM memory located on device 1 with device 0 current; setup() holds 2 MiB on device 0. */
static void run_two_devices(long l0, long l1, long copies, double hold_s) {
    setup(1 << 20);
    CUdevice d1;
    CUuuid u;
    struct second s = {.launches = l1, .copies = copies};
    CHECK(((PFN_cuDeviceGet)sym("cuDeviceGet", 1))(&d1, 1));
    CHECK(((PFN_cuDevicePrimaryCtxRetain)sym("cuDevicePrimaryCtxRetain", 1))(&s.c1, d1));
    PFN_cuDeviceGetUuid uuid = (PFN_cuDeviceGetUuid)sym("cuDeviceGetUuid_v2", 1);
    CHECK(uuid(&u, 0));
    CHECK(uuid(&u, d1));
    CHECK(((PFN_cuCtxPushCurrent)sym("cuCtxPushCurrent_v2", 1))(s.c1));
    CUmodule m1;
    CHECK(((PFN_cuModuleLoadData)sym("cuModuleLoadData", 1))(&m1, PTX));
    CHECK(((PFN_cuModuleGetFunction)sym("cuModuleGetFunction", 1))(&s.f1, m1, MANGLED));
    CUstream s1 = new_stream();
    CHECK(((PFN_cuMemAlloc)sym("cuMemAlloc_v2", 1))(&s.buf, 1 << 20));
    CUcontext popped;
    CHECK(((PFN_cuCtxPopCurrent)sym("cuCtxPopCurrent_v2", 1))(&popped));
    /* 2 MiB of VMM memory located on device 1, created while device 0 is current. */
    CUmemAllocationProp prop = {.type = 1, .location = {.type = 1, .id = d1}};
    CUmemGenericAllocationHandle h;
    CHECK(((PFN_cuMemCreate)sym("cuMemCreate", 1))(&h, (size_t)2 << 20, &prop, 0));

    PFN_cuLaunchKernel launch = (PFN_cuLaunchKernel)sym("cuLaunchKernel", 1);
    PFN_cuMemcpyHtoD htod = (PFN_cuMemcpyHtoD)sym("cuMemcpyHtoD_v2", 1);
    PFN_cuMemcpyHtoDAsync htod_async = (PFN_cuMemcpyHtoDAsync)sym("cuMemcpyHtoDAsync_v2", 1);
    for (long i = 0; i < l0; i++) CHECK(launch(function, 1, 1, 1, 32, 1, 1, 0, NULL, kernel_params, NULL));
    for (long i = 0; i < l1; i++) CHECK(launch(s.f1, 1, 1, 1, 32, 1, 1, 0, s1, kernel_params, NULL));
    for (long i = 0; i < copies; i++) CHECK(htod_async(s.buf, host_buf, 4096, s1));
    for (long i = 0; i < copies; i++) CHECK(htod(dev_a, host_buf, 1024));
    pthread_t t;
    pthread_create(&t, NULL, device1_thread, &s);
    pthread_join(t, NULL);
    printf("{\"pid\":%d,\"function\":%llu,\"function1\":%llu,\"stream1\":%llu,\"context1\":%llu}\n", getpid(),
           (unsigned long long)(uintptr_t)function, (unsigned long long)(uintptr_t)s.f1,
           (unsigned long long)(uintptr_t)s1, (unsigned long long)(uintptr_t)s.c1);
    fflush(stdout);
    struct timespec ts = {(time_t)hold_s, (long)((hold_s - (double)(time_t)hold_s) * 1e9)};
    nanosleep(&ts, NULL);
}

int run_devices(const char *scenario, int argc, char **argv) {
    if (!strcmp(scenario, "two-devices") && argc == 4)
        run_two_devices(atol(argv[0]), atol(argv[1]), atol(argv[2]), atof(argv[3]));
    else return 0;
    return 1;
}
