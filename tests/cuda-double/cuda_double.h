/* cuda_double.h - what the CUDA test double offers beyond the CUDA API it
 * serves (tests/cuda-double/README.md): the stand-ins of Loom's reduction
 * kernels launch through it, and tests read its counters. */
#ifndef LOOM_CUDA_DOUBLE_H
#define LOOM_CUDA_DOUBLE_H

#include <stddef.h>
#include <cuda_runtime_api.h>

/* The double's own view of device memory: the writable mapping of the pages
 * whose PROT_NONE alias [p, p + len) is, or p itself for pinned host memory
 * (a kernel may read that over the bus). NULL for anything else: pageable host
 * memory, a range that runs past its allocation, freed memory. */
void *cuda_double_reach(const void *p, size_t len);

/* Queue fn(arg) on stream as a kernel: in stream order, on the stream's worker
 * thread; arg (arg_bytes) is copied at launch, as kernel arguments are. */
cudaError_t cuda_double_launch(cudaStream_t stream, void (*fn)(void *arg), const void *arg,
                               size_t arg_bytes);

/* Make the context fail as a faulting kernel does on hardware: every later call
 * returns e (a sticky error). Kernels call it for a bad operand. */
void cuda_double_fault(cudaError_t e, const char *why);

/* What the double has done in this process: copies by direction (bytes and
 * calls; device memory opened from an IPC handle counts as device), kernels
 * run, IPC handles opened and closed, dma-bufs exported. */
typedef struct cuda_double_counts {
    long h2d, d2h, d2d, h2h;                 /* copies */
    long long h2d_bytes, d2h_bytes, d2d_bytes;
    long kernels;
    long ipc_opens, ipc_closes;
    long dmabuf_exports;                     /* cuMemGetHandleForAddressRange */
    long allocs, frees;                      /* cudaMalloc, cudaFree of device memory */
} cuda_double_counts_t;
void cuda_double_counts(cuda_double_counts_t *out);

/* cudaMalloc at exactly at (page-aligned, not mapped now), for tests: an
 * allocation freed and made again at the same address, as a caching or
 * pool allocator makes it on hardware. cudaErrorMemoryAllocation when at is
 * taken. */
cudaError_t cuda_double_malloc_at(void **out, size_t size, void *at);

/* The offset in the allocation's memfd where the dma-buf fd of
 * cuMemGetHandleForAddressRange begins (its offset 0), or -1 for a descriptor
 * that was never handed out as one; the libibverbs double looks it up. */
long long cuda_double_dmabuf_offset(int fd);

/* on: queued work runs only once the host waits for something (a synchronize,
 * a blocking copy, a query, cudaFree), and then everything queued before the
 * wait may run, so work that the host uses without waiting for it has
 * certainly not happened (a read sees the old bytes, a write races ahead of
 * the copy that should have read first). Only for code that waits through
 * CUDA alone: a host function that some thread waits for by other means never
 * runs. off (the default): work runs as soon as its stream gets to it. */
void cuda_double_set_lazy(int on);

/* Record e as the calling thread's last error (cudaGetLastError) and return
 * it: for the calls the double answers only with an error (torch_face.c). */
cudaError_t cuda_double_fail(cudaError_t e);

/* Whether this process has started CUDA (made a runtime call): its primary
 * context is active, in the driver's terms. */
int cuda_double_started(void);

#endif
