/*
 * allreduce_ring.c - bandwidth-optimal ring allreduce: ring reduce-scatter
 * followed by ring allgather, pipelined in segments across all steps.
 *
 * Source: P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms
 * for clusters of workstations", JPDC 69(2), 2009; the segment pipeline follows
 * NCCL's ring (a segment moves on as soon as it is reduced, without waiting
 * for the rest of its block).
 *
 * Steps, for n ranks, the vector cut into n blocks (block b gets count/n
 * elements, the first count%n blocks one more), right = rank+1, left = rank-1,
 * 2(n-1) steps in all:
 *  - step s < n-1 (reduce-scatter): receive block rank-s-1 from the left into
 *    a scratch slot and reduce it with our input into recvbuf;
 *  - step s >= n-1 (allgather): receive block rank-(s-n+1) straight into recvbuf;
 *  - the block sent at step s is the one received at step s-1 (our own input
 *    block at step 0), and each of its segments is sent as soon as that segment
 *    of step s-1 has been reduced (or received).
 * Up to RING_WINDOW receives are posted ahead, so segments land in their final
 * place instead of being copied through an early-message buffer, and up to
 * RING_WINDOW sends are in flight, so reductions overlap transfers both ways.
 * After the last reduce-scatter step rank r holds the full result of block
 * r+1 (divided by n for LOOM_AVG) and the allgather spreads it. Each element is
 * reduced at exactly one rank, in one order: the result is bitwise identical
 * on every rank.
 *
 * Cost: 2(n-1) latencies, 2(n-1)/n * bytes sent per rank, (n-1)/n * count
 * reductions per rank. Best for large vectors; the latency term grows with n.
 *
 * Limits: none (any n, any count; blocks may be empty when count < n).
 * Memory: RING_WINDOW segments of scratch (segment = LOOM_SEGMENT_BYTES).
 * In place (sendbuf == recvbuf) a block is only received into after our last
 * send from it has completed.
 */
#include <string.h>

#include "algorithms.h"
#include "blocks.h"
#include "base/reduce.h"

#define RING_WINDOW 8

typedef struct ring {
    int n, rank;
    size_t count, seg;
} ring_t;

static size_t block_count(const ring_t *r, int b)
{
    return loom_block_count(r->count, r->n, b);
}

static size_t block_offset(const ring_t *r, int b)
{
    return loom_block_offset(r->count, r->n, b);
}

static size_t nsegs(const ring_t *r, int b)
{
    return (block_count(r, b) + r->seg - 1) / r->seg;
}

static int recv_block(const ring_t *r, int s)
{
    return s < r->n - 1 ? loom_mod(r->rank - s - 1, r->n)
                        : loom_mod(r->rank - (s - r->n + 1), r->n);
}

static int send_block(const ring_t *r, int s)
{
    return s == 0 ? r->rank : recv_block(r, s - 1);
}

/* A position in the sequence of segments of steps 0 .. 2(n-1)-1. */
typedef struct cursor {
    int step;
    size_t seg;
} cursor_t;

/* Skip to the next segment that exists (blocks may be empty). */
static void cursor_settle(const ring_t *r, cursor_t *c, int (*block_of)(const ring_t *, int))
{
    while (c->step < 2 * (r->n - 1) && c->seg >= nsegs(r, block_of(r, c->step))) {
        c->step++;
        c->seg = 0;
    }
}

static void cursor_next(const ring_t *r, cursor_t *c, int (*block_of)(const ring_t *, int))
{
    c->seg++;
    cursor_settle(r, c, block_of);
}

