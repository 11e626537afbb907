/*
 * direct.c - allreduce, broadcast and allgather inside one node, working on
 * the peers' buffers in place through one-sided reads (cross-memory attach)
 * instead of messages: every byte is copied once, straight from the buffer
 * that holds it, so the collectives run at memory bandwidth rather than at
 * the rate of a message ring.
 *
 * Ranks first swap the addresses of their buffers (a few small messages),
 * then read what they need from each other, and end with a fence of empty
 * messages, so that nobody returns (and reuses a buffer) while a peer may
 * still read it.
 *
 * allreduce: rank i reduces slice i of the vector, reading slice i of every
 * peer's input piece by piece into a cache-sized buffer and reducing it into
 * its own output slice (a reduce-scatter); after a fence every rank copies
 * the other slices from their owners' outputs (an allgather).
 */
#include <string.h>

#include "algorithms.h"
#include "blocks.h"
#include "direct.h"
#include "base/reduce.h"

/* The piece of a peer's slice read before it is reduced: stays in L2. */
#define PIECE_BYTES (256 * 1024)

int loom_direct_can_run(const loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    (void)a;
    if (ctx->size > MAX_DIRECT_RANKS)
        return 0;
    for (int p = 0; p < ctx->size; p++)
        if (p != ctx->rank && !loom_p2p_can_read(ctx, p))
            return 0;
    return 1;
}

/* Everyone's two buffer addresses: mine[0..1] -> all[2p], all[2p+1]. */
static loom_status_t swap_addrs(loom_ctx_t *ctx, const void *send, const void *recv,
                                uint64_t *all)
{
    loom_tp_req_t reqs[2 * MAX_DIRECT_RANKS];
    const int n = ctx->size, me = ctx->rank;
    int nreq = 0;
    all[2 * me] = (uint64_t)(uintptr_t)send;
    all[2 * me + 1] = (uint64_t)(uintptr_t)recv;
    for (int p = 0; p < n; p++) {
        if (p == me)
            continue;
        loom_status_t st = loom_p2p_irecv(ctx, p, STEP_ADDRS, &all[2 * p], 2 * sizeof(uint64_t),
                                          &reqs[nreq++]);
        if (st == LOOM_SUCCESS)
            st = loom_p2p_isend(ctx, p, STEP_ADDRS, &all[2 * me], 2 * sizeof(uint64_t),
                                &reqs[nreq++]);
        if (st != LOOM_SUCCESS)
            return st;
    }
    return loom_p2p_waitall(ctx, reqs, nreq);
}

/* Everybody has reached this point (an empty message to and from each peer). */
loom_status_t loom_direct_fence(loom_ctx_t *ctx, uint32_t step)
{
    loom_tp_req_t reqs[2 * MAX_DIRECT_RANKS];
    char none[1];
    int nreq = 0;
    for (int p = 0; p < ctx->size; p++) {
        if (p == ctx->rank)
            continue;
        loom_status_t st = loom_p2p_irecv(ctx, p, step, none, 0, &reqs[nreq++]);
        if (st == LOOM_SUCCESS)
            st = loom_p2p_isend(ctx, p, step, none, 0, &reqs[nreq++]);
        if (st != LOOM_SUCCESS)
            return st;
    }
    return loom_p2p_waitall(ctx, reqs, nreq);
}

/* An allreduce with nothing to exchange: one rank, or no elements. */
loom_status_t loom_direct_alone(const loom_coll_args_t *a, int n)
{
    if (a->count && a->sendbuf != a->recvbuf)
        memcpy(a->recvbuf, a->sendbuf, a->count * a->esize);
    if (a->op == LOOM_AVG && a->count)
        loom_reduce_avg_finalize(a->recvbuf, a->count, a->dtype, n);
    return LOOM_SUCCESS;
}

