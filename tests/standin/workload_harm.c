/* The harm scenario (issue 44): is a traced process unharmed?
 *
 *     harm SECONDS      (at most; SIGUSR1 ends it sooner) --threads T workers call every probed family through harm_call (which
 *                       checks the callee-saved registers and the FP control register after each
 *                       call) and check each result; SIGPROF at 1 kHz of CPU time; a fork every
 *                       200 ms whose child makes 2,000 checked calls; every second the library is
 *                       closed (unmapped) and opened again; SIGUSR2 compares the library's code in
 *                       memory with its file (after a detach). Prints one JSON line of counts.
 *     fault-in-call     with CUDA_STANDIN_FAULT=1 in the environment, cuCtxSynchronize faults a
 *                       few instructions past its entry (SIGILL): a probe's harm, as seen.
 *     fault-own         a few probed calls, then a SIGSEGV in the workload's own code.
 *     fault-self-HOW    a probed call, then a fault the process makes itself where a probe's harm
 *                       would show: noexec (the entry's page made non-executable, then called),
 *                       raise (SIGILL sent to itself), null (a call below mmap_min_addr).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>

#include "workload.h"

uint64_t harm_call(void *fn, const uint64_t args[12], uint64_t seed, uint64_t *bad);
void harm_clobber(void);

/* Held for reading by a worker for each batch of calls; for writing around a fork and a remap,
 * so that no thread is inside the library then. */
static pthread_rwlock_t quiet;
static volatile int generation;
static volatile int stop;
static volatile long profs;

struct fns {
    void *launch, *launch_ex, *alloc, *free_, *htod_async, *record, *equery, *squery, *ssync, *csync, *getfn;
};

struct tstate {
    int gen;
    uint64_t seed;
    struct fns f;
    CUstream stream;
    CUevent event;
    long calls, mismatches, bad_results;
};

static void resolve(struct tstate *t) {
    t->f.launch = sym("cuLaunchKernel", 1);
    t->f.launch_ex = sym("cuLaunchKernelEx", 1);
    t->f.alloc = sym("cuMemAlloc_v2", 1);
    t->f.free_ = sym("cuMemFree_v2", 1);
    t->f.htod_async = sym("cuMemcpyHtoDAsync_v2", 1);
    t->f.record = sym("cuEventRecord", 1);
    t->f.equery = sym("cuEventQuery", 1);
    t->f.squery = sym("cuStreamQuery", 1);
    t->f.ssync = sym("cuStreamSynchronize", 1);
    t->f.csync = sym("cuCtxSynchronize", 1);
    t->f.getfn = sym("cuModuleGetFunction", 1);
    t->stream = new_stream();
    CHECK(((PFN_cuEventCreate)sym("cuEventCreate", 1))(&t->event, 0));
    t->gen = generation;
}

/* One checked call: `want` is the result expected (`alt` also accepted). */
static uint64_t call(struct tstate *t, void *fn, const uint64_t args[12], CUresult want, CUresult alt) {
    uint64_t bad = 0;
    t->seed = t->seed * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t r = harm_call(fn, args, t->seed, &bad);
    t->calls++;
    if (bad) {
        t->mismatches++;
        fprintf(stderr, "cuda-workload: harm: registers changed across a call (mask %#llx)\n", (unsigned long long)bad);
    }
    if ((CUresult)r != want && (CUresult)r != alt) {
        t->bad_results++;
        fprintf(stderr, "cuda-workload: harm: result %llu, expected %d\n", (unsigned long long)r, want);
    }
    return r;
}

