/* The subset of the CUDA driver API (cuda.h, CUDA 12/13) that the stand-in library exports and
 * the workload calls, with the real types and prototypes. Only what cudatrace's tests need. */
#ifndef CUDATRACE_STANDIN_CUDA_H
#define CUDATRACE_STANDIN_CUDA_H
#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraph_st *CUgraph;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;
/* cuda.h's CUmemAllocationProp: type 1 is pinned, location type 1 a device (id at offset 12). */
typedef struct {
    int type;
    int requestedHandleTypes;
    struct { int type; int id; } location;
    void *win32HandleMetaData;
    struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_ILLEGAL_STATE 401
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_NOT_FOUND 500

typedef struct CUlaunchAttribute_st {
    int id;
    char pad[4];
    char value[64];
} CUlaunchAttribute;

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;            /* offset 32 */
    CUlaunchAttribute *attrs;    /* offset 40 */
    unsigned int numAttrs;       /* offset 48 */
} CUlaunchConfig;

/* A device's identity (cuDeviceGetUuid). */
typedef struct CUuuid_st { char bytes[16]; } CUuuid;
/* cuCtxCreate_v4's parameters (CUDA 12.5+): execution affinity and a CIG context, unused here. */
typedef struct CUctxCreateParams_st {
    void *execAffinityParams;
    int numExecAffinityParams;
    void *cigParams;
} CUctxCreateParams;

