/* gpu_collectives - every collective on GPU buffers, with 1-4 ranks (forked
 * processes over loopback sockets) sharing GPU 0: the plain calls, the
 * stream-ordered forms (inputs uploaded and results downloaded by async copies
 * on the same stream, so a call that broke stream order reads stale inputs or
 * is read too early), a non-blocking call, blocking and stream-ordered send/recv,
 * and the argument errors (host/GPU mixes, non-blocking p2p on GPU buffers).
 * Everything runs twice: with the default staging chunk and with
 * LOOM_CUDA_CHUNK_BYTES=4096, so large calls take many passes. Inputs are small
 * integers: every reduction is exact and results must match bit for bit.
 * Exits 77 without a GPU. Also built over the CUDA double (tests/cuda-double/),
 * with a smaller largest count when chunks are small. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_common.h"
#include "loom.h"
#include "loom_cuda.h"
#include "../mp_util.h"
#include "base/reduce.h"

typedef enum { MODE_PLAIN, MODE_STREAM, MODE_NONBLOCKING } mode_t_;
static const char *const mode_names[] = {"plain", "stream", "non-blocking"};
static const char *const coll_names[] = {"allreduce", "broadcast", "reduce", "allgather",
                                         "allgatherv", "reduce_scatter", "alltoall",
                                         "alltoallv", "gather", "scatter", "barrier",
                                         "allreduce-in-place"};
enum { ALLREDUCE, BROADCAST, REDUCE, ALLGATHER, ALLGATHERV, REDUCE_SCATTER, ALLTOALL,
       ALLTOALLV, GATHER, SCATTER, BARRIER, ALLREDUCE_IN_PLACE, NCOLLS };

static double value_of(int rank, size_t i, loom_op_t op)
{
    if (op == LOOM_PROD)
        return ((i + (size_t)rank) % 4 == 0) ? 2.0 : 1.0;
    return (double)(((size_t)rank * 3 + i) % 11 + 1);
}

static void put(loom_dtype_t dt, void *buf, size_t i, double v)
{
    switch (dt) {
    case LOOM_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case LOOM_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case LOOM_FLOAT16: ((uint16_t *)buf)[i] = loom_float_to_half((float)v); break;
    case LOOM_BFLOAT16: ((uint16_t *)buf)[i] = loom_float_to_bf16((float)v); break;
    default: ((float *)buf)[i] = (float)v; break;
    }
}

/* The reduction of element i over the ranks, as the device computes it. */
static double reduced(loom_dtype_t dt, loom_op_t op, int P, size_t i)
{
    double acc = value_of(0, i, op);
    for (int r = 1; r < P; r++) {
        double v = value_of(r, i, op);
        acc = op == LOOM_PROD ? acc * v : op == LOOM_MIN ? fmin(acc, v)
              : op == LOOM_MAX ? fmax(acc, v) : acc + v;
    }
    if (op == LOOM_AVG)
        acc = dt == LOOM_INT32 ? trunc(acc / P) : (double)((float)acc / (float)P);
    return acc;
}

static size_t vcount(size_t count, int from, int to)
{
    return (size_t)((from * 3 + to * 5) % 4) * count / 2;
}

typedef struct {
    int coll;
    loom_dtype_t dt;
    loom_op_t op;
    size_t count;
    mode_t_ mode;
} case_t;

static int failures;

__attribute__((format(printf, 3, 4))) static void report(loom_comm_t c, const case_t *k,
                                                         const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAIL rank %d/%d %s %s dtype %d op %d count %zu: %s\n", loom_comm_rank(c),
            loom_comm_size(c), coll_names[k->coll], mode_names[k->mode], (int)k->dt, (int)k->op,
            k->count, msg);
    failures++;
}

