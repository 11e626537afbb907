/*
 * algorithms.c - the table of every algorithm and the automatic choice
 * between them.
 *
 * The choice is a small crossover table (bytes, ranks) per collective: the
 * first row whose limits hold and whose algorithm can run wins; collectives
 * without rows, or without a row that fits, get the first algorithm of the
 * table that can run. The allreduce rows come from measurements on a 2-core
 * machine over loopback TCP (below); the allgather rows are still guesses
 * from the literature (MPICH's defaults, Thakur et al. 2005). Faster fabrics
 * move the crossovers: LOOM_ALGO overrides them.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms.h"

const loom_algo_t loom_algorithms[] = {
    { LOOM_COLL_ALLREDUCE, "ring", loom_allreduce_ring, NULL },
    { LOOM_COLL_ALLREDUCE, "rabenseifner", loom_allreduce_rabenseifner, NULL },
    { LOOM_COLL_ALLREDUCE, "recdbl", loom_allreduce_recdbl, NULL },
    { LOOM_COLL_ALLREDUCE, "hierarchical", loom_allreduce_hierarchical, NULL },
    { LOOM_COLL_BROADCAST, "binomial", loom_broadcast_binomial, NULL },
    { LOOM_COLL_BROADCAST, "hierarchical", loom_broadcast_hierarchical, NULL },
    { LOOM_COLL_BROADCAST, "scatter_allgather", loom_broadcast_scatter_allgather, NULL },
    { LOOM_COLL_REDUCE, "binomial", loom_reduce_binomial, NULL },
    { LOOM_COLL_ALLGATHER, "ring", loom_allgather_ring, NULL },
    { LOOM_COLL_ALLGATHER, "bruck", loom_allgather_bruck, NULL },
    { LOOM_COLL_ALLGATHER, "hierarchical", loom_allgather_hierarchical, NULL },
    { LOOM_COLL_ALLGATHERV, "ring", loom_allgatherv_ring, NULL },
    { LOOM_COLL_REDUCE_SCATTER, "ring", loom_reduce_scatter_ring, NULL },
    { LOOM_COLL_ALLTOALL, "pairwise", loom_alltoall_pairwise, NULL },
    { LOOM_COLL_ALLTOALLV, "pairwise", loom_alltoallv_pairwise, NULL },
    { LOOM_COLL_GATHER, "linear", loom_gather_linear, NULL },
    { LOOM_COLL_SCATTER, "linear", loom_scatter_linear, NULL },
    { LOOM_COLL_BARRIER, "dissemination", loom_barrier_dissemination, NULL },
    { LOOM_COLL_ALLREDUCE, "direct", loom_allreduce_direct, loom_direct_can_run },
    { LOOM_COLL_ALLREDUCE, "staged", loom_allreduce_staged, loom_staged_can_run },
    { LOOM_COLL_BROADCAST, "direct", loom_broadcast_direct, loom_direct_can_run },
    { LOOM_COLL_ALLGATHER, "direct", loom_allgather_direct, loom_direct_can_run },
};

const size_t loom_num_algorithms = sizeof(loom_algorithms) / sizeof(loom_algorithms[0]);

/*
 * Crossovers. A row applies from min_ranks ranks up and below below_bytes,
 * where bytes is the vector for allreduce (count * esize) and the gathered
 * total for allgather (size * count * esize).
 *
 * allreduce: recursive doubling costs log2(n) latencies but moves the whole
 *   vector each round: best while latency dominates (MPICH switches at 2 KiB
 *   on old networks; 16 KiB suits today's 100-400 Gb/s links). Rabenseifner
 *   moves 2x the vector in 2 log2(n) steps; the ring moves the same in 2(n-1)
 *   steps but with neighbour-only traffic and pipelined reductions, so it
 *   wins once bytes/n segments are long enough to hide the extra latencies,
 *   later on many ranks.
 * allgather: Bruck needs log2(n) steps but an extra copy of the total; the
 *   ring is bandwidth-optimal and copy-free.
 */
typedef struct crossover {
    loom_coll_t coll;
    int min_ranks;
    size_t below_bytes;
    const char *name;
} crossover_t;

static const crossover_t crossovers[] = {
    /* allreduce rows measured over loopback TCP on 2 cores (bench/loom_bench.c,
     * each algorithm forced, float32 sum, us per call):
     *            16 KiB: recdbl/rab/ring   64 KiB        1 MiB          4 MiB          16 MiB
     *   2 ranks  8.6 / 12.5 / 12.1        24 / 22 / 22  449 / 278 / 301  1807/1708/1199  11889/8724/8158
     *   4 ranks  31 / 37 / 67             91 / 61 / 99  1924 / 760 / 876 9258/5561/6093  47951/28280/27107
     *   8 ranks  94 / 112 / 215           264/172/243   4982/1948/3558   30689/12709/15934 146858/68634/64834 */
    { LOOM_COLL_ALLREDUCE, 1, (size_t)32 << 10, "recdbl" },
    { LOOM_COLL_ALLREDUCE, 3, (size_t)8 << 20, "rabenseifner" },
    { LOOM_COLL_ALLREDUCE, 1, (size_t)2 << 20, "rabenseifner" },
    { LOOM_COLL_ALLREDUCE, 1, SIZE_MAX, "ring" },
    { LOOM_COLL_ALLGATHER, 1, (size_t)256 << 10, "bruck" },
    { LOOM_COLL_ALLGATHER, 1, SIZE_MAX, "ring" },
};

