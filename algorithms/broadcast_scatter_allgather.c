/*
 * broadcast_scatter_allgather.c - broadcast of large buffers as a scatter of
 * n blocks from the root followed by a ring allgather of the blocks.
 *
 * Source: M. Barnett, S. Gupta, D. Payne, L. Shuler, R. van de Geijn and
 * J. Watts, "Interprocessor Collective Communication Library (InterCom)",
 * SHPCC 1994; R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of
 * Collective Communication Operations in MPICH", IJHPCA 19(1), 2005, section
 * 4.1 (MPICH's long-message broadcast).
 *
 * Steps: the buffer is cut into n blocks like the ring allreduce's (block b
 * gets count/n elements, the first count%n one more); the root sends block b
 * to rank b (all sends posted at once), every other rank receives its block in
 * place; then the ring allgatherv spreads the blocks, on a view whose steps
 * never meet the scatter's.
 *
 * Cost: the root sends (n-1)/n of the buffer once, every rank receives the
 * whole buffer once and forwards (n-2)/n of it: about 2x the buffer on the
 * busiest link, where the binomial tree's root sends ceil(log2 n) copies.
 * n latencies more than the tree, so it pays only for large buffers on more
 * than two ranks.
 *
 * Measured here (loom-perf broadcast, 4 ranks on 2 cores over loopback TCP,
 * 64 KiB to 64 MiB): 1.4-2x slower than the pipelined binomial tree at every
 * size, since copies, not links, bound a 2-core machine; so the selection
 * never picks it and LOOM_ALGO=broadcast=scatter_allgather is for fabrics
 * where the root's link is the bottleneck.
 *
 * Limits: none (any n, any root, any count; blocks may be empty).
 * Memory: 2n size_t of scratch for the allgatherv's counts; n requests on the
 * stack up to 64 ranks, else one malloc per call.
 */
#include <stdlib.h>

#include "algorithms.h"
#include "blocks.h"

#define STACK_REQS 64
#define PHASE_STEPS (UINT32_C(1) << 20)

loom_status_t loom_broadcast_scatter_allgather(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, me = ctx->rank;
    const size_t es = a->esize, count = a->count;
    char *buf = a->recvbuf;
    loom_status_t st = LOOM_SUCCESS;
    if (count == 0 || n == 1)
        return LOOM_SUCCESS;

    loom_tp_req_t stack_reqs[STACK_REQS], *reqs = stack_reqs;
    if (me == a->root) {
        if (n > STACK_REQS && (reqs = malloc(sizeof(*reqs) * (size_t)n)) == NULL)
            return loom_err_set(ctx->err, LOOM_ERR_NO_MEMORY, "broadcast: out of memory");
        int nreq = 0;
        for (int b = 0; b < n && st == LOOM_SUCCESS; b++)
            if (b != me && loom_block_count(count, n, b) > 0)
                st = loom_p2p_isend(ctx, b, 0, buf + loom_block_offset(count, n, b) * es,
                                    loom_block_count(count, n, b) * es, &reqs[nreq++]);
        if (st == LOOM_SUCCESS)
            st = loom_p2p_waitall(ctx, reqs, nreq);
        if (reqs != stack_reqs)
            free(reqs);
    } else if (loom_block_count(count, n, me) > 0) {
        st = loom_p2p_irecv(ctx, a->root, 0, buf + loom_block_offset(count, n, me) * es,
                            loom_block_count(count, n, me) * es, &reqs[0]);
        if (st == LOOM_SUCCESS)
            st = loom_p2p_wait(ctx, &reqs[0]);
    }
    if (st != LOOM_SUCCESS)
        return st;

    size_t *counts = loom_ctx_scratch(ctx, 2 * (size_t)n * sizeof(size_t));
    if (counts == NULL)
        return LOOM_ERR_NO_MEMORY;
    size_t *displs = counts + n;
    for (int b = 0; b < n; b++) {
        counts[b] = loom_block_count(count, n, b);
        displs[b] = loom_block_offset(count, n, b);
    }
    loom_ctx_t v = *ctx;
    v.step_base = ctx->step_base + PHASE_STEPS;
    loom_coll_args_t ga = *a;
    ga.coll = LOOM_COLL_ALLGATHERV;
    ga.sendbuf = buf + displs[me] * es;
    ga.count = counts[me];
    ga.counts = counts;
    ga.displs = displs;
    st = loom_allgatherv_ring(&v, &ga);
    ctx->scratch = v.scratch;
    ctx->scratch_size = v.scratch_size;
    return st;
}
