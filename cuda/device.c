/* device.c - the CUDA backend: which buffers live on a GPU, the per-communicator
 * staging state, the device operations staging.c is written against, and the
 * accelerator table the core calls (loom_accel_cuda, src/accel.h). It sees a
 * communicator only through the public calls (loom_comm_rank, loom_comm_size)
 * and as the key of its state.
 *
 * Classifying a pointer goes through the driver API (libcuda.so.1, when the
 * process has already loaded it): cuPointerGetAttributes needs no context, so a
 * CPU-only program linked with a CUDA build of Loom never initialises CUDA just
 * because Loom looked at its buffers, and without a driver every buffer is
 * simply host memory.
 * Everything else goes through the CUDA runtime (linked statically, see
 * configure.ac), only once a device buffer has been seen.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "cuda_state.h"
#include "base/log.h"
#include "base/settings.h"

__thread int loom_cuda_on_stream_worker;

loom_status_t loom_cuda_fail(loom_err_t *err, cudaError_t e, const char *what)
{
    return loom_err_set(err, LOOM_ERR_TRANSPORT, "CUDA: %s failed: %s (%s)", what,
                        cudaGetErrorString(e), cudaGetErrorName(e));
}

/* ---- pointer classification -------------------------------------------- */

typedef CUresult (*cu_attrs_fn)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);

static _Atomic(cu_attrs_fn) driver_attrs;

/* cuPointerGetAttributes of the driver the process already uses, or NULL. GPU
 * memory can only exist once something loaded and initialised the driver, so
 * Loom never loads it (RTLD_NOLOAD) nor initialises it (no cuInit): a CPU-only
 * program keeps a process without CUDA, which it may still fork. Until the
 * driver shows up the lookup is repeated (a cheap dlopen of a loaded name). */
static int count_loads(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    *(unsigned long long *)data = info->dlpi_adds;
    return 1;   /* the counter is the same in every entry: one is enough */
}

/* dlopen of a name that is not loaded still searches the library path (tens
 * of microseconds, twice per collective); it is only worth repeating once
 * something new was loaded, which the loader's own counter tells. */
static _Atomic unsigned long long loads_seen = ~0ULL;

static cu_attrs_fn driver_pointer_attrs(void)
{
    cu_attrs_fn f = atomic_load(&driver_attrs);
    if (f)
        return f;
    unsigned long long loads = 0;
    dl_iterate_phdr(count_loads, &loads);
    if (loads != 0 && atomic_exchange(&loads_seen, loads) == loads)
        return NULL;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!lib)
        return NULL;
    f = (cu_attrs_fn)dlsym(lib, "cuPointerGetAttributes");
    /* The reference is kept: f points into the library. */
    if (f)
        atomic_store(&driver_attrs, f);
    else
        dlclose(lib);
    return f;
}

loom_status_t loom_cuda_agree_min(loom_accel_host_coll_fn run_host, void *host_arg, int32_t *v)
{
    int32_t mine = *v;
    loom_coll_args_t m = {.coll = LOOM_COLL_ALLREDUCE, .sendbuf = &mine, .recvbuf = v, .count = 1,
                          .esize = sizeof(int32_t), .dtype = LOOM_INT32, .op = LOOM_MIN};
    return run_host(host_arg, &m);
}

void *loom_cuda_driver_sym(const char *name)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    void *f = lib ? dlsym(lib, name) : NULL;
    /* The reference is kept while f points into the library: it stays loaded anyway. */
    if (lib && !f)
        dlclose(lib);
    return f;
}

