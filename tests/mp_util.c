#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mp_util.h"
#include "store/store.h"

static char store_uri[128];
static int npassed, nfailed;

double mp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *mp_store_uri(void)
{
    return store_uri;
}

/* The store runs in a child process of its own: forking ranks from a parent
 * with a server thread can copy an allocator lock that thread holds (ASan's
 * allocator has no fork handler in gcc 12), and the rank then deadlocks in
 * its first malloc. The child serves until the pipe from the parent closes. */
static pid_t store_start(int *to_store)
{
    int port_pipe[2], stop_pipe[2];
    if (pipe(port_pipe) != 0 || pipe(stop_pipe) != 0)
        return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(port_pipe[0]);
        close(stop_pipe[1]);
        loom_err_t err = {0};
        loom_store_server_t *srv;
        int port = -1;
        if (loom_store_server_start("127.0.0.1", 0, &err, &srv) == LOOM_SUCCESS)
            port = loom_store_server_port(srv);
        else
            fprintf(stderr, "cannot start a store: %s\n", err.msg);
        if (write(port_pipe[1], &port, sizeof(port)) != (ssize_t)sizeof(port) || port < 0)
            _exit(1);
        char c;
        while (read(stop_pipe[0], &c, 1) > 0)
            ;
        loom_store_server_stop(srv);
        _exit(0);
    }
    close(port_pipe[1]);
    close(stop_pipe[0]);
    int port = -1;
    if (pid < 0 || read(port_pipe[0], &port, sizeof(port)) != (ssize_t)sizeof(port) || port < 0) {
        close(port_pipe[0]);
        close(stop_pipe[1]);
        if (pid > 0)
            waitpid(pid, NULL, 0);
        return -1;
    }
    close(port_pipe[0]);
    snprintf(store_uri, sizeof(store_uri), "tcp://127.0.0.1:%d", port);
    *to_store = stop_pipe[1];
    return pid;
}

static void store_stop(pid_t pid, int to_store)
{
    close(to_store);
    waitpid(pid, NULL, 0);
}

static int run(int nranks, mp_rank_fn fn, void *arg, double limit_s, int raw)
{
    static int job_counter;
    int to_store;
    pid_t store_pid = store_start(&to_store);
    if (store_pid < 0)
        return nranks;
    char job[64];
    snprintf(job, sizeof(job), "mp-%d-%d", (int)getpid(), job_counter++);
    fflush(NULL);
    pid_t *pids = calloc((size_t)nranks, sizeof(pid_t));
    for (int r = 0; r < nranks; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            close(to_store);
            char v[32];
            setenv("LOOM_JOB_ID", job, 1);
            setenv("LOOM_STORE", store_uri, 1);
            snprintf(v, sizeof(v), "%d", r);
            setenv("LOOM_RANK", v, 1);
            snprintf(v, sizeof(v), "%d", nranks);
            setenv("LOOM_SIZE", v, 1);
            /* Emulated nodes: LOOM_MP_NODES=k puts ranks [i*k, (i+1)*k) on node i. */
            const char *nodes = getenv("LOOM_MP_NODES");
            if (nodes && atoi(nodes) > 0) {
                snprintf(v, sizeof(v), "node%d", r / atoi(nodes));
                setenv("LOOM_HOST_ID", v, 1);
            }
            if (raw)
                _exit(fn(NULL, arg) == 0 ? 0 : 1);
            loom_config_t cfg = LOOM_CONFIG_INIT;
            cfg.rank = r;
            cfg.size = nranks;
            cfg.store = store_uri;
            loom_comm_t comm;
            loom_status_t st = loom_comm_create(&cfg, &comm);
            if (st != LOOM_SUCCESS) {
                fprintf(stderr, "rank %d: loom_comm_create: %s: %s\n", r, loom_strerror(st),
                        loom_comm_last_error(NULL));
                _exit(2);
            }
            int rc = fn(comm, arg);
            loom_comm_destroy(comm);
            _exit(rc == 0 ? 0 : 1);
        }
    }
    int failed = 0, left = nranks;
    double deadline = mp_now() + limit_s;
    while (left > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            for (int r = 0; r < nranks; r++)
                if (pids[r] == pid) {
                    pids[r] = 0;
                    left--;
                    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                        failed++;
                        if (WIFSIGNALED(status))
                            fprintf(stderr, "rank %d killed by signal %d\n", r, WTERMSIG(status));
                    }
                }
            continue;
        }
        if (mp_now() > deadline) {
            fprintf(stderr, "ranks still running after %.0f s: killing them\n", limit_s);
            for (int r = 0; r < nranks; r++)
                if (pids[r] > 0) {
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], NULL, 0);
                    failed++;
                    left--;
                }
            break;
        }
        usleep(2000);
    }
    free(pids);
    store_stop(store_pid, to_store);
    return failed;
}

int mp_run(int nranks, mp_rank_fn fn, void *arg, double limit_s)
{
    return run(nranks, fn, arg, limit_s, 0);
}

int mp_run_raw(int nranks, mp_rank_fn fn, void *arg, double limit_s)
{
    return run(nranks, fn, arg, limit_s, 1);
}

int mp_bad_count;

void mp_bad(loom_comm_t c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (mp_bad_count++ < 20)
        fprintf(stderr, "FAIL rank %d/%d: %s\n", loom_comm_rank(c), loom_comm_size(c), msg);
}

void mp_result(const char *name, int ok)
{
    printf("%s %s\n", ok ? "PASS" : "FAIL", name);
    fflush(stdout);
    if (ok)
        npassed++;
    else
        nfailed++;
}

int mp_summary(void)
{
    printf("%d passed, %d failed\n", npassed, nfailed);
    return nfailed == 0 ? 0 : 1;
}
