/* coll_kind.h - what a collective is, as the core hands it on: its kind and
 * its checked arguments. Shared by the layers that describe or run a
 * collective without choosing its algorithm (wire.c names it in errors, the
 * accelerator stages its buffers, algorithms/ run it). */
#ifndef LOOM_COLL_KIND_H
#define LOOM_COLL_KIND_H

#include <stddef.h>
#include "loom.h"

typedef enum {
    LOOM_COLL_ALLREDUCE, LOOM_COLL_BROADCAST, LOOM_COLL_REDUCE, LOOM_COLL_ALLGATHER,
    LOOM_COLL_ALLGATHERV, LOOM_COLL_REDUCE_SCATTER, LOOM_COLL_ALLTOALL, LOOM_COLL_ALLTOALLV,
    LOOM_COLL_GATHER, LOOM_COLL_SCATTER, LOOM_COLL_BARRIER, LOOM_COLL_COUNT
} loom_coll_t;

/* "allreduce", ...; "unknown" for a value out of range (base/types.c). */
const char *loom_coll_name(loom_coll_t coll);

/* Arguments of one collective, already checked and normalised by the core:
 *  - sendbuf is never LOOM_IN_PLACE: in-place calls arrive with sendbuf == recvbuf
 *    (reduce_scatter in place: sendbuf == recvbuf holding size*count elements;
 *    allgather in place: sendbuf == recvbuf + rank*count*esize);
 *  - count is the count the user passed (elements; per-rank block for allgather,
 *    reduce_scatter, alltoall, gather, scatter);
 *  - esize is the element size in bytes;
 *  - counts/displs are recvcounts/displs (allgatherv) or recvcounts/rdispls
 *    (alltoallv); scounts/sdispls the send side of alltoallv. */
typedef struct loom_coll_args {
    loom_coll_t coll;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    size_t esize;
    loom_dtype_t dtype;
    loom_op_t op;
    int root;
    const size_t *counts, *displs;
    const size_t *scounts, *sdispls;
} loom_coll_args_t;

#endif
