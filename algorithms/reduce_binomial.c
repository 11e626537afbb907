/*
 * reduce_binomial.c - binomial-tree reduce to any root.
 *
 * Source: R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of Collective
 * Communication Operations in MPICH", IJHPCA 19(1), 2005, section 4.3 (the
 * binomial tree used for short reduces); Open MPI's
 * ompi_coll_base_reduce_intra_binomial uses the same tree.
 *
 * Steps, with v = (rank - root) mod n, for mask = 1, 2, 4, ...: if v has the
 * bit set, send the accumulated vector to v - mask and stop; otherwise, if
 * v + mask < n, receive that child's vector and reduce it into the
 * accumulator (own data first: the child covers the higher virtual ranks).
 * The root (v = 0) ends with the full result (divided by n for AVG).
 *
 * Cost: ceil(log2 n) latencies and reductions of the whole vector on the
 * critical path; the root receives ceil(log2 n) full vectors. Meant for small
 * and mid-sized vectors; a reduce-scatter + gather would beat it for large ones.
 *
 * Limits: none (any n, any root, any count). At non-roots recvbuf may be NULL
 * and is never touched; sendbuf is never written.
 * Memory: count elements of scratch at the root (one child's vector), twice
 * that at inner ranks (accumulator + child's vector), none at leaves.
 */
#include <string.h>

#include "algorithms.h"
#include "base/reduce.h"

loom_status_t loom_reduce_binomial(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size;
    const size_t bytes = a->count * a->esize;
    const int v = (ctx->rank - a->root + n) % n;
    const char *in = a->sendbuf;
    loom_status_t st = LOOM_SUCCESS;

    if (a->count == 0)
        goto out;

    /* How many children does v have? (they come at v + 1, v + 2, v + 4, ...) */
    int nchild = 0, mask = 1;
    while (mask < n && !(v & mask)) {
        if (v + mask < n)
            nchild++;
        mask <<= 1;
    }

    char *acc = NULL, *tmp = NULL;
    if (nchild > 0) {
        size_t need = v == 0 ? bytes : 2 * bytes;
        char *scratch = loom_ctx_scratch(ctx, need);
        if (scratch == NULL) {
            st = LOOM_ERR_NO_MEMORY;
            goto out;
        }
        tmp = scratch;
        acc = v == 0 ? a->recvbuf : scratch + bytes;
    } else if (v == 0) {
        acc = a->recvbuf;
    }

    /* cur is the vector we hold: our input until the first child arrives. */
    const char *cur = in;
    for (mask = 1; mask < n; mask <<= 1) {
        if (v & mask) {
            int parent = (v - mask + a->root) % n;
            st = loom_p2p_sendrecv(ctx, parent, cur, bytes, -1, NULL, 0, 0);
            goto out;
        }
        if (v + mask < n) {
            int child = (v + mask + a->root) % n;
            st = loom_p2p_sendrecv(ctx, -1, NULL, 0, child, tmp, bytes, 0);
            if (st != LOOM_SUCCESS)
                goto out;
            loom_reduce_local3(acc, cur, tmp, a->count, a->dtype, a->op);
            cur = acc;
        }
    }

    /* Only the root gets here. */
    if (cur != acc)
        memcpy(acc, cur, bytes);
    if (a->op == LOOM_AVG)
        loom_reduce_avg_finalize(acc, a->count, a->dtype, n);
out:
    return st;
}
