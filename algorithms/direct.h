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

#endif