/* Function-pointer types, as the CUDA runtime holds them after cuGetProcAddress. */
typedef CUresult (*PFN_cuInit)(unsigned int);
typedef CUresult (*PFN_cuDeviceGet)(CUdevice *, int);
typedef CUresult (*PFN_cuCtxCreate)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*PFN_cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
typedef CUresult (*PFN_cuCtxSetCurrent)(CUcontext);
typedef CUresult (*PFN_cuDeviceGetCount)(int *);
typedef CUresult (*PFN_cuCtxCreate_v4)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
typedef CUresult (*PFN_cuCtxDestroy)(CUcontext);
typedef CUresult (*PFN_cuCtxPushCurrent)(CUcontext);
typedef CUresult (*PFN_cuCtxPopCurrent)(CUcontext *);
typedef CUresult (*PFN_cuDeviceGetUuid)(CUuuid *, CUdevice);
typedef CUresult (*PFN_cuStreamCreateWithPriority)(CUstream *, unsigned int, int);
typedef CUresult (*PFN_cuModuleLoadData)(CUmodule *, const void *);
typedef CUresult (*PFN_cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
typedef CUresult (*PFN_cuLibraryLoadData)(CUlibrary *, const void *, void *, void *, unsigned int, void *, void *, unsigned int);
typedef CUresult (*PFN_cuLibraryGetKernel)(CUkernel *, CUlibrary, const char *);
typedef CUresult (*PFN_cuKernelGetFunction)(CUfunction *, CUkernel);
typedef CUresult (*PFN_cuLaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                                       unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
typedef CUresult (*PFN_cuLaunchCooperativeKernel)(CUfunction, unsigned int, unsigned int, unsigned int,
                                                  unsigned int, unsigned int, unsigned int, unsigned int,
                                                  CUstream, void **);
typedef CUresult (*PFN_cuLaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*PFN_cuGraphLaunch)(CUgraphExec, CUstream);
typedef CUresult (*PFN_cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
typedef CUresult (*PFN_cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
typedef CUresult (*PFN_cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult (*PFN_cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*PFN_cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*PFN_cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
typedef CUresult (*PFN_cuMemcpy)(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult (*PFN_cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
typedef CUresult (*PFN_cuMemcpyPeer)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t);
typedef CUresult (*PFN_cuMemcpyPeerAsync)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);
typedef CUresult (*PFN_cuStreamSynchronize)(CUstream);
typedef CUresult (*PFN_cuCtxSynchronize)(void);
typedef CUresult (*PFN_cuEventSynchronize)(CUevent);
typedef CUresult (*PFN_cuStreamWaitEvent)(CUstream, CUevent, unsigned int);
typedef CUresult (*PFN_cuEventCreate)(CUevent *, unsigned int);
typedef CUresult (*PFN_cuEventRecord)(CUevent, CUstream);
typedef CUresult (*PFN_cuEventRecordWithFlags)(CUevent, CUstream, unsigned int);
typedef CUresult (*PFN_cuEventQuery)(CUevent);
typedef CUresult (*PFN_cuStreamQuery)(CUstream);
typedef CUresult (*PFN_cuCtxSynchronize_v2)(CUcontext);
typedef CUresult (*PFN_cuStreamBeginCapture)(CUstream, int);
typedef CUresult (*PFN_cuStreamEndCapture)(CUstream, CUgraph *);
typedef CUresult (*PFN_cuGraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*PFN_cuGraphInstantiateWithParams)(CUgraphExec *, CUgraph, void *);
typedef CUresult (*PFN_cuGraphExecUpdate)(CUgraphExec, CUgraph, void *);
typedef CUresult (*PFN_cuGetProcAddress)(const char *, void **, int, unsigned long long, int *);
typedef CUresult (*PFN_cuStreamCreate)(CUstream *, unsigned int);
typedef CUresult (*PFN_cuMemAlloc)(CUdeviceptr *, size_t);
typedef CUresult (*PFN_cuMemFree)(CUdeviceptr);
typedef CUresult (*PFN_cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*PFN_cuMemFreeAsync)(CUdeviceptr, CUstream);
typedef CUresult (*PFN_cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                                    unsigned long long);
typedef CUresult (*PFN_cuMemRelease)(CUmemGenericAllocationHandle);
typedef CUresult (*PFN_cuMemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*PFN_cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
typedef CUresult (*PFN_cuMemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef CUresult (*PFN_cuDeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);

/* cuda.h's 2-D and 3-D copy parameters (memory types: 1 host, 2 device, 3 array, 4 unified). */
typedef struct {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;
typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    void *reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    void *reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;
typedef struct { int srcAccessOrder; struct { int type; int id; } srcLocHint, dstLocHint; unsigned int flags; } CUmemcpyAttributes;
typedef CUresult (*PFN_cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
typedef CUresult (*PFN_cuMemsetD16)(CUdeviceptr, unsigned short, size_t);
typedef CUresult (*PFN_cuMemsetD32)(CUdeviceptr, unsigned int, size_t);
typedef CUresult (*PFN_cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
typedef CUresult (*PFN_cuMemsetD16Async)(CUdeviceptr, unsigned short, size_t, CUstream);
typedef CUresult (*PFN_cuMemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
typedef CUresult (*PFN_cuMemsetD2D8)(CUdeviceptr, size_t, unsigned char, size_t, size_t);
typedef CUresult (*PFN_cuMemsetD2D16)(CUdeviceptr, size_t, unsigned short, size_t, size_t);
typedef CUresult (*PFN_cuMemsetD2D32)(CUdeviceptr, size_t, unsigned int, size_t, size_t);
typedef CUresult (*PFN_cuMemsetD2D8Async)(CUdeviceptr, size_t, unsigned char, size_t, size_t, CUstream);
typedef CUresult (*PFN_cuMemsetD2D16Async)(CUdeviceptr, size_t, unsigned short, size_t, size_t, CUstream);
typedef CUresult (*PFN_cuMemsetD2D32Async)(CUdeviceptr, size_t, unsigned int, size_t, size_t, CUstream);
typedef CUresult (*PFN_cuMemcpy2D)(const CUDA_MEMCPY2D *);
typedef CUresult (*PFN_cuMemcpy2DAsync)(const CUDA_MEMCPY2D *, CUstream);
typedef CUresult (*PFN_cuMemcpy3D)(const CUDA_MEMCPY3D *);
typedef CUresult (*PFN_cuMemcpy3DAsync)(const CUDA_MEMCPY3D *, CUstream);
/* CUDA 12.8's batch (with failIdx) and CUDA 13's (cuMemcpyBatchAsync_v2, without). */
typedef CUresult (*PFN_cuMemcpyBatchAsync)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *,
                                           size_t *, size_t, size_t *, CUstream);
typedef CUresult (*PFN_cuMemcpyBatchAsync_v2)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *,
                                              size_t *, size_t, CUstream);

#endif
