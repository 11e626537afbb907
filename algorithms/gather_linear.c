/*
 * gather_linear.c - linear gather: every rank sends its block to the root.
 *
 * Source: the basic linear algorithm of MPICH and Open MPI
 * (ompi_coll_base_gather_intra_basic_linear); see R. Thakur, R. Rabenseifner
 * and W. Gropp, IJHPCA 19(1), 2005, for the tree alternatives.
 *
 * Steps: the root copies its own block into place (unless in place: sendbuf
 * already points at recvbuf + root * count), posts one receive per rank at
 * once, straight into recvbuf, and waits for all; every other rank sends its
 * block to the root.
 *
 * Cost: one latency, but the root's link carries (n-1) * count elements and
 * it holds n-1 receives at once. Fine for the small and mid-sized gathers DL
 * jobs do (metrics, object lists); a binomial tree would cut latency for many
 * ranks with tiny blocks.
 *
 * Limits: none (any n, any root, any count). recvbuf is not touched at
 * non-roots.
 * Memory: n requests of scratch at the root.
 */
#include <string.h>

#include "algorithms.h"

loom_status_t loom_gather_linear(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, rank = ctx->rank;
    const size_t bytes = a->count * a->esize;
    loom_status_t st = LOOM_SUCCESS;

    if (bytes == 0)
        goto out;
    if (rank != a->root) {
        st = loom_p2p_sendrecv(ctx, a->root, a->sendbuf, bytes, -1, NULL, 0, 0);
        goto out;
    }

    char *out = a->recvbuf;
    /* Before any receive lands, so a sendbuf that aliases recvbuf is read intact. */
    if (a->sendbuf != out + (size_t)rank * bytes)
        memmove(out + (size_t)rank * bytes, a->sendbuf, bytes);
    if (n == 1)
        goto out;

    loom_tp_req_t *reqs = loom_ctx_scratch(ctx, (size_t)(n - 1) * sizeof(*reqs));
    if (reqs == NULL) {
        st = LOOM_ERR_NO_MEMORY;
        goto out;
    }
    int nreq = 0;
    for (int i = 0; i < n; i++) {
        if (i == rank)
            continue;
        st = loom_p2p_irecv(ctx, i, 0, out + (size_t)i * bytes, bytes, &reqs[nreq]);
        if (st != LOOM_SUCCESS)
            goto out;
        nreq++;
    }
    st = loom_p2p_waitall(ctx, reqs, nreq);
out:
    return st;
}
