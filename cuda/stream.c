/* stream.c - the stream-ordered calls of loom_cuda.h.
 *
 * A call records an event on the caller's stream (its inputs are ready when the
 * event completes), queues a job for the communicator's stream worker, and
 * queues on the stream a host function that returns once the job is done, so
 * later work on the stream sees the results. The worker thread takes jobs in
 * call order, sleeps in cudaEventSynchronize on a blocking-sync event (it never
 * spins on the stream), then runs the ordinary blocking collective on the
 * device buffers (device.c, staging.c).
 *
 * The host function only waits for the worker; it makes no CUDA call, and the
 * worker's own GPU work runs on non-blocking streams and never waits on the
 * legacy stream, so a stream held by the host function cannot block the job it
 * waits for. A job and its host function share the job: whichever finishes
 * last frees it, so a communicator may be destroyed while a stream has not yet
 * reached the host function.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_state.h"
#include "loom_cuda.h"
#include "base/types.h"

typedef enum {
    JOB_ALLREDUCE, JOB_BROADCAST, JOB_REDUCE, JOB_ALLGATHER, JOB_ALLGATHERV,
    JOB_REDUCE_SCATTER, JOB_ALLTOALL, JOB_ALLTOALLV, JOB_GATHER, JOB_SCATTER, JOB_BARRIER,
    JOB_SEND, JOB_RECV
} job_kind_t;

struct loom_cuda_job {
    struct loom_cuda_job *next;
    job_kind_t kind;
    loom_comm_t comm;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    loom_dtype_t dt;
    loom_op_t op;
    int root, peer, tag;
    size_t *arrays;            /* copies of the count/displacement arrays */
    cudaEvent_t ready;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;
    _Atomic int refs;          /* the worker and the host function */
};

static void job_free(loom_cuda_job_t *job)
{
    pthread_cond_destroy(&job->cond);
    pthread_mutex_destroy(&job->lock);
    free(job->arrays);
    free(job);
}

static void job_unref(loom_cuda_job_t *job)
{
    if (atomic_fetch_sub(&job->refs, 1) == 1)
        job_free(job);
}

/* Runs on a CUDA thread when the stream reaches it; holds the stream until the
 * job is done. */
static void CUDART_CB host_wait(void *arg)
{
    loom_cuda_job_t *job = arg;
    pthread_mutex_lock(&job->lock);
    while (!job->done)
        pthread_cond_wait(&job->cond, &job->lock);
    pthread_mutex_unlock(&job->lock);
    job_unref(job);
}

static loom_status_t run_job(loom_cuda_job_t *job)
{
    loom_comm_t c = job->comm;
    const size_t *a = job->arrays;
    size_t n = c ? (size_t)loom_comm_size(c) : 0;
    switch (job->kind) {
    case JOB_ALLREDUCE:
        return loom_allreduce(job->sendbuf, job->recvbuf, job->count, job->dt, job->op, c);
    case JOB_BROADCAST:
        return loom_broadcast(job->recvbuf, job->count, job->dt, job->root, c);
    case JOB_REDUCE:
        return loom_reduce(job->sendbuf, job->recvbuf, job->count, job->dt, job->op, job->root, c);
    case JOB_ALLGATHER:
        return loom_allgather(job->sendbuf, job->recvbuf, job->count, job->dt, c);
    case JOB_ALLGATHERV:
        return loom_allgatherv(job->sendbuf, job->count, job->recvbuf, a, a + n, job->dt, c);
    case JOB_REDUCE_SCATTER:
        return loom_reduce_scatter(job->sendbuf, job->recvbuf, job->count, job->dt, job->op, c);
    case JOB_ALLTOALL:
        return loom_alltoall(job->sendbuf, job->recvbuf, job->count, job->dt, c);
    case JOB_ALLTOALLV:
        return loom_alltoallv(job->sendbuf, a, a + n, job->recvbuf,
                              a + 2 * n, a + 3 * n, job->dt, c);
    case JOB_GATHER:
        return loom_gather(job->sendbuf, job->recvbuf, job->count, job->dt, job->root, c);
    case JOB_SCATTER:
        return loom_scatter(job->sendbuf, job->recvbuf, job->count, job->dt, job->root, c);
    case JOB_BARRIER:
        return loom_barrier(c);
    case JOB_SEND:
        return loom_send(job->sendbuf, job->count, job->dt, job->peer, job->tag, c);
    case JOB_RECV:
        return loom_recv(job->recvbuf, job->count, job->dt, job->peer, job->tag, c);
    }
    return LOOM_ERR_INTERNAL;
}