loom_status_t loom_allreduce_direct(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, me = ctx->rank;
    const size_t es = a->esize;
    const char *in = a->sendbuf;
    char *out = a->recvbuf;
    if (n == 1 || a->count == 0)
        return loom_direct_alone(a, n);
    uint64_t addrs[2 * MAX_DIRECT_RANKS];
    loom_status_t st = swap_addrs(ctx, in, out, addrs);
    if (st != LOOM_SUCCESS)
        return st;

    size_t first = loom_block_offset(a->count, n, me), mine = loom_block_count(a->count, n, me);
    size_t piece = PIECE_BYTES / es ? PIECE_BYTES / es : 1;
    char *tmp = loom_ctx_scratch(ctx, piece * es);
    if (!tmp)
        return LOOM_ERR_NO_MEMORY;
    for (size_t done = 0; done < mine; done += piece) {
        size_t k = mine - done < piece ? mine - done : piece;
        size_t off = (first + done) * es;
        for (int j = 1; j < n; j++) {
            /* Start at a different peer on every rank so no buffer is read by all at once. */
            int p = (me + j) % n;
            if ((st = loom_p2p_read(ctx, p, tmp, addrs[2 * p] + off, k * es)) != LOOM_SUCCESS)
                return st;
            loom_ctx_reduce(ctx, out + off, j == 1 ? in + off : out + off, tmp, k, a->dtype, a->op);
        }
        if (a->op == LOOM_AVG)
            loom_reduce_avg_finalize(out + off, k, a->dtype, n);
    }
    if ((st = loom_direct_fence(ctx, STEP_MIDDLE)) != LOOM_SUCCESS)
        return st;
    for (int j = 1; j < n; j++) {
        int p = (me + j) % n;
        size_t pfirst = loom_block_offset(a->count, n, p);
        size_t pcount = loom_block_count(a->count, n, p);
        if (pcount &&
            (st = loom_p2p_read(ctx, p, out + pfirst * es, addrs[2 * p + 1] + pfirst * es,
                                pcount * es)) != LOOM_SUCCESS)
            return st;
    }
    return loom_direct_fence(ctx, STEP_END);
}

loom_status_t loom_broadcast_direct(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, me = ctx->rank;
    const size_t bytes = a->count * a->esize;
    if (n == 1 || bytes == 0)
        return LOOM_SUCCESS;
    loom_tp_req_t reqs[MAX_DIRECT_RANKS];
    uint64_t root_addr = (uint64_t)(uintptr_t)a->recvbuf;
    loom_status_t st;
    if (me == a->root) {
        int nreq = 0;
        for (int p = 0; p < n; p++)
            if (p != me && (st = loom_p2p_isend(ctx, p, STEP_ADDRS, &root_addr, sizeof(root_addr),
                                                &reqs[nreq++])) != LOOM_SUCCESS)
                return st;
        if ((st = loom_p2p_waitall(ctx, reqs, nreq)) != LOOM_SUCCESS)
            return st;
        /* The buffer must stay as it is until every rank has its copy. */
        char none[1];
        nreq = 0;
        for (int p = 0; p < n; p++)
            if (p != me && (st = loom_p2p_irecv(ctx, p, STEP_END, none, 0, &reqs[nreq++])) !=
                               LOOM_SUCCESS)
                return st;
        return loom_p2p_waitall(ctx, reqs, nreq);
    }
    if ((st = loom_p2p_irecv(ctx, a->root, STEP_ADDRS, &root_addr, sizeof(root_addr), &reqs[0])) !=
            LOOM_SUCCESS ||
        (st = loom_p2p_wait(ctx, &reqs[0])) != LOOM_SUCCESS ||
        (st = loom_p2p_read(ctx, a->root, a->recvbuf, root_addr, bytes)) != LOOM_SUCCESS)
        return st;
    char none[1];
    if ((st = loom_p2p_isend(ctx, a->root, STEP_END, none, 0, &reqs[0])) != LOOM_SUCCESS)
        return st;
    return loom_p2p_wait(ctx, &reqs[0]);
}

loom_status_t loom_allgather_direct(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, me = ctx->rank;
    const size_t block = a->count * a->esize;
    char *out = a->recvbuf;
    if (block == 0)
        return LOOM_SUCCESS;
    if (a->sendbuf != out + (size_t)me * block)
        memcpy(out + (size_t)me * block, a->sendbuf, block);
    if (n == 1)
        return LOOM_SUCCESS;
    uint64_t addrs[2 * MAX_DIRECT_RANKS];
    loom_status_t st = swap_addrs(ctx, a->sendbuf, out, addrs);
    if (st != LOOM_SUCCESS)
        return st;
    for (int j = 1; j < n; j++) {
        int p = (me + j) % n;
        if ((st = loom_p2p_read(ctx, p, out + (size_t)p * block, addrs[2 * p], block)) !=
            LOOM_SUCCESS)
            return st;
    }
    return loom_direct_fence(ctx, STEP_END);
}
