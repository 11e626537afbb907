/*
 * loomrun - start the ranks of a job: forked here, over ssh on other hosts,
 * or through srun inside a Slurm allocation.
 *
 *   loomrun [-np N] [-H h1:4,h2:4 | --hostfile F] [-x VAR[=value]]... prog args...
 *
 * loomrun serves the rendezvous store itself (so no rank has to), starts the
 * ranks with LOOM_RANK/LOOM_SIZE/LOOM_LOCAL_RANK/LOOM_LOCAL_SIZE/LOOM_STORE/
 * LOOM_JOB_ID (and LOOM_HOST_ID when hosts are named) set, tags every line
 * they print with "[R]<stdout>: " or "[R]<stderr>: " (unless --no-tag-output),
 * forwards SIGINT/SIGTERM/SIGHUP, and when one rank fails ends the others and
 * exits with the failing rank's code.
 *
 * A remote rank is an ssh client here running a small sh script there (see
 * remote_script): the script says when the program starts, so an ssh failure
 * before it ("cannot reach host") is told apart from the program failing, and
 * a watcher in it reads ssh's stdin, so loomrun can forward signals by writing
 * their names there and the remote program dies when the connection does.
 *
 * Everything runs in one thread around poll(): the ranks' pipes plus a
 * self-pipe that the signal handlers write to, so signals and child exits are
 * handled in the loop rather than in handlers.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "loom.h"
#include "error.h"
#include "settings.h"
#include "store.h"

/* LOOM_AUTH_KEY (or the file LOOM_AUTH_KEY_FILE names), as the ranks will read
 * it: the store loomrun serves requires it of every client. */
static loom_settings_t g_auth;

static void load_launcher_key(void)
{
    loom_err_t err;
    loom_err_clear(&err);
    if (loom_settings_load(&g_auth, loom_getenv_process, NULL, &err) != LOOM_SUCCESS)
        g_auth.auth_keylen = 0;   /* the ranks report the bad setting themselves */
}

extern char **environ;

/* Time the other ranks get between SIGTERM and SIGKILL. */
#define GRACE_MS 3000
/* A line longer than this is emitted in pieces, so a rank that never prints a
 * newline (progress bars, binary dumps) cannot make loomrun's memory grow
 * without bound. Well above any line a person reads. */
#define LINE_CAP ((size_t)4 << 20)
#define READ_CHUNK 65536
/* Reads of a dead rank's pipe: 16 MiB, more than any pipe buffer holds. */
#define DRAIN_MAX_READS 256
/* What a remote rank may print on stderr before its program starts (ssh's
 * complaints, a login banner) is held back this far, to be shown only if it
 * matters. */
#define HOLD_CAP ((size_t)64 << 10)
/* Seconds a host gets to answer when neither --timeout nor LOOM_TIMEOUT says. */
#define DEFAULT_ANSWER_S 60.0
/* The remote script prints this on stdout just before it runs the program. */
#define MARKER "@@loomrun: rank started@@"

/* Exit codes of loomrun itself, apart from propagated rank codes. */
#define EXIT_USAGE 2
#define EXIT_UNREACHABLE 255   /* ssh's own code for "could not connect" */

typedef struct strbuf {
    char *p;
    size_t len, cap;
} strbuf_t;

typedef enum { RANK_LOCAL, RANK_SSH, RANK_SRUN } rank_kind_t;

typedef struct stream {
    int fd;              /* read end of the rank's pipe; -1 once closed */
    int dest;            /* STDOUT_FILENO or STDERR_FILENO */
    int rank;            /* whose stream */
    int file;            /* --output-filename copy; -1 when none */
    char prefix[40];     /* "[R]<stdout>: " */
    size_t prefix_len;
    char *line;          /* partial line not yet ended by '\n' */
    size_t len, cap;
} stream_t;

typedef struct rank {
    pid_t pid;           /* also its process group id; 0 once reaped */
    int running;         /* not exited yet */
    rank_kind_t kind;
    int host;            /* index into g_hosts */
    int started;         /* ssh: the remote script reached the program */
    int ctl;             /* ssh: write end of ssh's stdin (the remote watcher); -1 */
    long long answer_by; /* ssh: deadline for starting; -1 once it does not matter */
    strbuf_t held;       /* ssh: stderr lines from before the start */
    stream_t out, err;
} rank_t;

typedef struct host {
    char *name;          /* as given: ssh destination, LOOM_HOST_ID, messages */
    int slots;
    int local;           /* this machine: fork, no ssh */
    int nranks;          /* ranks placed on it */
    char *store;         /* LOOM_STORE for its ranks; NULL: the remote script takes
                          * this machine's address from $SSH_CLIENT */
} host_t;

/* The job, global so the fatal path can still end the ranks. */
static rank_t *g_ranks;
static int g_np;
static int g_nrunning;
static host_t *g_hosts;
static int g_nhosts;

static int g_sigpipe[2] = { -1, -1 };
static const int g_fwd_signals[] = { SIGINT, SIGTERM, SIGHUP };
#define NFWD ((int)(sizeof(g_fwd_signals) / sizeof(g_fwd_signals[0])))
/* Dispositions loomrun started with: a signal ignored on entry (nohup, a
 * background job of a non-interactive shell) stays ignored, for us and for
 * the ranks. */
static struct sigaction g_orig_act[NFWD];
static struct sigaction g_orig_chld, g_orig_pipe;
static sigset_t g_orig_mask;

/* Set when a write to our stdout/stderr failed for good (EPIPE...): further
 * output for it is dropped instead of retried. */
static int g_dest_dead[3];

static int g_tag = 1;    /* --tag-output (the default) / --no-tag-output */
static char *g_out;      /* assembly buffer for one batch of tagged lines */
static size_t g_out_cap;
static strbuf_t g_fbuf;  /* the same batch, untagged, for --output-filename */

/* ---- small helpers --------------------------------------------------------- */

static void kill_all(int sig);
static void reap_all(void);

/* Out of memory and the like: take the ranks down with us rather than leave
 * them running unobserved. */
static void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("loomrun: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (g_ranks != NULL) {
        kill_all(SIGKILL);
        reap_all();
    }
    exit(1);
}

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL)
        fatal("out of memory");
    return q;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(xrealloc(NULL, n), s, n);
}

static void sb_add(strbuf_t *b, const char *s, size_t n)
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

static void sb_str(strbuf_t *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

/* s as one word of a POSIX shell: in single quotes, each ' as '\''. */
static void sb_quote(strbuf_t *b, const char *s)
{
    sb_add(b, "'", 1);
    for (const char *q; (q = strchr(s, '\'')) != NULL; s = q + 1) {
        sb_add(b, s, (size_t)(q - s));
        sb_add(b, "'\\''", 4);
    }
    sb_str(b, s);
    sb_add(b, "'", 1);
}

static void sb_free(strbuf_t *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *signal_name(int sig)
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
static int write_fd(int fd, const char *buf, size_t len)
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

static void write_all(int fd, const char *buf, size_t len)
{
    if (!g_dest_dead[fd] && write_fd(fd, buf, len) < 0)
        g_dest_dead[fd] = 1;
}

static void out_reserve(size_t need)
{
    if (need <= g_out_cap)
        return;
    size_t cap = g_out_cap ? g_out_cap : READ_CHUNK;
    while (cap < need)
        cap *= 2;
    g_out = xrealloc(g_out, cap);
    g_out_cap = cap;
}

/* ---- ending ranks -------------------------------------------------------------- */

/* Deliver sig to one rank. A started remote rank gets the signal's name on
 * its control pipe, which its watcher turns into the signal there; SIGKILL
 * (and anything for a rank still connecting) ends the ssh client instead, and
 * the remote side follows when the connection closes. */
static void signal_rank(rank_t *rk, int sig)
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
static void kill_all(int sig)
{
    for (int r = 0; r < g_np; r++)
        signal_rank(&g_ranks[r], sig);
}

static void reap_all(void)
{
    for (int r = 0; r < g_np; r++) {
        if (g_ranks[r].pid <= 0)
            continue;
        while (waitpid(g_ranks[r].pid, NULL, 0) < 0 && errno == EINTR)
            ;
        g_ranks[r].pid = 0;
    }
}

/* ---- output tagging -------------------------------------------------------- */

static int is_marker(const stream_t *s, const char *text, size_t n)
{
    size_t m = sizeof(MARKER) - 1;
    return s->len + n == m && (s->len == 0 || memcmp(s->line, MARKER, s->len) == 0) &&
           memcmp(text, MARKER + s->len, n) == 0;
}

/* Print the stderr lines a remote rank wrote before its program started, now
 * that they are the program's business (or explain its failure). */
static void flush_held(rank_t *rk)
{
    strbuf_t b = { 0 };
    const char *p = rk->held.p, *end = rk->held.p + rk->held.len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        sb_add(&b, rk->err.prefix, rk->err.prefix_len);
        sb_add(&b, p, n);
        sb_add(&b, "\n", 1);
        p += n + 1;
    }
    if (b.len > 0)
        write_all(STDERR_FILENO, b.p, b.len);
    sb_free(&b);
    sb_free(&rk->held);
}

/* The last non-empty line held back: ssh's reason for failing. */
static const char *last_held_line(rank_t *rk)
{
    char *p = rk->held.p;
    if (p == NULL)
        return NULL;
    size_t n = rk->held.len;
    while (n > 0 && (p[n - 1] == '\n' || p[n - 1] == '\r' || p[n - 1] == ' '))
        p[--n] = '\0';
    if (n == 0)
        return NULL;
    char *nl = memrchr(p, '\n', n);
    return nl ? nl + 1 : p;
}

/* One line of s is complete: s->line[0..len) then text[0..n), ended by a
 * newline in the output when ended (else cut at LINE_CAP or at the end).
 * Append it, tagged, to the batch at *olen, and untagged to g_fbuf. */
static void line_done(stream_t *s, size_t *olen, const char *text, size_t n, int ended)
{
    rank_t *rk = &g_ranks[s->rank];
    if (rk->kind == RANK_SSH && !rk->started && s->dest == STDOUT_FILENO && ended &&
        is_marker(s, text, n)) {
        s->len = 0;
        rk->started = 1;
        rk->answer_by = -1;
        flush_held(rk);
        return;
    }
    if (s->file >= 0) {
        sb_add(&g_fbuf, s->line, s->len);
        sb_add(&g_fbuf, text, n);
        if (ended)
            sb_add(&g_fbuf, "\n", 1);
    }
    if (rk->kind == RANK_SSH && !rk->started && s->dest == STDERR_FILENO &&
        rk->held.len < HOLD_CAP) {
        sb_add(&rk->held, s->line, s->len);
        sb_add(&rk->held, text, n);
        sb_add(&rk->held, "\n", 1);
        s->len = 0;
        return;
    }
    out_reserve(*olen + s->prefix_len + s->len + n + 1);
    memcpy(g_out + *olen, s->prefix, s->prefix_len);
    *olen += s->prefix_len;
    if (s->len > 0)   /* s->line may still be NULL */
        memcpy(g_out + *olen, s->line, s->len);
    *olen += s->len;
    memcpy(g_out + *olen, text, n);
    *olen += n;
    g_out[(*olen)++] = '\n';
    s->len = 0;
}

/* Write out a batch: tagged to the console, untagged to the rank's file. */
static void flush_batch(stream_t *s, size_t olen)
{
    if (olen > 0)
        write_all(s->dest, g_out, olen);
    if (g_fbuf.len > 0 && s->file >= 0 && write_fd(s->file, g_fbuf.p, g_fbuf.len) < 0) {
        fprintf(stderr, "loomrun: rank %d: writing its %s file: %s; no longer written\n",
                s->rank, s->dest == STDOUT_FILENO ? "stdout" : "stderr", strerror(errno));
        close(s->file);
        s->file = -1;
    }
    g_fbuf.len = 0;
}

/* Tag the complete lines in data; keep the unfinished tail for later. One
 * write per batch keeps a rank's lines whole and cuts syscalls. */
static void feed(stream_t *s, const char *data, size_t n)
{
    size_t olen = 0;
    const char *p = data, *end = data + n;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl != NULL) {
            line_done(s, &olen, p, (size_t)(nl - p), 1);
            p = nl + 1;
            continue;
        }
        size_t tail = (size_t)(end - p);
        if (s->len + tail > s->cap) {
            size_t cap = s->cap ? s->cap : 256;
            while (cap < s->len + tail)
                cap *= 2;
            s->line = xrealloc(s->line, cap);
            s->cap = cap;
        }
        memcpy(s->line + s->len, p, tail);
        s->len += tail;
        if (s->len >= LINE_CAP)
            line_done(s, &olen, "", 0, 0);
        break;
    }
    flush_batch(s, olen);
}

/* The rank closed the stream or exited: an unfinished last line still gets
 * printed, with a newline so the next tagged line starts cleanly. */
