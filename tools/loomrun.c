/*
 * loomrun - start N ranks of a program on this host.
 *
 *   loomrun -np N [-x VAR[=value]]... [--timeout S] prog args...
 *
 * loomrun serves the rendezvous store itself (so no rank has to), forks the
 * ranks with LOOM_RANK/LOOM_SIZE/LOOM_LOCAL_RANK/LOOM_LOCAL_SIZE/LOOM_STORE/
 * LOOM_JOB_ID set, tags every line they print with "[R]<stdout>: " or
 * "[R]<stderr>: ", forwards SIGINT/SIGTERM/SIGHUP, and when one rank fails
 * ends the others and exits with the failing rank's code.
 *
 * Everything runs in one thread around poll(): the ranks' pipes plus a
 * self-pipe that the signal handlers write to, so signals and child exits are
 * handled in the loop rather than in handlers.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "loom.h"
#include "error.h"
#include "store.h"

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

/* Exit codes of loomrun itself, apart from propagated rank codes. */
#define EXIT_USAGE 2

typedef struct stream {
    int fd;              /* read end of the rank's pipe; -1 once closed */
    int dest;            /* STDOUT_FILENO or STDERR_FILENO */
    char prefix[40];     /* "[R]<stdout>: " */
    size_t prefix_len;
    char *line;          /* partial line not yet ended by '\n' */
    size_t len, cap;
} stream_t;

typedef struct rank {
    pid_t pid;           /* also its process group id; 0 once reaped */
    int running;         /* not exited yet */
    stream_t out, err;
} rank_t;

/* The job, global so the fatal path can still end the ranks. */
static rank_t *g_ranks;
static int g_np;
static int g_nrunning;

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

static char *g_out;      /* assembly buffer for one batch of tagged lines */
static size_t g_out_cap;

/* ---- small helpers --------------------------------------------------------- */

/* Signal the process group of every rank, exited ones included: an exited
 * rank stays an unreaped zombie until loomrun ends, which keeps its pid, and
 * so its group id, from being reused, while its background children may still
 * be in the group. */
static void kill_all(int sig)
{
    for (int r = 0; r < g_np; r++)
        if (g_ranks[r].pid > 0)
            kill(-g_ranks[r].pid, sig);
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
 * inherited. */
static void write_all(int fd, const char *buf, size_t len)
{
    if (g_dest_dead[fd])
        return;
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
            g_dest_dead[fd] = 1;
            return;
        }
    }
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

/* ---- output tagging -------------------------------------------------------- */

/* Append "prefix + partial line + text[0..n) + '\n'" to the batch at *olen. */
static void emit_line(stream_t *s, size_t *olen, const char *text, size_t n)
{
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

/* Tag the complete lines in data; keep the unfinished tail for later. One
 * write per batch keeps a rank's lines whole and cuts syscalls. */
static void feed(stream_t *s, const char *data, size_t n)
{
    size_t olen = 0;
    const char *p = data, *end = data + n;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl != NULL) {
            emit_line(s, &olen, p, (size_t)(nl - p));
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
            emit_line(s, &olen, "", 0);
        break;
    }
    if (olen > 0)
        write_all(s->dest, g_out, olen);
}

/* The rank closed the stream or exited: an unfinished last line still gets
 * printed, with a newline so the next tagged line starts cleanly. */
