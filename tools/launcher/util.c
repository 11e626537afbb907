/* loomrun: small helpers, ending ranks, and the signal handlers. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "loomrun.h"

#include <stdarg.h>

/* ---- small helpers --------------------------------------------------------- */


/* Out of memory and the like: take the ranks down with us rather than leave
 * them running unobserved. */
void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("loomrun: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (g_run.ranks != NULL) {
        kill_all(SIGKILL);
        reap_all();
    }
    exit(1);
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL)
        fatal("out of memory");
    return q;
}

char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(xrealloc(NULL, n), s, n);
}

void sb_add(strbuf_t *b, const char *s, size_t n)
{
    if (n == 0)
        return;   /* s may be NULL then */
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        b->p = xrealloc(b->p, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void sb_str(strbuf_t *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

/* s as one word of a POSIX shell: in single quotes, each ' as '\''. */
void sb_quote(strbuf_t *b, const char *s)
{
    sb_add(b, "'", 1);
    for (const char *q; (q = strchr(s, '\'')) != NULL; s = q + 1) {
        sb_add(b, s, (size_t)(q - s));
        sb_add(b, "'\\''", 4);
    }
    sb_str(b, s);
    sb_add(b, "'", 1);
}

void sb_free(strbuf_t *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *signal_name(int sig)
{
    switch (sig) {
    case SIGHUP:  return "SIGHUP";
    case SIGINT:  return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL:  return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS:  return "SIGBUS";
    case SIGFPE:  return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS:  return "SIGSYS";
    default:      return "unknown signal";
    }
}

/* Write all of buf to fd, waiting out a non-blocking descriptor we may have
 * inherited. Returns 0, or -1 when the descriptor is unusable for good. */
int write_fd(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd p = { .fd = fd, .events = POLLOUT };
            poll(&p, 1, -1);
        } else {
            return -1;
        }
    }
    return 0;
}

void write_all(int fd, const char *buf, size_t len)
{
    if (!g_run.dest_dead[fd] && write_fd(fd, buf, len) < 0)
        g_run.dest_dead[fd] = 1;
}

void out_reserve(size_t need)
{
    if (need <= g_run.out_cap)
        return;
    size_t cap = g_run.out_cap ? g_run.out_cap : READ_CHUNK;
    while (cap < need)
        cap *= 2;
    g_run.out = xrealloc(g_run.out, cap);
    g_run.out_cap = cap;
}

/* ---- ending ranks -------------------------------------------------------------- */

/* Deliver sig to one rank. A started remote rank gets the signal's name on
 * its control pipe, which its watcher turns into the signal there; SIGKILL
 * (and anything for a rank still connecting) ends the ssh client instead, and
 * the remote side follows when the connection closes. */
void signal_rank(rank_t *rk, int sig)
{
    if (rk->pid <= 0)
        return;
    if (rk->kind == RANK_SSH && rk->started && rk->running && rk->ctl >= 0 && sig != SIGKILL &&
        strncmp(signal_name(sig), "SIG", 3) == 0) {
        char line[16];
        int n = snprintf(line, sizeof(line), "%s\n", signal_name(sig) + 3);
        if (write(rk->ctl, line, (size_t)n) == n)
            return;
    }
    /* srun takes a lone SIGINT as a request for the job's status. */
    if (rk->kind == RANK_SRUN && sig == SIGINT)
        sig = SIGTERM;
    kill(-rk->pid, sig);
}

/* Signal the process group of every rank, exited ones included: an exited
 * rank stays an unreaped zombie until loomrun ends, which keeps its pid, and
 * so its group id, from being reused, while its background children may still
 * be in the group. */
void kill_all(int sig)
{
    for (int r = 0; r < g_run.np; r++)
        signal_rank(&g_run.ranks[r], sig);
}

void reap_all(void)
{
    for (int r = 0; r < g_run.np; r++) {
        if (g_run.ranks[r].pid <= 0)
            continue;
        while (waitpid(g_run.ranks[r].pid, NULL, 0) < 0 && errno == EINTR)
            ;
        g_run.ranks[r].pid = 0;
    }
}


/* ---- signals ----------------------------------------------------------------- */

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    ssize_t r = write(g_run.sigpipe[1], &b, 1);
    (void)r;   /* a full pipe already holds a wake-up */
    errno = saved;
}

void install_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;

    for (int i = 0; i < NFWD; i++) {
        sigaction(g_fwd_signals[i], NULL, &g_run.orig_act[i]);
        if (g_run.orig_act[i].sa_handler != SIG_IGN)
            sigaction(g_fwd_signals[i], &sa, NULL);
    }
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, &g_run.orig_chld);

    /* A closed stdout must not kill loomrun (and with it the job's exit code);
     * write_all sees EPIPE instead. */
    struct sigaction ign;
    memset(&ign, 0, sizeof(ign));
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &g_run.orig_pipe);
}

/* Whether the host of a running ssh rank let its answer time pass; true once,
 * as the deadline is then cleared. */
int answer_overdue(rank_t *rk, long long now)
{
    if (!rk->running || rk->answer_by < 0 || now < rk->answer_by)
        return 0;
    rk->answer_by = -1;
    return 1;
}