static loom_status_t issue(loom_comm_t c, const case_t *k, const void *s, void *r, int root,
                           const size_t *sc, const size_t *sd, const size_t *rc, const size_t *rd,
                           cudaStream_t st)
{
    size_t n = k->count;
    loom_dtype_t dt = k->dt;
    int stream = k->mode == MODE_STREAM;
    switch (k->coll) {
    case ALLREDUCE:
        if (k->mode == MODE_NONBLOCKING) {
            loom_request_t req;
            loom_status_t x = loom_iallreduce(s, r, n, dt, k->op, c, &req);
            return x == LOOM_SUCCESS ? loom_wait(req) : x;
        }
        return stream ? loom_allreduce_stream(s, r, n, dt, k->op, c, st)
                      : loom_allreduce(s, r, n, dt, k->op, c);
    case ALLREDUCE_IN_PLACE:
        return stream ? loom_allreduce_stream(LOOM_IN_PLACE, r, n, dt, k->op, c, st)
                      : loom_allreduce(LOOM_IN_PLACE, r, n, dt, k->op, c);
    case BROADCAST:
        return stream ? loom_broadcast_stream(r, n, dt, root, c, st)
                      : loom_broadcast(r, n, dt, root, c);
    case REDUCE:
        return stream ? loom_reduce_stream(s, r, n, dt, k->op, root, c, st)
                      : loom_reduce(s, r, n, dt, k->op, root, c);
    case ALLGATHER:
        return stream ? loom_allgather_stream(s, r, n, dt, c, st) : loom_allgather(s, r, n, dt, c);
    case ALLGATHERV:
        return stream ? loom_allgatherv_stream(s, rc[loom_comm_rank(c)], r, rc, rd, dt, c, st)
                      : loom_allgatherv(s, rc[loom_comm_rank(c)], r, rc, rd, dt, c);
    case REDUCE_SCATTER:
        return stream ? loom_reduce_scatter_stream(s, r, n, dt, k->op, c, st)
                      : loom_reduce_scatter(s, r, n, dt, k->op, c);
    case ALLTOALL:
        return stream ? loom_alltoall_stream(s, r, n, dt, c, st) : loom_alltoall(s, r, n, dt, c);
    case ALLTOALLV:
        return stream ? loom_alltoallv_stream(s, sc, sd, r, rc, rd, dt, c, st)
                      : loom_alltoallv(s, sc, sd, r, rc, rd, dt, c);
    case GATHER:
        return stream ? loom_gather_stream(s, r, n, dt, root, c, st)
                      : loom_gather(s, r, n, dt, root, c);
    case SCATTER:
        return stream ? loom_scatter_stream(s, r, n, dt, root, c, st)
                      : loom_scatter(s, r, n, dt, root, c);
    case BARRIER:
        return stream ? loom_barrier_stream(c, st) : loom_barrier(c);
    }
    return LOOM_ERR_INTERNAL;
}

