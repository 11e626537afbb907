/*
 * comm.c - making and unmaking communicators: settings, rendezvous through
 * the store (every rank publishes its transport address and host identity,
 * then reads everyone else's), topology, transport connection, split, abort,
 * destroy; and the error text every public call leaves behind.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel.h"
#include "comm.h"
#include "base/log.h"
#include "base/timeline.h"
#include "transports/tp_mux.h"
#include "transports/transports.h"

static __thread char global_error[LOOM_ERRMSG_MAX];

LOOM_API const char *loom_comm_last_error(loom_comm_t c)
{
    return c ? c->last_error : global_error;
}

loom_status_t loom_global_fail(loom_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(global_error, sizeof(global_error), fmt, ap);
    va_end(ap);
    return st;
}

loom_status_t loom_comm_fail(loom_comm_t c, loom_status_t st, const char *fmt, ...)
{
    char msg[LOOM_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->err_lock);
    memcpy(c->last_error, msg, sizeof(msg));
    pthread_mutex_unlock(&c->err_lock);
    LOOM_WARN("coll", "rank %d: %s: %s", c->rank, loom_strerror(st), msg);
    return st;
}

void loom_comm_publish_error(loom_comm_t c, loom_status_t st)
{
    loom_comm_fail(c, st, "%s", c->work_err.msg[0] ? c->work_err.msg : loom_strerror(st));
}

LOOM_API int loom_comm_rank(loom_comm_t c) { return c ? c->rank : -1; }
LOOM_API int loom_comm_size(loom_comm_t c) { return c ? c->size : -1; }
LOOM_API int loom_comm_local_rank(loom_comm_t c) { return c ? c->local_rank : -1; }
LOOM_API int loom_comm_local_size(loom_comm_t c) { return c ? c->local_size : -1; }
LOOM_API int loom_comm_node_rank(loom_comm_t c) { return c ? c->node_rank : -1; }
LOOM_API int loom_comm_node_count(loom_comm_t c) { return c ? c->node_count : -1; }

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* hostname plus boot id, so containers that share a hostname on different
 * machines (and a rebooted machine) are told apart; LOOM_HOST_ID overrides. */
static void host_identity(const loom_settings_t *cfg, char *out, size_t outlen)
{
    if (cfg->host_id[0]) {
        snprintf(out, outlen, "%s", cfg->host_id);
        return;
    }
    char host[256] = "unknown", boot[64] = "";
    gethostname(host, sizeof(host) - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof(boot), f))
            boot[0] = '\0';
        fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
    }
    snprintf(out, outlen, "%s/%s", host, boot);
}

static void store_unref(loom_store_ref_t *ref)
{
    if (ref && atomic_fetch_sub(&ref->refs, 1) == 1) {
        loom_store_close(ref->store);
        free(ref);
    }
}

void loom_store_ref_release(loom_store_ref_t *ref)
{
    store_unref(ref);
}

static loom_comm_t comm_alloc(void)
{
    loom_comm_t c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    pthread_mutex_init(&c->err_lock, NULL);
    pthread_mutex_init(&c->qlock, NULL);
    pthread_cond_init(&c->qcond, NULL);
    pthread_cond_init(&c->done_cond, NULL);
    return c;
}

static void comm_free(loom_comm_t c)
{
    loom_timeline_release(c->ctx.timeline);
    free(c->ctx.scratch);
    free(c->node_of);
    pthread_mutex_destroy(&c->err_lock);
    pthread_mutex_destroy(&c->qlock);
    pthread_cond_destroy(&c->qcond);
    pthread_cond_destroy(&c->done_cond);
    free(c);
}

/* Say which ranks never published their address, in rank terms. */
static void missing_ranks_error(loom_comm_t c, const char *const *keys, const char *store_msg)
{
    char list[200] = "";
    size_t off = 0;
    int nmissing = 0;
    for (int r = 0; r < c->size; r++) {
        loom_err_t probe = {0};
        if (loom_store_wait(c->store->store, &keys[r], 1, 0.0, &probe) == LOOM_SUCCESS)
            continue;
        if (nmissing++ < 16 && off < sizeof(list))
            off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%d", off ? "," : "", r);
    }
    if (nmissing > 16 && off < sizeof(list))
        snprintf(list + off, sizeof(list) - off, ",... (%d in all)", nmissing);
    loom_err_set(&c->work_err, LOOM_ERR_TIMEOUT,
                 "rank %d waited %.1f s (LOOM_TIMEOUT) for rank(s) %s of %d to join; are they "
                 "started, with the same LOOM_STORE and LOOM_JOB_ID? (%s)",
                 c->rank, c->cfg.timeout_s, nmissing ? list : "?", c->size, store_msg);
}