int loom_cuda_ptr_on_device(const void *p, int *device)
{
    cu_attrs_fn attrs = p ? driver_pointer_attrs() : NULL;
    if (!attrs)
        return 0;
    unsigned int memtype = 0, managed = 0;
    int ordinal = -1;
    CUpointer_attribute which[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                    CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void *values[3] = {&memtype, &managed, &ordinal};
    /* CUDA_ERROR_NOT_INITIALIZED (nobody called cuInit yet) means host memory too. */
    if (attrs(3, which, values, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
        return 0;
    /* Managed memory is readable by the CPU: the host path handles it. */
    if (memtype != CU_MEMORYTYPE_DEVICE || managed)
        return 0;
    *device = ordinal;
    return 1;
}

void *loom_cuda_alloc_base(const void *p)
{
    cu_attrs_fn attrs = p ? driver_pointer_attrs() : NULL;
    void *base = NULL;
    CUpointer_attribute which = CU_POINTER_ATTRIBUTE_RANGE_START_ADDR;
    void *values[1] = {&base};
    if (!attrs || attrs(1, &which, values, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
        return NULL;
    return base;
}

/* Note one buffer; the first one decides what the others must be. */
static loom_status_t classify(const char *coll, const char *name, const void *p, int *seen,
                              int *on_device, int *device, loom_err_t *err)
{
    int dev = -1;
    int is_dev = loom_cuda_ptr_on_device(p, &dev);
    if (!*seen) {
        *seen = 1;
        *on_device = is_dev;
        *device = dev;
        return LOOM_SUCCESS;
    }
    if (is_dev != *on_device)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "%s: %s is %s memory but the other buffers are %s memory; "
                            "pass all host or all GPU buffers", coll, name,
                            is_dev ? "GPU" : "host", *on_device ? "GPU" : "host");
    if (is_dev && dev != *device)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "%s: %s is on GPU %d but the other buffers are on GPU %d", coll,
                            name, dev, *device);
    return LOOM_SUCCESS;
}

static int any_nonzero(const size_t *counts, int n)
{
    for (int i = 0; counts && i < n; i++)
        if (counts[i])
            return 1;
    return 0;
}

loom_status_t loom_cuda_args_on_device(const loom_coll_args_t *a, int nranks, int rank,
                                       int *on_device, int *device, loom_err_t *err)
{
    const char *coll = loom_coll_name(a->coll);
    int seen = 0, dev = -1, is_dev = 0;
    /* Only the buffers this rank reads or writes: the others may be anything. */
    int send_used = a->sendbuf != NULL, recv_used = a->recvbuf != NULL;
    if (a->coll == LOOM_COLL_ALLGATHERV)
        send_used = send_used && a->count > 0;
    if (a->coll == LOOM_COLL_ALLGATHERV || a->coll == LOOM_COLL_ALLTOALLV)
        recv_used = recv_used && any_nonzero(a->counts, nranks);
    if (a->coll == LOOM_COLL_ALLTOALLV)
        send_used = send_used && any_nonzero(a->scounts, nranks);
    if (a->coll == LOOM_COLL_REDUCE && rank != a->root)
        recv_used = 0;
    /* An alltoallv rank with nothing to send or receive (a step routing no
     * tokens from or to it) must still take the path its peers take, or they
     * wait for it in collectives it never calls: the buffers it passed say
     * which (NULL ones can only mean host). Only alltoallv's counts differ
     * from rank to rank in whether anything moves. */
    if (a->coll == LOOM_COLL_ALLTOALLV && !send_used && !recv_used) {
        send_used = a->sendbuf != NULL;
        recv_used = a->recvbuf != NULL;
    }
    loom_status_t st = LOOM_SUCCESS;
    if (send_used)
        st = classify(coll, "sendbuf", a->sendbuf, &seen, &is_dev, &dev, err);
    if (st == LOOM_SUCCESS && recv_used)
        st = classify(coll, "recvbuf", a->recvbuf, &seen, &is_dev, &dev, err);
    if (st != LOOM_SUCCESS)
        return st;
    *on_device = is_dev;
    *device = dev;
    return LOOM_SUCCESS;
}

/* ---- per-communicator state --------------------------------------------- */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static loom_cuda_state_t *registry;

/* LOOM_CUDA_CHUNK_BYTES: bytes per staging pass (default 4 MiB). Every rank must
 * use the same value; at least 16 bytes per rank. */
static size_t chunk_bytes_for(const loom_settings_t *cfg, int nranks)
{
    size_t chunk = cfg->cuda_chunk_bytes;
    size_t least = (size_t)16 * (size_t)nranks;
    if (chunk < least)
        chunk = least;
    return (chunk + 15) & ~(size_t)15;
}

loom_cuda_state_t *loom_cuda_state_find(loom_comm_t c)
{
    pthread_mutex_lock(&registry_lock);
    loom_cuda_state_t *st = registry;
    while (st && st->comm != c)
        st = st->next;
    pthread_mutex_unlock(&registry_lock);
    return st;
}

static void state_free(loom_cuda_state_t *st)
{
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(st->device);
    loom_cuda_ipc_release(st);
    if (st->hier_ok)
        loom_hier_free(&st->hier);
    if (st->dev_scratch)
        cudaFree(st->dev_scratch);
    if (st->gdr_acc)
        cudaFree(st->gdr_acc);
    if (st->pinned)
        cudaFreeHost(st->pinned);
    for (int i = 0; i < LOOM_STAGING_MARKS; i++)
        if (st->marks[i])
            cudaEventDestroy(st->marks[i]);
    if (st->legacy_ready)
        cudaEventDestroy(st->legacy_ready);
    if (st->done)
        cudaEventDestroy(st->done);
    if (st->p2p_stream)
        cudaStreamDestroy(st->p2p_stream);
    if (st->down)
        cudaStreamDestroy(st->down);
    if (st->stream)
        cudaStreamDestroy(st->stream);
    if (prev >= 0)
        cudaSetDevice(prev);
    pthread_cond_destroy(&st->cond);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

static loom_status_t state_create(loom_comm_t c, int device, loom_cuda_state_t **out,
                                  loom_err_t *err)
{
    loom_cuda_state_t *st = calloc(1, sizeof(*st));
    if (!st)
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory");
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->cond, NULL);
    st->comm = c;
    st->device = device;
    st->chunk_bytes = chunk_bytes_for(loom_comm_settings(c), loom_comm_size(c));
    st->overlap = loom_comm_settings(c)->cuda_overlap;
    /* Every rank on one node: each can map the others' allocations. */
    st->ipc = loom_comm_settings(c)->cuda_ipc && loom_comm_node_count(c) == 1 &&
              loom_comm_size(c) > 1;
    /* Several nodes of the same number of ranks: IPC inside each, the network
     * between (the same views on every rank, from the same topology). The
     * views point into st itself, which never moves. */
    if (loom_comm_settings(c)->cuda_ipc && loom_comm_node_count(c) > 1) {
        int h = loom_comm_hier(c, &st->hier);
        if (h < 0) {
            state_free(st);
            return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory");
        }
        st->hier_ok = h;
    }
    int prev = -1;
    cudaError_t e = cudaGetDevice(&prev);
    const char *what = "cudaGetDevice";
    if (e == cudaSuccess && prev != device) {
        what = "cudaSetDevice";
        e = cudaSetDevice(device);
    }
    if (e == cudaSuccess) {
        what = "cudaStreamCreateWithFlags";
        e = cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking);
    }
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&st->down, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&st->p2p_stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) {
        what = "cudaEventCreateWithFlags";
        e = cudaEventCreateWithFlags(&st->done, cudaEventBlockingSync | cudaEventDisableTiming);
    }
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&st->legacy_ready, cudaEventDisableTiming);
    /* The host waits on the markers while the network waits on it: sleeping,
     * not spinning, leaves the cores to the host collective. */
    for (int i = 0; i < LOOM_STAGING_MARKS && e == cudaSuccess; i++)
        e = cudaEventCreateWithFlags(&st->marks[i],
                                     cudaEventBlockingSync | cudaEventDisableTiming);
    if (e == cudaSuccess) {
        what = "cudaHostAlloc (staging buffers)";
        e = cudaHostAlloc((void **)&st->pinned, 2 * LOOM_STAGING_SETS * st->chunk_bytes,
                          cudaHostAllocPortable);
    }
    for (int i = 0; e == cudaSuccess && i < LOOM_STAGING_SETS; i++) {
        st->sets[i].send = st->pinned + (size_t)(2 * i) * st->chunk_bytes;
        st->sets[i].recv = st->sets[i].send + st->chunk_bytes;
    }
    if (e == cudaSuccess) {
        what = "cudaMalloc (reduction scratch)";
        e = cudaMalloc((void **)&st->dev_scratch, st->chunk_bytes);
    }
    if (prev >= 0 && prev != device)
        cudaSetDevice(prev);
    if (e != cudaSuccess) {
        state_free(st);
        return loom_cuda_fail(err, e, what);
    }
    *out = st;
    return LOOM_SUCCESS;
}

