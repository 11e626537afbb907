/* mp_shm_bind.c - a record replayed from another job must not reach that job's
 * shared memory (issue 26).
 *
 * Two jobs of one user with one LOOM_JOB_ID (and, in the first round, one
 * LOOM_AUTH_KEY), each rendezvousing in a file:// store of its own, all ranks
 * on this node over shared memory. B (the bystander) starts and connects fully;
 * then B's signed rank-0 record is copied into A's store over A's own rank 0's
 * before A's rank 1 is started, so A's rank 1 reads it: A's rank 1 must fail
 * with LOOM_ERR_AUTH (LOOM_ERR_TRANSPORT without a key) naming rank 0, its rank
 * 0 must fail too, and B, let go only once both of A's ranks are gone, must
 * still get every collective right. Each step waits for the previous one's
 * event (a pipe message, a store key, a child's exit), never for the clock. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loom.h"
#include "mp_util.h"
#include "store/store.h"

#define JOB_ID "shm-bind-twins"
#define KEY "one key for both jobs"
/* A's ranks must fail at once; this only bounds a broken build. */
#define A_TIMEOUT_S 20.0
#define B_TIMEOUT_S 120.0
#define WAIT_MS 180000
#define COUNT 300000   /* above the CMA and the ring's chunk sizes */

typedef struct report {
    int rank, st;
    char msg[1000];
} report_t;

static void report_to(int fd, int rank, loom_status_t st, const char *msg)
{
    report_t r = {.rank = rank, .st = (int)st};
    snprintf(r.msg, sizeof(r.msg), "%s", msg);
    if (write(fd, &r, sizeof(r)) != (ssize_t)sizeof(r))
        _exit(9);
}

/* Read one report within WAIT_MS; 0 on success. */
static int read_report(int fd, report_t *r)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, WAIT_MS) != 1)
        return -1;
    return read(fd, r, sizeof(*r)) == (ssize_t)sizeof(*r) ? 0 : -1;
}

static void job_env(const char *dir, int keyed, double timeout_s)
{
    char uri[300], t[32];
    snprintf(uri, sizeof(uri), "file://%s", dir);
    snprintf(t, sizeof(t), "%g", timeout_s);
    setenv("LOOM_STORE", uri, 1);
    setenv("LOOM_JOB_ID", JOB_ID, 1);
    setenv("LOOM_SHM", "1", 1);
    setenv("LOOM_TIMEOUT", t, 1);
    unsetenv("LOOM_HOST_ID");
    if (keyed)
        setenv("LOOM_AUTH_KEY", KEY, 1);
    else
        unsetenv("LOOM_AUTH_KEY");
}

static loom_status_t create(int rank, loom_comm_t *c)
{
    loom_config_t cfg = LOOM_CONFIG_INIT;
    cfg.rank = rank;
    cfg.size = 2;
    return loom_comm_create(&cfg, c);
}

/* A rank of B: connect, say so, wait for "go", then allreduces in place and
 * out of place, small and large, checked element by element. */
static void bystander(int rank, const char *dir, int keyed, int up, int go)
{
    job_env(dir, keyed, B_TIMEOUT_S);
    loom_comm_t c = NULL;
    loom_status_t st = create(rank, &c);
    report_to(up, rank, st, st == LOOM_SUCCESS ? "up" : loom_comm_last_error(NULL));
    if (st != LOOM_SUCCESS)
        _exit(1);
    char g;
    if (read(go, &g, 1) != 1)
        _exit(2);
    double *x = malloc(sizeof(double) * COUNT), *y = malloc(sizeof(double) * COUNT);
    if (!x || !y)
        _exit(3);
    int bad = 0;
    for (int round = 0; round < 3 && st == LOOM_SUCCESS; round++) {
        size_t n = round == 0 ? 8 : COUNT;
        for (size_t i = 0; i < n; i++)
            x[i] = (double)(rank + 1) * (double)(i + round);
        st = loom_allreduce(x, y, n, LOOM_FLOAT64, LOOM_SUM, c);
        for (size_t i = 0; st == LOOM_SUCCESS && i < n; i++)
            bad += y[i] != 3.0 * (double)(i + round);
        if (st == LOOM_SUCCESS)
            st = loom_allreduce(LOOM_IN_PLACE, x, n, LOOM_FLOAT64, LOOM_MAX, c);
        for (size_t i = 0; st == LOOM_SUCCESS && i < n; i++)
            bad += x[i] != 2.0 * (double)(i + round);
    }
    if (st != LOOM_SUCCESS)
        fprintf(stderr, "bystander rank %d: %s: %s\n", rank, loom_strerror(st),
                loom_comm_last_error(c));
    if (bad)
        fprintf(stderr, "bystander rank %d: %d wrong elements\n", rank, bad);
    loom_status_t dst = loom_comm_destroy(c);
    _exit(st == LOOM_SUCCESS && dst == LOOM_SUCCESS && !bad ? 0 : 4);
}

/* A rank of A: report how creating its communicator ended. */
static void victim(int rank, const char *dir, int keyed, int out)
{
    job_env(dir, keyed, A_TIMEOUT_S);
    loom_comm_t c = NULL;
    loom_status_t st = create(rank, &c);
    report_to(out, rank, st, st == LOOM_SUCCESS ? "created" : loom_comm_last_error(NULL));
    loom_comm_destroy(c);
    _exit(0);
}

static pid_t spawn_bystander(int rank, const char *dir, int keyed, int up[2], int go[2])
{
    pid_t pid = fork();
    if (pid == 0) {
        close(up[0]);
        close(go[1]);
        bystander(rank, dir, keyed, up[1], go[0]);
    }
    return pid;
}