static void *worker_main(void *arg)
{
    loom_cuda_state_t *st = arg;
    loom_cuda_on_stream_worker = 1;
    cudaSetDevice(st->device);
    pthread_mutex_lock(&st->lock);
    for (;;) {
        while (!st->head && !st->stopping)
            pthread_cond_wait(&st->cond, &st->lock);
        loom_cuda_job_t *job = st->head;
        if (!job)
            break;
        st->head = job->next;
        if (!st->head)
            st->tail = NULL;
        /* Destroying the communicator abandons what the streams have not reached. */
        int abandon = st->stopping;
        pthread_mutex_unlock(&st->lock);

        loom_status_t status = LOOM_ERR_ABORTED;
        const char *msg = "the communicator was destroyed before its stream reached this call";
        if (!abandon) {
            cudaError_t e = cudaEventSynchronize(job->ready);
            if (e != cudaSuccess) {
                status = LOOM_ERR_TRANSPORT;
                msg = cudaGetErrorString(e);
            } else {
                status = run_job(job);
                msg = loom_comm_last_error(st->comm);
            }
        }
        cudaEventDestroy(job->ready);

        pthread_mutex_lock(&st->lock);
        if (status != LOOM_SUCCESS && st->async_status == LOOM_SUCCESS) {
            st->async_status = status;
            snprintf(st->async_msg, sizeof(st->async_msg), "%s", msg);
        }
        pthread_mutex_unlock(&st->lock);

        pthread_mutex_lock(&job->lock);
        job->done = 1;
        pthread_cond_broadcast(&job->cond);
        pthread_mutex_unlock(&job->lock);
        job_unref(job);
        pthread_mutex_lock(&st->lock);
    }
    pthread_mutex_unlock(&st->lock);
    return NULL;
}

void loom_cuda_stream_stop(loom_cuda_state_t *st)
{
    pthread_mutex_lock(&st->lock);
    int started = st->worker_started;
    st->stopping = 1;
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->lock);
    if (started)
        pthread_join(st->worker, NULL);
    pthread_mutex_lock(&st->lock);
    st->worker_started = 0;
    pthread_mutex_unlock(&st->lock);
}

/* The state of c, on the device loom_comm_set_device chose, else the caller's. */
static loom_status_t comm_state(loom_comm_t c, const char *fn, loom_cuda_state_t **out)
{
    loom_cuda_state_t *st = loom_cuda_state_find(c);
    if (!st) {
        int device = 0;
        cudaError_t e = cudaGetDevice(&device);
        if (e != cudaSuccess)
            return loom_comm_fail(c, LOOM_ERR_UNSUPPORTED, "%s: no usable GPU: %s", fn,
                                  cudaGetErrorString(e));
        loom_err_t err = {0};
        loom_status_t status = loom_cuda_state_get(c, device, &st, &err);
        if (status != LOOM_SUCCESS)
            return loom_comm_fail(c, status, "%s: %s", fn, err.msg);
    }
    *out = st;
    return LOOM_SUCCESS;
}