loom_status_t loom_cuda_state_get(loom_comm_t c, int device, loom_cuda_state_t **out,
                                  loom_err_t *err)
{
    loom_status_t status = LOOM_SUCCESS;
    pthread_mutex_lock(&registry_lock);
    loom_cuda_state_t *st = registry;
    while (st && st->comm != c)
        st = st->next;
    if (!st && (status = state_create(c, device, &st, err)) == LOOM_SUCCESS) {
        st->next = registry;
        registry = st;
    }
    pthread_mutex_unlock(&registry_lock);
    if (status != LOOM_SUCCESS)
        return status;
    if (st->device != device)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "the buffers are on GPU %d but this communicator works on GPU %d "
                            "(loom_comm_set_device or its first GPU call chose it)",
                            device, st->device);
    *out = st;
    return LOOM_SUCCESS;
}

static void cuda_comm_quiesce(loom_comm_t c)
{
    loom_cuda_state_t *st = loom_cuda_state_find(c);
    if (st)
        loom_cuda_stream_stop(st);
}

static void cuda_comm_release(loom_comm_t c)
{
    pthread_mutex_lock(&registry_lock);
    loom_cuda_state_t **pp = &registry;
    while (*pp && (*pp)->comm != c)
        pp = &(*pp)->next;
    loom_cuda_state_t *st = *pp;
    if (st)
        *pp = st->next;
    pthread_mutex_unlock(&registry_lock);
    if (!st)
        return;
    loom_cuda_stream_stop(st);
    state_free(st);
}