/* One round of every family, each call checked. */
static void round_of_calls(struct tstate *t, long i) {
    uint64_t a[12] = {0};
    CUdeviceptr p = 0;
    CUfunction f = 0;
    CUlaunchConfig cfg = {1, 1, 1, 32, 1, 1, 0, t->stream, NULL, 0};
    a[0] = (uint64_t)(uintptr_t)function;
    a[1] = 1; a[2] = 1; a[3] = 1; a[4] = 32; a[5] = 1; a[6] = 1; a[7] = (uint64_t)(i & 255);
    a[8] = (uint64_t)(uintptr_t)t->stream; a[9] = (uint64_t)(uintptr_t)kernel_params; a[10] = 0;
    call(t, t->f.launch, a, CUDA_SUCCESS, CUDA_SUCCESS);
    memset(a, 0, sizeof a);
    a[0] = (uint64_t)(uintptr_t)&cfg; a[1] = (uint64_t)(uintptr_t)function; a[2] = (uint64_t)(uintptr_t)kernel_params;
    call(t, t->f.launch_ex, a, CUDA_SUCCESS, CUDA_SUCCESS);
    memset(a, 0, sizeof a);
    a[0] = (uint64_t)(uintptr_t)&p; a[1] = 256;
    if (call(t, t->f.alloc, a, CUDA_SUCCESS, CUDA_SUCCESS) == CUDA_SUCCESS && p == 0) t->bad_results++;
    a[0] = p; a[1] = 0;
    call(t, t->f.free_, a, CUDA_SUCCESS, CUDA_SUCCESS);
    a[0] = dev_a; a[1] = (uint64_t)(uintptr_t)host_buf; a[2] = 64; a[3] = (uint64_t)(uintptr_t)t->stream;
    call(t, t->f.htod_async, a, CUDA_SUCCESS, CUDA_SUCCESS);
    memset(a, 0, sizeof a);
    a[0] = (uint64_t)(uintptr_t)t->event; a[1] = (uint64_t)(uintptr_t)t->stream;
    call(t, t->f.record, a, CUDA_SUCCESS, CUDA_SUCCESS);
    a[1] = 0;
    call(t, t->f.equery, a, CUDA_SUCCESS, CUDA_ERROR_NOT_READY);
    a[0] = (uint64_t)(uintptr_t)t->stream;
    call(t, t->f.squery, a, CUDA_SUCCESS, CUDA_ERROR_NOT_READY);
    call(t, t->f.ssync, a, CUDA_SUCCESS, CUDA_SUCCESS);
    a[0] = 0;
    call(t, t->f.csync, a, CUDA_SUCCESS, CUDA_SUCCESS);
    a[0] = (uint64_t)(uintptr_t)&f; a[1] = (uint64_t)(uintptr_t)module; a[2] = (uint64_t)(uintptr_t)MANGLED;
    if (call(t, t->f.getfn, a, CUDA_SUCCESS, CUDA_SUCCESS) == CUDA_SUCCESS && f != function) t->bad_results++;
}

struct worker {
    pthread_t th;
    struct tstate t;
};

static void *worker_main(void *p) {
    struct tstate *t = &((struct worker *)p)->t;
    thread_ctx();
    long i = 0;
    while (!stop) {
        pthread_rwlock_rdlock(&quiet);
        if (t->gen != generation) resolve(t);
        for (int k = 0; k < 64 && !stop; k++) round_of_calls(t, i++);
        pthread_rwlock_unlock(&quiet);
    }
    return NULL;
}

static void on_prof(int sig) {
    (void)sig;
    /* Some floating point and a counter: the signal frame must give both back intact. */
    volatile double x = 1.5;
    x = x * 3.25 + (double)profs;
    profs = profs + 1 + (long)(x < 0);
}

/* 1: SIGUSR2 (after a detach: nothing may differ); 2: SIGWINCH (while attached: the control,
 * where the breakpoints must show). */
static volatile int check_asked;

static void on_usr2(int sig) {
    check_asked = sig == SIGWINCH ? 2 : 1;
}

struct code_check {
    const char *base;
    long differ, compared;
};

/* The library's executable segments in memory against its file: bytes that differ (a
 * breakpoint left behind by a detached probe). */
static int check_segments(struct dl_phdr_info *info, size_t size, void *p) {
    (void)size;
    struct code_check *c = p;
    if (!info->dlpi_name || !strstr(info->dlpi_name, c->base)) return 0;
    int fd = open(info->dlpi_name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        char *file = malloc(ph->p_filesz);
        if (file && pread(fd, file, ph->p_filesz, (off_t)ph->p_offset) == (ssize_t)ph->p_filesz) {
            const char *mem = (const char *)(info->dlpi_addr + ph->p_vaddr);
            for (size_t k = 0; k < ph->p_filesz; k++) c->differ += mem[k] != file[k];
            c->compared += (long)ph->p_filesz;
        }
        free(file);
    }
    close(fd);
    return 1;
}

