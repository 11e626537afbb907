/*
 * allgather_hierarchical.c - two-level allgather for jobs that span several
 * nodes: M-1 inter-node steps (one ring per local index, all in parallel)
 * instead of n-1, and the rest inside the nodes.
 *
 * For M nodes of L ranks (we are index l on our node, see hierarchy.c), with
 * a packed buffer Q of n blocks in scratch, ordered [local index][node]:
 *  (a) the ranks of index l, one per node, ring-allgather their blocks into
 *      Q's l-th row (M blocks);
 *  (b) the L ranks of a node allgather their rows in place in Q (one block of
 *      M*count elements each), directly in each other's memory where the
 *      node allows it, by the ring otherwise;
 *  (c) every block is copied from Q to its place in recvbuf.
 * In place, our own block is read in (a), before (c) writes recvbuf.
 *
 * Limits: needs the same number L > 1 of the context's ranks on M > 1 nodes;
 * otherwise the flat ring runs, so forcing it is always correct.
 * Memory: scratch of the whole gathered vector (n blocks).
 */
#include <string.h>

#include "algorithms.h"

loom_status_t loom_allgather_hierarchical(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const size_t block = a->count * a->esize;
    if (block == 0)
        return LOOM_SUCCESS;
    loom_hier_t h;
    int ready = loom_hier_init(ctx, &h);
    if (ready < 0)
        return LOOM_ERR_NO_MEMORY;
    if (ready == 0)
        return loom_allgather_ring(ctx, a);
    const int L = h.L, M = h.M;
    loom_status_t st = LOOM_SUCCESS;
    char *q = loom_ctx_scratch(ctx, (size_t)ctx->size * block);
    if (q == NULL) {
        loom_hier_free(&h);
        return LOOM_ERR_NO_MEMORY;
    }
    char *row = q + (size_t)h.l * (size_t)M * block;

    /* Neither ring below uses scratch, so q stays put. */
    loom_ctx_t xv = loom_hier_cross_view(ctx, &h, 0);
    loom_coll_args_t xa = *a;
    xa.recvbuf = row;
    st = loom_allgather_ring(&xv, &xa);
    if (st == LOOM_SUCCESS) {
        loom_ctx_t lv = loom_hier_local_view(ctx, &h, 1);
        loom_coll_args_t la = *a;
        la.sendbuf = row;
        la.recvbuf = q;
        la.count = a->count * (size_t)M;
        /* Direct where the node shares memory; never Bruck, whose scratch is q. */
        const loom_algo_t *algo = loom_algo_select(&lv, &la, NULL);
        st = (algo && algo->run == loom_allgather_direct ? loom_allgather_direct
                                                         : loom_allgather_ring)(&lv, &la);
    }
    if (st == LOOM_SUCCESS)
        for (int i = 0; i < L; i++)
            for (int m = 0; m < M; m++)
                memcpy((char *)a->recvbuf + (size_t)h.grid[m * L + i] * block,
                       q + ((size_t)i * (size_t)M + (size_t)m) * block, block);
    loom_hier_free(&h);
    return st;
}
