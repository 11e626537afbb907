/* mp_remap - buffers whose pages change between calls, through the public API
 * only: each round maps a buffer (at the address the previous round unmapped),
 * fills it, runs an in-place int32 sum allreduce on N ranks, checks every
 * element and unmaps it; or keeps the mapping and drops its pages with
 * madvise(MADV_DONTNEED). A transport that kept a registration of the old
 * pages (an HCA pins them) would move the bytes to and from pages nobody sees
 * any more: right in round 0, wrong in every later round. A last case
 * registers one buffer with loom_comm_register_buffer and reuses it.
 *
 * Runs over whatever LOOM_TRANSPORT selects (tests/test_ibverbs.sh: the
 * libibverbs test double, which models pinned pages; tests/rxe: soft-RoCE).
 * LOOM_REMAP_RANKS (default 2), LOOM_REMAP_ROUNDS (default 5). Prints
 * PASS/FAIL lines and "N passed, N failed"; exit status 0 when all pass.
 * `mp_remap --launched`: one rank of a job a launcher started (LOOM_* or
 * torchrun variables; tests/rxe runs it across two VMs), every case on it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loom.h"
#include "mp_util.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

enum { MODE_MMAP, MODE_MADVISE, MODE_REGISTERED };
static const char *const mode_names[] = {"munmap+mmap", "madvise(DONTNEED)",
                                         "loom_comm_register_buffer"};

typedef struct {
    int mode;
    size_t count;   /* int32 elements */
    int rounds;
} remap_case_t;

static int32_t value(int rank, size_t i, int round)
{
    return (int32_t)(rank * 7 + (int)(i % 100000) + round * 13);
}

/* Fill, allreduce in place, check; the number of wrong elements (or -1 when
 * the call failed). */
static long one_round(loom_comm_t c, int32_t *v, size_t count, int round)
{
    int rank = loom_comm_rank(c), n = loom_comm_size(c);
    for (size_t i = 0; i < count; i++)
        v[i] = value(rank, i, round);
    loom_status_t st = loom_allreduce(LOOM_IN_PLACE, v, count, LOOM_INT32, LOOM_SUM, c);
    if (st != LOOM_SUCCESS) {
        fprintf(stderr, "rank %d round %d: allreduce of %zu: %s: %s\n", rank, round, count,
                loom_strerror(st), loom_comm_last_error(c));
        return -1;
    }
    long wrong = 0;
    for (size_t i = 0; i < count; i++) {
        int64_t want = 0;
        for (int r = 0; r < n; r++)
            want += value(r, i, round);
        if (v[i] != (int32_t)want) {
            if (wrong == 0)
                fprintf(stderr, "rank %d round %d count %zu: element %zu is %d, want %d\n", rank,
                        round, count, i, v[i], (int32_t)want);
            wrong++;
        }
    }
    return wrong;
}

static int rank_main(loom_comm_t c, void *arg)
{
    const remap_case_t *k = arg;
    int rank = loom_comm_rank(c);
    size_t bytes = k->count * sizeof(int32_t);
    void *addr = NULL;
    int reused = 0, failed = 0;
    loom_buffer_reg_t reg = NULL;
    if (k->mode != MODE_MMAP) {
        addr = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (addr == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
    }
    if (k->mode == MODE_REGISTERED) {
        loom_status_t st = loom_comm_register_buffer(c, addr, bytes, &reg);
        if (st != LOOM_SUCCESS) {
            fprintf(stderr, "rank %d: loom_comm_register_buffer: %s\n", rank,
                    loom_comm_last_error(c));
            munmap(addr, bytes);
            return 1;
        }
    }
    for (int round = 0; round < k->rounds; round++) {
        void *v = addr;
        if (k->mode == MODE_MMAP) {
            /* Where the last round's buffer was: what malloc does for a large
             * block after free (munmap, then mmap). */
            v = mmap(addr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | (addr ? MAP_FIXED_NOREPLACE : 0), -1, 0);
            if (v == MAP_FAILED && addr)
                v = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                         0);
            if (v == MAP_FAILED) {
                perror("mmap");
                return 1;
            }
            reused += round > 0 && v == addr;
            addr = v;
        }
        long wrong = one_round(c, v, k->count, round);
        if (wrong != 0) {
            if (wrong > 0)
                fprintf(stderr, "rank %d: %s, %zu bytes, round %d: %ld of %zu elements wrong\n",
                        rank, mode_names[k->mode], bytes, round, wrong, k->count);
            failed = 1;
        }
        if (k->mode == MODE_MMAP)
            munmap(v, bytes);
        else if (k->mode == MODE_MADVISE && madvise(v, bytes, MADV_DONTNEED) != 0)
            perror("madvise");
        if (wrong < 0)
            break;
    }
    if (reg && loom_comm_deregister_buffer(c, reg) != LOOM_SUCCESS)
        failed = 1;
    if (k->mode != MODE_MMAP)
        munmap(addr, bytes);
    if (k->mode == MODE_MMAP && rank == 0)
        fprintf(stderr, "rank 0: %s, %zu bytes: the address was reused in %d of %d rounds\n",
                mode_names[k->mode], bytes, reused, k->rounds - 1);
    return failed;
}

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* Eager-sized pieces, the first count that takes the RDMA-write path in the
 * collective matrix, 1 MiB (the program), 4 MiB. */
static const size_t counts[] = {1024, 100003, 262144, 1048576};

int main(int argc, char **argv)
{
    int nranks = env_int("LOOM_REMAP_RANKS", 2);
    int rounds = env_int("LOOM_REMAP_ROUNDS", 5);
    if (argc > 1 && strcmp(argv[1], "--launched") == 0) {
        loom_comm_t c;
        loom_status_t st = loom_init(&c);
        if (st != LOOM_SUCCESS) {
            fprintf(stderr, "loom_init: %s: %s\n", loom_strerror(st), loom_comm_last_error(NULL));
            return 2;
        }
        int bad = 0;
        for (int mode = MODE_MMAP; mode <= MODE_REGISTERED; mode++)
            for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
                if (mode != MODE_MMAP && counts[i] != 262144)
                    continue;
                remap_case_t k = {.mode = mode, .count = counts[i], .rounds = rounds};
                int b = rank_main(c, &k);
                printf("%s rank %d: %s, %zu-byte buffer, %d rounds\n", b ? "FAIL" : "PASS",
                       loom_comm_rank(c), mode_names[mode], counts[i] * sizeof(int32_t), rounds);
                bad |= b;
            }
        loom_comm_destroy(c);
        return bad ? 1 : 0;
    }
    for (int mode = MODE_MMAP; mode <= MODE_REGISTERED; mode++)
        for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
            if (mode != MODE_MMAP && counts[i] != 262144)
                continue;
            remap_case_t k = {.mode = mode, .count = counts[i], .rounds = rounds};
            char name[160];
            snprintf(name, sizeof(name), "%s: %zu-byte buffer, %d rounds of in-place allreduce "
                     "on %d ranks", mode_names[mode], counts[i] * sizeof(int32_t), rounds,
                     nranks);
            int bad = mp_run(nranks, rank_main, &k, 120);
            mp_result(name, bad == 0);
        }
    return mp_summary();
}
