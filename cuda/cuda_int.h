/* cuda_int.h - the GPU side of Loom as the tests see it; the core sees only its
 * accelerator table, loom_accel_cuda (src/accel.h).
 *
 * Three layers, so that as much as possible runs without a GPU:
 *  - kernels.cu: the reduction kernels (nvcc), element code shared with the CPU
 *    path through base/reduce_ops.h;
 *  - staging.c: every collective on device buffers, written against a small
 *    table of device operations (loom_dev_ops_t) and a "run this collective on
 *    host buffers" callback;
 *  - device.c / stream.c: the CUDA backend of that table, the per-communicator
 *    state (staging buffers, stream, stream-ordered worker), the accelerator
 *    table the core calls (device.c) and loom_cuda.h (stream.c, a layer above
 *    the core: its stream worker calls the public collectives).
 * Without a GPU the tests run all of it over the CUDA double
 * (tests/cuda-double/), where the host cannot touch device memory.
 */
#ifndef LOOM_CUDA_INT_H
#define LOOM_CUDA_INT_H

#include <stddef.h>
#include "src/accel.h"
#include "base/coll_kind.h"
#include "base/error.h"
#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- kernels.cu ------------------------------------------------------------
 * Queued on stream (a cudaStream_t); return a cudaError_t (0: launched).
 * out[i] = a[i] (op) b[i] for i < count, out may equal a or b; LOOM_AVG reduces
 * as LOOM_SUM (loom_cuda_avg divides once at the end, as the CPU path does). */
int loom_cuda_reduce3(void *out, const void *a, const void *b, size_t count, loom_dtype_t dt,
                      loom_op_t op, void *stream);
/* buf[i] = buf[i] / nranks in the element type. */
int loom_cuda_avg(void *buf, size_t count, loom_dtype_t dt, int nranks, void *stream);

/* ---- staging.c ------------------------------------------------------------ */

/* Device operations, queued in order on two queues that run side by side, as
 * a GPU's copy engines do: LOOM_DEV_DOWN for copies to the host, LOOM_DEV_UP
 * for copies to the device and the kernels (reduce3, avg). copy2d copies
 * height rows of width bytes between any two memories. mark puts a numbered
 * marker (0 <= slot < LOOM_STAGING_MARKS) behind what is queued on q; order
 * makes q run what comes next only after the work before the latest marker
 * of slot; wait returns once that work is done, sync once all of it is. */
enum { LOOM_DEV_DOWN, LOOM_DEV_UP };

typedef struct loom_dev_ops {
    size_t size;
    loom_status_t (*copy2d)(void *arg, int q, void *dst, size_t dpitch, const void *src,
                            size_t spitch, size_t width, size_t height, loom_err_t *err);
    loom_status_t (*reduce3)(void *arg, void *out, const void *a, const void *b, size_t count,
                             loom_dtype_t dt, loom_op_t op, loom_err_t *err);
    loom_status_t (*avg)(void *arg, void *buf, size_t count, loom_dtype_t dt, int nranks,
                         loom_err_t *err);
    loom_status_t (*sync)(void *arg, loom_err_t *err);
    loom_status_t (*mark)(void *arg, int q, int slot, loom_err_t *err);
    loom_status_t (*order)(void *arg, int q, int slot, loom_err_t *err);
    loom_status_t (*wait)(void *arg, int slot, loom_err_t *err);
} loom_dev_ops_t;

/* Passes in flight at once when they overlap: the copies down of the next
 * pass, the host collective of this one, the copies up of the one before.
 * Each has its own pair of host buffers and four markers: one per device
 * stage (at most three: before, between and after the host collectives of a
 * pass) and one inside the stage between. */
#define LOOM_STAGING_SETS 3
#define LOOM_STAGING_MARKS (4 * LOOM_STAGING_SETS)

typedef struct loom_staging_set {
    char *send, *recv;   /* host memory, chunk_bytes each */
} loom_staging_set_t;

/* One collective on device buffers: every buffer of args is device memory, moved
 * through the host buffers of sets (pinned in the CUDA backend) in passes of
 * at most chunk_bytes; each pass runs ordinary host collectives through
 * run_host. Reductions run on the device, in dev_scratch (chunk_bytes):
 * a reducing collective is a reduce-scatter (alltoall of blocks, then the
 * device reduces the size copies of its block in rank order) followed by an
 * allgatherv (allreduce), a copy at the root (reduce) or nothing (reduce_scatter).
 * overlap: the device copies of neighbouring passes run while a pass's host
 * collective does (0: each device stage is waited for at once). Every rank
 * must pass the same chunk_bytes, at least 16 * size; overlap may differ, the
 * host collectives come in the same order either way. */
typedef struct loom_staging {
    int rank, size;
    loom_err_t *err;
    loom_status_t (*run_host)(void *arg, const loom_coll_args_t *a);
    void *host_arg;
    const loom_dev_ops_t *dev;
    void *dev_arg;
    loom_staging_set_t sets[LOOM_STAGING_SETS];
    char *dev_scratch;
    size_t chunk_bytes;
    int overlap;
} loom_staging_t;

loom_status_t loom_staging_run(const loom_staging_t *s, const loom_coll_args_t *a);

/* ---- device.c: the accelerator table (src/accel.h) -------------------------- */

/* Buffer classification (the table's coll_memory and ptr_memory), with the
 * CUDA driver's pointer attributes: pinned and managed memory count as host,
 * the CPU can read them directly. */
loom_status_t loom_cuda_args_on_device(const loom_coll_args_t *a, int nranks, int rank,
                                       int *on_device, int *device, loom_err_t *err);
int loom_cuda_ptr_on_device(const void *p, int *device);

/* Staging through the communicator's pinned buffers, device reductions,
 * stream-ordered calls stopped at destroy and their state freed. */
extern const loom_accel_ops_t loom_accel_cuda;

#ifdef __cplusplus
}
#endif
#endif