/* The transports a communicator makes, in list order (transports.h): at
 * most one network transport and one node-local one, as a rank's record has
 * an address field for each (KIND_NET, KIND_LOCAL). */
enum { KIND_NET = 0, KIND_LOCAL = 1, MAX_TPS = 2 };
typedef struct tp_set {
    int n;
    const loom_transport_ops_t *ops[MAX_TPS];
    loom_tp_t *tp[MAX_TPS];
} tp_set_t;

/* The next network transport of the list after index i, or NULL. */
static const loom_transport_ops_t *next_net_transport(int i)
{
    while (loom_transports[++i])
        if (!loom_transports[i]->node_local)
            return loom_transports[i];
    return NULL;
}

/* Walk the list: make the network transport LOOM_TRANSPORT names (auto: the
 * first that opens; the next one when it cannot) and, unless LOOM_SHM=0,
 * the node-local one beside it. addr[kind]: the address each published,
 * "-" when none. */
static loom_status_t create_transports(loom_comm_t c, const loom_tp_params_t *params,
                                       tp_set_t *set, char addr[2][1024])
{
    const char *want = c->cfg.transport;
    int any = strcmp(want, "auto") == 0;
    if (!any && !loom_transport_find(want))
        return loom_err_set(params->err, LOOM_ERR_UNSUPPORTED,
                            "LOOM_TRANSPORT=%s, but this build of Loom has no %s transport "
                            "(configure's summary lists the transports it built)", want, want);
    int made[2] = {0, 0};
    for (int i = 0; loom_transports[i] && set->n < MAX_TPS; i++) {
        const loom_transport_ops_t *t = loom_transports[i];
        int kind = t->node_local ? KIND_LOCAL : KIND_NET;
        if (made[kind] || (t->node_local ? !c->cfg.shm || c->size == 1
                                          : !any && strcmp(want, t->name) != 0))
            continue;
        /* The transport keeps params->err for its later failures. */
        loom_tp_t *tp = NULL;
        loom_status_t st = t->create(params, addr[kind], sizeof(addr[kind]), &tp);
        if (st == LOOM_SUCCESS) {
            set->ops[set->n] = t;
            set->tp[set->n++] = tp;
            made[kind] = 1;
            continue;
        }
        const loom_transport_ops_t *next = next_net_transport(i);
        if (t->node_local)
            LOOM_WARN("init", "rank %d: no %s, ranks of this node talk over the network: %s",
                      c->rank, t->medium, params->err->msg);
        else if (!any || !next)
            return st;
        else if (st == LOOM_ERR_UNSUPPORTED)
            LOOM_INFO("init", "rank %d: no %s (%s); using %s", c->rank, t->medium,
                      params->err->msg, next->medium);
        else
            LOOM_WARN("init", "rank %d: %s failed (%s); using %s", c->rank, t->name,
                      params->err->msg, next->medium);
        loom_err_clear(params->err);   /* the first failure recorded is what users read */
        snprintf(addr[kind], sizeof(addr[kind]), "-");
    }
    if (!made[KIND_NET])
        return loom_err_set(params->err, LOOM_ERR_INTERNAL, "no network transport in the list");
    return LOOM_SUCCESS;
}

/* Route each peer to the first transport that reaches it and connect each
 * transport to the peers it serves; keep one transport when it serves
 * everybody, else a mux of those that serve someone. addrs[kind][r]: what
 * rank r published for that kind of transport (NULL: nothing). */
