/* cuda-workload's odd scenarios: a process dying inside a call, a headless process, refused
 * copies, tenant-chosen names, a rename, short processes by the thousand, and launch
 * configurations not yet paged in (see
 * workload.c for what each does). */
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "workload.h"

/* ---- die-in-call ------------------------------------------------------------------------------ */

static CUstream die_stream;
static void *die_waiter(void *p) {
    (void)p;
    thread_ctx();
    ((PFN_cuStreamSynchronize)sym("cuStreamSynchronize", 1))(die_stream); /* never returns: exit comes first */
    return NULL;
}

/* Queues a long kernel, blocks a second thread in cuStreamSynchronize, and exits the process while
 * that thread is inside the call: its entry state must not outlive it. */
static void run_die_in_call(void) {
    setup(4096);
    die_stream = new_stream();
    CHECK(((PFN_cuLaunchKernel)sym("cuLaunchKernel", 1))(function, 1, 1, 1, 1, 1, 1, 0, die_stream, kernel_params, NULL));
    pthread_t t;
    pthread_create(&t, NULL, die_waiter, NULL);
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    printf("{\"pid\":%d}\n", getpid());
    fflush(stdout);
    _exit(0);
}

/* ---- park ------------------------------------------------------------------------------------- */

static void *parked(void *p) {
    (void)p;
    thread_ctx();
    CHECK(((PFN_cuCtxSynchronize)sym("cuCtxSynchronize", 1))());
    return NULL;
}

static void *parked_launcher(void *p) {
    long n = *(long *)p;
    thread_ctx();
    CUstream s = new_stream();
    PFN_cuLaunchKernel launch = (PFN_cuLaunchKernel)sym("cuLaunchKernel", 1);
    for (long i = 0; i < n; i++) CHECK(launch(function, 1, 1, 1, 1, 1, 1, 0, s, kernel_params, NULL));
    return NULL;
}

/* One kernel of GRID blocks, then THREADS threads (64 KiB stacks) each parked in cuCtxSynchronize
 * until it is done: a tenant holding thousands of threads inside a probed call at once. */
static void run_park(long threads, unsigned grid) {
    setup(4096);
    CUstream s = new_stream();
    CHECK(((PFN_cuLaunchKernel)sym("cuLaunchKernel", 1))(function, grid, 1, 1, 1, 1, 1, 0, s, kernel_params, NULL));
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    pthread_t *t = calloc((size_t)threads, sizeof(pthread_t));
    long made = 0;
    for (long i = 0; i < threads; i++)
        if (pthread_create(&t[made], &attr, parked, NULL) == 0) made++;
    /* WORKLOAD_PARKED_LAUNCHES=N: once they are parked, a new thread (past the process's share
     * of slots) makes N launches: a process hiding its work behind the threads it parks. */
    const char *n = getenv("WORKLOAD_PARKED_LAUNCHES");
    long launches = n ? atol(n) : 0;
    if (launches > 0) {
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
        pthread_t l;
        pthread_create(&l, NULL, parked_launcher, &launches);
        pthread_join(l, NULL);
    }
    for (long i = 0; i < made; i++) pthread_join(t[i], NULL);
    printf("{\"pid\":%d,\"threads\":%ld,\"parked_launches\":%ld}\n", getpid(), made, launches);
    free(t);
}

static double headless_seconds;

static void *headless_worker(void *unused) {
    (void)unused;
    run_loop(headless_seconds, 1, 1, 0);
    fflush(stdout);
    exit(0);
}

/* The main thread leaves (the process's leader becomes a zombie) while a second thread goes on
 * calling the driver: the process still runs and must still be traced. */
static void run_headless(double seconds) {
    headless_seconds = seconds;
    pthread_t t;
    if (pthread_create(&t, NULL, headless_worker, NULL) != 0) exit(2);
    pthread_exit(NULL);
}

static void run_huge_copies(long n) {
    setup(4096);
    PFN_cuMemcpyHtoD htod = (PFN_cuMemcpyHtoD)sym("cuMemcpyHtoD_v2", 1);
    static char host[16];
    long failed = 0;
    for (long i = 0; i < n; i++) failed += htod(dev_a, host, (size_t)1 << 63) != CUDA_SUCCESS;
    printf("{\"pid\":%d,\"copies\":%ld,\"failed\":%ld}\n", getpid(), n, failed);
}

/* cuModuleGetFunction of each name, then WORKLOAD_LAUNCHES launches of each (1 by default), after
 * WORKLOAD_LAUNCH_AFTER_MS (0 by default: a tracer started meanwhile sees launches, no lookup). */
