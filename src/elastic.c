/*
 * elastic.c - communicators whose membership changes while the job runs.
 *
 * Every elastic communicator belongs to an epoch. Epoch R is formed by a
 * membership round in the store under loom/<job>/elastic/e<R>:
 *
 *   n            a counter: each participant takes a slot with add(n, 1)
 *   m/<slot>     "id class key" of that participant: class 0 for the members
 *                of epoch R-1 (key: their rank there), class 1 for newcomers
 *                (key: their id), so survivors come first, in their old order
 *   members      the closed list, written once by compare-and-set: whoever
 *                sees the round complete first writes it, everyone reads it
 *   ready/<id>   after the close: "I am still here" before connecting
 *   revoked      set by the first rank that gives up on the epoch
 *   c/...        the communicator's own rendezvous keys (comm.c)
 *
 * and loom/<job>/elastic/dead/<id>, set by the launcher for a process that
 * exited, so a round never waits for it, and loom/<job>/elastic/finished, set
 * by the launcher once a rank has finished, so a late newcomer stops waiting,
 * and loom/<job>/elastic/joining, the processes the launcher started that are
 * in no epoch yet: members that find newcomers waiting at a commit point wait
 * for the rest of them, so one reset takes in all that were started together.
 *
 * A round is complete when every live member of the previous epoch has
 * registered (or, for epoch 0, LOOM_SIZE processes have) and there are at
 * least LOOM_ELASTIC_MIN_NP participants; newcomers registered by then are
 * included. A member of the previous epoch that does not come within
 * LOOM_ELASTIC_TIMEOUT is left out when at least LOOM_ELASTIC_MIN_NP
 * participants are there; below that the round fails and names who was
 * waited for. After the close every member says it is ready before anyone
 * connects, and a failed connection leads to the next round, so a member
 * that dies during a rebuild costs one more round, not LOOM_TIMEOUT. Stable ids come from
 * LOOM_ELASTIC_ID (loomrun sets it) or from a counter in the store.
 *
 * A watcher thread per elastic communicator, on a store handle of its own,
 * turns the epoch's revoked key into LOOM_ERR_PEER_LOST for every call here,
 * and publishes the key when this rank's communicator breaks, so one rank's
 * failure reaches every survivor within a fraction of a second, including
 * the ones that exchange nothing with it directly. Communicators split from
 * an elastic one get a watcher of their own on the same key.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "comm.h"
#include "base/log.h"

#define POLL_US 10000           /* store polling while a round is open */
#define WATCH_S 0.2             /* the watcher's wait slice: bounds destroy's wait */

struct loom_elastic {
    char base[200];             /* loom/<job>/elastic */
    char uri[512];              /* the store, for the watcher's own handle */
    long long id;
    uint64_t epoch;
    double timeout_s;           /* LOOM_ELASTIC_TIMEOUT */
    int min_np;                 /* LOOM_ELASTIC_MIN_NP */
    int derived;                /* a split of an elastic communicator: watched, not rebuilt */
    loom_store_t *watch_store;
    pthread_t watcher;
    int watcher_started;
    _Atomic int stop;
};

typedef struct entry {
    long long id;
    int cls;
    long long key;
} entry_t;

static int key_exists(loom_store_t *s, const char *key)
{
    loom_err_t probe = {0};
    const char *k = key;
    return loom_store_wait(s, &k, 1, 0.0, &probe) == LOOM_SUCCESS;
}

/* ---- settings ------------------------------------------------------------- */

/* The LOOM_ELASTIC_* rows, validated when the settings were loaded. */
static void elastic_settings(struct loom_elastic *e, const loom_settings_t *cfg)
{
    e->timeout_s = cfg->elastic_timeout_s > 0 ? cfg->elastic_timeout_s : cfg->timeout_s;
    e->min_np = cfg->elastic_min_np;
    snprintf(e->base, sizeof(e->base), "loom/%s/elastic", cfg->job_id);
}

/* ---- the membership list -------------------------------------------------- */

