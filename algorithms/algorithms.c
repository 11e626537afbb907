/*
 * algorithms.c - the table of every algorithm and the automatic choice
 * between them.
 *
 * The choice is one table of rows (collective, ranks, topology, byte range,
 * algorithm): LOOM_ALGO's rows first (parsed here, matched by the core),
 * then Loom's own; the first row whose limits hold and whose algorithm can
 * run wins; collectives without a row that fits get the first algorithm of
 * the table that can run. The allreduce rows come from measurements on a
 * 2-core machine over loopback TCP (below); the allgather rows are still
 * guesses from the literature (MPICH's defaults, Thakur et al. 2005). Faster
 * fabrics move the crossovers: LOOM_ALGO overrides them, per byte range too.
 */
#include <stdint.h>
#include <stdio.h>
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
    { LOOM_COLL_ALLREDUCE, "slots", loom_allreduce_slots, loom_slots_can_run },
    { LOOM_COLL_BROADCAST, "direct", loom_broadcast_direct, loom_direct_can_run },
    { LOOM_COLL_ALLGATHER, "direct", loom_allgather_direct, loom_direct_can_run },
};

const size_t loom_num_algorithms = sizeof(loom_algorithms) / sizeof(loom_algorithms[0]);

/*
 * Loom's own selection rows (loom_algo_rule_t), tried in order after
 * LOOM_ALGO's: the direct algorithms inside a node, then the hierarchical
 * ones across uniform nodes, then the crossovers between the flat ones.
 * Collectives without a row that fits and can run get the first algorithm
 * of loom_algorithms that can.
 *
 * Direct, inside one node over shared memory: the direct algorithms (each
 * byte copied once, by cross-memory attach, from the buffer that holds it)
 * and the staged allreduce (two memcpys through the node's staging windows,
 * in chunks that stay in cache) from these sizes up; their can_run says
 * whether every peer is reachable so. Below them a few small messages cost
 * less than their address swap and fences. loom-perf allreduce, 2-core VM,
 * each algorithm forced, us per call (shared memory; machine not idle):
 *            64 KiB: recdbl/rab/direct/staged  256 KiB          1 MiB           64 MiB
 *   2 ranks  61 / 75 / 72 / 67                 95/92/90/98      325/291/261/273 37372/24647/22166/23702
 *   4 ranks  157 / 209 / 208 / 205             356/343/317/227  1147/1180/915/620 131122/77516/60926/51988
 *
 * Slots, inside one node below 1 KiB: one fence through the windows, no
 * message (allreduce_slots.c). From 1 KiB the reads of the peers' freshly
 * written slots cost more than recursive doubling's messages. loom_bench
 * (the MPI harness), 2-core VM, us per call, slots / recdbl (auto before it):
 *            8 B          64 B         1 KiB        4 KiB
 *   2 ranks  0.44-0.49 / 0.87-0.93   0.47-0.55 / 0.89   1.25-1.31 / 1.27-1.29   2.8-2.9 / 1.9-2.0
 *   4 ranks  3.1-4.5 / 5.4-10.2      3.3 / 4.2          5.4-5.7 / 5.4-5.5       10.4-11.2 / 9.3-9.7
 *
 * Hierarchical, when the job spans several nodes with the same number (> 1)
 * of ranks on each, from 256 KiB up. A first guess, to be measured: below it
 * the three phases' extra latencies (2(L-1) intra-node steps on top of the
 * inter-node allreduce) cost more than the inter-node traffic saved (the
 * flat ring sends 2(n-1)/n of the vector over the slow links per rank, the
 * hierarchical one 2(M-1)/M of a 1/L slice).
 *
 * Crossovers. allreduce: recursive doubling costs log2(n) latencies but
 *   moves the whole vector each round: best while latency dominates (MPICH
 *   switches at 2 KiB on old networks; 16 KiB suits today's 100-400 Gb/s
 *   links). Rabenseifner moves 2x the vector in 2 log2(n) steps; the ring
 *   moves the same in 2(n-1) steps but with neighbour-only traffic and
 *   pipelined reductions, so it wins once bytes/n segments are long enough to
 *   hide the extra latencies, later on many ranks. The allreduce rows were
 *   measured over loopback TCP on 2 cores (bench/loom_bench.c, each algorithm
 *   forced, float32 sum, us per call):
 *            16 KiB: recdbl/rab/ring   64 KiB        1 MiB          4 MiB          16 MiB
 *   2 ranks  8.6 / 12.5 / 12.1        24 / 22 / 22  449 / 278 / 301  1807/1708/1199  11889/8724/8158
 *   4 ranks  31 / 37 / 67             91 / 61 / 99  1924 / 760 / 876 9258/5561/6093  47951/28280/27107
 *   8 ranks  94 / 112 / 215           264/172/243   4982/1948/3558   30689/12709/15934 146858/68634/64834
 * allgather: Bruck needs log2(n) steps but an extra copy of the total; the
 *   ring is bandwidth-optimal and copy-free.
 */