/* ---- the device operations ---------------------------------------------- */

static cudaStream_t queue(const loom_cuda_state_t *st, int q)
{
    return q == LOOM_DEV_DOWN ? st->down : st->stream;
}

static loom_status_t cuda_copy2d(void *arg, int q, void *dst, size_t dpitch, const void *src,
                                 size_t spitch, size_t width, size_t height, loom_err_t *err)
{
    loom_cuda_state_t *st = arg;
    cudaError_t e = height == 1
                        ? cudaMemcpyAsync(dst, src, width, cudaMemcpyDefault, queue(st, q))
                        : cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height,
                                            cudaMemcpyDefault, queue(st, q));
    return e == cudaSuccess ? LOOM_SUCCESS : loom_cuda_fail(err, e, "staging copy");
}

static loom_status_t cuda_reduce3(void *arg, void *out, const void *a, const void *b,
                                  size_t count, loom_dtype_t dt, loom_op_t op, loom_err_t *err)
{
    loom_cuda_state_t *st = arg;
    cudaError_t e = (cudaError_t)loom_cuda_reduce3(out, a, b, count, dt, op, st->stream);
    return e == cudaSuccess ? LOOM_SUCCESS : loom_cuda_fail(err, e, "reduction kernel launch");
}

static loom_status_t cuda_avg(void *arg, void *buf, size_t count, loom_dtype_t dt, int nranks,
                              loom_err_t *err)
{
    loom_cuda_state_t *st = arg;
    cudaError_t e = (cudaError_t)loom_cuda_avg(buf, count, dt, nranks, st->stream);
    return e == cudaSuccess ? LOOM_SUCCESS : loom_cuda_fail(err, e, "average kernel launch");
}

static loom_status_t cuda_sync(void *arg, loom_err_t *err)
{
    loom_cuda_state_t *st = arg;
    cudaError_t e = cudaSuccess;
    for (int q = LOOM_DEV_DOWN; q <= LOOM_DEV_UP && e == cudaSuccess; q++)
        if ((e = cudaEventRecord(st->done, queue(st, q))) == cudaSuccess)
            e = cudaEventSynchronize(st->done);
    return e == cudaSuccess ? LOOM_SUCCESS : loom_cuda_fail(err, e, "waiting for the GPU");
}

static loom_status_t cuda_mark(void *arg, int q, int slot, loom_err_t *err)
{
    loom_cuda_state_t *st = arg;
    cudaError_t e = cudaEventRecord(st->marks[slot], queue(st, q));
    return e == cudaSuccess ? LOOM_SUCCESS : loom_cuda_fail(err, e, "cudaEventRecord (staging)");
}

static loom_status_t cuda_order(void *arg, int q, int slot, loom_err_t *err)
{
    loom_cuda_state_t *st = arg;
    cudaError_t e = cudaStreamWaitEvent(queue(st, q), st->marks[slot], 0);
    return e == cudaSuccess ? LOOM_SUCCESS
                            : loom_cuda_fail(err, e, "cudaStreamWaitEvent (staging)");
}

static loom_status_t cuda_wait(void *arg, int slot, loom_err_t *err)
{
    loom_cuda_state_t *st = arg;
    cudaError_t e = cudaEventSynchronize(st->marks[slot]);
    return e == cudaSuccess ? LOOM_SUCCESS : loom_cuda_fail(err, e, "waiting for the GPU");
}

const loom_dev_ops_t loom_cuda_dev_ops = {
    .size = sizeof(loom_dev_ops_t),
    .copy2d = cuda_copy2d,
    .reduce3 = cuda_reduce3,
    .avg = cuda_avg,
    .sync = cuda_sync,
    .mark = cuda_mark,
    .order = cuda_order,
    .wait = cuda_wait,
};