static loom_status_t submit(loom_cuda_job_t *job, const char *fn, cudaStream_t stream)
{
    loom_comm_t c = job->comm;
    loom_cuda_state_t *st = NULL;
    loom_status_t status = comm_state(c, fn, &st);
    if (status != LOOM_SUCCESS)
        goto free_job;
    char why[LOOM_ERRMSG_MAX] = "";
    pthread_mutex_lock(&st->lock);
    status = st->stopping ? LOOM_ERR_ABORTED : st->async_status;
    if (status == LOOM_SUCCESS && !st->worker_started) {
        if (pthread_create(&st->worker, NULL, worker_main, st) == 0)
            st->worker_started = 1;
        else
            status = LOOM_ERR_NO_MEMORY;
    }
    if (status == LOOM_ERR_NO_MEMORY)
        snprintf(why, sizeof(why), "cannot start the stream worker");
    else if (st->stopping)
        snprintf(why, sizeof(why), "the communicator is being destroyed");
    else if (status != LOOM_SUCCESS)
        snprintf(why, sizeof(why), "an earlier stream-ordered call failed: %.400s", st->async_msg);
    pthread_mutex_unlock(&st->lock);
    if (status != LOOM_SUCCESS) {
        loom_comm_fail(c, status, "%s: %s", fn, why);
        goto free_job;
    }

    int prev = -1;
    cudaGetDevice(&prev);
    if (prev != st->device)
        cudaSetDevice(st->device);
    const char *what = "cudaEventCreateWithFlags";
    cudaError_t e = cudaEventCreateWithFlags(&job->ready,
                                             cudaEventBlockingSync | cudaEventDisableTiming);
    if (e == cudaSuccess) {
        what = "cudaEventRecord on the caller's stream";
        if ((e = cudaEventRecord(job->ready, stream)) == cudaSuccess) {
            what = "cudaLaunchHostFunc on the caller's stream";
            e = cudaLaunchHostFunc(stream, host_wait, job);
        }
        if (e != cudaSuccess)
            cudaEventDestroy(job->ready);
    }
    if (prev >= 0 && prev != st->device)
        cudaSetDevice(prev);
    if (e != cudaSuccess) {
        status = loom_comm_fail(c, LOOM_ERR_TRANSPORT, "%s: CUDA: %s failed: %s", fn, what,
                                cudaGetErrorString(e));
        goto free_job;
    }

    pthread_mutex_lock(&st->lock);
    if (st->tail)
        st->tail->next = job;
    else
        st->head = job;
    st->tail = job;
    pthread_cond_signal(&st->cond);
    pthread_mutex_unlock(&st->lock);
    return LOOM_SUCCESS;

free_job:
    job_free(job);
    return status;
}

/* A job with what every call has. who names root or peer (NULL: neither). */
static loom_status_t job_new(loom_comm_t c, const char *fn, job_kind_t kind, loom_dtype_t dt,
                             int needs_op, loom_op_t op, const char *who, int rank,
                             loom_cuda_job_t **out)
{
    if (!c)
        return loom_global_fail(LOOM_ERR_INVALID_ARG, "%s: the communicator is NULL", fn);
    /* Checked here as well as by the collective, so that a bad argument is
     * returned by this call instead of surfacing later, asynchronously. */
    if (!loom_dtype_valid(dt))
        return loom_comm_fail(c, LOOM_ERR_INVALID_ARG, "%s: unknown dtype %d", fn, (int)dt);
    if (needs_op && !loom_op_valid(op))
        return loom_comm_fail(c, LOOM_ERR_INVALID_ARG, "%s: unknown reduction op %d", fn, (int)op);
    if (needs_op && !loom_op_takes_dtype(op, dt))
        return loom_comm_fail(c, LOOM_ERR_INVALID_ARG, "%s: %s applies to integer dtypes, not %s",
                              fn, loom_op_name(op), loom_dtype_name(dt));
    if (who && (rank < 0 || rank >= loom_comm_size(c)))
        return loom_comm_fail(c, LOOM_ERR_INVALID_ARG,
                              "%s: %s %d is not a rank of this communicator (size %d)", fn, who,
                              rank, loom_comm_size(c));
    loom_cuda_job_t *job = calloc(1, sizeof(*job));
    if (!job)
        return loom_comm_fail(c, LOOM_ERR_NO_MEMORY, "%s: out of memory", fn);
    job->kind = kind;
    job->comm = c;
    job->dt = dt;
    job->op = op;
    job->root = rank;
    job->peer = rank;
    pthread_mutex_init(&job->lock, NULL);
    pthread_cond_init(&job->cond, NULL);
    atomic_init(&job->refs, 2);
    *out = job;
    return LOOM_SUCCESS;
}

