/*
 * direct.h - what the in-node algorithms that work on shared memory share:
 * direct.c (one-sided reads of the peers' buffers) and allreduce_staged.c (the
 * transport's staging windows).
 */
#ifndef LOOM_DIRECT_H
#define LOOM_DIRECT_H

#include <stdint.h>

#include "algorithms.h"

#define MAX_DIRECT_RANKS 64

enum { STEP_ADDRS = 0, STEP_MIDDLE = 1, STEP_END = 2 };

/* Everybody has reached this point (an empty message to and from each peer). */
loom_status_t loom_direct_fence(loom_ctx_t *ctx, uint32_t step);
/* An allreduce with nothing to exchange: one rank, or no elements. */
loom_status_t loom_direct_alone(const loom_coll_args_t *a, int n);

/* ---- The staging windows (algorithms/window.c). -----------------------------
 * Every rank of the node maps every peer's window (loom_p2p_window). A window
 * holds a head (the rank's fence count, and how many peers sleep waiting for
 * it), two slots for small vectors, and after them the staging area of
 * allreduce_staged. All ranks' windows have one size, so one layout. */
#define LOOM_SLOT_HEAD_BYTES 32
/* The head of a slot; its payload follows at LOOM_SLOT_HEAD_BYTES, so that a
 * vector of up to 32 bytes shares the head's cache line. */
typedef struct loom_slot_head {
    _Atomic uint32_t fence;  /* the fence it was filled for: written last */
    uint32_t desc;           /* the call that filled it: descriptor (ctx->desc), */
    uint64_t total;          /* count (ctx->total) */
    uint64_t bytes;          /* and bytes of the chunk it holds */
} loom_slot_head_t;

/* Payload bytes of one slot of a window of wlen bytes (0: too small for any). */
size_t loom_window_slot_bytes(size_t wlen);
/* The number the next fence through our window win will have. */
uint32_t loom_window_next_fence(char *win);
/* The slot of a window that fence number fence passes. */
loom_slot_head_t *loom_window_slot(char *win, size_t wlen, uint32_t fence);
/* Where allreduce_staged may stage data in a window, and *len_p how much. */
char *loom_window_staging(char *win, size_t wlen, size_t *len_p);
/* A barrier of the ranks of ctx through their windows (win[p]: peer p's
 * window, as loom_p2p_window gives it; all wlen bytes): marks our slot of the
 * next fence (number loom_window_next_fence, the same on every rank) with
 * its number, then waits until every peer's slot of that fence holds it too.
 * What a rank wrote into its window before is visible to every peer after.
 * Fails as a wait for a message would (LOOM_TIMEOUT, a peer that gave up or
 * vanished, abort). */
loom_status_t loom_window_fence(loom_ctx_t *ctx, char *const *win, size_t wlen);

#endif
