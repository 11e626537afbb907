/*
 * broadcast_hierarchical.c - two-level broadcast for jobs that span several
 * nodes: the vector crosses the inter-node links once per node, then spreads
 * inside each node over shared memory.
 *
 * With the root the l0-th rank of its node: (a) the ranks of index l0, one
 * per node, broadcast among themselves from the root (binomial); (b) inside
 * every node the rank of index l0 broadcasts to the others, with the direct
 * algorithm (peers copy from its buffer in place) where the node allows it,
 * binomially otherwise.
 *
 * Limits: needs the same number L > 1 of the context's ranks on M > 1 nodes
 * (algorithms/hierarchy.c); otherwise it runs the binomial broadcast, so
 * forcing it is always correct. Memory: no scratch.
 */
#include "algorithms.h"

loom_status_t loom_broadcast_hierarchical(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    if (a->count == 0)
        return LOOM_SUCCESS;
    loom_hier_t h;
    int ready = loom_hier_init(ctx, &h);
    if (ready < 0)
        return LOOM_ERR_NO_MEMORY;
    if (ready == 0)
        return loom_broadcast_binomial(ctx, a);
    int root_node, root_local;
    loom_hier_place(&h, a->root, &root_node, &root_local);
    loom_status_t st = LOOM_SUCCESS;
    if (h.l == root_local) {
        loom_ctx_t xv = loom_hier_cross_view(ctx, &h, 0);
        loom_coll_args_t xa = *a;
        xa.root = root_node;
        st = loom_broadcast_binomial(&xv, &xa);
        loom_hier_adopt_scratch(ctx, &xv);
    }
    if (st == LOOM_SUCCESS) {
        loom_ctx_t lv = loom_hier_local_view(ctx, &h, 1);
        loom_coll_args_t la = *a;
        la.root = root_local;
        const loom_algo_t *algo = loom_algo_select(&lv, &la, NULL);
        loom_algo_fn run = algo && algo->run != loom_broadcast_hierarchical ? algo->run
                                                                             : loom_broadcast_binomial;
        st = run(&lv, &la);
        loom_hier_adopt_scratch(ctx, &lv);
    }
    loom_hier_free(&h);
    return st;
}
