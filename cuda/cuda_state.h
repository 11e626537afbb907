/* cuda_state.h - what a communicator holds for GPU buffers (device.c, stream.c). */
#ifndef LOOM_CUDA_STATE_H
#define LOOM_CUDA_STATE_H

#include <pthread.h>
#include <cuda_runtime_api.h>

#include "cuda_int.h"

typedef struct loom_cuda_job loom_cuda_job_t;

typedef struct loom_cuda_state {
    struct loom_cuda_state *next;     /* in the registry */
    loom_comm_t comm;
    int device;
    cudaStream_t stream;              /* staging copies up and kernels; non-blocking */
    cudaStream_t down;                /* staging copies down; non-blocking */
    cudaStream_t p2p_stream;          /* blocking send/recv copies, which may run
                                         beside a queued collective */
    cudaEvent_t done;                 /* blocking-sync: waiting on it sleeps */
    cudaEvent_t legacy_ready;         /* plain calls: after the legacy stream's work */
    cudaEvent_t marks[LOOM_STAGING_MARKS];   /* the staging markers; blocking-sync */
    char *pinned;                     /* the host buffers of the staging sets */
    loom_staging_set_t sets[LOOM_STAGING_SETS];   /* chunk_bytes each, in pinned */
    char *dev_scratch;                /* chunk_bytes */
    size_t chunk_bytes;
    int overlap;                      /* LOOM_CUDA_OVERLAP */
    int ipc;                          /* LOOM_CUDA_IPC, and the ranks share a node */
    struct loom_cuda_peer *peers;     /* IPC: peers' allocations this one holds (ipc.c) */
    int npeers;
    struct loom_cuda_retired *retired;   /* IPC: held no longer, to close */
    unsigned long calls;              /* IPC: collectives run, to age the peers */
    unsigned char logged[LOOM_COLL_COUNT];   /* paths named in the log: 1 IPC, 2 staged, 4 GDR,
                                                8 hierarchical */
    int gdr;                          /* GPUDirect RDMA (gdr.c): 0 not asked yet, 1 direct,
                                         2 staged, 3 insisted on but impossible */
    int gdr_cross;                    /* the same between nodes only (the hierarchical path) */
    /* The hierarchical path (ipc.c): LOOM_CUDA_IPC and several nodes of the
     * same number > 1 of ranks; hier holds the views (hierarchy.c). */
    int hier_ok;
    loom_hier_t hier;
    char *gdr_acc;                    /* GPUDirect reduce and reduce_scatter's accumulator,
                                         grown to the largest call, kept until destroy */
    size_t gdr_acc_bytes;

    /* The stream-ordered worker (stream.c), under lock. */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    loom_cuda_job_t *head, *tail;
    int worker_started, stopping;
    pthread_t worker;
    loom_status_t async_status;       /* first failure of a stream-ordered call */
    char async_msg[LOOM_ERRMSG_MAX];
} loom_cuda_state_t;

/* The state of c, created on device (its buffers allocated now) when c has
 * none; LOOM_ERR_INVALID_ARG when c already works on another device. */
loom_status_t loom_cuda_state_get(loom_comm_t c, int device, loom_cuda_state_t **out,
                                  loom_err_t *err);
/* The state of c if it has one. */
loom_cuda_state_t *loom_cuda_state_find(loom_comm_t c);

/* Set on the stream-ordered worker threads: their collectives are already
 * ordered after the user's stream, and must not wait on the legacy stream,
 * which may be the very stream blocked until they finish. */
extern __thread int loom_cuda_on_stream_worker;

/* stream.c: stop the worker of st (pending jobs fail with LOOM_ERR_ABORTED). */
void loom_cuda_stream_stop(loom_cuda_state_t *st);

/* The device operations staging.c runs on (arg: a state; its stream, done
 * event and marks). */
extern const loom_dev_ops_t loom_cuda_dev_ops;

/* ipc.c: collectives GPU to GPU inside one node. Whether a collective goes
 * that way depends only on what every rank shares (the setting, the node
 * count, the collective); loom_cuda_ipc_run then agrees with the other ranks
 * whether every buffer could be shared and returns *done = 0, with nothing
 * touched, when some could not (the caller stages instead). may_wait: a plain
 * call, which may wait for the whole device (to close handles it let go). */
int loom_cuda_ipc_covers(const loom_cuda_state_t *st, const loom_coll_args_t *a);
/* alltoall(v) with the output over the input: neither the IPC nor the
 * GPUDirect path moves it (each would overwrite blocks peers still read). */
