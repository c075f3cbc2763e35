/* Stand-in libcuda.so.1: devices and contexts. Included by libcuda.c (one translation unit).
 *
 *   CUDA_STANDIN_DEVICES   devices (CUDA ordinals 0..N-1, at most 8; default 1); they share the
 *                          simulated queue of the device file
 *   CUDA_STANDIN_UUIDS     their UUIDs, comma-separated, as NVML prints them (GPU-8-4-4-4-12 hex);
 *                          default: every byte the ordinal + 1
 *
 * A thread's current context is the top of its own stack, as in the driver; a function looked up
 * (cuModuleGetFunction, cuKernelGetFunction) belongs to the current context's device, so the same
 * name gives one handle per device. */

#define MAX_DEVICES 8
static struct CUctx_st primary[MAX_DEVICES], created[MAX_DEVICES];
static __thread CUcontext ctx_stack[16];
static __thread int ctx_depth;

static int devices(void) {
    uint64_t n = env_u64("CUDA_STANDIN_DEVICES", 1);
    return n < 1 ? 1 : n > MAX_DEVICES ? MAX_DEVICES : (int)n;
}

static int valid_ctx(CUcontext c) {
    for (int i = 0; i < MAX_DEVICES; i++)
        if (c == &primary[i] || c == &created[i]) return 1;
    return 0;
}

/* The device of the thread's current context (0 with none). */
static int current_device(void) { return ctx_depth ? ctx_stack[ctx_depth - 1]->device : 0; }

static int uuid_of(int ordinal, unsigned char out[16]) {
    for (int i = 0; i < 16; i++) out[i] = (unsigned char)(ordinal + 1);
    const char *all = getenv("CUDA_STANDIN_UUIDS");
    if (!all) return 1;
    const char *u = all;
    for (int i = 0; i < ordinal && u; i++) {
        u = strchr(u, ',');
        if (u) u++;
    }
    if (!u) return 1;
    if (strncmp(u, "GPU-", 4) == 0 || strncmp(u, "MIG-", 4) == 0) u += 4;
    for (int i = 0; i < 16; i++) {
        while (*u == '-') u++;
        unsigned int b;
        if (sscanf(u, "%2x", &b) != 1) return 0;
        out[i] = (unsigned char)b;
        u += 2;
    }
    return 1;
}

static CUresult device_ok(CUdevice d) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    return d >= 0 && d < devices() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult push_ctx(CUcontext c) {
    if (ctx_depth == (int)(sizeof ctx_stack / sizeof ctx_stack[0])) return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = c;
    return CUDA_SUCCESS;
}

/* ---- set-up entry points (not probed) ------------------------------------------------------- */

EXPORT CUresult cuInit(unsigned int flags) {
    (void)flags;
    init();
    for (int i = 0; i < MAX_DEVICES; i++) primary[i].device = created[i].device = i;
    initialized = 1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (!d || ordinal < 0 || ordinal >= devices()) return CUDA_ERROR_INVALID_VALUE;
    *d = ordinal;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetCount(int *n) {
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *n = devices();
    return CUDA_SUCCESS;
}

/* ---- contexts and devices (probed) ------------------------------------------------------------ */

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = device_ok(d);
    if (r == CUDA_SUCCESS) *c = &primary[d];
    return r;
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned int flags, CUdevice d) {
    (void)flags;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = device_ok(d);
    if (r != CUDA_SUCCESS) return r;
    *c = &created[d];
    return push_ctx(*c);
}
EXPORT CUresult cuCtxCreate_v4(CUcontext *c, CUctxCreateParams *params, unsigned int flags, CUdevice d) {
    (void)params; (void)flags;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = device_ok(d);
    if (r != CUDA_SUCCESS) return r;
    *c = &created[d];
    return push_ctx(*c);
}
EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
    if (!valid_ctx(c)) return CUDA_ERROR_INVALID_VALUE;
    if (ctx_depth && ctx_stack[ctx_depth - 1] == c) ctx_depth--;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
    if (c && !valid_ctx(c)) return CUDA_ERROR_INVALID_VALUE;
    if (!c) {
        if (ctx_depth) ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (ctx_depth) ctx_stack[ctx_depth - 1] = c;
    else ctx_stack[ctx_depth++] = c;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) {
    if (!valid_ctx(c)) return CUDA_ERROR_INVALID_VALUE;
    return push_ctx(c);
}
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c) {
    if (!ctx_depth) return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext top = ctx_stack[--ctx_depth];
    if (c) *c = top;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) {
    if (!u) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = device_ok(d);
    if (r == CUDA_SUCCESS && !uuid_of(d, (unsigned char *)u->bytes)) r = CUDA_ERROR_INVALID_VALUE;
    return r;
}
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) {
    if (!u) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = device_ok(d);
    if (r == CUDA_SUCCESS && !uuid_of(d, (unsigned char *)u->bytes)) r = CUDA_ERROR_INVALID_VALUE;
    return r;
}
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
    static int ids;
    (void)flags;
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    *s = calloc(1, sizeof **s);
    (*s)->id = __atomic_add_fetch(&ids, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority) {
    static int ids = 1 << 20;
    (void)flags; (void)priority;
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    *s = calloc(1, sizeof **s);
    (*s)->id = __atomic_add_fetch(&ids, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
