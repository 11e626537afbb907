/*
 * alltoallv_pairwise.c - pairwise-exchange alltoallv (blocks of any size).
 *
 * Source: R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of Collective
 * Communication Operations in MPICH", IJHPCA 19(1), 2005, section 4.6; Open
 * MPI's ompi_coll_base_alltoallv_intra_pairwise.
 *
 * Steps: copy our own block locally, then for k = 1 .. n-1 send scounts[dst]
 * elements at sdispls[dst] to dst = (rank + k) mod n and receive counts[src]
 * elements at displs[src] from src = (rank - k) mod n. A message goes even
 * when it is empty: only the receiver knows how much it expects, and the
 * transport's length check is what catches a sender that disagrees.
 *
 * Cost: n-1 latencies; each step is as slow as the larger of the two blocks.
 *
 * Limits: none (any n, any counts, gaps between blocks are not touched). In
 * place (sendbuf == recvbuf) the send side uses counts/displs, as MPI's
 * MPI_IN_PLACE does, so every pair must exchange equal counts.
 * Memory: none out of place; in place, scratch for the extent of recvbuf
 * (max over ranks of displs + counts).
 */
#include <string.h>

#include "algorithms.h"

/* Address of a block; buffers may be NULL where every block is empty. */
static char *block(const void *base, size_t displ, size_t count, size_t es)
{
    return count > 0 ? (char *)base + displ * es : NULL;
}

loom_status_t loom_alltoallv_pairwise(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, rank = ctx->rank;
    const size_t es = a->esize;
    const char *in = a->sendbuf;
    char *out = a->recvbuf;
    const size_t *scounts = a->scounts, *sdispls = a->sdispls;
    const int inplace = in == out;
    loom_status_t st = LOOM_SUCCESS;

    if (inplace) {
        /* A block received early would overwrite one not sent yet: send from a copy. */
        size_t extent = 0;
        for (int i = 0; i < n; i++) {
            if (a->counts[i] > 0 && a->displs[i] + a->counts[i] > extent)
                extent = a->displs[i] + a->counts[i];
        }
        scounts = a->counts;
        sdispls = a->displs;
        if (n > 1 && extent > 0) {
            char *copy = loom_ctx_scratch(ctx, extent * es);
            if (copy == NULL) {
                st = LOOM_ERR_NO_MEMORY;
                goto out;
            }
            memcpy(copy, in, extent * es);
            in = copy;
        }
    }
    if (scounts[rank] != a->counts[rank]) {
        st = loom_err_set(ctx->err, LOOM_ERR_INVALID_ARG,
                          "alltoallv: rank %d sends itself %zu elements but expects %zu", rank,
                          scounts[rank], a->counts[rank]);
        goto out;
    }
    if (!inplace && a->counts[rank] > 0)
        memcpy(out + a->displs[rank] * es, in + sdispls[rank] * es, a->counts[rank] * es);

    for (int k = 1; k < n; k++) {
        int dst = (rank + k) % n, src = (rank - k + n) % n;
        size_t sc = scounts[dst], rc = a->counts[src];
        st = loom_p2p_sendrecv(ctx, dst, block(in, sdispls[dst], sc, es), sc * es, src,
                               block(out, a->displs[src], rc, es), rc * es, (uint32_t)k);
        if (st != LOOM_SUCCESS)
            goto out;
    }
out:
    return st;
}
