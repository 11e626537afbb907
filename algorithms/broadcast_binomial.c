/*
 * broadcast_binomial.c - binomial-tree broadcast, pipelined in segments.
 *
 * Source: R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of Collective
 * Communication Operations in MPICH", IJHPCA 19(1), 2005, section 4.1 (the
 * binomial tree); segmentation as in Open MPI's
 * ompi_coll_base_bcast_intra_binomial / ompi_coll_base_bcast_intra_generic.
 *
 * Steps, with v = (rank - root) mod n: the parent of v is v with its lowest
 * set bit cleared; the children of v are v + 2^k for every 2^k below that bit
 * with v + 2^k < n (the root's go up to the highest power of two below n).
 * The buffer is cut into segments of ctx->segment_bytes (rounded to elements):
 * a rank receives segment j from its parent (with segment j+1 already posted)
 * and forwards it to its children, largest subtree first, while the next
 * segment arrives. Segments of one pair share a step number and match in order.
 *
 * Cost: (ceil(log2 n) + nseg - 1) segment times on the critical path; the
 * root sends ceil(log2 n) copies of the buffer, so a pipelined chain or a
 * scatter-allgather would beat it for very large buffers on many ranks.
 *
 * Limits: none (any n, any root, any count).
 * Memory: no scratch; two segments' worth of requests on the stack.
 */
#include "algorithms.h"

#define MAX_CHILDREN 32   /* log2 of the largest int rank count, plus one */

static size_t min_sz(size_t x, size_t y)
{
    return x < y ? x : y;
}

loom_status_t loom_broadcast_binomial(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size;
    const size_t es = a->esize, count = a->count;
    char *buf = a->recvbuf;
    loom_tp_req_t rreq[2], sreq[2][MAX_CHILDREN];
    int nsent[2] = { 0, 0 };
    int children[MAX_CHILDREN], nchild = 0, parent = -1;
    loom_status_t st = LOOM_SUCCESS;

    if (count == 0 || n == 1)
        goto out;

    const int v = (ctx->rank - a->root + n) % n;
    int mask = 1;
    while (mask < n) {
        if (v & mask) {
            parent = (v - mask + a->root) % n;
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (v + mask < n)
            children[nchild++] = (v + mask + a->root) % n;

    size_t seg = ctx->segment_bytes / es;
    if (seg == 0)
        seg = ctx->segment_bytes == 0 ? count : 1;
    const size_t nseg = (count + seg - 1) / seg;

    if (parent >= 0) {
        st = loom_p2p_irecv(ctx, parent, 0, buf, min_sz(seg, count) * es, &rreq[0]);
        if (st != LOOM_SUCCESS)
            goto out;
    }
    for (size_t j = 0; j < nseg; j++) {
        const int k = (int)(j & 1);
        const size_t off = j * seg, len = min_sz(seg, count - off);
        if (parent >= 0) {
            if (j + 1 < nseg) {
                size_t noff = off + seg;
                st = loom_p2p_irecv(ctx, parent, 0, buf + noff * es,
                                    min_sz(seg, count - noff) * es, &rreq[1 - k]);
                if (st != LOOM_SUCCESS)
                    goto out;
            }
            st = loom_p2p_wait(ctx, &rreq[k]);
            if (st != LOOM_SUCCESS)
                goto out;
        }
        if (nchild > 0) {
            /* The request slots of segment j-2 are reused. */
            st = loom_p2p_waitall(ctx, sreq[k], nsent[k]);
            if (st != LOOM_SUCCESS)
                goto out;
            nsent[k] = 0;
            for (int c = 0; c < nchild; c++) {
                st = loom_p2p_isend(ctx, children[c], 0, buf + off * es, len * es,
                                    &sreq[k][c]);
                if (st != LOOM_SUCCESS)
                    goto out;
                nsent[k]++;
            }
        }
    }
    for (int k = 0; k < 2; k++) {
        st = loom_p2p_waitall(ctx, sreq[k], nsent[k]);
        if (st != LOOM_SUCCESS)
            goto out;
    }
out:
    return st;
}
