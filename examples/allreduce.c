/*
 * allreduce.c - the smallest complete Loom program.
 *
 * Every rank contributes rank+1 in each element; after loom_allreduce with
 * LOOM_SUM every rank holds 1 + 2 + ... + size in each element.
 *
 *   loomrun -np 4 ./allreduce
 *
 * Any launcher works: loom_init reads LOOM_*, torchrun, Slurm, Open MPI or
 * PMI variables from the environment.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stdio.h>
#include <stdlib.h>

#include <loom.h>

#define COUNT 8

int main(void)
{
    loom_comm_t comm;
    loom_status_t st = loom_init(&comm);
    if (st != LOOM_SUCCESS) {
        /* No communicator yet: the message is kept per thread under NULL. */
        fprintf(stderr, "loom_init failed: %s: %s\n", loom_strerror(st),
                loom_comm_last_error(NULL));
        return 1;
    }
    int rank = loom_comm_rank(comm);
    int size = loom_comm_size(comm);
    printf("rank %d of %d\n", rank, size);

    float data[COUNT];
    for (int i = 0; i < COUNT; i++)
        data[i] = (float)(rank + 1);

    /* Same buffer as input and output: an in-place reduction. */
    st = loom_allreduce(data, data, COUNT, LOOM_FLOAT32, LOOM_SUM, comm);
    if (st != LOOM_SUCCESS) {
        fprintf(stderr, "rank %d: loom_allreduce failed: %s: %s\n", rank, loom_strerror(st),
                loom_comm_last_error(comm));
        loom_comm_destroy(comm);
        return 1;
    }

    /* Small integers are exact in float32, so the check can be exact too. */
    float expected = (float)size * (float)(size + 1) / 2.0f;
    int ok = 1;
    for (int i = 0; i < COUNT; i++) {
        if (data[i] != expected) {
            fprintf(stderr, "rank %d: element %d is %g, expected %g\n", rank, i, data[i],
                    expected);
            ok = 0;
        }
    }
    if (ok)
        printf("rank %d: allreduce OK (sum = %g)\n", rank, expected);

    st = loom_comm_destroy(comm);
    if (st != LOOM_SUCCESS) {
        /* comm is gone: its detailed message cannot be read any more. */
        fprintf(stderr, "rank %d: loom_comm_destroy failed: %s\n", rank, loom_strerror(st));
        return 1;
    }
    return ok ? 0 : 1;
}