static int entry_cmp(const void *a, const void *b)
{
    const entry_t *x = a, *y = b;
    if (x->cls != y->cls)
        return x->cls < y->cls ? -1 : 1;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* "id class key" lines; returns the count or -1. */
static int parse_list(const char *text, entry_t **out)
{
    int n = 0, cap = 0;
    entry_t *v = NULL;
    for (const char *p = text; p && *p;) {
        entry_t en;
        if (sscanf(p, "%lld %d %lld", &en.id, &en.cls, &en.key) != 3) {
            free(v);
            return -1;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            entry_t *nv = realloc(v, sizeof(*v) * (size_t)cap);
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
        }
        v[n++] = en;
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    *out = v;
    return n;
}

static loom_status_t read_list(loom_store_t *s, const char *key, entry_t **out, int *n_p,
                               loom_err_t *err)
{
    void *val;
    size_t len;
    /* Signed with LOOM_AUTH_KEY: nobody else can say who the members are. */
    loom_status_t st = loom_store_get_signed(s, key, &val, &len, 1.0, err);
    if (st != LOOM_SUCCESS)
        return st;
    int n = parse_list(val, out);
    free(val);
    if (n < 0)
        return loom_err_set(err, LOOM_ERR_MISMATCH, "malformed membership list at %s", key);
    *n_p = n;
    return LOOM_SUCCESS;
}

static int is_dead(loom_store_t *s, const char *base, long long id)
{
    char key[320];
    snprintf(key, sizeof(key), "%s/dead/%lld", base, id);
    return key_exists(s, key);
}

static int find_id(const entry_t *v, int n, long long id)
{
    for (int i = 0; i < n; i++)
        if (v[i].id == id)
            return i;
    return -1;
}

/* ---- one membership round --------------------------------------------------- */

enum { ROUND_IN = 0, ROUND_OUT = 1 };

/* Read round rkey's nreg registrations into seen (room for nreg): the live,
 * distinct, correctly signed ones; *unwritten counts slots taken but not yet
 * written. A forged registration fails the round (LOOM_ERR_AUTH). */
static loom_status_t read_registrations(struct loom_elastic *e, loom_store_t *s,
                                        const char *rkey, int64_t nreg, entry_t *seen,
                                        int *nseen_p, int *nold_p, int *unwritten_p,
                                        loom_err_t *err)
{
    char k[360];
    int nseen = 0, nold = 0, unwritten = 0;
    loom_status_t st = LOOM_SUCCESS;
    for (int64_t i = 0; i < nreg; i++) {
        snprintf(k, sizeof(k), "%s/m/%lld", rkey, (long long)i);
        if (!key_exists(s, k)) {
            unwritten++;   /* took a slot, not written yet */
            continue;
        }
        void *val;
        size_t len;
        entry_t *one = NULL;
        loom_err_t ignored = {0};
        loom_status_t gst = loom_store_get_signed(s, k, &val, &len, 1.0, &ignored);
        if (gst == LOOM_ERR_AUTH) {
            st = loom_err_set(err, gst, "elastic: %s", ignored.msg);
            break;
        }
        if (gst != LOOM_SUCCESS)
            continue;
        int ok = parse_list(val, &one) == 1;
        free(val);
        if (ok && find_id(seen, nseen, one->id) < 0 && !is_dead(s, e->base, one->id)) {
            seen[nseen++] = *one;
            nold += one->cls == 0;
        }
        free(one);
    }
    *nseen_p = nseen;
    *nold_p = nold;
    *unwritten_p = unwritten;
    return st;
}

/* Offer the sorted list as round rkey's members; whichever offer the store
 * took first wins, and everyone reads that one back. */
static loom_status_t close_round(loom_store_t *s, const char *rkey, entry_t *seen, int nseen,
                                 loom_err_t *err)
{
    char k[360];
    loom_status_t st;
    qsort(seen, (size_t)nseen, sizeof(*seen), entry_cmp);
    size_t cap = (size_t)nseen * 72 + 1, len = 0;
    char *list = malloc(cap);
    if (!list)
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory");
    list[0] = '\0';
    for (int i = 0; i < nseen; i++)
        len += (size_t)snprintf(list + len, cap - len, "%lld %d %lld\n", seen[i].id,
                                seen[i].cls, seen[i].key);
    void *got = NULL, *signed_list = NULL;
    size_t glen, slen;
    snprintf(k, sizeof(k), "%s/members", rkey);
    st = loom_store_sign(s, k, list, len, &signed_list, &slen, err);
    if (st == LOOM_SUCCESS)
        st = loom_store_cas(s, k, "", 0, signed_list, slen, &got, &glen, err);
    free(signed_list);
    free(list);
    free(got);
    return st;
}

/* Register in round R and wait for its close. prev/nprev: epoch R-1's
 * members (NULL for the first round, which waits for `initial` processes).
 * On ROUND_IN, *members and *nmembers hold the list and *rank_p our place. */
static loom_status_t run_round(struct loom_elastic *e, loom_store_t *s, uint64_t R, int cls,
                               long long key, const entry_t *prev, int nprev, int initial,
                               entry_t **members, int *nmembers, int *rank_p, int *outcome,
                               loom_err_t *err)
{
    char rkey[300], k[360], mine[96];
    loom_status_t st;
    entry_t *seen = NULL;
    snprintf(rkey, sizeof(rkey), "%s/e%llu", e->base, (unsigned long long)R);
    snprintf(k, sizeof(k), "%s/members", rkey);
    *outcome = ROUND_OUT;
    if (key_exists(s, k))
        return LOOM_SUCCESS;   /* closed before we came */

    int64_t slot;
    snprintf(k, sizeof(k), "%s/n", rkey);
    if ((st = loom_store_add(s, k, 1, &slot, err)) != LOOM_SUCCESS)
        return st;
    snprintf(k, sizeof(k), "%s/m/%lld", rkey, (long long)slot - 1);
    int mlen = snprintf(mine, sizeof(mine), "%lld %d %lld", e->id, cls, key);
    if ((st = loom_store_set_signed(s, k, mine, (size_t)mlen, err)) != LOOM_SUCCESS)
        return st;
    LOOM_INFO("elastic", "id %lld: registered for epoch %llu as %s %lld", e->id,
              (unsigned long long)R, cls == 0 ? "member" : "newcomer", key);

    /* Only members of the previous epoch (or anyone, in the first round) may
     * close an incomplete round: a newcomer may have waited far longer than
     * the members that are just arriving. */
    int may_force = prev == NULL || cls == 0;
    double deadline = loom_now_s() + e->timeout_s, unwritten_since = -1;
    for (;;) {
        snprintf(k, sizeof(k), "%s/members", rkey);
        if (key_exists(s, k)) {
            int n;
            if ((st = read_list(s, k, members, &n, err)) != LOOM_SUCCESS)
                break;
            *nmembers = n;
            *rank_p = find_id(*members, n, e->id);
            if (*rank_p >= 0)
                *outcome = ROUND_IN;
            else {
                free(*members);
                *members = NULL;
            }
            break;
        }
        snprintf(k, sizeof(k), "%s/finished", e->base);
        if ((prev == NULL || cls == 1) && key_exists(s, k)) {
            st = loom_err_set(err, LOOM_ERR_ABORTED, "elastic: the job finished before id %lld "
                              "could join it", e->id);
            break;
        }
        int64_t nreg;
        snprintf(k, sizeof(k), "%s/n", rkey);
        if ((st = loom_store_add(s, k, 0, &nreg, err)) != LOOM_SUCCESS)
            break;
        free(seen);
        seen = calloc((size_t)nreg + 1, sizeof(*seen));
        if (!seen) {
            st = loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory");
            break;
        }
        int nseen = 0, nold = 0, unwritten = 0;
        st = read_registrations(e, s, rkey, nreg, seen, &nseen, &nold, &unwritten, err);
        if (st != LOOM_SUCCESS)
            break;   /* a forged registration */
        /* Who is still awaited: live previous members not registered. */
        char waiting[200] = "";
        size_t off = 0;
        int nwait = 0;
        for (int i = 0; prev && i < nprev; i++) {
            if (find_id(seen, nseen, prev[i].id) >= 0 || is_dead(s, e->base, prev[i].id))
                continue;
            if (nwait++ < 12 && off < sizeof(waiting))
                off += (size_t)snprintf(waiting + off, sizeof(waiting) - off, "%s%d (id %lld)",
                                        off ? ", " : "", i, prev[i].id);
        }
        /* Below LOOM_ELASTIC_MIN_NP the round keeps waiting for newcomers. */
        int complete = (prev ? nwait == 0 && nold > 0 : nseen >= initial) && nseen >= e->min_np;
        /* A slot taken but not yet written is someone about to register:
         * wait for it a moment, unless it died in between. */
        if (!unwritten)
            unwritten_since = -1;
        else if (unwritten_since < 0)
            unwritten_since = loom_now_s();
        if (unwritten && loom_now_s() - unwritten_since < 1.0)
            complete = 0;
        int expired = loom_now_s() > deadline;
        int enough = nseen >= e->min_np && (prev == NULL || nold > 0);
        if (complete || (expired && may_force && enough)) {
            if (!complete)
                LOOM_WARN("elastic", "id %lld: epoch %llu closes without rank(s) %s of epoch "
                          "%llu after %.1f s (LOOM_ELASTIC_TIMEOUT)", e->id,
                          (unsigned long long)R, prev ? waiting : "?",
                          (unsigned long long)(R ? R - 1 : 0), e->timeout_s);
            st = close_round(s, rkey, seen, nseen, err);
            if (st != LOOM_SUCCESS)
                break;
            continue;   /* read back whichever list won */
        }
        if (expired && (!may_force || !enough)) {
            if (prev)
                st = loom_err_set(err, LOOM_ERR_TIMEOUT,
                                  "elastic epoch %llu: waited %.1f s (LOOM_ELASTIC_TIMEOUT) for "
                                  "rank(s) %s of epoch %llu; %d participant(s) registered, %d "
                                  "needed (LOOM_ELASTIC_MIN_NP)%s",
                                  (unsigned long long)R, e->timeout_s, nwait ? waiting : "none",
                                  (unsigned long long)R - 1, nseen, e->min_np,
                                  nold ? "" : "; no member of the previous epoch is left");
            else
                st = loom_err_set(err, LOOM_ERR_TIMEOUT,
                                  "elastic epoch 0: waited %.1f s (LOOM_ELASTIC_TIMEOUT) for %d "
                                  "processes, %d registered (LOOM_ELASTIC_MIN_NP %d)",
                                  e->timeout_s, initial, nseen, e->min_np);
            break;
        }
        /* Every participant polls every entry: back off in large rounds. */
        usleep((useconds_t)(POLL_US * (1 + nreg / 16)));
    }
    free(seen);
    return st;
}

/* After the close, everyone says it is still there before anyone connects;
 * a member that died in between sends the others to the next round at once
 * instead of leaving them in the rendezvous until LOOM_TIMEOUT. */
static loom_status_t ready_barrier(struct loom_elastic *e, loom_store_t *s, uint64_t R,
                                   const entry_t *m, int n, int *lost, loom_err_t *err)
{
    char k[360];
    snprintf(k, sizeof(k), "%s/e%llu/ready/%lld", e->base, (unsigned long long)R, e->id);
    loom_status_t st = loom_store_set(s, k, "1", 1, err);
    if (st != LOOM_SUCCESS)
        return st;
    *lost = 0;
    double deadline = loom_now_s() + e->timeout_s;
    for (;;) {
        int missing = -1;
        for (int i = 0; i < n && missing < 0; i++) {
            snprintf(k, sizeof(k), "%s/e%llu/ready/%lld", e->base, (unsigned long long)R, m[i].id);
            if (key_exists(s, k))
                continue;
            if (is_dead(s, e->base, m[i].id)) {
                LOOM_INFO("elastic", "id %lld: id %lld died before epoch %llu was connected",
                          e->id, m[i].id, (unsigned long long)R);
                *lost = 1;
                return LOOM_SUCCESS;
            }
            missing = i;
        }
        if (missing < 0)
            return LOOM_SUCCESS;
        if (loom_now_s() > deadline) {
            *lost = 1;   /* a member that vanished unnoticed: try without it */
            LOOM_WARN("elastic", "id %lld: rank %d (id %lld) of epoch %llu never said it was "
                      "ready within %.1f s", e->id, missing, m[missing].id,
                      (unsigned long long)R, e->timeout_s);
            return LOOM_SUCCESS;
        }
        usleep(POLL_US);
    }
}

/* ---- revocation ----------------------------------------------------------- */

/* Fail every pending and later call on c with LOOM_ERR_PEER_LOST. */
static void revoke_local(loom_comm_t c, const char *why)
{
    /* A call in flight keeps the first message written, so it reports the
     * revocation rather than the transport's "aborted". */
    loom_err_set(&c->work_err, LOOM_ERR_PEER_LOST, "%s", why);
    if (!c->broken) {
        snprintf(c->broken_msg, sizeof(c->broken_msg), "%s", why);
        c->broken = LOOM_ERR_PEER_LOST;
    }
    if (c->tp)
        c->tp_ops->abort(c->tp, LOOM_ERR_PEER_LOST);
    pthread_mutex_lock(&c->qlock);
    pthread_cond_broadcast(&c->qcond);
    pthread_mutex_unlock(&c->qlock);
}

static void revoke_publish(const char *base, uint64_t epoch, loom_store_t *s, int rank,
                           const char *why)
{
    char k[320], val[LOOM_ERRMSG_MAX + 64];
    snprintf(k, sizeof(k), "%s/e%llu/revoked", base, (unsigned long long)epoch);
    if (key_exists(s, k))
        return;   /* the first reason stays */
    int len = snprintf(val, sizeof(val), "rank %d: %s", rank, why);
    loom_err_t ignored = {0};
    loom_store_set(s, k, val, (size_t)(len < (int)sizeof(val) ? len : (int)sizeof(val) - 1),
                   &ignored);
}

static void *watcher_main(void *arg)
{
    loom_comm_t c = arg;
    struct loom_elastic *e = c->elastic;
    char k[320];
    snprintf(k, sizeof(k), "%s/e%llu/revoked", e->base, (unsigned long long)e->epoch);
    const char *keys[1] = {k};
    int published = 0;
    while (!atomic_load(&e->stop)) {
        if (c->broken && !published) {
            revoke_publish(e->base, e->epoch, e->watch_store, c->rank, c->broken_msg);
            published = 1;
        }
        loom_err_t werr = {0};
        loom_status_t st = loom_store_wait(e->watch_store, keys, 1, WATCH_S, &werr);
        if (st == LOOM_SUCCESS) {
            void *val = NULL;
            size_t len;
            char why[LOOM_ERRMSG_MAX];
            if (loom_store_get(e->watch_store, k, &val, &len, 1.0, &werr) == LOOM_SUCCESS)
                snprintf(why, sizeof(why), "elastic epoch %llu was revoked by %s",
                         (unsigned long long)e->epoch, (char *)val);
            else
                snprintf(why, sizeof(why), "elastic epoch %llu was revoked",
                         (unsigned long long)e->epoch);
            free(val);
            revoke_local(c, why);
            break;
        } else if (st != LOOM_ERR_TIMEOUT) {
            usleep((useconds_t)(WATCH_S * 1e6));   /* store hiccup: try again */
        }
    }
    return NULL;
}

/* ---- attaching to a communicator ---------------------------------------------- */

static const loom_comm_layer_t elastic_layer;

static loom_status_t attach(loom_comm_t c, const struct loom_elastic *tmpl, uint64_t epoch,
                            loom_err_t *err)
{
    struct loom_elastic *e = calloc(1, sizeof(*e));
    if (!e)
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory");
    memcpy(e->base, tmpl->base, sizeof(e->base));
    memcpy(e->uri, tmpl->uri, sizeof(e->uri));
    e->id = tmpl->id;
    e->timeout_s = tmpl->timeout_s;
    e->min_np = tmpl->min_np;
    e->epoch = epoch;
    atomic_init(&e->stop, 0);
    loom_status_t st = loom_store_open_key(e->uri, -1, c->cfg.timeout_s, c->cfg.auth_key,
                                           c->cfg.auth_keylen, err, &e->watch_store);
    if (st != LOOM_SUCCESS) {
        free(e);
        return st;
    }
    c->elastic = e;
    if (pthread_create(&e->watcher, NULL, watcher_main, c) != 0) {
        c->elastic = NULL;
        loom_store_close(e->watch_store);
        free(e);
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "cannot start the elastic watcher thread");
    }
    e->watcher_started = 1;
    c->layer = &elastic_layer;
    return LOOM_SUCCESS;
}

/* A communicator split from an elastic one shares its epoch: the same
 * revoked key ends its calls, and its own failure revokes the epoch, so a
 * rank blocked on a split (the Python engine's, say) is freed as fast as one
 * blocked on the world. */
static loom_status_t elastic_inherit(loom_comm_t parent, loom_comm_t child, loom_err_t *err)
{
    if (!parent->elastic || child->size < 2)
        return LOOM_SUCCESS;
    loom_status_t st = attach(child, parent->elastic, parent->elastic->epoch, err);
    if (st == LOOM_SUCCESS)
        child->elastic->derived = 1;
    return st;
}

static void elastic_detach(loom_comm_t c)
{
    struct loom_elastic *e = c->elastic;
    if (!e)
        return;
    atomic_store(&e->stop, 1);
    if (e->watcher_started)
        pthread_join(e->watcher, NULL);
    loom_store_close(e->watch_store);
    free(e);
    c->elastic = NULL;
    c->layer = NULL;
}

static const loom_comm_layer_t elastic_layer = {
    .inherit = elastic_inherit,
    .detach = elastic_detach,
};

/* ---- forming an epoch ----------------------------------------------------------- */

/* While the members connect, a member that the launcher reports dead gets a
 * placeholder address in its name, so the others' rendezvous, which waits
 * for every address, fails at once on it instead of at its timeout. */
typedef struct form_monitor {
    const struct loom_elastic *e;
    const entry_t *members;
    int n;
    const char *prefix;
    int stop;                   /* under lock */
    pthread_mutex_t lock;
    pthread_cond_t wake;        /* stop without waiting out a poll */
    loom_store_t *store;
} form_monitor_t;

static void *monitor_main(void *arg)
{
    form_monitor_t *fm = arg;
    pthread_mutex_lock(&fm->lock);
    while (!fm->stop) {
        pthread_mutex_unlock(&fm->lock);
        for (int i = 0; i < fm->n; i++) {
            if (!is_dead(fm->store, fm->e->base, fm->members[i].id))
                continue;
            char k[320];
            void *got = NULL;
            size_t glen;
            loom_err_t ignored = {0};
            snprintf(k, sizeof(k), "%s/addr/%d", fm->prefix, i);
            loom_store_cas(fm->store, k, "", 0, "dead", 4, &got, &glen, &ignored);
            free(got);
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 20 * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&fm->lock);
        if (!fm->stop)
            pthread_cond_timedwait(&fm->wake, &fm->lock, &until);
    }
    pthread_mutex_unlock(&fm->lock);
    return NULL;
}

/* Rounds from R on until one connects. prev: the previous epoch's members
 * (NULL for the first round); my place in it decides class and key. */
static loom_status_t form_epoch(struct loom_elastic *e, loom_store_ref_t *sref,
                                const loom_settings_t *cfg, uint64_t R, entry_t *prev, int nprev,
                                int initial, loom_comm_t *out, loom_err_t *err)
{
    loom_store_t *s = sref->store;
    entry_t *owned_prev = NULL;
    loom_status_t st = LOOM_SUCCESS;
    double give_up = loom_now_s() + 4 * e->timeout_s;
    int attempt = 0;
    for (;; R++) {
        int me = prev ? find_id(prev, nprev, e->id) : -1;
        int cls = me >= 0 ? 0 : 1;
        long long key = me >= 0 ? me : e->id;
        entry_t *m = NULL;
        int n = 0, rank = -1, outcome;
        st = run_round(e, s, R, cls, key, prev, nprev, initial, &m, &n, &rank, &outcome, err);
        if (st != LOOM_SUCCESS)
            break;
        if (outcome == ROUND_OUT) {
            if (cls == 0) {
                st = loom_err_set(err, LOOM_ERR_ABORTED,
                                  "stale rank: id %lld (rank %d of epoch %llu) was left out of "
                                  "epoch %llu, which closed without it; this process is no "
                                  "longer part of the job", e->id, me,
                                  (unsigned long long)R - 1, (unsigned long long)R);
                break;
            }
            if (loom_now_s() > give_up) {
                st = loom_err_set(err, LOOM_ERR_TIMEOUT, "elastic join: every round closed "
                                  "before id %lld could register, up to epoch %llu", e->id,
                                  (unsigned long long)R);
                break;
            }
            /* A newcomer tries the next round, whose old members are this one's. */
            char k[320];
            snprintf(k, sizeof(k), "%s/e%llu/members", e->base, (unsigned long long)R);
            if ((st = read_list(s, k, &m, &n, err)) != LOOM_SUCCESS)
                break;
            free(owned_prev);
            owned_prev = prev = m;
            nprev = n;
            continue;
        }
        int lost = 0;
        if ((st = ready_barrier(e, s, R, m, n, &lost, err)) != LOOM_SUCCESS) {
            free(m);
            break;
        }
        if (!lost) {
            char prefix[256];
            snprintf(prefix, sizeof(prefix), "%s/e%llu/c", e->base, (unsigned long long)R);
            loom_err_t ferr = {0};
            loom_comm_t c = NULL;
            /* A member that dies after the barrier would hold the others in
             * the rendezvous for LOOM_TIMEOUT: connect under a short bound
             * that grows with each try instead. Giving up costs only a new
             * round, in which every live member comes again. */
            loom_settings_t fcfg = *cfg;
            double bound = 2.0 * (double)(1 << (attempt < 5 ? attempt : 5));
            if (bound < fcfg.timeout_s)
                fcfg.timeout_s = bound;
            attempt++;
            form_monitor_t fm = {.e = e, .members = m, .n = n, .prefix = prefix};
            pthread_mutex_init(&fm.lock, NULL);
            pthread_cond_init(&fm.wake, NULL);
            pthread_t mon;
            int monitoring = n > 1 &&
                             loom_store_open_key(e->uri, -1, cfg->timeout_s, cfg->auth_key,
                                                 cfg->auth_keylen, &ferr, &fm.store) ==
                                 LOOM_SUCCESS;
            if (monitoring && pthread_create(&mon, NULL, monitor_main, &fm) != 0) {
                loom_store_close(fm.store);
                monitoring = 0;
            }
            loom_err_clear(&ferr);
            st = loom_comm_form(&fcfg, rank, n, sref, prefix, &c, &ferr);
            if (monitoring) {
                pthread_mutex_lock(&fm.lock);
                fm.stop = 1;
                pthread_cond_signal(&fm.wake);
                pthread_mutex_unlock(&fm.lock);
                pthread_join(mon, NULL);
                loom_store_close(fm.store);
            }
            pthread_mutex_destroy(&fm.lock);
            pthread_cond_destroy(&fm.wake);
            if (st == LOOM_SUCCESS) {
                c->cfg.timeout_s = cfg->timeout_s;
                c->ctx.timeout_s = cfg->timeout_s;
                st = attach(c, e, R, err);
                if (st != LOOM_SUCCESS) {
                    loom_comm_destroy(c);
                    free(m);
                    break;
                }
                char k[320], v[32];
                snprintf(k, sizeof(k), "%s/epoch", e->base);
                int vlen = snprintf(v, sizeof(v), "%llu", (unsigned long long)R);
                loom_store_set(s, k, v, (size_t)vlen, err);
                loom_err_clear(err);
                LOOM_INFO("elastic", "id %lld: rank %d of %d in epoch %llu", e->id, rank, n,
                          (unsigned long long)R);
                free(m);
                *out = c;
                break;
            }
            LOOM_INFO("elastic", "id %lld: epoch %llu did not connect (%s); next round",
                      e->id, (unsigned long long)R, ferr.msg);
            /* Tell the members that did connect to move on too. */
            revoke_publish(e->base, R, s, rank, ferr.msg);
        }
        if (loom_now_s() > give_up) {
            st = loom_err_set(err, LOOM_ERR_TIMEOUT, "elastic: no epoch could be connected "
                              "within %.1f s (last tried: %llu)", 4 * e->timeout_s,
                              (unsigned long long)R);
            free(m);
            break;
        }
        free(owned_prev);
        owned_prev = prev = m;
        nprev = n;
    }
    free(owned_prev);
    return st;
}

loom_status_t loom_elastic_init(const loom_settings_t *cfg, const loom_bootstrap_t *b,
                                loom_comm_t *out, loom_err_t *err)
{
    struct loom_elastic e;
    memset(&e, 0, sizeof(e));
    elastic_settings(&e, cfg);
    loom_status_t st;
    if (!b->store[0])
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "LOOM_ELASTIC=1 needs a store served outside the ranks (loomrun "
                            "--elastic or loom-store): set LOOM_STORE");
    snprintf(e.uri, sizeof(e.uri), "%s", b->store);
    loom_store_ref_t *sref = calloc(1, sizeof(*sref));
    if (!sref)
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory");
    atomic_init(&sref->refs, 1);
    /* Client only: the store must outlive any rank. */
    if ((st = loom_store_open_key(b->store, -1, cfg->timeout_s, cfg->auth_key, cfg->auth_keylen,
                                   err, &sref->store)) != LOOM_SUCCESS) {
        free(sref);
        return st;
    }
    char k[320];
    if (cfg->elastic_id >= 0) {
        e.id = cfg->elastic_id;
    } else {
        int64_t v;
        snprintf(k, sizeof(k), "%s/ids", e.base);
        if ((st = loom_store_add(sref->store, k, 1, &v, err)) != LOOM_SUCCESS)
            goto out;
        e.id = (1LL << 40) + v;   /* apart from launcher-given ids */
    }
    /* Join the round after the newest closed epoch; the first round when none is. */
    uint64_t R = 0;
    snprintf(k, sizeof(k), "%s/epoch", e.base);
    if (key_exists(sref->store, k)) {
        void *val;
        size_t len;
        if ((st = loom_store_get(sref->store, k, &val, &len, 1.0, err)) != LOOM_SUCCESS)
            goto out;
        R = strtoull(val, NULL, 10) + 1;
        free(val);
    }
    /* A newcomer to a running job waits as long as it takes the members to
     * reach a commit point, bounded by its own LOOM_ELASTIC_TIMEOUT. */
    entry_t *prev = NULL;
    int nprev = 0;
    if (R > 0) {
        snprintf(k, sizeof(k), "%s/e%llu/members", e.base, (unsigned long long)R - 1);
        if ((st = read_list(sref->store, k, &prev, &nprev, err)) != LOOM_SUCCESS)
            goto out;
    }
    st = form_epoch(&e, sref, cfg, R, prev, nprev, b->size, out, err);
    free(prev);
out:
    loom_store_ref_release(sref);
    return st;
}

