/* cuda-workload's `each` scenario: every entry point the library exports, N calls each, with
 * the counts printed as one JSON object (see workload.c). */
#include "workload.h"

/* ---- each ------------------------------------------------------------------------------------- */

static int first_count = 1;
static void count(const char *api, long n) {
    printf("%s\"%s\":%ld", first_count ? "" : ",", api, n);
    first_count = 0;
}

/* VMM, pools, managed and pitched memory: N calls each of 2 MiB (the VMM granularity; pitched:
 * 256 x 8 bytes); VMM handles released, the rest left to the process's exit. */
static void each_memory(long n, CUstream s) {
    PFN_cuMemCreate create = (PFN_cuMemCreate)sym("cuMemCreate", 0);
    PFN_cuMemRelease release = (PFN_cuMemRelease)sym("cuMemRelease", 0);
    if (create && release) {
        CUmemAllocationProp prop = {.type = 1, .location = {.type = 1, .id = 0}};
        CUmemGenericAllocationHandle *h = calloc((size_t)n, sizeof *h);
        for (long i = 0; i < n; i++) CHECK(create(&h[i], (size_t)2 << 20, &prop, 0));
        for (long i = 0; i < n; i++) CHECK(release(h[i]));
        count("cuMemCreate", n);
        count("cuMemRelease", n);
        free(h);
    }
    PFN_cuDeviceGetDefaultMemPool get_pool = (PFN_cuDeviceGetDefaultMemPool)sym("cuDeviceGetDefaultMemPool", 0);
    CUmemoryPool pool = NULL;
    if (get_pool) CHECK(get_pool(&pool, 0));
    static const char *from_pool[] = {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"};
    for (size_t v = 0; v < 2 && pool; v++) {
        PFN_cuMemAllocFromPoolAsync p = (PFN_cuMemAllocFromPoolAsync)sym(from_pool[v], 0);
        if (!p) continue;
        for (long i = 0; i < n; i++) {
            CUdeviceptr d;
            CHECK(p(&d, (size_t)2 << 20, pool, v ? NULL : s));
        }
        count(from_pool[v], n);
    }
    PFN_cuMemAllocManaged managed = (PFN_cuMemAllocManaged)sym("cuMemAllocManaged", 0);
    if (managed) {
        for (long i = 0; i < n; i++) {
            CUdeviceptr d;
            CHECK(managed(&d, (size_t)2 << 20, 1));
        }
        count("cuMemAllocManaged", n);
    }
    PFN_cuMemAllocPitch pitched = (PFN_cuMemAllocPitch)sym("cuMemAllocPitch_v2", 0);
    if (pitched) {
        for (long i = 0; i < n; i++) {
            CUdeviceptr d;
            size_t pitch;
            CHECK(pitched(&d, &pitch, 256, 8, 4));
        }
        count("cuMemAllocPitch_v2", n);
    }
}

/* Events, polling, capture and graphs: N calls each, after which the stream is idle. */
static void each_serving(long n, CUstream s, CUevent e) {
    static const char *records[] = {"cuEventRecord", "cuEventRecord_ptsz"};
    for (size_t v = 0; v < 2; v++) {
        PFN_cuEventRecord p = (PFN_cuEventRecord)sym(records[v], 0);
        if (!p) continue;
        for (long i = v ? 0 : 1; i < n; i++) CHECK(p(e, v ? NULL : s));
        count(records[v], v ? n : n - 1);
    }
    static const char *with_flags[] = {"cuEventRecordWithFlags", "cuEventRecordWithFlags_ptsz"};
    for (size_t v = 0; v < 2; v++) {
        PFN_cuEventRecordWithFlags p = (PFN_cuEventRecordWithFlags)sym(with_flags[v], 0);
        if (!p) continue;
        for (long i = 0; i < n; i++) CHECK(p(e, v ? NULL : s, 0));
        count(with_flags[v], n);
    }
    /* Everything done first, so that every poll answers success (one event each). */
    PFN_cuCtxSynchronize_v2 sync2 = (PFN_cuCtxSynchronize_v2)sym("cuCtxSynchronize_v2", 0);
    if (sync2) {
        for (long i = 0; i < n; i++) CHECK(sync2(ctx));
        count("cuCtxSynchronize_v2", n);
    } else {
        CHECK(((PFN_cuCtxSynchronize)sym("cuCtxSynchronize", 1))());
        count("cuCtxSynchronize(settle)", 1);
    }
    PFN_cuEventQuery equery = (PFN_cuEventQuery)sym("cuEventQuery", 1);
    for (long i = 0; i < n; i++) CHECK(equery(e));
    count("cuEventQuery", n);
    static const char *queries[] = {"cuStreamQuery", "cuStreamQuery_ptsz"};
    for (size_t v = 0; v < 2; v++) {
        PFN_cuStreamQuery p = (PFN_cuStreamQuery)sym(queries[v], 0);
        if (!p) continue;
        for (long i = 0; i < n; i++) CHECK(p(v ? NULL : s));
        count(queries[v], n);
    }
    /* Captures of nothing: an empty graph each, made executable and updated. */
    CUstream c = new_stream();
    CUgraph g = NULL;
    static const char *captures[][2] = {{"cuStreamBeginCapture_v2", "cuStreamEndCapture"},
                                        {"cuStreamBeginCapture_v2_ptsz", "cuStreamEndCapture_ptsz"}};
    for (size_t v = 0; v < 2; v++) {
        PFN_cuStreamBeginCapture b = (PFN_cuStreamBeginCapture)sym(captures[v][0], 0);
        PFN_cuStreamEndCapture en = (PFN_cuStreamEndCapture)sym(captures[v][1], 0);
        if (!b || !en) continue;
        for (long i = 0; i < n; i++) {
            CHECK(b(v ? NULL : c, 0));
            CHECK(en(v ? NULL : c, &g));
        }
        count(captures[v][0], n);
        count(captures[v][1], n);
    }
    if (!g) return;
    CUgraphExec x = NULL;
    PFN_cuGraphInstantiateWithFlags wf = (PFN_cuGraphInstantiateWithFlags)sym("cuGraphInstantiateWithFlags", 0);
    if (wf) {
        for (long i = 0; i < n; i++) CHECK(wf(&x, g, 0));
        count("cuGraphInstantiateWithFlags", n);
    }
    static const char *with_params[] = {"cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams_ptsz"};
    for (size_t v = 0; v < 2; v++) {
        PFN_cuGraphInstantiateWithParams p = (PFN_cuGraphInstantiateWithParams)sym(with_params[v], 0);
        if (!p) continue;
        unsigned long long params[4] = {0};
        for (long i = 0; i < n; i++) CHECK(p(&x, g, params));
        count(with_params[v], n);
    }
    /* Entry points looked up by name, as the CUDA runtime does. */
    PFN_cuGetProcAddress resolve = (PFN_cuGetProcAddress)sym("cuGetProcAddress_v2", 0);
    if (resolve) {
        for (long i = 0; i < n; i++) {
            void *p = NULL;
            int status = -1;
            CHECK(resolve("cuLaunchKernel", &p, 12000, 0, &status));
        }
        count("cuGetProcAddress_v2", n);
    }
    PFN_cuGraphExecUpdate update = (PFN_cuGraphExecUpdate)sym("cuGraphExecUpdate_v2", 0);
    if (update && x) {
        unsigned long long info[4] = {0};
        for (long i = 0; i < n; i++) CHECK(update(x, g, info));
        count("cuGraphExecUpdate_v2", n);
    }
}

void run_each(long n) {
    setup(1 << 20);
    CUstream s = new_stream();
    CUevent e;
    CHECK(((PFN_cuEventCreate)sym("cuEventCreate", 1))(&e, 0));
    CUlibrary library = NULL;
    CUkernel kernel = NULL;
    CUfunction kernel_fn = NULL;
    CUgraphExec graph = NULL;
    PFN_cuLibraryLoadData libload = (PFN_cuLibraryLoadData)sym("cuLibraryLoadData", 0);
    if (libload) CHECK(libload(&library, PTX, NULL, NULL, 0, NULL, NULL, 0));
    if (!real_driver) {
        CUresult (*inst)(CUgraphExec *) = (CUresult(*)(CUgraphExec *))sym("cuGraphInstantiateStandin", 0);
        if (inst) CHECK(inst(&graph));
    }

    printf("{\"pid\":%d,\"stream\":%llu,\"event\":%llu,\"calls\":{", getpid(), (unsigned long long)(uintptr_t)s,
           (unsigned long long)(uintptr_t)e);

    /* Name lookups first, so that every launch below is of a named handle. setup() made one. */
    PFN_cuModuleGetFunction getfn = (PFN_cuModuleGetFunction)sym("cuModuleGetFunction", 1);
    for (long i = 1; i < n; i++) CHECK(getfn(&function, module, MANGLED));
    count("cuModuleGetFunction", n);
    PFN_cuLibraryGetKernel getk = (PFN_cuLibraryGetKernel)sym("cuLibraryGetKernel", 0);
    PFN_cuKernelGetFunction kgetf = (PFN_cuKernelGetFunction)sym("cuKernelGetFunction", 0);
    if (getk && library) {
        for (long i = 0; i < n; i++) CHECK(getk(&kernel, library, LIB_KERNEL));
        count("cuLibraryGetKernel", n);
        if (kgetf) {
            for (long i = 0; i < n; i++) CHECK(kgetf(&kernel_fn, kernel));
            count("cuKernelGetFunction", n);
        }
    }
    if (!kernel_fn) kernel_fn = function;
    CUfunction kernel_as_fn = kernel ? (CUfunction)kernel : function;

    /* Launches: launch i of every variant uses grid (1 + i, 2, 3), block (4, 5, 6), sharedMem 7 + i. */
    static const struct { const char *name; int kind; } launches[] = {
        {"cuLaunchKernel", 0}, {"cuLaunchKernel_ptsz", 0}, {"cuLaunchCooperativeKernel", 1},
        {"cuLaunchCooperativeKernel_ptsz", 1}, {"cuLaunchKernelEx", 2}, {"cuLaunchKernelEx_ptsz", 2}};
    for (size_t v = 0; v < sizeof launches / sizeof *launches; v++) {
        void *p = sym(launches[v].name, 0);
        if (!p) continue;
        /* _ptsz launches run the handle from cuKernelGetFunction; cooperative ones a CUkernel cast. */
        CUfunction f = strstr(launches[v].name, "_ptsz") ? kernel_fn : function;
        if (launches[v].kind == 1 && !real_driver) f = kernel_as_fn;
        for (long i = 0; i < n; i++) {
            unsigned smem = real_driver ? 0 : (unsigned)(7 + i);
            if (launches[v].kind == 0)
                CHECK(((PFN_cuLaunchKernel)p)(f, 1 + i, 2, 3, 4, 5, 6, smem, s, kernel_params, NULL));
            else if (launches[v].kind == 1)
                CHECK(((PFN_cuLaunchCooperativeKernel)p)(f, 1 + i, 2, 3, 4, 5, 6, smem, s, kernel_params));
            else {
                CUlaunchConfig c = {(unsigned)(1 + i), 2, 3, 4, 5, 6, smem, s, NULL, 0};
                CHECK(((PFN_cuLaunchKernelEx)p)(&c, f, kernel_params, NULL));
            }
        }
        count(launches[v].name, n);
    }
    if (graph) {
        static const char *graphs[] = {"cuGraphLaunch", "cuGraphLaunch_ptsz"};
        for (size_t v = 0; v < 2; v++) {
            PFN_cuGraphLaunch p = (PFN_cuGraphLaunch)sym(graphs[v], 0);
            if (!p) continue;
            for (long i = 0; i < n; i++) CHECK(p(graph, s));
            count(graphs[v], n);
        }
    }

    /* Copies: copy i of every variant moves 100 + i bytes. */
    static const struct { const char *name; int kind; } copies[] = {
        {"cuMemcpyHtoD_v2", 0}, {"cuMemcpyHtoD_v2_ptds", 0}, {"cuMemcpyDtoH_v2", 1}, {"cuMemcpyDtoH_v2_ptds", 1},
        {"cuMemcpyDtoD_v2", 2}, {"cuMemcpyDtoD_v2_ptds", 2}, {"cuMemcpyHtoDAsync_v2", 3},
        {"cuMemcpyHtoDAsync_v2_ptsz", 3}, {"cuMemcpyDtoHAsync_v2", 4}, {"cuMemcpyDtoHAsync_v2_ptsz", 4},
        {"cuMemcpyDtoDAsync_v2", 5}, {"cuMemcpyDtoDAsync_v2_ptsz", 5}, {"cuMemcpy", 2}, {"cuMemcpy_ptds", 2},
        {"cuMemcpyAsync", 5}, {"cuMemcpyAsync_ptsz", 5}, {"cuMemcpyPeer", 6}, {"cuMemcpyPeer_ptds", 6},
        {"cuMemcpyPeerAsync", 7}, {"cuMemcpyPeerAsync_ptsz", 7}};
    for (size_t v = 0; v < sizeof copies / sizeof *copies; v++) {
        void *p = sym(copies[v].name, 0);
        if (!p) continue;
        for (long i = 0; i < n; i++) {
            size_t b = 100 + i;
            switch (copies[v].kind) {
            case 0: CHECK(((PFN_cuMemcpyHtoD)p)(dev_a, host_buf, b)); break;
            case 1: CHECK(((PFN_cuMemcpyDtoH)p)(host_buf, dev_a, b)); break;
            case 2: CHECK(((PFN_cuMemcpyDtoD)p)(dev_b, dev_a, b)); break;
            case 3: CHECK(((PFN_cuMemcpyHtoDAsync)p)(dev_a, host_buf, b, s)); break;
            case 4: CHECK(((PFN_cuMemcpyDtoHAsync)p)(host_buf, dev_a, b, s)); break;
            case 5: CHECK(((PFN_cuMemcpyDtoDAsync)p)(dev_b, dev_a, b, s)); break;
            case 6: CHECK(((PFN_cuMemcpyPeer)p)(dev_b, ctx, dev_a, ctx, b)); break;
            case 7: CHECK(((PFN_cuMemcpyPeerAsync)p)(dev_b, ctx, dev_a, ctx, b, s)); break;
            }
        }
        count(copies[v].name, n);
    }
    each_sized(n, s, count);

    /* Waits. */
    CHECK(((PFN_cuEventRecord)sym("cuEventRecord", 1))(e, s));
    count("cuEventRecord(first)", 1);
    static const char *stream_waits[] = {"cuStreamSynchronize", "cuStreamSynchronize_ptsz"};
    for (size_t v = 0; v < 2; v++) {
        PFN_cuStreamSynchronize p = (PFN_cuStreamSynchronize)sym(stream_waits[v], 0);
        if (!p) continue;
        for (long i = 0; i < n; i++) CHECK(p(v ? NULL : s));
        count(stream_waits[v], n);
    }
    PFN_cuCtxSynchronize ctxsync = (PFN_cuCtxSynchronize)sym("cuCtxSynchronize", 1);
    for (long i = 0; i < n; i++) CHECK(ctxsync());
    count("cuCtxSynchronize", n);
    PFN_cuEventSynchronize evsync = (PFN_cuEventSynchronize)sym("cuEventSynchronize", 1);
    for (long i = 0; i < n; i++) CHECK(evsync(e));
    count("cuEventSynchronize", n);
    static const char *event_waits[] = {"cuStreamWaitEvent", "cuStreamWaitEvent_ptsz"};
    for (size_t v = 0; v < 2; v++) {
        PFN_cuStreamWaitEvent p = (PFN_cuStreamWaitEvent)sym(event_waits[v], 0);
        if (!p) continue;
        for (long i = 0; i < n; i++) CHECK(p(s, e, 0));
        count(event_waits[v], n);
    }

    each_serving(n, s, e);

    /* Memory: allocation i of every variant is 4096 * (i + 1) bytes, freed by the matching free. */
    CUdeviceptr *ptrs = calloc((size_t)n, sizeof *ptrs);
    PFN_cuMemAlloc alloc = (PFN_cuMemAlloc)sym("cuMemAlloc_v2", 1);
    PFN_cuMemFree mfree = (PFN_cuMemFree)sym("cuMemFree_v2", 1);
    for (long i = 0; i < n; i++) CHECK(alloc(&ptrs[i], 4096 * (size_t)(i + 1)));
    for (long i = 0; i < n; i++) CHECK(mfree(ptrs[i]));
    /* One free of a pointer never allocated while traced (the stand-in accepts any non-zero one). */
    if (!real_driver) CHECK(mfree((CUdeviceptr)0xdead0000ull));
    count("cuMemAlloc_v2", n + 2); /* setup() allocated two buffers */
    count("cuMemFree_v2", n + !real_driver);
    static const char *async_allocs[][2] = {{"cuMemAllocAsync", "cuMemFreeAsync"},
                                            {"cuMemAllocAsync_ptsz", "cuMemFreeAsync_ptsz"}};
    for (size_t v = 0; v < 2; v++) {
        PFN_cuMemAllocAsync a = (PFN_cuMemAllocAsync)sym(async_allocs[v][0], 0);
        PFN_cuMemFreeAsync f = (PFN_cuMemFreeAsync)sym(async_allocs[v][1], 0);
        if (!a || !f) continue;
        for (long i = 0; i < n; i++) CHECK(a(&ptrs[i], 4096 * (size_t)(i + 1), s));
        for (long i = 0; i < n; i++) CHECK(f(ptrs[i], s));
        count(async_allocs[v][0], n);
        count(async_allocs[v][1], n);
    }
    each_memory(n, s);
    each_devices(n, 2, count); /* the streams of run_each and each_serving */
    CHECK(ctxsync());
    count("cuCtxSynchronize(final)", 1);
    printf("},\"function\":%llu,\"kernel\":%llu,\"kernel_function\":%llu,\"graph\":%llu,\"context\":%llu}\n",
           (unsigned long long)(uintptr_t)function, (unsigned long long)(uintptr_t)kernel,
           (unsigned long long)(uintptr_t)kernel_fn, (unsigned long long)(uintptr_t)graph,
           (unsigned long long)(uintptr_t)ctx);
}
