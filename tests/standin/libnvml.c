/* Stand-in libnvidia-ml.so.1: the NVML functions cudatrace samples, with the real prototypes
 * (nvml.h), replaying a scenario file named by NVML_STANDIN_SCENARIO. Lines:
 *
 *   gpu INDEX [from=SECONDS] uuid=GPU-... sm=PCT mem=PCT total=BYTES used=BYTES temp=C
 *             power_mw=MW sm_clock=MHZ reasons=HEX pcie_tx_kbs=KBS pcie_rx_kbs=KBS [pci=BUSID]
 *   proc INDEX pid=PID used=BYTES sm=PCT memutil=PCT [mps=1] [gi=N]
 *   mig INDEX uuid=MIG-... gi=N
 *
 * A mig line puts GPU INDEX in MIG mode with one more MIG device: its UUID (nvmlDeviceGetUUID of
 * its handle) and GPU instance (nvmlDeviceGetGpuInstanceId).
 * gi=N puts the process on MIG GPU instance N of the GPU (its process info's gpuInstanceId).
 * A proc line with mps=1 is a client of the GPU's MPS server: listed by
 * nvmlDeviceGetMPSComputeRunningProcesses_v3 only, not by the compute-process list (which lists
 * the server, a proc line of its own).
 * A gpu line applies from `from` seconds after nvmlInit (default 0); the latest that applies
 * wins, so a scenario can change utilization over time. The file is read again whenever it
 * changes (a test lists processes once it knows their pids). Without the variable, or when the
 * file cannot be read, nvmlInit_v2 fails with NVML_ERROR_DRIVER_NOT_LOADED, as on a host without
 * a driver. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned int pid; unsigned long long timeStamp; unsigned int smUtil, memUtil, encUtil, decUtil; } nvmlProcessUtilizationSample_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9

#define MAX_LINES 64
struct gpu_line {
    int index;
    double from;
    char uuid[96], pci[32];
    unsigned sm, mem, temp, power_mw, sm_clock, pcie_tx, pcie_rx;
    unsigned long long total, used, reasons;
};
struct proc_line { int index, mps; unsigned pid, sm, memutil, gi; unsigned long long used; };
struct mig_line { int index; unsigned gi; char uuid[96]; };
/* A GPU's handle (mig -1), or a MIG device's (mig: its line). */
struct nvmlDevice_st { int index, mig; };

static struct gpu_line gpus[MAX_LINES];
static struct proc_line procs[MAX_LINES];
static struct mig_line migs[MAX_LINES];
static struct nvmlDevice_st devices[8], mig_handles[MAX_LINES];
static int ngpus, nprocs, nmigs, ndevices, initialized;
static struct timespec started;

static double elapsed(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - started.tv_sec) + (double)(now.tv_nsec - started.tv_nsec) / 1e9;
}

static unsigned long long field(const char *line, const char *key, unsigned long long dflt) {
    char pat[32];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *p = strstr(line, pat);
    return p ? strtoull(p + strlen(pat), NULL, 0) : dflt;
}

static const struct gpu_line *current(int index) {
    const struct gpu_line *best = NULL;
    double t = elapsed();
    for (int i = 0; i < ngpus; i++)
        if (gpus[i].index == index && gpus[i].from <= t && (!best || gpus[i].from >= best->from)) best = &gpus[i];
    return best;
}

