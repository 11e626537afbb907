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


loomrun_t g_run = {.sigpipe = {-1, -1}, .tag = 1};
const int g_fwd_signals[NFWD] = { SIGINT, SIGTERM, SIGHUP };

void load_launcher_key(void)
{
    loom_err_t err;
    loom_err_clear(&err);
    if (loom_settings_load(&g_run.auth, loom_getenv_process, NULL, &err) != LOOM_SUCCESS)
        g_run.auth.auth_keylen = 0;   /* the ranks report the bad setting themselves */
}

/* ---- the job ----------------------------------------------------------------- */

/* If rank r has exited, fill *si and return 1, leaving it a zombie (see
 * kill_all). */
int rank_exited(int r, siginfo_t *si)
{
    memset(si, 0, sizeof(*si));
    while (waitid(P_PID, (id_t)g_run.ranks[r].pid, si, WEXITED | WNOHANG | WNOWAIT) < 0) {
        if (errno != EINTR)
            fatal("waitid: %s", strerror(errno));
    }
    return si->si_pid == g_run.ranks[r].pid;
}

/* Say how rank r failed, in one line, and return loomrun's exit code for it. */
int report(int r, const siginfo_t *si)
{
    rank_t *rk = &g_run.ranks[r];
    const char *host = g_run.hosts[rk->host].name;
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
    for (int h = 0; h < g_run.nhosts; h++)
        if (g_run.hosts[h].nranks > lrank) {
            cross_rank += h < host;
            cross_size++;
        }
    const struct { const char *name; int value; } v[] = {
        { "HOROVOD_RANK", rank }, { "HOROVOD_SIZE", size }, { "HOROVOD_LOCAL_RANK", lrank },
        { "HOROVOD_LOCAL_SIZE", g_run.hosts[host].nranks }, { "HOROVOD_CROSS_RANK", cross_rank },
        { "HOROVOD_CROSS_SIZE", cross_size },
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        char *s = format_int(v[i].value);
        env_set(e, v[i].name, s);
        free(s);
    }
    env_set(e, "HOROVOD_HOSTNAME", g_run.hosts[host].name);
}

/* The state of a plain (not --elastic) job. */
typedef struct job {
    options_t opt;
    int slurm;             /* inside a Slurm allocation without -H: one srun */
    int named_hosts;       /* -H or --hostfile */
    int any_remote;
    char me[256];          /* this machine's name */
    strbuf_t wdir;         /* where remote ranks run */
    char *outdir;          /* --output-filename, absolute; NULL: none */
    double answer_s;       /* how long a host may take to answer */
    int port;              /* of the store loomrun serves */
    char *local_store;     /* LOOM_STORE of the ranks on this machine */
    envv_t env, xenv;      /* of local ranks (and ssh, srun) / of remote ranks */
    int exit_code;         /* of the first rank that failed; 0: none did */
    evloop_t loop;
} job_t;

/* Where the ranks go: the hosts, -np, and each rank's host and kind. */
static void place_ranks(job_t *j)
{
    options_t *o = &j->opt;
    const char *slurm_job = getenv("SLURM_JOB_ID");
    j->slurm = o->nhosts == 0 && slurm_job != NULL && slurm_job[0] != '\0';
    j->named_hosts = o->nhosts > 0;
    strcpy(j->me, "localhost");
    if (gethostname(j->me, sizeof(j->me) - 1) != 0 || j->me[0] == '\0')
        strcpy(j->me, "localhost");
    if (j->slurm && o->np == 0) {
        const char *n = getenv("SLURM_NTASKS");
        if (n == NULL || n[0] == '\0')
            n = getenv("SLURM_NPROCS");
        if (n == NULL || (o->np = parse_slots(n, strlen(n))) < 0)
            usage_error("-np N is required (SLURM_NTASKS is not set)");
    }
    if (!j->named_hosts) {
        if (o->np == 0)
            usage_error("-np N is required (or -H/--hostfile)");
        add_host(&o->hosts, &o->nhosts, j->me, strlen(j->me), o->np);
    }
    long total = 0;
    for (int h = 0; h < o->nhosts; h++)
        total += o->hosts[h].slots;
    if (o->np == 0)
        o->np = total > INT_MAX / 2 ? INT_MAX / 2 : (int)total;
    if (!j->slurm && o->np > total)
        usage_error("-np %d is more than the %ld slots of the hosts", o->np, total);
    for (int h = 0; h < o->nhosts; h++) {
        o->hosts[h].local = !j->named_hosts || is_local_host(o->hosts[h].name);
        j->any_remote |= !o->hosts[h].local;
    }
    g_run.hosts = o->hosts;
    g_run.nhosts = o->nhosts;
    g_run.np = j->slurm ? 1 : o->np;
    g_run.ranks = xrealloc(NULL, (size_t)g_run.np * sizeof(rank_t));
    memset(g_run.ranks, 0, (size_t)g_run.np * sizeof(rank_t));
    for (int r = 0, h = 0; r < g_run.np; r++) {
        rank_t *rk = &g_run.ranks[r];
        while (!j->slurm && g_run.hosts[h].nranks == g_run.hosts[h].slots)
            h++;
        rk->host = h;
        g_run.hosts[h].nranks++;
        rk->kind = j->slurm ? RANK_SRUN : g_run.hosts[h].local ? RANK_LOCAL : RANK_SSH;
        rk->out.fd = rk->err.fd = rk->out.file = rk->err.file = rk->ctl = -1;
        rk->answer_by = -1;
    }
}

