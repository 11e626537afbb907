/* check_cuda_mp - the GPU-buffer path of the public calls without a GPU: 1-4
 * forked ranks over loopback sockets, over the CUDA double (tests/cuda-double/:
 * device memory the host cannot touch, ordered streams). Covers what the unit
 * tests of staging.c cannot: the core's in-place normal forms reaching the
 * staging code, dispatch from blocking, non-blocking and queued calls, blocking
 * send/recv on GPU buffers, and the argument errors. The test keeps a host
 * image of each device buffer, uploaded before a call and downloaded after it.
 * Runs with the default staging chunk and with 256 bytes (many passes).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-double/cuda_double.h"
#include "loom.h"
#include "mp_util.h"

static int32_t val(int rank, size_t i)
{
    return (int32_t)(((size_t)rank * 7 + i) % 97);
}

/* A GPU buffer of n int32 (and one more) and its host image, filled with 0x5a bytes. */
typedef struct {
    int32_t *dev, *host;
    size_t bytes;
} buffer_t;

static int buffer_alloc(buffer_t *b, size_t n)
{
    b->bytes = (n + 1) * sizeof(int32_t);
    b->host = malloc(b->bytes);
    if (!b->host || cudaMalloc((void **)&b->dev, b->bytes) != cudaSuccess)
        return 0;
    memset(b->host, 0x5a, b->bytes);
    return 1;
}

static void buffer_free(buffer_t *b)
{
    cudaFree(b->dev);
    free(b->host);
}

static void upload(loom_comm_t c, const buffer_t *b)
{
    cudaError_t e = cudaMemcpy(b->dev, b->host, b->bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess)
        mp_bad(c, "upload: %s", cudaGetErrorString(e));
}

static void download(loom_comm_t c, const buffer_t *b)
{
    cudaError_t e = cudaMemcpy(b->host, b->dev, b->bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess)
        mp_bad(c, "download: %s", cudaGetErrorString(e));
}

#define EXPECT_DONE(call, what)                                                         \
    do {                                                                                \
        loom_status_t st_ = (call);                                                     \
        if (st_ != LOOM_SUCCESS)                                                        \
            mp_bad(c, "%s: %s: %s", what, loom_strerror(st_), loom_comm_last_error(c));  \
    } while (0)

/* A blocking call on the device buffers, between the upload and the download
 * of both. */
#define EXPECT_OK(call, what)                                                           \
    do {                                                                                \
        upload(c, &sb);                                                                 \
        upload(c, &rb);                                                                 \
        EXPECT_DONE(call, what);                                                        \
        download(c, &sb);                                                               \
        download(c, &rb);                                                               \
    } while (0)

/* Staging copies made since the last look. */
static long staged_since(long *seen)
{
    cuda_double_counts_t k;
    cuda_double_counts(&k);
    long before = *seen;
    *seen = k.d2h;
    return k.d2h - before;
}

static void check_eq(loom_comm_t c, const char *what, const int32_t *got, size_t i, int32_t want)
{
    if (got[i] != want)
        mp_bad(c, "%s: element %zu is %d, want %d", what, i, got[i], want);
}

