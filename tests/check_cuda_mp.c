/* check_cuda_mp - the GPU-buffer path of the public calls without a GPU: 1-4
 * forked ranks over loopback sockets, with the device double of
 * check_cuda_fake.c standing in for GPU memory (host memory the classifier calls
 * device memory, copies and reductions that refuse to work where a GPU could
 * not). Covers what the unit tests of staging.c cannot: the core's in-place
 * normal forms reaching the staging code, dispatch from blocking, non-blocking
 * and queued calls, blocking send/recv on "GPU" buffers, and the argument
 * errors. Runs with the default staging chunk and with 256 bytes (many passes).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_cuda_fake.h"
#include "loom.h"
#include "mp_util.h"

static int failures;

__attribute__((format(printf, 2, 3))) static void bad(loom_comm_t c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAIL rank %d/%d: %s\n", loom_comm_rank(c), loom_comm_size(c), msg);
    failures++;
}

static int32_t val(int rank, size_t i)
{
    return (int32_t)(((size_t)rank * 7 + i) % 97);
}

/* A "GPU" buffer of n int32 (and one more), filled with 0x5a bytes. */
static int32_t *dev_alloc(size_t n)
{
    int32_t *p = malloc((n + 1) * sizeof(int32_t));
    memset(p, 0x5a, (n + 1) * sizeof(int32_t));
    region_add(p, (n + 1) * sizeof(int32_t));
    return p;
}

static void dev_free(int32_t *p)
{
    region_remove(p);
    free(p);
}

#define EXPECT_OK(call, what)                                                           \
    do {                                                                                \
        loom_status_t st_ = (call);                                                     \
        if (st_ != LOOM_SUCCESS)                                                        \
            bad(c, "%s: %s: %s", what, loom_strerror(st_), loom_comm_last_error(c));     \
    } while (0)

static void check_eq(loom_comm_t c, const char *what, const int32_t *got, size_t i, int32_t want)
{
    if (got[i] != want)
        bad(c, "%s: element %zu is %d, want %d", what, i, got[i], want);
}