/* Reads the scenario file; 0 when it cannot be read. */
static struct timespec loaded_mtime;
static int load(const char *path) {
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return 0;
    struct stat st;
    if (fstat(fileno(f), &st) == 0) loaded_mtime = st.st_mtim;
    char line[512];
    ngpus = nprocs = nmigs = ndevices = 0;
    while (fgets(line, sizeof line, f)) {
        int index;
        if (sscanf(line, "gpu %d", &index) == 1 && ngpus < MAX_LINES) {
            struct gpu_line *g = &gpus[ngpus++];
            memset(g, 0, sizeof *g);
            g->index = index;
            const char *from = strstr(line, " from=");
            g->from = from ? atof(from + 6) : 0;
            const char *u = strstr(line, " uuid=");
            if (u) sscanf(u + 6, "%95s", g->uuid);
            const char *pci = strstr(line, " pci=");
            if (pci) sscanf(pci + 5, "%31s", g->pci);
            g->sm = field(line, "sm", 0);
            g->mem = field(line, "mem", 0);
            g->total = field(line, "total", 0);
            g->used = field(line, "used", 0);
            g->temp = field(line, "temp", 0);
            g->power_mw = field(line, "power_mw", 0);
            g->sm_clock = field(line, "sm_clock", 0);
            g->reasons = field(line, "reasons", 0);
            g->pcie_tx = field(line, "pcie_tx_kbs", 0);
            g->pcie_rx = field(line, "pcie_rx_kbs", 0);
            if (index + 1 > ndevices) ndevices = index + 1;
        } else if (sscanf(line, "proc %d", &index) == 1 && nprocs < MAX_LINES) {
            struct proc_line *p = &procs[nprocs++];
            p->index = index;
            p->pid = field(line, "pid", 0);
            p->used = field(line, "used", 0);
            p->sm = field(line, "sm", 0);
            p->memutil = field(line, "memutil", 0);
            p->mps = (int)field(line, "mps", 0);
            p->gi = (unsigned)field(line, "gi", 0xFFFFFFFF);
        } else if (sscanf(line, "mig %d", &index) == 1 && nmigs < MAX_LINES) {
            struct mig_line *m = &migs[nmigs];
            m->index = index;
            m->gi = (unsigned)field(line, "gi", 0);
            m->uuid[0] = 0;
            const char *u = strstr(line, " uuid=");
            if (u) sscanf(u + 6, "%95s", m->uuid);
            mig_handles[nmigs] = (struct nvmlDevice_st){index, nmigs};
            nmigs++;
        }
    }
    fclose(f);
    if (ndevices > 8) ndevices = 8;
    for (int i = 0; i < ndevices; i++) devices[i] = (struct nvmlDevice_st){i, -1};
    return 1;
}

/* Reads the file again when it changed since it was read. */
static void reload(void) {
    const char *path = getenv("NVML_STANDIN_SCENARIO");
    struct stat st;
    if (!path || stat(path, &st) != 0) return;
    if (st.st_mtim.tv_sec != loaded_mtime.tv_sec || st.st_mtim.tv_nsec != loaded_mtime.tv_nsec) load(path);
}

EXPORT nvmlReturn_t nvmlInit_v2(void) {
    if (!load(getenv("NVML_STANDIN_SCENARIO"))) return NVML_ERROR_DRIVER_NOT_LOADED;
    clock_gettime(CLOCK_MONOTONIC, &started);
    initialized = 1;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlShutdown(void) { initialized = 0; return NVML_SUCCESS; }

EXPORT const char *nvmlErrorString(nvmlReturn_t r) { return r == NVML_SUCCESS ? "Success" : "stand-in error"; }

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    reload();
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)ndevices;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned)ndevices) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

#define GPU_OR_FAIL(dev)                                         \
    if (!initialized) return NVML_ERROR_UNINITIALIZED;           \
    const struct gpu_line *g = dev ? current(dev->index) : NULL; \
    if (!g) return NVML_ERROR_NOT_FOUND;

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    GPU_OR_FAIL(dev);
    const char *own = dev->mig >= 0 ? migs[dev->mig].uuid : g->uuid;
    if (!uuid || length < strlen(own) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(uuid, own);
    return NVML_SUCCESS;
}

#define NVML_ERROR_NOT_SUPPORTED 3

/* The bus id of a gpu line's pci=, as given (NVML writes 00000000:3B:00.0). */
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    GPU_OR_FAIL(dev);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->pci[0]) return NVML_ERROR_NOT_SUPPORTED;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%.15s", g->pci);
    unsigned fn = 0;
    sscanf(g->pci, "%x:%x:%x.%x", &pci->domain, &pci->bus, &pci->device, &fn);
    return NVML_SUCCESS;
}

