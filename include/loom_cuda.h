/*
 * loom_cuda.h - GPU buffers: stream-ordered collectives and the device a
 * communicator works on. Installed by builds configured with CUDA.
 *
 * Device memory with the ordinary calls (loom.h): every collective accepts
 * buffers in GPU memory (cudaMalloc, cudaMallocAsync pools); the call reads them
 * after the work already queued on the legacy default stream, and returns once
 * the results are in place. Pinned and managed memory count as host memory. One
 * call takes all host or all GPU buffers (mixing is LOOM_ERR_INVALID_ARG), and
 * every rank of a call must pass the same kind, since the two kinds move in
 * different passes. Non-blocking point-to-point (loom_isend, loom_irecv) on GPU
 * buffers goes GPU to network with GPUDirect RDMA (LOOM_NET_GDR, docs/gpu.md),
 * after the work queued on the legacy default stream; without it, it is
 * LOOM_ERR_UNSUPPORTED: use loom_send/loom_recv or the _stream forms.
 * Non-blocking collectives (loom_iallreduce...) on GPU buffers read them when
 * they run, on the communicator's worker, without waiting for any stream:
 * synchronize the stream that produced the inputs before the call.
 *
 * Data path: slices of at most LOOM_CUDA_CHUNK_BYTES (default 4 MiB, the same on
 * every rank) are copied through pinned host buffers, moved by the host
 * algorithms, and copied back; reductions run on the GPU, in Loom's kernels.
 *
 * Stream-ordered calls (loom_X_stream): the call returns at once; the collective
 * starts when the work queued on stream before it has finished, and work queued
 * on stream after it waits until it is done, as with NCCL. Arguments are
 * checked by the call; a failure that happens later, while it runs, is kept and
 * returned by loom_comm_stream_status and by the next _stream call on the
 * communicator. Count and displacement arrays are copied by the call. Every
 * rank must issue its calls on a communicator in the same order; a
 * communicator's stream-ordered calls run in the order they were made, but
 * apart from the calls that do not take a stream: synchronize the stream
 * before making one of those on the same communicator. Before
 * loom_comm_destroy, synchronize the streams: calls the streams have not
 * reached by then fail with LOOM_ERR_ABORTED.
 */
#ifndef LOOM_CUDA_H
#define LOOM_CUDA_H

#include <cuda_runtime_api.h>
#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Make c work on this CUDA device: allocates its staging buffers (pinned host
 *  and device memory) now. Optional: otherwise the device of the first GPU
 *  buffers, or the caller's current device for a first _stream call. A
 *  communicator stays on one device: another one is LOOM_ERR_INVALID_ARG. */
LOOM_API loom_status_t loom_comm_set_device(loom_comm_t c, int device);

/** The first failure of a stream-ordered call on c since it was created
 *  (LOOM_SUCCESS if none); its message goes to loom_comm_last_error. */
LOOM_API loom_status_t loom_comm_stream_status(loom_comm_t c);

LOOM_API loom_status_t loom_allreduce_stream(const void *sendbuf, void *recvbuf, size_t count,
                                             loom_dtype_t dt, loom_op_t op, loom_comm_t c,
                                             cudaStream_t stream);
LOOM_API loom_status_t loom_broadcast_stream(void *buf, size_t count, loom_dtype_t dt, int root,
                                             loom_comm_t c, cudaStream_t stream);
LOOM_API loom_status_t loom_reduce_stream(const void *sendbuf, void *recvbuf, size_t count,
                                          loom_dtype_t dt, loom_op_t op, int root, loom_comm_t c,
                                          cudaStream_t stream);
LOOM_API loom_status_t loom_allgather_stream(const void *sendbuf, void *recvbuf, size_t sendcount,
                                             loom_dtype_t dt, loom_comm_t c, cudaStream_t stream);
LOOM_API loom_status_t loom_allgatherv_stream(const void *sendbuf, size_t sendcount, void *recvbuf,
                                              const size_t *recvcounts, const size_t *displs,
                                              loom_dtype_t dt, loom_comm_t c, cudaStream_t stream);
LOOM_API loom_status_t loom_reduce_scatter_stream(const void *sendbuf, void *recvbuf,
                                                  size_t recvcount, loom_dtype_t dt, loom_op_t op,
                                                  loom_comm_t c, cudaStream_t stream);
LOOM_API loom_status_t loom_alltoall_stream(const void *sendbuf, void *recvbuf, size_t count,
                                            loom_dtype_t dt, loom_comm_t c, cudaStream_t stream);
LOOM_API loom_status_t loom_alltoallv_stream(const void *sendbuf, const size_t *sendcounts,
                                             const size_t *sdispls, void *recvbuf,
                                             const size_t *recvcounts, const size_t *rdispls,
                                             loom_dtype_t dt, loom_comm_t c, cudaStream_t stream);
LOOM_API loom_status_t loom_gather_stream(const void *sendbuf, void *recvbuf, size_t sendcount,
                                          loom_dtype_t dt, int root, loom_comm_t c,
                                          cudaStream_t stream);
LOOM_API loom_status_t loom_scatter_stream(const void *sendbuf, void *recvbuf, size_t recvcount,
                                           loom_dtype_t dt, int root, loom_comm_t c,
                                           cudaStream_t stream);
LOOM_API loom_status_t loom_barrier_stream(loom_comm_t c, cudaStream_t stream);
LOOM_API loom_status_t loom_send_stream(const void *buf, size_t count, loom_dtype_t dt, int peer,
                                        int tag, loom_comm_t c, cudaStream_t stream);
LOOM_API loom_status_t loom_recv_stream(void *buf, size_t count, loom_dtype_t dt, int peer,
                                        int tag, loom_comm_t c, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_CUDA_H */