static void close_stream(stream_t *s)
{
    if (s->len > 0) {
        size_t olen = 0;
        line_done(s, &olen, "", 0, 0);
        flush_batch(s, olen);
    }
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    if (s->file >= 0)
        close(s->file);
    s->file = -1;
    free(s->line);
    s->line = NULL;
    s->len = s->cap = 0;
}

/* Read what is there now. Returns 0 when the stream reached EOF (and is
 * closed), 1 otherwise. With drain, keep reading until the pipe is empty,
 * but not forever: a background child of an exited rank may still write. */
static int pump(stream_t *s, int drain)
{
    static char buf[READ_CHUNK];
    int reads = 0;
    while (s->fd >= 0) {
        ssize_t n = read(s->fd, buf, sizeof(buf));
        if (n > 0) {
            feed(s, buf, (size_t)n);
            if (!drain || ++reads >= DRAIN_MAX_READS)
                return 1;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 1;
        } else {
            close_stream(s);
            return 0;
        }
    }
    return 0;
}

/* ---- the ranks' environment -------------------------------------------------- */

typedef struct envv {
    char **v;            /* NULL-terminated, every string owned */
    size_t n, cap;
} envv_t;

static void env_push(envv_t *e, char *kv)
{
    if (e->n + 2 > e->cap) {
        e->cap = e->cap ? e->cap * 2 : 64;
        e->v = xrealloc(e->v, e->cap * sizeof(char *));
    }
    e->v[e->n++] = kv;
    e->v[e->n] = NULL;
}

static int env_find(const envv_t *e, const char *name)
{
    size_t nlen = strlen(name);
    for (size_t i = 0; i < e->n; i++)
        if (strncmp(e->v[i], name, nlen) == 0 && e->v[i][nlen] == '=')
            return (int)i;
    return -1;
}

static void env_set(envv_t *e, const char *name, const char *value)
{
    size_t nlen = strlen(name), vlen = strlen(value);
    char *kv = xrealloc(NULL, nlen + vlen + 2);
    memcpy(kv, name, nlen);
    kv[nlen] = '=';
    memcpy(kv + nlen + 1, value, vlen + 1);
    int i = env_find(e, name);
    if (i >= 0) {
        free(e->v[i]);
        e->v[i] = kv;
    } else {
        env_push(e, kv);
    }
}

static void env_unset(envv_t *e, const char *name)
{
    int i = env_find(e, name);
    if (i < 0)
        return;
    free(e->v[i]);
    memmove(&e->v[i], &e->v[i + 1], (e->n - (size_t)i) * sizeof(char *));   /* with the NULL */
    e->n--;
}

static void env_init(envv_t *e, int from_environ)
{
    e->v = xrealloc(NULL, sizeof(char *));
    e->v[0] = NULL;
    e->n = e->cap = 0;
    for (char **p = environ; from_environ && p != NULL && *p != NULL; p++)
        env_push(e, xstrdup(*p));
}

static void env_free(envv_t *e)
{
    for (size_t i = 0; i < e->n; i++)
        free(e->v[i]);
    free(e->v);
}

/* The variables loomrun sets for every rank itself. */
static int loomrun_sets(const char *kv)
{
    static const char *const names[] = { "LOOM_RANK", "LOOM_SIZE", "LOOM_LOCAL_RANK",
                                         "LOOM_LOCAL_SIZE", "LOOM_STORE", "LOOM_JOB_ID",
                                         "LOOM_HOST_ID" };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        size_t n = strlen(names[i]);
        if (strncmp(kv, names[i], n) == 0 && kv[n] == '=')
            return 1;
    }
    return 0;
}

/* ---- signals ----------------------------------------------------------------- */

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    ssize_t r = write(g_sigpipe[1], &b, 1);
    (void)r;   /* a full pipe already holds a wake-up */
    errno = saved;
}

static void install_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;

    for (int i = 0; i < NFWD; i++) {
        sigaction(g_fwd_signals[i], NULL, &g_orig_act[i]);
        if (g_orig_act[i].sa_handler != SIG_IGN)
            sigaction(g_fwd_signals[i], &sa, NULL);
    }
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, &g_orig_chld);

    /* A closed stdout must not kill loomrun (and with it the job's exit code);
     * write_all sees EPIPE instead. */
    struct sigaction ign;
    memset(&ign, 0, sizeof(ign));
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &g_orig_pipe);
}

/* ---- hosts ------------------------------------------------------------------- */

static void add_host(host_t **hosts, int *nhosts, const char *name, size_t len, int slots)
{
    /* The same name twice is the same host: its slots add up. */
    for (int i = 0; i < *nhosts; i++) {
        if (strlen((*hosts)[i].name) == len && strncmp((*hosts)[i].name, name, len) == 0) {
            (*hosts)[i].slots = (*hosts)[i].slots > INT_MAX / 2 - slots ? INT_MAX / 2
                                                                        : (*hosts)[i].slots + slots;
            return;
        }
    }
    *hosts = xrealloc(*hosts, (size_t)(*nhosts + 1) * sizeof(host_t));
    host_t *h = &(*hosts)[(*nhosts)++];
    memset(h, 0, sizeof(*h));
    h->name = xrealloc(NULL, len + 1);
    memcpy(h->name, name, len);
    h->name[len] = '\0';
    h->slots = slots;
}

/* A slot count: an integer >= 1. Returns it, or -1. */
static int parse_slots(const char *s, size_t len)
{
    if (len == 0 || len > 9)
        return -1;
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i]))
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v >= 1 ? v : -1;
}

static int is_local_host(const char *name)
{
    if (strchr(name, '@') != NULL)
        return 0;   /* a user to log in as: the user wants ssh */
    if (strcasecmp(name, "localhost") == 0 || strcasecmp(name, "localhost.localdomain") == 0)
        return 1;
    char me[256] = "";
    if (gethostname(me, sizeof(me) - 1) == 0 && me[0] != '\0') {
        size_t mshort = strcspn(me, "."), nshort = strcspn(name, ".");
        if (strcasecmp(name, me) == 0)
            return 1;
        /* "node1" given on node1.cluster, or "node1.cluster" on node1 */
        if ((name[nshort] == '\0' || me[mshort] == '\0') && mshort == nshort &&
            strncasecmp(name, me, mshort) == 0)
            return 1;
    }
    /* An address: loopback, or one of this machine's interfaces. */
    unsigned char a[16];
    int family = inet_pton(AF_INET, name, a) == 1 ? AF_INET
                 : inet_pton(AF_INET6, name, a) == 1 ? AF_INET6 : 0;
    if (family == 0)
        return 0;
    if ((family == AF_INET && a[0] == 127) ||
        (family == AF_INET6 && IN6_IS_ADDR_LOOPBACK((struct in6_addr *)a)))
        return 1;
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0)
        return 0;
    int found = 0;
    for (struct ifaddrs *i = ifs; i != NULL && !found; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != family)
            continue;
        if (family == AF_INET)
            found = memcmp(&((struct sockaddr_in *)i->ifa_addr)->sin_addr, a, 4) == 0;
        else
            found = memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, a, 16) == 0;
    }
    freeifaddrs(ifs);
    return found;
}

/* The address of this machine that routes to host: connecting a UDP socket
 * sends nothing but makes the kernel choose the source address. */
static int route_addr(const char *host, char *out, size_t outlen)
{
    const char *at = strrchr(host, '@');
    if (at != NULL)
        host = at + 1;
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM,
                              .ai_flags = AI_NUMERICSERV };
    struct addrinfo *res;
    if (getaddrinfo(host, "22", &hints, &res) != 0)
        return -1;
    int ok = -1;
    for (struct addrinfo *ai = res; ai != NULL && ok != 0; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
            getnameinfo((struct sockaddr *)&ss, sl, out, (socklen_t)outlen, NULL, 0,
                        NI_NUMERICHOST) == 0)
            ok = 0;
        close(fd);
    }
    freeaddrinfo(res);
    return ok;
}

/* A non-loopback address this machine's name resolves to. */
static int own_addr(char *out, size_t outlen)
{
    char me[256] = "";
    if (gethostname(me, sizeof(me) - 1) != 0 || me[0] == '\0')
        return -1;
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
    struct addrinfo *res;
    if (getaddrinfo(me, NULL, &hints, &res) != 0)
        return -1;
    int ok = -1;
    for (struct addrinfo *ai = res; ai != NULL && ok != 0; ai = ai->ai_next) {
        if ((ai->ai_family == AF_INET &&
             ((const unsigned char *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr)[0] == 127) ||
            (ai->ai_family == AF_INET6 &&
             IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr)))
            continue;
        if (getnameinfo(ai->ai_addr, ai->ai_addrlen, out, (socklen_t)outlen, NULL, 0,
                        NI_NUMERICHOST) == 0)
            ok = 0;
    }
    freeaddrinfo(res);
    return ok;
}

static char *store_uri(const char *addr, int port)
{
    char buf[NI_MAXHOST + 32];
    snprintf(buf, sizeof(buf), strchr(addr, ':') ? "tcp://[%s]:%d" : "tcp://%s:%d", addr, port);
    return xstrdup(buf);
}

/* The first node of a Slurm node list: "gpu[03-08,11],cpu1" -> "gpu03". */
static void first_slurm_node(const char *list, char *out, size_t outlen)
{
    size_t n = strcspn(list, ",[");
    size_t k = 0;
    if (list[n] == '[')
        k = strcspn(list + n + 1, "-,]");
    if (n + k >= outlen) {
        out[0] = '\0';
        return;
    }
    memcpy(out, list, n);
    memcpy(out + n, list + n + 1, k);   /* nothing copied when k == 0 */
    out[n + k] = '\0';
}

/* ---- starting ranks ---------------------------------------------------------- */

/* Runs in the forked child. The store server thread of the parent may have
 * held any lock at fork, so nothing here allocates: argv and the environment
 * were built before the fork, and the error text is written piece by piece.
 * in_fd >= 0 becomes stdin; else stdin stays loomrun's if keep_stdin (and it
 * is not a terminal), /dev/null otherwise. out_w/err_w < 0 keep loomrun's. */
static void exec_child(int in_fd, int keep_stdin, int out_w, int err_w, const char *dir,
                       char *const argv[], char *const envp[], pid_t parent)
{
    /* Own process group: the terminal's Ctrl-C reaches loomrun only, which
     * forwards it once, and kill(-pgid) also reaches the rank's children. */
    setpgid(0, 0);
#ifdef __linux__
    /* If loomrun is killed outright (SIGKILL), do not leave the rank running;
     * for an ssh client, its end takes the remote rank with it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(1);
#else
    (void)parent;
#endif
    for (int i = 0; i < NFWD; i++)
        sigaction(g_fwd_signals[i], &g_orig_act[i], NULL);
    sigaction(SIGCHLD, &g_orig_chld, NULL);
    sigaction(SIGPIPE, &g_orig_pipe, NULL);   /* SIG_IGN would survive exec */

    if ((out_w >= 0 && dup2(out_w, STDOUT_FILENO) < 0) ||
        (err_w >= 0 && dup2(err_w, STDERR_FILENO) < 0))
        _exit(127);
    if (in_fd >= 0) {
        if (dup2(in_fd, STDIN_FILENO) < 0)
            _exit(127);
    } else if (!keep_stdin || isatty(STDIN_FILENO)) {
        /* Rank 0 may read loomrun's stdin (`cat data | loomrun ...`), but not
         * a terminal: from its own process group a read would stop it with
         * SIGTTIN. */
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0 && nul != STDIN_FILENO) {
            dup2(nul, STDIN_FILENO);
            close(nul);
        }
    }
    const char *what = "execute ", *name = argv[0];
    int e = 0;
    if (dir != NULL && chdir(dir) != 0) {
        e = errno;
        what = "change to directory ";
        name = dir;
    }
#if defined(__linux__) && defined(CLOSE_RANGE_CLOEXEC)
    /* Every fd of ours is O_CLOEXEC already; this also covers any the library
     * (store server sockets) might have opened without it. */
    close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
#endif
    sigprocmask(SIG_SETMASK, &g_orig_mask, NULL);

    if (e == 0) {
        execvpe(argv[0], argv, envp);
        e = errno;
    }
    const char *parts[] = { "loomrun: cannot ", what, name, ": ", strerror(e), "\n" };
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        ssize_t r = write(STDERR_FILENO, parts[i], strlen(parts[i]));
        (void)r;
    }
    /* The shell's convention: 127 not found, 126 found but not runnable. */
    _exit(e == ENOENT || e == ENOTDIR ? 127 : 126);
}