/* ---- public calls ---------------------------------------------------------------- */

LOOM_API uint64_t loom_comm_epoch(loom_comm_t c)
{
    return c && c->elastic ? c->elastic->epoch : 0;
}

LOOM_API loom_status_t loom_comm_revoke(loom_comm_t c)
{
    if (!c)
        return loom_global_fail(LOOM_ERR_INVALID_ARG, "loom_comm_revoke: NULL communicator");
    char why[LOOM_ERRMSG_MAX];
    if (c->elastic) {
        snprintf(why, sizeof(why), "elastic epoch %llu was revoked by rank %d",
                 (unsigned long long)c->elastic->epoch, c->rank);
        revoke_publish(c->elastic->base, c->elastic->epoch, c->store->store, c->rank,
                       c->broken ? c->broken_msg : "loom_comm_revoke");
    } else {
        snprintf(why, sizeof(why), "the communicator was revoked by loom_comm_revoke");
    }
    revoke_local(c, why);
    return LOOM_SUCCESS;
}

LOOM_API loom_status_t loom_comm_rebuild(loom_comm_t old, loom_comm_t *out)
{
    if (!old || !out)
        return loom_global_fail(LOOM_ERR_INVALID_ARG, "loom_comm_rebuild: NULL argument");
    if (!old->elastic)
        return loom_comm_fail(old, LOOM_ERR_INVALID_ARG,
                              "loom_comm_rebuild: not an elastic communicator (start the job "
                              "with loomrun --elastic, or set LOOM_ELASTIC=1 and LOOM_STORE)");
    if (old->elastic->derived)
        return loom_comm_fail(old, LOOM_ERR_INVALID_ARG,
                              "loom_comm_rebuild: this communicator was split from an elastic "
                              "one: rebuild that one and split the new epoch again");
    /* Whoever is still inside the old epoch must leave it now. */
    loom_comm_revoke(old);
    struct loom_elastic *e = old->elastic;
    entry_t *prev = NULL;
    int nprev = 0;
    char k[320];
    loom_err_t err = {0};
    snprintf(k, sizeof(k), "%s/e%llu/members", e->base, (unsigned long long)e->epoch);
    loom_status_t st = read_list(old->store->store, k, &prev, &nprev, &err);
    if (st == LOOM_SUCCESS) {
        /* A process of an older epoch that missed a round is refused there. */
        loom_comm_t c = NULL;
        st = form_epoch(e, old->store, &old->cfg, e->epoch + 1, prev, nprev, 0, &c, &err);
        free(prev);
        if (st == LOOM_SUCCESS) {
            *out = c;
            return LOOM_SUCCESS;
        }
    }
    return loom_comm_fail(old, st, "loom_comm_rebuild: %s", err.msg[0] ? err.msg : loom_strerror(st));
}

