/* p2p.c - tagged point-to-point inside a running collective, and the wait loop
 * every blocking path goes through: it spins while spinning pays (the policy
 * of base/spin.c: about twice what recent waits took, and on crowded CPUs only
 * while that beats sleeping) and sleeps in the transport otherwise (epoll,
 * futex), failing with LOOM_ERR_TIMEOUT after ctx->timeout_s without progress. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

#include "base/clock.h"
#include "algorithms.h"
#include "base/reduce.h"
#include "base/spin.h"
#include "base/timeline.h"

#define LOOM_COLL_TAG_BIT (UINT64_C(1) << 63)

/* Tags of collective messages: the top bit keeps them apart from user tags,
 * the sequence number apart from the previous and next collective. */
static uint64_t coll_tag(const loom_ctx_t *ctx, uint32_t step)
{
    return LOOM_COLL_TAG_BIT | ((ctx->seq & ((UINT64_C(1) << 39) - 1)) << 24) |
           (uint64_t)((ctx->step_base + step) & 0xffffffu);
}

/* peer is an index of the context's view; the transport knows real ranks. */
static void fill_req(loom_ctx_t *ctx, int peer, uint32_t step, const void *buf, size_t bytes,
                     loom_tp_req_t *req)
{
    memset(req, 0, sizeof(*req));
    req->peer = ctx->rank_map ? ctx->rank_map[peer] : peer;
    req->buf = (void *)buf;
    req->len = bytes;
    req->match.tag = coll_tag(ctx, step);
    req->match.desc = ctx->desc;
    req->match.total = ctx->total;
    req->on_device = ctx->device_mem;
    req->posted_us = ctx->timeline ? loom_timeline_now_us() : 0;
}

/* A "send" or "recv" span from posting to the moment its completion was seen. */
static void trace_done(loom_ctx_t *ctx, loom_tp_req_t *req)
{
    if (!ctx->timeline || req->posted_us <= 0 || !req->done)
        return;
    char args[64];
    snprintf(args, sizeof(args), "\"peer\": %d, \"bytes\": %zu", req->peer, req->len);
    loom_timeline_span(ctx->timeline, req->is_send ? "send" : "recv", "p2p", req->posted_us,
                       loom_timeline_now_us(), ctx->timeline_tid, args);
    req->posted_us = 0;
}

int loom_p2p_test(loom_ctx_t *ctx, loom_tp_req_t *req)
{
    if (req->done)
        trace_done(ctx, req);
    return req->done;
}

/* st, a failure of the transport, with a message: the transport describes a
 * failure once, so the first description is kept for the later calls that
 * get only the status. */
static loom_status_t described(loom_ctx_t *ctx, loom_status_t st)
{
    if (ctx->err->msg[0]) {
        if (!ctx->tp_failure[0])
            snprintf(ctx->tp_failure, sizeof(ctx->tp_failure), "%s", ctx->err->msg);
        return st;
    }
    return loom_err_set(ctx->err, st, "%s", ctx->tp_failure[0] ? ctx->tp_failure
                                            : "the transport failed in an earlier call");
}

static loom_status_t check_peer(loom_ctx_t *ctx, int peer)
{
    if (peer < 0 || peer >= ctx->size || peer == ctx->rank)
        return loom_err_set(ctx->err, LOOM_ERR_INTERNAL,
                            "algorithm addressed peer %d from rank %d of %d", peer, ctx->rank,
                            ctx->size);
    return LOOM_SUCCESS;
}

loom_status_t loom_p2p_isend(loom_ctx_t *ctx, int peer, uint32_t step, const void *buf,
                             size_t bytes, loom_tp_req_t *req)
{
    loom_status_t st = check_peer(ctx, peer);
    if (st != LOOM_SUCCESS)
        return st;
    fill_req(ctx, peer, step, buf, bytes, req);
    req->is_send = 1;
    st = ctx->tp_ops->isend(ctx->tp, req);
    return st == LOOM_SUCCESS ? st : described(ctx, st);
}

loom_status_t loom_p2p_irecv(loom_ctx_t *ctx, int peer, uint32_t step, void *buf, size_t bytes,
                             loom_tp_req_t *req)
{
    loom_status_t st = check_peer(ctx, peer);
    if (st != LOOM_SUCCESS)
        return st;
    fill_req(ctx, peer, step, buf, bytes, req);
    st = ctx->tp_ops->irecv(ctx->tp, req);
    return st == LOOM_SUCCESS ? st : described(ctx, st);
}