#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define ANY_SIZE SIZE_MAX
static const loom_algo_rule_t builtin_rules[] = {
    { LOOM_COLL_ALLREDUCE, 2, LOOM_TOPO_ANY, 0, 1 * KiB, "slots" },
    { LOOM_COLL_ALLREDUCE, 3, LOOM_TOPO_ANY, 256 * KiB, ANY_SIZE, "staged" },
    { LOOM_COLL_ALLREDUCE, 1, LOOM_TOPO_ANY, 256 * KiB, ANY_SIZE, "direct" },
    { LOOM_COLL_BROADCAST, 1, LOOM_TOPO_ANY, 32 * KiB, ANY_SIZE, "direct" },
    { LOOM_COLL_ALLGATHER, 1, LOOM_TOPO_ANY, 64 * KiB, ANY_SIZE, "direct" },
    { LOOM_COLL_ALLREDUCE, 1, LOOM_TOPO_MULTI_NODE, 256 * KiB, ANY_SIZE, "hierarchical" },
    { LOOM_COLL_BROADCAST, 1, LOOM_TOPO_MULTI_NODE, 256 * KiB, ANY_SIZE, "hierarchical" },
    { LOOM_COLL_ALLGATHER, 1, LOOM_TOPO_MULTI_NODE, 256 * KiB, ANY_SIZE, "hierarchical" },
    { LOOM_COLL_ALLREDUCE, 1, LOOM_TOPO_ANY, 0, 32 * KiB, "recdbl" },
    { LOOM_COLL_ALLREDUCE, 3, LOOM_TOPO_ANY, 0, 8 * MiB, "rabenseifner" },
    { LOOM_COLL_ALLREDUCE, 1, LOOM_TOPO_ANY, 0, 2 * MiB, "rabenseifner" },
    { LOOM_COLL_ALLREDUCE, 1, LOOM_TOPO_ANY, 0, ANY_SIZE, "ring" },
    { LOOM_COLL_ALLGATHER, 1, LOOM_TOPO_ANY, 0, 256 * KiB, "bruck" },
    { LOOM_COLL_ALLGATHER, 1, LOOM_TOPO_ANY, 0, ANY_SIZE, "ring" },
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

size_t loom_algo_bytes(const loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    size_t bytes = mul_sat(a->count, a->esize);
    return a->coll == LOOM_COLL_ALLGATHER ? mul_sat(bytes, (size_t)ctx->size) : bytes;
}

static int rule_holds(const loom_algo_rule_t *r, const loom_ctx_t *ctx,
                      const loom_coll_args_t *a, size_t bytes)
{
    if (r->coll != a->coll || ctx->size < r->min_ranks || bytes < r->min_bytes ||
        (r->max_bytes != SIZE_MAX && bytes >= r->max_bytes))
        return 0;
    return r->topology == LOOM_TOPO_ANY ||
           (ctx->ranks_per_node > 1 && ctx->size > ctx->ranks_per_node);
}

const loom_algo_rule_t *loom_algo_rule_match(const loom_algo_rule_t *rules, size_t n,
                                             const loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    size_t bytes = loom_algo_bytes(ctx, a);
    for (size_t i = 0; i < n; i++)
        if (rule_holds(&rules[i], ctx, a, bytes))
            return &rules[i];
    return NULL;
}

/* "64K" -> 65536; 0, or -1 when s..end is not a byte count. */
static int parse_bytes(const char *s, const char *end, size_t *out)
{
    if (s == end || *s < '0' || *s > '9')
        return -1;
    size_t v = 0;
    for (; s < end && *s >= '0' && *s <= '9'; s++) {
        if (v > (SIZE_MAX - 9) / 10)
            return -1;
        v = v * 10 + (size_t)(*s - '0');
    }
    int shift = 0;
    if (s < end) {
        const char *units = "KMG";
        const char *u = strchr(units, *s >= 'a' ? *s - 'a' + 'A' : *s);
        if (*s == '\0' || u == NULL || s + 1 != end)
            return -1;
        shift = 10 * (int)(u - units + 1);
    }
    if (v > (SIZE_MAX >> shift))
        return -1;
    *out = v << shift;
    return 0;
}

int loom_algo_rules_parse(const char *text, loom_algo_rule_t *rules, size_t max, size_t *n_p,
                          char *why, size_t whylen)
{
    size_t n = 0;
    for (const char *p = text; p && *p;) {
        const char *comma = strchr(p, ',');
        const char *end = comma ? comma : p + strlen(p);
        const char *eq = memchr(p, '=', (size_t)(end - p));
        const char *at = eq ? memchr(eq, '@', (size_t)(end - eq)) : NULL;
        const char *name_end = at ? at : end;
        int coll = -1;
        for (int c = 0; eq && c < LOOM_COLL_COUNT; c++)
            if ((size_t)(eq - p) == strlen(loom_coll_name((loom_coll_t)c)) &&
                strncmp(p, loom_coll_name((loom_coll_t)c), (size_t)(eq - p)) == 0)
                coll = c;
        if (coll >= 0) {
            loom_algo_rule_t r = { (loom_coll_t)coll, 1, LOOM_TOPO_ANY, 0, SIZE_MAX, "" };
            size_t nlen = (size_t)(name_end - eq - 1);
            if (nlen == 0 || nlen >= sizeof(r.name)) {
                snprintf(why, whylen, "\"%.*s\": the algorithm name is %s", (int)(end - p), p,
                         nlen ? "too long" : "empty");
                return -1;
            }
            memcpy(r.name, eq + 1, nlen);
            if (at) {
                const char *dash = memchr(at, '-', (size_t)(end - at));
                if (!dash || (dash == at + 1 && dash + 1 == end) ||
                    (dash > at + 1 && parse_bytes(at + 1, dash, &r.min_bytes) != 0) ||
                    (dash + 1 < end && parse_bytes(dash + 1, end, &r.max_bytes) != 0) ||
                    r.min_bytes >= r.max_bytes) {
                    snprintf(why, whylen, "\"%.*s\": not a byte range LO-HI, LO- or -HI (K, M "
                             "or G for 2^10, 2^20, 2^30; LO < HI)", (int)(end - p), p);
                    return -1;
                }
            }
            if (n == max) {
                snprintf(why, whylen, "more than %zu items", max);
                return -1;
            }
            rules[n++] = r;
        }
        p = comma ? comma + 1 : NULL;
    }
    *n_p = n;
    return 0;
}

const loom_algo_t *loom_algo_select(const loom_ctx_t *ctx, const loom_coll_args_t *a,
                                    const char *forced)
{
    const loom_algo_t *algo = NULL;

    if (forced != NULL && strcmp(forced, "auto") != 0) {
        algo = loom_algo_find(a->coll, forced);
        return runnable(algo, ctx, a) ? algo : NULL;
    }
    size_t bytes = loom_algo_bytes(ctx, a);
    for (size_t i = 0; i < sizeof(builtin_rules) / sizeof(builtin_rules[0]); i++) {
        if (!rule_holds(&builtin_rules[i], ctx, a, bytes))
            continue;
        algo = loom_algo_find(a->coll, builtin_rules[i].name);
        if (runnable(algo, ctx, a))
            return algo;
    }
    for (size_t i = 0; i < loom_num_algorithms; i++)
        if (loom_algorithms[i].coll == a->coll && runnable(&loom_algorithms[i], ctx, a))
            return &loom_algorithms[i];
    return NULL;
}
