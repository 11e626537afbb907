/*
 * relay_rank.c - one rank of the job that tests/test_relay.py attacks: it
 * joins from the environment (LOOM_RANK, LOOM_SIZE, LOOM_STORE, ...), runs
 * ITERS allreduces of COUNT int32 elements (each rank contributes rank + 1),
 * and reports one line on stdout:
 *
 *   rank R status NAME wrong W: message
 *
 * NAME is the loom_status_t of the first failing call (SUCCESS when none
 * failed), W the number of wrong elements the calls that succeeded returned.
 *
 *   relay_rank [ITERS [COUNT]]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <loom.h>

static const char *status_name(loom_status_t st)
{
    static const char *const names[] = {
        "SUCCESS", "INVALID_ARG", "NO_MEMORY", "TIMEOUT", "PEER_LOST", "TRANSPORT",
        "MISMATCH", "UNSUPPORTED", "AUTH", "ABORTED", "INTERNAL",
    };
    return (unsigned)st < sizeof(names) / sizeof(names[0]) ? names[st] : "?";
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 5;
    size_t count = argc > 2 ? (size_t)atol(argv[2]) : 1024;
    loom_comm_t c;
    loom_status_t st = loom_init(&c);
    if (st != LOOM_SUCCESS) {
        const char *r = getenv("LOOM_RANK");
        printf("rank %s status %s wrong 0: %s\n", r ? r : "?", status_name(st),
               loom_comm_last_error(NULL));
        return 0;
    }
    int rank = loom_comm_rank(c), size = loom_comm_size(c);
    int32_t want = size * (size + 1) / 2;
    int32_t *x = malloc(count * sizeof(*x));
    long wrong = 0;
    for (int i = 0; i < iters && st == LOOM_SUCCESS && x; i++) {
        for (size_t j = 0; j < count; j++)
            x[j] = rank + 1;
        st = loom_allreduce(LOOM_IN_PLACE, x, count, LOOM_INT32, LOOM_SUM, c);
        for (size_t j = 0; j < count && st == LOOM_SUCCESS; j++)
            wrong += x[j] != want;
    }
    printf("rank %d status %s wrong %ld: %s\n", rank, status_name(st), wrong,
           st == LOOM_SUCCESS ? "" : loom_comm_last_error(c));
    fflush(stdout);
    free(x);
    loom_comm_destroy(c);
    return 0;
}