static inline int loom_cuda_alltoall_in_place(const loom_coll_args_t *a)
{
    return (a->coll == LOOM_COLL_ALLTOALL || a->coll == LOOM_COLL_ALLTOALLV) &&
           a->sendbuf == a->recvbuf;
}
loom_status_t loom_cuda_ipc_run(loom_cuda_state_t *st, const loom_coll_args_t *a,
                                loom_accel_host_coll_fn run_host, void *host_arg, int may_wait,
                                int *done, loom_err_t *err);
/* The hierarchical allreduce, reduce_scatter, allgather, reduce and
 * broadcast (st->hier_ok, GPUDirect RDMA agreed between nodes): a
 * reduce-scatter over CUDA IPC inside each node, each block reduced by
 * GPUDirect RDMA with the ranks of the same local index on the other nodes,
 * then (allreduce) an allgather over IPC inside each node or (reduce) the
 * root's node's blocks copied into the root's output; allgather and
 * broadcast: between nodes first, then inside.
 * *done as for loom_cuda_ipc_run: 0 when some rank could not share a
 * buffer (all stage). */
loom_status_t loom_cuda_ipc_hier_run(loom_cuda_state_t *st, const loom_coll_args_t *a,
                                     loom_accel_host_coll_fn run_host, void *host_arg,
                                     int may_wait, int *done, loom_err_t *err);
/* Closes the peers' allocations st opened (at destroy, nothing queued). */
void loom_cuda_ipc_release(loom_cuda_state_t *st);

/* gdr.c: collectives moved GPU to network by the transport (GPUDirect RDMA).
 * covers: the collective can go that way; decide: whether it does, agreed by
 * every rank once per communicator (a host allreduce through run_host at the
 * first call); run: the collective, all buffers device memory. devmem: the
 * dma-buf export the transports are given (src/accel.h). */
int loom_cuda_gdr_covers(const loom_coll_args_t *a);
loom_status_t loom_cuda_gdr_decide(loom_cuda_state_t *st, loom_accel_host_coll_fn run_host,
                                   void *host_arg, int *direct, loom_err_t *err);
loom_status_t loom_cuda_gdr_run(loom_cuda_state_t *st, const loom_coll_args_t *a,
                                loom_err_t *err);
/* decide for the peers on other nodes only (st->hier.cross), for the
 * hierarchical path; kept in st->gdr_cross. */
loom_status_t loom_cuda_gdr_decide_cross(loom_cuda_state_t *st, loom_accel_host_coll_fn run_host,
                                         void *host_arg, int *direct, loom_err_t *err);
/* The ring allreduce or reduce of a (sendbuf == recvbuf, op not LOOM_AVG:
 * the caller divides; a reduce's recvbuf the accumulator, its root an index
 * in ranks[]), or the allgather (each piece where its communicator rank's
 * goes) or broadcast (root an index in ranks[]) of a, among the P
 * communicator ranks of ranks[], we being index me.
 * Every rank of the communicator calls it for the same collective, those
 * with a->count 0 too. */
loom_status_t loom_cuda_gdr_run_group(loom_cuda_state_t *st, const loom_coll_args_t *a,
                                      const int *ranks, int P, int me, loom_err_t *err);
/* The communicator's GPUDirect accumulator (st->gdr_acc), grown to at least
 * bytes; NULL when it cannot be (the message is in err). */
char *loom_cuda_gdr_accumulator(loom_cuda_state_t *st, size_t bytes, loom_err_t *err);
/* The ring reduce_scatter among the P ranks of ranks[] of the P blocks of
 * a->count elements the caller put into the accumulator (in ring order; op
 * not LOOM_AVG): afterwards block me of it holds the result. Called as
 * loom_cuda_gdr_run_group. */
loom_status_t loom_cuda_gdr_reduce_scatter_group(loom_cuda_state_t *st,
                                                 const loom_coll_args_t *a, const int *ranks,
                                                 int P, int me, loom_err_t *err);
extern const loom_tp_devmem_t loom_cuda_devmem;
/* The accelerator table's device_ready: blocking send/recv over GPUDirect RDMA. */
loom_status_t loom_cuda_device_ready(loom_comm_t c, int device, loom_err_t *err);

/* device.c: *v becomes the least of every rank's *v (a host allreduce through
 * run_host): how the ranks agree on a path. */
loom_status_t loom_cuda_agree_min(loom_accel_host_coll_fn run_host, void *host_arg, int32_t *v);

/* device.c: a symbol of the CUDA driver the process has loaded (never loaded
 * here), or NULL. */
void *loom_cuda_driver_sym(const char *name);

/* device.c: the start of the allocation holding device pointer p (driver
 * attributes), or NULL. */
void *loom_cuda_alloc_base(const void *p);

/* A CUDA error as a Loom status with a message naming the call. */
loom_status_t loom_cuda_fail(loom_err_t *err, cudaError_t e, const char *what);

#endif
