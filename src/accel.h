/* accel.h - what the core asks of an accelerator (memory a CPU cannot read
 * directly), as one table of operations.
 *
 * The core (coll.c, comm.c) calls only through this table and includes no
 * accelerator header. The build picks the table: configure sets
 * LOOM_ACCEL_TABLE to loom_accel_cuda (cuda/device.c) in a CUDA build and to
 * loom_accel_null (accel.c: everything is host memory) otherwise, as Open
 * MPI's accelerator framework picks one component and UCC's mc layer one
 * memory type per buffer. A ROCm backend would be one more table.
 *
 * The accelerator sits beside the core, not below the algorithms: a
 * collective on device buffers is staged through host memory and runs
 * ordinary host collectives through the core's executor (run_host), so the
 * algorithms and transports never see device memory.
 */
#ifndef LOOM_ACCEL_H
#define LOOM_ACCEL_H

#include <stddef.h>
#include <stdint.h>
#include "base/coll_kind.h"
#include "base/error.h"
#include "base/settings.h"
#include "algorithms/algorithms.h"
#include "transports/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The settings a communicator was made with, for the layers above the core
 * (cuda/) that may not see struct loom_comm. */
const loom_settings_t *loom_comm_settings(loom_comm_t c);

/* GPUDirect RDMA (cuda/gdr.c): whether every peer of c among the npeers ranks
 * of peers (NULL: every rank; c's own rank is skipped) is reached by a
 * transport that moves GPU memory itself: 1 yes, 0 no, -1 LOOM_NET_GDR=1
 * insists but some peer cannot; why gets one line. A list lets the
 * hierarchical GPU path ask about its peers on other nodes only: those of its
 * own node are reached by CUDA IPC, whatever transport the host uses. */
int loom_comm_gdr(loom_comm_t c, const int *peers, int npeers, char *why, size_t whylen);
/* The two-level views of c's ranks (algorithms/hierarchy.c), so the GPU path
 * splits a communicator exactly as the host hierarchical algorithms do:
 * loom_hier_init's result (1 ready, free with loom_hier_free; 0 not several
 * nodes of the same number > 1 of ranks; -1 out of memory). */
int loom_comm_hier(loom_comm_t c, loom_hier_t *h);
/* One transfer of GPU memory between this rank and peer. */
typedef struct loom_dev_xfer {
    int peer, is_send;
    void *buf;
    size_t bytes;
} loom_dev_xfer_t;
/* A collective on GPU memory moved by the transport: begin gives it the next
 * sequence number and descriptor as the host executor would (every rank calls
 * it for the same collectives in the same order); p2p posts the n transfers
 * with tag step, the buffers as GPU memory, and waits for all of them. */
void loom_comm_dev_begin(loom_comm_t c, const loom_coll_args_t *a);
loom_status_t loom_comm_dev_p2p(loom_comm_t c, uint32_t step, const loom_dev_xfer_t *x, int n);
/* The same in two halves, for pipelines: post fills reqs[0..n) (kept in place
 * until waited for; on failure the communicator is broken and what was posted
 * fails), wait waits for all n. */
loom_status_t loom_comm_dev_post(loom_comm_t c, uint32_t step, const loom_dev_xfer_t *x, int n,
                                 loom_tp_req_t *reqs);
loom_status_t loom_comm_dev_wait(loom_comm_t c, loom_tp_req_t *reqs, int n);

/* Runs a collective on host buffers for the accelerator (the core's executor:
 * algorithm selection, then the algorithm, on the calling thread). */
typedef loom_status_t (*loom_accel_host_coll_fn)(void *arg, const loom_coll_args_t *a);
/* Runs a blocking send or receive on the host buffer hbuf. */
typedef loom_status_t (*loom_accel_host_p2p_fn)(void *hbuf, void *arg);

typedef struct loom_accel_ops {
    size_t size;              /* sizeof(loom_accel_ops_t): the table may grow */
    const char *name;         /* "null", "cuda" */

    /* Where the buffers of a collective live: *on_device 0 (host memory) or 1
     * (then *device names the device); LOOM_ERR_INVALID_ARG (message in err)
     * when host and device buffers are mixed or sit on different devices. Only
     * the buffers this rank reads or writes count. Memory the CPU can read
     * directly (pinned, managed) is host memory. Called at submission, so a bad
     * mix fails the call itself, and again where the collective runs. */
    loom_status_t (*coll_memory)(const loom_coll_args_t *a, int nranks, int rank,
                                 int *on_device, int *device, loom_err_t *err);
    /* The same for one buffer (point-to-point): 1 and *device for device memory. */
    int (*ptr_memory)(const void *p, int *device);

    /* Run a collective whose buffers are on device (coll_memory said so),
     * staged through host memory in passes that each call run_host. Called
     * where the core would run the host algorithm, so one at a time per
     * communicator; on_comm_worker: from the communicator's worker thread (a
     * queued call), which must not wait for the caller's device work. */
    loom_status_t (*run_coll)(loom_comm_t c, int device, const loom_coll_args_t *a,
                              int on_comm_worker, loom_accel_host_coll_fn run_host,
                              void *host_arg, loom_err_t *err);
    /* A blocking send (is_send) or receive of bytes at device buffer dbuf,
     * copied through a host buffer that host() sends or receives. */
    loom_status_t (*run_p2p)(loom_comm_t c, int device, int is_send, void *dbuf, size_t bytes,
                             loom_accel_host_p2p_fn host, void *arg, loom_err_t *err);

    /* loom_comm_destroy, in this order around stopping the core's worker:
     * quiesce stops what the accelerator itself queues on c (stream-ordered
     * calls); release frees what it holds for c once nothing runs on c. */
    void (*comm_quiesce)(loom_comm_t c);
    void (*comm_release)(loom_comm_t c);

    /* loom-info: what is built and the devices this process sees. */
    void (*describe)(char *out, size_t len);

    /* GPU memory for the transports (GPUDirect RDMA), or NULL. */
    const loom_tp_devmem_t *devmem;
    /* Before a send/recv (blocking or not) hands device memory to the
     * transport (GPUDirect RDMA): wait for the device work queued before the
     * call, as run_p2p's copies would; NULL: such calls are always staged
     * (and the non-blocking ones refused). */
    loom_status_t (*device_ready)(loom_comm_t c, int device, loom_err_t *err);
} loom_accel_ops_t;

/* The table of this build (configure's LOOM_ACCEL_TABLE). */
extern const loom_accel_ops_t *const loom_accel;

/* Host memory only: every buffer is host memory, nothing to stage or free. */
extern const loom_accel_ops_t loom_accel_null;

#ifdef __cplusplus
}
#endif
#endif
