/*
 * allreduce_ring.c - bandwidth-optimal ring allreduce: ring reduce-scatter
 * followed by ring allgather, with the reduce-scatter chunked and pipelined.
 *
 * Source: P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms
 * for clusters of workstations", JPDC 69(2), 2009; the same schedule as Open
 * MPI's ompi_coll_base_allreduce_intra_ring (segmented variant).
 *
 * Steps, for n ranks, the vector cut into n blocks (block b gets count/n
 * elements, the first count%n blocks one more), right = rank+1, left = rank-1:
 *  1. reduce-scatter, n-1 steps: at step s send block (rank-s) to the right
 *     (our input at s = 0, the partial result of step s-1 afterwards) and
 *     receive block (rank-s-1) from the left, reducing it with our input into
 *     recvbuf. Each block travels in segments of ctx->segment_bytes: the
 *     receive of segment j+1 is posted before segment j is reduced, so the
 *     reduction overlaps the transfer. After n-1 steps rank r holds the full
 *     result of block (r+1) mod n (divided by n here for LOOM_AVG).
 *  2. allgather, n-1 steps: at step s send block (rank+1-s) to the right and
 *     receive block (rank-s) from the left straight into recvbuf.
 * Each element is reduced at exactly one rank, in one order, and then copied:
 * the result is bitwise identical on every rank.
 *
 * Cost: 2(n-1) latencies, 2(n-1)/n * bytes sent per rank, (n-1)/n * count
 * reductions per rank. Best for large vectors; the latency term grows with n.
 *
 * Limits: none (any n, any count; blocks may be empty when count < n).
 * Memory: two segments of scratch (2 * segment_bytes, rounded to elements).
 * sendbuf is never written; in place (sendbuf == recvbuf) needs no copy.
 */
#include <string.h>

#include "algorithms.h"
#include "reduce.h"

/* Elements of block b when count is split into n blocks as evenly as possible. */
static size_t block_count(size_t count, int n, int b)
{
    return count / (size_t)n + ((size_t)b < count % (size_t)n ? 1 : 0);
}

static size_t block_offset(size_t count, int n, int b)
{
    size_t rem = count % (size_t)n;
    return (size_t)b * (count / (size_t)n) + ((size_t)b < rem ? (size_t)b : rem);
}

static size_t min_sz(size_t x, size_t y)
{
    return x < y ? x : y;
}

/*
 * One reduce-scatter step: send scount elements of sbuf to the right in
 * segments of seg elements while receiving rcount elements from the left in
 * segments into the double buffer tmp, and set out = own (op) received per
 * segment. Both neighbours cut a block identically, so segment sizes match.
 */
static loom_status_t rs_step(loom_ctx_t *ctx, const loom_coll_args_t *a, uint32_t step,
                             const char *sbuf, size_t scount, char *out, const char *own,
                             size_t rcount, char *tmp, size_t seg)
{
    const size_t es = a->esize;
    const int right = (ctx->rank + 1) % ctx->size;
    const int left = (ctx->rank - 1 + ctx->size) % ctx->size;
    const size_t nsend = (scount + seg - 1) / seg;
    const size_t nrecv = (rcount + seg - 1) / seg;
    const size_t nit = nsend > nrecv ? nsend : nrecv;
    loom_tp_req_t sreq[2], rreq[2];
    int spending[2] = { 0, 0 };
    loom_status_t st = LOOM_SUCCESS;

    if (nrecv > 0) {
        st = loom_p2p_irecv(ctx, left, step, tmp, min_sz(seg, rcount) * es, &rreq[0]);
        if (st != LOOM_SUCCESS)
            goto out;
    }
    for (size_t j = 0; j < nit; j++) {
        const int k = (int)(j & 1);
        if (j < nsend) {
            /* Two sends in flight at most: the slot is reused every other segment. */
            if (spending[k]) {
                st = loom_p2p_wait(ctx, &sreq[k]);
                if (st != LOOM_SUCCESS)
                    goto out;
            }
            size_t off = j * seg;
            st = loom_p2p_isend(ctx, right, step, sbuf + off * es, min_sz(seg, scount - off) * es,
                                &sreq[k]);
            if (st != LOOM_SUCCESS)
                goto out;
            spending[k] = 1;
        }
        if (j + 1 < nrecv) {
            /* The other half of tmp was consumed by the reduction of segment j-1. */
            size_t off = (j + 1) * seg;
            st = loom_p2p_irecv(ctx, left, step, tmp + (size_t)(1 - k) * seg * es,
                                min_sz(seg, rcount - off) * es, &rreq[1 - k]);
            if (st != LOOM_SUCCESS)
                goto out;
        }
        if (j < nrecv) {
            st = loom_p2p_wait(ctx, &rreq[k]);
            if (st != LOOM_SUCCESS)
                goto out;
            size_t off = j * seg;
            loom_reduce_local3(out + off * es, own + off * es, tmp + (size_t)k * seg * es,
                               min_sz(seg, rcount - off), a->dtype, a->op);
        }
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

loom_status_t loom_allreduce_ring(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, rank = ctx->rank;
    const size_t es = a->esize, count = a->count;
    const char *in = a->sendbuf;
    char *out = a->recvbuf;
    loom_status_t st = LOOM_SUCCESS;

    if (count == 0)
        goto out;
    if (n == 1) {
        if (in != out)
            memcpy(out, in, count * es);
        if (a->op == LOOM_AVG)
            loom_reduce_avg_finalize(out, count, a->dtype, n);
        goto out;
    }

    size_t seg = ctx->segment_bytes / es;
    if (seg == 0)
        seg = ctx->segment_bytes == 0 ? count : 1;
    /* A segment never needs to exceed the largest block. */
    seg = min_sz(seg, block_count(count, n, 0));
    char *tmp = loom_ctx_scratch(ctx, 2 * seg * es);
    if (tmp == NULL) {
        st = LOOM_ERR_NO_MEMORY;
        goto out;
    }

    for (int s = 0; s < n - 1; s++) {
        int sb = ((rank - s) % n + n) % n;
        int rb = ((rank - s - 1) % n + n) % n;
        /* What we forward is our raw input at the first step and the partial
         * result written into recvbuf by the previous step afterwards. */
        const char *src = s == 0 ? in : out;
        size_t soff = block_offset(count, n, sb) * es;
        size_t roff = block_offset(count, n, rb) * es;
        st = rs_step(ctx, a, (uint32_t)s, src + soff, block_count(count, n, sb), out + roff,
                     in + roff, block_count(count, n, rb), tmp, seg);
        if (st != LOOM_SUCCESS)
            goto out;
    }

    /* Divide once, where the block is complete, so every rank gets the same bits. */
    int mine = (rank + 1) % n;
    if (a->op == LOOM_AVG)
        loom_reduce_avg_finalize(out + block_offset(count, n, mine) * es,
                                 block_count(count, n, mine), a->dtype, n);

    const int right = (rank + 1) % n, left = (rank - 1 + n) % n;
    for (int s = 0; s < n - 1; s++) {
        int sb = ((rank + 1 - s) % n + n) % n;
        int rb = ((rank - s) % n + n) % n;
        size_t sc = block_count(count, n, sb), rc = block_count(count, n, rb);
        /* Block sizes are known to both sides: empty blocks are skipped on both. */
        st = loom_p2p_sendrecv(ctx, sc ? right : -1, out + block_offset(count, n, sb) * es,
                               sc * es, rc ? left : -1, out + block_offset(count, n, rb) * es,
                               rc * es, (uint32_t)(n - 1 + s));
        if (st != LOOM_SUCCESS)
            goto out;
    }
out:
    return st;
}