static loom_status_t cuda_run_coll(loom_comm_t c, int device, const loom_coll_args_t *a,
                                   int on_comm_worker, loom_accel_host_coll_fn run_host,
                                   void *host_arg, loom_err_t *err)
{
    loom_cuda_state_t *st;
    loom_status_t status = loom_cuda_state_get(c, device, &st, err);
    if (status != LOOM_SUCCESS)
        return status;
    int prev = -1;
    cudaError_t e = cudaGetDevice(&prev);
    if (e == cudaSuccess && prev != device)
        e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return loom_cuda_fail(err, e, "cudaSetDevice");
    /* A blocking call on device buffers reads them after the work the caller queued
     * on the legacy default stream (and so on every blocking stream), as cudaMemcpy
     * would. Not on the worker threads: stream-ordered calls are ordered by their
     * own stream, which may be the legacy one, held by a host function until they
     * finish; and a non-blocking call runs later, on the communicator's worker,
     * where it could meet the same hold (loom_cuda.h asks for a synchronized
     * stream before a non-blocking call). */
    if (!loom_cuda_on_stream_worker && !on_comm_worker) {
        e = cudaEventRecord(st->legacy_ready, cudaStreamLegacy);
        if (e == cudaSuccess)
            e = cudaStreamWaitEvent(st->stream, st->legacy_ready, 0);
        if (e == cudaSuccess)
            e = cudaStreamWaitEvent(st->down, st->legacy_ready, 0);
        if (e != cudaSuccess)
            status = loom_cuda_fail(err, e, "ordering after the default stream");
    }
    int done = 0;
    const int may_wait = !loom_cuda_on_stream_worker && !on_comm_worker;
    /* Several nodes of several ranks each: IPC inside, GPUDirect RDMA between,
     * where the ranks agree that every peer on another node can take GPU
     * memory (those of the node are IPC's, whatever the host transport). */
    const int hier = status == LOOM_SUCCESS && st->hier_ok &&
                     (a->coll == LOOM_COLL_ALLREDUCE || a->coll == LOOM_COLL_REDUCE_SCATTER ||
                      a->coll == LOOM_COLL_ALLGATHER || a->coll == LOOM_COLL_REDUCE ||
                      a->coll == LOOM_COLL_BROADCAST);
    int hier_gdr = 0;
    if (hier)
        status = loom_cuda_gdr_decide_cross(st, run_host, host_arg, &hier_gdr, err);
    if (status == LOOM_SUCCESS && hier_gdr) {
        status = loom_cuda_ipc_hier_run(st, a, run_host, host_arg, may_wait, &done, err);
        done = done ? 3 : 0;
    }
    const int ipc = status == LOOM_SUCCESS && !hier && loom_cuda_ipc_covers(st, a);
    if (ipc)
        status = loom_cuda_ipc_run(st, a, run_host, host_arg, may_wait, &done, err);
    /* Across nodes (or with LOOM_CUDA_IPC=0): GPUDirect RDMA where every
     * peer's transport moves GPU memory itself. */
    int gdr = 0;
    if (status == LOOM_SUCCESS && !done && loom_cuda_gdr_covers(a))
        status = loom_cuda_gdr_decide(st, run_host, host_arg, &gdr, err);
    if (status == LOOM_SUCCESS && gdr) {
        status = loom_cuda_gdr_run(st, a, err);
        done = 2;
    }
    const int path = done == 3 ? 8 : done == 2 ? 4 : done ? 1 : 2;
    if (status == LOOM_SUCCESS && !(st->logged[a->coll] & path)) {
        /* Once per communicator and path: which way a collective went. */
        st->logged[a->coll] |= (unsigned char)path;
        LOOM_INFO(
            "cuda", "rank %d: %s on GPU buffers: %s", loom_comm_rank(c), loom_coll_name(a->coll),
            done == 3         ? "hierarchical: CUDA IPC inside each node, GPUDirect RDMA between "
                                "nodes (no staging copies)"
            : done == 2       ? "GPU to network through GPUDirect RDMA (no staging copies)"
            : done            ? "GPU to GPU through CUDA IPC (one node)"
            : ipc && loom_cuda_alltoall_in_place(a)
                ? "staged through host memory (in place, which the IPC path does not cover)"
            : hier_gdr || ipc ? "staged through host memory (a buffer could not be shared by IPC)"
            : hier            ? "staged through host memory (hierarchical path: no GPUDirect RDMA "
                                "between nodes)"
            : st->ipc         ? "staged through host memory (not covered by the IPC path)"
                              : "staged through host memory");
    }
    if (status == LOOM_SUCCESS && !done) {
        loom_staging_t s = {.rank = loom_comm_rank(c), .size = loom_comm_size(c), .err = err,
                            .run_host = run_host, .host_arg = host_arg,
                            .dev = &loom_cuda_dev_ops, .dev_arg = st,
                            .dev_scratch = st->dev_scratch, .chunk_bytes = st->chunk_bytes,
                            .overlap = st->overlap};
        memcpy(s.sets, st->sets, sizeof(s.sets));
        status = loom_staging_run(&s, a);
    }
    if (status != LOOM_SUCCESS)
        cuda_sync(st, err); /* nothing of ours may still write the staging buffers */
    if (prev >= 0 && prev != device)
        cudaSetDevice(prev);
    return status;
}

