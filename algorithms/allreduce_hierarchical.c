/*
 * allreduce_hierarchical.c - two-level allreduce for jobs that span several
 * nodes: only a 1/L slice of the vector per rank crosses the slow inter-node
 * links, where a flat ring sends nearly the whole vector per rank over them.
 *
 * Source: Horovod's hierarchical allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE);
 * X. Jia et al., "Highly Scalable Deep Learning Training System with
 * Mixed-Precision", arXiv:1807.11205, 2018 (section 4.2); NCCL's tree/ring
 * split between intra- and inter-node channels follows the same idea.
 *
 * Steps, for M nodes holding L ranks each (ranks of a node taken in rank
 * order, local index l), the vector cut into L blocks like allreduce_ring's
 * (block b gets count/L elements, the first count%L one more):
 *  (a) intra-node ring reduce-scatter over the L local ranks: at step
 *      s = 0 .. L-2 send block (l-s-1) mod L to local l+1 (our input at s = 0,
 *      the partial result of step s-1 after) and receive block (l-s-2) mod L
 *      from local l-1, reducing our input of it into recvbuf; after L-1 steps
 *      local rank l holds block l reduced over its node;
 *  (b) block l allreduced among the M ranks of local index l, one per node
 *      (M disjoint groups running in parallel, one per local index), by the
 *      flat allreduce the selection picks for a block that size on M ranks;
 *      for LOOM_AVG the block is then divided by the job's size, once;
 *  (c) intra-node ring allgather (allgatherv_ring on the local ranks, uneven
 *      blocks) spreads the L finished blocks.
 * Each phase runs on a view of the context (rank_map) with its own step_base,
 * so no two phases share a tag. Every element is reduced in one fixed order
 * (its node's ring, then the inter-node algorithm, which is itself bitwise
 * identical on its ranks) and then copied: the result is bitwise identical on
 * every rank.
 *
 * Cost, per rank: (a) and (c) L-1 latencies and (L-1)/L * bytes each over the
 * intra-node links; (b) the flat algorithm's cost for bytes/L on M ranks, e.g.
 * 2(M-1)/M * bytes/L over the inter-node links for the ring.
 *
 * Limits: the hierarchical path needs the topology (ctx->node_of), more than
 * one node and the same number L > 1 of the context's ranks on every node
 * (ctx->ranks_per_node, checked against node_of);
 * otherwise (one node, one rank per node, uneven nodes, unknown topology) it
 * runs loom_allreduce_ring, so forcing it is always correct. Phases (a) and
 * (c) are not pipelined (a step's block moves as one message and is reduced
 * after it arrived): the intra-node links are assumed much faster than the
 * inter-node ones.
 * Memory: the rank maps (algorithms/hierarchy.c) on the stack up to 256 ints,
 * else one malloc per call; scratch: one block (count/L + 1 elements) in place
 * only, 2L size_t for (c), and whatever the inter-node algorithm needs.
 */
#include "algorithms.h"
#include "blocks.h"
#include "base/reduce.h"

/* Phase (a) on the local view v: afterwards out holds block v->rank reduced
 * over the node (and, out of place, partial results in other blocks). */
static loom_status_t local_reduce_scatter(loom_ctx_t *v, const loom_coll_args_t *a, loom_op_t op)
{
    const int n = v->size, r = v->rank;
    const size_t es = a->esize, count = a->count;
    const char *in = a->sendbuf;
    char *out = a->recvbuf;
    char *tmp = NULL;

    /* In place a received block cannot land on the input it is reduced with. */
    if (in == out && (tmp = loom_ctx_scratch(v, loom_block_count(count, n, 0) * es)) == NULL)
        return LOOM_ERR_NO_MEMORY;
    const int right = loom_mod(r + 1, n), left = loom_mod(r - 1, n);
    for (int s = 0; s < n - 1; s++) {
        int sb = loom_mod(r - s - 1, n), rb = loom_mod(r - s - 2, n);
        size_t sc = loom_block_count(count, n, sb), rc = loom_block_count(count, n, rb);
        const char *src = (s == 0 ? in : out) + loom_block_offset(count, n, sb) * es;
        char *dst = tmp ? tmp : out + loom_block_offset(count, n, rb) * es;
        loom_status_t st = loom_p2p_sendrecv(v, sc ? right : -1, src, sc * es, rc ? left : -1,
                                             dst, rc * es, (uint32_t)s);
        if (st != LOOM_SUCCESS)
            return st;
        if (rc > 0) {
            size_t off = loom_block_offset(count, n, rb) * es;
            loom_ctx_reduce(v, out + off, in + off, dst, rc, a->dtype, op);
        }
    }
    return LOOM_SUCCESS;
}

loom_status_t loom_allreduce_hierarchical(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size;
    const size_t es = a->esize;
    loom_status_t st = LOOM_SUCCESS;

    if (a->count == 0)
        return LOOM_SUCCESS;
    loom_hier_t h;
    int ready = loom_hier_init(ctx, &h);
    if (ready < 0)
        return LOOM_ERR_NO_MEMORY;
    if (ready == 0)   /* every rank sees the same node_of, so all fall back together */
        return loom_allreduce_ring(ctx, a);
    const int L = h.L, l = h.l;

    const loom_op_t op = a->op == LOOM_AVG ? LOOM_SUM : a->op;
    const size_t count = a->count, mine = loom_block_count(count, L, l);
    char *const block = (char *)a->recvbuf + loom_block_offset(count, L, l) * es;

    loom_ctx_t lv = loom_hier_local_view(ctx, &h, 0);
    st = local_reduce_scatter(&lv, a, op);
    loom_hier_adopt_scratch(ctx, &lv);
    if (st != LOOM_SUCCESS)
        goto out;

    if (mine > 0) {
        loom_ctx_t xv = loom_hier_cross_view(ctx, &h, 1);
        loom_coll_args_t xa = *a;
        xa.sendbuf = block;
        xa.recvbuf = block;
        xa.count = mine;
        xa.op = op;
        const loom_algo_t *algo = loom_algo_select(&xv, &xa, NULL);
        /* One rank per node in the group: never ourselves again. */
        loom_algo_fn run = algo && algo->run != loom_allreduce_hierarchical ? algo->run
                                                                             : loom_allreduce_ring;
        st = run(&xv, &xa);
        loom_hier_adopt_scratch(ctx, &xv);
        if (st != LOOM_SUCCESS)
            goto out;
        if (a->op == LOOM_AVG)
            loom_reduce_avg_finalize(block, mine, a->dtype, n);
    }

    lv = loom_hier_local_view(ctx, &h, 2);
    size_t *counts = loom_ctx_scratch(&lv, 2 * (size_t)L * sizeof(size_t));
    loom_hier_adopt_scratch(ctx, &lv);
    if (counts == NULL) {
        st = LOOM_ERR_NO_MEMORY;
        goto out;
    }
    size_t *displs = counts + L;
    for (int b = 0; b < L; b++) {
        counts[b] = loom_block_count(count, L, b);
        displs[b] = loom_block_offset(count, L, b);
    }
    loom_coll_args_t ga = *a;
    ga.coll = LOOM_COLL_ALLGATHERV;
    ga.sendbuf = block;
    ga.count = mine;
    ga.counts = counts;
    ga.displs = displs;
    st = loom_allgatherv_ring(&lv, &ga);
    loom_hier_adopt_scratch(ctx, &lv);
out:
    loom_hier_free(&h);
    return st;
}