static int open_stream(stream_t *s, int rank, int dest, int *write_end)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return -1;
    /* Non-blocking read end so a drain stops at "empty"; the rank's write end
     * stays blocking. */
    fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
    s->fd = p[0];
    s->dest = dest;
    s->rank = rank;
    snprintf(s->prefix, sizeof(s->prefix), "[%d]<%s>: ", rank,
             dest == STDOUT_FILENO ? "stdout" : "stderr");
    if (!g_tag)
        s->prefix[0] = '\0';
    s->prefix_len = strlen(s->prefix);
    s->line = NULL;
    s->len = s->cap = 0;
    *write_end = p[1];
    return 0;
}

/* Fork rank r running argv. Its output is tagged unless it is srun (whose
 * output is the job's, already labelled as the user asked srun to). */
static int start_rank(int r, char *const argv[], char *const envp[], const char *dir)
{
    rank_t *rk = &g_ranks[r];
    int out_w = -1, err_w = -1, ctl[2] = { -1, -1 };

    if (rk->kind != RANK_SRUN) {
        if (open_stream(&rk->out, r, STDOUT_FILENO, &out_w) < 0)
            return -1;
        if (open_stream(&rk->err, r, STDERR_FILENO, &err_w) < 0) {
            close(out_w);
            close_stream(&rk->out);
            return -1;
        }
    }
    if (rk->kind == RANK_SSH) {
        if (pipe2(ctl, O_CLOEXEC) < 0) {
            close(out_w);
            close(err_w);
            close_stream(&rk->out);
            close_stream(&rk->err);
            return -1;
        }
        /* A wedged ssh must never block loomrun's loop. */
        fcntl(ctl[1], F_SETFL, fcntl(ctl[1], F_GETFL) | O_NONBLOCK);
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0)
        exec_child(ctl[0], r == 0 || rk->kind == RANK_SRUN, out_w, err_w, dir, argv, envp,
                   parent);
    int saved = errno;
    if (out_w >= 0)
        close(out_w);
    if (err_w >= 0)
        close(err_w);
    if (ctl[0] >= 0)
        close(ctl[0]);
    if (pid < 0) {
        if (ctl[1] >= 0)
            close(ctl[1]);
        close_stream(&rk->out);
        close_stream(&rk->err);
        errno = saved;
        return -1;
    }
    /* Also set the group here: whichever of parent and child runs first, the
     * group exists before loomrun may signal it. */
    setpgid(pid, pid);
    rk->pid = pid;
    rk->ctl = ctl[1];
    rk->running = 1;
    g_nrunning++;
    return 0;
}

/* The command a remote rank's ssh runs there, in the login shell (sh syntax):
 *
 *  - fd 3 keeps ssh's stdin for the watcher; the program gets /dev/null.
 *  - The watcher, in the background, turns each line loomrun writes ("TERM")
 *    into that signal for the whole process group (sshd made the shell a
 *    session and group leader, so the group is the rank and its children),
 *    and at EOF, that is when loomrun or its ssh client went away, sends
 *    SIGTERM and, if the rank is still there after the grace time, SIGKILL.
 *  - The shell traps those signals (a trap, unlike ignoring, is undone for
 *    the program by exec) so that it outlives the program and passes on its
 *    status: 128+N for a death by signal N. ssh itself would report 255 for
 *    a shell killed by a signal, the same as for a failed connection.
 *  - The shell's own stderr goes to /dev/null once the program is set up,
 *    so "Terminated" from bash for the program it waited for does not read
 *    as the rank's output.
 *  - MARKER tells loomrun that the host answered and the program starts. */
/* Settings whose values are secrets. A command line is no place for them (ps
 * shows it to every user of both hosts): a remote rank's shell reads them from
 * ssh's standard input before anything else, one line each. */
static const char *const secret_vars[] = { "LOOM_AUTH_KEY", "LOOM_REDIS_PASSWORD" };

/* The length of the name of secret setting kv ("NAME=value"), or 0. */
static size_t secret_name_len(const char *kv)
{
    for (size_t i = 0; i < sizeof(secret_vars) / sizeof(secret_vars[0]); i++) {
        size_t n = strlen(secret_vars[i]);
        if (strncmp(kv, secret_vars[i], n) == 0 && kv[n] == '=')
            return n;
    }
    return 0;
}

/* remote_script below, with xenv: the variables the rank gets. Secrets among
 * them are read from stdin, whose first lines loomrun writes into *secrets. */
static void remote_script(strbuf_t *b, const char *wdir, int store_port, const host_t *h,
                          const envv_t *xenv, strbuf_t *secrets)
{
    char line[160];
    sb_str(b, "cd -- ");
    sb_quote(b, wdir);
    sb_str(b, " || exit 127\n");
    for (size_t i = 0; i < xenv->n; i++) {
        size_t n = secret_name_len(xenv->v[i]);
        if (n == 0)
            continue;
        const char *val = xenv->v[i] + n + 1;
        if (strchr(val, '\n') != NULL)
            fatal("%.*s holds a newline, which cannot be passed to a remote rank; put the "
                  "secret in a file readable only by you and set %.*s_FILE instead", (int)n,
                  xenv->v[i], (int)n, xenv->v[i]);
        sb_str(b, "IFS= read -r ");
        sb_add(b, xenv->v[i], n);
        sb_str(b, " || exit 127\nexport ");
        sb_add(b, xenv->v[i], n);
        sb_str(b, "\n");
        sb_str(secrets, val);
        sb_str(secrets, "\n");
    }
    sb_str(b, "exec 3<&0 </dev/null\n"
              "trap : INT TERM HUP\n"
              "{ trap '' INT TERM HUP\n"
              "  while read -r s <&3; do kill -s \"$s\" 0; done\n"
              "  kill -s TERM 0\n");
    snprintf(line, sizeof(line), "  if kill -0 $$; then sleep %d; kill -s KILL 0; fi\n",
             GRACE_MS / 1000);
    sb_str(b, line);
    sb_str(b, "} >/dev/null 2>&1 &\n"
              "exec 3<&- 4>&2 2>/dev/null\n");
    if (h->store == NULL) {
        /* No route from here to the host's name (an ssh alias?): the address
         * the host sees this machine's connection come from will do. */
        sb_str(b, "a=${SSH_CLIENT%% *}\n"
                  "case $a in *:*) a=\"[$a]\";; esac\n");
    }
    sb_str(b, "echo '" MARKER "'\n");
    sb_str(b, "env");
    if (h->store == NULL) {
        snprintf(line, sizeof(line), " \"LOOM_STORE=tcp://$a:%d\"", store_port);
        sb_str(b, line);
    }
    for (size_t i = 0; i < xenv->n; i++) {
        if (secret_name_len(xenv->v[i]) > 0)
            continue;
        sb_add(b, " ", 1);
        sb_quote(b, xenv->v[i]);
    }
}

/* Hand a remote rank its secrets: the first lines of its ssh's stdin. */
static void send_secrets(rank_t *rk, const strbuf_t *secrets)
{
    if (secrets->len == 0)
        return;
    /* Far below a pipe's capacity, so the non-blocking write takes it whole. */
    if (write(rk->ctl, secrets->p, secrets->len) != (ssize_t)secrets->len)
        fatal("cannot pass the secrets to a remote rank: %s", strerror(errno));
}

/* ---- command line ------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
        "Usage: loomrun [-np N] [-H HOSTS | --hostfile FILE] [options] prog [args...]\n"
        "\n"
        "Start N ranks of prog: forked on this machine, through ssh on other hosts,\n"
        "or through srun inside a Slurm allocation. loomrun serves the ranks'\n"
        "rendezvous store and tags their output with the rank.\n"
        "\n"
        "Where the ranks run:\n"
        "  -np N, -n N       number of ranks (default: the hosts' slots, or SLURM_NTASKS)\n"
        "  -H, --host HOSTS  host1:slots,host2:slots (slots default to 1); ranks fill\n"
        "                    the hosts in order. localhost, 127.0.0.1, this machine's\n"
        "                    name and addresses fork here, other hosts go through ssh\n"
        "  --hostfile FILE   one host per line as \"host slots=N\"; # starts a comment\n"
        "  --ssh-port P      port of the remote hosts' sshd\n"
        "  --ssh-identity-file FILE  private key for ssh (ssh -i)\n"
        "  --wdir DIR        directory the ranks run in (default: the current one,\n"
        "                    on remote hosts too)\n"
        "Without -H and --hostfile, inside a Slurm allocation (SLURM_JOB_ID set) the\n"
        "job is `srun --ntasks=N --kill-on-bad-exit=1 prog args`, elsewhere N local\n"
        "ranks (-H localhost:N forces that inside an allocation too).\n"
        "\n"
        "Options:\n"
        "  -x VAR=value      set VAR in the ranks' environment\n"
        "  -x VAR            pass loomrun's value of VAR (local ranks inherit loomrun's\n"
        "                    whole environment; remote ones get -x variables and LOOM_*)\n"
        "  --timeout S       seconds a Loom call may wait (LOOM_TIMEOUT for the ranks);\n"
        "                    also the time a host has to answer (default: LOOM_TIMEOUT,\n"
        "                    else %.0f)\n"
        "  --output-filename DIR  also write rank N's stdout and stderr to\n"
        "                    DIR/rank.N/stdout and DIR/rank.N/stderr (under srun,\n"
        "                    srun writes them instead of the console)\n"
        "  --tag-output      prefix every line with \"[R]<stdout>: \" or \"[R]<stderr>: \"\n"
        "                    (the default)\n"
        "  --no-tag-output   print the ranks' lines as they wrote them, for tools that\n"
        "                    read the output by position (nccl-tests parsers)\n"
        "Elastic jobs (ranks may die, leave and join while the job runs):\n"
        "  --elastic         membership changes rebuild the job instead of ending it:\n"
        "                    ranks get LOOM_ELASTIC=1 and LOOM_ELASTIC_ID\n"
        "  --min-np A        fewest ranks the job may run with (default 1)\n"
        "  --max-np B        most ranks (default: -np, else no limit)\n"
        "  --host-discovery-script S  prints the usable hosts, one \"host[:slots]\" a\n"
        "                    line; run every --discovery-interval seconds (default 1)\n"
        "  --slots-per-host K  slots of a host the script lists without a count\n"
        "  --elastic-timeout T  seconds a rebuild waits for missing ranks, and the job\n"
        "                    may stay below --min-np (default: --timeout or 600)\n"
        "  --reset-limit L   fail the job after L membership changes\n"
        "  --blacklist-failures F  rank failures after which a host is not used\n"
        "                    for --blacklist-cooldown C seconds (defaults 1 and 60)\n"
        "  -h, --help        show this help and exit\n"
        "  --version         show the version and exit\n"
        "  --                end of options (for a program whose name starts with '-')\n"
        "\n"
        "Each rank gets LOOM_RANK, LOOM_SIZE, LOOM_LOCAL_RANK, LOOM_LOCAL_SIZE (its\n"
        "place among the ranks on its host), LOOM_STORE (tcp://ADDR:PORT, served by\n"
        "loomrun on 127.0.0.1, or on all interfaces when a host is remote) and\n"
        "LOOM_JOB_ID; with -H or --hostfile also LOOM_HOST_ID=the host as given, so\n"
        "-H localhost:2,127.0.0.1:2 acts out two nodes on this machine. Under srun,\n"
        "srun numbers the ranks (SLURM_PROCID...). Outside srun and --elastic, Horovod's\n"
        "HOROVOD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _CROSS_RANK, _CROSS_SIZE and\n"
        "_HOSTNAME are set too.\n"
        "Every output line is prefixed with \"[R]<stdout>: \" or \"[R]<stderr>: \" unless\n"
        "--no-tag-output is given (whole lines are never mixed either way).\n"
        "SIGINT, SIGTERM and SIGHUP are forwarded to all ranks, remote ones included;\n"
        "a remote rank also ends when its ssh connection does. When a rank exits\n"
        "non-zero or is killed, the others get SIGTERM and %d s later SIGKILL, and\n"
        "loomrun names the rank and its host and exits with that rank's code (128+N\n"
        "for signal N). A host ssh cannot reach ends the job with code 255.\n",
        DEFAULT_ANSWER_S, GRACE_MS / 1000);
}

static void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("loomrun: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\nTry 'loomrun --help' for more information.\n", stderr);
    va_end(ap);
    exit(EXIT_USAGE);
}

typedef struct options {
    int np;
    const char *timeout;       /* as given */
    double timeout_s;          /* 0: not given */
    const char **xvars;        /* "VAR" or "VAR=value", as given */
    int nx;
    const char *hostlist;      /* -H, as given (several are joined) */
    const char *hostfile;
    const char *ssh_port;
    const char *ssh_identity;
    const char *wdir;
    const char *output_dir;
    host_t *hosts;
    int nhosts;
    char **argv;               /* the program and its arguments */
    /* --elastic (see elastic_main) */
    int elastic;
    int min_np, max_np;        /* 0: not given */
    const char *discovery;     /* --host-discovery-script */
    int slots_per_host;        /* 0: not given */
    double elastic_timeout_s;  /* 0: not given */
    const char *elastic_timeout;
    int reset_limit;           /* -1: none */
    double blacklist_cooldown_s;
    int blacklist_failures;
    double discovery_interval_s;
} options_t;