/* Copy n arrays of c->size counts into the job (the caller's may be gone by the
 * time the stream reaches the call). */
static int copy_arrays(loom_cuda_job_t *job, const size_t *const *src, int n, const char *fn)
{
    size_t size = (size_t)loom_comm_size(job->comm);
    for (int i = 0; i < n; i++)
        if (!src[i]) {
            loom_comm_fail(job->comm, LOOM_ERR_INVALID_ARG, "%s: NULL count or displacement array", fn);
            return -1;
        }
    if (!(job->arrays = malloc((size_t)n * size * sizeof(size_t)))) {
        loom_comm_fail(job->comm, LOOM_ERR_NO_MEMORY, "%s: out of memory", fn);
        return -1;
    }
    for (int i = 0; i < n; i++)
        memcpy(job->arrays + (size_t)i * size, src[i], size * sizeof(size_t));
    return 0;
}

static loom_status_t drop(loom_cuda_job_t *job)
{
    job_free(job);
    return LOOM_ERR_INVALID_ARG; /* copy_arrays recorded the message */
}

/* ---- the public calls ------------------------------------------------------ */

LOOM_API loom_status_t loom_comm_set_device(loom_comm_t c, int device)
{
    if (!c)
        return loom_global_fail(LOOM_ERR_INVALID_ARG, "loom_comm_set_device: the communicator is NULL");
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        return loom_comm_fail(c, LOOM_ERR_UNSUPPORTED, "loom_comm_set_device: no usable GPU: %s",
                              cudaGetErrorString(e));
    if (device < 0 || device >= count)
        return loom_comm_fail(c, LOOM_ERR_INVALID_ARG,
                              "loom_comm_set_device: device %d does not exist (%d GPUs)", device,
                              count);
    loom_err_t err = {0};
    loom_cuda_state_t *st;
    loom_status_t status = loom_cuda_state_get(c, device, &st, &err);
    return status == LOOM_SUCCESS ? status
                                  : loom_comm_fail(c, status, "loom_comm_set_device: %s", err.msg);
}

LOOM_API loom_status_t loom_comm_stream_status(loom_comm_t c)
{
    if (!c)
        return loom_global_fail(LOOM_ERR_INVALID_ARG, "loom_comm_stream_status: the communicator is NULL");
    loom_cuda_state_t *st = loom_cuda_state_find(c);
    if (!st)
        return LOOM_SUCCESS;
    pthread_mutex_lock(&st->lock);
    loom_status_t status = st->async_status;
    char msg[LOOM_ERRMSG_MAX];
    memcpy(msg, st->async_msg, sizeof(msg));
    pthread_mutex_unlock(&st->lock);
    return status == LOOM_SUCCESS ? status : loom_comm_fail(c, status, "%s", msg);
}

LOOM_API loom_status_t loom_allreduce_stream(const void *sendbuf, void *recvbuf, size_t count,
                                             loom_dtype_t dt, loom_op_t op, loom_comm_t c,
                                             cudaStream_t stream)
{
    loom_cuda_job_t *job;
    loom_status_t status = job_new(c, "allreduce_stream", JOB_ALLREDUCE, dt, 1, op, NULL, 0, &job);
    if (status != LOOM_SUCCESS)
        return status;
    job->sendbuf = sendbuf;
    job->recvbuf = recvbuf;
    job->count = count;
    return submit(job, "allreduce_stream", stream);
}

