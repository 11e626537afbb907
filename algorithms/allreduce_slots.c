/*
 * allreduce_slots.c - small allreduces inside one node through slots in the
 * staging windows, without a message: every rank copies its vector into its
 * slot, passes a window fence (window.c) and reduces all the ranks' slots,
 * in rank order, into its output. A few cache lines change hands; the
 * message algorithms pay a record, a match and often a wake-up per peer and
 * step. Every rank adds the same slots in the same order, so all get the
 * same bits.
 *
 * Two slots alternate by the fence's parity: a rank fills a slot again two
 * fences later, after every peer passed the fence between, and a peer passes
 * it only once it has read that slot. A vector larger than a slot goes in
 * slot-sized chunks, a fence each (correct, but the selection gives such
 * sizes to other algorithms). Each slot's head names the call, so ranks that
 * disagree on the call or the count fail with LOOM_ERR_MISMATCH, as the
 * message algorithms' frame check makes them.
 *
 * Limits: up to MAX_DIRECT_RANKS ranks, all on one node, every one with a
 * window (loom_slots_can_run). Memory: none of its own.
 */
#include <string.h>

#include "algorithms.h"
#include "direct.h"
#include "base/reduce.h"
#include "transports/wire.h"

int loom_slots_can_run(const loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    if (ctx->size > MAX_DIRECT_RANKS)
        return 0;
    for (int p = 0; p < ctx->size; p++) {
        size_t wlen = 0;
        if (loom_p2p_window(ctx, p, &wlen) == NULL || loom_window_slot_bytes(wlen) < a->esize)
            return 0;
    }
    return 1;
}

/* Whether peer's slot holds the same call as ours (the message algorithms'
 * wording when not). */
static loom_status_t same_call(loom_ctx_t *ctx, int peer, const loom_slot_head_t *mine,
                               const loom_slot_head_t *theirs)
{
    loom_frame_t arrived = {.match = {.desc = theirs->desc, .total = theirs->total},
                            .len = theirs->bytes};
    loom_tp_req_t posted = {.peer = peer, .match = {.desc = mine->desc, .total = mine->total},
                            .len = (size_t)mine->bytes};
    return loom_frame_check(&arrived, &posted, ctx->rank, ctx->err);
}

loom_status_t loom_allreduce_slots(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, me = ctx->rank;
    const size_t es = a->esize;
    if (n == 1 || a->count == 0)
        return loom_direct_alone(a, n);
    char *win[MAX_DIRECT_RANKS];
    size_t wlen = 0;
    for (int p = 0; p < n; p++)
        win[p] = loom_p2p_window(ctx, p, &wlen);
    const size_t chunk = loom_window_slot_bytes(wlen) / es;
    const char *in = a->sendbuf;
    char *out = a->recvbuf;
    for (size_t off = 0; off < a->count;) {
        const size_t k = a->count - off < chunk ? a->count - off : chunk;
        const uint32_t fence = loom_window_next_fence(win[me]);
        loom_slot_head_t *mine = loom_window_slot(win[me], wlen, fence);
        mine->desc = ctx->desc;
        mine->total = ctx->total;
        mine->bytes = k * es;
        memcpy((char *)mine + LOOM_SLOT_HEAD_BYTES, in + off * es, k * es);
        loom_status_t st = loom_window_fence(ctx, win, wlen);
        if (st != LOOM_SUCCESS)
            return st;
        char *acc = out + off * es;
        const char *first = NULL;
        for (int p = 0; p < n; p++) {
            loom_slot_head_t *theirs = loom_window_slot(win[p], wlen, fence);
            if (p != me && (st = same_call(ctx, p, mine, theirs)) != LOOM_SUCCESS)
                return st;
            const char *data = (const char *)theirs + LOOM_SLOT_HEAD_BYTES;
            if (p == 0)
                first = data;
            else
                loom_ctx_reduce(ctx, acc, p == 1 ? first : acc, data, k, a->dtype, a->op);
        }
        if (a->op == LOOM_AVG)
            loom_reduce_avg_finalize(acc, k, a->dtype, n);
        off += k;
    }
    return LOOM_SUCCESS;
}
