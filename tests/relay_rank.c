/*
 * relay_rank.c - one rank of the job that tests/test_relay.py attacks: it
 * joins from the environment (LOOM_RANK, LOOM_SIZE, LOOM_STORE, ...), runs
 * ITERS allreduces of COUNT int32 elements (each rank contributes rank + 1),
 * and reports one line on stdout:
 *
 *   rank R status NAME wrong W peak P: message
 *
 * NAME is the loom_status_t of the first failing call (SUCCESS when none
 * failed), W the number of wrong elements the calls that succeeded returned,
 * P the process's peak virtual memory in KiB (VmPeak) when it reports.
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

static long vm_peak_kib(void)
{
    char line[256];
    long kib = -1;
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmPeak: %ld", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 5;
    size_t count = argc > 2 ? (size_t)atol(argv[2]) : 1024;
    loom_comm_t c;
    loom_status_t st = loom_init(&c);
    if (st != LOOM_SUCCESS) {
        const char *r = getenv("LOOM_RANK");
        printf("rank %s status %s wrong 0 peak %ld: %s\n", r ? r : "?", status_name(st),
               vm_peak_kib(), loom_comm_last_error(NULL));
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
    printf("rank %d status %s wrong %ld peak %ld: %s\n", rank, status_name(st), wrong,
           vm_peak_kib(), st == LOOM_SUCCESS ? "" : loom_comm_last_error(c));
    fflush(stdout);
    free(x);
    loom_comm_destroy(c);
    return 0;
}