/* The value of an option: "--opt=value" or the next argument. */
static const char *opt_value(int argc, char **argv, int *i, const char *name, const char *eq)
{
    if (eq != NULL)
        return eq + 1;
    if (*i + 1 >= argc)
        usage_error("option %s needs a value", name);
    return argv[++*i];
}

static void parse_hostlist(options_t *o, const char *list)
{
    const char *p = list;
    for (;;) {
        size_t n = strcspn(p, ",");
        const char *name = p, *slots = NULL;
        size_t nlen = n;
        if (n > 0 && p[0] == '[') {
            /* [IPv6]:slots */
            const char *close = memchr(p, ']', n);
            if (close == NULL)
                usage_error("-H: '%.*s' has '[' without ']'", (int)n, p);
            name = p + 1;
            nlen = (size_t)(close - name);
            if (close + 1 < p + n) {
                if (close[1] != ':')
                    usage_error("-H: '%.*s' is not [address]:slots", (int)n, p);
                slots = close + 2;
            }
        } else {
            const char *colon = memchr(p, ':', n);
            /* Two colons without brackets: a bare IPv6 address, one slot. */
            if (colon != NULL && memchr(colon + 1, ':', (size_t)(p + n - colon - 1)) == NULL) {
                nlen = (size_t)(colon - p);
                slots = colon + 1;
            }
        }
        int s = 1;
        if (slots != NULL && (s = parse_slots(slots, (size_t)(p + n - slots))) < 0)
            usage_error("-H: '%.*s': the slots are not an integer >= 1", (int)n, p);
        if (nlen == 0)
            usage_error("-H: '%s' has an empty host name", list);
        add_host(&o->hosts, &o->nhosts, name, nlen, s);
        if (p[n] == '\0')
            break;
        p += n + 1;
    }
}

/* Open MPI's and Horovod's format: "host [slots=N] [max_slots=M]" per line;
 * '#' starts a comment. max_slots is accepted and ignored (we never
 * oversubscribe). */
static void parse_hostfile(options_t *o, const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        usage_error("--hostfile %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0;
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        line[strcspn(line, "#\r\n")] = '\0';
        char *save = NULL, *host = strtok_r(line, " \t", &save);
        if (host == NULL)
            continue;
        int slots = 1;
        for (char *tok; (tok = strtok_r(NULL, " \t", &save)) != NULL;) {
            if (strncmp(tok, "slots=", 6) == 0) {
                if ((slots = parse_slots(tok + 6, strlen(tok + 6))) < 0)
                    usage_error("%s:%d: '%s': the slots are not an integer >= 1", path, lineno,
                                tok);
            } else if (strncmp(tok, "max_slots=", 10) != 0 && strncmp(tok, "max-slots=", 10) != 0) {
                usage_error("%s:%d: unexpected '%s' (the format is \"host slots=N\")", path,
                            lineno, tok);
            }
        }
        add_host(&o->hosts, &o->nhosts, host, strlen(host), slots);
    }
    free(line);
    fclose(f);
    if (o->nhosts == 0)
        usage_error("--hostfile %s names no host", path);
}

static int is_var_name(const char *s, size_t n)
{
    if (n == 0 || isdigit((unsigned char)s[0]))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_')
            return 0;
    return 1;
}

static void parse_args(int argc, char **argv, options_t *o)
{
    memset(o, 0, sizeof(*o));
    o->reset_limit = -1;
    o->xvars = xrealloc(NULL, (size_t)argc * sizeof(char *));
    strbuf_t hostlist = { 0 };
    int i;
    for (i = 1; i < argc; i++) {
        char *a = argv[i];
        if (a[0] != '-')
            break;   /* the program: everything after belongs to it */
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        /* Long options accept "--opt=value" too. */
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        size_t nlen = eq != NULL ? (size_t)(eq - a) : strlen(a);
#define IS_LONG(s) (nlen == sizeof(s) - 1 && strncmp(a, s, nlen) == 0)

        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--version") == 0) {
            printf("loomrun (Loom) %d.%d.%d\n", LOOM_VERSION_MAJOR, LOOM_VERSION_MINOR,
                   LOOM_VERSION_PATCH);
            exit(0);
        } else if (strcmp(a, "-np") == 0 || strcmp(a, "-n") == 0 || IS_LONG("--np")) {
            const char *v = opt_value(argc, argv, &i, "-np", eq);
            char *end;
            errno = 0;
            long n = strtol(v, &end, 10);
            if (end == v || *end != '\0' || errno != 0 || n < 1 || n > INT_MAX / 2)
                usage_error("-np: '%s' is not a rank count (an integer >= 1)", v);
            o->np = (int)n;
        } else if (strcmp(a, "-H") == 0 || IS_LONG("--host") || IS_LONG("--hosts")) {
            const char *v = opt_value(argc, argv, &i, "-H", eq);
            if (v[0] == '\0')
                usage_error("-H: no hosts given");
            if (hostlist.len > 0)
                sb_add(&hostlist, ",", 1);
            sb_str(&hostlist, v);
        } else if (IS_LONG("--hostfile")) {
            o->hostfile = opt_value(argc, argv, &i, "--hostfile", eq);
        } else if (IS_LONG("--ssh-port")) {
            const char *v = opt_value(argc, argv, &i, "--ssh-port", eq);
            int p = parse_slots(v, strlen(v));
            if (p < 1 || p > 65535)
                usage_error("--ssh-port: '%s' is not a port (1-65535)", v);
            o->ssh_port = v;
        } else if (IS_LONG("--ssh-identity-file")) {
            o->ssh_identity = opt_value(argc, argv, &i, "--ssh-identity-file", eq);
            if (o->ssh_identity[0] == '\0')
                usage_error("--ssh-identity-file: empty file name");
        } else if (IS_LONG("--wdir") || strcmp(a, "-wdir") == 0) {
            o->wdir = opt_value(argc, argv, &i, "--wdir", eq);
            if (o->wdir[0] == '\0')
                usage_error("--wdir: empty directory name");
        } else if (IS_LONG("--tag-output") || IS_LONG("--no-tag-output")) {
            if (eq)
                usage_error("%.*s takes no value", (int)nlen, a);
            g_tag = IS_LONG("--tag-output");
        } else if (IS_LONG("--output-filename")) {
            o->output_dir = opt_value(argc, argv, &i, "--output-filename", eq);
            if (o->output_dir[0] == '\0')
                usage_error("--output-filename: empty directory name");
        } else if (strcmp(a, "-x") == 0) {
            const char *v = opt_value(argc, argv, &i, "-x", NULL);
            if (!is_var_name(v, strcspn(v, "=")))
                usage_error("-x: '%s' does not start with a variable name", v);
            o->xvars[o->nx++] = v;
        } else if (IS_LONG("--timeout")) {
            const char *v = opt_value(argc, argv, &i, "--timeout", eq);
            char *end;
            double t = strtod(v, &end);
            if (end == v || *end != '\0' || !(t > 0) || t > 1e7)
                usage_error("--timeout: '%s' is not a positive number of seconds", v);
            o->timeout = v;
            o->timeout_s = t;
        } else if (IS_LONG("--elastic")) {
            if (eq != NULL)
                usage_error("--elastic takes no value");
            o->elastic = 1;
        } else if (IS_LONG("--min-np") || IS_LONG("--max-np") || IS_LONG("--slots-per-host") ||
                   IS_LONG("--reset-limit") || IS_LONG("--blacklist-failures")) {
            char name[32];
            snprintf(name, sizeof(name), "%.*s", (int)nlen, a);
            const char *v = opt_value(argc, argv, &i, name, eq);
            int n = parse_slots(v, strlen(v));
            if (strcmp(name, "--reset-limit") == 0 && strcmp(v, "0") == 0)
                n = 0;
            if (n < 0)
                usage_error("%s: '%s' is not a count (an integer >= 1)", name, v);
            if (strcmp(name, "--min-np") == 0)
                o->min_np = n;
            else if (strcmp(name, "--max-np") == 0)
                o->max_np = n;
            else if (strcmp(name, "--slots-per-host") == 0)
                o->slots_per_host = n;
            else if (strcmp(name, "--reset-limit") == 0)
                o->reset_limit = n;
            else
                o->blacklist_failures = n;
        } else if (IS_LONG("--host-discovery-script")) {
            o->discovery = opt_value(argc, argv, &i, "--host-discovery-script", eq);
            if (o->discovery[0] == '\0')
                usage_error("--host-discovery-script: empty command");
        } else if (IS_LONG("--elastic-timeout") || IS_LONG("--blacklist-cooldown") ||
                   IS_LONG("--discovery-interval")) {
            char name[32];
            snprintf(name, sizeof(name), "%.*s", (int)nlen, a);
            const char *v = opt_value(argc, argv, &i, name, eq);
            char *end;
            double t = strtod(v, &end);
            if (end == v || *end != '\0' || !(t > 0) || t > 1e7)
                usage_error("%s: '%s' is not a positive number of seconds", name, v);
            if (strcmp(name, "--elastic-timeout") == 0) {
                o->elastic_timeout_s = t;
                o->elastic_timeout = v;
            } else if (strcmp(name, "--blacklist-cooldown") == 0) {
                o->blacklist_cooldown_s = t;
            } else {
                o->discovery_interval_s = t;
            }
        } else {
            usage_error("unknown option '%s'", a);
        }
#undef IS_LONG
    }
    if (i >= argc)
        usage_error("no program to run");
    if (!o->elastic && (o->min_np || o->max_np || o->discovery || o->slots_per_host ||
                        o->elastic_timeout_s > 0 || o->reset_limit >= 0 ||
                        o->blacklist_cooldown_s > 0 || o->blacklist_failures ||
                        o->discovery_interval_s > 0))
        usage_error("--min-np, --max-np, --host-discovery-script, --slots-per-host, "
                    "--elastic-timeout, --reset-limit and the blacklist options need --elastic");
    if (o->elastic && o->min_np && o->max_np && o->min_np > o->max_np)
        usage_error("--min-np %d is more than --max-np %d", o->min_np, o->max_np);
    if (hostlist.len > 0 && o->hostfile != NULL)
        usage_error("-H and --hostfile: give the hosts one way");
    if (hostlist.len > 0)
        parse_hostlist(o, hostlist.p);
    else if (o->hostfile != NULL)
        parse_hostfile(o, o->hostfile);
    sb_free(&hostlist);
    o->argv = argv + i;
}

/* mkdir -p, for --output-filename. */
static int make_dirs(const char *path)
{
    char *p = xstrdup(path);
    int rc = 0;
    for (char *s = p + 1; rc == 0; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            rc = -1;
        *s = c;
        if (c == '\0')
            break;
    }
    free(p);
    return rc;
}

static int open_output_file(const char *dir, int rank, const char *which)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/rank.%d", dir, rank);
    if (make_dirs(path) != 0)
        fatal("--output-filename: cannot create %s: %s", path, strerror(errno));
    if (which == NULL)
        return -1;
    snprintf(path, sizeof(path), "%s/rank.%d/%s", dir, rank, which);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        fatal("--output-filename: cannot create %s: %s", path, strerror(errno));
    return fd;
}

/* ---- the job ----------------------------------------------------------------- */

/* If rank r has exited, fill *si and return 1, leaving it a zombie (see
 * kill_all). */
static int rank_exited(int r, siginfo_t *si)
{
    memset(si, 0, sizeof(*si));
    while (waitid(P_PID, (id_t)g_ranks[r].pid, si, WEXITED | WNOHANG | WNOWAIT) < 0) {
        if (errno != EINTR)
            fatal("waitid: %s", strerror(errno));
    }
    return si->si_pid == g_ranks[r].pid;
}