static void run_case(loom_comm_t c, const case_t *k, cudaStream_t st)
{
    const int P = loom_comm_size(c), me = loom_comm_rank(c), root = P - 1;
    const loom_dtype_t dt = k->dt;
    const size_t es = loom_dtype_size(dt), n = k->count;
    size_t sc[4], sd[4], rc[4], rd[4], stotal = 0, rtotal = 0;
    for (int i = 0; i < P; i++) {
        sc[i] = k->coll == ALLTOALLV ? vcount(n, me, i) : 0;
        rc[i] = k->coll == ALLTOALLV ? vcount(n, i, me) : vcount(n, i, 0);
        sd[i] = stotal;
        rd[i] = rtotal;
        stotal += sc[i];
        rtotal += rc[i];
    }
    size_t send_elems = n, recv_elems = n;
    if (k->coll == REDUCE_SCATTER || k->coll == ALLTOALL || k->coll == SCATTER)
        send_elems = n * (size_t)P;
    if (k->coll == ALLTOALLV)
        send_elems = stotal;
    if (k->coll == ALLGATHERV)
        send_elems = rc[me];
    if (k->coll == ALLGATHER || k->coll == ALLTOALL || k->coll == GATHER)
        recv_elems = n * (size_t)P;
    if (k->coll == ALLGATHERV || k->coll == ALLTOALLV)
        recv_elems = rtotal;
    size_t sbytes = (send_elems + 1) * es, rbytes = (recv_elems + 1) * es;
    unsigned char *hs, *hr, *want = malloc(rbytes);
    GPU_CHECK(cudaMallocHost((void **)&hs, sbytes));
    GPU_CHECK(cudaMallocHost((void **)&hr, rbytes));
    memset(hr, 0x5a, rbytes);
    memcpy(want, hr, rbytes);
    int reducing = k->coll == ALLREDUCE || k->coll == REDUCE || k->coll == REDUCE_SCATTER ||
                   k->coll == ALLREDUCE_IN_PLACE;
    for (size_t i = 0; i < send_elems; i++)
        put(dt, hs, i, reducing ? value_of(me, i, k->op) : (double)(((size_t)me * 7 + i) % 97));
    if (k->coll == BROADCAST && me == root)
        memcpy(hr, hs, n * es);
    if (k->coll == ALLREDUCE_IN_PLACE)
        memcpy(hr, hs, n * es);
    /* What every rank must hold afterwards. */
    switch (k->coll) {
    case ALLREDUCE:
    case ALLREDUCE_IN_PLACE:
    case REDUCE:
        if (k->coll != REDUCE || me == root)
            for (size_t i = 0; i < n; i++)
                put(dt, want, i, reduced(dt, k->op, P, i));
        break;
    case REDUCE_SCATTER:
        for (size_t i = 0; i < n; i++)
            put(dt, want, i, reduced(dt, k->op, P, (size_t)me * n + i));
        break;
    case BROADCAST:
        for (size_t i = 0; i < n; i++)
            put(dt, want, i, (double)(((size_t)root * 7 + i) % 97));
        break;
    case ALLGATHER:
    case GATHER:
        if (k->coll == ALLGATHER || me == root)
            for (int r = 0; r < P; r++)
                for (size_t i = 0; i < n; i++)
                    put(dt, want, (size_t)r * n + i, (double)(((size_t)r * 7 + i) % 97));
        break;
    case SCATTER:
        for (size_t i = 0; i < n; i++)
            put(dt, want, i, (double)(((size_t)root * 7 + (size_t)me * n + i) % 97));
        break;
    case ALLTOALL:
        for (int r = 0; r < P; r++)
            for (size_t i = 0; i < n; i++)
                put(dt, want, (size_t)r * n + i, (double)(((size_t)r * 7 + (size_t)me * n + i) % 97));
        break;
    case ALLGATHERV:
    case ALLTOALLV:
        for (int r = 0; r < P; r++) {
            size_t from = 0;
            if (k->coll == ALLTOALLV)
                for (int j = 0; j < me; j++)
                    from += vcount(n, r, j);
            for (size_t i = 0; i < rc[r]; i++)
                put(dt, want, rd[r] + i, (double)(((size_t)r * 7 + from + i) % 97));
        }
        break;
    default:
        break;
    }

    unsigned char *ds, *dr;
    GPU_CHECK(cudaMalloc((void **)&ds, sbytes));
    GPU_CHECK(cudaMalloc((void **)&dr, rbytes));
    loom_status_t status;
    if (k->mode == MODE_STREAM) {
        /* Fill the device buffers with junk first, so stale inputs show. */
        GPU_CHECK(cudaMemsetAsync(ds, 0x33, sbytes, st));
        GPU_CHECK(cudaMemsetAsync(dr, 0x33, rbytes, st));
        GPU_CHECK(cudaMemcpyAsync(ds, hs, sbytes, cudaMemcpyHostToDevice, st));
        GPU_CHECK(cudaMemcpyAsync(dr, hr, rbytes, cudaMemcpyHostToDevice, st));
        status = issue(c, k, ds, dr, root, sc, sd, rc, rd, st);
        GPU_CHECK(cudaMemcpyAsync(hr, dr, rbytes, cudaMemcpyDeviceToHost, st));
        GPU_CHECK(cudaStreamSynchronize(st));
        if (status == LOOM_SUCCESS)
            status = loom_comm_stream_status(c);
    } else {
        GPU_CHECK(cudaMemcpy(ds, hs, sbytes, cudaMemcpyHostToDevice));
        GPU_CHECK(cudaMemcpy(dr, hr, rbytes, cudaMemcpyHostToDevice));
        status = issue(c, k, ds, dr, root, sc, sd, rc, rd, st);
        GPU_CHECK(cudaMemcpy(hr, dr, rbytes, cudaMemcpyDeviceToHost));
    }
    if (status != LOOM_SUCCESS) {
        report(c, k, "%s: %s", loom_strerror(status), loom_comm_last_error(c));
    } else {
        for (size_t i = 0; i < recv_elems + 1; i++)
            if (memcmp(hr + i * es, want + i * es, es) != 0) {
                report(c, k, "element %zu of %zu differs", i, recv_elems);
                break;
            }
    }
    cudaFree(ds);
    cudaFree(dr);
    cudaFreeHost(hs);
    cudaFreeHost(hr);
    free(want);
}