/* Transports built before the one-sided ops have a shorter table. */
static int has_peer_read(const loom_transport_ops_t *ops)
{
    return ops && ops->size >= sizeof(loom_transport_ops_t) && ops->peer_readable &&
           ops->peer_read;
}

int loom_p2p_can_read(const loom_ctx_t *ctx, int peer)
{
    return has_peer_read(ctx->tp_ops) &&
           ctx->tp_ops->peer_readable(ctx->tp, ctx->rank_map ? ctx->rank_map[peer] : peer);
}

void *loom_p2p_window(const loom_ctx_t *ctx, int peer, size_t *len_p)
{
    const loom_transport_ops_t *ops = ctx->tp_ops;
    if (!ops || ops->size < sizeof(loom_transport_ops_t) || !ops->window)
        return NULL;
    return ops->window(ctx->tp, ctx->rank_map ? ctx->rank_map[peer] : peer, len_p);
}

loom_status_t loom_p2p_read(loom_ctx_t *ctx, int peer, void *buf, uint64_t addr, size_t bytes)
{
    loom_status_t st = check_peer(ctx, peer);
    if (st != LOOM_SUCCESS)
        return st;
    if (!has_peer_read(ctx->tp_ops))
        return loom_err_set(ctx->err, LOOM_ERR_INTERNAL, "the transport cannot read peers");
    double t0 = ctx->timeline ? loom_timeline_now_us() : 0;
    st = ctx->tp_ops->peer_read(ctx->tp, ctx->rank_map ? ctx->rank_map[peer] : peer, buf, addr,
                                bytes);
    if (ctx->timeline) {
        char args[64];
        snprintf(args, sizeof(args), "\"peer\": %d, \"bytes\": %zu", peer, bytes);
        loom_timeline_span(ctx->timeline, "read", "read", t0, loom_timeline_now_us(),
                           ctx->timeline_tid, args);
    }
    return st;
}

void loom_ctx_reduce(loom_ctx_t *ctx, void *out, const void *a, const void *b, size_t count,
                     loom_dtype_t dt, loom_op_t op)
{
    double t0 = ctx->timeline ? loom_timeline_now_us() : 0;
    loom_reduce_local3(out, a, b, count, dt, op);
    if (ctx->timeline) {
        char args[48];
        snprintf(args, sizeof(args), "\"elements\": %zu", count);
        loom_timeline_span(ctx->timeline, "reduce", "reduce", t0, loom_timeline_now_us(),
                           ctx->timeline_tid, args);
    }
}

/* Seconds since peer was last heard from, < 0 when the transport cannot say. */
static double silent_s(const loom_ctx_t *ctx, int peer)
{
    const loom_transport_ops_t *ops = ctx->tp_ops;
    if (!ops || ops->size < sizeof(loom_transport_ops_t) || !ops->silent_s)
        return -1;
    return ops->silent_s(ctx->tp, peer);
}

/* A wait ran out of LOOM_TIMEOUT on peer waited_on (-1: on no one rank).
 * That peer may only be waiting itself, on a rank further down a chain of
 * waits (the steps of an algorithm): when it was heard from recently (its
 * transport sends keepalives while it waits), the rank silent the longest
 * is the one that stopped answering. The blame goes into ctx->fault, which
 * the communicator hands its transport, which tells every peer. */
int loom_p2p_blame(loom_ctx_t *ctx, int waited_on, char *why, size_t len)
{
    int me = ctx->rank_map ? ctx->rank_map[ctx->rank] : ctx->rank;
    int culprit = waited_on;
    double quiet = waited_on >= 0 ? silent_s(ctx, waited_on) : -1, worst = -1;
    why[0] = '\0';
    if (waited_on < 0 || (quiet >= 0 && quiet < ctx->timeout_s / 2)) {
        int worst_peer = -1;
        for (int p = 0; p < ctx->size; p++) {
            int peer = ctx->rank_map ? ctx->rank_map[p] : p;
            double s = peer == me ? -1 : silent_s(ctx, peer);
            if (s > worst) {
                worst = s;
                worst_peer = peer;
            }
        }
        if (worst >= ctx->timeout_s / 2) {
            culprit = worst_peer;
            if (waited_on >= 0)
                snprintf(why, len, "; rank %d stopped answering (silent for %.1f s, while rank "
                         "%d is alive and waits in turn)", culprit, worst, waited_on);
            else
                snprintf(why, len, "; rank %d stopped answering (silent for %.1f s)", culprit,
                         worst);
        }
    }
    if (!why[0] && culprit >= 0)
        snprintf(why, len, "; rank %d stopped answering", culprit);
    if (ctx->fault)
        *ctx->fault = (loom_tp_fault_t){.culprit = culprit, .reporter = me,
                                        .why = LOOM_ERR_TIMEOUT,
                                        .waited_ms = (uint32_t)(ctx->timeout_s * 1000)};
    return culprit;
}

