/*
 * loomrun's private header: the job's types and state, shared by the files of
 * tools/launcher/ (see main.c for what loomrun does).
 */
#ifndef LOOMRUN_H
#define LOOMRUN_H

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
#include "base/error.h"
#include "base/settings.h"
#include "store/store.h"

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

/* --max-np all: every slot the hosts have, now and as they come (what
 * horovodrun does without --max-np). */
#define EVERY_SLOT (INT_MAX / 2)

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
    int host;            /* index into g_run.hosts */
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

typedef struct envv {
    char **v;            /* NULL-terminated, every string owned */
    size_t n, cap;
} envv_t;

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
    int min_np, max_np;        /* 0: not given; max_np EVERY_SLOT: --max-np all */
    const char *discovery;     /* --host-discovery-script */
    int slots_per_host;        /* 0: not given */
    double elastic_timeout_s;  /* 0: not given */
    const char *elastic_timeout;
    int reset_limit;           /* -1: none */
    double blacklist_cooldown_s;
    int blacklist_failures;
    double discovery_interval_s;
} options_t;


/* SIGINT, SIGTERM, SIGHUP: forwarded to the ranks. */
#define NFWD 3
extern const int g_fwd_signals[NFWD];

/* Everything loomrun keeps about the ranks while they run, in one place
 * (main.c defines it; a plain job's plan is main.c's job_t), global so
 * that the fatal path and the signal handler can still end the ranks. */
typedef struct loomrun {
    rank_t *ranks;
    int np;
    int nrunning;
    host_t *hosts;
    int nhosts;

    int sigpipe[2];
    /* Dispositions loomrun started with: a signal ignored on entry (nohup, a
     * background job of a non-interactive shell) stays ignored, for us and
     * for the ranks. */
    struct sigaction orig_act[NFWD];
    struct sigaction orig_chld, orig_pipe;
    sigset_t orig_mask;

    /* Set when a write to our stdout/stderr failed for good (EPIPE...):
     * further output for it is dropped instead of retried. */
    int dest_dead[3];

    int tag;            /* --tag-output (the default) / --no-tag-output */
    char *out;          /* assembly buffer for one batch of tagged lines */
    size_t out_cap;
    strbuf_t fbuf;      /* the same batch, untagged, for --output-filename */

    /* LOOM_AUTH_KEY (or the file LOOM_AUTH_KEY_FILE names), as the ranks
     * will read it: the store loomrun serves requires it of every client. */
    loom_settings_t auth;
} loomrun_t;
extern loomrun_t g_run;

void load_launcher_key(void);

/* util.c */
void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
void sb_add(strbuf_t *b, const char *s, size_t n);
void sb_str(strbuf_t *b, const char *s);
void sb_quote(strbuf_t *b, const char *s);
void sb_free(strbuf_t *b);
long long now_ms(void);
const char *signal_name(int sig);
int write_fd(int fd, const char *buf, size_t len);
void write_all(int fd, const char *buf, size_t len);
void out_reserve(size_t need);
void signal_rank(rank_t *rk, int sig);
void kill_all(int sig);
void reap_all(void);
void install_handlers(void);
int answer_overdue(rank_t *rk, long long now);

/* output.c */
void flush_held(rank_t *rk);
const char *last_held_line(rank_t *rk);
void close_stream(stream_t *s);
int pump(stream_t *s, int drain);
int make_dirs(const char *path);
int open_output_file(const char *dir, int rank, const char *which);

/* hosts.c */
void add_host(host_t **hosts, int *nhosts, const char *name, size_t len, int slots);
int parse_slots(const char *s, size_t len);
int is_local_host(const char *name);
int route_addr(const char *host, char *out, size_t outlen);
int own_addr(char *out, size_t outlen);
char *store_uri(const char *addr, int port);
void first_slurm_node(const char *list, char *out, size_t outlen);

/* launch.c */
void env_push(envv_t *e, char *kv);
void env_set(envv_t *e, const char *name, const char *value);
void env_unset(envv_t *e, const char *name);
void env_init(envv_t *e, int from_environ);
void env_free(envv_t *e);
int loomrun_sets(const char *kv);
int start_rank(int r, char *const argv[], char *const envp[], const char *dir);
void remote_script(strbuf_t *b, const char *wdir, int store_port, const host_t *h,
                   const envv_t *xenv, strbuf_t *secrets);
void remote_wdir(const char *wdir, strbuf_t *out);
void build_envs(const options_t *o, envv_t *env, envv_t *xenv, int warn_unset);
int start_ssh_rank(int r, const options_t *o, const envv_t *env, const envv_t *xenv,
                   const char *wdir, int port, const char *timeout_opt, double answer_s);

/* args.c */
void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void parse_args(int argc, char **argv, options_t *o);

/* main.c */
int rank_exited(int r, siginfo_t *si);
int report(int r, const siginfo_t *si);
char *format_int(int v);
/* HOROVOD_RANK, _SIZE, _LOCAL_RANK, ..., HOROVOD_HOSTNAME of a rank on host. */
void env_set_horovod(envv_t *e, int rank, int size, int lrank, int host);

/* loop.c */
typedef struct evloop {
    struct pollfd *pfd;   /* the self-pipe, then the ranks' open pipes */
    stream_t **pstream;   /* the stream of each pfd entry (NULL for the self-pipe) */
    int got_signal;       /* first terminating signal loomrun received; 0: none */
    long long kill_at;    /* when the SIGKILL follows the SIGTERM; -1: none due */
    int killed;           /* that SIGKILL was sent */
} evloop_t;
/* Rank r exited with code (128+N for signal N); its output is all printed. */
typedef void (*evloop_exit_fn)(int r, const siginfo_t *si, int code, void *arg);
void block_signals(void);
void make_jobid(char *out, size_t outlen);
void evloop_init(evloop_t *L);
/* One turn: wait up to wait_ms (-1: no limit) for output, a signal or an exit;
 * forward signals, print output, reap exited ranks through on_exit. */
void evloop_turn(evloop_t *L, int wait_ms, evloop_exit_fn on_exit, void *arg);
void evloop_fail(evloop_t *L, long long now);
void evloop_kill_due(evloop_t *L, long long now);
void end_job(evloop_t *L, int failed, loom_store_server_t *srv);
int die_of_signal(int sig);

/* elastic.c */
int elastic_main(options_t *o);

#endif
