/*
 * barrier_dissemination.c - dissemination barrier.
 *
 * Source: D. Hensgen, R. Finkel and U. Manber, "Two algorithms for barrier
 * synchronization", IJPP 17(1), 1988; Open MPI's
 * ompi_coll_base_barrier_intra_bruck uses the same pattern.
 *
 * Steps: for k = 0 .. ceil(log2 n)-1, with d = 2^k, send an empty message to
 * (rank + d) mod n and wait for one from (rank - d) mod n. After round k each
 * rank has heard, directly or not, from the 2^(k+1) - 1 ranks before it, so
 * after the last round from all of them: no rank leaves before all arrived.
 *
 * Cost: ceil(log2 n) latencies for any n (no power-of-two fold needed).
 * Limits: none.
 * Memory: none.
 */
#include "algorithms.h"

loom_status_t loom_barrier_dissemination(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, rank = ctx->rank;
    /* A valid address for the empty messages, never read nor written. */
    char token = 0, sink = 0;
    loom_status_t st = LOOM_SUCCESS;

    for (int d = 1, k = 0; d < n; d *= 2, k++) {
        st = loom_p2p_sendrecv(ctx, (rank + d) % n, &token, 0, (rank - d + n) % n, &sink, 0,
                               (uint32_t)k);
        if (st != LOOM_SUCCESS)
            goto out;
    }
out:
    return st;
}