/* Processes waiting to join the epoch after c's, as the store says now. */
static loom_status_t join_count(loom_comm_t c, const char *what, int32_t *n)
{
    *n = 0;
    if (!c->elastic)
        return LOOM_SUCCESS;
    char k[320];
    snprintf(k, sizeof(k), "%s/e%llu/n", c->elastic->base,
             (unsigned long long)c->elastic->epoch + 1);
    loom_err_t err = {0};
    int64_t v = 0;
    if (loom_store_add(c->store->store, k, 0, &v, &err) != LOOM_SUCCESS)
        return loom_comm_fail(c, err.status, "%s: %s", what, err.msg);
    *n = (int32_t)(v > INT32_MAX ? INT32_MAX : v);
    return LOOM_SUCCESS;
}

/* How many processes the launcher started to join (loomrun --elastic
 * publishes it as <base>/joining); 0 when it does not say. */
static int32_t starting_joiners(loom_comm_t c)
{
    if (!c->elastic)
        return 0;
    char k[320];
    snprintf(k, sizeof(k), "%s/joining", c->elastic->base);
    loom_err_t err = {0};
    void *val = NULL;
    size_t len = 0;
    int found = 0;
    if (loom_store_try_get(c->store->store, k, &val, &len, &found, &err) != LOOM_SUCCESS ||
        !found)
        return 0;
    long n = len > 0 && len < 16 ? strtol(val, NULL, 10) : 0;
    free(val);
    return n > 0 && n < INT32_MAX ? (int32_t)n : 0;
}