static int rank_main(loom_comm_t c, void *arg)
{
    (void)arg;
    const int P = loom_comm_size(c), me = loom_comm_rank(c), root = P - 1;
    const size_t n = 1031;
    const size_t cap = n * (size_t)(P > 3 ? P : 3);
    buffer_t sb, rb;
    if (!buffer_alloc(&sb, cap) || !buffer_alloc(&rb, cap)) {
        mp_bad(c, "cudaMalloc failed");
        return 1;
    }
    int32_t *s = sb.dev, *r = rb.dev, *hs = sb.host, *hr = rb.host;

    for (int in_place = 0; in_place < 2; in_place++) {
        const char *mode = in_place ? "in place" : "out of place";
        char what[64];
        /* allreduce */
        for (size_t i = 0; i < n; i++)
            (in_place ? hr : hs)[i] = val(me, i);
        upload(c, &sb);
        upload(c, &rb);
        long copies = 0;
        staged_since(&copies);
        EXPECT_DONE(loom_allreduce(in_place ? LOOM_IN_PLACE : s, r, n, LOOM_INT32, LOOM_SUM, c),
                    "allreduce");
        if (staged_since(&copies) == 0)
            mp_bad(c, "allreduce on GPU buffers was not staged");
        download(c, &rb);
        snprintf(what, sizeof(what), "allreduce %s", mode);
        for (size_t i = 0; i < n && !mp_bad_count; i++) {
            int32_t want = 0;
            for (int k = 0; k < P; k++)
                want += val(k, i);
            check_eq(c, what, hr, i, want);
        }
        /* reduce_scatter: block b of rank k holds val(k, b * n + i) */
        for (size_t i = 0; i < n * (size_t)P; i++)
            (in_place ? hr : hs)[i] = val(me, i);
        EXPECT_OK(loom_reduce_scatter(in_place ? LOOM_IN_PLACE : s, r, n, LOOM_INT32, LOOM_MAX, c),
                  "reduce_scatter");
        snprintf(what, sizeof(what), "reduce_scatter %s", mode);
        for (size_t i = 0; i < n && !mp_bad_count; i++) {
            int32_t want = INT32_MIN;
            for (int k = 0; k < P; k++)
                want = val(k, (size_t)me * n + i) > want ? val(k, (size_t)me * n + i) : want;
            check_eq(c, what, hr, i, want);
        }
        /* reduce to the last rank */
        for (size_t i = 0; i < n; i++)
            (in_place ? hr : hs)[i] = val(me, i);
        EXPECT_OK(loom_reduce(in_place ? LOOM_IN_PLACE : s, r, n, LOOM_INT32, LOOM_SUM, root, c),
                  "reduce");
        snprintf(what, sizeof(what), "reduce %s", mode);
        for (size_t i = 0; me == root && i < n && !mp_bad_count; i++) {
            int32_t want = 0;
            for (int k = 0; k < P; k++)
                want += val(k, i);
            check_eq(c, what, hr, i, want);
        }
        /* allgather: in place, each rank's block is already at its place */
        for (size_t i = 0; i < n; i++)
            (in_place ? hr + (size_t)me * n : hs)[i] = val(me, i);
        EXPECT_OK(loom_allgather(in_place ? LOOM_IN_PLACE : s, r, n, LOOM_INT32, c), "allgather");
        snprintf(what, sizeof(what), "allgather %s", mode);
        for (int k = 0; k < P && !mp_bad_count; k++)
            for (size_t i = 0; i < n; i++)
                check_eq(c, what, hr, (size_t)k * n + i, val(k, i));
        /* alltoall: block b for rank b is val(me, b * n + i) */
        for (size_t i = 0; i < n * (size_t)P; i++)
            (in_place ? hr : hs)[i] = val(me, i);
        EXPECT_OK(loom_alltoall(in_place ? LOOM_IN_PLACE : s, r, n, LOOM_INT32, c), "alltoall");
        snprintf(what, sizeof(what), "alltoall %s", mode);
        for (int k = 0; k < P && !mp_bad_count; k++)
            for (size_t i = 0; i < n; i++)
                check_eq(c, what, hr, (size_t)k * n + i, val(k, (size_t)me * n + i));
        /* gather and scatter at the last rank; in place at the root only */
        for (size_t i = 0; i < n; i++)
            (in_place && me == root ? hr + (size_t)me * n : hs)[i] = val(me, i);
        EXPECT_OK(loom_gather(in_place && me == root ? LOOM_IN_PLACE : s, r, n, LOOM_INT32, root, c),
                  "gather");
        snprintf(what, sizeof(what), "gather %s", mode);
        for (int k = 0; me == root && k < P && !mp_bad_count; k++)
            for (size_t i = 0; i < n; i++)
                check_eq(c, what, hr, (size_t)k * n + i, val(k, i));
        if (me == root)
            for (size_t i = 0; i < n * (size_t)P; i++)
                hs[i] = val(me, i);
        EXPECT_OK(loom_scatter(s, in_place && me == root ? (void *)LOOM_IN_PLACE : r, n, LOOM_INT32,
                               root, c),
                  "scatter");
        snprintf(what, sizeof(what), "scatter %s", mode);
        for (size_t i = 0; !(in_place && me == root) && i < n && !mp_bad_count; i++)
            check_eq(c, what, hr, i, val(root, (size_t)me * n + i));
    }

    /* broadcast, and a non-blocking allreduce queued behind it */
    for (size_t i = 0; i < n; i++)
        hr[i] = me == 0 ? val(0, i) : -1;
    for (size_t i = 0; i < n; i++)
        hs[n + i] = val(me, i);
    upload(c, &rb);
    upload(c, &sb);
    loom_request_t req1, req2;
    EXPECT_DONE(loom_ibroadcast(r, n, LOOM_INT32, 0, c, &req1), "ibroadcast");
    EXPECT_DONE(loom_iallreduce(s + n, s + 2 * n, n, LOOM_INT32, LOOM_MIN, c, &req2), "iallreduce");
    EXPECT_DONE(loom_wait(req1), "wait ibroadcast");
    EXPECT_DONE(loom_wait(req2), "wait iallreduce");
    download(c, &rb);
    download(c, &sb);
    for (size_t i = 0; i < n && !mp_bad_count; i++) {
        check_eq(c, "ibroadcast", hr, i, val(0, i));
        int32_t want = val(0, i);
        for (int k = 1; k < P; k++)
            want = val(k, i) < want ? val(k, i) : want;
        check_eq(c, "iallreduce", hs + 2 * n, i, want);
    }

    /* allgatherv and alltoallv with empty and uneven blocks */
    size_t counts[4], displs[4], sc[4], sd[4], total = 0, stotal = 0;
    for (int k = 0; k < P; k++) {
        counts[k] = (size_t)((k * 3) % 4) * 100;
        displs[k] = total;
        total += counts[k];
    }
    for (size_t i = 0; i < counts[me]; i++)
        hs[i] = val(me, i);
    EXPECT_OK(loom_allgatherv(s, counts[me], r, counts, displs, LOOM_INT32, c), "allgatherv");
    for (int k = 0; k < P && !mp_bad_count; k++)
        for (size_t i = 0; i < counts[k]; i++)
            check_eq(c, "allgatherv", hr, displs[k] + i, val(k, i));
    total = 0;
    for (int k = 0; k < P; k++) {
        sc[k] = (size_t)((me + 2 * k) % 3) * 150;       /* me -> k */
        counts[k] = (size_t)((k + 2 * me) % 3) * 150;   /* k -> me */
        sd[k] = stotal;
        displs[k] = total;
        stotal += sc[k];
        total += counts[k];
    }
    for (size_t i = 0; i < stotal; i++)
        hs[i] = val(me, i);
    EXPECT_OK(loom_alltoallv(s, sc, sd, r, counts, displs, LOOM_INT32, c), "alltoallv");
    for (int k = 0; k < P && !mp_bad_count; k++) {
        size_t from = 0; /* rank k's block for me starts after its blocks for ranks < me */
        for (int j = 0; j < me; j++)
            from += (size_t)((k + 2 * j) % 3) * 150;
        for (size_t i = 0; i < counts[k]; i++)
            check_eq(c, "alltoallv", hr, displs[k] + i, val(k, from + i));
    }

    /* blocking send/recv around a ring on "GPU" buffers: even ranks send first */
    if (P > 1) {
        int next = (me + 1) % P, prev = (me + P - 1) % P;
        for (size_t i = 0; i < n; i++)
            hs[i] = val(me, i);
        upload(c, &sb);
        loom_status_t a = me % 2 == 0 ? loom_send(s, n, LOOM_INT32, next, 9, c)
                                      : loom_recv(r, n, LOOM_INT32, prev, 9, c);
        loom_status_t b = me % 2 == 0 ? loom_recv(r, n, LOOM_INT32, prev, 9, c)
                                      : loom_send(s, n, LOOM_INT32, next, 9, c);
        if (a != LOOM_SUCCESS || b != LOOM_SUCCESS)
            mp_bad(c, "send/recv: %s", loom_comm_last_error(c));
        download(c, &rb);
        for (size_t i = 0; i < n && !mp_bad_count; i++)
            check_eq(c, "send/recv", hr, i, val(prev, i));
        if (loom_isend(s, n, LOOM_INT32, next, 9, c, &req1) != LOOM_ERR_UNSUPPORTED)
            mp_bad(c, "loom_isend on a GPU buffer was not refused");
    }

    /* mixing host and GPU buffers */
    int32_t *host = calloc(n, sizeof(int32_t));
    if (loom_allreduce(s, host, n, LOOM_INT32, LOOM_SUM, c) != LOOM_ERR_INVALID_ARG ||
        !strstr(loom_comm_last_error(c), "GPU memory"))
        mp_bad(c, "a host/GPU mix was not refused clearly: %s", loom_comm_last_error(c));
    EXPECT_DONE(loom_barrier(c), "barrier after the refused call");
    free(host);
    buffer_free(&sb);
    buffer_free(&rb);
    return mp_bad_count ? 1 : 0;
}

int main(void)
{
    static const char *const chunks[] = {NULL, "256"};
    /* The staging path: forked ranks share a node, where GPU buffers would
     * otherwise go GPU to GPU (check_cuda_ipc tests that). */
    setenv("LOOM_CUDA_IPC", "0", 1);
    for (int ch = 0; ch < 2; ch++) {
        if (chunks[ch])
            setenv("LOOM_CUDA_CHUNK_BYTES", chunks[ch], 1);
        else
            unsetenv("LOOM_CUDA_CHUNK_BYTES");
        for (int n = 1; n <= 4; n++) {
            char name[128];
            snprintf(name, sizeof(name), "collectives and send/recv on GPU buffers (CUDA double), %d rank%s, chunk %s",
                     n, n > 1 ? "s" : "", chunks[ch] ? chunks[ch] : "default");
            mp_result(name, mp_run(n, rank_main, NULL, 300) == 0);
        }
    }
    return mp_summary();
}