static int rank_main(loom_comm_t c, void *arg)
{
    (void)arg;
    loom_cuda_test_backend(fake_on_device, &fake_ops, NULL, fake_scratch_alloc, fake_scratch_free);
    const int P = loom_comm_size(c), me = loom_comm_rank(c), root = P - 1;
    const size_t n = 1031;
    const size_t cap = n * (size_t)(P > 3 ? P : 3);
    int32_t *s = dev_alloc(cap), *r = dev_alloc(cap);
    long copies = fake_copies;

    for (int in_place = 0; in_place < 2; in_place++) {
        const char *mode = in_place ? "in place" : "out of place";
        char what[64];
        /* allreduce */
        for (size_t i = 0; i < n; i++)
            (in_place ? r : s)[i] = val(me, i);
        EXPECT_OK(loom_allreduce(in_place ? LOOM_IN_PLACE : s, r, n, LOOM_INT32, LOOM_SUM, c),
                  "allreduce");
        if (fake_copies == copies)
            bad(c, "allreduce on GPU buffers was not staged");
        copies = fake_copies;
        snprintf(what, sizeof(what), "allreduce %s", mode);
        for (size_t i = 0; i < n && !failures; i++) {
            int32_t want = 0;
            for (int k = 0; k < P; k++)
                want += val(k, i);
            check_eq(c, what, r, i, want);
        }
        /* reduce_scatter: block b of rank k holds val(k, b * n + i) */
        for (size_t i = 0; i < n * (size_t)P; i++)
            (in_place ? r : s)[i] = val(me, i);
        EXPECT_OK(loom_reduce_scatter(in_place ? LOOM_IN_PLACE : s, r, n, LOOM_INT32, LOOM_MAX, c),
                  "reduce_scatter");
        snprintf(what, sizeof(what), "reduce_scatter %s", mode);
        for (size_t i = 0; i < n && !failures; i++) {
            int32_t want = INT32_MIN;
            for (int k = 0; k < P; k++)
                want = val(k, (size_t)me * n + i) > want ? val(k, (size_t)me * n + i) : want;
            check_eq(c, what, r, i, want);
        }
        /* reduce to the last rank */
        for (size_t i = 0; i < n; i++)
            (in_place ? r : s)[i] = val(me, i);
        EXPECT_OK(loom_reduce(in_place ? LOOM_IN_PLACE : s, r, n, LOOM_INT32, LOOM_SUM, root, c),
                  "reduce");
        snprintf(what, sizeof(what), "reduce %s", mode);
        for (size_t i = 0; me == root && i < n && !failures; i++) {
            int32_t want = 0;
            for (int k = 0; k < P; k++)
                want += val(k, i);
            check_eq(c, what, r, i, want);
        }
        /* allgather: in place, each rank's block is already at its place */
        for (size_t i = 0; i < n; i++)
            (in_place ? r + (size_t)me * n : s)[i] = val(me, i);
        EXPECT_OK(loom_allgather(in_place ? LOOM_IN_PLACE : s, r, n, LOOM_INT32, c), "allgather");
        snprintf(what, sizeof(what), "allgather %s", mode);
        for (int k = 0; k < P && !failures; k++)
            for (size_t i = 0; i < n; i++)
                check_eq(c, what, r, (size_t)k * n + i, val(k, i));
        /* alltoall: block b for rank b is val(me, b * n + i) */
        for (size_t i = 0; i < n * (size_t)P; i++)
            (in_place ? r : s)[i] = val(me, i);
        EXPECT_OK(loom_alltoall(in_place ? LOOM_IN_PLACE : s, r, n, LOOM_INT32, c), "alltoall");
        snprintf(what, sizeof(what), "alltoall %s", mode);
        for (int k = 0; k < P && !failures; k++)
            for (size_t i = 0; i < n; i++)
                check_eq(c, what, r, (size_t)k * n + i, val(k, (size_t)me * n + i));
        /* gather and scatter at the last rank; in place at the root only */
        for (size_t i = 0; i < n; i++)
            (in_place && me == root ? r + (size_t)me * n : s)[i] = val(me, i);
        EXPECT_OK(loom_gather(in_place && me == root ? LOOM_IN_PLACE : s, r, n, LOOM_INT32, root, c),
                  "gather");
        snprintf(what, sizeof(what), "gather %s", mode);
        for (int k = 0; me == root && k < P && !failures; k++)
            for (size_t i = 0; i < n; i++)
                check_eq(c, what, r, (size_t)k * n + i, val(k, i));
        if (me == root)
            for (size_t i = 0; i < n * (size_t)P; i++)
                s[i] = val(me, i);
        EXPECT_OK(loom_scatter(s, in_place && me == root ? (void *)LOOM_IN_PLACE : r, n, LOOM_INT32,
                               root, c),
                  "scatter");
        snprintf(what, sizeof(what), "scatter %s", mode);
        for (size_t i = 0; !(in_place && me == root) && i < n && !failures; i++)
            check_eq(c, what, r, i, val(root, (size_t)me * n + i));
    }

    /* broadcast, and a non-blocking allreduce queued behind it */
    for (size_t i = 0; i < n; i++)
        r[i] = me == 0 ? val(0, i) : -1;
    loom_request_t req1, req2;
    EXPECT_OK(loom_ibroadcast(r, n, LOOM_INT32, 0, c, &req1), "ibroadcast");
    for (size_t i = 0; i < n; i++)
        s[n + i] = val(me, i);
    EXPECT_OK(loom_iallreduce(s + n, s + 2 * n, n, LOOM_INT32, LOOM_MIN, c, &req2), "iallreduce");
    EXPECT_OK(loom_wait(req1), "wait ibroadcast");
    EXPECT_OK(loom_wait(req2), "wait iallreduce");
    for (size_t i = 0; i < n && !failures; i++) {
        check_eq(c, "ibroadcast", r, i, val(0, i));
        int32_t want = val(0, i);
        for (int k = 1; k < P; k++)
            want = val(k, i) < want ? val(k, i) : want;
        check_eq(c, "iallreduce", s + 2 * n, i, want);
    }

    /* allgatherv and alltoallv with empty and uneven blocks */
    size_t counts[4], displs[4], sc[4], sd[4], total = 0, stotal = 0;
    for (int k = 0; k < P; k++) {
        counts[k] = (size_t)((k * 3) % 4) * 100;
        displs[k] = total;
        total += counts[k];
    }
    for (size_t i = 0; i < counts[me]; i++)
        s[i] = val(me, i);
    EXPECT_OK(loom_allgatherv(s, counts[me], r, counts, displs, LOOM_INT32, c), "allgatherv");
    for (int k = 0; k < P && !failures; k++)
        for (size_t i = 0; i < counts[k]; i++)
            check_eq(c, "allgatherv", r, displs[k] + i, val(k, i));
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
        s[i] = val(me, i);
    EXPECT_OK(loom_alltoallv(s, sc, sd, r, counts, displs, LOOM_INT32, c), "alltoallv");
    for (int k = 0; k < P && !failures; k++) {
        size_t from = 0; /* rank k's block for me starts after its blocks for ranks < me */
        for (int j = 0; j < me; j++)
            from += (size_t)((k + 2 * j) % 3) * 150;
        for (size_t i = 0; i < counts[k]; i++)
            check_eq(c, "alltoallv", r, displs[k] + i, val(k, from + i));
    }

    /* blocking send/recv around a ring on "GPU" buffers: even ranks send first */
    if (P > 1) {
        int next = (me + 1) % P, prev = (me + P - 1) % P;
        for (size_t i = 0; i < n; i++)
            s[i] = val(me, i);
        loom_status_t a = me % 2 == 0 ? loom_send(s, n, LOOM_INT32, next, 9, c)
                                      : loom_recv(r, n, LOOM_INT32, prev, 9, c);
        loom_status_t b = me % 2 == 0 ? loom_recv(r, n, LOOM_INT32, prev, 9, c)
                                      : loom_send(s, n, LOOM_INT32, next, 9, c);
        if (a != LOOM_SUCCESS || b != LOOM_SUCCESS)
            bad(c, "send/recv: %s", loom_comm_last_error(c));
        for (size_t i = 0; i < n && !failures; i++)
            check_eq(c, "send/recv", r, i, val(prev, i));
        if (loom_isend(s, n, LOOM_INT32, next, 9, c, &req1) != LOOM_ERR_UNSUPPORTED)
            bad(c, "loom_isend on a GPU buffer was not refused");
    }

    /* mixing host and GPU buffers */
    int32_t *host = calloc(n, sizeof(int32_t));
    if (loom_allreduce(s, host, n, LOOM_INT32, LOOM_SUM, c) != LOOM_ERR_INVALID_ARG ||
        !strstr(loom_comm_last_error(c), "GPU memory"))
        bad(c, "a host/GPU mix was not refused clearly: %s", loom_comm_last_error(c));
    EXPECT_OK(loom_barrier(c), "barrier after the refused call");
    free(host);
    dev_free(s);
    dev_free(r);
    loom_cuda_test_backend(NULL, NULL, NULL, NULL, NULL);
    return failures ? 1 : 0;
}

int main(void)
{
    static const char *const chunks[] = {NULL, "256"};
    for (int ch = 0; ch < 2; ch++) {
        if (chunks[ch])
            setenv("LOOM_CUDA_CHUNK_BYTES", chunks[ch], 1);
        else
            unsetenv("LOOM_CUDA_CHUNK_BYTES");
        for (int n = 1; n <= 4; n++) {
            char name[128];
            snprintf(name, sizeof(name), "collectives and send/recv on GPU-buffer doubles, %d rank%s, chunk %s",
                     n, n > 1 ? "s" : "", chunks[ch] ? chunks[ch] : "default");
            mp_result(name, mp_run(n, rank_main, NULL, 300) == 0);
        }
    }
    return mp_summary();
}
