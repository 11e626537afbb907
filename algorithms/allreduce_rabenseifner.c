/*
 * allreduce_rabenseifner.c - Rabenseifner's allreduce: reduce-scatter by
 * recursive halving, then allgather by recursive doubling.
 *
 * Source: R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of Collective
 * Communication Operations in MPICH", IJHPCA 19(1), 2005, section 4.4; the
 * same schedule as Open MPI's ompi_coll_base_allreduce_intra_redscat_allgather
 * and MPICH's MPIR_Allreduce_intra_reduce_scatter_allgather.
 *
 * Steps, with p2 the largest power of two <= n and rem = n - p2, the vector
 * cut into p2 blocks (block b gets count/p2 elements, the first count%p2 one
 * more):
 *  1. fold: among the first 2*rem ranks, each odd rank sends its whole vector
 *     to rank-1 and drops out; the even rank reduces it into its own. The p2
 *     ranks left get virtual ranks v = rank/2 (rank < 2*rem) or rank - rem.
 *  2. reduce-scatter by recursive halving, log2(p2) steps, distance p2/2 down
 *     to 1: the current window of blocks is split in two, v keeps the lower
 *     half if its bit for this distance is 0 and the upper half otherwise,
 *     sends the other half to v ^ distance and reduces the half it receives.
 *     Afterwards v holds the full result of block v (divided by n for AVG).
 *  3. allgather by recursive doubling, distance 1 up to p2/2: exchange the
 *     window gathered so far with v ^ distance, straight into recvbuf.
 *  4. unfold: each even rank of the first 2*rem sends the result to rank+1.
 * Each block is completed at one rank and then copied: the result is bitwise
 * identical on every rank.
 *
 * Cost: 2 log2(p2) latencies (+2 when n is not a power of two), about
 * 2 * bytes sent per rank (+ bytes twice more for the fold), (p2-1)/p2 * count
 * reductions. Good for mid-sized vectors; non-powers of two pay for the fold.
 *
 * Limits: none (any n, any count; blocks may be empty when count < p2).
 * Memory: count elements of scratch on the ranks that fold, the lower half
 * of the vector on the others.
 */
#include <string.h>

#include "algorithms.h"
#include "blocks.h"
#include "base/reduce.h"

#define STEP_FOLD 0u
#define STEP_HALVE(k) (1u + (uint32_t)(k))
#define STEP_DOUBLE(k) (32u + (uint32_t)(k))
#define STEP_UNFOLD 64u

static int real_rank(int v, int rem)
{
    return v < rem ? v * 2 : v + rem;
}

/* Steps 2 and 3 for a rank that stays in, with virtual rank v; in is its
 * vector (sendbuf, or recvbuf once the fold reduced into it). */
static loom_status_t halve_double(loom_ctx_t *ctx, const loom_coll_args_t *a, int v, int p2,
                                  int rem, const char *in, char *out, char *tmp)
{
    const size_t es = a->esize, count = a->count;
    int lo = 0, len = p2;   /* window of blocks this rank is responsible for */
    loom_status_t st = LOOM_SUCCESS;

    for (int dist = p2 / 2, k = 0; dist >= 1; dist /= 2, k++) {
        int pv = v ^ dist;
        int peer = real_rank(pv, rem);
        int half = len / 2;
        int keep_lo = (v & dist) ? lo + half : lo;
        int give_lo = (v & dist) ? lo : lo + half;
        size_t koff = loom_block_offset(count, p2, keep_lo);
        size_t kcnt = loom_block_offset(count, p2, keep_lo + half) - koff;
        size_t goff = loom_block_offset(count, p2, give_lo);
        size_t gcnt = loom_block_offset(count, p2, give_lo + half) - goff;
        /* Both partners compute the same sizes, so empty halves are skipped on both. */
        st = loom_p2p_sendrecv(ctx, gcnt ? peer : -1, in + goff * es, gcnt * es,
                               kcnt ? peer : -1, tmp, kcnt * es, STEP_HALVE(k));
        if (st != LOOM_SUCCESS)
            goto out;
        if (v < pv)
            loom_reduce_local3(out + koff * es, in + koff * es, tmp, kcnt, a->dtype, a->op);
        else
            loom_reduce_local3(out + koff * es, tmp, in + koff * es, kcnt, a->dtype, a->op);
        /* Later steps read only the kept window, which now lives in recvbuf. */
        in = out;
        lo = keep_lo;
        len = half;
    }

    if (a->op == LOOM_AVG) {
        size_t off = loom_block_offset(count, p2, v);
        loom_reduce_avg_finalize(out + off * es, loom_block_offset(count, p2, v + 1) - off,
                                 a->dtype, ctx->size);
    }

    for (int dist = 1, k = 0; dist < p2; dist *= 2, k++) {
        int pv = v ^ dist;
        int peer = real_rank(pv, rem);
        int plo = (v & dist) ? lo - len : lo + len;
        size_t moff = loom_block_offset(count, p2, lo);
        size_t mcnt = loom_block_offset(count, p2, lo + len) - moff;
        size_t poff = loom_block_offset(count, p2, plo);
        size_t pcnt = loom_block_offset(count, p2, plo + len) - poff;
        st = loom_p2p_sendrecv(ctx, mcnt ? peer : -1, out + moff * es, mcnt * es,
                               pcnt ? peer : -1, out + poff * es, pcnt * es, STEP_DOUBLE(k));
        if (st != LOOM_SUCCESS)
            goto out;
        if (plo < lo)
            lo = plo;
        len *= 2;
    }

    if (ctx->rank < 2 * rem)
        st = loom_p2p_sendrecv(ctx, ctx->rank + 1, out, count * es, -1, NULL, 0, STEP_UNFOLD);
out:
    return st;
}

loom_status_t loom_allreduce_rabenseifner(loom_ctx_t *ctx, const loom_coll_args_t *a)
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
        if (a->op == LOOM_AVG)
            loom_reduce_avg_finalize(out, a->count, a->dtype, n);
    } else if (rank < 2 * rem && rank % 2 == 1) {
        st = loom_p2p_sendrecv(ctx, rank - 1, in, bytes, -1, NULL, 0, STEP_FOLD);
        if (st != LOOM_SUCCESS)
            goto out;
        /* Already divided for AVG by the rank that sends it. */
        st = loom_p2p_sendrecv(ctx, -1, NULL, 0, rank - 1, out, bytes, STEP_UNFOLD);
    } else {
        /* The first halving step keeps at most the lower half, the larger one. */
        size_t need = rank < 2 * rem ? bytes : loom_block_offset(a->count, p2, p2 / 2) * a->esize;
        char *tmp = loom_ctx_scratch(ctx, need);
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
        st = halve_double(ctx, a, v, p2, rem, in, out, tmp);
    }
out:
    return st;
}
