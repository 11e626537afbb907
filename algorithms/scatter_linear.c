/*
 * scatter_linear.c - linear scatter: the root sends each rank its block.
 *
 * Source: the basic linear algorithm of MPICH and Open MPI
 * (ompi_coll_base_scatter_intra_basic_linear); see R. Thakur, R. Rabenseifner
 * and W. Gropp, IJHPCA 19(1), 2005, for the tree alternatives.
 *
 * Steps: the root posts one send per rank at once, straight from sendbuf,
 * waits for all, then copies its own block to recvbuf (unless in place:
 * recvbuf already points at sendbuf + root * count); every other rank
 * receives its block from the root.
 *
 * Cost: one latency, but the root's link carries (n-1) * count elements.
 *
 * Limits: none (any n, any root, any count). sendbuf is not read at non-roots.
 * Memory: n requests of scratch at the root.
 */
#include <string.h>

#include "algorithms.h"

loom_status_t loom_scatter_linear(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, rank = ctx->rank;
    const size_t bytes = a->count * a->esize;
    const char *in = a->sendbuf;
    loom_status_t st = LOOM_SUCCESS;

    if (bytes == 0)
        goto out;
    if (rank != a->root) {
        st = loom_p2p_sendrecv(ctx, -1, NULL, 0, a->root, a->recvbuf, bytes, 0);
        goto out;
    }

    if (n > 1) {
        loom_tp_req_t *reqs = loom_ctx_scratch(ctx, (size_t)(n - 1) * sizeof(*reqs));
        if (reqs == NULL) {
            st = LOOM_ERR_NO_MEMORY;
            goto out;
        }
        int nreq = 0;
        for (int i = 0; i < n; i++) {
            if (i == rank)
                continue;
            st = loom_p2p_isend(ctx, i, 0, in + (size_t)i * bytes, bytes, &reqs[nreq]);
            if (st != LOOM_SUCCESS)
                goto out;
            nreq++;
        }
        st = loom_p2p_waitall(ctx, reqs, nreq);
        if (st != LOOM_SUCCESS)
            goto out;
    }
    /* After the sends: a recvbuf that aliases another block must not clobber it early. */
    if (a->recvbuf != in + (size_t)rank * bytes)
        memmove(a->recvbuf, in + (size_t)rank * bytes, bytes);
out:
    return st;
}