static loom_status_t timed_out_on(loom_ctx_t *ctx, int peer, size_t bytes)
{
    int me = ctx->rank_map ? ctx->rank_map[ctx->rank] : ctx->rank;
    char why[160];
    loom_p2p_blame(ctx, peer, why, sizeof(why));
    return loom_err_set(ctx->err, LOOM_ERR_TIMEOUT,
                        "timed out: rank %d waited %.1f s (LOOM_TIMEOUT) without progress for %zu "
                        "bytes with rank %d%s", me, ctx->timeout_s, bytes, peer, why);
}

static loom_status_t timed_out(loom_ctx_t *ctx, const loom_tp_req_t *r)
{
    return timed_out_on(ctx, r ? r->peer : -1, r ? r->len - r->off : 0);
}

loom_status_t loom_p2p_window_timeout(loom_ctx_t *ctx, int peer)
{
    return timed_out_on(ctx, ctx->rank_map ? ctx->rank_map[peer] : peer, 0);
}

loom_status_t loom_p2p_window_progress(loom_ctx_t *ctx)
{
    int moved = 0;
    loom_status_t st = ctx->tp_ops->progress(ctx->tp, 0, &moved);
    return st == LOOM_SUCCESS ? st : described(ctx, st);
}

loom_status_t loom_p2p_window_watch(loom_ctx_t *ctx, int peer)
{
    const loom_transport_ops_t *ops = ctx->tp_ops;
    if (ops->size < sizeof(loom_transport_ops_t) || !ops->watch)
        return LOOM_SUCCESS;
    loom_status_t st = ops->watch(ctx->tp, ctx->rank_map ? ctx->rank_map[peer] : peer);
    return st == LOOM_SUCCESS ? st : described(ctx, st);
}

/* Whether the wait below is over with success: every request done without
 * error, or with any_of one of them. */
static int all_done_ok(loom_tp_req_t *reqs, int n, loom_tp_req_t *const *any_of)
{
    for (int i = 0; i < n; i++) {
        const loom_tp_req_t *r = any_of ? any_of[i] : &reqs[i];
        int ok = r && r->done && r->status == LOOM_SUCCESS;
        if (any_of && ok)
            return 1;
        if (!any_of && !ok)
            return 0;
    }
    return !any_of;
}

/* Progress until every request of reqs is done, or with any_of set until one
 * of the requests any_of points to (NULL entries skipped) is done. */
static loom_status_t wait_loop(loom_ctx_t *ctx, loom_tp_req_t *reqs, int n,
                               loom_tp_req_t *const *any_of)
{
    double started = 0, last_moved = 0;
    int first_pending = 0, spin_us = -1;
    for (;;) {
        if (any_of) {
            int done = 0;
            for (int i = 0; i < n && !done; i++)
                done = any_of[i] && any_of[i]->done;
            if (done)
                break;
            while (first_pending < n && !any_of[first_pending])
                first_pending++;
        } else {
            while (first_pending < n && reqs[first_pending].done)
                first_pending++;
            if (first_pending == n)
                break;
        }
        double now = loom_now_s();
        if (spin_us < 0) {   /* something to wait for after all */
            started = last_moved = now;
            spin_us = ctx->spin ? loom_spin_begin(ctx->spin, now) : ctx->spin_us;
        }
        double idle_s = now - last_moved;
        /* Busy-poll while data was flowing recently: a sleep in epoll costs a
         * cross-core wake-up (tens of microseconds in a VM) per message. */
        int timeout_ms = idle_s * 1e6 < (double)spin_us ? 0 : 100;
        int moved = 0;
        loom_status_t st = ctx->tp_ops->progress(ctx->tp, timeout_ms, &moved);
        if (st != LOOM_SUCCESS) {
            /* News of a failure elsewhere (a GAVE_UP) can come in the same pass
             * as the last of what this call waits for, sent before it: the call
             * has all it needs and succeeds; the next one fails. */
            st = described(ctx, st);
            if (all_done_ok(reqs, n, any_of))
                break;
            return st;
        }
        if (!moved && timeout_ms == 0 && ctx->spin_yield)
            sched_yield();   /* a rank sharing our core may be the one we wait for */
        if (moved) {
            last_moved = loom_now_s();
        } else if (idle_s > ctx->timeout_s) {
            const loom_tp_req_t *r = any_of ? any_of[first_pending < n ? first_pending : 0]
                                            : &reqs[first_pending];
            return timed_out(ctx, r);
        }
    }
    if (spin_us >= 0 && ctx->spin)
        loom_spin_end(ctx->spin, (loom_now_s() - started) * 1e6);
    loom_status_t st = LOOM_SUCCESS;
    for (int i = 0; i < n; i++) {
        loom_tp_req_t *r = any_of ? any_of[i] : &reqs[i];
        if (r && r->done && r->status != LOOM_SUCCESS && st == LOOM_SUCCESS)
            st = r->status;
        if (r)
            trace_done(ctx, r);
    }
    return st == LOOM_SUCCESS ? st : described(ctx, st);
}

