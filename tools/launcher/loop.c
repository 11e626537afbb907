/*
 * loomrun: the event loop both modes run, and what comes before and after it.
 *
 * One thread waits in poll() on the ranks' pipes and on a self-pipe the signal
 * handlers write to, so signals and child exits are handled here, in the loop,
 * rather than in handlers. A turn forwards the signals that arrived, prints
 * what the ranks wrote, and reaps the ranks that exited; what an exit means
 * (the job failed, a member left) is the caller's business, told through a
 * callback.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "loomrun.h"

/* Signals stay blocked until the ranks are started: the store server thread
 * inherits the mask (so the handlers run on this thread), and a signal cannot
 * hit a child between fork and exec with our handler. */
void block_signals(void)
{
    if (pipe2(g_run.sigpipe, O_CLOEXEC | O_NONBLOCK) < 0)
        fatal("pipe: %s", strerror(errno));
    sigset_t block;
    sigemptyset(&block);
    for (int i = 0; i < NFWD; i++)
        sigaddset(&block, g_fwd_signals[i]);
    sigaddset(&block, SIGCHLD);
    sigprocmask(SIG_BLOCK, &block, &g_run.orig_mask);
    install_handlers();
}

/* Unique per run, so ranks of an earlier job still connecting to a reused
 * port are refused by the handshake. */
void make_jobid(char *out, size_t outlen)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(out, outlen, "%llx%06x",
             (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec,
             (unsigned)getpid() & 0xffffffu);
}

void evloop_init(evloop_t *L)
{
    memset(L, 0, sizeof(*L));
    L->kill_at = -1;
}

/* The job is ending for a failure: SIGTERM to every rank now, SIGKILL after
 * the grace time (unless one is due already). */
void evloop_fail(evloop_t *L, long long now)
{
    kill_all(SIGTERM);
    if (L->kill_at < 0)
        L->kill_at = now + GRACE_MS;
}

/* The SIGKILL that follows the SIGTERM, once due. */
void evloop_kill_due(evloop_t *L, long long now)
{
    if (L->kill_at >= 0 && !L->killed && now >= L->kill_at) {
        kill_all(SIGKILL);
        L->killed = 1;   /* once is enough: SIGKILL cannot be caught */
    }
}

/* The pipes of every rank, after the self-pipe at index 0. Returns the count. */
static int evloop_fds(evloop_t *L)
{
    L->pfd = xrealloc(L->pfd, (size_t)(2 * g_run.np + 1) * sizeof(struct pollfd));
    L->pstream = xrealloc(L->pstream, (size_t)(2 * g_run.np + 1) * sizeof(stream_t *));
    int n = 0;
    L->pfd[n].fd = g_run.sigpipe[0];
    L->pfd[n].events = POLLIN;
    L->pstream[n++] = NULL;
    for (int r = 0; r < g_run.np; r++) {
        stream_t *ss[2] = { &g_run.ranks[r].out, &g_run.ranks[r].err };
        for (int k = 0; k < 2; k++) {
            if (ss[k]->fd < 0)
                continue;
            L->pfd[n].fd = ss[k]->fd;
            L->pfd[n].events = POLLIN;
            L->pstream[n++] = ss[k];
        }
    }
    return n;
}

/* Read the self-pipe: forward terminating signals, and return whether a
 * SIGCHLD came (some rank may have exited). */
static int evloop_signals(evloop_t *L)
{
    int reap = 0;
    unsigned char sigs[64];
    ssize_t m;
    while ((m = read(g_run.sigpipe[0], sigs, sizeof(sigs))) > 0) {
        for (ssize_t j = 0; j < m; j++) {
            if (sigs[j] == SIGCHLD) {
                reap = 1;
                continue;
            }
            /* Forward each time, so a second Ctrl-C reaches the ranks again;
             * the SIGKILL deadline is set by the first. */
            kill_all(sigs[j]);
            if (!L->got_signal) {
                L->got_signal = sigs[j];
                if (L->kill_at < 0)
                    L->kill_at = now_ms() + GRACE_MS;
            }
        }
    }
    return reap;
}

/* Rank r exited: collect the rest of its output, then tell on_exit. */
static void evloop_reaped(int r, const siginfo_t *si, evloop_exit_fn on_exit, void *arg)
{
    rank_t *rk = &g_run.ranks[r];
    rk->running = 0;
    g_run.nrunning--;
    if (rk->ctl >= 0)
        close(rk->ctl);
    rk->ctl = -1;
    rk->answer_by = -1;
    /* Everything the rank wrote is in the pipes now; print it before any
     * verdict. Output of its own background children after this point is not
     * collected. */
    pump(&rk->out, 1);
    pump(&rk->err, 1);
    close_stream(&rk->out);
    close_stream(&rk->err);
    int code = si->si_code == CLD_EXITED ? si->si_status : 128 + si->si_status;
    on_exit(r, si, code, arg);
    sb_free(&rk->held);
}

void evloop_turn(evloop_t *L, int wait_ms, evloop_exit_fn on_exit, void *arg)
{
    int n = evloop_fds(L);
    int ready = poll(L->pfd, (nfds_t)n, wait_ms);
    if (ready < 0 && errno != EINTR)
        fatal("poll: %s", strerror(errno));
    int reap = ready > 0 && (L->pfd[0].revents & POLLIN) ? evloop_signals(L) : 0;
    for (int j = 1; ready > 0 && j < n; j++)
        if (L->pfd[j].revents != 0)
            pump(L->pstream[j], 0);
    for (int r = 0; reap && r < g_run.np; r++) {
        siginfo_t si;
        if (g_run.ranks[r].running && rank_exited(r, &si))
            evloop_reaped(r, &si, on_exit, arg);
    }
}

/* After the loop. A failed or interrupted job leaves nothing behind, not even
 * background children of ranks that exited; a job that succeeded keeps them,
 * as a shell would. Then the job's state goes. */
void end_job(evloop_t *L, int failed, loom_store_server_t *srv)
{
    if (failed)
        kill_all(SIGKILL);
    reap_all();
    loom_store_server_stop(srv);
    sigaction(SIGCHLD, &g_run.orig_chld, NULL);
    close(g_run.sigpipe[0]);
    close(g_run.sigpipe[1]);
    free(L->pfd);
    free(L->pstream);
    free(g_run.ranks);
    g_run.ranks = NULL;
    g_run.np = 0;
    free(g_run.out);
    sb_free(&g_run.fbuf);
    for (int h = 0; h < g_run.nhosts; h++) {
        free(g_run.hosts[h].name);
        free(g_run.hosts[h].store);
    }
    free(g_run.hosts);
}

/* Die of the signal loomrun got, so a calling shell sees the interruption and
 * stops its script as it would for any interrupted command. */
int die_of_signal(int sig)
{
    signal(sig, SIG_DFL);
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, sig);
    sigprocmask(SIG_UNBLOCK, &s, NULL);
    raise(sig);
    return 128 + sig;
}