/* hierarchical allreduce, when the job spans several nodes with the same
 * number (> 1) of ranks on each, from this many bytes up. A first guess, to
 * be measured: below it the three phases' extra latencies (2(L-1) intra-node
 * steps on top of the inter-node allreduce) cost more than the inter-node
 * traffic saved (the flat ring sends 2(n-1)/n of the vector over the slow
 * links per rank, the hierarchical one 2(M-1)/M of a 1/L slice). */
#define HIERARCHICAL_MIN_BYTES ((size_t)256 << 10)

/* Inside one node, over shared memory: the direct algorithms (each byte
 * copied once, by cross-memory attach, from the buffer that holds it) and
 * the staged allreduce (two memcpys through the node's staging windows, in
 * chunks that stay in cache) from these sizes up, first row that fits and
 * can run. Below them a few small messages cost less than their address
 * swap and fences. loom-perf allreduce, 2-core VM, each algorithm forced,
 * us per call (shared memory; machine not idle):
 *            64 KiB: recdbl/rab/direct/staged  256 KiB          1 MiB           64 MiB
 *   2 ranks  61 / 75 / 72 / 67                 95/92/90/98      325/291/261/273 37372/24647/22166/23702
 *   4 ranks  157 / 209 / 208 / 205             356/343/317/227  1147/1180/915/620 131122/77516/60926/51988 */
static const struct {
    loom_coll_t coll;
    int min_ranks;
    size_t min_bytes;
    const char *name;
} direct_from[] = {
    { LOOM_COLL_ALLREDUCE, 3, (size_t)256 << 10, "staged" },
    { LOOM_COLL_ALLREDUCE, 1, (size_t)256 << 10, "direct" },
    { LOOM_COLL_BROADCAST, 1, (size_t)32 << 10, "direct" },
    { LOOM_COLL_ALLGATHER, 1, (size_t)64 << 10, "direct" },
};

void loom_ctx_set_topology(loom_ctx_t *ctx, const int *node_of, int node_count)
{
    ctx->node_of = node_of;
    ctx->node_count = node_count;
    ctx->ranks_per_node = 0;
    if (node_of == NULL || node_count < 1 || ctx->size % node_count != 0)
        return;
    /* Uniform iff no node holds more than size / node_count ranks (the node
     * indices are dense, so then every node holds exactly that many). */
    const int per = ctx->size / node_count;
    int *seen = calloc((size_t)node_count, sizeof(int));
    if (seen == NULL)
        return;   /* unknown topology: flat algorithms, still correct */
    int ok = 1;
    for (int r = 0; r < ctx->size && ok; r++)
        ok = node_of[r] >= 0 && node_of[r] < node_count && ++seen[node_of[r]] <= per;
    free(seen);
    if (ok)
        ctx->ranks_per_node = per;
}

static int runnable(const loom_algo_t *algo, const loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    return algo != NULL && (algo->can_run == NULL || algo->can_run(ctx, a));
}

/* Saturating, so a huge request still lands in the last row. */
static size_t mul_sat(size_t x, size_t y)
{
    return y != 0 && x > SIZE_MAX / y ? SIZE_MAX : x * y;
}

const loom_algo_t *loom_algo_find(loom_coll_t coll, const char *name)
{
    if (name == NULL)
        return NULL;
    for (size_t i = 0; i < loom_num_algorithms; i++)
        if (loom_algorithms[i].coll == coll && strcmp(loom_algorithms[i].name, name) == 0)
            return &loom_algorithms[i];
    return NULL;
}

const loom_algo_t *loom_algo_select(const loom_ctx_t *ctx, const loom_coll_args_t *a,
                                    const char *forced)
{
    const loom_algo_t *algo = NULL;

    if (forced != NULL && strcmp(forced, "auto") != 0) {
        algo = loom_algo_find(a->coll, forced);
        if (!runnable(algo, ctx, a))
            algo = NULL;
        goto out;
    }

    size_t bytes = mul_sat(a->count, a->esize);
    if (a->coll == LOOM_COLL_ALLGATHER)
        bytes = mul_sat(bytes, (size_t)ctx->size);
    for (size_t i = 0; i < sizeof(direct_from) / sizeof(direct_from[0]); i++) {
        if (direct_from[i].coll != a->coll || bytes < direct_from[i].min_bytes ||
            ctx->size < direct_from[i].min_ranks)
            continue;
        algo = loom_algo_find(a->coll, direct_from[i].name);
        if (runnable(algo, ctx, a))
            goto out;
    }
    if ((a->coll == LOOM_COLL_ALLREDUCE || a->coll == LOOM_COLL_BROADCAST ||
         a->coll == LOOM_COLL_ALLGATHER) && ctx->ranks_per_node > 1 &&
        ctx->size > ctx->ranks_per_node && bytes >= HIERARCHICAL_MIN_BYTES) {
        algo = loom_algo_find(a->coll, "hierarchical");
        if (runnable(algo, ctx, a))
            goto out;
    }
    for (size_t i = 0; i < sizeof(crossovers) / sizeof(crossovers[0]); i++) {
        const crossover_t *c = &crossovers[i];
        if (c->coll != a->coll || ctx->size < c->min_ranks || bytes >= c->below_bytes)
            continue;
        algo = loom_algo_find(c->coll, c->name);
        if (runnable(algo, ctx, a))
            goto out;
    }

    algo = NULL;
    for (size_t i = 0; i < loom_num_algorithms; i++) {
        if (loom_algorithms[i].coll == a->coll && runnable(&loom_algorithms[i], ctx, a)) {
            algo = &loom_algorithms[i];
            break;
        }
    }
out:
    return algo;
}
