/* thread_harness.c - N ranks as threads over an in-memory transport (see the header). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdint.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "thread_harness.h"

/* A message sent before its receive was posted: a copy (eager), or the
 * sender's request itself, whose buffer is read when the receive comes
 * (rendezvous). */
typedef struct hmsg {
    struct hmsg *next;
    loom_tp_match_t match;
    size_t len;
    loom_tp_req_t *sreq;
    unsigned char data[];
} hmsg_t;

typedef struct world world_t;

/* One rank's instance. */
struct loom_tp {
    world_t *w;
    int rank;
    loom_err_t *err;
    /* Requests other threads completed or paired; the owner marks them done in progress. */
    loom_tp_req_t *matched;
    int gone;                  /* destroyed: its peers' waits for it fail */
    loom_status_t aborted;     /* set by abort (any thread) */
    loom_status_t failed;      /* sticky failure, described in err (owner's thread) */
};

struct world {
    pthread_mutex_t lock;
    pthread_cond_t cond;       /* a receive was matched, or a rank failed or left */
    int n;
    int rendezvous;            /* sends complete only once matched */
    int gave_up;               /* the first rank aborted, -1: none */
    hmsg_t **queue;            /* [src * n + dst]: FIFO of unexpected messages */
    loom_tp_req_t **posted;    /* [dst * n + src]: FIFO of receives not matched yet */
    int nposted;               /* receives posted and not matched yet, in all lists */
    int nmatched;              /* requests on the ranks' matched lists */
    loom_tp_t *tps;            /* [rank] */
    char *windows;             /* [rank]: HARNESS_WINDOW bytes of staging window each */
};

/* Fill receive r from a message (lock held). On a mismatch the sender's
 * length and descriptor are kept in tp_private for the owner's message. */
static void deliver(loom_tp_req_t *r, const loom_tp_match_t *m, const void *data, size_t len)
{
    if (r->len == len && r->match.desc == m->desc && r->match.total == m->total) {
        if (len > 0)
            memcpy(r->buf, data, len);
        r->off = len;
        r->status = LOOM_SUCCESS;
    } else {
        r->tp_private[0] = len;
        r->tp_private[1] = m->desc;
        r->status = LOOM_ERR_MISMATCH;
    }
}

/* Queue r for rank's thread, which marks it done in its next progress call
 * (lock held). */
static void hand_to(world_t *w, int rank, loom_tp_req_t *r)
{
    if (w->tps[rank].gone)
        return;   /* destroyed: its requests are forgotten */
    r->next = w->tps[rank].matched;
    w->tps[rank].matched = r;
    w->nmatched++;
    pthread_cond_broadcast(&w->cond);
}

/* Rendezvous: a receive paired with a send whose bytes are not read yet. */
#define PAIRED SIZE_MAX

