/*
 * hierarchy.c - the views of a context that two-level algorithms run their
 * phases on: the ranks of our node ("local") and, when every node holds the
 * same number L of the context's ranks, the ranks sharing our index l among
 * their node's ranks, one per node ("cross"). Ranks of a node are taken in
 * view order, nodes in order of their first rank; every rank computes the
 * same maps from the same node_of.
 */
#include <stdlib.h>
#include <string.h>

#include "algorithms.h"

static int real_rank(const loom_ctx_t *ctx, int i)
{
    return ctx->rank_map ? ctx->rank_map[i] : i;
}

int loom_hier_init(const loom_ctx_t *ctx, loom_hier_t *h)
{
    memset(h, 0, sizeof(*h));
    const int n = ctx->size, L = ctx->ranks_per_node, M = L > 0 ? n / L : 0;
    if (ctx->node_of == NULL || L < 2 || M < 2 || n % L != 0)
        return 0;
    const int nodes = ctx->node_count;
    /* per_node and order[node] (the node's position among those we span) + local + cross + grid */
    size_t nints = 2 * (size_t)nodes + (size_t)L + (size_t)M + (size_t)n;
    int *ints = nints <= LOOM_HIER_STACK_INTS ? h->stack : malloc(nints * sizeof(int));
    if (ints == NULL) {
        loom_err_set(ctx->err, LOOM_ERR_NO_MEMORY, "hierarchical: out of memory");
        return -1;
    }
    h->heap = ints == h->stack ? NULL : ints;
    int *per_node = ints, *order = ints + nodes;
    h->local = order + nodes;
    h->cross = h->local + L;
    h->grid = h->cross + M;

    memset(per_node, 0, sizeof(int) * (size_t)nodes);
    for (int k = 0; k < nodes; k++)
        order[k] = -1;
    const int mynode = ctx->node_of[real_rank(ctx, ctx->rank)];
    int spanned = 0;
    for (int i = 0; i < n; i++) {
        int nd = ctx->node_of[real_rank(ctx, i)];
        /* What ranks_per_node claims is checked here: the maps are sized by it. */
        if (nd < 0 || nd >= nodes || per_node[nd] >= L) {
            loom_hier_free(h);
            return 0;
        }
        if (per_node[nd] == 0)
            order[nd] = spanned++;
        int idx = per_node[nd]++;
        if (nd == mynode) {
            if (i == ctx->rank)
                h->l = idx;
            h->local[idx] = real_rank(ctx, i);
        }
        h->grid[order[nd] * L + idx] = i;
    }
    if (spanned != M) {
        loom_hier_free(h);
        return 0;
    }
    for (int m = 0; m < M; m++) {
        int i = h->grid[m * L + h->l];
        h->cross[m] = real_rank(ctx, i);
        if (i == ctx->rank)
            h->me_cross = m;
    }
    h->L = L;
    h->M = M;
    return 1;
}

void loom_hier_place(const loom_hier_t *h, int rank, int *node_p, int *local_p)
{
    *node_p = *local_p = 0;
    for (int g = 0; g < h->M * h->L; g++)
        if (h->grid[g] == rank) {
            *node_p = g / h->L;
            *local_p = g % h->L;
            return;
        }
}

void loom_hier_free(loom_hier_t *h)
{
    free(h->heap);
    h->heap = NULL;
}

loom_ctx_t loom_hier_local_view(const loom_ctx_t *ctx, const loom_hier_t *h, uint32_t phase)
{
    loom_ctx_t v = *ctx;
    v.rank = h->l;
    v.size = h->L;
    v.rank_map = h->local;
    v.ranks_per_node = h->L;
    v.step_base = ctx->step_base + phase * LOOM_HIER_PHASE_STEPS;
    return v;
}

loom_ctx_t loom_hier_cross_view(const loom_ctx_t *ctx, const loom_hier_t *h, uint32_t phase)
{
    loom_ctx_t v = *ctx;
    v.rank = h->me_cross;
    v.size = h->M;
    v.rank_map = h->cross;
    v.ranks_per_node = 1;
    v.step_base = ctx->step_base + phase * LOOM_HIER_PHASE_STEPS;
    return v;
}

void loom_hier_adopt_scratch(loom_ctx_t *ctx, const loom_ctx_t *view)
{
    ctx->scratch = view->scratch;
    ctx->scratch_size = view->scratch_size;
}
