/*
 * mp_spread - a failure spreads: one of 4 ranks is frozen (SIGSTOP) or killed
 * in the middle of a loop of allreduces, over TCP and over shared memory. The
 * survivors wait on each other in chains (the algorithm's steps), so without
 * the news spreading each would wait out its own LOOM_TIMEOUT on the one
 * before it (10, 20, 30 s); with it, every survivor fails within about one
 * LOOM_TIMEOUT of the fault, naming the rank that stopped answering rather
 * than the rank that told it. The times each survivor ended are printed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mp_util.h"

#define NRANKS 4
#define TIMEOUT_S 4.0
#define SLACK_S 3.0

enum { HOW_STOP, HOW_KILL };

/* Shared by the ranks (mapped before the fork). */
typedef struct {
    int victim, how;
    double timeout_s[NRANKS];    /* each rank's LOOM_TIMEOUT */
    _Atomic int fault_set;
    double fault_at;             /* when the victim stopped (mp_now: monotonic) */
    _Atomic int pid;
    _Atomic int survivors_done;
    double end[NRANKS];
    int status[NRANKS];
    char msg[NRANKS][512];
} shared_t;

static shared_t *sh;

/* The message names the victim as the rank that stopped answering or was
 * lost (first hand or told), not a survivor that only gave up or told. */
static int names_victim(const char *msg, int victim)
{
    static const char *const forms[] = {"rank %d stopped answering", "rank %d was lost",
                                        "lost rank %d: the connection",
                                        "lost rank %d: its process",
                                        "lost the connection to rank %d:"};
    for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
        char want[64];
        snprintf(want, sizeof(want), forms[i], victim);
        if (strstr(msg, want))
            return 1;
    }
    return 0;
}

static int spread_loop(loom_comm_t c)
{
    enum { N = 1 << 14 };
    float *buf = calloc(N, sizeof(float));
    int r = loom_comm_rank(c);
    for (int it = 0; it < 1000000; it++) {
        if (r == sh->victim && it == 20) {
            sh->fault_at = mp_now();
            atomic_store(&sh->pid, (int)getpid());
            atomic_store(&sh->fault_set, 1);
            if (sh->how == HOW_KILL)
                raise(SIGKILL);
            raise(SIGSTOP);
            /* Woken by the last survivor: our next call must fail too. */
        }
        loom_status_t st = loom_allreduce(LOOM_IN_PLACE, buf, N, LOOM_FLOAT32, LOOM_SUM, c);
        if (st == LOOM_SUCCESS)
            continue;
        free(buf);
        if (r == sh->victim)
            return 0;
        sh->end[r] = mp_now();
        sh->status[r] = (int)st;
        snprintf(sh->msg[r], sizeof(sh->msg[r]), "%s", loom_comm_last_error(c));
        /* Later calls fail at once. */
        double t0 = mp_now();
        int ok = loom_barrier(c) != LOOM_SUCCESS && mp_now() - t0 < 1.0;
        if (atomic_fetch_add(&sh->survivors_done, 1) == NRANKS - 2 && sh->how == HOW_STOP)
            kill(atomic_load(&sh->pid), SIGCONT);
        return ok ? 0 : 1;
    }
    free(buf);
    return 1;
}

static int spread_rank(loom_comm_t unused, void *arg)
{
    (void)unused;
    (void)arg;
    int r = atoi(getenv("LOOM_RANK"));
    loom_config_t cfg = LOOM_CONFIG_INIT;
    cfg.rank = r;
    cfg.size = NRANKS;
    cfg.store = getenv("LOOM_STORE");
    cfg.timeout_s = sh->timeout_s[r];
    loom_comm_t c = NULL;
    loom_status_t st = loom_comm_create(&cfg, &c);
    if (st != LOOM_SUCCESS) {
        fprintf(stderr, "rank %d: create: %s: %s\n", r, loom_strerror(st),
                loom_comm_last_error(NULL));
        return 1;
    }
    int rc = spread_loop(c);
    loom_comm_destroy(c);
    return rc;
}

/* early >= 0: that rank's LOOM_TIMEOUT is half the others', so it gives up
 * first, while it waits on a rank that is itself only waiting. */
static void run_case(const char *transport, int how, int victim, int early)
{
    memset(sh, 0, sizeof(*sh));
    sh->victim = victim;
    sh->how = how;
    for (int r = 0; r < NRANKS; r++)
        sh->timeout_s[r] = r == early ? TIMEOUT_S / 2 : TIMEOUT_S;
    setenv("LOOM_SHM", strcmp(transport, "shm") == 0 ? "1" : "0", 1);
    int failed = mp_run_raw(NRANKS, spread_rank, NULL, 3 * TIMEOUT_S + 30);
    int ok = failed == (how == HOW_KILL ? 1 : 0) && atomic_load(&sh->fault_set);
    if (failed != (how == HOW_KILL ? 1 : 0))
        fprintf(stderr, "# %d rank(s) failed\n", failed);
    char ends[256] = "";
    size_t off = 0;
    for (int r = 0; r < NRANKS; r++) {
        if (r == victim)
            continue;
        double after = sh->end[r] - sh->fault_at;
        off += (size_t)snprintf(ends + off, sizeof(ends) - off, "%s%d: %.2f s", off ? ", " : "", r,
                                sh->end[r] > 0 ? after : -1.0);
        fprintf(stderr, "# %s %s: rank %d ended %.2f s after the fault: %s: %s\n", transport,
                how == HOW_STOP ? "SIGSTOP" : "SIGKILL", r, after,
                loom_strerror((loom_status_t)sh->status[r]), sh->msg[r]);
        ok = ok && sh->end[r] > 0 && after < TIMEOUT_S + SLACK_S &&
             names_victim(sh->msg[r], victim);
    }
    char name[512];
    char first[64] = "";
    if (early >= 0)
        snprintf(first, sizeof(first), ", rank %d times out first (%.0f s)", early,
                 TIMEOUT_S / 2);
    snprintf(name, sizeof(name), "%s of rank %d of %d over %s%s: every survivor fails within "
             "LOOM_TIMEOUT (%.0f s) + %.0f s naming it (ended after %s)",
             how == HOW_STOP ? "SIGSTOP" : "SIGKILL", victim, NRANKS, transport, first,
             TIMEOUT_S, SLACK_S, ends);
    mp_result(name, ok);
}

int main(void)
{
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("mmap");
        return 99;
    }
    const char *only = getenv("LOOM_SPREAD_CASE");   /* "tcp" or "shm": one transport */
    const char *transports[] = {"tcp", "shm"};
    for (int i = 0; i < 2; i++) {
        if (only && strcmp(only, transports[i]) != 0)
            continue;
        run_case(transports[i], HOW_STOP, 2, -1);
        /* Rank 1 waits on rank 0, which waits on rank 3 or 2: rank 1 must
         * still blame rank 2 (rank 0 says it is alive while it waits). */
        run_case(transports[i], HOW_STOP, 2, 1);
        run_case(transports[i], HOW_KILL, 2, -1);
    }
    return mp_summary();
}
