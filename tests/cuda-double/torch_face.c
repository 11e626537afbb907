/* torch_face.c - the rest of the CUDA runtime that PyPI's torch links, for the
 * double built as libcudart.so.13 (README.md here, "torch over the double").
 *
 * torch's libraries name about 110 cudart calls with the version node
 * libcudart.so.13, and Python loads them with RTLD_NOW: every one must exist,
 * or nothing loads. cuda_double.c serves the ones Loom and the torch paths
 * tested here use; this file has the rest. Registering the fat binaries of
 * torch's kernels (static constructors, at load) is bookkeeping that keeps
 * nothing; launching a kernel fails with cudaErrorNotSupported, recorded as
 * the last error as a failed launch is, so torch raises at its launch check:
 * the double cannot run torch's device code and does not pretend to. Everything
 * else here (graphs, memory pools, peer access, libraries, event IPC handles,
 * pinning host memory) answers cudaErrorNotSupported too.
 */
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cuda_double.h"

/* What nvcc's host code calls; no header declares them for C. */
void **CUDARTAPI __cudaRegisterFatBinary(void *fat);
void CUDARTAPI __cudaRegisterFatBinaryEnd(void **handle);
void CUDARTAPI __cudaUnregisterFatBinary(void **handle);
void CUDARTAPI __cudaRegisterVar(void **handle, char *host, char *device, const char *name, int ext,
                                 size_t size, int constant, int global);
void CUDARTAPI __cudaRegisterFunction(void **handle, const char *host, char *device,
                                      const char *name, int limit, uint3 *tid, uint3 *bid,
                                      dim3 *bdim, dim3 *gdim, int *wsize);
unsigned CUDARTAPI __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared,
                                               struct CUstream_st *stream);
cudaError_t CUDARTAPI __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared,
                                                 void *stream);
cudaError_t CUDARTAPI __cudaGetKernel(cudaKernel_t *kernel, const void *fn);
cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args,
                                         size_t shared, cudaStream_t stream);

/* ---- fat binaries and kernel stubs ------------------------------------------------ */

/* Every module gets the same handle: nothing is looked up through it. */
static void *module;

void **CUDARTAPI __cudaRegisterFatBinary(void *fat)
{
    (void)fat;
    return &module;
}

void CUDARTAPI __cudaRegisterFatBinaryEnd(void **handle)
{
    (void)handle;
}

void CUDARTAPI __cudaUnregisterFatBinary(void **handle)
{
    (void)handle;
}

void CUDARTAPI __cudaRegisterVar(void **handle, char *host, char *device, const char *name, int ext,
                                 size_t size, int constant, int global)
{
    (void)handle, (void)host, (void)device, (void)name, (void)ext, (void)size, (void)constant,
        (void)global;
}

void CUDARTAPI __cudaRegisterFunction(void **handle, const char *host, char *device,
                                      const char *name, int limit, uint3 *tid, uint3 *bid,
                                      dim3 *bdim, dim3 *gdim, int *wsize)
{
    (void)handle, (void)host, (void)device, (void)name, (void)limit, (void)tid, (void)bid,
        (void)bdim, (void)gdim, (void)wsize;
}

/* A kernel stub pushes its <<<>>> configuration, pops it and launches: the
 * pop succeeds so that the launch itself is what fails, where torch checks. */
unsigned CUDARTAPI __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared,
                                               struct CUstream_st *stream)
{
    (void)grid, (void)block, (void)shared, (void)stream;
    return 0;
}

cudaError_t CUDARTAPI __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared,
                                                 void *stream)
{
    dim3 one = {1, 1, 1};
    *grid = one;
    *block = one;
    *shared = 0;
    memset(stream, 0, sizeof(cudaStream_t));
    return cudaSuccess;
}

cudaError_t CUDARTAPI __cudaGetKernel(cudaKernel_t *kernel, const void *fn)
{
    (void)fn;
    *kernel = NULL;
    return cudaSuccess;
}

/* The launches: the double runs none of torch's kernels. */
#define NO_KERNELS cuda_double_fail(cudaErrorNotSupported)

cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args,
                                         size_t shared, cudaStream_t stream)
{
    (void)kernel, (void)grid, (void)block, (void)args, (void)shared, (void)stream;
    return NO_KERNELS;
}

cudaError_t CUDARTAPI cudaLaunchKernel(const void *fn, dim3 grid, dim3 block, void **args,
                                       size_t shared, cudaStream_t stream)
{
    (void)fn, (void)grid, (void)block, (void)args, (void)shared, (void)stream;
    return NO_KERNELS;
}