/* --output-filename is taken relative to where loomrun runs; and how long a
 * host may take to answer: ssh's ConnectTimeout and our own deadline for the
 * remote script to start the program. */
static void prepare_paths(job_t *j)
{
    remote_wdir(j->opt.wdir, &j->wdir);
    if (j->opt.output_dir != NULL) {
        if (make_dirs(j->opt.output_dir) != 0)
            fatal("--output-filename: cannot create %s: %s", j->opt.output_dir, strerror(errno));
        j->outdir = realpath(j->opt.output_dir, NULL);
        if (j->outdir == NULL)
            fatal("--output-filename: %s: %s", j->opt.output_dir, strerror(errno));
    }
    j->answer_s = j->opt.timeout_s;
    if (j->answer_s <= 0) {
        const char *t = getenv("LOOM_TIMEOUT");
        char *end;
        j->answer_s = t != NULL ? strtod(t, &end) : 0;
        if (t == NULL || end == t || *end != '\0' || !(j->answer_s > 0) || j->answer_s > 1e7)
            j->answer_s = DEFAULT_ANSWER_S;
    }
}

/* Each host gets the store at the address of ours that routes to it. Local
 * ranks listen on the interface of their store connection, so with remote
 * hosts they need an address those hosts reach, not 127.0.0.1. */
static void assign_stores(job_t *j)
{
    char addr[NI_MAXHOST];
    for (int h = 0; h < g_run.nhosts; h++) {
        if (g_run.hosts[h].local || g_run.hosts[h].nranks == 0)
            continue;
        if (route_addr(g_run.hosts[h].name, addr, sizeof(addr)) == 0) {
            g_run.hosts[h].store = store_uri(addr, j->port);
            if (j->local_store == NULL)
                j->local_store = xstrdup(g_run.hosts[h].store);
        }
    }
    if (j->slurm) {
        const char *nodes = getenv("SLURM_JOB_NODELIST");
        if (nodes == NULL || nodes[0] == '\0')
            nodes = getenv("SLURM_NODELIST");
        char node[256] = "";
        if (nodes != NULL)
            first_slurm_node(nodes, node, sizeof(node));
        if ((node[0] != '\0' && route_addr(node, addr, sizeof(addr)) == 0) ||
            own_addr(addr, sizeof(addr)) == 0)
            j->local_store = store_uri(addr, j->port);
        else
            j->local_store = store_uri(j->me, j->port);
    } else if (j->any_remote && j->local_store == NULL) {
        if (own_addr(addr, sizeof(addr)) == 0) {
            j->local_store = store_uri(addr, j->port);
        } else {
            j->local_store = store_uri("127.0.0.1", j->port);
            for (int r = 0; r < g_run.np; r++) {
                if (g_run.ranks[r].kind == RANK_LOCAL) {
                    fprintf(stderr, "loomrun: warning: no address of this machine found that "
                            "the remote hosts reach; local ranks use 127.0.0.1 (set "
                            "LOOM_SOCKET_IFNAME)\n");
                    break;
                }
            }
        }
    } else if (j->local_store == NULL) {
        j->local_store = store_uri("127.0.0.1", j->port);
    }
    for (int h = 0; h < g_run.nhosts; h++)
        if (g_run.hosts[h].local)
            g_run.hosts[h].store = xstrdup(j->local_store);
}