static pid_t spawn_victim(int rank, const char *dir, int keyed, int out[2])
{
    pid_t pid = fork();
    if (pid == 0) {
        close(out[0]);
        victim(rank, dir, keyed, out[1]);
    }
    return pid;
}

static int exited_ok(pid_t pid)
{
    int status;
    return waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static loom_status_t open_store(const char *dir, int keyed, loom_store_t **s)
{
    char uri[300];
    loom_err_t err = {0};
    snprintf(uri, sizeof(uri), "file://%s", dir);
    loom_status_t st = loom_store_open_key(uri, -1, 30.0, KEY, keyed ? strlen(KEY) : 0, &err, s);
    if (st != LOOM_SUCCESS)
        fprintf(stderr, "cannot open %s: %s\n", uri, err.msg);
    return st;
}

static void run_round(int keyed)
{
    const char *with = keyed ? "with a key" : "without a key";
    char dir_a[] = "/tmp/loom-shm-bind-a-XXXXXX", dir_b[] = "/tmp/loom-shm-bind-b-XXXXXX";
    char name[200];
    if (!mkdtemp(dir_a) || !mkdtemp(dir_b)) {
        perror("mkdtemp");
        mp_result("temporary store directories", 0);
        return;
    }
    int b_up[2], b_go[2], a_out[2];
    if (pipe(b_up) != 0 || pipe(b_go) != 0 || pipe(a_out) != 0) {
        mp_result("pipes", 0);
        return;
    }
    pid_t b[2] = {-1, -1}, a[2] = {-1, -1};
    loom_store_t *sa = NULL, *sb = NULL;
    void *rec = NULL, *probe = NULL;
    size_t len, plen;
    loom_err_t err = {0};
    int ok_b_up = 1;

    /* 1. B fully connected. */
    for (int r = 0; r < 2; r++)
        b[r] = spawn_bystander(r, dir_b, keyed, b_up, b_go);
    for (int r = 0; r < 2; r++) {
        report_t rep;
        if (read_report(b_up[0], &rep) != 0 || rep.st != LOOM_SUCCESS) {
            fprintf(stderr, "B did not come up: %s\n", rep.msg);
            ok_b_up = 0;
        }
    }
    snprintf(name, sizeof(name), "%s: the bystander job B connects", with);
    mp_result(name, ok_b_up);
    if (!ok_b_up)
        goto out;

    /* 2. B's rank-0 record, signed as B wrote it, over A's rank 0's own. */
    const char *key0 = "loom/" JOB_ID "/world0/addr/0";
    if (open_store(dir_b, keyed, &sb) != LOOM_SUCCESS ||
        open_store(dir_a, keyed, &sa) != LOOM_SUCCESS ||
        loom_store_get(sb, key0, &rec, &len, 30.0, &err) != LOOM_SUCCESS) {
        fprintf(stderr, "cannot read B's record: %s\n", err.msg);
        mp_result("B's rank-0 record", 0);
        goto out;
    }
    a[0] = spawn_victim(0, dir_a, keyed, a_out);
    /* A's rank 0 reads the records only once rank 1's is there too, so it
     * reads the copy. */
    if (loom_store_get(sa, key0, &probe, &plen, 60.0, &err) != LOOM_SUCCESS ||
        loom_store_set(sa, key0, rec, len, &err) != LOOM_SUCCESS) {
        fprintf(stderr, "cannot replace A's record: %s\n", err.msg);
        mp_result("B's record copied into A's store", 0);
        goto out;
    }
    a[1] = spawn_victim(1, dir_a, keyed, a_out);

    /* 3. A fails, naming rank 0; which of A's ranks reports first varies. */
    report_t rep[2];
    int got = 0;
    for (int i = 0; i < 2; i++)
        got += read_report(a_out[0], &rep[i]) == 0;
    int ok1 = 0, ok0 = 0;
    loom_status_t want = keyed ? LOOM_ERR_AUTH : LOOM_ERR_TRANSPORT;
    for (int i = 0; i < got; i++) {
        printf("  %s: A's rank %d: %s: %s\n", with, rep[i].rank,
               loom_strerror((loom_status_t)rep[i].st), rep[i].msg);
        if (rep[i].rank == 1)
            ok1 = rep[i].st == (int)want && strstr(rep[i].msg, "rank 0") != NULL;
        else
            ok0 = rep[i].st != LOOM_SUCCESS;
    }
    for (int r = 0; r < 2; r++)
        exited_ok(a[r]);
    a[0] = a[1] = -1;
    snprintf(name, sizeof(name), "%s: A's rank 1 refuses B's rank-0 segment (%s naming rank 0)",
             with, loom_strerror(want));
    mp_result(name, got == 2 && ok1);
    snprintf(name, sizeof(name), "%s: A's rank 0 fails on the replayed record", with);
    mp_result(name, got == 2 && ok0);

out:
    /* 4. B, untouched, runs its collectives. */
    if (b[0] > 0 || b[1] > 0) {
        if (write(b_go[1], "gg", 2) != 2)
            perror("write");
        int ok = 1;
        for (int r = 0; r < 2; r++)
            ok &= b[r] > 0 && exited_ok(b[r]);
        snprintf(name, sizeof(name), "%s: the bystander B gets every collective right", with);
        mp_result(name, ok);
    }
    for (int r = 0; r < 2; r++)
        if (a[r] > 0) {
            kill(a[r], SIGKILL);
            waitpid(a[r], NULL, 0);
        }
    free(rec);
    free(probe);
    loom_store_close(sa);
    loom_store_close(sb);
    close(b_up[0]), close(b_up[1]), close(b_go[0]), close(b_go[1]);
    close(a_out[0]), close(a_out[1]);
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", dir_a, dir_b);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s, %s\n", dir_a, dir_b);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    run_round(1);
    run_round(0);
    return mp_summary();
}