cudaError_t CUDARTAPI cudaLaunchCooperativeKernel(const void *fn, dim3 grid, dim3 block,
                                                  void **args, size_t shared, cudaStream_t stream)
{
    (void)fn, (void)grid, (void)block, (void)args, (void)shared, (void)stream;
    return NO_KERNELS;
}

cudaError_t CUDARTAPI cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *fn,
                                          void **args)
{
    (void)config, (void)fn, (void)args;
    return NO_KERNELS;
}

/* ---- versions ---------------------------------------------------------------------- */

cudaError_t CUDARTAPI cudaDriverGetVersion(int *v)
{
    if (!v)
        return cuda_double_fail(cudaErrorInvalidValue);
    *v = CUDA_VERSION;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaRuntimeGetVersion(int *v)
{
    if (!v)
        return cuda_double_fail(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}


/* ---- the driver calls of torch's NVRTC stub, and the driver's entry points ------- */

/* libcaffe2_nvrtc.so, which torch loads (RTLD_NOW) when CUDA starts, links
 * these from libcuda.so.1: the double is that too (a link to this library of
 * that name on the library path). The primary contexts are one placeholder
 * per device, active once the process started CUDA; setting one makes its
 * device current, as cudaSetDevice. */
static char contexts[64];

static int context_device(CUcontext ctx)
{
    ptrdiff_t d = (char *)ctx - contexts;
    return d >= 0 && d < (ptrdiff_t)sizeof(contexts) ? (int)d : -1;
}

/* Whether dev is one of the double's and there is somewhere to put the answer. */
static CUresult device_question(CUdevice dev, const void *answer)
{
    int n = 0;
    if (!answer)
        return CUDA_ERROR_INVALID_VALUE;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return CUDA_ERROR_NOT_INITIALIZED;
    return dev >= 0 && dev < n && dev < (int)sizeof(contexts) ? CUDA_SUCCESS
                                                              : CUDA_ERROR_INVALID_DEVICE;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *dev, int ordinal)
{
    CUresult e = device_question(ordinal, dev);
    if (e == CUDA_SUCCESS)
        *dev = ordinal;
    return e;
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CUresult e = device_question(dev, flags ? (void *)active : NULL);
    if (e == CUDA_SUCCESS) {
        *flags = 0;
        *active = cuda_double_started();
    }
    return e;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    CUresult e = device_question(dev, ctx);
    if (e == CUDA_SUCCESS)
        *ctx = (CUcontext)(contexts + dev);
    return e;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *ctx)
{
    int dev = 0;
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!cuda_double_started()) {
        *ctx = NULL;
        return CUDA_SUCCESS;
    }
    if (cudaGetDevice(&dev) != cudaSuccess)
        return CUDA_ERROR_NOT_INITIALIZED;
    *ctx = (CUcontext)(contexts + dev);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    int dev = context_device(ctx);
    if (dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    return cudaSetDevice(dev) == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr)
{
    void *values[1] = {data};
    return cuPointerGetAttributes(1, &attr, values, ptr);
}

CUresult CUDAAPI cuGetErrorString(CUresult e, const char **text)
{
    if (!text)
        return CUDA_ERROR_INVALID_VALUE;
    switch (e) {
    case CUDA_SUCCESS: *text = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *text = "initialization error"; break;
    case CUDA_ERROR_INVALID_DEVICE: *text = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *text = "invalid device context"; break;
    case CUDA_ERROR_NOT_FOUND: *text = "named symbol not found"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *text = "operation not supported"; break;
    default: *text = "unknown error (the CUDA double does not name it)"; break;
    }
    return CUDA_SUCCESS;
}

/* The driver calls the double serves (cuda_double.c and the ones above), by
 * the names a caller asks for (torch asks for cuDeviceGet); any other is not
 * found, as one newer than the driver would be. */
cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char *symbol, void **fn,
                                                       unsigned int version,
                                                       unsigned long long flags,
                                                       enum cudaDriverEntryPointQueryResult *status)
{
    static const struct { const char *name; void *fn; } served[] = {
        {"cuInit", (void *)cuInit},
        {"cuPointerGetAttributes", (void *)cuPointerGetAttributes},
        {"cuPointerGetAttribute", (void *)cuPointerGetAttribute},
        {"cuMemGetAddressRange", (void *)cuMemGetAddressRange},
        {"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute},
        {"cuMemGetHandleForAddressRange", (void *)cuMemGetHandleForAddressRange},
        {"cuDeviceGet", (void *)cuDeviceGet},
        {"cuDevicePrimaryCtxGetState", (void *)cuDevicePrimaryCtxGetState},
        {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain},
        {"cuCtxGetCurrent", (void *)cuCtxGetCurrent},
        {"cuCtxSetCurrent", (void *)cuCtxSetCurrent},
        {"cuGetErrorString", (void *)cuGetErrorString},
    };
    (void)version, (void)flags;
    if (!symbol || !fn)
        return cuda_double_fail(cudaErrorInvalidValue);
    for (size_t i = 0; i < sizeof(served) / sizeof(served[0]); i++)
        if (strcmp(symbol, served[i].name) == 0) {
            *fn = served[i].fn;
            if (status)
                *status = cudaDriverEntryPointSuccess;
            return cudaSuccess;
        }
    *fn = NULL;
    if (status)
        *status = cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

/* ---- the rest: not supported ----------------------------------------------------- */

/* Their parameters are not looked at: one pragma rather than a (void) for each. */
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define NOT_SUPPORTED cuda_double_fail(cudaErrorNotSupported)

/* No peer access between the double's devices. */
cudaError_t CUDARTAPI cudaDeviceCanAccessPeer(int *can, int device, int peer)
{
    if (!can)
        return cuda_double_fail(cudaErrorInvalidValue);
    *can = 0;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceEnablePeerAccess(int peer, unsigned int flags) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaMemcpyPeerAsync(void *dst, int dd, const void *src, int sd, size_t n,
                                          cudaStream_t s) { return NOT_SUPPORTED; }

/* Memory the double does not model: stream-ordered pools, managed memory,
 * registered host memory, symbols in device code; and no memory limit to report. */
cudaError_t CUDARTAPI cudaMallocAsync(void **p, size_t n, cudaStream_t s) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaFreeAsync(void *p, cudaStream_t s) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr a, void *v) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr a, void *v) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaMemPoolSetAccess(cudaMemPool_t pool, const struct cudaMemAccessDesc *d,
                                           size_t n) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaMallocManaged(void **p, size_t n, unsigned int flags) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaHostRegister(void *p, size_t n, unsigned int flags) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaHostUnregister(void *p) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaMemGetInfo(size_t *free_bytes, size_t *total) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaGetSymbolAddress(void **p, const void *symbol) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaMemcpyToSymbol(const void *symbol, const void *src, size_t n, size_t off,
                                         enum cudaMemcpyKind kind) { return NOT_SUPPORTED; }

/* Kernels' attributes and occupancy, and loaded libraries of device code. */
cudaError_t CUDARTAPI cudaFuncGetAttributes(struct cudaFuncAttributes *a, const void *fn) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaFuncSetAttribute(const void *fn, enum cudaFuncAttribute a, int v) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaKernelSetAttributeForDevice(cudaKernel_t k, enum cudaFuncAttribute a,
                                                      int v, int device) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *fn, int bs,
                                                                    size_t shared) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int *n, const void *fn, int bs, size_t shared, unsigned int flags) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaLibraryLoadData(cudaLibrary_t *lib, const void *code, enum cudaJitOption *o,
                                          void **ov, unsigned int no, enum cudaLibraryOption *lo,
                                          void **lov, unsigned int nlo) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaLibraryLoadFromFile(cudaLibrary_t *lib, const char *file,
                                              enum cudaJitOption *o, void **ov, unsigned int no,
                                              enum cudaLibraryOption *lo, void **lov,
                                              unsigned int nlo) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaLibraryUnload(cudaLibrary_t lib) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaLibraryGetKernel(cudaKernel_t *k, cudaLibrary_t lib, const char *name) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaLibraryGetKernelCount(unsigned int *n, cudaLibrary_t lib) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaLibraryGetGlobal(void **p, size_t *n, cudaLibrary_t lib, const char *name) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaLibraryGetManaged(void **p, size_t *n, cudaLibrary_t lib, const char *name) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaLibraryGetUnifiedFunction(void **fn, cudaLibrary_t lib, const char *name) { return NOT_SUPPORTED; }