/* The whole job is `srun --ntasks=N ... prog args`, rank 0 of ours. */
static void start_srun(job_t *j, const char *size_s)
{
    /* srun numbers the tasks; variables of an enclosing launcher would take
     * precedence over SLURM_PROCID in loom_init. */
    static const char *const stale[] = { "LOOM_RANK", "LOOM_SIZE", "LOOM_LOCAL_RANK",
                                         "LOOM_LOCAL_SIZE", "RANK", "WORLD_SIZE",
                                         "LOCAL_RANK", "LOCAL_WORLD_SIZE" };
    for (size_t i = 0; i < sizeof(stale) / sizeof(stale[0]); i++)
        env_unset(&j->env, stale[i]);
    env_set(&j->env, "LOOM_STORE", j->local_store);
    strbuf_t ntasks = { 0 }, so = { 0 }, se = { 0 }, chdir_opt = { 0 };
    char *sargv[16 + 1];
    int k = 0;
    sargv[k++] = "srun";
    sb_str(&ntasks, "--ntasks=");
    sb_str(&ntasks, size_s);
    sargv[k++] = ntasks.p;
    sargv[k++] = "--kill-on-bad-exit=1";
    if (j->opt.wdir != NULL) {
        sb_str(&chdir_opt, "--chdir=");
        sb_str(&chdir_opt, j->opt.wdir);
        sargv[k++] = chdir_opt.p;
    }
    if (j->outdir != NULL) {
        /* srun writes the files itself (%t: the task's rank); its console
         * output then holds only what srun says. */
        for (int r = 0; r < j->opt.np; r++)
            open_output_file(j->outdir, r, NULL);
        sb_str(&so, "--output=");
        sb_str(&so, j->outdir);
        sb_str(&so, "/rank.%t/stdout");
        sb_str(&se, "--error=");
        sb_str(&se, j->outdir);
        sb_str(&se, "/rank.%t/stderr");
        sargv[k++] = so.p;
        sargv[k++] = se.p;
    }
    int nargs = 0;
    while (j->opt.argv[nargs] != NULL)
        nargs++;
    char **full = xrealloc(NULL, (size_t)(k + nargs + 1) * sizeof(char *));
    memcpy(full, sargv, (size_t)k * sizeof(char *));
    memcpy(full + k, j->opt.argv, (size_t)(nargs + 1) * sizeof(char *));
    if (start_rank(0, full, j->env.v, NULL) < 0)
        fatal("cannot start srun: %s", strerror(errno));
    free(full);
    sb_free(&ntasks);
    sb_free(&so);
    sb_free(&se);
    sb_free(&chdir_opt);
}

/* Fork the local ranks and ssh to the remote ones, in rank order. */
static void start_ranks(job_t *j, const char *size_s)
{
    env_set(&j->env, "LOOM_SIZE", size_s);
    env_set(&j->xenv, "LOOM_SIZE", size_s);
    char timeout_opt[64];
    snprintf(timeout_opt, sizeof(timeout_opt), "ConnectTimeout=%d",
             j->answer_s >= INT_MAX - 1 ? INT_MAX - 1
                                        : (int)j->answer_s + (j->answer_s > (int)j->answer_s));
    int *placed = xrealloc(NULL, (size_t)g_run.nhosts * sizeof(int));
    memset(placed, 0, (size_t)g_run.nhosts * sizeof(int));
    for (int r = 0; r < g_run.np; r++) {
        rank_t *rk = &g_run.ranks[r];
        host_t *h = &g_run.hosts[rk->host];
        int lrank = placed[rk->host]++;
        char *rank_s = format_int(r), *lrank_s = format_int(lrank),
             *lsize_s = format_int(h->nranks);
        if (j->outdir != NULL) {
            rk->out.file = open_output_file(j->outdir, r, "stdout");
            rk->err.file = open_output_file(j->outdir, r, "stderr");
        }
        /* Remote ranks always get LOOM_HOST_ID; local ones with named hosts. */
        envv_t *e = rk->kind == RANK_LOCAL ? &j->env : &j->xenv;
        env_set(e, "LOOM_RANK", rank_s);
        env_set(e, "LOOM_LOCAL_RANK", lrank_s);
        env_set(e, "LOOM_LOCAL_SIZE", lsize_s);
        if (rk->kind == RANK_LOCAL)
            env_set(e, "LOOM_STORE", h->store);
        if (rk->kind != RANK_LOCAL || j->named_hosts)
            env_set(e, "LOOM_HOST_ID", h->name);
        env_set_horovod(e, r, g_run.np, lrank, rk->host);
        int rc;
        if (rk->kind == RANK_LOCAL) {
            rc = start_rank(r, j->opt.argv, j->env.v, j->opt.wdir);
        } else {
            if (h->store != NULL)
                env_set(e, "LOOM_STORE", h->store);
            else
                env_unset(e, "LOOM_STORE");
            rc = start_ssh_rank(r, &j->opt, &j->env, &j->xenv, j->wdir.p, j->port, timeout_opt,
                                j->answer_s);
        }
        if (rc < 0)
            fatal("cannot start rank %d: %s", r, strerror(errno));
        free(rank_s);
        free(lrank_s);
        free(lsize_s);
    }
    free(placed);
}