static loom_status_t connect_transports(loom_comm_t c, tp_set_t *set, char **addrs[2])
{
    loom_err_t *err = &c->work_err;
    int *route = malloc(sizeof(int) * (size_t)c->size);
    int *mux_route = malloc(sizeof(int) * (size_t)c->size);
    char **mine = calloc((size_t)c->size, sizeof(char *));
    loom_status_t st = LOOM_SUCCESS;
    if (!route || !mux_route || !mine) {
        st = loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    int used[MAX_TPS] = {0}, self = 0;
    for (int r = 0; r < c->size; r++) {
        int same_host = c->node_of[r] == c->node_of[c->rank];
        route[r] = -1;
        for (int j = 0; j < set->n && route[r] < 0; j++) {
            const char *peer_addr = addrs[set->ops[j]->node_local][r];
            if (set->ops[j]->reaches ? set->ops[j]->reaches(set->tp[j], r, peer_addr, same_host)
                                     : peer_addr != NULL)
                route[r] = j;
        }
        if (route[r] < 0) {
            st = loom_err_set(err, LOOM_ERR_MISMATCH, "rank %d: no transport of this build "
                              "reaches rank %d", c->rank, r);
            goto out;
        }
        if (r != c->rank)
            used[route[r]] = 1;
        else
            self = route[r];
    }
    for (int j = 0; j < set->n && st == LOOM_SUCCESS; j++) {
        if (!used[j] || c->size == 1)
            continue;
        for (int r = 0; r < c->size; r++)
            mine[r] = route[r] == j ? addrs[set->ops[j]->node_local][r] : NULL;
        st = set->ops[j]->connect(set->tp[j], mine, c->cfg.timeout_s);
    }
    if (st != LOOM_SUCCESS)
        goto out;
    int nused = 0, keep = self;
    for (int j = 0; j < set->n; j++)
        if (used[j]) {
            nused++;
            keep = j;
        }
    if (nused > 1) {
        /* Network first, as the mux polls them in this order. */
        const loom_transport_ops_t *ops[MAX_TPS];
        loom_tp_t *tps[MAX_TPS];
        int at[MAX_TPS], m = 0;
        for (int j = set->n - 1; j >= 0; j--) {
            at[j] = -1;
            if (used[j] || j == self) {
                at[j] = m;
                ops[m] = set->ops[j];
                tps[m++] = set->tp[j];
            }
        }
        for (int r = 0; r < c->size; r++)
            mux_route[r] = at[route[r]];
        st = loom_mux_create(ops, tps, m, mux_route, c->size, err, &c->tp);
        if (st != LOOM_SUCCESS)
            goto out;
        c->tp_ops = &loom_mux_transport;
        for (int j = 0; j < set->n; j++)
            if (at[j] >= 0)
                set->tp[j] = NULL;
    } else {
        c->tp_ops = set->ops[keep];
        c->tp = set->tp[keep];
        set->tp[keep] = NULL;
        for (int j = 0; j < set->n; j++)
            if (set->tp[j]) {
                set->ops[j]->destroy(set->tp[j], 0);
                set->tp[j] = NULL;
            }
    }
    LOOM_INFO("init", "rank %d: transport %s%s", c->rank, c->tp_ops->name,
              c->tp_ops == &loom_mux_transport ? " (shm inside the node, network across)" : "");
out:
    free(route);
    free(mux_route);
    free(mine);
    return st;
}

/* Publish our record and read every rank's (values[r], each malloc'd). */
static loom_status_t exchange_addresses(loom_comm_t c, const char *mine, size_t len, char **values)
{
    loom_err_t *err = &c->work_err;
    loom_status_t st;
    char key[320];
    snprintf(key, sizeof(key), "%s/addr/%d", c->prefix, c->rank);
    /* Signed with LOOM_AUTH_KEY: whoever can write the store cannot redirect us. */
    if ((st = loom_store_set_signed(c->store->store, key, mine, len, err)) != LOOM_SUCCESS)
        return st;
    /* One wait for all keys: its timeout message names every missing rank. */
    char (*keys)[320] = calloc((size_t)c->size, sizeof(*keys));
    const char **keyp = calloc((size_t)c->size, sizeof(char *));
    if (!keys || !keyp) {
        free(keys);
        free(keyp);
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory");
    }
    for (int r = 0; r < c->size; r++) {
        snprintf(keys[r], sizeof(keys[r]), "%s/addr/%d", c->prefix, r);
        keyp[r] = keys[r];
    }
    loom_err_t wait_err = {0};
    st = loom_store_wait(c->store->store, keyp, (size_t)c->size, c->cfg.timeout_s, &wait_err);
    if (st == LOOM_ERR_TIMEOUT)
        missing_ranks_error(c, keyp, wait_err.msg);
    else if (st != LOOM_SUCCESS)
        loom_err_set(err, st, "%s", wait_err.msg);
    for (int r = 0; r < c->size && st == LOOM_SUCCESS; r++) {
        size_t vlen;
        loom_err_t get_err = {0};
        st = loom_store_get_signed(c->store->store, keys[r], (void **)&values[r], &vlen,
                                   c->cfg.timeout_s, &get_err);
        /* The store's message names the key; users think in ranks. */
        if (st == LOOM_ERR_AUTH)
            loom_err_set(err, st, "rank %d refuses rank %d's record: %s", c->rank, r,
                         get_err.msg);
        else if (st != LOOM_SUCCESS)
            loom_err_set(err, st, "%s", get_err.msg);
    }
    /* Our own record as others read it: a rewrite shows here even without a
     * key. With one, the record is signed, so it can only be an old one
     * replayed; the handshake's binding refuses whoever dials it, and we stay
     * to refuse them (so they learn why at once) rather than leave them to
     * time out. Shared memory has no handshake: its connect fails us at once,
     * and the segment's binding refuses our peers (transports/shm/shm.c). */
    if (st == LOOM_SUCCESS && strcmp(values[c->rank], mine) != 0) {
        if (c->cfg.auth_keylen)
            LOOM_WARN("init", "rank %d finds an older signed address of its own under %s "
                      "in the store (replayed?); connections made through it will fail",
                      c->rank, keys[c->rank]);
        else
            st = loom_err_set(err, LOOM_ERR_MISMATCH,
                              "rank %d finds another address than its own under its key %s "
                              "in the store: another process wrote it (a second rank %d, "
                              "or someone redirecting the job; see LOOM_AUTH_KEY)", c->rank,
                              keys[c->rank], c->rank);
    }
    free(keys);
    free(keyp);
    return st;
}

/* Ranks on one host are numbered in rank order; hosts in order of first rank. */
static loom_status_t number_nodes(loom_comm_t c, char **hosts, const char *myid)
{
    c->local_rank = c->local_size = c->node_rank = c->node_count = 0;
    free(c->node_of);
    if ((c->node_of = malloc(sizeof(int) * (size_t)c->size)) == NULL)
        return loom_err_set(&c->work_err, LOOM_ERR_NO_MEMORY, "out of memory");
    for (int r = 0; r < c->size; r++) {
        int first = 1;
        for (int q = 0; q < r && first; q++)
            if (strcmp(hosts[q], hosts[r]) == 0) {
                first = 0;
                c->node_of[r] = c->node_of[q];
            }
        if (first) {
            if (strcmp(hosts[r], myid) == 0)
                c->node_rank = c->node_count;
            c->node_of[r] = c->node_count++;
        }
        if (strcmp(hosts[r], myid) == 0) {
            if (r < c->rank)
                c->local_rank++;
            c->local_size++;
        }
    }
    return LOOM_SUCCESS;
}

/* Publish our addresses, read everyone's, derive the topology, connect. The
 * communicator already has rank, size, cfg, store, prefix and hashes. */
static loom_status_t rendezvous(loom_comm_t c)
{
    loom_err_t *err = &c->work_err;
    loom_status_t st;
    char addr[2][1024] = {"-", "-"}, myid[512];
    char **addrs[2] = {NULL, NULL}, **hosts = NULL, **values = NULL;
    tp_set_t set = {0};

    char bind_host[128] = "";
    if (c->store && loom_store_local_host(c->store->store, bind_host, sizeof(bind_host)) != 0)
        bind_host[0] = '\0';
    host_identity(&c->cfg, myid, sizeof(myid));
    loom_tp_params_t params = {
        .rank = c->rank, .size = c->size, .job_hash = c->job_hash, .comm_hash = c->comm_hash,
        .ifname = c->cfg.ifname, .bind_host = bind_host, .sockbuf = c->cfg.socket_bufsize,
        .settings = &c->cfg, .host_id = myid, .err = err,
        .devmem = loom_accel->size > offsetof(loom_accel_ops_t, devmem) ? loom_accel->devmem
                                                                         : NULL};
    if ((st = create_transports(c, &params, &set, addr)) != LOOM_SUCCESS)
        goto out;

    addrs[KIND_NET] = calloc((size_t)c->size, sizeof(char *));
    addrs[KIND_LOCAL] = calloc((size_t)c->size, sizeof(char *));
    hosts = calloc((size_t)c->size, sizeof(char *));
    values = calloc((size_t)c->size, sizeof(char *));
    if (!addrs[KIND_NET] || !addrs[KIND_LOCAL] || !hosts || !values) {
        st = loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    char mine[4096];
    int len = snprintf(mine, sizeof(mine), "%d\n%s\n%s\n%s", c->size, addr[KIND_NET], myid,
                       addr[KIND_LOCAL]);
    if (c->size > 1) {
        if ((st = exchange_addresses(c, mine, (size_t)len, values)) != LOOM_SUCCESS)
            goto out;
    } else {
        values[0] = strdup(mine);
        if (!values[0]) {
            st = loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory");
            goto out;
        }
    }
    for (int r = 0; r < c->size; r++) {
        char *nl1 = strchr(values[r], '\n'), *nl2 = nl1 ? strchr(nl1 + 1, '\n') : NULL;
        char *nl3 = nl2 ? strchr(nl2 + 1, '\n') : NULL;
        if (!nl3) {
            st = loom_err_set(err, LOOM_ERR_MISMATCH, "rank %d published a malformed address "
                              "(a different Loom version or a stale store?)", r);
            goto out;
        }
        *nl1 = *nl2 = *nl3 = '\0';
        if (atoi(values[r]) != c->size) {
            st = loom_err_set(err, LOOM_ERR_MISMATCH,
                              "rank %d believes the job has %s ranks, rank %d believes %d (or the "
                              "store holds keys of an earlier job: set LOOM_JOB_ID)",
                              r, values[r], c->rank, c->size);
            goto out;
        }
        addrs[KIND_NET][r] = nl1 + 1;
        hosts[r] = nl2 + 1;
        addrs[KIND_LOCAL][r] = strcmp(nl3 + 1, "-") == 0 ? NULL : nl3 + 1;
    }

    if ((st = number_nodes(c, hosts, myid)) != LOOM_SUCCESS)
        goto out;
    LOOM_INFO("init", "rank %d/%d at %s: host %s, local rank %d/%d, node %d/%d", c->rank, c->size,
              addr[KIND_NET], myid, c->local_rank, c->local_size, c->node_rank, c->node_count);

    st = connect_transports(c, &set, addrs);
out:
    for (int j = 0; j < set.n; j++)
        if (set.tp[j])
            set.ops[j]->destroy(set.tp[j], 0);
    if (values)
        for (int r = 0; r < c->size; r++)
            free(values[r]);
    free(values);
    free(addrs[KIND_NET]);
    free(addrs[KIND_LOCAL]);
    free(hosts);
    return st;
}

static void init_ctx(loom_comm_t c)
{
    c->ctx.rank = c->rank;
    c->ctx.size = c->size;
    c->ctx.tp_ops = c->tp_ops;
    c->ctx.tp = c->tp;
    c->ctx.tp_failure[0] = '\0';
    c->ctx.timeout_s = c->cfg.timeout_s;
    c->ctx.spin_us = c->cfg.spin_us;
    loom_spin_init(&c->spin, c->cfg.spin_us, c->local_size);
    c->ctx.spin = &c->spin;
    c->ctx.spin_yield = c->cfg.spin_yield;
    c->ctx.err = &c->work_err;
    c->fault = LOOM_TP_FAULT_NONE;
    c->ctx.fault = &c->fault;
    c->ctx.segment_bytes = c->cfg.segment_bytes;
    loom_ctx_set_topology(&c->ctx, c->node_of, c->node_count);
    /* loom_comm_settings_load refused a LOOM_ALGO this cannot parse. */
    char why[8];
    if (loom_algo_rules_parse(c->cfg.algo, c->algo_rules, LOOM_ALGO_MAX_RULES, &c->n_algo_rules,
                              why, sizeof(why)) != 0)
        c->n_algo_rules = 0;
}

/* Everything after the store is open: shared by create and split. */
static loom_status_t comm_finish(loom_comm_t c)
{
    c->job_hash = fnv1a(c->cfg.job_id);
    c->comm_hash = fnv1a(c->prefix);
    loom_status_t st = rendezvous(c);
    if (st != LOOM_SUCCESS) {
        if (c->tp)
            c->tp_ops->destroy(c->tp, 0);
        c->tp = NULL;
        return st;
    }
    init_ctx(c);
    c->ctx.timeline = loom_timeline_acquire(c->cfg.timeline, c->rank);
    return LOOM_SUCCESS;
}

/* store_uri is opened, unless cb (the caller's store) is given. */
static loom_status_t create_from(const loom_settings_t *cfg, int rank, int size,
                                 const char *store_uri, const loom_store_callbacks_t *cb,
                                 loom_comm_t *out)
{
    loom_comm_t c = comm_alloc();
    if (!c)
        return loom_global_fail(LOOM_ERR_NO_MEMORY, "out of memory");
    c->cfg = *cfg;
    c->rank = rank;
    c->size = size;
    loom_err_clear(&c->work_err);
    /* Every rank creates its communicators in the same order, so the count tells
     * apart the keys of a second world communicator from those of the first. */
    static _Atomic int ncreated;
    /* The caller's store gives each communicator a key space of its own (and
     * ranks outside a torch sub-group create nothing, so a count would differ). */
    if (cb)
        snprintf(c->prefix, sizeof(c->prefix), "loom/%s/ext", cfg->job_id);
    else
        snprintf(c->prefix, sizeof(c->prefix), "loom/%s/world%d", cfg->job_id,
                 atomic_fetch_add(&ncreated, 1));
    loom_status_t st = LOOM_SUCCESS;
    if (cb) {
        c->store = calloc(1, sizeof(*c->store));
        if (!c->store) {
            st = loom_err_set(&c->work_err, LOOM_ERR_NO_MEMORY, "out of memory");
            if (cb->release)
                cb->release(cb->ctx);
            goto err_free;
        }
        atomic_init(&c->store->refs, 1);
        st = loom_store_open_callbacks(cb, cfg->auth_key, cfg->auth_keylen, &c->work_err,
                                       &c->store->store);
        if (st != LOOM_SUCCESS) {
            free(c->store);
            c->store = NULL;
            goto err_free;
        }
    } else if (size > 1) {
        c->store = calloc(1, sizeof(*c->store));
        if (!c->store) {
            st = loom_err_set(&c->work_err, LOOM_ERR_NO_MEMORY, "out of memory");
            goto err_free;
        }
        atomic_init(&c->store->refs, 1);
        st = loom_store_open_key(store_uri, rank, cfg->timeout_s, cfg->auth_key, cfg->auth_keylen,
                                 &c->work_err, &c->store->store);
        if (st != LOOM_SUCCESS) {
            free(c->store);
            c->store = NULL;
            goto err_free;
        }
    }
    if ((st = comm_finish(c)) != LOOM_SUCCESS)
        goto err_store;
    *out = c;
    return LOOM_SUCCESS;

err_store:
    store_unref(c->store);
err_free:
    loom_global_fail(st, "%s", c->work_err.msg[0] ? c->work_err.msg : loom_strerror(st));
    comm_free(c);
    return st;
}

loom_status_t loom_comm_form(const loom_settings_t *cfg, int rank, int size,
                             loom_store_ref_t *store, const char *prefix, loom_comm_t *out,
                             loom_err_t *err)
{
    loom_comm_t c = comm_alloc();
    if (!c)
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory");
    c->cfg = *cfg;
    c->rank = rank;
    c->size = size;
    loom_err_clear(&c->work_err);
    snprintf(c->prefix, sizeof(c->prefix), "%s", prefix);
    c->store = store;
    atomic_fetch_add(&store->refs, 1);
    loom_status_t st = comm_finish(c);
    if (st != LOOM_SUCCESS) {
        loom_err_set(err, st, "%s", c->work_err.msg[0] ? c->work_err.msg : loom_strerror(st));
        store_unref(c->store);
        comm_free(c);
        return st;
    }
    *out = c;
    return LOOM_SUCCESS;
}

loom_status_t loom_comm_settings_load(loom_settings_t *cfg, loom_getenv_fn get, void *arg,
                                      loom_err_t *err)
{
    loom_status_t st = loom_settings_load(cfg, get, arg, err);
    if (st != LOOM_SUCCESS)
        return st;
    loom_algo_rule_t rules[LOOM_ALGO_MAX_RULES];
    size_t n;
    char why[256];
    if (loom_algo_rules_parse(cfg->algo, rules, LOOM_ALGO_MAX_RULES, &n, why, sizeof(why)) != 0)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "LOOM_ALGO=\"%s\": %s", cfg->algo, why);
    return LOOM_SUCCESS;
}

const loom_settings_t *loom_comm_settings(loom_comm_t c)
{
    return &c->cfg;
}

loom_status_t loom_comm_create_world(const loom_settings_t *cfg, int rank, int size,
                                     const char *store_uri, loom_comm_t *out)
{
    return create_from(cfg, rank, size, store_uri, NULL, out);
}

LOOM_API loom_status_t loom_comm_create(const loom_config_t *ucfg, loom_comm_t *comm)
{
    if (!ucfg || !comm)
        return loom_global_fail(LOOM_ERR_INVALID_ARG, "loom_comm_create: NULL argument");
    /* Read only the fields the caller's version of the struct has. */
    loom_config_t in = LOOM_CONFIG_INIT;
    size_t n = ucfg->struct_size < sizeof(in) ? ucfg->struct_size : sizeof(in);
    if (n < offsetof(loom_config_t, timeout_s) + sizeof(double))
        return loom_global_fail(LOOM_ERR_INVALID_ARG,
                                "loom_comm_create: struct_size %zu is too small: start from "
                                "LOOM_CONFIG_INIT", ucfg->struct_size);
    memcpy(&in, ucfg, n);
    if (in.size < 1 || in.rank < 0 || in.rank >= in.size)
        return loom_global_fail(LOOM_ERR_INVALID_ARG,
                                "loom_comm_create: rank %d / size %d is not a valid rank", in.rank,
                                in.size);
    loom_err_t err = {0};
    loom_settings_t cfg;
    loom_status_t st = loom_comm_settings_load(&cfg, loom_getenv_process, NULL, &err);
    if (st != LOOM_SUCCESS)
        return loom_global_fail(st, "loom_comm_create: %s", err.msg);
    if (in.timeout_s > 0)
        cfg.timeout_s = in.timeout_s;
    const char *store = in.store ? in.store : getenv("LOOM_STORE");
    if (in.size > 1 && (!store || !*store))
        return loom_global_fail(LOOM_ERR_INVALID_ARG,
                                "loom_comm_create: no store: set cfg.store or LOOM_STORE");
    return create_from(&cfg, in.rank, in.size, store ? store : "", NULL, comm);
}

LOOM_API loom_status_t loom_comm_create_with_store(const loom_config_t *ucfg,
                                                   const loom_store_callbacks_t *cb,
                                                   loom_comm_t *comm)
{
    loom_status_t st = LOOM_ERR_INVALID_ARG;
    loom_err_t err = {0};
    if (!ucfg || !cb || !comm) {
        loom_global_fail(st, "loom_comm_create_with_store: NULL argument");
        goto release;
    }
    loom_config_t in = LOOM_CONFIG_INIT;
    size_t n = ucfg->struct_size < sizeof(in) ? ucfg->struct_size : sizeof(in);
    if (n < offsetof(loom_config_t, timeout_s) + sizeof(double)) {
        loom_global_fail(st, "loom_comm_create_with_store: struct_size %zu is too small: start "
                         "from LOOM_CONFIG_INIT", ucfg->struct_size);
        goto release;
    }
    memcpy(&in, ucfg, n);
    if (in.size < 1 || in.rank < 0 || in.rank >= in.size) {
        loom_global_fail(st, "loom_comm_create_with_store: rank %d / size %d is not a valid "
                         "rank", in.rank, in.size);
        goto release;
    }
    loom_settings_t cfg;
    if ((st = loom_comm_settings_load(&cfg, loom_getenv_process, NULL, &err)) != LOOM_SUCCESS) {
        loom_global_fail(st, "loom_comm_create_with_store: %s", err.msg);
        goto release;
    }
    if (in.timeout_s > 0)
        cfg.timeout_s = in.timeout_s;
    /* From here on the store owns cb->ctx and releases it. */
    return create_from(&cfg, in.rank, in.size, "", cb, comm);

release:
    if (cb && cb->struct_size >= offsetof(loom_store_callbacks_t, release) + sizeof(cb->release) &&
        cb->release)
        cb->release(cb->ctx);
    return st;
}

typedef struct split_entry {
    int color, key, rank;
} split_entry_t;

static int split_cmp(const void *a, const void *b)
{
    const split_entry_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

LOOM_API loom_status_t loom_comm_split(loom_comm_t c, int color, int key, loom_comm_t *out)
{
    if (!c || !out)
        return loom_global_fail(LOOM_ERR_INVALID_ARG, "loom_comm_split: NULL argument");
    if (color < 0 && color != LOOM_UNDEFINED)
        return loom_comm_fail(c, LOOM_ERR_INVALID_ARG,
                              "loom_comm_split: color %d is negative (LOOM_UNDEFINED opts out)",
                              color);
    int mine[2] = {color, key};
    int *all = malloc(sizeof(int) * 2 * (size_t)c->size);
    split_entry_t *members = malloc(sizeof(*members) * (size_t)c->size);
    loom_status_t st;
    if (!all || !members) {
        st = loom_comm_fail(c, LOOM_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    if ((st = loom_allgather(mine, all, 2, LOOM_INT32, c)) != LOOM_SUCCESS)
        goto out;
    uint64_t split_id = c->nsplits++;
    if (color == LOOM_UNDEFINED) {
        *out = NULL;
        goto out;
    }
    int n = 0;
    for (int r = 0; r < c->size; r++)
        if (all[2 * r] == color)
            members[n++] = (split_entry_t){color, all[2 * r + 1], r};
    qsort(members, (size_t)n, sizeof(*members), split_cmp);
    loom_comm_t child = comm_alloc();
    if (!child) {
        st = loom_comm_fail(c, LOOM_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    child->cfg = c->cfg;
    child->size = n;
    for (int i = 0; i < n; i++)
        if (members[i].rank == c->rank)
            child->rank = i;
    loom_err_clear(&child->work_err);
    if ((size_t)snprintf(child->prefix, sizeof(child->prefix), "%s/split%llu/%d", c->prefix,
                         (unsigned long long)split_id, color) >= sizeof(child->prefix)) {
        st = loom_comm_fail(c, LOOM_ERR_INVALID_ARG, "loom_comm_split: split nested too deeply");
        comm_free(child);
        goto out;
    }
    if (n > 1) {
        child->store = c->store;
        atomic_fetch_add(&child->store->refs, 1);
    }
    st = comm_finish(child);
    child->ctx.timeline_tid = (int)(c->ctx.timeline_tid * 16 + (int)split_id + 1);
    if (st == LOOM_SUCCESS && c->layer &&
        (st = c->layer->inherit(c, child, &child->work_err)) != LOOM_SUCCESS) {
        loom_comm_fail(c, st, "loom_comm_split: %s", child->work_err.msg);
        loom_comm_destroy(child);
        goto out;
    }
    if (st != LOOM_SUCCESS) {
        loom_comm_fail(c, st, "loom_comm_split: %s", child->work_err.msg);
        store_unref(child->store);
        comm_free(child);
        goto out;
    }
    *out = child;
out:
    free(all);
    free(members);
    return st;
}

LOOM_API loom_status_t loom_comm_abort(loom_comm_t c)
{
    if (!c)
        return loom_global_fail(LOOM_ERR_INVALID_ARG, "loom_comm_abort: NULL communicator");
    atomic_store(&c->aborted, 1);
    if (c->tp)
        c->tp_ops->abort(c->tp, LOOM_ERR_ABORTED);
    pthread_mutex_lock(&c->qlock);
    pthread_cond_broadcast(&c->qcond);
    pthread_mutex_unlock(&c->qlock);
    return LOOM_SUCCESS;
}

struct loom_buffer_reg {
    loom_comm_t comm;
    void *handle;                 /* the transport's, NULL when it registers nothing */
};

LOOM_API loom_status_t loom_comm_register_buffer(loom_comm_t c, void *buf, size_t len,
                                                 loom_buffer_reg_t *reg)
{
    if (!c)
        return loom_global_fail(LOOM_ERR_INVALID_ARG,
                                "loom_comm_register_buffer: NULL communicator");
    if (!reg || (!buf && len))
        return loom_comm_fail(c, LOOM_ERR_INVALID_ARG, "loom_comm_register_buffer: %s",
                              !reg ? "NULL handle pointer" : "NULL buffer");
    loom_buffer_reg_t r = calloc(1, sizeof(*r));
    if (!r)
        return loom_comm_fail(c, LOOM_ERR_NO_MEMORY, "out of memory");
    r->comm = c;
    if (len && c->tp && c->tp_ops->mem_register) {
        errno = 0;
        loom_status_t st = c->tp_ops->mem_register(c->tp, buf, len, &r->handle);
        if (st != LOOM_SUCCESS) {
            int e = errno;
            free(r);
            return loom_comm_fail(c, st, "loom_comm_register_buffer: %s cannot register %zu "
                                  "bytes at %p: %s (RLIMIT_MEMLOCK?)", c->tp_ops->name, len, buf,
                                  e ? strerror(e) : "unknown reason");
        }
    }
    *reg = r;
    return LOOM_SUCCESS;
}

LOOM_API loom_status_t loom_comm_deregister_buffer(loom_comm_t c, loom_buffer_reg_t reg)
{
    if (!reg)
        return LOOM_SUCCESS;
    if (!c || reg->comm != c)
        return loom_global_fail(LOOM_ERR_INVALID_ARG, "loom_comm_deregister_buffer: the handle "
                                "belongs to another communicator");
    if (reg->handle && c->tp && c->tp_ops->mem_deregister)
        c->tp_ops->mem_deregister(c->tp, reg->handle);
    free(reg);
    return LOOM_SUCCESS;
}

LOOM_API loom_status_t loom_comm_destroy(loom_comm_t c)
{
    if (!c)
        return LOOM_SUCCESS;
    /* The whole teardown, in order: each step may still use what the later
     * ones free. A layer's threads (the elastic watcher) may abort the
     * transport; the accelerator's stream-ordered calls queue work on c;
     * queued operations finish (or fail within LOOM_TIMEOUT) before the
     * accelerator frees its staging memory, the transport closes and the
     * store is let go. */
    if (c->layer)
        c->layer->detach(c);
    loom_accel->comm_quiesce(c);
    loom_comm_stop_worker(c);
    loom_accel->comm_release(c);
    LOOM_INFO("coll", "rank %d: spin budget %d us at the end (LOOM_SPIN_US %d, %d CPUs, %d "
              "local ranks, %d runnable; waits took %.1f us spinning, %.1f us sleeping)",
              c->rank, loom_spin_decide(&c->spin.view), c->spin.view.setting_us,
              c->spin.view.cpus, c->spin.view.local_ranks, c->spin.view.runnable,
              c->spin.view.spin_wait_us, c->spin.view.sleep_wait_us);
    if (c->tp)
        c->tp_ops->destroy(c->tp, c->cfg.timeout_s);
    store_unref(c->store);
    comm_free(c);
    return LOOM_SUCCESS;
}