/* Event IPC handles (README.md: not yet), the old callback form of host
 * functions, the profiler. */
cudaError_t CUDARTAPI cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t ev) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaIpcOpenEventHandle(cudaEvent_t *ev, cudaIpcEventHandle_t h) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaStreamAddCallback(cudaStream_t s, cudaStreamCallback_t fn, void *user,
                                            unsigned int flags) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaProfilerStart(void) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaProfilerStop(void) { return NOT_SUPPORTED; }

/* Graphs and stream capture. Asking for the capture mode is allowed (torch
 * does around allocations); nothing can begin a capture. */
cudaError_t CUDARTAPI cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    static __thread enum cudaStreamCaptureMode current = cudaStreamCaptureModeGlobal;
    if (!mode)
        return cuda_double_fail(cudaErrorInvalidValue);
    enum cudaStreamCaptureMode was = current;
    current = *mode;
    *mode = was;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaStreamBeginCaptureToGraph(cudaStream_t s, cudaGraph_t g,
                                                    const cudaGraphNode_t *deps,
                                                    const cudaGraphEdgeData *data, size_t n,
                                                    enum cudaStreamCaptureMode m) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaStreamUpdateCaptureDependencies(cudaStream_t s, cudaGraphNode_t *deps,
                                                          const cudaGraphEdgeData *data, size_t n,
                                                          unsigned int flags) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaGraphAddNode(cudaGraphNode_t *node, cudaGraph_t g, const cudaGraphNode_t *deps,
                                       const cudaGraphEdgeData *data, size_t n,
                                       struct cudaGraphNodeParams *params) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaGraphConditionalHandleCreate(cudaGraphConditionalHandle *h, cudaGraph_t g,
                                                       unsigned int v, unsigned int flags) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaGraphDestroy(cudaGraph_t g) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaGraphExecDestroy(cudaGraphExec_t g) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *n) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaGraphInstantiateWithFlags(cudaGraphExec_t *e, cudaGraph_t g,
                                                    unsigned long long flags) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaGraphNodeGetDependencies(cudaGraphNode_t node, cudaGraphNode_t *deps,
                                                   cudaGraphEdgeData *data, size_t *n) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaGraphRetainUserObject(cudaGraph_t g, cudaUserObject_t o, unsigned int count,
                                                unsigned int flags) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaDeviceGetGraphMemAttribute(int device, enum cudaGraphMemAttributeType a,
                                                     void *v) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaDeviceSetGraphMemAttribute(int device, enum cudaGraphMemAttributeType a,
                                                     void *v) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaUserObjectCreate(cudaUserObject_t *o, void *p, cudaHostFn_t destroy,
                                           unsigned int refs, unsigned int flags) { return NOT_SUPPORTED; }