/* A rank exited: only the first failure is the cause; ranks ending because
 * we (or the user, through us) signalled them are not. */
static void plain_exit(int r, const siginfo_t *si, int code, void *arg)
{
    job_t *j = arg;
    if (code != 0 && j->exit_code == 0 && !j->loop.got_signal) {
        j->exit_code = report(r, si);
        evloop_fail(&j->loop, now_ms());
    }
}

/* How long the next turn may wait: until the next host must have answered
 * or the SIGKILL is due; -1: no deadline. */
static int plain_wait_ms(const job_t *j)
{
    long long wake = -1;
    for (int r = 0; r < g_run.np; r++)
        if (g_run.ranks[r].running && g_run.ranks[r].answer_by >= 0 &&
            (wake < 0 || g_run.ranks[r].answer_by < wake))
            wake = g_run.ranks[r].answer_by;
    if (j->loop.kill_at >= 0 && !j->loop.killed && (wake < 0 || j->loop.kill_at < wake))
        wake = j->loop.kill_at;
    if (wake < 0)
        return -1;
    long long left = wake - now_ms();
    return left > 0 ? (left > INT_MAX ? INT_MAX : (int)left) : 0;
}

/* Remote ranks whose host did not answer in time fail the job. */
static void check_answers(job_t *j, long long now)
{
    for (int r = 0; r < g_run.np; r++) {
        rank_t *rk = &g_run.ranks[r];
        if (!answer_overdue(rk, now))
            continue;
        if (j->exit_code == 0 && !j->loop.got_signal) {
            fprintf(stderr, "loomrun: cannot reach host %s: no answer within %g s\n",
                    g_run.hosts[rk->host].name, j->answer_s);
            j->exit_code = EXIT_UNREACHABLE;
            evloop_fail(&j->loop, now);
        }
    }
}

int main(int argc, char **argv)
{
    job_t j;
    memset(&j, 0, sizeof(j));
    parse_args(argc, argv, &j.opt);
    if (j.opt.elastic)
        return elastic_main(&j.opt);
    place_ranks(&j);
    prepare_paths(&j);
    block_signals();

    /* Remote ranks (and srun's, on other nodes) reach the store over the
     * network; local-only jobs keep it on loopback. */
    loom_err_t err;
    loom_err_clear(&err);
    loom_store_server_t *srv = NULL;
    load_launcher_key();
    if (loom_store_server_start_auth(j.any_remote || j.slurm ? NULL : "127.0.0.1", 0,
                                     g_run.auth.auth_key, g_run.auth.auth_keylen, &err,
                                     &srv) != LOOM_SUCCESS)
        fatal("cannot start the rendezvous store: %s", err.msg);
    j.port = loom_store_server_port(srv);
    assign_stores(&j);

    char jobid[64];
    make_jobid(jobid, sizeof(jobid));
    char *size_s = format_int(j.opt.np);
    build_envs(&j.opt, &j.env, &j.xenv, 1);
    if (j.opt.timeout != NULL) {
        env_set(&j.env, "LOOM_TIMEOUT", j.opt.timeout);
        env_set(&j.xenv, "LOOM_TIMEOUT", j.opt.timeout);
    }
    env_set(&j.env, "LOOM_JOB_ID", jobid);
    env_set(&j.xenv, "LOOM_JOB_ID", jobid);
    if (j.slurm)
        start_srun(&j, size_s);
    else
        start_ranks(&j, size_s);
    env_free(&j.env);
    env_free(&j.xenv);
    free(j.opt.xvars);
    free(size_s);
    free(j.local_store);
    sb_free(&j.wdir);
    sigprocmask(SIG_SETMASK, &g_run.orig_mask, NULL);

    evloop_init(&j.loop);
    while (g_run.nrunning > 0) {
        evloop_turn(&j.loop, plain_wait_ms(&j), plain_exit, &j);
        long long now = now_ms();
        check_answers(&j, now);
        evloop_kill_due(&j.loop, now);
    }
    end_job(&j.loop, j.exit_code != 0 || j.loop.got_signal, srv);
    free(j.outdir);
    if (j.exit_code != 0)
        return j.exit_code;
    if (j.loop.got_signal)
        return die_of_signal(j.loop.got_signal);
    return 0;
}