LOOM_API loom_status_t loom_broadcast_stream(void *buf, size_t count, loom_dtype_t dt, int root,
                                             loom_comm_t c, cudaStream_t stream)
{
    loom_cuda_job_t *job;
    loom_status_t status = job_new(c, "broadcast_stream", JOB_BROADCAST, dt, 0, LOOM_SUM, "root", root, &job);
    if (status != LOOM_SUCCESS)
        return status;
    job->recvbuf = buf;
    job->count = count;
    return submit(job, "broadcast_stream", stream);
}

LOOM_API loom_status_t loom_reduce_stream(const void *sendbuf, void *recvbuf, size_t count,
                                          loom_dtype_t dt, loom_op_t op, int root, loom_comm_t c,
                                          cudaStream_t stream)
{
    loom_cuda_job_t *job;
    loom_status_t status = job_new(c, "reduce_stream", JOB_REDUCE, dt, 1, op, "root", root, &job);
    if (status != LOOM_SUCCESS)
        return status;
    job->sendbuf = sendbuf;
    job->recvbuf = recvbuf;
    job->count = count;
    return submit(job, "reduce_stream", stream);
}

LOOM_API loom_status_t loom_allgather_stream(const void *sendbuf, void *recvbuf, size_t sendcount,
                                             loom_dtype_t dt, loom_comm_t c, cudaStream_t stream)
{
    loom_cuda_job_t *job;
    loom_status_t status = job_new(c, "allgather_stream", JOB_ALLGATHER, dt, 0, LOOM_SUM, NULL, 0, &job);
    if (status != LOOM_SUCCESS)
        return status;
    job->sendbuf = sendbuf;
    job->recvbuf = recvbuf;
    job->count = sendcount;
    return submit(job, "allgather_stream", stream);
}

LOOM_API loom_status_t loom_allgatherv_stream(const void *sendbuf, size_t sendcount, void *recvbuf,
                                              const size_t *recvcounts, const size_t *displs,
                                              loom_dtype_t dt, loom_comm_t c, cudaStream_t stream)
{
    loom_cuda_job_t *job;
    loom_status_t status = job_new(c, "allgatherv_stream", JOB_ALLGATHERV, dt, 0, LOOM_SUM, NULL, 0, &job);
    if (status != LOOM_SUCCESS)
        return status;
    const size_t *arrays[2] = {recvcounts, displs};
    if (copy_arrays(job, arrays, 2, "allgatherv_stream") != 0)
        return drop(job);
    job->sendbuf = sendbuf;
    job->recvbuf = recvbuf;
    job->count = sendcount;
    return submit(job, "allgatherv_stream", stream);
}

LOOM_API loom_status_t loom_reduce_scatter_stream(const void *sendbuf, void *recvbuf,
                                                  size_t recvcount, loom_dtype_t dt, loom_op_t op,
                                                  loom_comm_t c, cudaStream_t stream)
{
    loom_cuda_job_t *job;
    loom_status_t status = job_new(c, "reduce_scatter_stream", JOB_REDUCE_SCATTER, dt, 1, op, NULL, 0, &job);
    if (status != LOOM_SUCCESS)
        return status;
    job->sendbuf = sendbuf;
    job->recvbuf = recvbuf;
    job->count = recvcount;
    return submit(job, "reduce_scatter_stream", stream);
}

LOOM_API loom_status_t loom_alltoall_stream(const void *sendbuf, void *recvbuf, size_t count,
                                            loom_dtype_t dt, loom_comm_t c, cudaStream_t stream)
{
    loom_cuda_job_t *job;
    loom_status_t status = job_new(c, "alltoall_stream", JOB_ALLTOALL, dt, 0, LOOM_SUM, NULL, 0, &job);
    if (status != LOOM_SUCCESS)
        return status;
    job->sendbuf = sendbuf;
    job->recvbuf = recvbuf;
    job->count = count;
    return submit(job, "alltoall_stream", stream);
}