cudaError_t CUDARTAPI cudaUserObjectRelease(cudaUserObject_t o, unsigned int count) { return NOT_SUPPORTED; }

/* Modules, linking, launches and tensor maps of the driver: no device code. */
#define NO_DEVICE_CODE CUDA_ERROR_NOT_SUPPORTED

CUresult CUDAAPI cuModuleLoad(CUmodule *m, const char *file) { return NO_DEVICE_CODE; }
CUresult CUDAAPI cuModuleLoadData(CUmodule *m, const void *image) { return NO_DEVICE_CODE; }
CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, CUjit_option *o,
                                    void **ov) { return NO_DEVICE_CODE; }
CUresult CUDAAPI cuModuleUnload(CUmodule m) { return NO_DEVICE_CODE; }
CUresult CUDAAPI cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) { return NO_DEVICE_CODE; }
CUresult CUDAAPI cuLinkCreate(unsigned int n, CUjit_option *o, void **ov, CUlinkState *state) { return NO_DEVICE_CODE; }
CUresult CUDAAPI cuLinkAddData(CUlinkState state, CUjitInputType type, void *data, size_t size,
                               const char *name, unsigned int n, CUjit_option *o, void **ov) { return NO_DEVICE_CODE; }
CUresult CUDAAPI cuLinkComplete(CUlinkState state, void **cubin, size_t *size) { return NO_DEVICE_CODE; }
CUresult CUDAAPI cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) { return NO_DEVICE_CODE; }
CUresult CUDAAPI cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) { return NO_DEVICE_CODE; }
CUresult CUDAAPI cuFuncSetCacheConfig(CUfunction f, CUfunc_cache c) { return NO_DEVICE_CODE; }
CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int bs,
                                                             size_t shared) { return NO_DEVICE_CODE; }
CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                                CUstream s, void **params, void **extra) { return NO_DEVICE_CODE; }
CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                           unsigned int gz, unsigned int bx, unsigned int by,
                                           unsigned int bz, unsigned int shared, CUstream s,
                                           void **params) { return NO_DEVICE_CODE; }
CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank,
                                        void *addr, const cuuint64_t *dims, const cuuint64_t *strides,
                                        const cuuint32_t *box, const cuuint32_t *estrides,
                                        CUtensorMapInterleave il, CUtensorMapSwizzle sw,
                                        CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) { return NO_DEVICE_CODE; }
