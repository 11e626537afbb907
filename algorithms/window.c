/*
 * window.c - the staging windows' layout and their fence: a barrier of the
 * node's ranks without messages.
 *
 * A rank reaching fence k writes k, last, into the head of its slot k % 2;
 * it waits until every peer's slot k % 2 holds k too. For a small vector
 * that is one cache line changing hands per peer, payload and flag together,
 * where a message costs a record, a match and often a wake-up per peer and
 * step. A waiter spins as the communicator's policy says, then sleeps on the
 * peer's flag (a futex in the shared window) after counting itself among the
 * sleepers in that window's head; the rank that writes its flag wakes its
 * window's sleepers if it has any. The flag is written before the sleepers
 * are read, and a sleeper counts itself before it reads the flag (all
 * sequentially consistent), so either the sleeper sees the flag or the
 * writer sees the sleeper.
 *
 * While it sleeps it wakes every SLEEP_SLICE_MS to do what a wait for a
 * message gets from progress (loom_p2p_window_progress, _watch): keepalives,
 * the transport's failures and abort, a peer that gave up, destroyed its
 * communicator or whose process is gone (looked at only after its flag, as
 * a peer that passed the fence may leave at once); LOOM_TIMEOUT runs from
 * the start of the wait. An abort is seen within a slice.
 *
 * A new window is all zeros and every rank of the window's communicator
 * passes the same fences (an algorithm that fences involves all of the
 * node's ranks), so fence k is the same fence everywhere. A slot's flag is
 * then k - 2 or k: a peer cannot reach k + 2 before we reach k + 1.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>

#include "algorithms.h"
#include "direct.h"
#include "base/clock.h"
#include "base/futex.h"
#include "base/spin.h"
#include "base/timeline.h"

#define SLEEP_SLICE_MS 10
/* Polls between reads of the clock and yields of the core, and between
 * looks at the transport, while spinning. */
#define POLLS_PER_YIELD 64
#define POLLS_PER_LOOK 1024
/* The largest slot: small vectors only (bigger ones go through the staging
 * area, or in chunks of a slot). */
#define SLOT_MAX_BYTES ((size_t)64 << 10)

typedef struct window_head {
    _Alignas(64) uint32_t fences;            /* fences its owner reached: its own */
    _Alignas(64) _Atomic uint32_t sleepers;  /* peers asleep on one of its slots */
} window_head_t;

/* What of the window the head and the two slots take: a quarter at most, so
 * a small window still leaves staging room. */
static size_t slots_area(size_t wlen)
{
    size_t most = 2 * (LOOM_SLOT_HEAD_BYTES + SLOT_MAX_BYTES);
    size_t room = wlen / 4 > sizeof(window_head_t) ? wlen / 4 - sizeof(window_head_t) : 0;
    return sizeof(window_head_t) + ((room < most ? room : most) & ~(size_t)127);
}

/* From one slot's head to the next's. */
static size_t slot_stride(size_t wlen)
{
    return (slots_area(wlen) - sizeof(window_head_t)) / 2;
}

size_t loom_window_slot_bytes(size_t wlen)
{
    size_t stride = slot_stride(wlen);
    return stride > LOOM_SLOT_HEAD_BYTES ? stride - LOOM_SLOT_HEAD_BYTES : 0;
}

uint32_t loom_window_next_fence(char *win)
{
    return ((window_head_t *)win)->fences + 1;
}

loom_slot_head_t *loom_window_slot(char *win, size_t wlen, uint32_t fence)
{
    return (loom_slot_head_t *)(win + sizeof(window_head_t) + (fence & 1) * slot_stride(wlen));
}

char *loom_window_staging(char *win, size_t wlen, size_t *len_p)
{
    size_t skip = slots_area(wlen);
    *len_p = wlen > skip ? wlen - skip : 0;
    return win + skip;
}

static int reached(loom_slot_head_t *slot, uint32_t fence)
{
    return (int32_t)(atomic_load_explicit(&slot->fence, memory_order_acquire) - fence) >= 0;
}

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Wait for one peer's slot; *started_p < 0 until some wait began (then
 * the spin budget runs from it, and ends at *spin_end_p). */
static loom_status_t wait_for(loom_ctx_t *ctx, int peer, window_head_t *head,
                              loom_slot_head_t *slot, uint32_t fence, double *started_p,
                              double *spin_end_p)
{
    unsigned polls = 0;
    while (!reached(slot, fence)) {
        /* The clock only every few polls: it costs as much as a poll. */
        if (*started_p >= 0 && ++polls % POLLS_PER_YIELD != 0) {
            relax();
            continue;
        }
        double now = loom_now_s();
        if (*started_p < 0) {
            *started_p = now;
            int spin_us = ctx->spin ? loom_spin_begin(ctx->spin, now) : ctx->spin_us;
            *spin_end_p = now + spin_us * 1e-6;
        }
        loom_status_t st;
        if (now < *spin_end_p) {
            /* A few microseconds of pauses, then give the core away: the
             * rank we wait for may need it. A yield per poll would cost a
             * system call each time a peer is a few cache misses late. */
            if (polls && ctx->spin_yield)
                sched_yield();
            if (polls < POLLS_PER_LOOK)
                continue;
            polls = 0;
        } else {
            atomic_fetch_add(&head->sleepers, 1);
            uint32_t seen = atomic_load(&slot->fence);
            if ((int32_t)(seen - fence) < 0)
                loom_futex_wait(&slot->fence, seen, SLEEP_SLICE_MS);
            atomic_fetch_sub(&head->sleepers, 1);
            if (reached(slot, fence))
                break;
        }
        /* A peer that passed the fence may leave, or a failure elsewhere be
         * told, at once: what progress learns of that comes after the flag,
         * so the flag is looked at again first (as a wait for messages
         * succeeds when its last message came with the news). */
        st = loom_p2p_window_progress(ctx);
        if (reached(slot, fence))
            break;
        if (st != LOOM_SUCCESS || (st = loom_p2p_window_watch(ctx, peer)) != LOOM_SUCCESS)
            return st;
        if (loom_now_s() - *started_p > ctx->timeout_s)
            return loom_p2p_window_timeout(ctx, peer);
    }
    return LOOM_SUCCESS;
}

loom_status_t loom_window_fence(loom_ctx_t *ctx, char *const *win, size_t wlen)
{
    const int n = ctx->size, me = ctx->rank;
    window_head_t *mine = (window_head_t *)win[me];
    const uint32_t fence = ++mine->fences;
    loom_slot_head_t *slot = loom_window_slot(win[me], wlen, fence);
    atomic_store(&slot->fence, fence);
    if (atomic_load(&mine->sleepers))
        loom_futex_wake(&slot->fence);
    double started = -1, spin_end = 0;
    double t0 = ctx->timeline ? loom_timeline_now_us() : 0;
    loom_status_t st = LOOM_SUCCESS;
    for (int j = 1; j < n && st == LOOM_SUCCESS; j++) {
        int p = (me + j) % n;
        st = wait_for(ctx, p, (window_head_t *)win[p], loom_window_slot(win[p], wlen, fence),
                      fence, &started, &spin_end);
    }
    if (started >= 0) {
        if (ctx->spin && st == LOOM_SUCCESS)
            loom_spin_end(ctx->spin, (loom_now_s() - started) * 1e6);
        if (ctx->timeline) {
            char args[48];
            snprintf(args, sizeof(args), "\"fence\": %u", (unsigned)fence);
            loom_timeline_span(ctx->timeline, "wait", "wait", t0, loom_timeline_now_us(),
                               ctx->timeline_tid, args);
        }
    }
    return st;
}