static void run_lookup(int n, char **names) {
    setup(4096);
    PFN_cuModuleGetFunction getfn = (PFN_cuModuleGetFunction)sym("cuModuleGetFunction", 1);
    PFN_cuLaunchKernel launch = (PFN_cuLaunchKernel)sym("cuLaunchKernel", 1);
    const char *l = getenv("WORKLOAD_LAUNCHES"), *after = getenv("WORKLOAD_LAUNCH_AFTER_MS");
    long launches = l ? atol(l) : 1;
    CUfunction f[16];
    if (n > 16) n = 16;
    for (int i = 0; i < n; i++) CHECK(getfn(&f[i], module, names[i]));
    if (after) usleep((useconds_t)(atol(after) * 1000));
    for (int i = 0; i < n; i++)
        for (long k = 0; k < launches; k++) CHECK(launch(f[i], 1, 1, 1, 32, 1, 1, 0, NULL, kernel_params, NULL));
    printf("{\"pid\":%d,\"function\":%lu,\"functions\":[", getpid(), (unsigned long)(uintptr_t)f[0]);
    for (int i = 0; i < n; i++) printf("%s%lu", i ? "," : "", (unsigned long)(uintptr_t)f[i]);
    printf("],\"launches\":%ld}\n", launches * n);
}

static void run_rename(const char *name, long n) {
    setup(4096);
    PFN_cuLaunchKernel launch = (PFN_cuLaunchKernel)sym("cuLaunchKernel", 1);
    for (long i = 0; i < 2 * n; i++) {
        if (i == n && prctl(PR_SET_NAME, name, 0, 0, 0) != 0) { perror("prctl"); exit(2); }
        CHECK(launch(function, 1, 1, 1, 32, 1, 1, 0, NULL, kernel_params, NULL));
    }
    printf("{\"pid\":%d,\"launches\":%ld}\n", getpid(), 2 * n);
}

static void run_unpaged_config(long n) {
    setup(4096);
    PFN_cuLaunchKernelEx launch_ex = (PFN_cuLaunchKernelEx)sym("cuLaunchKernelEx", 1);
    char path[] = "/tmp/cuda-workload-config-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { perror("mkstemp"); exit(2); }
    unlink(path);
    CUlaunchConfig c = {(unsigned)(n + 1), 2, 3, 32, 1, 1, 0, NULL, NULL, 0};
    if (write(fd, &c, sizeof c) != (ssize_t)sizeof c) { perror("write"); exit(2); }
    for (long i = 0; i < n; i++) {
        /* A fresh private mapping each time: its page is in the page cache but not in this
         * process's page table until something touches it. */
        void *m = mmap(NULL, sizeof c, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) { perror("mmap"); exit(2); }
        CHECK(launch_ex((const CUlaunchConfig *)m, function, kernel_params, NULL));
        munmap(m, sizeof c);
    }
    close(fd);
    printf("{\"pid\":%d,\"launches\":%ld}\n", getpid(), n);
}

/* One allocation of BYTES through the entry point WORKLOAD_ALLOC names: `mem` (cuMemAlloc_v2, the
 * default), `vmm` (cuMemCreate of pinned device memory), `pool` (cuMemAllocFromPoolAsync from the
 * device's default pool), `managed` (cuMemAllocManaged), `pitch` (cuMemAllocPitch_v2, rows of
 * 256 bytes). */
CUresult alloc_by_kind(size_t bytes) {
    const char *kind = getenv("WORKLOAD_ALLOC");
    CUdeviceptr p;
    if (!kind || !strcmp(kind, "mem")) return ((PFN_cuMemAlloc)sym("cuMemAlloc_v2", 1))(&p, bytes);
    if (!strcmp(kind, "vmm")) {
        CUmemAllocationProp prop = {.type = 1, .location = {.type = 1, .id = 0}};
        CUmemGenericAllocationHandle h;
        return ((PFN_cuMemCreate)sym("cuMemCreate", 1))(&h, bytes, &prop, 0);
    }
    if (!strcmp(kind, "pool")) {
        CUmemoryPool pool;
        CHECK(((PFN_cuDeviceGetDefaultMemPool)sym("cuDeviceGetDefaultMemPool", 1))(&pool, 0));
        return ((PFN_cuMemAllocFromPoolAsync)sym("cuMemAllocFromPoolAsync", 1))(&p, bytes, pool, NULL);
    }
    if (!strcmp(kind, "managed")) return ((PFN_cuMemAllocManaged)sym("cuMemAllocManaged", 1))(&p, bytes, 1);
    if (!strcmp(kind, "pitch")) {
        size_t pitch;
        return ((PFN_cuMemAllocPitch)sym("cuMemAllocPitch_v2", 1))(&p, &pitch, 256, bytes / 256, 4);
    }
    fprintf(stderr, "WORKLOAD_ALLOC=%s: expected mem, vmm, pool, managed or pitch\n", kind);
    exit(2);
}