static void on_usr1(int sig) {
    (void)sig;
    stop = 1;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

/* Whether a mapping of the library's file is in this process now. */
static int library_mapped(void) {
    FILE *m = fopen("/proc/self/maps", "r");
    char line[4096];
    int found = 0;
    const char *base = strrchr(lib_path, '/');
    base = base ? base + 1 : lib_path;
    while (m && fgets(line, sizeof line, m))
        if (strstr(line, base)) found = 1;
    if (m) fclose(m);
    return found;
}

static void run_harm(int threads, double seconds) {
    /* Writer first: workers take the lock again at once, and must not starve the forks. */
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&quiet, &attr);
    setup(4096);
    struct tstate main_t = {.seed = 0x5eed};
    resolve(&main_t);
    /* The thunk must see a clobber, or it proves nothing. */
    uint64_t none[12] = {0}, bad = 0;
    harm_call((void *)harm_clobber, none, 42, &bad);
    if (!(bad & 1)) {
        fprintf(stderr, "cuda-workload: harm: the thunk did not see harm_clobber change a register\n");
        exit(4);
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_prof;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGPROF, &sa, NULL);
    /* 2 kHz by the monotonic clock (an hrtimer: ITIMER_PROF follows the scheduler tick),
     * delivered to whichever thread runs. */
    timer_t timer;
    struct sigevent sev = {0};
    sev.sigev_notify = SIGEV_SIGNAL;
    sev.sigev_signo = SIGPROF;
    struct itimerspec its = {{0, 500000}, {0, 500000}};
    if (timer_create(CLOCK_MONOTONIC, &sev, &timer) != 0 || timer_settime(timer, 0, &its, NULL) != 0) {
        perror("cuda-workload: harm: timer");
        exit(2);
    }
    struct worker *w = calloc((size_t)threads, sizeof *w);
    for (int i = 0; i < threads; i++) {
        w[i].t.seed = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
        w[i].t.gen = -1;
        pthread_create(&w[i].th, NULL, worker_main, &w[i]);
    }
    uint64_t start = now_ns(), deadline = start + (uint64_t)(seconds * 1e9);
    uint64_t next_remap = start + 1000000000ull;
    long children = 0, abnormal = 0, remaps = 0, unmapped = 0, child_calls = 0;
    signal(SIGUSR1, on_usr1); /* stop early: the test is done attaching */
    signal(SIGUSR2, on_usr2); /* compare the library's code with its file (after a detach) */
    signal(SIGWINCH, on_usr2);  /* the same while attached: the check's control */
    long code_checks = 0, code_differ = 0, control_differ = -1;
    while (now_ns() < deadline && !stop) {
        sleep_ms(200);
        pthread_rwlock_wrlock(&quiet);
        if (check_asked) {
            int control = check_asked == 2;
            check_asked = 0;
            const char *b = strrchr(lib_path, '/');
            struct code_check c = {b ? b + 1 : lib_path, 0, 0};
            dl_iterate_phdr(check_segments, &c);
            if (control) {
                control_differ = c.differ;
            } else {
                code_checks++;
                code_differ += c.differ;
            }
            fprintf(stderr, "cuda-workload: harm: code check %ld: %ld of %ld bytes differ from the file\n", code_checks,
                    c.differ, c.compared);
        }
        pid_t c = fork();
        if (c == 0) {
            struct tstate ct = main_t;
            ct.seed ^= (uint64_t)getpid();
            ct.calls = ct.mismatches = ct.bad_results = 0;
            for (long i = 0; ct.calls < 2000; i++) round_of_calls(&ct, i);
            _exit(ct.mismatches || ct.bad_results ? 3 : 0);
        }
        if (now_ns() >= next_remap) {
            next_remap += 1000000000ull;
            dlclose(lib);
            unmapped += !library_mapped();
            lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
            if (!lib) {
                fprintf(stderr, "cuda-workload: harm: cannot load %s again: %s\n", lib_path, dlerror());
                exit(2);
            }
            setup(4096);
            generation++;
            resolve(&main_t);
            remaps++;
        }
        pthread_rwlock_unlock(&quiet);
        if (c > 0) {
            int status = 0;
            while (waitpid(c, &status, 0) == -1 && errno == EINTR) {}
            children++;
            child_calls += 2000;
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                abnormal++;
                fprintf(stderr, "cuda-workload: harm: child %d ended with status %#x\n", c, status);
            }
        }
    }
    stop = 1;
    long calls = 0, mismatches = 0, bad_results = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(w[i].th, NULL);
        calls += w[i].t.calls;
        mismatches += w[i].t.mismatches;
        bad_results += w[i].t.bad_results;
    }
    timer_delete(timer);
    double secs = (double)(now_ns() - start) / 1e9;
    printf("{\"pid\":%d,\"threads\":%d,\"calls\":%ld,\"child_calls\":%ld,\"mismatches\":%ld,\"bad_results\":%ld,"
           "\"children\":%ld,\"abnormal\":%ld,\"remaps\":%ld,\"unmapped\":%ld,\"signals\":%ld,\"code_checks\":%ld,"
           "\"code_differ\":%ld,\"control_differ\":%ld,\"seconds\":%.3f}\n",
           getpid(), threads, calls, child_calls, mismatches, bad_results, children, abnormal, remaps, unmapped, profs,
           code_checks, code_differ, control_differ, secs);
    fflush(stdout);
    free(w);
}

