/* The stand-in libcuda's serving-stack entry points: events and polling, stream capture and CUDA
 * graphs, cuCtxSynchronize_v2, and cuGetProcAddress_v2. Included by libcuda.c (one translation
 * unit: these use its static device, streams and clock).
 *
 * Capture: a launch on a capturing stream (or on a stream joined to the capture by waiting on an
 * event recorded in it) is appended to the capture's graph and runs nothing. An executable graph
 * runs its nodes' device time at each launch.
 *
 * cuGetProcAddress_v2 answers with the exported function of that name (the `_ptsz`/`_ptds`
 * variant when asked for per-thread default streams), as dlsym would; with
 * CUDA_STANDIN_PROC_ADDRESS=private it answers with private entry points into the same code for
 * the functions of `privates` below, which no uprobe on an exported symbol sees.
 */

struct capture {
    uintptr_t key; /* stream key (0: free slot) */
    struct CUgraph_st *graph;
};

#define MAX_CAPTURING 64
static struct capture capturing[MAX_CAPTURING];

/* The graph `key` captures into, or NULL. Caller holds objs_lock. */
static struct CUgraph_st *captured_by(uintptr_t key) {
    for (size_t i = 0; i < MAX_CAPTURING; i++)
        if (capturing[i].key == key) return capturing[i].graph;
    return NULL;
}

static int capture_join(uintptr_t key, struct CUgraph_st *g) {
    for (size_t i = 0; i < MAX_CAPTURING; i++)
        if (capturing[i].key == 0 || capturing[i].key == key) {
            capturing[i] = (struct capture){key, g};
            return 1;
        }
    return 0;
}

static void graph_add(struct CUgraph_st *g, CUfunction f, uint64_t blocks) {
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 16;
        struct graph_node *n = realloc(g->nodes, cap * sizeof *n);
        if (!n) return;
        g->nodes = n;
        g->cap = cap;
    }
    g->nodes[g->n++] = (struct graph_node){f, blocks};
}

/* A launch on a capturing stream: recorded into its graph. 1 when it was. */
static int capture_launch(uintptr_t key, CUfunction f, uint64_t blocks) {
    pthread_mutex_lock(&objs_lock);
    struct CUgraph_st *g = captured_by(key);
    if (g) graph_add(g, f, blocks);
    pthread_mutex_unlock(&objs_lock);
    return g != NULL;
}

static int is_capturing(uintptr_t key) {
    pthread_mutex_lock(&objs_lock);
    int c = captured_by(key) != NULL;
    pthread_mutex_unlock(&objs_lock);
    return c;
}

/* ---- events and polling ------------------------------------------------------------------------ */

static CUresult event_record(CUevent e, CUstream s, int per_thread) {
    init();
    spin(cfg_call_ns);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    uintptr_t key = stream_key(s, per_thread);
    pthread_mutex_lock(&objs_lock);
    e->capture = captured_by(key);
    pthread_mutex_unlock(&objs_lock);
    if (!e->capture) e->done_at = stream_tail(key);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s) { return event_record(e, s, 0); }
EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return event_record(e, s, 1); }
EXPORT CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags) {
    (void)flags;
    return event_record(e, s, 0);
}
EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned int flags) {
    (void)flags;
    return event_record(e, s, 1);
}
EXPORT CUresult cuEventQuery(CUevent e) {
    init();
    spin(cfg_call_ns);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    return now_ns() >= e->done_at ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

static CUresult stream_query(CUstream s, int per_thread) {
    init();
    spin(cfg_call_ns);
    return now_ns() >= stream_tail(stream_key(s, per_thread)) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuStreamQuery(CUstream s) { return stream_query(s, 0); }
EXPORT CUresult cuStreamQuery_ptsz(CUstream s) { return stream_query(s, 1); }
EXPORT CUresult cuCtxSynchronize_v2(CUcontext c) {
    init();
    spin(cfg_call_ns);
    if (c && !valid_ctx(c)) return CUDA_ERROR_INVALID_VALUE;
    wait_until(all_tail());
    return CUDA_SUCCESS;
}

/* ---- capture and graphs ----------------------------------------------------------------------- */

static CUresult begin_capture(CUstream s, int per_thread) {
    init();
    spin(cfg_call_ns);
    uintptr_t key = stream_key(s, per_thread);
    pthread_mutex_lock(&objs_lock);
    CUresult r = CUDA_SUCCESS;
    if (captured_by(key)) r = CUDA_ERROR_ILLEGAL_STATE;
    else if (!capture_join(key, calloc(1, sizeof(struct CUgraph_st)))) r = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&objs_lock);
    return r;
}

static CUresult end_capture(CUstream s, CUgraph *out, int per_thread) {
    init();
    spin(cfg_call_ns);
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    uintptr_t key = stream_key(s, per_thread);
    pthread_mutex_lock(&objs_lock);
    struct CUgraph_st *g = captured_by(key);
    if (g)
        for (size_t i = 0; i < MAX_CAPTURING; i++)
            if (capturing[i].graph == g) capturing[i] = (struct capture){0, NULL};
    pthread_mutex_unlock(&objs_lock);
    if (!g) return CUDA_ERROR_ILLEGAL_STATE;
    *out = g;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode) { (void)mode; return begin_capture(s, 0); }
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode) { (void)mode; return begin_capture(s, 1); }
EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) { return end_capture(s, g, 0); }
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) { return end_capture(s, g, 1); }