/* Argument errors and point-to-point. */
static void run_p2p_and_errors(loom_comm_t c, cudaStream_t st)
{
    const int P = loom_comm_size(c), me = loom_comm_rank(c);
    const size_t n = 5000;
    case_t k = {ALLREDUCE, LOOM_FLOAT32, LOOM_SUM, n, MODE_PLAIN};
    float *d1, *d2, *host = calloc(n, sizeof(float)), *back = calloc(n, sizeof(float));
    GPU_CHECK(cudaMalloc((void **)&d1, n * sizeof(float)));
    GPU_CHECK(cudaMalloc((void **)&d2, n * sizeof(float)));
    if (loom_allreduce(d1, host, n, LOOM_FLOAT32, LOOM_SUM, c) != LOOM_ERR_INVALID_ARG ||
        !strstr(loom_comm_last_error(c), "GPU"))
        report(c, &k, "host/GPU mix not refused: %s", loom_comm_last_error(c));
    loom_request_t req;
    if (P > 1 && loom_isend(d1, n, LOOM_FLOAT32, (me + 1) % P, 3, c, &req) != LOOM_ERR_UNSUPPORTED)
        report(c, &k, "loom_isend on a GPU buffer not refused");
    if (P > 1) {
        for (int stream = 0; stream < 2; stream++) {
            for (size_t i = 0; i < n; i++)
                host[i] = (float)(me * 1000 + (int)i % 1000);
            GPU_CHECK(cudaMemcpy(d1, host, n * sizeof(float), cudaMemcpyHostToDevice));
            GPU_CHECK(cudaMemset(d2, 0, n * sizeof(float)));
            int next = (me + 1) % P, prev = (me + P - 1) % P;
            loom_status_t a, b;
            /* Even ranks send first, odd ranks receive first: no cycle of blocked sends. */
            if (!stream) {
                a = me % 2 == 0 ? loom_send(d1, n, LOOM_FLOAT32, next, 5, c)
                                : loom_recv(d2, n, LOOM_FLOAT32, prev, 5, c);
                b = me % 2 == 0 ? loom_recv(d2, n, LOOM_FLOAT32, prev, 5, c)
                                : loom_send(d1, n, LOOM_FLOAT32, next, 5, c);
            } else {
                a = me % 2 == 0 ? loom_send_stream(d1, n, LOOM_FLOAT32, next, 5, c, st)
                                : loom_recv_stream(d2, n, LOOM_FLOAT32, prev, 5, c, st);
                b = me % 2 == 0 ? loom_recv_stream(d2, n, LOOM_FLOAT32, prev, 5, c, st)
                                : loom_send_stream(d1, n, LOOM_FLOAT32, next, 5, c, st);
                GPU_CHECK(cudaStreamSynchronize(st));
                if (a == LOOM_SUCCESS && b == LOOM_SUCCESS)
                    a = loom_comm_stream_status(c);
            }
            /* With an odd rank count the last even rank sends to rank 0 (even), which
             * sends first too: that still completes, as small sends are buffered. */
            if (a != LOOM_SUCCESS || b != LOOM_SUCCESS) {
                report(c, &k, "%s send/recv: %s", stream ? "stream" : "blocking",
                       loom_comm_last_error(c));
                break;
            }
            GPU_CHECK(cudaMemcpy(back, d2, n * sizeof(float), cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < n; i++)
                if (back[i] != (float)(prev * 1000 + (int)i % 1000)) {
                    report(c, &k, "%s send/recv: element %zu is %g", stream ? "stream" : "blocking",
                           i, back[i]);
                    break;
                }
        }
    }
    cudaFree(d1);
    cudaFree(d2);
    free(host);
    free(back);
}

static int rank_main(loom_comm_t c, void *arg)
{
    (void)arg;
    GPU_CHECK(cudaSetDevice(0));
    loom_status_t s0 = loom_comm_set_device(c, 0);
    if (s0 != LOOM_SUCCESS) {
        fprintf(stderr, "loom_comm_set_device: %s\n", loom_comm_last_error(c));
        return 1;
    }
    cudaStream_t st;
    GPU_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
#ifdef LOOM_ON_CUDA_DOUBLE
    /* Hundreds of 4 KiB passes per call are a GPU's work, not a loaded CPU's:
     * over the double the largest count still takes tens of passes. */
    const char *chunk = getenv("LOOM_CUDA_CHUNK_BYTES");
    const size_t counts[] = {1, 1031, chunk ? 30011 : 300007};
#else
    static const size_t counts[] = {1, 1031, 300007};
#endif
    static const struct { loom_dtype_t dt; loom_op_t op; } reds[] = {
        {LOOM_INT32, LOOM_SUM}, {LOOM_INT32, LOOM_PROD}, {LOOM_INT32, LOOM_MIN},
        {LOOM_INT32, LOOM_MAX}, {LOOM_INT32, LOOM_AVG}, {LOOM_FLOAT32, LOOM_SUM},
        {LOOM_FLOAT32, LOOM_AVG}, {LOOM_BFLOAT16, LOOM_SUM}, {LOOM_BFLOAT16, LOOM_MAX},
        {LOOM_FLOAT16, LOOM_SUM}};
    for (int coll = 0; coll < NCOLLS; coll++)
        for (size_t ci = 0; ci < 3; ci++)
            for (int mode = 0; mode < 3; mode++) {
                if (mode == MODE_NONBLOCKING && coll != ALLREDUCE)
                    continue;
                int reducing = coll == ALLREDUCE || coll == REDUCE || coll == REDUCE_SCATTER ||
                               coll == ALLREDUCE_IN_PLACE;
                size_t ncase = reducing ? sizeof reds / sizeof reds[0] : 2;
                for (size_t t = 0; t < ncase; t++) {
                    case_t k = {coll, reducing ? reds[t].dt : (t ? LOOM_FLOAT32 : LOOM_UINT8),
                                reducing ? reds[t].op : LOOM_SUM, counts[ci], (mode_t_)mode};
                    if (coll == BARRIER && (ci > 0 || t > 0))
                        continue;
                    run_case(c, &k, st);
                }
            }
    run_p2p_and_errors(c, st);
    cudaStreamDestroy(st);
    return failures ? 1 : 0;
}

int main(void)
{
    int skip = gpu_skip_unless_available("gpu_collectives");
    if (skip)
        return skip;
    static const char *const chunks[] = {NULL, "4096"};
    for (int ch = 0; ch < 2; ch++) {
        if (chunks[ch])
            setenv("LOOM_CUDA_CHUNK_BYTES", chunks[ch], 1);
        else
            unsetenv("LOOM_CUDA_CHUNK_BYTES");
        for (int n = 1; n <= 4; n++) {
            char name[128];
            snprintf(name, sizeof(name), "every collective on GPU buffers, %d rank%s, chunk %s",
                     n, n > 1 ? "s" : "", chunks[ch] ? chunks[ch] : "default");
            double t0 = mp_now();
            int bad = mp_run(n, rank_main, NULL, 600);
            fprintf(stderr, "%s: %.1f s\n", name, mp_now() - t0);
            mp_result(name, bad == 0);
        }
    }
    return mp_summary();
}