LOOM_API loom_status_t loom_alltoallv_stream(const void *sendbuf, const size_t *sendcounts,
                                             const size_t *sdispls, void *recvbuf,
                                             const size_t *recvcounts, const size_t *rdispls,
                                             loom_dtype_t dt, loom_comm_t c, cudaStream_t stream)
{
    loom_cuda_job_t *job;
    loom_status_t status = job_new(c, "alltoallv_stream", JOB_ALLTOALLV, dt, 0, LOOM_SUM, NULL, 0, &job);
    if (status != LOOM_SUCCESS)
        return status;
    /* In place, the send arrays are not read: stand the receive ones in for them. */
    int in_place = sendbuf == LOOM_IN_PLACE;
    const size_t *arrays[4] = {in_place ? recvcounts : sendcounts, in_place ? rdispls : sdispls,
                               recvcounts, rdispls};
    if (copy_arrays(job, arrays, 4, "alltoallv_stream") != 0)
        return drop(job);
    job->sendbuf = sendbuf;
    job->recvbuf = recvbuf;
    return submit(job, "alltoallv_stream", stream);
}

LOOM_API loom_status_t loom_gather_stream(const void *sendbuf, void *recvbuf, size_t sendcount,
                                          loom_dtype_t dt, int root, loom_comm_t c,
                                          cudaStream_t stream)
{
    loom_cuda_job_t *job;
    loom_status_t status = job_new(c, "gather_stream", JOB_GATHER, dt, 0, LOOM_SUM, "root", root, &job);
    if (status != LOOM_SUCCESS)
        return status;
    job->sendbuf = sendbuf;
    job->recvbuf = recvbuf;
    job->count = sendcount;
    return submit(job, "gather_stream", stream);
}

LOOM_API loom_status_t loom_scatter_stream(const void *sendbuf, void *recvbuf, size_t recvcount,
                                           loom_dtype_t dt, int root, loom_comm_t c,
                                           cudaStream_t stream)
{
    loom_cuda_job_t *job;
    loom_status_t status = job_new(c, "scatter_stream", JOB_SCATTER, dt, 0, LOOM_SUM, "root", root, &job);
    if (status != LOOM_SUCCESS)
        return status;
    job->sendbuf = sendbuf;
    job->recvbuf = recvbuf;
    job->count = recvcount;
    return submit(job, "scatter_stream", stream);
}

LOOM_API loom_status_t loom_barrier_stream(loom_comm_t c, cudaStream_t stream)
{
    loom_cuda_job_t *job;
    loom_status_t status = job_new(c, "barrier_stream", JOB_BARRIER, LOOM_UINT8, 0, LOOM_SUM, NULL, 0, &job);
    if (status != LOOM_SUCCESS)
        return status;
    return submit(job, "barrier_stream", stream);
}

LOOM_API loom_status_t loom_send_stream(const void *buf, size_t count, loom_dtype_t dt, int peer,
                                        int tag, loom_comm_t c, cudaStream_t stream)
{
    loom_cuda_job_t *job;
    loom_status_t status = job_new(c, "send_stream", JOB_SEND, dt, 0, LOOM_SUM, "peer", peer, &job);
    if (status != LOOM_SUCCESS)
        return status;
    job->sendbuf = buf;
    job->count = count;
    job->tag = tag;
    return submit(job, "send_stream", stream);
}

LOOM_API loom_status_t loom_recv_stream(void *buf, size_t count, loom_dtype_t dt, int peer,
                                        int tag, loom_comm_t c, cudaStream_t stream)
{
    loom_cuda_job_t *job;
    loom_status_t status = job_new(c, "recv_stream", JOB_RECV, dt, 0, LOOM_SUM, "peer", peer, &job);
    if (status != LOOM_SUCCESS)
        return status;
    job->recvbuf = buf;
    job->count = count;
    job->tag = tag;
    return submit(job, "recv_stream", stream);
}
