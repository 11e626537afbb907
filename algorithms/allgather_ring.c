/*
 * allgather_ring.c - ring allgather.
 *
 * Source: R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of Collective
 * Communication Operations in MPICH", IJHPCA 19(1), 2005, section 4.2 (the
 * ring algorithm, used for long messages); P. Patarasuk and X. Yuan, JPDC
 * 69(2), 2009, for its bandwidth optimality; Open MPI's
 * ompi_coll_base_allgather_intra_ring.
 *
 * Steps: copy our block to its place in recvbuf (unless in place), then for
 * s = 0 .. n-2 send block (rank - s) mod n to rank+1 and receive block
 * (rank - s - 1) mod n from rank-1, straight into recvbuf.
 *
 * Cost: n-1 latencies, (n-1) * count elements sent and received per rank:
 * bandwidth-optimal, but the latency term grows with n (use Bruck for small
 * totals).
 *
 * Limits: none (any n, any count).
 * Memory: none.
 */
#include <string.h>

#include "algorithms.h"

loom_status_t loom_allgather_ring(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, rank = ctx->rank;
    const size_t bytes = a->count * a->esize;
    char *out = a->recvbuf;
    loom_status_t st = LOOM_SUCCESS;

    if (bytes == 0)
        goto out;
    /* In place, sendbuf already points at our block. memmove: a caller that
     * aliases sendbuf with another block of recvbuf still gets its data. */
    if (a->sendbuf != out + (size_t)rank * bytes)
        memmove(out + (size_t)rank * bytes, a->sendbuf, bytes);

    const int right = (rank + 1) % n, left = (rank - 1 + n) % n;
    for (int s = 0; s < n - 1; s++) {
        size_t sb = (size_t)((rank - s + n) % n), rb = (size_t)((rank - s - 1 + n) % n);
        st = loom_p2p_sendrecv(ctx, right, out + sb * bytes, bytes, left, out + rb * bytes, bytes,
                               (uint32_t)s);
        if (st != LOOM_SUCCESS)
            goto out;
    }
out:
    return st;
}