/* The k-th MIG device of GPU `index`, or -1. */
static int mig_of(int index, unsigned k) {
    for (int i = 0; i < nmigs; i++)
        if (migs[i].index == index && k-- == 0) return i;
    return -1;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int *mode, unsigned int *pending) {
    GPU_OR_FAIL(dev);
    (void)g;
    if (!mode || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    *mode = *pending = mig_of(dev->index, 0) >= 0;
    return NVML_SUCCESS;
}

/* As on an A100 or H100 in MIG mode: room for 7, whether or not each exists. */
EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned int *count) {
    GPU_OR_FAIL(dev);
    (void)g;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = mig_of(dev->index, 0) >= 0 ? 7 : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned int index, nvmlDevice_t *mig) {
    GPU_OR_FAIL(dev);
    (void)g;
    if (!mig) return NVML_ERROR_INVALID_ARGUMENT;
    int i = mig_of(dev->index, index);
    if (i < 0) return NVML_ERROR_NOT_FOUND;
    *mig = &mig_handles[i];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned int *id) {
    GPU_OR_FAIL(dev);
    (void)g;
    if (!id || dev->mig < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *id = migs[dev->mig].gi;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *u) {
    GPU_OR_FAIL(dev);
    if (!u) return NVML_ERROR_INVALID_ARGUMENT;
    u->gpu = g->sm;
    u->memory = g->mem;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m) {
    GPU_OR_FAIL(dev);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = g->total;
    m->used = g->used;
    m->reserved = 0;
    m->free = g->total - g->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned int *temp) {
    GPU_OR_FAIL(dev);
    if (!temp || sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = g->temp;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *mw) {
    GPU_OR_FAIL(dev);
    if (!mw) return NVML_ERROR_INVALID_ARGUMENT;
    *mw = g->power_mw;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t dev, int type, unsigned int *mhz) {
    GPU_OR_FAIL(dev);
    if (!mhz || type != 1 /* NVML_CLOCK_SM */) return NVML_ERROR_INVALID_ARGUMENT;
    *mhz = g->sm_clock;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t dev, unsigned long long *reasons) {
    GPU_OR_FAIL(dev);
    if (!reasons) return NVML_ERROR_INVALID_ARGUMENT;
    *reasons = g->reasons;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t dev, int counter, unsigned int *kbs) {
    GPU_OR_FAIL(dev);
    if (!kbs) return NVML_ERROR_INVALID_ARGUMENT;
    *kbs = counter == 0 ? g->pcie_tx : g->pcie_rx; /* NVML_PCIE_UTIL_TX_BYTES = 0 */
    return NVML_SUCCESS;
}

/* The processes of `dev` whose mps flag is `mps`, as NVML's two process queries answer. */
static nvmlReturn_t processes(nvmlDevice_t dev, unsigned int *count, nvmlProcessInfo_t *infos, int mps) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    for (int i = 0; i < nprocs; i++) n += procs[i].index == dev->index && procs[i].mps == mps;
    if (!infos || *count < n) {
        *count = n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    n = 0;
    for (int i = 0; i < nprocs; i++)
        if (procs[i].index == dev->index && procs[i].mps == mps)
            infos[n++] = (nvmlProcessInfo_t){procs[i].pid, procs[i].used, procs[i].gi,
                                             procs[i].gi == 0xFFFFFFFF ? 0xFFFFFFFF : 0};
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count,
                                                            nvmlProcessInfo_t *infos) {
    GPU_OR_FAIL(dev);
    return processes(dev, count, infos, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count,
                                                               nvmlProcessInfo_t *infos) {
    GPU_OR_FAIL(dev);
    return processes(dev, count, infos, 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t dev, nvmlProcessUtilizationSample_t *samples,
                                                    unsigned int *count, unsigned long long last_seen) {
    GPU_OR_FAIL(dev);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    unsigned long long ts = (unsigned long long)now.tv_sec * 1000000ull + (unsigned long long)now.tv_nsec / 1000;
    unsigned n = 0;
    for (int i = 0; i < nprocs; i++) n += procs[i].index == dev->index;
    if (n == 0 || last_seen >= ts) return NVML_ERROR_NOT_FOUND; /* no new samples */
    if (!samples || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    n = 0;
    for (int i = 0; i < nprocs; i++)
        if (procs[i].index == dev->index)
            samples[n++] = (nvmlProcessUtilizationSample_t){procs[i].pid, ts, procs[i].sm, procs[i].memutil, 0, 0};
    *count = n;
    return NVML_SUCCESS;
}