static void close_stream(stream_t *s)
{
    if (s->len > 0) {
        size_t olen = 0;
        emit_line(s, &olen, "", 0);
        write_all(s->dest, g_out, olen);
    }
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
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

static void env_set(envv_t *e, const char *name, const char *value)
{
    size_t nlen = strlen(name), vlen = strlen(value);
    char *kv = xrealloc(NULL, nlen + vlen + 2);
    memcpy(kv, name, nlen);
    kv[nlen] = '=';
    memcpy(kv + nlen + 1, value, vlen + 1);
    for (size_t i = 0; i < e->n; i++) {
        if (strncmp(e->v[i], name, nlen) == 0 && e->v[i][nlen] == '=') {
            free(e->v[i]);
            e->v[i] = kv;
            return;
        }
    }
    if (e->n + 2 > e->cap) {
        e->cap = e->cap ? e->cap * 2 : 64;
        e->v = xrealloc(e->v, e->cap * sizeof(char *));
    }
    e->v[e->n++] = kv;
    e->v[e->n] = NULL;
}

static void env_init(envv_t *e)
{
    e->v = xrealloc(NULL, sizeof(char *));
    e->v[0] = NULL;
    e->n = e->cap = 0;
    for (char **p = environ; p != NULL && *p != NULL; p++) {
        if (e->n + 2 > e->cap) {
            e->cap = e->cap ? e->cap * 2 : 64;
            e->v = xrealloc(e->v, e->cap * sizeof(char *));
        }
        e->v[e->n++] = xstrdup(*p);
        e->v[e->n] = NULL;
    }
}

static void env_free(envv_t *e)
{
    for (size_t i = 0; i < e->n; i++)
        free(e->v[i]);
    free(e->v);
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

/* ---- starting ranks ---------------------------------------------------------- */

/* Runs in the forked child. The store server thread of the parent may have
 * held any lock at fork, so nothing here allocates: the environment was
 * built before the fork, and the error text is written piece by piece. */
static void exec_rank(int rank, int out_w, int err_w, char *const argv[], char *const envp[],
                      pid_t parent)
{
    /* Own process group: the terminal's Ctrl-C reaches loomrun only, which
     * forwards it once, and kill(-pgid) also reaches the rank's children. */
    setpgid(0, 0);
#ifdef __linux__
    /* If loomrun is killed outright (SIGKILL), do not leave the rank running. */
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

    if (dup2(out_w, STDOUT_FILENO) < 0 || dup2(err_w, STDERR_FILENO) < 0)
        _exit(127);
    /* Rank 0 may read loomrun's stdin (`cat data | loomrun ...`), but not a
     * terminal: from its own process group a read would stop it with SIGTTIN. */
    if (rank != 0 || isatty(STDIN_FILENO)) {
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0 && nul != STDIN_FILENO) {
            dup2(nul, STDIN_FILENO);
            close(nul);
        }
    }
#if defined(__linux__) && defined(CLOSE_RANGE_CLOEXEC)
    /* Every fd of ours is O_CLOEXEC already; this also covers any the library
     * (store server sockets) might have opened without it. */
    close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
#endif
    sigprocmask(SIG_SETMASK, &g_orig_mask, NULL);

    execvpe(argv[0], argv, envp);

    int e = errno;
    const char *parts[] = { "loomrun: cannot execute ", argv[0], ": ", strerror(e), "\n" };
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
    snprintf(s->prefix, sizeof(s->prefix), "[%d]<%s>: ", rank,
             dest == STDOUT_FILENO ? "stdout" : "stderr");
    s->prefix_len = strlen(s->prefix);
    s->line = NULL;
    s->len = s->cap = 0;
    *write_end = p[1];
    return 0;
}

static int start_rank(int rank, char *const argv[], envv_t *env)
{
    rank_t *rk = &g_ranks[rank];
    int out_w = -1, err_w = -1;
    char buf[32];

    snprintf(buf, sizeof(buf), "%d", rank);
    env_set(env, "LOOM_RANK", buf);
    env_set(env, "LOOM_LOCAL_RANK", buf);

    if (open_stream(&rk->out, rank, STDOUT_FILENO, &out_w) < 0)
        return -1;
    if (open_stream(&rk->err, rank, STDERR_FILENO, &err_w) < 0) {
        close(out_w);
        close_stream(&rk->out);
        return -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0)
        exec_rank(rank, out_w, err_w, argv, env->v, parent);
    int saved = errno;
    close(out_w);
    close(err_w);
    if (pid < 0) {
        close_stream(&rk->out);
        close_stream(&rk->err);
        errno = saved;
        return -1;
    }
    /* Also set the group here: whichever of parent and child runs first, the
     * group exists before loomrun may signal it. */
    setpgid(pid, pid);
    rk->pid = pid;
    rk->running = 1;
    g_nrunning++;
    return 0;
}

/* ---- command line ------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
        "Usage: loomrun -np N [-x VAR[=value]]... [--timeout S] prog [args...]\n"
        "\n"
        "Start N ranks of prog on this host, serve their rendezvous store and tag\n"
        "their output with the rank.\n"
        "\n"
        "Options:\n"
        "  -np N, -n N       number of ranks (required, at least 1)\n"
        "  -x VAR=value      set VAR in the ranks' environment\n"
        "  -x VAR            pass loomrun's own value of VAR to the ranks\n"
        "  --timeout S       seconds a Loom call may wait (LOOM_TIMEOUT for the ranks)\n"
        "  -h, --help        show this help and exit\n"
        "  --version         show the version and exit\n"
        "  --                end of options (for a program whose name starts with '-')\n"
        "\n"
        "Each rank gets LOOM_RANK, LOOM_SIZE, LOOM_LOCAL_RANK, LOOM_LOCAL_SIZE,\n"
        "LOOM_STORE (tcp://127.0.0.1:PORT, served by loomrun) and LOOM_JOB_ID.\n"
        "Every output line is prefixed with \"[R]<stdout>: \" or \"[R]<stderr>: \".\n"
        "SIGINT, SIGTERM and SIGHUP are forwarded to all ranks. When a rank exits\n"
        "non-zero or is killed, the others get SIGTERM and %d s later SIGKILL, and\n"
        "loomrun exits with that rank's code (128+N for signal N).\n",
        GRACE_MS / 1000);
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
    const char *timeout;
    const char **xvars;  /* "VAR" or "VAR=value", as given */
    int nx;
    char **argv;         /* the program and its arguments */
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

static void parse_args(int argc, char **argv, options_t *o)
{
    memset(o, 0, sizeof(*o));
    o->xvars = xrealloc(NULL, (size_t)argc * sizeof(char *));
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

        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--version") == 0) {
            printf("loomrun (Loom) %d.%d.%d\n", LOOM_VERSION_MAJOR, LOOM_VERSION_MINOR,
                   LOOM_VERSION_PATCH);
            exit(0);
        } else if (strcmp(a, "-np") == 0 || strcmp(a, "-n") == 0 ||
                   (nlen == 4 && strncmp(a, "--np", 4) == 0)) {
            const char *v = opt_value(argc, argv, &i, "-np", eq);
            char *end;
            errno = 0;
            long n = strtol(v, &end, 10);
            if (end == v || *end != '\0' || errno != 0 || n < 1 || n > INT_MAX / 2)
                usage_error("-np: '%s' is not a rank count (an integer >= 1)", v);
            o->np = (int)n;
        } else if (strcmp(a, "-x") == 0) {
            const char *v = opt_value(argc, argv, &i, "-x", NULL);
            if (v[0] == '\0' || v[0] == '=')
                usage_error("-x: '%s' does not start with a variable name", v);
            o->xvars[o->nx++] = v;
        } else if (nlen == 9 && strncmp(a, "--timeout", 9) == 0) {
            const char *v = opt_value(argc, argv, &i, "--timeout", eq);
            char *end;
            double t = strtod(v, &end);
            if (end == v || *end != '\0' || !(t > 0))
                usage_error("--timeout: '%s' is not a positive number of seconds", v);
            o->timeout = v;
        } else {
            usage_error("unknown option '%s'", a);
        }
    }
    if (i >= argc)
        usage_error("no program to run");
    if (o->np == 0)
        usage_error("-np N is required");
    o->argv = argv + i;
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

