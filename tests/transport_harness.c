/* transport_harness.c - every transport's endpoints as threads of one process (see the header). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/settings.h"
#include "thread_harness.h"
#include "transports/tp_mux.h"
#include "transports/transports.h"
#include "transport_harness.h"

#define MAX_RANKS 3
#define ADDR_BYTES 1024
/* Generous bounds: they end a broken run, a working one never meets them. */
#define CONNECT_S 60.0
#define BARRIER_S 60.0

struct tph_run {
    tph_kind_t kind;
    int size;
    int (*fn)(tph_rank_t *r, void *arg);
    void *arg;
    loom_settings_t settings;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int arrived, generation, left;   /* tph_barrier; left: ranks whose fn returned */
    char net_addr[MAX_RANKS][ADDR_BYTES];
    char shm_addr[MAX_RANKS][ADDR_BYTES];
    int create_failed;
    int failed;
    char msg[LOOM_ERRMSG_MAX + 128];
    tph_rank_t ranks[MAX_RANKS];
    loom_err_t errs[MAX_RANKS];
};

double tph_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *tph_name(tph_kind_t kind)
{
    static const char *const names[TPH_KINDS] = {"harness", "tcp", "shm", "mux", "ibverbs"};
    return kind >= 0 && kind < TPH_KINDS ? names[kind] : "?";
}

int tph_size(tph_kind_t kind)
{
    return kind == TPH_MUX ? 3 : 2;
}

/* Load the double under the name the transport dlopens: an object already
 * loaded with soname libibverbs.so.1 is what dlopen("libibverbs.so.1") returns. */
static int load_verbs_double(char *why, size_t whylen)
{
    static int loaded;
    if (loaded)
        return 1;
    const char *top = getenv("top_builddir");
    char path[4096];
    snprintf(path, sizeof(path), "%s/tests/verbs-provider/.libs/libibverbs.so.1",
             top && *top ? top : LOOM_TEST_BUILDDIR);
    if (access(path, R_OK) != 0) {
        snprintf(why, whylen, "the libibverbs test double %s is not built (--disable-shared?)",
                 path);
        return 0;
    }
    if (!dlopen(path, RTLD_NOW | RTLD_GLOBAL)) {
        snprintf(why, whylen, "cannot load the libibverbs test double: %s", dlerror());
        return 0;
    }
    /* The double's registry (POSIX shm): one per test process, removed at exit. */
    static char registry[64];
    snprintf(registry, sizeof(registry), "/loomfake-conform-%d", (int)getpid());
    setenv("FAKEVERBS_REGISTRY", registry, 1);
    loaded = 1;
    return 1;
}

int tph_available(tph_kind_t kind, char *why, size_t whylen)
{
    if (kind != TPH_IBVERBS)
        return 1;
    if (loom_transport_find("ibverbs"))
        return load_verbs_double(why, whylen);
    snprintf(why, whylen, "this build has no ibverbs transport (no infiniband/verbs.h)");
    return 0;
}

/* The transport a run of kind drives (the mux's network one for TPH_MUX);
 * tph_available said it is built. */
static const loom_transport_ops_t *net_ops(tph_kind_t kind)
{
    return loom_transport_find(kind == TPH_IBVERBS ? "ibverbs" : kind == TPH_SHM ? "shm" : "tcp");
}

int tph_fail(tph_rank_t *r, const char *fmt, ...)
{
    tph_run_t *run = r->run;
    char m[LOOM_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof(m), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&run->lock);
    if (!run->failed)
        snprintf(run->msg, sizeof(run->msg), "%s, rank %d: %s", tph_name(run->kind), r->rank, m);
    run->failed = 1;
    pthread_mutex_unlock(&run->lock);
    return -1;
}

static void req_init(loom_tp_req_t *req, int peer, void *buf, size_t len, uint64_t tag,
                     int is_send)
{
    memset(req, 0, sizeof(*req));
    req->peer = peer;
    req->buf = buf;
    req->len = len;
    req->match.tag = tag;
    req->match.desc = 0x1234;
    req->match.total = 7;
    req->is_send = is_send;
}

loom_status_t tph_isend(tph_rank_t *r, loom_tp_req_t *req, int peer, const void *buf, size_t len,
                        uint64_t tag)
{
    req_init(req, peer, (void *)(uintptr_t)buf, len, tag, 1);
    return r->ops->isend(r->tp, req);
}

loom_status_t tph_irecv(tph_rank_t *r, loom_tp_req_t *req, int peer, void *buf, size_t len,
                        uint64_t tag)
{
    req_init(req, peer, buf, len, tag, 0);
    return r->ops->irecv(r->tp, req);
}

loom_status_t tph_irecv_match(tph_rank_t *r, loom_tp_req_t *req, int peer, void *buf, size_t len,
                              const loom_tp_match_t *match)
{
    req_init(req, peer, buf, len, match->tag, 0);
    req->match = *match;
    return r->ops->irecv(r->tp, req);
}

