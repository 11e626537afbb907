/* mp_util.h - run a function on N ranks, each a forked process joined over
 * real loopback sockets through a store served by the parent (as loomrun does). */
#ifndef LOOM_MP_UTIL_H
#define LOOM_MP_UTIL_H

#include "loom.h"

/* Runs in each rank; returns 0 on success. Output goes to stderr. */
typedef int (*mp_rank_fn)(loom_comm_t comm, void *arg);

/* Fork nranks processes, give each a communicator, run fn, destroy it. With
 * LOOM_MP_NODES=k in the environment, rank r gets LOOM_HOST_ID=node<r/k>, so
 * the ranks act out nodes of k ranks. Returns
 * the number of ranks that failed (non-zero exit, a signal, or not done within
 * limit_s, after which all are killed). */
int mp_run(int nranks, mp_rank_fn fn, void *arg, double limit_s);

/* Like mp_run but the ranks create their own communicator (fn gets NULL): for
 * tests of creation itself. The store URI is in LOOM_STORE, rank/size in
 * LOOM_RANK/LOOM_SIZE. */
int mp_run_raw(int nranks, mp_rank_fn fn, void *arg, double limit_s);

/* The URI of the store the parent serves during mp_run/mp_run_raw. */
const char *mp_store_uri(void);

double mp_now(void);

/* A failed check inside a rank: prints "FAIL rank r/n: message" to stderr
 * (the first 20) and counts it in mp_bad_count, which is per process, so per
 * rank. */
extern int mp_bad_count;
void mp_bad(loom_comm_t c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Test bookkeeping: prints "PASS name" / "FAIL name" and counts. */
void mp_result(const char *name, int ok);
/* Prints "N passed, N failed" and returns the exit code for automake. */
int mp_summary(void);

#endif
