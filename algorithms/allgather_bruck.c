/*
 * allgather_bruck.c - Bruck's allgather: ceil(log2 n) steps for any n.
 *
 * Source: J. Bruck, C.-T. Ho, S. Kipnis, E. Upfal and D. Weathersby,
 * "Efficient algorithms for all-to-all communications in multiport
 * message-passing systems", IEEE TPDS 8(11), 1997; R. Thakur, R. Rabenseifner
 * and W. Gropp, IJHPCA 19(1), 2005, section 4.2 (used by MPICH for short
 * messages and non-powers of two); Open MPI's ompi_coll_base_allgather_intra_bruck.
 * It plays the role of recursive-doubling allgather, without needing n to be
 * a power of two.
 *
 * Steps, in a scratch buffer t of n blocks where t[i] ends up holding the
 * block of rank (rank + i) mod n:
 *  1. t[0] = our block;
 *  2. for k = 0 .. ceil(log2 n)-1, with d = 2^k: send t[0 .. m) to
 *     (rank - d) mod n and receive m blocks from (rank + d) mod n into
 *     t[d .. d+m), where m = min(d, n - d);
 *  3. rotate: recvbuf block (rank + i) mod n = t[i].
 *
 * Cost: ceil(log2 n) latencies, (n-1) * count elements sent per rank, plus
 * a local copy of the whole result. Best for small totals.
 *
 * Limits: none (any n, any count).
 * Memory: n * count elements of scratch.
 */
#include <string.h>

#include "algorithms.h"

loom_status_t loom_allgather_bruck(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, rank = ctx->rank;
    const size_t bytes = a->count * a->esize;
    char *out = a->recvbuf;
    loom_status_t st = LOOM_SUCCESS;

    if (bytes == 0)
        goto out;
    if (n == 1) {
        if (a->sendbuf != out)
            memmove(out, a->sendbuf, bytes);
        goto out;
    }

    char *t = loom_ctx_scratch(ctx, (size_t)n * bytes);
    if (t == NULL) {
        st = LOOM_ERR_NO_MEMORY;
        goto out;
    }
    memcpy(t, a->sendbuf, bytes);

    for (int d = 1, k = 0; d < n; d *= 2, k++) {
        size_t m = (size_t)(d < n - d ? d : n - d);
        int dst = (rank - d + n) % n, src = (rank + d) % n;
        st = loom_p2p_sendrecv(ctx, dst, t, m * bytes, src, t + (size_t)d * bytes, m * bytes,
                               (uint32_t)k);
        if (st != LOOM_SUCCESS)
            goto out;
    }

    /* t[0 .. n-rank) are blocks rank .. n-1, the rest blocks 0 .. rank-1. */
    size_t head = (size_t)(n - rank);
    memcpy(out + (size_t)rank * bytes, t, head * bytes);
    memcpy(out, t + head * bytes, (size_t)rank * bytes);
out:
    return st;
}