/* wait_loop, shown as a "wait" span in LOOM_TIMELINE when it had to wait. */
static loom_status_t traced_wait(loom_ctx_t *ctx, loom_tp_req_t *reqs, int n,
                                 loom_tp_req_t *const *any_of)
{
    const loom_tp_req_t *pending = NULL;
    for (int i = 0; i < n && ctx->timeline && !pending; i++) {
        const loom_tp_req_t *r = any_of ? any_of[i] : &reqs[i];
        if (r && !r->done)
            pending = r;
    }
    if (!pending)
        return wait_loop(ctx, reqs, n, any_of);
    double t0 = loom_timeline_now_us();
    char args[96];
    snprintf(args, sizeof(args), "\"peer\": %d, \"bytes\": %zu, \"requests\": %d",
             pending->peer, pending->len, n);
    loom_status_t st = wait_loop(ctx, reqs, n, any_of);
    loom_timeline_span(ctx->timeline, "wait", "wait", t0, loom_timeline_now_us(),
                       ctx->timeline_tid, args);
    return st;
}

loom_status_t loom_p2p_waitall(loom_ctx_t *ctx, loom_tp_req_t *reqs, int n)
{
    return traced_wait(ctx, reqs, n, NULL);
}

loom_status_t loom_p2p_wait_any(loom_ctx_t *ctx, loom_tp_req_t *const *reqs, int n)
{
    return traced_wait(ctx, NULL, n, reqs);
}

loom_status_t loom_p2p_wait(loom_ctx_t *ctx, loom_tp_req_t *req)
{
    return loom_p2p_waitall(ctx, req, 1);
}

loom_status_t loom_p2p_sendrecv(loom_ctx_t *ctx, int dst, const void *sbuf, size_t sbytes,
                                int src, void *rbuf, size_t rbytes, uint32_t step)
{
    loom_tp_req_t reqs[2];
    int n = 0;
    loom_status_t st;
    /* Receive first so the bytes land in rbuf instead of an unexpected-message copy. */
    if (src >= 0) {
        st = loom_p2p_irecv(ctx, src, step, rbuf, rbytes, &reqs[n]);
        if (st != LOOM_SUCCESS)
            return st;
        n++;
    }
    if (dst >= 0) {
        st = loom_p2p_isend(ctx, dst, step, sbuf, sbytes, &reqs[n]);
        if (st != LOOM_SUCCESS)
            return st;
        n++;
    }
    return loom_p2p_waitall(ctx, reqs, n);
}

void *loom_ctx_scratch(loom_ctx_t *ctx, size_t bytes)
{
    if (bytes == 0)
        bytes = 64;   /* a valid pointer even for nothing, so NULL always means no memory */
    if (bytes <= ctx->scratch_size)
        return ctx->scratch;
    /* Grow geometrically so a sweep of sizes does not reallocate every call. */
    size_t want = ctx->scratch_size * 2 > bytes ? ctx->scratch_size * 2 : bytes;
    void *p = NULL;
    if (posix_memalign(&p, 64, want) != 0) {
        loom_err_set(ctx->err, LOOM_ERR_NO_MEMORY, "cannot allocate %zu bytes of scratch", want);
        return NULL;
    }
    free(ctx->scratch);
    ctx->scratch = p;
    ctx->scratch_size = want;
    return p;
}