/* Say how rank r failed, in one line, and return loomrun's exit code for it. */
static int report(int r, const siginfo_t *si)
{
    rank_t *rk = &g_ranks[r];
    const char *host = g_hosts[rk->host].name;
    int code = si->si_code == CLD_EXITED ? si->si_status : 128 + si->si_status;

    if (rk->kind == RANK_SRUN) {
        if (si->si_code == CLD_EXITED)
            fprintf(stderr, "loomrun: srun exited with code %d\n", code);
        else
            fprintf(stderr, "loomrun: srun was killed by signal %s (%d)\n",
                    signal_name(si->si_status), si->si_status);
        return code;
    }
    if (si->si_code != CLD_EXITED) {
        if (rk->kind == RANK_SSH)
            fprintf(stderr, "loomrun: rank %d on host %s: its ssh client was killed by signal "
                    "%s (%d)\n", r, host, signal_name(si->si_status), si->si_status);
        else
            fprintf(stderr, "loomrun: rank %d on host %s was killed by signal %s (%d)\n", r,
                    host, signal_name(si->si_status), si->si_status);
        return code;
    }
    if (rk->kind == RANK_SSH && !rk->started) {
        if (code == EXIT_UNREACHABLE) {
            const char *why = last_held_line(rk);
            fprintf(stderr, "loomrun: cannot reach host %s: %s\n", host,
                    why != NULL ? why : "ssh exited with code 255");
            return code;
        }
        flush_held(rk);   /* the remote shell's complaint, e.g. about --wdir */
    }
    /* A remote shell reports a death by signal N as 128+N, like any shell;
     * a program that exits with such a code on purpose reads the same. */
    if (rk->kind == RANK_SSH && rk->started && code > 128 && code < 128 + 32 &&
        strcmp(signal_name(code - 128), "unknown signal") != 0)
        fprintf(stderr, "loomrun: rank %d on host %s was killed by signal %s (%d)\n", r, host,
                signal_name(code - 128), code - 128);
    else if (rk->kind == RANK_SSH && code == EXIT_UNREACHABLE)
        fprintf(stderr, "loomrun: rank %d on host %s exited with code 255 (or its ssh "
                "connection failed)\n", r, host);
    else
        fprintf(stderr, "loomrun: rank %d on host %s exited with code %d\n", r, host, code);
    return code;
}

static char *format_int(int v)
{
    char buf[24];
    snprintf(buf, sizeof(buf), "%d", v);
    return xstrdup(buf);
}

/* The variables Horovod's launchers set, so that Horovod scripts (and its
 * tests) reading them agree with what loom_init reports. Horovod's cross rank
 * numbers the hosts that have a rank with this local rank. */
static void env_set_horovod(envv_t *e, int rank, int size, int lrank, int host)
{
    int cross_rank = 0, cross_size = 0;
    for (int h = 0; h < g_nhosts; h++)
        if (g_hosts[h].nranks > lrank) {
            cross_rank += h < host;
            cross_size++;
        }
    const struct { const char *name; int value; } v[] = {
        { "HOROVOD_RANK", rank }, { "HOROVOD_SIZE", size }, { "HOROVOD_LOCAL_RANK", lrank },
        { "HOROVOD_LOCAL_SIZE", g_hosts[host].nranks }, { "HOROVOD_CROSS_RANK", cross_rank },
        { "HOROVOD_CROSS_SIZE", cross_size },
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        char *s = format_int(v[i].value);
        env_set(e, v[i].name, s);
        free(s);
    }
    env_set(e, "HOROVOD_HOSTNAME", g_hosts[host].name);
}

/* ---- elastic jobs ---------------------------------------------------------------
 *
 * loomrun --elastic keeps the job alive across membership changes. It serves
 * the store (so the store outlives any rank), starts processes with
 * LOOM_ELASTIC=1 and a fresh LOOM_ELASTIC_ID each, and the library forms and
 * re-forms the communicator through membership rounds in that store (see
 * src/elastic.c). loomrun's part:
 *  - when a process exits, it marks loom/<job>/elastic/dead/<id> in the store,
 *    so the survivors' next round does not wait for it;
 *  - a failure (non-zero exit, signal) counts against its host: after
 *    --blacklist-failures of them the host is not used for
 *    --blacklist-cooldown seconds;
 *  - every --discovery-interval it runs the discovery script: ranks of hosts
 *    that left get SIGTERM (then SIGKILL), and free slots of present hosts get
 *    new processes, which join at the members' next commit point;
 *  - once a rank exits 0 the job is finishing: nothing new starts, and
 *    loom/<job>/elastic/finished tells waiting newcomers to give up;
 *  - the job fails when it stays below --min-np for --elastic-timeout seconds
 *    or changes membership more than --reset-limit times.
 * The verdict: every member of the last epoch exited 0. */

typedef struct ehost {
    int present;           /* listed by the last discovery */
    int failures;          /* since the last cooldown */
    long long banned_until;
} ehost_t;

typedef struct eproc {
    int removed;           /* asked to leave: its host left */
    long long kill_at;     /* SIGKILL after the SIGTERM, -1: none due */
    int code;              /* exit code once exited, -1 before */
} eproc_t;

static ehost_t *g_eh;
static eproc_t *g_ep;

/* Hosts the discovery script lists now, marked present (added when new). */
static int discover(const options_t *o, int slots_dflt)
{
    for (int h = 0; h < g_nhosts; h++)
        g_eh[h].present = 0;
    if (o->discovery == NULL) {
        for (int h = 0; h < g_nhosts; h++)
            g_eh[h].present = 1;
        return 0;
    }
    fflush(NULL);
    FILE *f = popen(o->discovery, "r");
    if (f == NULL)
        return -1;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        line[strcspn(line, "#\r\n")] = '\0';
        char *p = line + strspn(line, " \t");
        size_t len = strcspn(p, " \t");
        p[len] = '\0';
        if (len == 0)
            continue;
        /* host, host:slots, [v6]:slots, [v6]; a bare v6 address has no slots */
        int slots = slots_dflt;
        char *colon = NULL;
        if (p[0] == '[') {
            char *close = strchr(p, ']');
            if (close == NULL || (close[1] != '\0' && close[1] != ':')) {
                fprintf(stderr, "loomrun: discovery script: '%s' is not [address]:slots; "
                        "host ignored\n", p);
                continue;
            }
            colon = close[1] == ':' ? close + 1 : NULL;
            *close = '\0';
            p++;
        } else if (strchr(p, ':') != NULL && strchr(p, ':') == strrchr(p, ':')) {
            colon = strchr(p, ':');
        }
        if (colon != NULL) {
            if ((slots = parse_slots(colon + 1, strlen(colon + 1))) < 0) {
                fprintf(stderr, "loomrun: discovery script: '%s': the slots are not an integer "
                        ">= 1; host ignored\n", colon + 1);
                continue;
            }
            *colon = '\0';
        }
        int before = g_nhosts, h;
        for (h = 0; h < g_nhosts && strcmp(g_hosts[h].name, p) != 0; h++)
            ;
        if (h == g_nhosts) {
            add_host(&g_hosts, &g_nhosts, p, strlen(p), slots);
            g_eh = xrealloc(g_eh, (size_t)g_nhosts * sizeof(ehost_t));
            memset(&g_eh[before], 0, sizeof(ehost_t));
            g_hosts[h].local = is_local_host(p);
        } else {
            g_hosts[h].slots = slots;
        }
        g_eh[h].present = 1;
        n++;
    }
    int rc = pclose(f);
    if (rc != 0)
        fprintf(stderr, "loomrun: discovery script exited with status %d\n",
                WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc));
    return n;
}

static int running_on(int h)
{
    int n = 0;
    for (int r = 0; r < g_np; r++)
        n += g_ranks[r].running && g_ranks[r].host == h && !g_ep[r].removed;
    return n;
}

static int live_ranks(void)
{
    int n = 0;
    for (int r = 0; r < g_np; r++)
        n += g_ranks[r].running && !g_ep[r].removed;
    return n;
}