static uint64_t fingerprint(const void *buf, size_t len)
{
    const unsigned char *p = buf;
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Pair receive r with pending send sr (lock held); the receiver reads the
 * bytes at its next progress call, as late as a zero-copy transport might. */
static void pair(world_t *w, loom_tp_req_t *r, loom_tp_req_t *sr, int receiver)
{
    r->off = PAIRED;
    r->tp_private[0] = (uintptr_t)sr;
    hand_to(w, receiver, r);
}

/* Read the bytes of a paired send into r (receiver's thread, lock held) and
 * hand the send back to its owner. A send buffer that changed since isend is
 * an algorithm that reused it too early. */
static void finish_pair(world_t *w, loom_tp_t *tp, loom_tp_req_t *r)
{
    loom_tp_req_t *sr = (loom_tp_req_t *)r->tp_private[0];
    if (fingerprint(sr->buf, sr->len) != (uint64_t)sr->tp_private[1]) {
        r->off = 0;
        r->status = loom_err_set(tp->err, LOOM_ERR_INTERNAL,
                                 "rank %d: the buffer of a send from rank %d (tag %#llx) "
                                 "changed before the send completed", tp->rank, r->peer,
                                 (unsigned long long)r->match.tag);
    } else {
        deliver(r, &sr->match, sr->buf, sr->len);
    }
    sr->off = sr->len;
    sr->status = LOOM_SUCCESS;
    hand_to(w, r->peer, sr);
}

/* On the receiver's thread (lock held): mark r done, describing a mismatch. */
static void complete(loom_tp_t *tp, loom_tp_req_t *r)
{
    if (r->status == LOOM_ERR_MISMATCH)
        loom_err_set(tp->err, LOOM_ERR_MISMATCH,
                     "rank %d: message from rank %d (tag %#llx) has %zu bytes, desc %#x; "
                     "the receive expects %zu bytes, desc %#x",
                     tp->rank, r->peer, (unsigned long long)r->match.tag,
                     (size_t)r->tp_private[0], (unsigned)r->tp_private[1], r->len,
                     (unsigned)r->match.desc);
    r->done = 1;
}

/* The failure state of tp, as a real transport's: its own abort fails it
 * with the abort's status; any other rank's abort fails it with PEER_LOST
 * (that rank gave up, and says so to its peers). Lock held, on tp's own
 * thread, which alone writes tp->err. */
static loom_status_t state(loom_tp_t *tp)
{
    world_t *w = tp->w;
    if (tp->failed != LOOM_SUCCESS)
        return tp->failed;
    if (tp->aborted != LOOM_SUCCESS)
        tp->failed = loom_err_set(tp->err, tp->aborted, "rank %d: aborted", tp->rank);
    else if (w->gave_up >= 0)
        tp->failed = loom_err_set(tp->err, LOOM_ERR_PEER_LOST,
                                  "rank %d lost rank %d: rank %d gave up (aborted)", tp->rank,
                                  w->gave_up, w->gave_up);
    return tp->failed;
}

/* A peer that destroyed its instance fails whoever still needs it, as a
 * real transport's goodbye does (lock held, tp's own thread). */
static loom_status_t peer_gone(loom_tp_t *tp, int peer)
{
    if (state(tp) == LOOM_SUCCESS && peer != tp->rank && tp->w->tps[peer].gone)
        tp->failed = loom_err_set(tp->err, LOOM_ERR_PEER_LOST,
                                  "rank %d lost rank %d: it destroyed its transport while rank "
                                  "%d still needs it", tp->rank, peer, tp->rank);
    return tp->failed;
}

/* Whether tp has failed, or has a receive posted from a peer that is gone
 * (lock held, tp's own thread). */
static loom_status_t waits_for_gone(loom_tp_t *tp)
{
    world_t *w = tp->w;
    for (int src = 0; src < w->n && state(tp) == LOOM_SUCCESS; src++)
        if (w->posted[tp->rank * w->n + src] != NULL)
            peer_gone(tp, src);
    return tp->failed;
}

static loom_status_t h_isend(loom_tp_t *tp, loom_tp_req_t *req)
{
    world_t *w = tp->w;
    loom_status_t st = LOOM_SUCCESS;

    pthread_mutex_lock(&w->lock);
    if ((st = peer_gone(tp, req->peer)) != LOOM_SUCCESS)
        goto out;
    loom_tp_req_t **pp = &w->posted[req->peer * w->n + tp->rank];
    while (*pp != NULL && (*pp)->match.tag != req->match.tag)
        pp = &(*pp)->next;
    if (w->rendezvous)
        req->tp_private[1] = fingerprint(req->buf, req->len);
    if (*pp != NULL && w->rendezvous) {
        loom_tp_req_t *r = *pp;
        *pp = r->next;
        w->nposted--;
        pair(w, r, req, req->peer);
        goto out;   /* complete once the receiver has read the bytes */
    } else if (*pp != NULL) {
        loom_tp_req_t *r = *pp;
        *pp = r->next;
        w->nposted--;
        deliver(r, &req->match, req->buf, req->len);
        hand_to(w, req->peer, r);
    } else {
        size_t copy = w->rendezvous ? 0 : req->len;
        hmsg_t *m = malloc(sizeof(*m) + copy);
        if (m == NULL) {
            st = loom_err_set(tp->err, LOOM_ERR_NO_MEMORY, "harness: no memory for a message");
            goto out;
        }
        m->next = NULL;
        m->match = req->match;
        m->len = req->len;
        m->sreq = w->rendezvous ? req : NULL;
        if (copy > 0)
            memcpy(m->data, req->buf, copy);
        hmsg_t **qp = &w->queue[tp->rank * w->n + req->peer];
        while (*qp != NULL)
            qp = &(*qp)->next;
        *qp = m;
        if (w->rendezvous)
            goto out;   /* the receiver completes it */
    }
    /* The bytes are copied: the send is complete. */
    req->off = req->len;
    req->status = LOOM_SUCCESS;
    req->done = 1;
out:
    pthread_mutex_unlock(&w->lock);
    return st;
}

static loom_status_t h_irecv(loom_tp_t *tp, loom_tp_req_t *req)
{
    world_t *w = tp->w;
    loom_status_t st = LOOM_SUCCESS;

    pthread_mutex_lock(&w->lock);
    if ((st = state(tp)) != LOOM_SUCCESS)
        goto out;
    hmsg_t **qp = &w->queue[req->peer * w->n + tp->rank];
    while (*qp != NULL && (*qp)->match.tag != req->match.tag)
        qp = &(*qp)->next;
    if (*qp == NULL && (st = peer_gone(tp, req->peer)) != LOOM_SUCCESS)
        goto out;
    if (*qp != NULL) {
        hmsg_t *m = *qp;
        *qp = m->next;
        if (m->sreq != NULL) {
            pair(w, req, m->sreq, tp->rank);
        } else {
            deliver(req, &m->match, m->data, m->len);
            complete(tp, req);
        }
        free(m);
    } else {
        req->next = NULL;
        loom_tp_req_t **pp = &w->posted[tp->rank * w->n + req->peer];
        while (*pp != NULL)
            pp = &(*pp)->next;
        *pp = req;
        w->nposted++;
    }
out:
    pthread_mutex_unlock(&w->lock);
    return st;
}

static loom_status_t h_progress(loom_tp_t *tp, int timeout_ms, int *moved_p)
{
    world_t *w = tp->w;
    struct timespec until;
    loom_status_t st;

    if (timeout_ms > 0) {
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
    }
    *moved_p = 0;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        if (tp->matched != NULL) {
            while (tp->matched != NULL) {
                loom_tp_req_t *r = tp->matched;
                tp->matched = r->next;
                w->nmatched--;
                if (r->off == PAIRED)
                    finish_pair(w, tp, r);
                complete(tp, r);
            }
            *moved_p = 1;
            break;
        }
        if (waits_for_gone(tp) != LOOM_SUCCESS || timeout_ms == 0)
            break;
        if (timeout_ms < 0)
            pthread_cond_wait(&w->cond, &w->lock);
        else if (pthread_cond_timedwait(&w->cond, &w->lock, &until) == ETIMEDOUT)
            timeout_ms = 0;   /* one last look, then leave */
    }
    st = state(tp);
    pthread_mutex_unlock(&w->lock);
    return st;
}