loom_status_t loom_allreduce_ring(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const size_t es = a->esize;
    const char *in = a->sendbuf;
    char *out = a->recvbuf;
    loom_status_t st = LOOM_SUCCESS;
    ring_t r = {ctx->size, ctx->rank, a->count, 0};

    if (a->count == 0)
        goto out;
    if (r.n == 1) {
        if (in != out)
            memcpy(out, in, a->count * es);
        if (a->op == LOOM_AVG)
            loom_reduce_avg_finalize(out, a->count, a->dtype, r.n);
        goto out;
    }
    r.seg = ctx->segment_bytes / es;
    if (r.seg == 0)
        r.seg = 1;
    if (r.seg > block_count(&r, 0))
        r.seg = block_count(&r, 0);

    /* Scratch: the receive slots, then the number of sends of each step. */
    const int nsteps = 2 * (r.n - 1);
    size_t slots_bytes = RING_WINDOW * r.seg * es;
    slots_bytes = (slots_bytes + 63) & ~(size_t)63;
    char *slots = loom_ctx_scratch(ctx, slots_bytes + ((size_t)nsteps + 1) * sizeof(size_t));
    if (slots == NULL) {
        st = LOOM_ERR_NO_MEMORY;
        goto out;
    }
    /* sends_before[s]: segments sent in steps < s; a block received at allgather
     * step t overwrites what step t sent, so that send must be complete first. */
    size_t *sends_before = (size_t *)(slots + slots_bytes);
    sends_before[0] = 0;
    for (int s = 0; s < nsteps; s++)
        sends_before[s + 1] = sends_before[s] + nsegs(&r, send_block(&r, s));
    const size_t total_sends = sends_before[nsteps];
    const size_t own_segs = nsegs(&r, r.rank);
    size_t total_recvs = 0;
    for (int s = 0; s < nsteps; s++)
        total_recvs += nsegs(&r, recv_block(&r, s));

    const int right = loom_mod(r.rank + 1, r.n), left = loom_mod(r.rank - 1, r.n);
    loom_tp_req_t sreq[RING_WINDOW], rreq[RING_WINDOW];
    cursor_t rpost = {0, 0}, rdone = {0, 0}, spost = {0, 0};
    cursor_settle(&r, &rpost, recv_block);
    cursor_settle(&r, &rdone, recv_block);
    cursor_settle(&r, &spost, send_block);
    size_t nrposted = 0, nrdone = 0, nsposted = 0, nsdone = 0;

    while (nrdone < total_recvs || nsdone < total_sends) {
        while (nsdone < nsposted && loom_p2p_test(ctx, &sreq[nsdone % RING_WINDOW])) {
            if ((st = sreq[nsdone % RING_WINDOW].status) != LOOM_SUCCESS)
                goto out;
            nsdone++;
        }
        /* Send what is ready: our own block at once, the rest once received. */
        while (nsposted < total_sends && nsposted - nsdone < RING_WINDOW &&
               (nsposted < own_segs || nsposted - own_segs < nrdone)) {
            int b = send_block(&r, spost.step);
            size_t off = spost.seg * r.seg, len = block_count(&r, b) - off;
            len = len < r.seg ? len : r.seg;
            const char *src = (spost.step == 0 ? in : out) + (block_offset(&r, b) + off) * es;
            st = loom_p2p_isend(ctx, right, (uint32_t)spost.step, src, len * es,
                                &sreq[nsposted % RING_WINDOW]);
            if (st != LOOM_SUCCESS)
                goto out;
            nsposted++;
            cursor_next(&r, &spost, send_block);
        }
        /* Post receives ahead, into a slot (reduce-scatter) or their place. */
        while (nrposted < total_recvs && nrposted - nrdone < RING_WINDOW) {
            int s = rpost.step, b = recv_block(&r, s);
            if (s >= r.n - 1 && nsdone < sends_before[s - (r.n - 1) + 1])
                break;
            size_t off = rpost.seg * r.seg, len = block_count(&r, b) - off;
            len = len < r.seg ? len : r.seg;
            char *dst = s < r.n - 1 ? slots + (nrposted % RING_WINDOW) * r.seg * es
                                    : out + (block_offset(&r, b) + off) * es;
            st = loom_p2p_irecv(ctx, left, (uint32_t)s, dst, len * es,
                                &rreq[nrposted % RING_WINDOW]);
            if (st != LOOM_SUCCESS)
                goto out;
            nrposted++;
            cursor_next(&r, &rpost, recv_block);
        }
        if (nrdone < nrposted) {
            loom_tp_req_t *req = &rreq[nrdone % RING_WINDOW];
            /* A finished send may let us post the send our receiver waits for. */
            loom_tp_req_t *either[2] = {req, nsdone < nsposted ? &sreq[nsdone % RING_WINDOW] : NULL};
            if ((st = loom_p2p_wait_any(ctx, either, 2)) != LOOM_SUCCESS)
                goto out;
            if (!req->done)
                continue;
            if ((st = req->status) != LOOM_SUCCESS)
                goto out;
            int s = rdone.step, b = recv_block(&r, s);
            if (s < r.n - 1) {
                size_t off = block_offset(&r, b) + rdone.seg * r.seg;
                size_t len = req->len / es;
                loom_ctx_reduce(ctx, out + off * es, in + off * es, req->buf, len, a->dtype, a->op);
                /* Divide once, where the block is complete, so every rank gets the same bits. */
                if (s == r.n - 2 && a->op == LOOM_AVG)
                    loom_reduce_avg_finalize(out + off * es, len, a->dtype, r.n);
            }
            nrdone++;
            cursor_next(&r, &rdone, recv_block);
        } else if (nsdone < nsposted) {
            if ((st = loom_p2p_wait(ctx, &sreq[nsdone % RING_WINDOW])) != LOOM_SUCCESS)
                goto out;
        }
    }
out:
    return st;
}