loom_status_t tph_wait(tph_rank_t *r, loom_tp_req_t *const *reqs, int n, double limit_s)
{
    double deadline = tph_now() + limit_s;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < n; i++) {
            if (!reqs[i]->done)
                pending = 1;
            else if (reqs[i]->status != LOOM_SUCCESS)
                return reqs[i]->status;
        }
        if (!pending)
            return LOOM_SUCCESS;
        if (tph_now() > deadline)
            return LOOM_ERR_TIMEOUT;
        int moved = 0;
        loom_status_t st = r->ops->progress(r->tp, 50, &moved);
        if (st != LOOM_SUCCESS)
            return st;
    }
}

void tph_destroy(tph_rank_t *r, double timeout_s)
{
    if (!r->destroyed)
        r->ops->destroy(r->tp, timeout_s);
    r->destroyed = 1;
}

/* Bounded, and released early (failing) when a rank has left the run. */
static int barrier(tph_run_t *run, int leaving)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)BARRIER_S;
    pthread_mutex_lock(&run->lock);
    if (leaving) {
        run->left++;
        pthread_cond_broadcast(&run->cond);
        pthread_mutex_unlock(&run->lock);
        return 0;
    }
    int gen = run->generation, rc = 0;
    if (run->left > 0) {
        pthread_mutex_unlock(&run->lock);
        return -1;
    }
    if (++run->arrived == run->size) {
        run->arrived = 0;
        run->generation++;
        pthread_cond_broadcast(&run->cond);
    } else {
        while (gen == run->generation && run->left == 0 && rc == 0)
            rc = pthread_cond_timedwait(&run->cond, &run->lock, &until);
        if (gen == run->generation) {
            run->arrived--;
            rc = -1;
        }
    }
    pthread_mutex_unlock(&run->lock);
    return rc == 0 ? 0 : -1;
}

int tph_barrier(tph_rank_t *r)
{
    if (barrier(r->run, 0) != 0)
        return tph_fail(r, "a barrier failed (a rank left the run or it took over %.0f s)",
                        BARRIER_S);
    return 0;
}

int tph_end(tph_rank_t *r)
{
    int rc = r->destroyed ? 0 : barrier(r->run, 0);
    tph_destroy(r, 10.0);
    return rc;
}

/* ---- the thread harness's transport ------------------------------------------------ */

static void harness_rank(loom_ctx_t *ctx, void *arg)
{
    tph_run_t *run = arg;
    tph_rank_t *r = &run->ranks[ctx->rank];
    r->rank = ctx->rank;
    r->size = ctx->size;
    r->ops = ctx->tp_ops;
    r->tp = ctx->tp;
    r->err = ctx->err;
    r->run = run;
    if (run->fn(r, run->arg) != 0 && !run->failed)
        tph_fail(r, "failed without saying why");
    barrier(run, 1);
    tph_destroy(r, 0);
}

/* ---- real transports ------------------------------------------------------------- */

static const char *no_env(const char *name, void *arg)
{
    (void)name;
    (void)arg;
    return NULL;
}

static int node_of(tph_run_t *run, int rank)
{
    return run->kind == TPH_MUX ? rank / 2 : 0;
}

/* Create the endpoint(s) of r, publishing their addresses in run. */
static loom_status_t create(tph_rank_t *r, const loom_tp_params_t *p, loom_tp_t **tps)
{
    tph_run_t *run = r->run;
    loom_status_t st = LOOM_SUCCESS;
    switch (run->kind) {
    case TPH_TCP:
    case TPH_MUX:
        st = net_ops(TPH_TCP)->create(p, run->net_addr[r->rank], ADDR_BYTES, &tps[0]);
        if (st == LOOM_SUCCESS && run->kind == TPH_MUX)
            st = net_ops(TPH_SHM)->create(p, run->shm_addr[r->rank], ADDR_BYTES, &tps[1]);
        break;
    case TPH_SHM:
        st = net_ops(TPH_SHM)->create(p, run->shm_addr[r->rank], ADDR_BYTES, &tps[1]);
        break;
    case TPH_IBVERBS:
        st = net_ops(TPH_IBVERBS)->create(p, run->net_addr[r->rank], ADDR_BYTES, &tps[0]);
        break;
    default:
        st = LOOM_ERR_INTERNAL;
    }
    return st;
}


