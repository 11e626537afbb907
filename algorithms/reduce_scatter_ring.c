/*
 * reduce_scatter_ring.c - ring reduce-scatter (equal blocks), chunked and
 * pipelined.
 *
 * Source: P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms
 * for clusters of workstations", JPDC 69(2), 2009 (its first phase); R.
 * Thakur, R. Rabenseifner and W. Gropp, IJHPCA 19(1), 2005, section 4.5; Open
 * MPI's ompi_coll_base_reduce_scatter_intra_ring.
 *
 * Steps, the input being n blocks of count elements, right = rank+1, left =
 * rank-1: for s = 0 .. n-2 send block (rank-s-1) mod n to the right (our
 * input at s = 0, the partial result of step s-1 afterwards) and receive the
 * partial result of block (rank-s-2) mod n from the left, reducing our input
 * of that block into it. At the last step that block is our own and the
 * reduction goes straight into recvbuf. Blocks travel in segments of
 * ctx->segment_bytes: the receive of segment j+1 is posted before segment j is
 * reduced, so the reduction overlaps the transfer.
 *
 * Cost: n-1 latencies, (n-1) * count elements sent per rank and (n-1) * count
 * reductions: bandwidth-optimal.
 *
 * Limits: none (any n, any count). In place (sendbuf == recvbuf holding n *
 * count elements) the result lands in the first count elements and the rest
 * of recvbuf is left as it was.
 * Memory: 2 * count elements of scratch (partial results of two consecutive
 * steps; count elements when n == 2).
 */
#include <stdint.h>
#include <string.h>

#include "algorithms.h"
#include "base/reduce.h"

static size_t min_sz(size_t x, size_t y)
{
    return x < y ? x : y;
}

static int overlaps(const char *p, const char *q, size_t bytes)
{
    return (uintptr_t)p < (uintptr_t)q + bytes && (uintptr_t)q < (uintptr_t)p + bytes;
}

/*
 * One step: send count elements of sbuf to the right in segments while the
 * left neighbour's partial result arrives, segment by segment, in acc; then
 * dst = own (op) acc per segment. When dst overlaps sbuf (in place, n == 2)
 * each segment's send completes before that segment of dst is written.
 */
static loom_status_t step(loom_ctx_t *ctx, const loom_coll_args_t *a, uint32_t stepno,
                          const char *sbuf, char *acc, const char *own, char *dst, size_t seg)
{
    const size_t es = a->esize, count = a->count;
    const int right = (ctx->rank + 1) % ctx->size;
    const int left = (ctx->rank - 1 + ctx->size) % ctx->size;
    const size_t nseg = (count + seg - 1) / seg;
    const int drain = overlaps(sbuf, dst, count * es);
    loom_tp_req_t sreq[2], rreq[2];
    int spending[2] = { 0, 0 };
    loom_status_t st;

    st = loom_p2p_irecv(ctx, left, stepno, acc, min_sz(seg, count) * es, &rreq[0]);
    if (st != LOOM_SUCCESS)
        goto out;
    for (size_t j = 0; j < nseg; j++) {
        const int k = (int)(j & 1);
        const size_t off = j * seg, len = min_sz(seg, count - off);
        if (spending[k]) {
            st = loom_p2p_wait(ctx, &sreq[k]);
            if (st != LOOM_SUCCESS)
                goto out;
            spending[k] = 0;
        }
        st = loom_p2p_isend(ctx, right, stepno, sbuf + off * es, len * es, &sreq[k]);
        if (st != LOOM_SUCCESS)
            goto out;
        spending[k] = 1;
        if (j + 1 < nseg) {
            size_t noff = off + seg;
            st = loom_p2p_irecv(ctx, left, stepno, acc + noff * es, min_sz(seg, count - noff) * es,
                                &rreq[1 - k]);
            if (st != LOOM_SUCCESS)
                goto out;
        }
        st = loom_p2p_wait(ctx, &rreq[k]);
        if (st != LOOM_SUCCESS)
            goto out;
        if (drain) {
            st = loom_p2p_wait(ctx, &sreq[k]);
            if (st != LOOM_SUCCESS)
                goto out;
            spending[k] = 0;
        }
        loom_reduce_local3(dst + off * es, own + off * es, acc + off * es, len, a->dtype, a->op);
    }
    for (int k = 0; k < 2; k++) {
        if (spending[k]) {
            st = loom_p2p_wait(ctx, &sreq[k]);
            if (st != LOOM_SUCCESS)
                goto out;
        }
    }
out:
    return st;
}

loom_status_t loom_reduce_scatter_ring(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, rank = ctx->rank;
    const size_t es = a->esize, count = a->count, bytes = count * es;
    const char *in = a->sendbuf;
    char *out = a->recvbuf;
    loom_status_t st = LOOM_SUCCESS;

    if (count == 0)
        goto out;
    if (n == 1) {
        if (in != out)
            memcpy(out, in, bytes);
    } else {
        size_t seg = ctx->segment_bytes / es;
        if (seg == 0)
            seg = ctx->segment_bytes == 0 ? count : 1;
        seg = min_sz(seg, count);
        char *acc = loom_ctx_scratch(ctx, (n == 2 ? 1 : 2) * bytes);
        if (acc == NULL) {
            st = LOOM_ERR_NO_MEMORY;
            goto out;
        }
        for (int s = 0; s < n - 1; s++) {
            size_t sb = (size_t)(((rank - s - 1) % n + n) % n);
            size_t rb = (size_t)(((rank - s - 2) % n + n) % n);
            /* Alternate two buffers: the one sent now was filled by the previous step. */
            char *cur = acc + (size_t)(s & 1) * bytes;
            const char *prev = acc + (size_t)((s + 1) & 1) * bytes;
            char *dst = s == n - 2 ? out : cur;
            st = step(ctx, a, (uint32_t)s, s == 0 ? in + sb * bytes : prev, cur, in + rb * bytes,
                      dst, seg);
            if (st != LOOM_SUCCESS)
                goto out;
        }
    }
    if (a->op == LOOM_AVG)
        loom_reduce_avg_finalize(out, count, a->dtype, n);
out:
    return st;
}