int run_harm_scenarios(const char *scenario, int threads, int argc, char **argv) {
    if (!strcmp(scenario, "harm") && argc == 1) {
        run_harm(threads, atof(argv[0]));
        return 1;
    }
    if (!strcmp(scenario, "fault-in-call") && argc == 0) {
        setup(4096);
        printf("{\"pid\":%d}\n", getpid());
        fflush(stdout);
        sleep_ms(1500); /* a tracer that discovers the process has attached by now */
        ((PFN_cuCtxSynchronize)sym("cuCtxSynchronize", 1))();
        return 1;
    }
    if (!strncmp(scenario, "fault-self-", 11) && argc == 0) {
        const char *how = scenario + 11;
        /* A fault the process makes itself right after a probed call, where a probe's harm
         * would show: `noexec` makes the library's page of cuCtxSynchronize non-executable and
         * calls it (SEGV_ACCERR at the probed entry); `raise` sends itself SIGILL; `null` calls
         * a function pointer below mmap_min_addr. */
        setup(4096);
        printf("{\"pid\":%d}\n", getpid());
        fflush(stdout);
        sleep_ms(1500);
        PFN_cuCtxSynchronize sync = (PFN_cuCtxSynchronize)sym("cuCtxSynchronize", 1);
        CHECK(sync());
        if (!strcmp(how, "noexec")) {
            long page = sysconf(_SC_PAGESIZE);
            void *at = (void *)((uintptr_t)sync & ~(uintptr_t)(page - 1));
            if (mprotect(at, (size_t)page, PROT_READ) != 0) {
                perror("cuda-workload: mprotect");
                return 1;
            }
            sync();
        } else if (!strcmp(how, "raise")) {
            raise(SIGILL);
        } else if (!strcmp(how, "null")) {
            const char *at = getenv("WORKLOAD_FAULT_ADDRESS");
            void (*tiny)(void) = (void (*)(void))(uintptr_t)strtoull(at ? at : "16", NULL, 0);
            tiny();
        }
        exit(2);
    }
    if (!strcmp(scenario, "fault-own") && argc == 0) {
        setup(4096);
        printf("{\"pid\":%d}\n", getpid());
        fflush(stdout);
        sleep_ms(1500);
        for (int i = 0; i < 3; i++) CHECK(((PFN_cuCtxSynchronize)sym("cuCtxSynchronize", 1))());
        /* An address from the environment, so that the compiler cannot see it is bad. */
        const char *at = getenv("WORKLOAD_FAULT_ADDRESS");
        volatile int *nowhere = (volatile int *)(uintptr_t)strtoull(at ? at : "8", NULL, 0);
        *nowhere = 1;
        return 1;
    }
    return 0;
}
