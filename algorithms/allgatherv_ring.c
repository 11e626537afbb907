/*
 * allgatherv_ring.c - ring allgatherv (blocks of different sizes).
 *
 * Source: R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of Collective
 * Communication Operations in MPICH", IJHPCA 19(1), 2005, section 4.2; Open
 * MPI's ompi_coll_base_allgatherv_intra_ring.
 *
 * Steps: copy our block to recvbuf + displs[rank] (unless in place: sendbuf
 * already points there), then for s = 0 .. n-2 send block (rank - s) mod n to
 * rank+1 and receive block (rank - s - 1) mod n from rank-1, straight into
 * recvbuf at its displacement. Every rank knows every block's size, so empty
 * blocks are skipped on both sides.
 *
 * Cost: n-1 latencies; each rank sends and receives every block but its own
 * once. A very uneven distribution makes every step as slow as the largest block.
 *
 * Limits: a->count (our sendcount) must equal counts[rank]; displs may leave
 * gaps, which are not touched.
 * Memory: none.
 */
#include <string.h>

#include "algorithms.h"

loom_status_t loom_allgatherv_ring(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, rank = ctx->rank;
    const size_t es = a->esize;
    char *out = a->recvbuf;
    loom_status_t st = LOOM_SUCCESS;

    if (a->count != a->counts[rank]) {
        st = loom_err_set(ctx->err, LOOM_ERR_INVALID_ARG,
                          "allgatherv: rank %d sends %zu elements but recvcounts[%d] is %zu",
                          rank, a->count, rank, a->counts[rank]);
        goto out;
    }
    if (a->count > 0 && a->sendbuf != out + a->displs[rank] * es)
        memmove(out + a->displs[rank] * es, a->sendbuf, a->count * es);

    const int right = (rank + 1) % n, left = (rank - 1 + n) % n;
    for (int s = 0; s < n - 1; s++) {
        int sb = (rank - s + n) % n, rb = (rank - s - 1 + n) % n;
        size_t sc = a->counts[sb], rc = a->counts[rb];
        /* recvbuf may be NULL when every block is empty: no address without bytes. */
        st = loom_p2p_sendrecv(ctx, sc ? right : -1, sc ? out + a->displs[sb] * es : NULL,
                               sc * es, rc ? left : -1, rc ? out + a->displs[rb] * es : NULL,
                               rc * es, (uint32_t)s);
        if (st != LOOM_SUCCESS)
            goto out;
    }
out:
    return st;
}
