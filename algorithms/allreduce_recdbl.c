/*
 * allreduce_recdbl.c - recursive-doubling allreduce, for small vectors.
 *
 * Source: R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of Collective
 * Communication Operations in MPICH", IJHPCA 19(1), 2005, section 4.4; the
 * same schedule as Open MPI's ompi_coll_base_allreduce_intra_recursivedoubling.
 *
 * Steps, with p2 the largest power of two <= n and rem = n - p2:
 *  1. fold: among the first 2*rem ranks, each odd rank sends its whole vector
 *     to rank-1 and drops out; the even rank reduces it into its own. The p2
 *     ranks left get virtual ranks v = rank/2 (rank < 2*rem) or rank - rem.
 *  2. log2(p2) rounds: at round k exchange the whole vector with virtual rank
 *     v ^ 2^k and reduce.
 *  3. unfold: each even rank of the first 2*rem sends the result to rank+1.
 * Partners combine in one fixed order (lower virtual rank first), so both hold
 * the same bits after every round and the result is bitwise identical on every
 * rank even where a floating-point op is not bitwise commutative.
 *
 * Cost: log2(p2) (+2 when n is not a power of two) latencies, each moving the
 * whole vector: good below a few KiB, wasteful for large vectors.
 *
 * Limits: none (any n, any count).
 * Memory: count elements of scratch (the partner's vector).
 */
#include <string.h>

#include "algorithms.h"
#include "base/reduce.h"

#define STEP_FOLD 0u
#define STEP_ROUND(k) (1u + (uint32_t)(k))
#define STEP_UNFOLD 64u

/* Steps 2 and 3 for a rank that stays in: v is its virtual rank, in its vector
 * (sendbuf, or recvbuf once the fold reduced into it). */
static loom_status_t rounds(loom_ctx_t *ctx, const loom_coll_args_t *a, int v, int p2, int rem,
                            const char *in, char *out, char *tmp)
{
    const size_t bytes = a->count * a->esize;
    loom_status_t st = LOOM_SUCCESS;

    for (int mask = 1, k = 0; mask < p2; mask <<= 1, k++) {
        int pv = v ^ mask;
        int peer = pv < rem ? pv * 2 : pv + rem;
        st = loom_p2p_sendrecv(ctx, peer, in, bytes, peer, tmp, bytes, STEP_ROUND(k));
        if (st != LOOM_SUCCESS)
            goto out;
        if (v < pv)
            loom_reduce_local3(out, in, tmp, a->count, a->dtype, a->op);
        else
            loom_reduce_local3(out, tmp, in, a->count, a->dtype, a->op);
        in = out;
    }
    if (ctx->rank < 2 * rem)
        st = loom_p2p_sendrecv(ctx, ctx->rank + 1, out, bytes, -1, NULL, 0, STEP_UNFOLD);
out:
    return st;
}

loom_status_t loom_allreduce_recdbl(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, rank = ctx->rank;
    const size_t bytes = a->count * a->esize;
    const char *in = a->sendbuf;
    char *out = a->recvbuf;
    loom_status_t st = LOOM_SUCCESS;

    if (a->count == 0)
        goto out;

    int p2 = 1;
    while (p2 * 2 <= n)
        p2 *= 2;
    const int rem = n - p2;

    if (n == 1) {
        if (in != out)
            memcpy(out, in, bytes);
    } else if (rank < 2 * rem && rank % 2 == 1) {
        st = loom_p2p_sendrecv(ctx, rank - 1, in, bytes, -1, NULL, 0, STEP_FOLD);
        if (st != LOOM_SUCCESS)
            goto out;
        st = loom_p2p_sendrecv(ctx, -1, NULL, 0, rank - 1, out, bytes, STEP_UNFOLD);
    } else {
        char *tmp = loom_ctx_scratch(ctx, bytes);
        if (tmp == NULL) {
            st = LOOM_ERR_NO_MEMORY;
            goto out;
        }
        int v = rank - rem;
        if (rank < 2 * rem) {
            st = loom_p2p_sendrecv(ctx, -1, NULL, 0, rank + 1, tmp, bytes, STEP_FOLD);
            if (st != LOOM_SUCCESS)
                goto out;
            loom_reduce_local3(out, in, tmp, a->count, a->dtype, a->op);
            in = out;
            v = rank / 2;
        }
        st = rounds(ctx, a, v, p2, rem, in, out, tmp);
    }
    /* Every rank divides the same bits the same way. */
    if (st == LOOM_SUCCESS && a->op == LOOM_AVG)
        loom_reduce_avg_finalize(out, a->count, a->dtype, n);
out:
    return st;
}