static void report(int rank, const siginfo_t *si)
{
    if (si->si_code == CLD_EXITED)
        fprintf(stderr, "loomrun: rank %d exited with code %d\n", rank, si->si_status);
    else
        fprintf(stderr, "loomrun: rank %d was killed by signal %s (%d)\n", rank,
                signal_name(si->si_status), si->si_status);
}

int main(int argc, char **argv)
{
    options_t opt;
    parse_args(argc, argv, &opt);

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

    loom_err_t err;
    loom_err_clear(&err);
    loom_store_server_t *srv = NULL;
    if (loom_store_server_start("127.0.0.1", 0, &err, &srv) != LOOM_SUCCESS)
        fatal("cannot start the rendezvous store: %s", err.msg);

    envv_t env;
    env_init(&env);
    for (int i = 0; i < opt.nx; i++) {
        const char *x = opt.xvars[i];
        const char *eq = strchr(x, '=');
        if (eq != NULL) {
            char *name = xstrdup(x);
            name[eq - x] = '\0';
            env_set(&env, name, eq + 1);
            free(name);
        } else if (getenv(x) != NULL) {
            env_set(&env, x, getenv(x));
        } else {
            fprintf(stderr, "loomrun: warning: -x %s: %s is not set, not passed\n", x, x);
        }
    }
    /* loomrun's own variables come last: -x cannot break the rendezvous. */
    char buf[64];
    snprintf(buf, sizeof(buf), "%d", opt.np);
    env_set(&env, "LOOM_SIZE", buf);
    env_set(&env, "LOOM_LOCAL_SIZE", buf);
    snprintf(buf, sizeof(buf), "tcp://127.0.0.1:%d", loom_store_server_port(srv));
    env_set(&env, "LOOM_STORE", buf);
    /* Unique per run, so ranks of an earlier job still connecting to a reused
     * port are refused by the handshake. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(buf, sizeof(buf), "%llx%06x",
             (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec,
             (unsigned)getpid() & 0xffffffu);
    env_set(&env, "LOOM_JOB_ID", buf);
    if (opt.timeout != NULL)
        env_set(&env, "LOOM_TIMEOUT", opt.timeout);

    g_np = opt.np;
    g_ranks = xrealloc(NULL, (size_t)g_np * sizeof(rank_t));
    memset(g_ranks, 0, (size_t)g_np * sizeof(rank_t));
    for (int r = 0; r < g_np; r++) {
        g_ranks[r].out.fd = g_ranks[r].err.fd = -1;
        if (start_rank(r, opt.argv, &env) < 0)
            fatal("cannot start rank %d: %s", r, strerror(errno));
    }
    env_free(&env);
    free(opt.xvars);
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
        int wait_ms = -1;
        if (kill_at >= 0 && !killed) {
            long long left = kill_at - now_ms();
            wait_ms = left > 0 ? (int)left : 0;
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
            if (g_ranks[r].running && rank_exited(r, &si)) {
                g_ranks[r].running = 0;
                g_nrunning--;
                /* Everything the rank wrote is in the pipes now; print it
                 * before any verdict. Output of its own background children
                 * after this point is not collected. */
                pump(&g_ranks[r].out, 1);
                pump(&g_ranks[r].err, 1);
                close_stream(&g_ranks[r].out);
                close_stream(&g_ranks[r].err);

                int code = si.si_code == CLD_EXITED ? si.si_status : 128 + si.si_status;
                /* Only the first failure is the cause; ranks ending because
                 * we (or the user, through us) signalled them are not. */
                if (code != 0 && exit_code == 0 && !got_signal) {
                    exit_code = code;
                    report(r, &si);
                    kill_all(SIGTERM);
                    if (kill_at < 0)
                        kill_at = now_ms() + GRACE_MS;
                }
            }
        }
        if (kill_at >= 0 && !killed && now_ms() >= kill_at) {
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
    g_ranks = NULL;

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