LOOM_API loom_status_t loom_comm_join_waiting(loom_comm_t c, int *waiting)
{
    if (!c || !waiting)
        return loom_global_fail(LOOM_ERR_INVALID_ARG, "loom_comm_join_waiting: NULL argument");
    int32_t n = 0;
    loom_status_t st = join_count(c, "loom_comm_join_waiting", &n);
    /* Processes the launcher has started count as soon as it started them, as
     * Horovod's driver notifies on discovery: a framework can take seconds to
     * load before the process registers. */
    int32_t starting = st == LOOM_SUCCESS ? starting_joiners(c) : 0;
    *waiting = n > starting ? n : starting;
    return st;
}

LOOM_API loom_status_t loom_comm_join_pending(loom_comm_t c, int *pending)
{
    if (!c || !pending)
        return loom_global_fail(LOOM_ERR_INVALID_ARG, "loom_comm_join_pending: NULL argument");
    int32_t mine = 0, all = 0;
    loom_status_t st = join_count(c, "loom_comm_join_pending", &mine);
    if (st != LOOM_SUCCESS)
        return st;
    /* The launcher started more processes than wait yet (they are still
     * loading): wait for them here, as Horovod's commit does once its driver
     * has found new hosts, so that one reset takes them all in; for
     * LOOM_TIMEOUT at most, then the reset goes on without the late ones
     * (they join at a later commit point). */
    double deadline = loom_now_s() + c->cfg.timeout_s;
    while (mine < starting_joiners(c) && loom_now_s() < deadline) {
        struct timespec nap = {0, 10 * 1000 * 1000};
        nanosleep(&nap, NULL);
        if ((st = join_count(c, "loom_comm_join_pending", &mine)) != LOOM_SUCCESS)
            return st;
    }
    /* Ranks read the store at different moments: agree on one answer. */
    st = loom_allreduce(&mine, &all, 1, LOOM_INT32, LOOM_MAX, c);
    if (st != LOOM_SUCCESS)
        return st;
    *pending = all;
    return LOOM_SUCCESS;
}
