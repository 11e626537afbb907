/*
 * alltoall_pairwise.c - pairwise-exchange alltoall.
 *
 * Source: R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of Collective
 * Communication Operations in MPICH", IJHPCA 19(1), 2005, section 4.6 (the
 * pairwise-exchange algorithm for long messages); Open MPI's
 * ompi_coll_base_alltoall_intra_pairwise.
 *
 * Steps: copy our own block locally, then for k = 1 .. n-1 send the block for
 * (rank + k) mod n to it and receive the block from (rank - k) mod n, one
 * exchange at a time so no rank is flooded by everyone at once.
 *
 * Cost: n-1 latencies, (n-1) * count elements sent per rank. For tiny blocks
 * on many ranks Bruck's alltoall (log2 n steps) would win.
 *
 * Limits: none (any n, any count). In place (sendbuf == recvbuf) a block
 * received early would overwrite one not sent yet, so the input is first
 * copied to scratch.
 * Memory: none out of place; n * count elements of scratch in place.
 */
#include <string.h>

#include "algorithms.h"

loom_status_t loom_alltoall_pairwise(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, rank = ctx->rank;
    const size_t bytes = a->count * a->esize;
    const char *in = a->sendbuf;
    char *out = a->recvbuf;
    loom_status_t st = LOOM_SUCCESS;

    if (bytes == 0 || (n == 1 && in == out))
        goto out;
    if (in == out) {
        char *copy = loom_ctx_scratch(ctx, (size_t)n * bytes);
        if (copy == NULL) {
            st = LOOM_ERR_NO_MEMORY;
            goto out;
        }
        memcpy(copy, in, (size_t)n * bytes);
        in = copy;
    } else {
        memcpy(out + (size_t)rank * bytes, in + (size_t)rank * bytes, bytes);
    }

    for (int k = 1; k < n; k++) {
        size_t dst = (size_t)((rank + k) % n), src = (size_t)((rank - k + n) % n);
        st = loom_p2p_sendrecv(ctx, (int)dst, in + dst * bytes, bytes, (int)src, out + src * bytes,
                               bytes, (uint32_t)k);
        if (st != LOOM_SUCCESS)
            goto out;
    }
out:
    return st;
}