/* Start one process on host h; its id is its index in g_ranks. */
static int elastic_start(int h, const options_t *o, envv_t *env, envv_t *xenv, int np0,
                         const char *remote_wdir, int port, double answer_s)
{
    int r = g_np;
    g_ranks = xrealloc(g_ranks, (size_t)(r + 1) * sizeof(rank_t));
    g_ep = xrealloc(g_ep, (size_t)(r + 1) * sizeof(eproc_t));
    rank_t *rk = &g_ranks[r];
    memset(rk, 0, sizeof(*rk));
    rk->host = h;
    rk->kind = g_hosts[h].local ? RANK_LOCAL : RANK_SSH;
    rk->out.fd = rk->err.fd = rk->out.file = rk->err.file = rk->ctl = -1;
    rk->answer_by = -1;
    g_ep[r] = (eproc_t){ 0, -1, -1 };
    g_np++;
    char *id_s = format_int(r), *rank_s = format_int(r % np0);
    envv_t *e = rk->kind == RANK_LOCAL ? env : xenv;
    env_set(e, "LOOM_ELASTIC_ID", id_s);
    env_set(e, "LOOM_RANK", rank_s);
    env_set(e, "LOOM_HOST_ID", g_hosts[h].name);
    if (g_hosts[h].store != NULL)
        env_set(e, "LOOM_STORE", g_hosts[h].store);
    else
        env_unset(e, "LOOM_STORE");
    free(id_s);
    free(rank_s);
    sigset_t block, old;
    sigfillset(&block);
    sigprocmask(SIG_BLOCK, &block, &old);
    int rc;
    if (rk->kind == RANK_LOCAL) {
        rc = start_rank(r, o->argv, env->v, o->wdir);
    } else {
        strbuf_t script = { 0 }, secrets = { 0 };
        remote_script(&script, remote_wdir, port, &g_hosts[h], xenv, &secrets);
        for (char **p = o->argv; *p != NULL; p++) {
            sb_add(&script, " ", 1);
            sb_quote(&script, *p);
        }
        sb_str(&script, " 2>&4 4>&-\nexit $?\n");
        char timeout_opt[64];
        snprintf(timeout_opt, sizeof(timeout_opt), "ConnectTimeout=%d", (int)answer_s + 1);
        char *sargv[24];
        int k = 0;
        sargv[k++] = "ssh";
        sargv[k++] = "-o";
        sargv[k++] = "BatchMode=yes";
        sargv[k++] = "-o";
        sargv[k++] = "StrictHostKeyChecking=accept-new";
        sargv[k++] = "-o";
        sargv[k++] = timeout_opt;
        sargv[k++] = "-o";
        sargv[k++] = "LogLevel=ERROR";
        if (o->ssh_port != NULL) {
            sargv[k++] = "-p";
            sargv[k++] = (char *)o->ssh_port;
        }
        if (o->ssh_identity != NULL) {
            sargv[k++] = "-i";
            sargv[k++] = (char *)o->ssh_identity;
        }
        sargv[k++] = "--";
        sargv[k++] = g_hosts[h].name;
        sargv[k++] = script.p;
        sargv[k] = NULL;
        rc = start_rank(r, sargv, env->v, NULL);
        if (rc == 0)
            send_secrets(rk, &secrets);
        rk->answer_by = now_ms() + (long long)(answer_s * 1000);
        sb_free(&script);
        sb_free(&secrets);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (rc < 0) {
        fprintf(stderr, "loomrun: cannot start a rank on %s: %s\n", g_hosts[h].name,
                strerror(errno));
        g_np--;
        return -1;
    }
    g_hosts[h].nranks++;
    return 0;
}

/* Start processes on free, usable slots until the job has want live ranks. */
static int fill_slots(int want, const options_t *o, envv_t *env, envv_t *xenv, int np0,
                      const char *remote_wdir, int port, double answer_s)
{
    int started = 0;
    long long now = now_ms();
    for (int h = 0; h < g_nhosts && live_ranks() < want; h++) {
        if (!g_eh[h].present)
            continue;
        if (g_eh[h].banned_until > now)
            continue;
        if (g_eh[h].banned_until > 0) {
            fprintf(stderr, "loomrun: host %s leaves the blacklist\n", g_hosts[h].name);
            g_eh[h].banned_until = 0;
            g_eh[h].failures = 0;
        }
        while (running_on(h) < g_hosts[h].slots && live_ranks() < want) {
            if (elastic_start(h, o, env, xenv, np0, remote_wdir, port, answer_s) < 0)
                break;
            started++;
        }
    }
    return started;
}

/* ids of the last epoch's members, from the store; -1 when there is none. */
static int final_members(loom_store_t *st, const char *base, long long **ids_p)
{
    char key[300];
    void *val = NULL;
    size_t len;
    loom_err_t err;
    loom_err_clear(&err);
    snprintf(key, sizeof(key), "%s/epoch", base);
    const char *k = key;
    if (loom_store_wait(st, &k, 1, 0.0, &err) != LOOM_SUCCESS ||
        loom_store_get(st, key, &val, &len, 1.0, &err) != LOOM_SUCCESS)
        return -1;
    unsigned long long epoch = strtoull(val, NULL, 10);
    free(val);
    snprintf(key, sizeof(key), "%s/e%llu/members", base, epoch);
    if (loom_store_get_signed(st, key, &val, &len, 1.0, &err) != LOOM_SUCCESS)
        return -1;
    int n = 0;
    long long *ids = NULL;
    for (char *p = val; p != NULL && *p != '\0';) {
        ids = xrealloc(ids, (size_t)(n + 1) * sizeof(long long));
        ids[n++] = strtoll(p, NULL, 10);
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
    free(val);
    *ids_p = ids;
    return n;
}

static int elastic_main(options_t *o)
{
    char me[256] = "localhost";
    if (gethostname(me, sizeof(me) - 1) != 0 || me[0] == '\0')
        strcpy(me, "localhost");
    int slots_dflt = o->slots_per_host > 0 ? o->slots_per_host : 1;
    /* Without a script the hosts are fixed: -H/--hostfile, or -np here. */
    if (o->discovery == NULL && o->nhosts == 0) {
        if (o->np == 0 && o->max_np == 0)
            usage_error("--elastic needs --host-discovery-script, -H/--hostfile or -np");
        add_host(&o->hosts, &o->nhosts, me, strlen(me),
                 o->max_np > o->np ? o->max_np : o->np);
    }
    g_hosts = o->hosts;
    g_nhosts = o->nhosts;
    g_eh = xrealloc(NULL, (size_t)(g_nhosts + 1) * sizeof(ehost_t));
    memset(g_eh, 0, (size_t)(g_nhosts + 1) * sizeof(ehost_t));
    for (int h = 0; h < g_nhosts; h++)
        g_hosts[h].local = is_local_host(g_hosts[h].name);
    if (discover(o, slots_dflt) < 0)
        fatal("cannot run the discovery script %s: %s", o->discovery, strerror(errno));
    long total = 0;
    for (int h = 0; h < g_nhosts; h++)
        total += g_eh[h].present ? g_hosts[h].slots : 0;
    int min_np = o->min_np > 0 ? o->min_np : 1;
    int max_np = o->max_np > 0 ? o->max_np : o->np > 0 ? o->np : INT_MAX / 2;
    int np0 = o->np > 0 ? o->np : (int)(total < max_np ? total : max_np);
    if (np0 > max_np)
        usage_error("-np %d is more than --max-np %d", np0, max_np);
    if (np0 > total)
        fatal("-np %d is more than the %ld slot(s) the hosts have now", np0, total);
    if (np0 < min_np || total < min_np)
        fatal("the hosts have %ld slot(s), fewer than --min-np %d", total, min_np);
    double answer_s = o->timeout_s > 0 ? o->timeout_s : DEFAULT_ANSWER_S;
    double etimeout_s = o->elastic_timeout_s > 0 ? o->elastic_timeout_s
                        : o->timeout_s > 0 ? o->timeout_s : 600;
    double cooldown_s = o->blacklist_cooldown_s > 0 ? o->blacklist_cooldown_s : 60;
    int bl_failures = o->blacklist_failures > 0 ? o->blacklist_failures : 1;
    double interval_s = o->discovery_interval_s > 0 ? o->discovery_interval_s : 1;

    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) == NULL)
        fatal("getcwd: %s", strerror(errno));
    strbuf_t remote_wdir = { 0 };
    sb_str(&remote_wdir, o->wdir != NULL && o->wdir[0] == '/' ? o->wdir : cwd);
    if (o->wdir != NULL && o->wdir[0] != '/') {
        sb_str(&remote_wdir, "/");
        sb_str(&remote_wdir, o->wdir);
    }

    if (pipe2(g_sigpipe, O_CLOEXEC | O_NONBLOCK) < 0)
        fatal("pipe: %s", strerror(errno));
    sigset_t block;
    sigemptyset(&block);
    for (int i = 0; i < NFWD; i++)
        sigaddset(&block, g_fwd_signals[i]);
    sigaddset(&block, SIGCHLD);
    sigprocmask(SIG_BLOCK, &block, &g_orig_mask);
    install_handlers();

    /* Hosts may appear later, so with a script the store listens everywhere. */
    int any_remote = o->discovery != NULL;
    for (int h = 0; h < g_nhosts; h++)
        any_remote |= !g_hosts[h].local;
    loom_err_t err;
    loom_err_clear(&err);
    loom_store_server_t *srv = NULL;
    load_launcher_key();
    if (loom_store_server_start_auth(any_remote ? NULL : "127.0.0.1", 0, g_auth.auth_key,
                                     g_auth.auth_keylen, &err, &srv) != LOOM_SUCCESS)
        fatal("cannot start the rendezvous store: %s", err.msg);
    int port = loom_store_server_port(srv);
    char addr[NI_MAXHOST];
    int only_local = 1;
    for (int h = 0; h < g_nhosts; h++)
        only_local &= g_hosts[h].local;
    /* Local ranks talk to remote ones through the address of this machine
     * (all of them are local in the tests, which keeps them on loopback). */
    char *local_store = !only_local && own_addr(addr, sizeof(addr)) == 0
                            ? store_uri(addr, port) : store_uri("127.0.0.1", port);
    char *client_uri = store_uri("127.0.0.1", port);
    loom_store_t *store = NULL;
    if (loom_store_open_key(client_uri, -1, 30, g_auth.auth_key, g_auth.auth_keylen, &err,
                            &store) != LOOM_SUCCESS)
        fatal("cannot reach the store loomrun serves: %s", err.msg);
    free(client_uri);

    char jobid[64];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(jobid, sizeof(jobid), "%llx%06x",
             (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec,
             (unsigned)getpid() & 0xffffffu);
    char base[128];
    snprintf(base, sizeof(base), "loom/%s/elastic", jobid);

    envv_t env, xenv;
    env_init(&env, 1);
    env_init(&xenv, 0);
    for (char **p = environ; p != NULL && *p != NULL; p++)
        if (strncmp(*p, "LOOM_", 5) == 0 && !loomrun_sets(*p))
            env_push(&xenv, xstrdup(*p));
    for (int i = 0; i < o->nx; i++) {
        const char *x = o->xvars[i];
        const char *eq = strchr(x, '=');
        if (eq != NULL) {
            char *name = xstrdup(x);
            name[eq - x] = '\0';
            env_set(&env, name, eq + 1);
            env_set(&xenv, name, eq + 1);
            free(name);
        } else if (getenv(x) != NULL) {
            env_set(&env, x, getenv(x));
            env_set(&xenv, x, getenv(x));
        }
    }
    char *np_s = format_int(np0), *min_s = format_int(min_np);
    envv_t *both[2] = { &env, &xenv };
    for (int i = 0; i < 2; i++) {
        if (o->timeout != NULL)
            env_set(both[i], "LOOM_TIMEOUT", o->timeout);
        if (o->elastic_timeout != NULL)
            env_set(both[i], "LOOM_ELASTIC_TIMEOUT", o->elastic_timeout);
        env_set(both[i], "LOOM_JOB_ID", jobid);
        env_set(both[i], "LOOM_SIZE", np_s);
        env_set(both[i], "LOOM_ELASTIC", "1");
        env_set(both[i], "LOOM_ELASTIC_MIN_NP", min_s);
        env_unset(both[i], "LOOM_LOCAL_RANK");
        env_unset(both[i], "LOOM_LOCAL_SIZE");
    }
    free(np_s);
    free(min_s);
    for (int h = 0; h < g_nhosts; h++) {
        if (g_hosts[h].local)
            g_hosts[h].store = xstrdup(local_store);
        else if (route_addr(g_hosts[h].name, addr, sizeof(addr)) == 0)
            g_hosts[h].store = store_uri(addr, port);
    }

    fill_slots(np0, o, &env, &xenv, np0, remote_wdir.p, port, answer_s);
    int nstarted0 = g_np;
    sigprocmask(SIG_SETMASK, &g_orig_mask, NULL);

    int exit_code = 0, got_signal = 0, finishing = 0, changes = 0, nfailed = 0, nremoved = 0;
    long long kill_at = -1, below_since = -1;
    long long next_discovery = now_ms() + (long long)(interval_s * 1000);
    int killed = 0;
    struct pollfd *pfd = NULL;
    stream_t **pstream = NULL;
    while (g_nrunning > 0 || (!finishing && !exit_code && !got_signal)) {
        pfd = xrealloc(pfd, (size_t)(2 * g_np + 1) * sizeof(struct pollfd));
        pstream = xrealloc(pstream, (size_t)(2 * g_np + 1) * sizeof(stream_t *));
        int n = 0;
        pfd[n].fd = g_sigpipe[0];
        pfd[n].events = POLLIN;
        pstream[n++] = NULL;
        for (int r = 0; r < g_np; r++) {
            stream_t *ss[2] = { &g_ranks[r].out, &g_ranks[r].err };
            for (int k = 0; k < 2; k++) {
                if (ss[k]->fd < 0)
                    continue;
                pfd[n].fd = ss[k]->fd;
                pfd[n].events = POLLIN;
                pstream[n++] = ss[k];
            }
        }
        int ready = poll(pfd, (nfds_t)n, 100);
        if (ready < 0 && errno != EINTR)
            fatal("poll: %s", strerror(errno));
        int reap = 0;
        if (ready > 0 && (pfd[0].revents & POLLIN)) {
            unsigned char sigs[64];
            ssize_t m;
            while ((m = read(g_sigpipe[0], sigs, sizeof(sigs))) > 0) {
                for (ssize_t j = 0; j < m; j++) {
                    if (sigs[j] == SIGCHLD) {
                        reap = 1;
                        continue;
                    }
                    kill_all(sigs[j]);
                    if (!got_signal) {
                        got_signal = sigs[j];
                        if (kill_at < 0)
                            kill_at = now_ms() + GRACE_MS;
                    }
                }
            }
        }
        for (int j = 1; ready > 0 && j < n; j++)
            if (pfd[j].revents != 0)
                pump(pstream[j], 0);
        long long now = now_ms();
        for (int r = 0; reap && r < g_np; r++) {
            siginfo_t si;
            rank_t *rk = &g_ranks[r];
            if (!rk->running || !rank_exited(r, &si))
                continue;
            rk->running = 0;
            g_nrunning--;
            if (rk->ctl >= 0)
                close(rk->ctl);
            rk->ctl = -1;
            rk->answer_by = -1;
            pump(&rk->out, 1);
            pump(&rk->err, 1);
            close_stream(&rk->out);
            close_stream(&rk->err);
            sb_free(&rk->held);
            int code = si.si_code == CLD_EXITED ? si.si_status : 128 + si.si_status;
            g_ep[r].code = code;
            /* Its id is dead for every later round, whatever the reason. */
            char key[200];
            snprintf(key, sizeof(key), "%s/dead/%d", base, r);
            loom_err_clear(&err);
            if (loom_store_set(store, key, "1", 1, &err) != LOOM_SUCCESS)
                fprintf(stderr, "loomrun: store: %s\n", err.msg);
            if (code == 0 && !finishing) {
                finishing = 1;
                snprintf(key, sizeof(key), "%s/finished", base);
                loom_store_set(store, key, "1", 1, &err);
            } else if (code != 0 && g_ep[r].removed) {
                fprintf(stderr, "loomrun: rank %d left with host %s\n", r, g_hosts[rk->host].name);
            } else if (code != 0 && !finishing && !got_signal && !exit_code) {
                report(r, &si);
                nfailed++;
                changes++;
                ehost_t *eh = &g_eh[rk->host];
                if (++eh->failures >= bl_failures && eh->banned_until == 0) {
                    eh->banned_until = now + (long long)(cooldown_s * 1000);
                    fprintf(stderr, "loomrun: host %s blacklisted for %g s after %d failure(s)\n",
                            g_hosts[rk->host].name, cooldown_s, eh->failures);
                }
            }
        }
        /* Ranks of hosts that left, past their grace time. */
        for (int r = 0; r < g_np; r++)
            if (g_ranks[r].running && g_ep[r].kill_at >= 0 && now >= g_ep[r].kill_at) {
                signal_rank(&g_ranks[r], SIGKILL);
                g_ep[r].kill_at = -1;
            }
        if (!finishing && !exit_code && !got_signal) {
            if (o->reset_limit >= 0 && changes > o->reset_limit) {
                fprintf(stderr, "loomrun: elastic job failed: %d membership changes exceed "
                        "--reset-limit %d\n", changes, o->reset_limit);
                exit_code = 1;
            }
            int live = live_ranks();
            int usable = 0;
            for (int h = 0; h < g_nhosts; h++)
                usable += g_eh[h].present && g_eh[h].banned_until <= now;
            if (live >= min_np) {
                below_since = -1;
            } else if (live == 0 && usable == 0 && nfailed > 0) {
                /* Every rank failed and took its host with it: a program that
                 * fails everywhere (a bad argument, say) fails the job now, not
                 * after the blacklist cooldown. */
                fprintf(stderr, "loomrun: elastic job failed: every rank failed and every host is "
                        "blacklisted (--blacklist-cooldown %g s)\n", cooldown_s);
                exit_code = 1;
            } else if (below_since < 0) {
                below_since = now;
                fprintf(stderr, "loomrun: %d rank(s) left, below --min-np %d; waiting up to "
                        "%g s for hosts\n", live, min_np, etimeout_s);
            } else if (now - below_since > (long long)(etimeout_s * 1000)) {
                fprintf(stderr, "loomrun: elastic job failed: %d rank(s) running, below "
                        "--min-np %d for %g s (--elastic-timeout)\n", live, min_np, etimeout_s);
                exit_code = 1;
            }
            if (exit_code) {
                kill_all(SIGTERM);
                kill_at = now + GRACE_MS;
            }
        }
        if (!finishing && !exit_code && !got_signal && now >= next_discovery) {
            next_discovery = now + (long long)(interval_s * 1000);
            if (discover(o, slots_dflt) >= 0) {
                for (int r = 0; r < g_np; r++) {
                    if (!g_ranks[r].running || g_ep[r].removed || g_eh[g_ranks[r].host].present)
                        continue;
                    fprintf(stderr, "loomrun: host %s left: stopping rank %d\n",
                            g_hosts[g_ranks[r].host].name, r);
                    g_ep[r].removed = 1;
                    g_ep[r].kill_at = now + GRACE_MS;
                    signal_rank(&g_ranks[r], SIGTERM);
                    nremoved++;
                    changes++;
                }
                for (int h = 0; h < g_nhosts; h++)
                    if (g_eh[h].present && g_hosts[h].store == NULL) {
                        if (g_hosts[h].local)
                            g_hosts[h].store = xstrdup(local_store);
                        else if (route_addr(g_hosts[h].name, addr, sizeof(addr)) == 0)
                            g_hosts[h].store = store_uri(addr, port);
                    }
                int added = fill_slots(max_np, o, &env, &xenv, np0, remote_wdir.p, port,
                                       answer_s);
                if (added > 0) {
                    fprintf(stderr, "loomrun: %d new rank(s) started; they join at the next "
                            "commit point\n", added);
                    changes += added;
                }
            }
        }
        if (kill_at >= 0 && !killed && now >= kill_at) {
            kill_all(SIGKILL);
            killed = 1;
        }
        if (g_nrunning == 0 && (finishing || exit_code || got_signal))
            break;
    }

    /* The verdict and a summary. */
    long long *ids = NULL;
    int nmembers = final_members(store, base, &ids);
    int bad = 0;
    for (int i = 0; i < nmembers; i++)
        if (ids[i] >= 0 && ids[i] < g_np && g_ep[ids[i]].code != 0) {
            fprintf(stderr, "loomrun: rank %lld of the final epoch exited with code %d\n",
                    ids[i], g_ep[ids[i]].code);
            bad = bad ? bad : g_ep[ids[i]].code;
        }
    if (!exit_code && !got_signal && (bad || nmembers <= 0))
        exit_code = bad ? bad : 1;
    fprintf(stderr, "loomrun: elastic job %s: %d process(es) started (%d at first), %d failed, "
            "%d stopped with their host, %d membership change(s); final epoch has %d rank(s)",
            exit_code || got_signal ? "failed" : "finished", g_np, nstarted0, nfailed, nremoved,
            changes, nmembers > 0 ? nmembers : 0);
    int nbl = 0;
    for (int h = 0; h < g_nhosts; h++)
        if (g_eh[h].banned_until > 0)
            fprintf(stderr, "%s%s", nbl++ ? ", " : "; blacklisted: ", g_hosts[h].name);
    fprintf(stderr, "\n");
    free(ids);

    if (exit_code != 0 || got_signal)
        kill_all(SIGKILL);
    reap_all();
    loom_store_close(store);
    loom_store_server_stop(srv);
    sigaction(SIGCHLD, &g_orig_chld, NULL);
    free(pfd);
    free(pstream);
    env_free(&env);
    env_free(&xenv);
    sb_free(&remote_wdir);
    free(local_store);
    free(o->xvars);
    free(g_ranks);
    g_ranks = NULL;
    g_np = 0;
    free(g_ep);
    free(g_eh);
    for (int h = 0; h < g_nhosts; h++) {
        free(g_hosts[h].name);
        free(g_hosts[h].store);
    }
    free(g_hosts);
    free(g_out);
    sb_free(&g_fbuf);
    close(g_sigpipe[0]);
    close(g_sigpipe[1]);
    if (got_signal) {
        signal(got_signal, SIG_DFL);
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, got_signal);
        sigprocmask(SIG_UNBLOCK, &s, NULL);
        raise(got_signal);
        return 128 + got_signal;
    }
    return exit_code;
}