/* Runs one of these scenarios; 0 when `scenario` is none of them. */
/* ---- churn ------------------------------------------------------------------------------------ */

static void *churn_thread(void *p) {
    (void)p;
    thread_ctx();
    CHECK(((PFN_cuCtxSynchronize)sym("cuCtxSynchronize", 1))());
    return NULL;
}

/* N short processes, one after another, each making one probed call and exiting: `cgroups`,
 * each in a cgroup of its own made under $WORKLOAD_CGROUP_BASE (removed after); `migrate`, the
 * same, each moving itself to a second cgroup of its own after its call; `leader-first`,
 * whose leader leaves (pthread_exit) before its one other thread makes the call. Weeks of
 * ordinary uptime for the entry slots' share counters, in seconds. Prints how many ran. */
static void run_churn(long n, const char *mode) {
    setup(4096);
    const char *base = getenv("WORKLOAD_CGROUP_BASE");
    int migrate = !strcmp(mode, "migrate");
    int cgroups = migrate || !strcmp(mode, "cgroups");
    if (cgroups && !base) {
        fprintf(stderr, "cuda-workload: churn cgroups needs WORKLOAD_CGROUP_BASE\n");
        exit(2);
    }
    long ok = 0;
    char dir[4096], procs[4200], moved[4096], moved_procs[4200];
    for (long i = 0; i < n; i++) {
        if (cgroups) {
            snprintf(dir, sizeof dir, "%s/c%ld", base, i);
            snprintf(procs, sizeof procs, "%s/cgroup.procs", dir);
            snprintf(moved, sizeof moved, "%s/m%ld", base, i);
            snprintf(moved_procs, sizeof moved_procs, "%s/cgroup.procs", moved);
            if (mkdir(dir, 0755) != 0 || (migrate && mkdir(moved, 0755) != 0)) {
                perror("cuda-workload: churn: mkdir");
                exit(2);
            }
        }
        pid_t c = fork();
        if (c == 0) {
            if (cgroups) {
                int fd = open(procs, O_WRONLY);
                if (fd < 0 || write(fd, "0", 1) != 1) _exit(3);
                close(fd);
                CHECK(((PFN_cuCtxSynchronize)sym("cuCtxSynchronize", 1))());
                /* `migrate`: its slot taken in one cgroup, it exits in another. */
                if (migrate) {
                    fd = open(moved_procs, O_WRONLY);
                    if (fd < 0 || write(fd, "0", 1) != 1) _exit(3);
                    close(fd);
                }
                _exit(0);
            }
            pthread_t t;
            pthread_create(&t, NULL, churn_thread, NULL);
            pthread_exit(NULL);
        }
        int status = 0;
        if (c > 0 && waitpid(c, &status, 0) == c && WIFEXITED(status) && WEXITSTATUS(status) == 0) ok++;
        if (cgroups) rmdir(dir);
        if (migrate) rmdir(moved);
    }
    printf("{\"pid\":%d,\"processes\":%ld,\"ok\":%ld}\n", getpid(), n, ok);
}

int run_misc(const char *scenario, int argc, char **argv) {
    if (!strncmp(scenario, "churn-", 6) && argc == 1) {
        run_churn(atol(argv[0]), scenario + 6);
        return 1;
    }
    if (!strcmp(scenario, "die-in-call") && argc == 0) run_die_in_call();
    else if (!strcmp(scenario, "unpaged-config") && argc == 1) run_unpaged_config(atol(argv[0]));
    else if (!strcmp(scenario, "huge-copies") && argc == 1) run_huge_copies(atol(argv[0]));
    else if (!strcmp(scenario, "headless") && argc == 1) run_headless(atof(argv[0]));
    else if (!strcmp(scenario, "lookup") && argc >= 1) run_lookup(argc, argv);
    else if (!strcmp(scenario, "rename") && argc == 2) run_rename(argv[0], atol(argv[1]));
    else if (!strcmp(scenario, "park") && argc == 2) run_park(atol(argv[0]), (unsigned)atol(argv[1]));
    else return 0;
    return 1;
}