/* Connect r's endpoint(s) and make r->tp the one the test drives. */
static loom_status_t connect_rank(tph_rank_t *r, loom_tp_t **tps)
{
    tph_run_t *run = r->run;
    char *addrs[MAX_RANKS];
    loom_status_t st;
    if (run->kind != TPH_MUX) {
        int t = run->kind == TPH_SHM;
        for (int i = 0; i < run->size; i++)
            addrs[i] = t ? run->shm_addr[i] : run->net_addr[i];
        r->ops = net_ops(run->kind);
        st = r->ops->connect(tps[t], addrs, CONNECT_S);
        r->tp = tps[t];
        tps[t] = NULL;
        return st;
    }
    /* As comm.c does: shm inside the node (and to ourselves), tcp across. */
    int route[MAX_RANKS];
    const loom_transport_ops_t *ops[2] = {net_ops(TPH_TCP), net_ops(TPH_SHM)};
    for (int t = 1; t >= 0; t--) {
        for (int i = 0; i < run->size; i++) {
            route[i] = node_of(run, i) == node_of(run, r->rank) ? 1 : 0;
            addrs[i] = i != r->rank && route[i] == t ? (t ? run->shm_addr[i] : run->net_addr[i])
                                                     : NULL;
        }
        if ((st = ops[t]->connect(tps[t], addrs, CONNECT_S)) != LOOM_SUCCESS)
            return st;
    }
    st = loom_mux_create(ops, tps, 2, route, run->size, r->err, &r->tp);
    if (st == LOOM_SUCCESS) {
        r->ops = &loom_mux_transport;
        tps[0] = tps[1] = NULL;
    }
    return st;
}

static void *rank_main(void *p)
{
    tph_rank_t *r = p;
    tph_run_t *run = r->run;
    loom_tp_t *tps[2] = {NULL, NULL};
    char host_id[32];
    snprintf(host_id, sizeof(host_id), "conform-node%d", node_of(run, r->rank));
    loom_tp_params_t params = {
        .rank = r->rank, .size = run->size, .job_hash = 0x636f6e666f726dull,
        .comm_hash = (uint64_t)run->kind + 1, .ifname = NULL, .bind_host = "127.0.0.1",
        .sockbuf = 0, .settings = &run->settings, .host_id = host_id, .err = r->err};

    loom_status_t st = create(r, &params, tps);
    if (st != LOOM_SUCCESS) {
        tph_fail(r, "create: %s: %s", loom_strerror(st), r->err->msg);
        pthread_mutex_lock(&run->lock);
        run->create_failed = 1;
        pthread_mutex_unlock(&run->lock);
    }
    /* Every address is published once all got here. */
    if (barrier(run, 0) != 0 || run->create_failed)
        goto out;
    st = connect_rank(r, tps);
    if (st != LOOM_SUCCESS) {
        tph_fail(r, "connect: %s: %s", loom_strerror(st), r->err->msg);
        goto out;
    }
    if (run->fn(r, run->arg) != 0 && !run->failed)
        tph_fail(r, "failed without saying why");
out:
    barrier(run, 1);
    if (r->tp)
        tph_destroy(r, 10.0);
    if (tps[0])
        net_ops(run->kind == TPH_SHM ? TPH_TCP : run->kind)->destroy(tps[0], 0);
    if (tps[1])
        net_ops(TPH_SHM)->destroy(tps[1], 0);
    return NULL;
}

int tph_run(tph_kind_t kind, int (*fn)(tph_rank_t *r, void *arg), void *arg, char *msg,
            size_t msglen)
{
    tph_run_t *run = calloc(1, sizeof(*run));
    pthread_t tids[MAX_RANKS];
    int started = 0, rc;
    char why[512];

    if (!run) {
        snprintf(msg, msglen, "out of memory");
        return -1;
    }
    if (!tph_available(kind, why, sizeof(why))) {
        snprintf(msg, msglen, "%s: %s", tph_name(kind), why);
        free(run);
        return -1;
    }
    run->kind = kind;
    run->size = tph_size(kind);
    run->fn = fn;
    run->arg = arg;
    pthread_mutex_init(&run->lock, NULL);
    pthread_cond_init(&run->cond, NULL);
    loom_err_t err = {0};
    if (loom_settings_load(&run->settings, no_env, NULL, &err) != LOOM_SUCCESS) {
        snprintf(msg, msglen, "settings: %s", err.msg);
        rc = -1;
        goto out;
    }
    run->settings.timeout_s = CONNECT_S;
    if (kind == TPH_HARNESS) {
        int strays = loom_harness_run(run->size, harness_rank, run);
        if (strays != 0 && !run->failed)
            snprintf(run->msg, sizeof(run->msg), "harness: %d requests or messages left over",
                     strays);
        rc = run->failed || strays != 0;
        goto out;
    }
    for (int i = 0; i < run->size; i++) {
        tph_rank_t *r = &run->ranks[i];
        r->rank = i;
        r->size = run->size;
        r->err = &run->errs[i];
        r->run = run;
        loom_err_clear(r->err);
    }
    for (; started < run->size; started++)
        if (pthread_create(&tids[started], NULL, rank_main, &run->ranks[started]) != 0)
            break;
    if (started < run->size) {
        /* The ranks already running leave at their first barrier. */
        pthread_mutex_lock(&run->lock);
        run->left += run->size - started;
        run->failed = 1;
        snprintf(run->msg, sizeof(run->msg), "cannot start a thread: %s", strerror(errno));
        pthread_cond_broadcast(&run->cond);
        pthread_mutex_unlock(&run->lock);
    }
    for (int i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    rc = run->failed;
out:
    snprintf(msg, msglen, "%s", rc ? run->msg : "");
    pthread_cond_destroy(&run->cond);
    pthread_mutex_destroy(&run->lock);
    free(run);
    return rc;
}