int main(int argc, char **argv)
{
    options_t opt;
    parse_args(argc, argv, &opt);
    if (opt.elastic)
        return elastic_main(&opt);

    /* Where the ranks go. */
    const char *slurm_job = getenv("SLURM_JOB_ID");
    int slurm = opt.nhosts == 0 && slurm_job != NULL && slurm_job[0] != '\0';
    int named_hosts = opt.nhosts > 0;
    char me[256] = "localhost";
    if (gethostname(me, sizeof(me) - 1) != 0 || me[0] == '\0')
        strcpy(me, "localhost");
    if (slurm && opt.np == 0) {
        const char *n = getenv("SLURM_NTASKS");
        if (n == NULL || n[0] == '\0')
            n = getenv("SLURM_NPROCS");
        if (n == NULL || (opt.np = parse_slots(n, strlen(n))) < 0)
            usage_error("-np N is required (SLURM_NTASKS is not set)");
    }
    if (!named_hosts) {
        if (opt.np == 0)
            usage_error("-np N is required (or -H/--hostfile)");
        add_host(&opt.hosts, &opt.nhosts, me, strlen(me), opt.np);
    }
    long total = 0;
    for (int h = 0; h < opt.nhosts; h++)
        total += opt.hosts[h].slots;
    if (opt.np == 0)
        opt.np = total > INT_MAX / 2 ? INT_MAX / 2 : (int)total;
    if (!slurm && opt.np > total)
        usage_error("-np %d is more than the %ld slots of the hosts", opt.np, total);
    int any_remote = 0;
    for (int h = 0; h < opt.nhosts; h++) {
        opt.hosts[h].local = !named_hosts || is_local_host(opt.hosts[h].name);
        any_remote |= !opt.hosts[h].local;
    }
    g_hosts = opt.hosts;
    g_nhosts = opt.nhosts;
    g_np = slurm ? 1 : opt.np;
    g_ranks = xrealloc(NULL, (size_t)g_np * sizeof(rank_t));
    memset(g_ranks, 0, (size_t)g_np * sizeof(rank_t));
    for (int r = 0, h = 0; r < g_np; r++) {
        rank_t *rk = &g_ranks[r];
        while (!slurm && g_hosts[h].nranks == g_hosts[h].slots)
            h++;
        rk->host = h;
        g_hosts[h].nranks++;
        rk->kind = slurm ? RANK_SRUN : g_hosts[h].local ? RANK_LOCAL : RANK_SSH;
        rk->out.fd = rk->err.fd = rk->out.file = rk->err.file = rk->ctl = -1;
        rk->answer_by = -1;
    }

    /* The remote working directory defaults to ours; --output-filename and
     * --wdir are taken relative to where loomrun runs. */
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) == NULL)
        fatal("getcwd: %s", strerror(errno));
    /* A relative --wdir means the same directory everywhere (a shared file
     * system), not one under each remote home. */
    strbuf_t remote_wdir = { 0 };
    if (opt.wdir != NULL && opt.wdir[0] == '/') {
        sb_str(&remote_wdir, opt.wdir);
    } else {
        sb_str(&remote_wdir, cwd);
        if (opt.wdir != NULL) {
            sb_str(&remote_wdir, "/");
            sb_str(&remote_wdir, opt.wdir);
        }
    }
    char *outdir = NULL;
    if (opt.output_dir != NULL) {
        if (make_dirs(opt.output_dir) != 0)
            fatal("--output-filename: cannot create %s: %s", opt.output_dir, strerror(errno));
        outdir = realpath(opt.output_dir, NULL);
        if (outdir == NULL)
            fatal("--output-filename: %s: %s", opt.output_dir, strerror(errno));
    }

    /* How long a host may take to answer: ssh's ConnectTimeout and our own
     * deadline for the remote script to start the program. */
    double answer_s = opt.timeout_s;
    if (answer_s <= 0) {
        const char *t = getenv("LOOM_TIMEOUT");
        char *end;
        answer_s = t != NULL ? strtod(t, &end) : 0;
        if (t == NULL || end == t || *end != '\0' || !(answer_s > 0) || answer_s > 1e7)
            answer_s = DEFAULT_ANSWER_S;
    }

    /* Signals stay blocked until the ranks are started: the store server
     * thread inherits the mask (so the handlers run on this thread), and a
     * signal cannot hit a child between fork and exec with our handler. */
    if (pipe2(g_sigpipe, O_CLOEXEC | O_NONBLOCK) < 0)
        fatal("pipe: %s", strerror(errno));
    sigset_t block;
    sigemptyset(&block);
    for (int i = 0; i < NFWD; i++)
        sigaddset(&block, g_fwd_signals[i]);
    sigaddset(&block, SIGCHLD);
    sigprocmask(SIG_BLOCK, &block, &g_orig_mask);
    install_handlers();

    /* Remote ranks (and srun's, on other nodes) reach the store over the
     * network; local-only jobs keep it on loopback. */
    loom_err_t err;
    loom_err_clear(&err);
    loom_store_server_t *srv = NULL;
    load_launcher_key();
    if (loom_store_server_start_auth(any_remote || slurm ? NULL : "127.0.0.1", 0, g_auth.auth_key,
                                     g_auth.auth_keylen, &err, &srv) != LOOM_SUCCESS)
        fatal("cannot start the rendezvous store: %s", err.msg);
    int port = loom_store_server_port(srv);

    /* Each host gets the store at the address of ours that routes to it. Local
     * ranks listen on the interface of their store connection, so with remote
     * hosts they need an address those hosts reach, not 127.0.0.1. */
    char addr[NI_MAXHOST];
    char *local_store = NULL;
    for (int h = 0; h < g_nhosts; h++) {
        if (g_hosts[h].local || g_hosts[h].nranks == 0)
            continue;
        if (route_addr(g_hosts[h].name, addr, sizeof(addr)) == 0) {
            g_hosts[h].store = store_uri(addr, port);
            if (local_store == NULL)
                local_store = xstrdup(g_hosts[h].store);
        }
    }
    if (slurm) {
        const char *nodes = getenv("SLURM_JOB_NODELIST");
        if (nodes == NULL || nodes[0] == '\0')
            nodes = getenv("SLURM_NODELIST");
        char node[256] = "";
        if (nodes != NULL)
            first_slurm_node(nodes, node, sizeof(node));
        if ((node[0] != '\0' && route_addr(node, addr, sizeof(addr)) == 0) ||
            own_addr(addr, sizeof(addr)) == 0)
            local_store = store_uri(addr, port);
        else
            local_store = store_uri(me, port);
    } else if (any_remote && local_store == NULL) {
        if (own_addr(addr, sizeof(addr)) == 0) {
            local_store = store_uri(addr, port);
        } else {
            local_store = store_uri("127.0.0.1", port);
            for (int r = 0; r < g_np; r++) {
                if (g_ranks[r].kind == RANK_LOCAL) {
                    fprintf(stderr, "loomrun: warning: no address of this machine found that "
                            "the remote hosts reach; local ranks use 127.0.0.1 (set "
                            "LOOM_SOCKET_IFNAME)\n");
                    break;
                }
            }
        }
    } else if (local_store == NULL) {
        local_store = store_uri("127.0.0.1", port);
    }
    for (int h = 0; h < g_nhosts; h++)
        if (g_hosts[h].local)
            g_hosts[h].store = xstrdup(local_store);

    /* Unique per run, so ranks of an earlier job still connecting to a reused
     * port are refused by the handshake. */
    char jobid[64];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(jobid, sizeof(jobid), "%llx%06x",
             (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec,
             (unsigned)getpid() & 0xffffffu);
    char *size_s = format_int(opt.np);

    /* The environment of local ranks (and srun): ours, -x on top, loomrun's
     * own variables last so -x cannot break the rendezvous. Remote ranks get
     * only what is passed on their command line: LOOM_* settings of ours, -x,
     * and loomrun's variables; secrets (secret_vars) travel on ssh's stdin
     * instead, since a command line can be seen in ps on both hosts. */
    envv_t env, xenv;
    env_init(&env, 1);
    env_init(&xenv, 0);
    for (char **p = environ; p != NULL && *p != NULL; p++)
        if (strncmp(*p, "LOOM_", 5) == 0 && !loomrun_sets(*p))
            env_push(&xenv, xstrdup(*p));
    for (int i = 0; i < opt.nx; i++) {
        const char *x = opt.xvars[i];
        const char *eq = strchr(x, '=');
        if (eq != NULL) {
            char *name = xstrdup(x);
            name[eq - x] = '\0';
            env_set(&env, name, eq + 1);
            env_set(&xenv, name, eq + 1);
            free(name);
        } else if (getenv(x) != NULL) {
            env_set(&env, x, getenv(x));
            env_set(&xenv, x, getenv(x));
        } else {
            fprintf(stderr, "loomrun: warning: -x %s: %s is not set, not passed\n", x, x);
        }
    }
    if (opt.timeout != NULL) {
        env_set(&env, "LOOM_TIMEOUT", opt.timeout);
        env_set(&xenv, "LOOM_TIMEOUT", opt.timeout);
    }
    env_set(&env, "LOOM_JOB_ID", jobid);
    env_set(&xenv, "LOOM_JOB_ID", jobid);

    if (slurm) {
        /* srun numbers the tasks; variables of an enclosing launcher would
         * take precedence over SLURM_PROCID in loom_init. */
        static const char *const stale[] = { "LOOM_RANK", "LOOM_SIZE", "LOOM_LOCAL_RANK",
                                             "LOOM_LOCAL_SIZE", "RANK", "WORLD_SIZE",
                                             "LOCAL_RANK", "LOCAL_WORLD_SIZE" };
        for (size_t i = 0; i < sizeof(stale) / sizeof(stale[0]); i++)
            env_unset(&env, stale[i]);
        env_set(&env, "LOOM_STORE", local_store);
        strbuf_t ntasks = { 0 }, so = { 0 }, se = { 0 }, chdir_opt = { 0 };
        char *sargv[16 + 1];
        int k = 0;
        sargv[k++] = "srun";
        sb_str(&ntasks, "--ntasks=");
        sb_str(&ntasks, size_s);
        sargv[k++] = ntasks.p;
        sargv[k++] = "--kill-on-bad-exit=1";
        if (opt.wdir != NULL) {
            sb_str(&chdir_opt, "--chdir=");
            sb_str(&chdir_opt, opt.wdir);
            sargv[k++] = chdir_opt.p;
        }
        if (outdir != NULL) {
            /* srun writes the files itself (%t: the task's rank); its console
             * output then holds only what srun says. */
            for (int r = 0; r < opt.np; r++)
                open_output_file(outdir, r, NULL);
            sb_str(&so, "--output=");
            sb_str(&so, outdir);
            sb_str(&so, "/rank.%t/stdout");
            sb_str(&se, "--error=");
            sb_str(&se, outdir);
            sb_str(&se, "/rank.%t/stderr");
            sargv[k++] = so.p;
            sargv[k++] = se.p;
        }
        int nargs = 0;
        while (opt.argv[nargs] != NULL)
            nargs++;
        char **full = xrealloc(NULL, (size_t)(k + nargs + 1) * sizeof(char *));
        memcpy(full, sargv, (size_t)k * sizeof(char *));
        memcpy(full + k, opt.argv, (size_t)(nargs + 1) * sizeof(char *));
        if (start_rank(0, full, env.v, NULL) < 0)
            fatal("cannot start srun: %s", strerror(errno));
        free(full);
        sb_free(&ntasks);
        sb_free(&so);
        sb_free(&se);
        sb_free(&chdir_opt);
    } else {
        env_set(&env, "LOOM_SIZE", size_s);
        env_set(&xenv, "LOOM_SIZE", size_s);
        char timeout_opt[64];
        snprintf(timeout_opt, sizeof(timeout_opt), "ConnectTimeout=%d",
                 answer_s >= INT_MAX - 1 ? INT_MAX - 1 : (int)answer_s + (answer_s > (int)answer_s));
        int *placed = xrealloc(NULL, (size_t)g_nhosts * sizeof(int));
        memset(placed, 0, (size_t)g_nhosts * sizeof(int));
        for (int r = 0; r < g_np; r++) {
            rank_t *rk = &g_ranks[r];
            host_t *h = &g_hosts[rk->host];
            char *rank_s = format_int(r), *lrank_s = format_int(placed[rk->host]++),
                 *lsize_s = format_int(h->nranks);
            if (outdir != NULL) {
                rk->out.file = open_output_file(outdir, r, "stdout");
                rk->err.file = open_output_file(outdir, r, "stderr");
            }
            int rc;
            if (rk->kind == RANK_LOCAL) {
                env_set(&env, "LOOM_RANK", rank_s);
                env_set(&env, "LOOM_LOCAL_RANK", lrank_s);
                env_set(&env, "LOOM_LOCAL_SIZE", lsize_s);
                env_set(&env, "LOOM_STORE", h->store);
                if (named_hosts)
                    env_set(&env, "LOOM_HOST_ID", h->name);
                env_set_horovod(&env, r, g_np, placed[rk->host] - 1, rk->host);
                rc = start_rank(r, opt.argv, env.v, opt.wdir);
            } else {
                env_set(&xenv, "LOOM_RANK", rank_s);
                env_set(&xenv, "LOOM_LOCAL_RANK", lrank_s);
                env_set(&xenv, "LOOM_LOCAL_SIZE", lsize_s);
                env_set(&xenv, "LOOM_HOST_ID", h->name);
                env_set_horovod(&xenv, r, g_np, placed[rk->host] - 1, rk->host);
                if (h->store != NULL)
                    env_set(&xenv, "LOOM_STORE", h->store);
                else
                    env_unset(&xenv, "LOOM_STORE");
                strbuf_t script = { 0 }, secrets = { 0 };
                remote_script(&script, remote_wdir.p, port, h, &xenv, &secrets);
                for (char **p = opt.argv; *p != NULL; p++) {
                    sb_add(&script, " ", 1);
                    sb_quote(&script, *p);
                }
                sb_str(&script, " 2>&4 4>&-\nexit $?\n");
                char *sargv[24];
                int k = 0;
                sargv[k++] = "ssh";
                sargv[k++] = "-o";
                sargv[k++] = "BatchMode=yes";
                sargv[k++] = "-o";
                sargv[k++] = "StrictHostKeyChecking=accept-new";
                sargv[k++] = "-o";
                sargv[k++] = timeout_opt;
                /* Keeps "Permanently added ... to the list of known hosts" out
                 * of the ranks' output; errors still show. */
                sargv[k++] = "-o";
                sargv[k++] = "LogLevel=ERROR";
                if (opt.ssh_port != NULL) {
                    sargv[k++] = "-p";
                    sargv[k++] = (char *)opt.ssh_port;
                }
                if (opt.ssh_identity != NULL) {
                    sargv[k++] = "-i";
                    sargv[k++] = (char *)opt.ssh_identity;
                }
                sargv[k++] = "--";   /* a host name is never an option */
                sargv[k++] = h->name;
                sargv[k++] = script.p;
                sargv[k] = NULL;
                rc = start_rank(r, sargv, env.v, NULL);
                if (rc == 0)
                    send_secrets(rk, &secrets);
                rk->answer_by = now_ms() + (long long)(answer_s * 1000);
                sb_free(&script);
                sb_free(&secrets);
            }
            if (rc < 0)
                fatal("cannot start rank %d: %s", r, strerror(errno));
            free(rank_s);
            free(lrank_s);
            free(lsize_s);
        }
        free(placed);
    }
    env_free(&env);
    env_free(&xenv);
    free(opt.xvars);
    free(size_s);
    free(local_store);
    sb_free(&remote_wdir);
    sigprocmask(SIG_SETMASK, &g_orig_mask, NULL);

    struct pollfd *pfd = xrealloc(NULL, (size_t)(2 * g_np + 1) * sizeof(struct pollfd));
    stream_t **pstream = xrealloc(NULL, (size_t)(2 * g_np + 1) * sizeof(stream_t *));
    int exit_code = 0;        /* of the first rank that failed; 0: none did */
    int got_signal = 0;       /* first terminating signal loomrun received */
    long long kill_at = -1;   /* when the SIGKILL follows the SIGTERM */
    int killed = 0;

    while (g_nrunning > 0) {
        int n = 0;
        pfd[n].fd = g_sigpipe[0];
        pfd[n].events = POLLIN;
        pstream[n++] = NULL;
        long long wake = -1;   /* the next deadline, if any */
        for (int r = 0; r < g_np; r++) {
            stream_t *ss[2] = { &g_ranks[r].out, &g_ranks[r].err };
            for (int k = 0; k < 2; k++) {
                if (ss[k]->fd < 0)
                    continue;
                pfd[n].fd = ss[k]->fd;
                pfd[n].events = POLLIN;
                pstream[n++] = ss[k];
            }
            if (g_ranks[r].running && g_ranks[r].answer_by >= 0 &&
                (wake < 0 || g_ranks[r].answer_by < wake))
                wake = g_ranks[r].answer_by;
        }
        if (kill_at >= 0 && !killed && (wake < 0 || kill_at < wake))
            wake = kill_at;
        int wait_ms = -1;
        if (wake >= 0) {
            long long left = wake - now_ms();
            wait_ms = left > 0 ? (left > INT_MAX ? INT_MAX : (int)left) : 0;
        }
        int ready = poll(pfd, (nfds_t)n, wait_ms);
        if (ready < 0 && errno != EINTR)
            fatal("poll: %s", strerror(errno));

        int reap = 0;
        if (ready > 0 && (pfd[0].revents & POLLIN)) {
            unsigned char sigs[64];
            ssize_t m;
            while ((m = read(g_sigpipe[0], sigs, sizeof(sigs))) > 0) {
                for (ssize_t j = 0; j < m; j++) {
                    if (sigs[j] == SIGCHLD) {
                        reap = 1;
                        continue;
                    }
                    /* Forward each time, so a second Ctrl-C reaches the ranks
                     * again; the SIGKILL deadline is set by the first. */
                    kill_all(sigs[j]);
                    if (!got_signal) {
                        got_signal = sigs[j];
                        if (kill_at < 0)
                            kill_at = now_ms() + GRACE_MS;
                    }
                }
            }
        }
        for (int j = 1; ready > 0 && j < n; j++)
            if (pfd[j].revents != 0)
                pump(pstream[j], 0);

        for (int r = 0; reap && r < g_np; r++) {
            siginfo_t si;
            rank_t *rk = &g_ranks[r];
            if (rk->running && rank_exited(r, &si)) {
                rk->running = 0;
                g_nrunning--;
                if (rk->ctl >= 0)
                    close(rk->ctl);
                rk->ctl = -1;
                rk->answer_by = -1;
                /* Everything the rank wrote is in the pipes now; print it
                 * before any verdict. Output of its own background children
                 * after this point is not collected. */
                pump(&rk->out, 1);
                pump(&rk->err, 1);
                close_stream(&rk->out);
                close_stream(&rk->err);

                int code = si.si_code == CLD_EXITED ? si.si_status : 128 + si.si_status;
                /* Only the first failure is the cause; ranks ending because
                 * we (or the user, through us) signalled them are not. */
                if (code != 0 && exit_code == 0 && !got_signal) {
                    exit_code = report(r, &si);
                    kill_all(SIGTERM);
                    if (kill_at < 0)
                        kill_at = now_ms() + GRACE_MS;
                }
                sb_free(&rk->held);
            }
        }
        long long now = now_ms();
        for (int r = 0; r < g_np; r++) {
            rank_t *rk = &g_ranks[r];
            if (!rk->running || rk->answer_by < 0 || now < rk->answer_by)
                continue;
            rk->answer_by = -1;
            if (exit_code == 0 && !got_signal) {
                fprintf(stderr, "loomrun: cannot reach host %s: no answer within %g s\n",
                        g_hosts[rk->host].name, answer_s);
                exit_code = EXIT_UNREACHABLE;
                kill_all(SIGTERM);
                if (kill_at < 0)
                    kill_at = now + GRACE_MS;
            }
        }
        if (kill_at >= 0 && !killed && now >= kill_at) {
            kill_all(SIGKILL);
            killed = 1;   /* once is enough: SIGKILL cannot be caught */
        }
    }

    /* After a failure or a signal, leave nothing of the job behind: not even
     * background children of ranks that exited. A job that succeeded keeps
     * them, as a shell would. */
    if (exit_code != 0 || got_signal)
        kill_all(SIGKILL);
    reap_all();
    loom_store_server_stop(srv);
    sigaction(SIGCHLD, &g_orig_chld, NULL);
    close(g_sigpipe[0]);
    close(g_sigpipe[1]);
    free(pfd);
    free(pstream);
    free(g_ranks);
    free(g_out);
    sb_free(&g_fbuf);
    g_ranks = NULL;
    for (int h = 0; h < g_nhosts; h++) {
        free(g_hosts[h].name);
        free(g_hosts[h].store);
    }
    free(g_hosts);
    free(outdir);

    if (exit_code != 0)
        return exit_code;
    if (got_signal) {
        /* Die of the same signal, so a calling shell sees the interruption
         * and stops its script as it would for any interrupted command. */
        signal(got_signal, SIG_DFL);
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, got_signal);
        sigprocmask(SIG_UNBLOCK, &s, NULL);
        raise(got_signal);
        return 128 + got_signal;
    }
    return 0;
}