/* "CUDA (...); 2 GPUs: 0 NVIDIA H200 (sm_90), ...", or why there is none. */
static void cuda_describe(char *out, size_t len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    size_t off = (size_t)snprintf(out, len, "CUDA (GPU buffers, loom_cuda.h); ");
    if (off >= len)
        return;
    if (e != cudaSuccess || n == 0) {
        snprintf(out + off, len - off, "no usable GPU (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return;
    }
    off += (size_t)snprintf(out + off, len - off, "%d GPU%s:", n, n > 1 ? "s" : "");
    for (int i = 0; i < n && off < len; i++) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) == cudaSuccess)
            off += (size_t)snprintf(out + off, len - off, "%s %d %s (sm_%d%d)", i ? "," : "", i,
                                    p.name, p.major, p.minor);
    }
}

/* ---- blocking point-to-point -------------------------------------------- */

static loom_status_t p2p_copy(loom_cuda_state_t *st, void *dst, const void *src, size_t bytes,
                              loom_err_t *err)
{
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventBlockingSync | cudaEventDisableTiming);
    if (e != cudaSuccess)
        return loom_cuda_fail(err, e, "cudaEventCreateWithFlags");
    if (!loom_cuda_on_stream_worker && (e = cudaEventRecord(ev, cudaStreamLegacy)) == cudaSuccess)
        e = cudaStreamWaitEvent(st->p2p_stream, ev, 0);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st->p2p_stream);
    if (e == cudaSuccess)
        e = cudaEventRecord(ev, st->p2p_stream);
    if (e == cudaSuccess)
        e = cudaEventSynchronize(ev);
    cudaEventDestroy(ev);
    return e == cudaSuccess ? LOOM_SUCCESS : loom_cuda_fail(err, e, "send/recv staging copy");
}

static loom_status_t cuda_run_p2p(loom_comm_t c, int device, int is_send, void *dbuf,
                                  size_t bytes, loom_accel_host_p2p_fn host, void *arg,
                                  loom_err_t *err)
{
    char *hbuf = malloc(bytes ? bytes : 1);
    if (!hbuf)
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory (%zu bytes to stage)", bytes);
    loom_status_t status = LOOM_SUCCESS;
    loom_cuda_state_t *st = NULL;
    int prev = -1;
    if ((status = loom_cuda_state_get(c, device, &st, err)) == LOOM_SUCCESS) {
        cudaGetDevice(&prev);
        if (prev != device)
            cudaSetDevice(device);
        if (is_send)
            status = p2p_copy(st, hbuf, dbuf, bytes, err);
    }
    if (status == LOOM_SUCCESS)
        status = host(hbuf, arg);
    if (status == LOOM_SUCCESS && !is_send)
        status = p2p_copy(st, dbuf, hbuf, bytes, err);
    if (prev >= 0 && prev != device)
        cudaSetDevice(prev);
    free(hbuf);
    return status;
}

/* ---- the accelerator table ----------------------------------------------- */

static int cuda_ptr_memory(const void *p, int *device)
{
    return loom_cuda_ptr_on_device(p, device);
}

const loom_accel_ops_t loom_accel_cuda = {
    .size = sizeof(loom_accel_ops_t),
    .name = "cuda",
    .coll_memory = loom_cuda_args_on_device,
    .ptr_memory = cuda_ptr_memory,
    .run_coll = cuda_run_coll,
    .run_p2p = cuda_run_p2p,
    .comm_quiesce = cuda_comm_quiesce,
    .comm_release = cuda_comm_release,
    .describe = cuda_describe,
    .devmem = &loom_cuda_devmem,
    .device_ready = loom_cuda_device_ready,
};