static void h_abort(loom_tp_t *tp, loom_status_t why)
{
    world_t *w = tp->w;
    pthread_mutex_lock(&w->lock);
    if (tp->aborted == LOOM_SUCCESS)
        tp->aborted = why;
    if (w->gave_up < 0)
        w->gave_up = tp->rank;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

/* Drop every request of tp's from the world, as a real transport forgets
 * them at destroy (lock held): its posted receives, the requests handed to
 * it, the messages sent to it, and its rendezvous sends nobody read yet. */
static void forget(world_t *w, loom_tp_t *tp)
{
    for (int src = 0; src < w->n; src++)
        for (loom_tp_req_t **pp = &w->posted[tp->rank * w->n + src]; *pp != NULL;) {
            *pp = (*pp)->next;
            w->nposted--;
        }
    while (tp->matched != NULL) {
        tp->matched = tp->matched->next;
        w->nmatched--;
    }
    for (int i = 0; i < w->n * w->n; i++) {
        int to_us = i % w->n == tp->rank;
        for (hmsg_t **qp = &w->queue[i]; *qp != NULL;) {
            hmsg_t *m = *qp;
            if (to_us || (m->sreq != NULL && i / w->n == tp->rank)) {
                *qp = m->next;
                free(m);
            } else {
                qp = &m->next;
            }
        }
    }
}

/* The world owns the instances; loom_harness_run frees them after the threads
 * end. Destroying one forgets its requests and fails the peers that wait for
 * it (their next progress, irecv or isend says PEER_LOST). */
static void h_destroy(loom_tp_t *tp, double timeout_s)
{
    world_t *w = tp->w;
    (void)timeout_s;
    pthread_mutex_lock(&w->lock);
    forget(w, tp);
    tp->gone = 1;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

/* Small, so the staged algorithms go through many chunks even in unit tests. */
#define HARNESS_WINDOW 65536

static void *h_window(loom_tp_t *tp, int peer, size_t *len_p)
{
    *len_p = HARNESS_WINDOW;
    return peer >= 0 && peer < tp->w->n ? tp->w->windows + (size_t)peer * HARNESS_WINDOW : NULL;
}

/* Ranks are threads of one process: a peer's memory is ours to read. */
static int h_peer_readable(loom_tp_t *tp, int peer)
{
    return peer >= 0 && peer < tp->w->n;
}

static loom_status_t h_peer_read(loom_tp_t *tp, int peer, void *buf, uint64_t addr, size_t len)
{
    (void)tp;
    (void)peer;
    if (len)
        memcpy(buf, (const void *)(uintptr_t)addr, len);
    return LOOM_SUCCESS;
}

const loom_transport_ops_t loom_harness_transport = {
    .size = sizeof(loom_transport_ops_t),
    .name = "harness",
    .create = NULL,
    .connect = NULL,
    .isend = h_isend,
    .irecv = h_irecv,
    .progress = h_progress,
    .mem_register = NULL,
    .mem_deregister = NULL,
    .abort = h_abort,
    .destroy = h_destroy,
    .peer_readable = h_peer_readable,
    .peer_read = h_peer_read,
    .window = h_window,
};

typedef struct rank_thread {
    pthread_t tid;
    loom_ctx_t ctx;
    loom_err_t err;
    void (*fn)(loom_ctx_t *ctx, void *arg);
    void *arg;
} rank_thread_t;

static void *rank_main(void *p)
{
    rank_thread_t *t = p;
    t->fn(&t->ctx, t->arg);
    return NULL;
}

int loom_harness_run(int nranks, void (*fn)(loom_ctx_t *ctx, void *arg), void *arg)
{
    return loom_harness_run_ex(nranks, 0, fn, arg);
}

int loom_harness_run_ex(int nranks, int flags, void (*fn)(loom_ctx_t *ctx, void *arg), void *arg)
{
    return loom_harness_run_nodes(nranks, flags, 0, fn, arg);
}

int loom_harness_run_nodes(int nranks, int flags, int per_node,
                           void (*fn)(loom_ctx_t *ctx, void *arg), void *arg)
{
    world_t w;
    int node_of[LOOM_HARNESS_MAX_RANKS];
    rank_thread_t *threads = NULL;
    int started = 0, ret = -1;

    if (nranks < 1 || nranks > LOOM_HARNESS_MAX_RANKS || per_node < 0)
        return -1;
    for (int r = 0; r < nranks; r++)
        node_of[r] = per_node ? r / per_node : 0;
    memset(&w, 0, sizeof(w));
    w.n = nranks;
    w.rendezvous = (flags & LOOM_HARNESS_RENDEZVOUS) != 0;
    w.gave_up = -1;
    w.queue = calloc((size_t)nranks * (size_t)nranks, sizeof(*w.queue));
    w.posted = calloc((size_t)nranks * (size_t)nranks, sizeof(*w.posted));
    w.tps = calloc((size_t)nranks, sizeof(*w.tps));
    /* Aligned as the transport's (a window's head is two cache lines). */
    w.windows = aligned_alloc(64, (size_t)nranks * HARNESS_WINDOW);
    if (w.windows)
        memset(w.windows, 0, (size_t)nranks * HARNESS_WINDOW);
    threads = calloc((size_t)nranks, sizeof(*threads));
    if (w.queue == NULL || w.posted == NULL || w.tps == NULL || w.windows == NULL || threads == NULL)
        goto free_world;
    pthread_mutex_init(&w.lock, NULL);
    pthread_cond_init(&w.cond, NULL);

    for (int r = 0; r < nranks; r++) {
        rank_thread_t *t = &threads[r];
        loom_err_clear(&t->err);
        w.tps[r].w = &w;
        w.tps[r].rank = r;
        w.tps[r].err = &t->err;
        t->ctx.rank = r;
        t->ctx.size = nranks;
        t->ctx.tp_ops = &loom_harness_transport;
        t->ctx.tp = &w.tps[r];
        t->ctx.timeout_s = 10.0;
        t->ctx.spin_us = 0;
        t->ctx.err = &t->err;
        t->ctx.segment_bytes = 4096;
        if (per_node > 0)
            loom_ctx_set_topology(&t->ctx, node_of, (nranks + per_node - 1) / per_node);
        t->fn = fn;
        t->arg = arg;
    }
    ret = 0;
    for (; started < nranks; started++) {
        if (pthread_create(&threads[started].tid, NULL, rank_main, &threads[started]) != 0) {
            /* Let the ranks already running fail fast instead of timing out. */
            h_abort(&w.tps[0], LOOM_ERR_INTERNAL);
            ret = -1;
            break;
        }
    }
    for (int r = 0; r < started; r++)
        pthread_join(threads[r].tid, NULL);

    /* Whatever is left was sent to nobody, waited for in vain or never waited
     * for. Pending requests lived on stacks that are gone: count them, never
     * follow them. */
    if (ret >= 0)
        ret += w.nposted + w.nmatched;
    for (int i = 0; i < nranks * nranks; i++) {
        while (w.queue[i] != NULL) {
            hmsg_t *m = w.queue[i];
            w.queue[i] = m->next;
            free(m);
            if (ret >= 0)
                ret++;
        }
    }
    for (int r = 0; r < nranks; r++)
        free(threads[r].ctx.scratch);
    pthread_cond_destroy(&w.cond);
    pthread_mutex_destroy(&w.lock);
free_world:
    free(threads);
    free(w.windows);
    free(w.tps);
    free(w.posted);
    free(w.queue);
    return ret;
}