/* An executable graph: its own copy of the graph's nodes. */
static CUresult instantiate(CUgraphExec *out, CUgraph g) {
    init();
    spin(cfg_call_ns);
    if (!out || !g) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *x = calloc(1, sizeof *x);
    if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
    x->graph = calloc(1, sizeof *x->graph);
    for (size_t i = 0; x->graph && i < g->n; i++) graph_add(x->graph, g->nodes[i].function, g->nodes[i].blocks);
    *out = x;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *out, CUgraph g, unsigned long long flags) {
    (void)flags;
    return instantiate(out, g);
}
EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *out, CUgraph g, void *params) {
    (void)params;
    return instantiate(out, g);
}
EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *out, CUgraph g, void *params) {
    (void)params;
    return instantiate(out, g);
}
EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec x, CUgraph g, void *info) {
    (void)info;
    init();
    spin(cfg_call_ns);
    if (!x || !g || !x->graph) return CUDA_ERROR_INVALID_VALUE;
    x->graph->n = 0;
    for (size_t i = 0; i < g->n; i++) graph_add(x->graph, g->nodes[i].function, g->nodes[i].blocks);
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress_v2 ------------------------------------------------------------------------ */

#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
#define CU_GET_PROC_ADDRESS_SUCCESS 0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1

/* Private entry points into the same code as the exported ones (a driver that hands out its
 * internal functions). */
static CUresult private_launch(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                               unsigned int by, unsigned int bz, unsigned int smem, CUstream s, void **params,
                               void **extra) {
    (void)smem; (void)params; (void)extra;
    return launch(f, gx, gy, gz, bx, by, bz, s, 0);
}
static CUresult private_stream_sync(CUstream s) { return stream_sync(s, 0); }

static const struct { const char *name; void *fn; } privates[] = {
    {"cuLaunchKernel", (void *)private_launch},
    {"cuStreamSynchronize", (void *)private_stream_sync},
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                                    int *status) {
    (void)version;
    init();
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    const char *mode = getenv("CUDA_STANDIN_PROC_ADDRESS");
    if (mode && !strcmp(mode, "private"))
        for (size_t i = 0; i < sizeof privates / sizeof *privates; i++)
            if (!strcmp(privates[i].name, symbol)) *pfn = privates[i].fn;
    Dl_info self;
    void *me = NULL;
    if (!*pfn && dladdr((void *)cuGetProcAddress_v2, &self)) me = dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    if (!*pfn && me && (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) {
        char name[128];
        snprintf(name, sizeof name, "%s_ptsz", symbol);
        *pfn = dlsym(me, name);
        if (!*pfn) {
            snprintf(name, sizeof name, "%s_ptds", symbol);
            *pfn = dlsym(me, name);
        }
    }
    if (!*pfn && me) *pfn = dlsym(me, symbol);
    if (me) dlclose(me);
    if (status) *status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* A launch's device time: its nodes' blocks (CUDA_STANDIN_GRAPH_NS for a graph of no known nodes). */
static uint64_t graph_ns(const struct CUgraphExec_st *x) {
    if (!x->graph) return cfg_graph_ns;
    uint64_t ns = 0;
    for (size_t i = 0; i < x->graph->n; i++) ns += x->graph->nodes[i].blocks * cfg_ns_per_block;
    return ns;
}
