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
    int unanswered;        /* its host did not answer in time: killed, reported */
    long long kill_at;     /* SIGKILL after the SIGTERM, -1: none due */
    int code;              /* exit code once exited, -1 before */
    int was_member;        /* of an epoch loomrun has seen: never a newcomer again */
} eproc_t;

static ehost_t *g_eh;
static eproc_t *g_ep;

/* Hosts the discovery script lists now, marked present (added when new). */
static int discover(const options_t *o, int slots_dflt)
{
    for (int h = 0; h < g_run.nhosts; h++)
        g_eh[h].present = 0;
    if (o->discovery == NULL) {
        for (int h = 0; h < g_run.nhosts; h++)
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
        int before = g_run.nhosts, h;
        for (h = 0; h < g_run.nhosts && strcmp(g_run.hosts[h].name, p) != 0; h++)
            ;
        if (h == g_run.nhosts) {
            add_host(&g_run.hosts, &g_run.nhosts, p, strlen(p), slots);
            g_eh = xrealloc(g_eh, (size_t)g_run.nhosts * sizeof(ehost_t));
            memset(&g_eh[before], 0, sizeof(ehost_t));
            g_run.hosts[h].local = is_local_host(p);
        } else {
            g_run.hosts[h].slots = slots;
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
    for (int r = 0; r < g_run.np; r++)
        n += g_run.ranks[r].running && g_run.ranks[r].host == h && !g_ep[r].removed;
    return n;
}

static int live_ranks(void)
{
    int n = 0;
    for (int r = 0; r < g_run.np; r++)
        n += g_run.ranks[r].running && !g_ep[r].removed;
    return n;
}

/* The state of an elastic job. */
typedef struct ejob {
    options_t *o;
    int slots_dflt;        /* of a host the script lists without a count */
    int np0, min_np, max_np;
    double answer_s, etimeout_s, cooldown_s, interval_s;
    int bl_failures;
    strbuf_t wdir;         /* where remote ranks run */
    int port;              /* of the store loomrun serves */
    loom_store_server_t *srv;
    loom_store_t *store;   /* loomrun's client of it */
    char *local_store;     /* LOOM_STORE of the ranks on this machine */
    char base[128];        /* loom/<job>/elastic */
    envv_t env, xenv;      /* of local ranks (and ssh) / of remote ranks */
    int exit_code, finishing, changes, nfailed, nremoved, nstarted0;
    int joining_published;  /* the last count of <base>/joining, -1: none yet */
    /* What the store said of the ranks' epochs: read once per turn of the
     * loop; the members only when the epoch changed (a signed list). */
    long long epoch;        /* -1: none formed yet */
    long long *members;
    int nmembers;           /* of epoch; -1: not read */
    long long below_since, next_discovery;
    evloop_t loop;
} ejob_t;

/* Start one process on host h; its id is its index in g_run.ranks. */
static int elastic_start(ejob_t *j, int h, int want)
{
    int r = g_run.np;
    /* The rank and size it will have in the epoch it joins (survivors come
     * first, newcomers in start order), as Horovod's launcher tells its ranks. */
    int expected_rank = live_ranks(), local_rank = running_on(h);
    g_run.ranks = xrealloc(g_run.ranks, (size_t)(r + 1) * sizeof(rank_t));
    g_ep = xrealloc(g_ep, (size_t)(r + 1) * sizeof(eproc_t));
    rank_t *rk = &g_run.ranks[r];
    memset(rk, 0, sizeof(*rk));
    rk->host = h;
    rk->kind = g_run.hosts[h].local ? RANK_LOCAL : RANK_SSH;
    rk->out.fd = rk->err.fd = rk->out.file = rk->err.file = rk->ctl = -1;
    rk->answer_by = -1;
    g_ep[r] = (eproc_t){ .kill_at = -1, .code = -1 };
    g_run.np++;
    char *id_s = format_int(r), *rank_s = format_int(r % j->np0);
    envv_t *e = rk->kind == RANK_LOCAL ? &j->env : &j->xenv;
    env_set(e, "LOOM_ELASTIC_ID", id_s);
    env_set(e, "LOOM_RANK", rank_s);
    env_set(e, "LOOM_HOST_ID", g_run.hosts[h].name);
    env_set_horovod(e, expected_rank, want, local_rank, h);
    if (g_run.hosts[h].store != NULL)
        env_set(e, "LOOM_STORE", g_run.hosts[h].store);
    else
        env_unset(e, "LOOM_STORE");
    free(id_s);
    free(rank_s);
    sigset_t block, old;
    sigfillset(&block);
    sigprocmask(SIG_BLOCK, &block, &old);
    int rc;
    if (rk->kind == RANK_LOCAL) {
        rc = start_rank(r, j->o->argv, j->env.v, j->o->wdir);
    } else {
        char timeout_opt[64];
        snprintf(timeout_opt, sizeof(timeout_opt), "ConnectTimeout=%d", (int)j->answer_s + 1);
        rc = start_ssh_rank(r, j->o, &j->env, &j->xenv, j->wdir.p, j->port, timeout_opt,
                            j->answer_s);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (rc < 0) {
        fprintf(stderr, "loomrun: cannot start a rank on %s: %s\n", g_run.hosts[h].name,
                strerror(errno));
        g_run.np--;
        return -1;
    }
    g_run.hosts[h].nranks++;
    return 0;
}

/* Start processes on free, usable slots until the job has want live ranks. */
static int fill_slots(ejob_t *j, int want)
{
    int started = 0;
    long long room = live_ranks();
    for (int h = 0; h < g_run.nhosts; h++)
        if (g_eh[h].present && g_eh[h].banned_until <= now_ms())
            room += g_run.hosts[h].slots - running_on(h);
    if (room < want)
        want = (int)room;
    long long now = now_ms();
    for (int h = 0; h < g_run.nhosts && live_ranks() < want; h++) {
        if (!g_eh[h].present)
            continue;
        if (g_eh[h].banned_until > now)
            continue;
        if (g_eh[h].banned_until > 0) {
            fprintf(stderr, "loomrun: host %s leaves the blacklist\n", g_run.hosts[h].name);
            g_eh[h].banned_until = 0;
            g_eh[h].failures = 0;
        }
        while (running_on(h) < g_run.hosts[h].slots && live_ranks() < want) {
            if (elastic_start(j, h, want) < 0)
                break;
            started++;
        }
    }
    return started;
}

/* The latest epoch the ranks formed (0: the first; each reset adds one); -1
 * before the first. */
static long long current_epoch(loom_store_t *st, const char *base)
{
    char key[300];
    void *val = NULL;
    size_t len;
    int found = 0;
    loom_err_t err;
    loom_err_clear(&err);
    snprintf(key, sizeof(key), "%s/epoch", base);
    if (loom_store_try_get(st, key, &val, &len, &found, &err) != LOOM_SUCCESS || !found)
        return -1;
    long long epoch = strtoll(val, NULL, 10);
    free(val);
    return epoch;
}

/* ids of the members of an epoch, from the store; -1 when there is none. */
static int read_members(loom_store_t *st, const char *base, long long epoch, long long **ids_p)
{
    char key[300];
    void *val = NULL;
    size_t len;
    loom_err_t err;
    loom_err_clear(&err);
    if (epoch < 0)
        return -1;
    snprintf(key, sizeof(key), "%s/e%lld/members", base, epoch);
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

/* The hosts (from the script, -H/--hostfile, or -np here) and the limits. */
static void elastic_hosts(ejob_t *j)
{
    options_t *o = j->o;
    char me[256] = "localhost";
    if (gethostname(me, sizeof(me) - 1) != 0 || me[0] == '\0')
        strcpy(me, "localhost");
    j->slots_dflt = o->slots_per_host > 0 ? o->slots_per_host : 1;
    /* Without a script the hosts are fixed: -H/--hostfile, or -np here. */
    if (o->discovery == NULL && o->nhosts == 0) {
        if (o->np == 0 && o->max_np == 0)
            usage_error("--elastic needs --host-discovery-script, -H/--hostfile or -np");
        if (o->max_np == EVERY_SLOT)
            usage_error("--max-np all needs hosts whose slots it fills: -H/--hostfile or "
                        "--host-discovery-script");
        add_host(&o->hosts, &o->nhosts, me, strlen(me),
                 o->max_np > o->np ? o->max_np : o->np);
    }
    g_run.hosts = o->hosts;
    g_run.nhosts = o->nhosts;
    g_eh = xrealloc(NULL, (size_t)(g_run.nhosts + 1) * sizeof(ehost_t));
    memset(g_eh, 0, (size_t)(g_run.nhosts + 1) * sizeof(ehost_t));
    for (int h = 0; h < g_run.nhosts; h++)
        g_run.hosts[h].local = is_local_host(g_run.hosts[h].name);
    if (discover(o, j->slots_dflt) < 0)
        fatal("cannot run the discovery script %s: %s", o->discovery, strerror(errno));
    long total = 0;
    for (int h = 0; h < g_run.nhosts; h++)
        total += g_eh[h].present ? g_run.hosts[h].slots : 0;
    j->min_np = o->min_np > 0 ? o->min_np : 1;
    j->max_np = o->max_np > 0 ? o->max_np : o->np > 0 ? o->np : EVERY_SLOT;
    /* As Horovod: with --max-np, every slot there is (up to it) from the start. */
    j->np0 = o->np > 0 ? o->np : (int)(total < j->max_np ? total : j->max_np);
    if (o->max_np > 0 && total > j->np0)
        j->np0 = (int)(total < j->max_np ? total : j->max_np);
    if (j->np0 > j->max_np)
        usage_error("-np %d is more than --max-np %d", j->np0, j->max_np);
    if (j->np0 > total)
        fatal("-np %d is more than the %ld slot(s) the hosts have now", j->np0, total);
    if (j->np0 < j->min_np || total < j->min_np)
        fatal("the hosts have %ld slot(s), fewer than --min-np %d", total, j->min_np);
    j->answer_s = o->timeout_s > 0 ? o->timeout_s : DEFAULT_ANSWER_S;
    j->etimeout_s = o->elastic_timeout_s > 0 ? o->elastic_timeout_s
                    : o->timeout_s > 0 ? o->timeout_s : 600;
    j->cooldown_s = o->blacklist_cooldown_s > 0 ? o->blacklist_cooldown_s : 60;
    j->bl_failures = o->blacklist_failures > 0 ? o->blacklist_failures : 1;
    j->interval_s = o->discovery_interval_s > 0 ? o->discovery_interval_s : 1;
}

/* Serve the store, and open loomrun's own client of it. */
static void elastic_store(ejob_t *j)
{
    /* Hosts may appear later, so with a script the store listens everywhere. */
    int any_remote = j->o->discovery != NULL;
    for (int h = 0; h < g_run.nhosts; h++)
        any_remote |= !g_run.hosts[h].local;
    loom_err_t err;
    loom_err_clear(&err);
    load_launcher_key();
    if (loom_store_server_start_auth(any_remote ? NULL : "127.0.0.1", 0, g_run.auth.auth_key,
                                     g_run.auth.auth_keylen, &err, &j->srv) != LOOM_SUCCESS)
        fatal("cannot start the rendezvous store: %s", err.msg);
    j->port = loom_store_server_port(j->srv);
    char addr[NI_MAXHOST];
    int only_local = 1;
    for (int h = 0; h < g_run.nhosts; h++)
        only_local &= g_run.hosts[h].local;
    /* Local ranks talk to remote ones through the address of this machine
     * (all of them are local in the tests, which keeps them on loopback). */
    j->local_store = !only_local && own_addr(addr, sizeof(addr)) == 0
                         ? store_uri(addr, j->port) : store_uri("127.0.0.1", j->port);
    char *client_uri = store_uri("127.0.0.1", j->port);
    if (loom_store_open_key(client_uri, -1, 30, g_run.auth.auth_key, g_run.auth.auth_keylen, &err,
                            &j->store) != LOOM_SUCCESS)
        fatal("cannot reach the store loomrun serves: %s", err.msg);
    free(client_uri);
}

/* The environments, with what every process of the job shares. */
static void elastic_envs(ejob_t *j)
{
    char jobid[64];
    make_jobid(jobid, sizeof(jobid));
    snprintf(j->base, sizeof(j->base), "loom/%s/elastic", jobid);
    build_envs(j->o, &j->env, &j->xenv, 0);
    char *np_s = format_int(j->np0), *min_s = format_int(j->min_np);
    envv_t *both[2] = { &j->env, &j->xenv };
    for (int i = 0; i < 2; i++) {
        if (j->o->timeout != NULL)
            env_set(both[i], "LOOM_TIMEOUT", j->o->timeout);
        if (j->o->elastic_timeout != NULL)
            env_set(both[i], "LOOM_ELASTIC_TIMEOUT", j->o->elastic_timeout);
        env_set(both[i], "LOOM_JOB_ID", jobid);
        env_set(both[i], "LOOM_SIZE", np_s);
        env_set(both[i], "LOOM_ELASTIC", "1");
        env_set(both[i], "LOOM_ELASTIC_MIN_NP", min_s);
        env_unset(both[i], "LOOM_LOCAL_RANK");
        env_unset(both[i], "LOOM_LOCAL_SIZE");
    }
    free(np_s);
    free(min_s);
}

/* The store address of each host that has none yet. */
static void elastic_host_stores(ejob_t *j, int present_only)
{
    char addr[NI_MAXHOST];
    for (int h = 0; h < g_run.nhosts; h++) {
        if (g_run.hosts[h].store != NULL || (present_only && !g_eh[h].present))
            continue;
        if (g_run.hosts[h].local)
            g_run.hosts[h].store = xstrdup(j->local_store);
        else if (route_addr(g_run.hosts[h].name, addr, sizeof(addr)) == 0)
            g_run.hosts[h].store = store_uri(addr, j->port);
    }
}

/* Its ranks leave a host that left or failed (SIGTERM, then SIGKILL after
 * the grace), as Horovod's driver drops a host with its ranks. */
static void leave_host(ejob_t *j, int h, const char *why)
{
    long long now = now_ms();
    for (int r = 0; r < g_run.np; r++) {
        if (!g_run.ranks[r].running || g_ep[r].removed || g_run.ranks[r].host != h)
            continue;
        fprintf(stderr, "loomrun: host %s %s: stopping rank %d\n", g_run.hosts[h].name, why, r);
        g_ep[r].removed = 1;
        g_ep[r].kill_at = now + GRACE_MS;
        signal_rank(&g_run.ranks[r], SIGTERM);
        j->nremoved++;
        j->changes++;
    }
}

/* A process exited: its id is dead for every later round, whatever the
 * reason; a 0 means the job is finishing; a failure counts against its host. */
static void elastic_exit(int r, const siginfo_t *si, int code, void *arg)
{
    ejob_t *j = arg;
    rank_t *rk = &g_run.ranks[r];
    g_ep[r].code = code;
    char key[200];
    loom_err_t err;
    snprintf(key, sizeof(key), "%s/dead/%d", j->base, r);
    loom_err_clear(&err);
    if (loom_store_set(j->store, key, "1", 1, &err) != LOOM_SUCCESS)
        fprintf(stderr, "loomrun: store: %s\n", err.msg);
    if (code == 0 && !j->finishing) {
        j->finishing = 1;
        snprintf(key, sizeof(key), "%s/finished", j->base);
        loom_store_set(j->store, key, "1", 1, &err);
    } else if (code != 0 && g_ep[r].removed) {
        fprintf(stderr, "loomrun: rank %d left with host %s\n", r, g_run.hosts[rk->host].name);
    } else if (code != 0 && !j->finishing && !j->loop.got_signal && !j->exit_code) {
        if (!g_ep[r].unanswered)
            report(r, si);   /* with ssh's own reason when the host was not reached */
        j->nfailed++;
        j->changes++;
        ehost_t *eh = &g_eh[rk->host];
        if (++eh->failures >= j->bl_failures && eh->banned_until == 0) {
            eh->banned_until = now_ms() + (long long)(j->cooldown_s * 1000);
            fprintf(stderr, "loomrun: host %s blacklisted for %g s after %d failure(s)\n",
                    g_run.hosts[rk->host].name, j->cooldown_s, eh->failures);
            leave_host(j, rk->host, "is blacklisted");
        }
    }
}

/* The latest epoch and its members, as the store says now. */
static void read_epoch(ejob_t *j)
{
    long long epoch = current_epoch(j->store, j->base);
    if (epoch >= 0 && (epoch != j->epoch || j->nmembers < 0)) {
        free(j->members);
        j->members = NULL;
        j->nmembers = read_members(j->store, j->base, epoch, &j->members);
        for (int i = 0; i < j->nmembers; i++)
            if (j->members[i] >= 0 && j->members[i] < g_run.np)
                g_ep[j->members[i]].was_member = 1;
    }
    j->epoch = epoch;
}

/* As Horovod counts them: resets, the epochs the ranks formed after the first
 * (one reset takes in every change that happened meanwhile). */
static void reset_limit_check(ejob_t *j)
{
    if (j->o->reset_limit < 0 || j->exit_code)
        return;
    long long resets = j->epoch;
    if (resets > j->o->reset_limit) {
        fprintf(stderr, "loomrun: elastic job failed: %lld reset(s) exceed --reset-limit %d\n",
                resets, j->o->reset_limit);
        j->exit_code = 1;
    }
}

/* Whether every member of the latest epoch has exited, one of them failing:
 * processes still waiting to join then have no one to take the state from. */
static int members_all_failed(const ejob_t *j)
{
    if (j->epoch < 0 || j->nmembers <= 0)
        return 0;
    int failed = 0;
    for (int i = 0; i < j->nmembers; i++) {
        long long id = j->members[i];
        if (id < 0 || id >= g_run.np || g_run.ranks[id].running)
            return 0;
        failed += g_ep[id].code != 0;
    }
    return failed > 0;
}

/* Whether the job can go on: the reset limit, a member left to carry the
 * state, and not below --min-np for too long (or for good). A failed job
 * starts ending. */
static void elastic_health(ejob_t *j, long long now)
{
    reset_limit_check(j);
    if (!j->exit_code && live_ranks() > 0 && members_all_failed(j)) {
        read_epoch(j);   /* not an epoch that formed since this turn began */
        if (members_all_failed(j)) {
            fprintf(stderr, "loomrun: elastic job failed: every member of epoch %lld exited "
                    "and one failed; the %d process(es) waiting to join have no one to take "
                    "the state from\n", j->epoch, live_ranks());
            j->exit_code = 1;
        }
    }
    int live = live_ranks();
    int usable = 0;
    for (int h = 0; h < g_run.nhosts; h++)
        usable += g_eh[h].present && g_eh[h].banned_until <= now;
    if (live >= j->min_np) {
        j->below_since = -1;
    } else if (live == 0 && usable == 0 && j->nfailed > 0) {
        /* Every rank failed and took its host with it: a program that fails
         * everywhere (a bad argument, say) fails the job now, not after the
         * blacklist cooldown. */
        fprintf(stderr, "loomrun: elastic job failed: every rank failed and every host is "
                "blacklisted (--blacklist-cooldown %g s)\n", j->cooldown_s);
        j->exit_code = 1;
    } else if (j->below_since < 0) {
        j->below_since = now;
        fprintf(stderr, "loomrun: %d rank(s) left, below --min-np %d; waiting up to "
                "%g s for hosts\n", live, j->min_np, j->etimeout_s);
    } else if (now - j->below_since > (long long)(j->etimeout_s * 1000)) {
        fprintf(stderr, "loomrun: elastic job failed: %d rank(s) running, below "
                "--min-np %d for %g s (--elastic-timeout)\n", live, j->min_np, j->etimeout_s);
        j->exit_code = 1;
    }
    if (j->exit_code)
        evloop_fail(&j->loop, now);
}

/* Run the discovery script: stop the ranks of hosts that left, fill the free
 * slots of the present ones. */
static void elastic_rediscover(ejob_t *j, long long now)
{
    j->next_discovery = now + (long long)(j->interval_s * 1000);
    if (discover(j->o, j->slots_dflt) < 0)
        return;
    for (int h = 0; h < g_run.nhosts; h++)
        if (!g_eh[h].present)
            leave_host(j, h, "left");
    elastic_host_stores(j, 1);
    int added = fill_slots(j, j->max_np);
    if (added > 0) {
        fprintf(stderr, "loomrun: %d new rank(s) started; they join at the next "
                "commit point\n", added);
        j->changes += added;
    }
}

/* A host that has not started its rank within the answer time (a hung
 * login, say) counts as that rank's failure: the ssh client is killed and
 * the host earns a strike towards the blacklist, as a crash would. */
static void elastic_check_answers(ejob_t *j, long long now)
{
    for (int r = 0; r < g_run.np; r++) {
        rank_t *rk = &g_run.ranks[r];
        if (!answer_overdue(rk, now))
            continue;
        g_ep[r].unanswered = 1;
        fprintf(stderr, "loomrun: cannot reach host %s: no answer within %g s; rank %d "
                "given up\n", g_run.hosts[rk->host].name, j->answer_s, r);
        signal_rank(rk, SIGKILL);
    }
}

/* Tell the members how many processes are on their way to join (started,
 * alive, in no epoch yet: a rank left out of an epoch is stale, not joining):
 * the members wait for them at their next commit point, so one reset takes
 * them in together. */
static void publish_joining(ejob_t *j)
{
    int joining = 0;
    for (int r = 0; r < g_run.np; r++)
        joining += g_run.ranks[r].running && !g_ep[r].removed && !g_ep[r].was_member;
    if (j->nmembers > 0 && joining != j->joining_published) {
        char key[300], val[24];
        snprintf(key, sizeof(key), "%s/joining", j->base);
        snprintf(val, sizeof(val), "%d", joining);
        loom_err_t err;
        loom_err_clear(&err);
        if (loom_store_set(j->store, key, val, strlen(val), &err) == LOOM_SUCCESS)
            j->joining_published = joining;
    }
}

/* The job runs until every process is gone once it finishes or fails. */
static void elastic_loop(ejob_t *j)
{
    evloop_init(&j->loop);
    j->below_since = -1;
    j->next_discovery = now_ms() + (long long)(j->interval_s * 1000);
    while (g_run.nrunning > 0 || (!j->finishing && !j->exit_code && !j->loop.got_signal)) {
        evloop_turn(&j->loop, 100, elastic_exit, j);
        long long now = now_ms();
        elastic_check_answers(j, now);
        /* Ranks of hosts that left, past their grace time. */
        for (int r = 0; r < g_run.np; r++)
            if (g_run.ranks[r].running && g_ep[r].kill_at >= 0 && now >= g_ep[r].kill_at) {
                signal_rank(&g_run.ranks[r], SIGKILL);
                g_ep[r].kill_at = -1;
            }
        if (!j->finishing && !j->exit_code && !j->loop.got_signal) {
            read_epoch(j);
            elastic_health(j, now);
        }
        if (!j->finishing && !j->exit_code && !j->loop.got_signal && now >= j->next_discovery)
            elastic_rediscover(j, now);
        if (!j->finishing && !j->exit_code && !j->loop.got_signal)
            publish_joining(j);
        evloop_kill_due(&j->loop, now);
        if (g_run.nrunning == 0 && (j->finishing || j->exit_code || j->loop.got_signal))
            break;
    }
}

/* The verdict (every member of the last epoch exited 0) and a summary. */
static void elastic_verdict(ejob_t *j)
{
    read_epoch(j);
    reset_limit_check(j);
    const long long *ids = j->members;
    int nmembers = j->epoch >= 0 ? j->nmembers : -1;
    int bad = 0;
    for (int i = 0; i < nmembers; i++)
        if (ids[i] >= 0 && ids[i] < g_run.np && g_ep[ids[i]].code != 0) {
            fprintf(stderr, "loomrun: rank %lld of the final epoch exited with code %d\n",
                    ids[i], g_ep[ids[i]].code);
            bad = bad ? bad : g_ep[ids[i]].code;
        }
    if (!j->exit_code && !j->loop.got_signal && (bad || nmembers <= 0))
        j->exit_code = bad ? bad : 1;
    fprintf(stderr, "loomrun: elastic job %s: %d process(es) started (%d at first), %d failed, "
            "%d stopped with their host, %d membership change(s); final epoch has %d rank(s)",
            j->exit_code || j->loop.got_signal ? "failed" : "finished", g_run.np, j->nstarted0,
            j->nfailed, j->nremoved, j->changes, nmembers > 0 ? nmembers : 0);
    int nbl = 0;
    for (int h = 0; h < g_run.nhosts; h++)
        if (g_eh[h].banned_until > 0)
            fprintf(stderr, "%s%s", nbl++ ? ", " : "; blacklisted: ", g_run.hosts[h].name);
    fprintf(stderr, "\n");
}

int elastic_main(options_t *o)
{
    ejob_t j;
    memset(&j, 0, sizeof(j));
    j.o = o;
    j.joining_published = -1;
    j.epoch = -1;
    j.nmembers = -1;
    elastic_hosts(&j);
    remote_wdir(o->wdir, &j.wdir);
    block_signals();
    elastic_store(&j);
    elastic_envs(&j);
    elastic_host_stores(&j, 0);
    fill_slots(&j, j.np0);
    j.nstarted0 = g_run.np;
    sigprocmask(SIG_SETMASK, &g_run.orig_mask, NULL);

    elastic_loop(&j);
    elastic_verdict(&j);

    loom_store_close(j.store);
    end_job(&j.loop, j.exit_code != 0 || j.loop.got_signal, j.srv);
    env_free(&j.env);
    env_free(&j.xenv);
    sb_free(&j.wdir);
    free(j.local_store);
    free(j.members);
    free(o->xvars);
    free(g_ep);
    free(g_eh);
    if (j.loop.got_signal)
        return die_of_signal(j.loop.got_signal);
    return j.exit_code;
}
