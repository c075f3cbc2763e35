/* Shared by the cuda-workload sources (workload.c: the set-up, main and most scenarios;
 * workload_each.c: the `each` scenario). */
#ifndef CUDA_WORKLOAD_H
#define CUDA_WORKLOAD_H
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "cuda.h"

#define MAX_THREADS 64

#define CHECK(call)                                                                    \
    do {                                                                               \
        CUresult rc_ = (call);                                                         \
        if (rc_ != CUDA_SUCCESS) {                                                     \
            fprintf(stderr, "cuda-workload: %s failed with %d\n", #call, (int)rc_);    \
            exit(3);                                                                   \
        }                                                                              \
    } while (0)

extern const char *MANGLED;
extern const char *LIB_KERNEL;
extern const char *PTX;
extern void *lib;
extern const char *lib_path;
extern int real_driver;
/* One allocation through the entry point WORKLOAD_ALLOC names (workload.c). */
CUresult alloc_by_kind(size_t bytes);
extern uint64_t loaded_ns;
extern CUcontext ctx;
extern CUmodule module;
extern CUfunction function;
extern CUdeviceptr dev_a, dev_b;
extern char *host_buf;
extern void *kernel_params[3];
extern unsigned int kernel_n;

/* dlsym in the library; exits when a required symbol is missing. */
void *sym(const char *name, int required);
/* CLOCK_MONOTONIC in ns. */
uint64_t now_ns(void);
/* The primary context, a module with MANGLED, two device buffers of BUF_BYTES, a host buffer. */
void setup(size_t buf_bytes);
/* A new stream. */
CUstream new_stream(void);
/* The `each` scenario (workload_each.c). */
void run_each(long n);
/* Its memsets, 2-D, 3-D and batch copies (workload_sized.c), each counted through `count`. */
void each_sized(long n, CUstream s, void (*count)(const char *, long));
/* Its context, UUID and stream calls (workload_devices.c), `streams` more having been made. */
void each_devices(long n, long streams, void (*count)(const char *, long));
/* The device scenarios (workload_devices.c): 1 when `scenario` was one of them. */
int run_devices(const char *scenario, int argc, char **argv);
/* A worker thread's context (a real driver's is per thread). */
void thread_ctx(void);
/* The serving-stack scenarios (workload_serving.c): 1 when `scenario` was one of them. */
int run_serving(const char *scenario, int argc, char **argv);
/* The odd scenarios (workload_misc.c): 1 when `scenario` was one of them. */
int run_misc(const char *scenario, int argc, char **argv);
int run_harm_scenarios(const char *scenario, int threads, int argc, char **argv);
/* The `loop` scenario (workload.c). */
void run_loop(double seconds, unsigned grid, long sync_every, long limit);

#endif
