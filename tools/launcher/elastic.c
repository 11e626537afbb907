/* loomrun --elastic. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "loomrun.h"

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

int elastic_main(options_t *o)
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
