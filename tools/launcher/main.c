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

#include "loomrun.h"


/* LOOM_AUTH_KEY (or the file LOOM_AUTH_KEY_FILE names), as the ranks will read
 * it: the store loomrun serves requires it of every client. */
loom_settings_t g_auth;

void load_launcher_key(void)
{
    loom_err_t err;
    loom_err_clear(&err);
    if (loom_settings_load(&g_auth, loom_getenv_process, NULL, &err) != LOOM_SUCCESS)
        g_auth.auth_keylen = 0;   /* the ranks report the bad setting themselves */
}


/* The job, global so the fatal path can still end the ranks. */
rank_t *g_ranks;
int g_np;
int g_nrunning;
host_t *g_hosts;
int g_nhosts;

int g_sigpipe[2] = { -1, -1 };
const int g_fwd_signals[NFWD] = { SIGINT, SIGTERM, SIGHUP };
/* Dispositions loomrun started with: a signal ignored on entry (nohup, a
 * background job of a non-interactive shell) stays ignored, for us and for
 * the ranks. */
struct sigaction g_orig_act[NFWD];
struct sigaction g_orig_chld, g_orig_pipe;
sigset_t g_orig_mask;

/* Set when a write to our stdout/stderr failed for good (EPIPE...): further
 * output for it is dropped instead of retried. */
int g_dest_dead[3];

int g_tag = 1;    /* --tag-output (the default) / --no-tag-output */
char *g_out;      /* assembly buffer for one batch of tagged lines */
size_t g_out_cap;
strbuf_t g_fbuf;  /* the same batch, untagged, for --output-filename */

/* ---- the job ----------------------------------------------------------------- */

/* If rank r has exited, fill *si and return 1, leaving it a zombie (see
 * kill_all). */
int rank_exited(int r, siginfo_t *si)
{
    memset(si, 0, sizeof(*si));
    while (waitid(P_PID, (id_t)g_ranks[r].pid, si, WEXITED | WNOHANG | WNOWAIT) < 0) {
        if (errno != EINTR)
            fatal("waitid: %s", strerror(errno));
    }
    return si->si_pid == g_ranks[r].pid;
}

/* Say how rank r failed, in one line, and return loomrun's exit code for it. */
int report(int r, const siginfo_t *si)
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

char *format_int(int v)
{
    char buf[24];
    snprintf(buf, sizeof(buf), "%d", v);
    return xstrdup(buf);
}

/* The variables Horovod's launchers set, so that Horovod scripts (and its
 * tests) reading them agree with what loom_init reports. Horovod's cross rank
 * numbers the hosts that have a rank with this local rank. */
void env_set_horovod(envv_t *e, int rank, int size, int lrank, int host)
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
