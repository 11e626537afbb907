/*
 * coll.c - the public collective and point-to-point calls: check the
 * arguments, normalise in-place forms, and run the operation either inline
 * (the fast path: nothing queued) or through the communicator's queue, which a
 * worker thread drains in submission order. Blocking calls queue too when
 * non-blocking ones are still pending, so that every rank runs its
 * collectives in the order it called them.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "accel.h"
#include "comm.h"
#include "base/log.h"
#include "base/timeline.h"
#include "base/reduce.h"
#include "base/types.h"
#include "transports/wire.h"

#define LOOM_DESC_P2P 0xff

/* ---- execution ------------------------------------------------------------ */

static uint64_t coll_total(const loom_comm_t c, const loom_coll_args_t *a)
{
    if (a->coll == LOOM_COLL_ALLGATHERV) {
        uint64_t total = 0;
        for (int i = 0; i < c->size; i++)
            total += a->counts[i];
        return total;
    }
    return a->coll == LOOM_COLL_ALLTOALLV ? 0 : a->count;
}

static int coll_has_op(loom_coll_t coll)
{
    return coll == LOOM_COLL_ALLREDUCE || coll == LOOM_COLL_REDUCE ||
           coll == LOOM_COLL_REDUCE_SCATTER;
}

/* A failed operation leaves messages in flight: the streams are no longer in
 * step with the peers', so nothing more can run on this communicator. The
 * transport tells every peer it reaches, naming the rank a timed-out wait
 * blamed (c->fault), so that none of them waits out its own LOOM_TIMEOUT on
 * a rank that is only waiting in turn. */
static void mark_broken(loom_comm_t c, loom_status_t st)
{
    if (c->broken)
        return;
    c->broken = st;
    snprintf(c->broken_msg, sizeof(c->broken_msg), "%s",
             c->work_err.msg[0] ? c->work_err.msg : loom_strerror(st));
    const loom_transport_ops_t *ops = c->tp_ops;
    if (ops->size >= sizeof(loom_transport_ops_t) && ops->give_up) {
        loom_tp_fault_t f = c->fault;
        if (f.reporter < 0 && ops->fault)
            ops->fault(c->tp, &f);
        if (f.reporter < 0)
            f = (loom_tp_fault_t){.culprit = -1, .reporter = c->rank, .why = st};
        ops->give_up(c->tp, st, &f);
    } else {
        ops->abort(c->tp, st);
    }
}

static loom_status_t run_collective(loom_comm_t c, const loom_coll_args_t *a)
{
    const char *cname = loom_coll_name(a->coll);
    const loom_algo_rule_t *rule =
        loom_algo_rule_match(c->algo_rules, c->n_algo_rules, &c->ctx, a);
    const char *forced = rule ? rule->name : NULL;
    const loom_algo_t *algo = loom_algo_select(&c->ctx, a, forced);
    if (!algo) {
        char names[256] = "";
        size_t off = 0;
        for (size_t i = 0; i < loom_num_algorithms && off < sizeof(names); i++)
            if (loom_algorithms[i].coll == a->coll)
                off += (size_t)snprintf(names + off, sizeof(names) - off, "%s%s",
                                        off ? ", " : "", loom_algorithms[i].name);
        return loom_err_set(&c->work_err, LOOM_ERR_INVALID_ARG,
                            "LOOM_ALGO forces %s=%s, which %s (%s has: %s)", cname, forced,
                            loom_algo_find(a->coll, forced) ? "cannot run this call"
                                                            : "does not exist",
                            cname, names);
    }
    c->ctx.seq++;
    c->ctx.desc = loom_desc_make((int)a->coll, (int)a->dtype, coll_has_op(a->coll) ? (int)a->op : 0);
    c->ctx.total = coll_total(c, a);
    LOOM_TRACE("coll", "rank %d: %s %s count %zu seq %llu", c->rank, cname, algo->name,
               a->count, (unsigned long long)c->ctx.seq);
    double t0 = c->ctx.timeline ? loom_timeline_now_us() : 0;
    loom_status_t st = algo->run(&c->ctx, a);
    if (c->ctx.timeline) {
        char args[256];
        snprintf(args, sizeof(args),
                 "\"algorithm\": \"%s\", \"count\": %zu, \"dtype\": \"%s\", \"op\": \"%s\", "
                 "\"root\": %d, \"seq\": %llu, \"status\": \"%s\"",
                 algo->name, a->count, loom_dtype_name(a->dtype), loom_op_name(a->op), a->root,
                 (unsigned long long)c->ctx.seq, loom_strerror(st));
        loom_timeline_span(c->ctx.timeline, cname, "collective", t0, loom_timeline_now_us(),
                           c->ctx.timeline_tid, args);
    }
    if (st != LOOM_SUCCESS)
        mark_broken(c, st);
    return st;
}

/* The executor the accelerator runs its staged passes through. */
static loom_status_t run_collective_host(void *c, const loom_coll_args_t *a)
{
    return run_collective(c, a);
}

/* ---- GPUDirect RDMA: GPU memory straight to the transport (cuda/gdr.c) ---- */

/* Whether the transport of peer takes GPU memory (transport.h's device_memory). */
static int gdr_to(loom_comm_t c, int peer, char *why, size_t whylen)
{
    const loom_transport_ops_t *ops = c->tp_ops;
    if (ops->size < offsetof(loom_transport_ops_t, device_memory) + sizeof(ops->device_memory) ||
        !ops->device_memory) {
        if (why && whylen)
            snprintf(why, whylen, "transport %s takes host memory only", ops->name);
        return 0;
    }
    return ops->device_memory(c->tp, peer, why, whylen);
}

int loom_comm_gdr(loom_comm_t c, const int *peers, int npeers, char *why, size_t whylen)
{
    if (why && whylen)
        snprintf(why, whylen, "a single rank: nothing goes over a network");
    const int n = peers ? npeers : c->size;
    int verdict = 0;
    for (int i = 0; i < n && verdict >= 0; i++) {
        const int peer = peers ? peers[i] : i;
        if (peer == c->rank)
            continue;
        if ((verdict = gdr_to(c, peer, why, whylen)) == 0)
            break;
    }
    return verdict;
}

int loom_comm_hier(loom_comm_t c, loom_hier_t *h)
{
    return loom_hier_init(&c->ctx, h);
}

void loom_comm_dev_begin(loom_comm_t c, const loom_coll_args_t *a)
{
    c->ctx.seq++;
    c->ctx.desc = loom_desc_make((int)a->coll, (int)a->dtype, coll_has_op(a->coll) ? (int)a->op : 0);
    c->ctx.total = coll_total(c, a);
}

loom_status_t loom_comm_dev_post(loom_comm_t c, uint32_t step, const loom_dev_xfer_t *x, int n,
                                 loom_tp_req_t *reqs)
{
    loom_status_t st = LOOM_SUCCESS;
    int posted = 0;
    memset(reqs, 0, sizeof(*reqs) * (size_t)n);
    c->ctx.device_mem = 1;
    /* Receives first, so that no rendezvous waits for a receive posted later. */
    for (int pass = 0; pass < 2 && st == LOOM_SUCCESS; pass++)
        for (int i = 0; i < n && st == LOOM_SUCCESS; i++) {
            if (x[i].is_send != pass)
                continue;
            st = x[i].is_send
                     ? loom_p2p_isend(&c->ctx, x[i].peer, step, x[i].buf, x[i].bytes, &reqs[posted])
                     : loom_p2p_irecv(&c->ctx, x[i].peer, step, x[i].buf, x[i].bytes, &reqs[posted]);
            if (st == LOOM_SUCCESS)
                posted++;
        }
    c->ctx.device_mem = 0;
    if (st != LOOM_SUCCESS) {
        mark_broken(c, st);   /* fails what was posted, so a wait for it ends */
        loom_p2p_waitall(&c->ctx, reqs, posted);
    }
    /* Entries never posted count as done, so a wait over all n ends. */
    for (int i = posted; i < n; i++)
        reqs[i].done = 1;
    return st;
}

loom_status_t loom_comm_dev_wait(loom_comm_t c, loom_tp_req_t *reqs, int n)
{
    loom_status_t st = loom_p2p_waitall(&c->ctx, reqs, n);
    if (st != LOOM_SUCCESS)
        mark_broken(c, st);
    return st;
}

loom_status_t loom_comm_dev_p2p(loom_comm_t c, uint32_t step, const loom_dev_xfer_t *x, int n)
{
    loom_tp_req_t stack[16], *reqs = n <= 16 ? stack : calloc((size_t)n, sizeof(*reqs));
    if (!reqs)
        return loom_err_set(&c->work_err, LOOM_ERR_NO_MEMORY, "out of memory");
    loom_status_t st = loom_comm_dev_post(c, step, x, n, reqs);
    if (st == LOOM_SUCCESS)
        st = loom_comm_dev_wait(c, reqs, n);
    if (reqs != stack)
        free(reqs);
    return st;
}

/* A receive from any rank takes the first rank, going round from the one
 * after the last chosen (so that no sender starves the others), that has a
 * message for its tag; until then it is not posted at all. */
static loom_status_t any_source_try(loom_comm_t c, struct loom_request *op)
{
    for (int i = 0; i < c->size; i++) {
        int peer = (c->any_next + i) % c->size;
        if (!c->tp_ops->probe(c->tp, peer, op->tp_req.match.tag))
            continue;
        c->any_next = (peer + 1) % c->size;
        op->tp_req.peer = peer;
        if (op->source_out)
            *op->source_out = peer;
        op->posted = 1;
        return c->tp_ops->irecv(c->tp, &op->tp_req);
    }
    return LOOM_SUCCESS;
}

/* The blocking form: probe between progress calls, bounded by LOOM_TIMEOUT
 * without progress, as every wait is. */
static loom_status_t any_source_wait(loom_comm_t c, struct loom_request *op)
{
    double last_moved = loom_now_s();
    loom_status_t st = any_source_try(c, op);
    while (st == LOOM_SUCCESS && !op->posted) {
        if (atomic_load(&c->aborted))
            return loom_err_set(&c->work_err, LOOM_ERR_ABORTED, "the communicator was aborted");
        int moved = 0;
        if ((st = c->tp_ops->progress(c->tp, 1, &moved)) != LOOM_SUCCESS)
            break;
        double now = loom_now_s();
        if (moved)
            last_moved = now;
        else if (now - last_moved > c->ctx.timeout_s) {
            char why[160];
            loom_p2p_blame(&c->ctx, -1, why, sizeof(why));
            return loom_err_set(&c->work_err, LOOM_ERR_TIMEOUT,
                                "timed out: rank %d waited %.1f s (LOOM_TIMEOUT) for a message "
                                "with tag %llu from any rank%s", c->rank, c->ctx.timeout_s,
                                (unsigned long long)op->tp_req.match.tag, why);
        }
        st = any_source_try(c, op);
    }
    return st;
}

loom_status_t loom_comm_execute(loom_comm_t c, struct loom_request *op, int wait)
{
    loom_err_clear(&c->work_err);
    if (atomic_load(&c->aborted))
        return loom_err_set(&c->work_err, LOOM_ERR_ABORTED, "the communicator was aborted");
    if (c->broken)
        return loom_err_set(&c->work_err, c->broken,
                            "the communicator failed earlier (%s) and can no longer be used: %s",
                            loom_strerror(c->broken), c->broken_msg);
    if (op->kind == LOOM_OP_COLL) {
        /* Device buffers (checked at submission): staged by the accelerator,
         * which runs its host collectives through run_collective. */
        int on_device = 0, device = -1;
        loom_err_t ignored;
        loom_err_clear(&ignored);
        if (loom_accel->coll_memory(&op->args, c->size, c->rank, &on_device, &device,
                                    &ignored) == LOOM_SUCCESS && on_device) {
            int on_worker = c->worker_started && pthread_equal(pthread_self(), c->worker);
            loom_status_t st = loom_accel->run_coll(c, device, &op->args, on_worker,
                                                    run_collective_host, c, &c->work_err);
            if (st != LOOM_SUCCESS)
                mark_broken(c, st);
            return st;
        }
        return run_collective(c, &op->args);
    }
    loom_status_t st;
    if (op->any_source)
        st = wait ? any_source_wait(c, op) : any_source_try(c, op);
    else
        st = op->kind == LOOM_OP_SEND ? c->tp_ops->isend(c->tp, &op->tp_req)
                                      : c->tp_ops->irecv(c->tp, &op->tp_req);
    if (st == LOOM_SUCCESS && wait)
        st = loom_p2p_wait(&c->ctx, &op->tp_req);
    if (st != LOOM_SUCCESS)
        mark_broken(c, st);
    return st;
}

/* Under qlock. */
static void complete(loom_comm_t c, struct loom_request *op, loom_status_t st)
{
    op->status = st;
    if (st != LOOM_SUCCESS) {
        memcpy(op->msg, c->work_err.msg[0] ? c->work_err.msg : loom_strerror(st), sizeof(op->msg));
        op->msg[sizeof(op->msg) - 1] = '\0';
    }
    op->done = 1;
    pthread_cond_broadcast(&c->done_cond);
}

/* Complete every posted p2p request the transport has finished. Under qlock. */
static void reap_active(loom_comm_t c, loom_status_t failure)
{
    struct loom_request **pp = &c->active;
    while (*pp) {
        struct loom_request *op = *pp;
        if (op->tp_req.done || failure != LOOM_SUCCESS) {
            *pp = op->next;
            complete(c, op, op->tp_req.done ? op->tp_req.status : failure);
        } else {
            pp = &op->next;
        }
    }
}

static void *worker_main(void *arg)
{
    loom_comm_t c = arg;
    double last_moved = loom_now_s();
    pthread_mutex_lock(&c->qlock);
    for (;;) {
        if (c->qhead) {
            struct loom_request *op = c->qhead;
            c->qhead = op->next;
            if (!c->qhead)
                c->qtail = NULL;
            c->busy = 1;
            pthread_mutex_unlock(&c->qlock);
            loom_status_t st = loom_comm_execute(c, op, 0);
            pthread_mutex_lock(&c->qlock);
            c->busy = 0;
            if (op->kind != LOOM_OP_COLL && st == LOOM_SUCCESS && !op->tp_req.done) {
                op->next = c->active;
                c->active = op;
                last_moved = loom_now_s();
            } else {
                complete(c, op, st);
            }
            reap_active(c, c->broken);
            continue;
        }
        if (c->active) {
            pthread_mutex_unlock(&c->qlock);
            int moved = 0;
            loom_err_clear(&c->work_err);
            loom_status_t st = c->broken ? c->broken : c->tp_ops->progress(c->tp, 1, &moved);
            double now = loom_now_s();
            if (moved)
                last_moved = now;
            /* Receives from any rank still waiting for a sender: only this
             * thread changes the active list, so it is walked unlocked. */
            for (struct loom_request *op = c->active; op && st == LOOM_SUCCESS; op = op->next)
                if (op->any_source && !op->posted) {
                    st = any_source_try(c, op);
                    if (op->posted)
                        last_moved = now;
                }
            if (st == LOOM_SUCCESS && now - last_moved > c->ctx.timeout_s) {
                /* The oldest posted request names the peer waited on. */
                int waited_on = -1;
                for (struct loom_request *op = c->active; op; op = op->next)
                    if (op->posted || !op->any_source)
                        waited_on = op->tp_req.peer;
                char why[160];
                loom_p2p_blame(&c->ctx, waited_on, why, sizeof(why));
                st = loom_err_set(&c->work_err, LOOM_ERR_TIMEOUT,
                                  "timed out: a non-blocking send/recv of rank %d made no "
                                  "progress for %.1f s (LOOM_TIMEOUT)%s", c->rank,
                                  c->ctx.timeout_s, why);
            }
            if (st != LOOM_SUCCESS)
                mark_broken(c, st);
            pthread_mutex_lock(&c->qlock);
            reap_active(c, st);
            continue;
        }
        if (c->stopping)
            break;
        pthread_cond_wait(&c->qcond, &c->qlock);
    }
    pthread_mutex_unlock(&c->qlock);
    return NULL;
}

/* Under qlock. */
static loom_status_t enqueue(loom_comm_t c, struct loom_request *op)
{
    if (!c->worker_started) {
        if (pthread_create(&c->worker, NULL, worker_main, c) != 0)
            return LOOM_ERR_NO_MEMORY;
        c->worker_started = 1;
    }
    op->next = NULL;
    if (c->qtail)
        c->qtail->next = op;
    else
        c->qhead = op;
    c->qtail = op;
    pthread_cond_signal(&c->qcond);
    return LOOM_SUCCESS;
}

void loom_comm_stop_worker(loom_comm_t c)
{
    pthread_mutex_lock(&c->qlock);
    int started = c->worker_started;
    c->stopping = 1;
    pthread_cond_signal(&c->qcond);
    pthread_mutex_unlock(&c->qlock);
    if (started)
        pthread_join(c->worker, NULL);
}

/* Run op for a blocking caller (op lives on the caller's stack), or queue it
 * for a non-blocking one (op is heap-allocated and handed out as the request). */
static loom_status_t submit(loom_comm_t c, struct loom_request *op, loom_request_t *req_p)
{
    op->comm = c;
    pthread_mutex_lock(&c->qlock);
    if (!req_p && !c->qhead && !c->busy && !c->active) {
        pthread_mutex_unlock(&c->qlock);
        loom_status_t st = loom_comm_execute(c, op, 1);
        if (st != LOOM_SUCCESS)
            loom_comm_publish_error(c, st);
        return st;
    }
    if (enqueue(c, op) != LOOM_SUCCESS) {
        pthread_mutex_unlock(&c->qlock);
        return loom_comm_fail(c, LOOM_ERR_NO_MEMORY, "cannot start the progress thread");
    }
    if (req_p) {
        pthread_mutex_unlock(&c->qlock);
        *req_p = op;
        return LOOM_SUCCESS;
    }
    op->blocking = 1;
    while (!op->done)
        pthread_cond_wait(&c->done_cond, &c->qlock);
    pthread_mutex_unlock(&c->qlock);
    if (op->status != LOOM_SUCCESS)
        loom_comm_fail(c, op->status, "%s", op->msg);
    return op->status;
}

loom_status_t loom_wait(loom_request_t req)
{
    if (!req)
        return loom_global_fail(LOOM_ERR_INVALID_ARG, "loom_wait: NULL request");
    loom_comm_t c = req->comm;
    pthread_mutex_lock(&c->qlock);
    while (!req->done)
        pthread_cond_wait(&c->done_cond, &c->qlock);
    pthread_mutex_unlock(&c->qlock);
    loom_status_t st = req->status;
    if (st != LOOM_SUCCESS)
        loom_comm_fail(c, st, "%s", req->msg);
    free(req);
    return st;
}

loom_status_t loom_test(loom_request_t req, int *done)
{
    if (!req || !done)
        return loom_global_fail(LOOM_ERR_INVALID_ARG, "loom_test: NULL request or flag");
    loom_comm_t c = req->comm;
    pthread_mutex_lock(&c->qlock);
    int finished = req->done;
    pthread_mutex_unlock(&c->qlock);
    *done = finished;
    return finished ? loom_wait(req) : LOOM_SUCCESS;
}

/* ---- argument checks ------------------------------------------------------ */

#define CHECK(cond, ...)                                                              \
    do {                                                                              \
        if (!(cond))                                                                  \
            return loom_comm_fail(c, LOOM_ERR_INVALID_ARG, __VA_ARGS__);              \
    } while (0)

static loom_status_t check_comm(loom_comm_t c, const char *fn)
{
    if (!c)
        return loom_global_fail(LOOM_ERR_INVALID_ARG, "%s: the communicator is NULL", fn);
    return LOOM_SUCCESS;
}

/* count * n elements of dt must be addressable. */
static int bytes_fit(size_t count, size_t n, size_t esize)
{
    return n == 0 || esize == 0 || count <= SIZE_MAX / n / esize;
}

static loom_status_t check_common(loom_comm_t c, const char *fn, loom_dtype_t dt,
                                  int needs_op, loom_op_t op, int has_root, int root)
{
    CHECK(loom_dtype_valid(dt), "%s: unknown dtype %d", fn, (int)dt);
    CHECK(!needs_op || loom_op_valid(op), "%s: unknown reduction op %d", fn, (int)op);
    CHECK(!needs_op || loom_op_takes_dtype(op, dt), "%s: %s applies to integer dtypes, not %s",
          fn, loom_op_name(op), loom_dtype_name(dt));
    CHECK(!has_root || (root >= 0 && root < c->size),
          "%s: root %d is not a rank of this communicator (size %d)", fn, root, c->size);
    return LOOM_SUCCESS;
}

static loom_status_t run_or_queue(loom_comm_t c, const loom_coll_args_t *a, loom_request_t *req)
{
    int on_device, device;
    loom_err_t err;
    loom_err_clear(&err);
    if (loom_accel->coll_memory(a, c->size, c->rank, &on_device, &device, &err) != LOOM_SUCCESS)
        return loom_comm_fail(c, LOOM_ERR_INVALID_ARG, "%s", err.msg);
    if (req) {
        struct loom_request *op = calloc(1, sizeof(*op));
        if (!op)
            return loom_comm_fail(c, LOOM_ERR_NO_MEMORY, "out of memory");
        op->kind = LOOM_OP_COLL;
        op->args = *a;
        loom_status_t st = submit(c, op, req);
        if (st != LOOM_SUCCESS)
            free(op);
        return st;
    }
    struct loom_request op = {.kind = LOOM_OP_COLL, .args = *a};
    return submit(c, &op, NULL);
}

/* A call that moves nothing still yields a request the caller can wait on. */
static loom_status_t nothing_to_do(loom_comm_t c, loom_request_t *req)
{
    if (!req)
        return LOOM_SUCCESS;
    struct loom_request *op = calloc(1, sizeof(*op));
    if (!op)
        return loom_comm_fail(c, LOOM_ERR_NO_MEMORY, "out of memory");
    op->comm = c;
    op->done = 1;
    *req = op;
    return LOOM_SUCCESS;
}

#define IN_PLACE(p) ((const void *)(p) == LOOM_IN_PLACE)

/* ---- collectives ---------------------------------------------------------- */

static loom_status_t do_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                                  loom_dtype_t dt, loom_op_t op, loom_comm_t c,
                                  loom_request_t *req)
{
    loom_status_t st;
    if ((st = check_comm(c, "allreduce")) != LOOM_SUCCESS ||
        (st = check_common(c, "allreduce", dt, 1, op, 0, 0)) != LOOM_SUCCESS)
        return st;
    size_t es = loom_dtype_size(dt);
    CHECK(bytes_fit(count, 1, es), "allreduce: count %zu is too large", count);
    if (count == 0)
        return nothing_to_do(c, req);
    CHECK(sendbuf && recvbuf, "allreduce: NULL buffer");
    loom_coll_args_t a = {.coll = LOOM_COLL_ALLREDUCE, .sendbuf = IN_PLACE(sendbuf) ? recvbuf : sendbuf,
                          .recvbuf = recvbuf, .count = count, .esize = es, .dtype = dt, .op = op};
    return run_or_queue(c, &a, req);
}

static loom_status_t do_broadcast(void *buf, size_t count, loom_dtype_t dt, int root,
                                  loom_comm_t c, loom_request_t *req)
{
    loom_status_t st;
    if ((st = check_comm(c, "broadcast")) != LOOM_SUCCESS ||
        (st = check_common(c, "broadcast", dt, 0, LOOM_SUM, 1, root)) != LOOM_SUCCESS)
        return st;
    size_t es = loom_dtype_size(dt);
    CHECK(bytes_fit(count, 1, es), "broadcast: count %zu is too large", count);
    if (count == 0)
        return nothing_to_do(c, req);
    CHECK(buf, "broadcast: NULL buffer");
    loom_coll_args_t a = {.coll = LOOM_COLL_BROADCAST, .sendbuf = buf, .recvbuf = buf,
                          .count = count, .esize = es, .dtype = dt, .root = root};
    return run_or_queue(c, &a, req);
}

static loom_status_t do_reduce(const void *sendbuf, void *recvbuf, size_t count, loom_dtype_t dt,
                               loom_op_t op, int root, loom_comm_t c, loom_request_t *req)
{
    loom_status_t st;
    if ((st = check_comm(c, "reduce")) != LOOM_SUCCESS ||
        (st = check_common(c, "reduce", dt, 1, op, 1, root)) != LOOM_SUCCESS)
        return st;
    size_t es = loom_dtype_size(dt);
    CHECK(bytes_fit(count, 1, es), "reduce: count %zu is too large", count);
    if (count == 0)
        return nothing_to_do(c, req);
    CHECK(sendbuf && (!IN_PLACE(sendbuf) || recvbuf), "reduce: NULL buffer");
    CHECK(c->rank != root || recvbuf, "reduce: NULL recvbuf at the root");
    loom_coll_args_t a = {.coll = LOOM_COLL_REDUCE, .sendbuf = IN_PLACE(sendbuf) ? recvbuf : sendbuf,
                          .recvbuf = c->rank == root || IN_PLACE(sendbuf) ? recvbuf : NULL,
                          .count = count, .esize = es, .dtype = dt, .op = op, .root = root};
    return run_or_queue(c, &a, req);
}

static loom_status_t do_allgather(const void *sendbuf, void *recvbuf, size_t count,
                                  loom_dtype_t dt, loom_comm_t c, loom_request_t *req)
{
    loom_status_t st;
    if ((st = check_comm(c, "allgather")) != LOOM_SUCCESS ||
        (st = check_common(c, "allgather", dt, 0, LOOM_SUM, 0, 0)) != LOOM_SUCCESS)
        return st;
    size_t es = loom_dtype_size(dt);
    CHECK(bytes_fit(count, (size_t)c->size, es), "allgather: count %zu is too large", count);
    if (count == 0)
        return nothing_to_do(c, req);
    CHECK(sendbuf && recvbuf, "allgather: NULL buffer");
    char *mine = (char *)recvbuf + (size_t)c->rank * count * es;
    loom_coll_args_t a = {.coll = LOOM_COLL_ALLGATHER, .sendbuf = IN_PLACE(sendbuf) ? mine : sendbuf,
                          .recvbuf = recvbuf, .count = count, .esize = es, .dtype = dt};
    return run_or_queue(c, &a, req);
}

static loom_status_t do_allgatherv(const void *sendbuf, size_t sendcount, void *recvbuf,
                                   const size_t *recvcounts, const size_t *displs,
                                   loom_dtype_t dt, loom_comm_t c, loom_request_t *req)
{
    loom_status_t st;
    if ((st = check_comm(c, "allgatherv")) != LOOM_SUCCESS ||
        (st = check_common(c, "allgatherv", dt, 0, LOOM_SUM, 0, 0)) != LOOM_SUCCESS)
        return st;
    CHECK(recvcounts && displs, "allgatherv: NULL recvcounts or displs");
    size_t es = loom_dtype_size(dt);
    CHECK(recvcounts[c->rank] == sendcount,
          "allgatherv: sendcount %zu differs from recvcounts[%d] = %zu", sendcount, c->rank,
          recvcounts[c->rank]);
    size_t total = 0;
    for (int i = 0; i < c->size; i++) {
        CHECK(bytes_fit(recvcounts[i], 1, es) && bytes_fit(displs[i], 1, es) &&
                  recvcounts[i] + displs[i] >= displs[i],
              "allgatherv: recvcounts[%d] or displs[%d] is too large", i, i);
        total += recvcounts[i];
    }
    CHECK(total == 0 || recvbuf, "allgatherv: NULL recvbuf");
    CHECK(sendcount == 0 || sendbuf, "allgatherv: NULL sendbuf");
    char *mine = (char *)recvbuf + displs[c->rank] * es;
    loom_coll_args_t a = {.coll = LOOM_COLL_ALLGATHERV,
                          .sendbuf = IN_PLACE(sendbuf) || !sendbuf ? mine : sendbuf,
                          .recvbuf = recvbuf, .count = sendcount, .esize = es, .dtype = dt,
                          .counts = recvcounts, .displs = displs};
    return run_or_queue(c, &a, req);
}

static loom_status_t do_reduce_scatter(const void *sendbuf, void *recvbuf, size_t count,
                                       loom_dtype_t dt, loom_op_t op, loom_comm_t c,
                                       loom_request_t *req)
{
    loom_status_t st;
    if ((st = check_comm(c, "reduce_scatter")) != LOOM_SUCCESS ||
        (st = check_common(c, "reduce_scatter", dt, 1, op, 0, 0)) != LOOM_SUCCESS)
        return st;
    size_t es = loom_dtype_size(dt);
    CHECK(bytes_fit(count, (size_t)c->size, es), "reduce_scatter: count %zu is too large", count);
    if (count == 0)
        return nothing_to_do(c, req);
    CHECK(sendbuf && recvbuf, "reduce_scatter: NULL buffer");
    loom_coll_args_t a = {.coll = LOOM_COLL_REDUCE_SCATTER,
                          .sendbuf = IN_PLACE(sendbuf) ? recvbuf : sendbuf, .recvbuf = recvbuf,
                          .count = count, .esize = es, .dtype = dt, .op = op};
    return run_or_queue(c, &a, req);
}

static loom_status_t do_alltoall(const void *sendbuf, void *recvbuf, size_t count,
                                 loom_dtype_t dt, loom_comm_t c, loom_request_t *req)
{
    loom_status_t st;
    if ((st = check_comm(c, "alltoall")) != LOOM_SUCCESS ||
        (st = check_common(c, "alltoall", dt, 0, LOOM_SUM, 0, 0)) != LOOM_SUCCESS)
        return st;
    size_t es = loom_dtype_size(dt);
    CHECK(bytes_fit(count, (size_t)c->size, es), "alltoall: count %zu is too large", count);
    if (count == 0)
        return nothing_to_do(c, req);
    CHECK(sendbuf && recvbuf, "alltoall: NULL buffer");
    loom_coll_args_t a = {.coll = LOOM_COLL_ALLTOALL, .sendbuf = IN_PLACE(sendbuf) ? recvbuf : sendbuf,
                          .recvbuf = recvbuf, .count = count, .esize = es, .dtype = dt};
    return run_or_queue(c, &a, req);
}

static loom_status_t do_alltoallv(const void *sendbuf, const size_t *sendcounts,
                                  const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                  const size_t *rdispls, loom_dtype_t dt, loom_comm_t c,
                                  loom_request_t *req)
{
    loom_status_t st;
    if ((st = check_comm(c, "alltoallv")) != LOOM_SUCCESS ||
        (st = check_common(c, "alltoallv", dt, 0, LOOM_SUM, 0, 0)) != LOOM_SUCCESS)
        return st;
    CHECK(recvcounts && rdispls, "alltoallv: NULL recvcounts or rdispls");
    int in_place = IN_PLACE(sendbuf);
    CHECK(in_place || (sendcounts && sdispls), "alltoallv: NULL sendcounts or sdispls");
    size_t es = loom_dtype_size(dt);
    size_t sent = 0, received = 0;
    for (int i = 0; i < c->size; i++) {
        CHECK(bytes_fit(recvcounts[i], 1, es) && bytes_fit(rdispls[i], 1, es),
              "alltoallv: recvcounts[%d] or rdispls[%d] is too large", i, i);
        received += recvcounts[i];
        if (!in_place) {
            CHECK(bytes_fit(sendcounts[i], 1, es) && bytes_fit(sdispls[i], 1, es),
                  "alltoallv: sendcounts[%d] or sdispls[%d] is too large", i, i);
            sent += sendcounts[i];
        }
    }
    CHECK(received == 0 || recvbuf, "alltoallv: NULL recvbuf");
    CHECK(in_place || sent == 0 || sendbuf, "alltoallv: NULL sendbuf");
    loom_coll_args_t a = {.coll = LOOM_COLL_ALLTOALLV, .sendbuf = in_place ? recvbuf : sendbuf,
                          .recvbuf = recvbuf, .esize = es, .dtype = dt,
                          .counts = recvcounts, .displs = rdispls,
                          .scounts = in_place ? recvcounts : sendcounts,
                          .sdispls = in_place ? rdispls : sdispls};
    return run_or_queue(c, &a, req);
}

static loom_status_t do_gather(const void *sendbuf, void *recvbuf, size_t count, loom_dtype_t dt,
                               int root, loom_comm_t c, loom_request_t *req)
{
    loom_status_t st;
    if ((st = check_comm(c, "gather")) != LOOM_SUCCESS ||
        (st = check_common(c, "gather", dt, 0, LOOM_SUM, 1, root)) != LOOM_SUCCESS)
        return st;
    size_t es = loom_dtype_size(dt);
    CHECK(bytes_fit(count, (size_t)c->size, es), "gather: count %zu is too large", count);
    if (count == 0)
        return nothing_to_do(c, req);
    int at_root = c->rank == root;
    CHECK(sendbuf && (!at_root || recvbuf), "gather: NULL buffer");
    CHECK(at_root || !IN_PLACE(sendbuf), "gather: LOOM_IN_PLACE is for the root only");
    char *mine = at_root ? (char *)recvbuf + (size_t)root * count * es : NULL;
    loom_coll_args_t a = {.coll = LOOM_COLL_GATHER, .sendbuf = IN_PLACE(sendbuf) ? mine : sendbuf,
                          .recvbuf = at_root ? recvbuf : NULL, .count = count, .esize = es,
                          .dtype = dt, .root = root};
    return run_or_queue(c, &a, req);
}

static loom_status_t do_scatter(const void *sendbuf, void *recvbuf, size_t count, loom_dtype_t dt,
                                int root, loom_comm_t c, loom_request_t *req)
{
    loom_status_t st;
    if ((st = check_comm(c, "scatter")) != LOOM_SUCCESS ||
        (st = check_common(c, "scatter", dt, 0, LOOM_SUM, 1, root)) != LOOM_SUCCESS)
        return st;
    size_t es = loom_dtype_size(dt);
    CHECK(bytes_fit(count, (size_t)c->size, es), "scatter: count %zu is too large", count);
    if (count == 0)
        return nothing_to_do(c, req);
    int at_root = c->rank == root;
    CHECK(recvbuf && (!at_root || sendbuf), "scatter: NULL buffer");
    CHECK(at_root || !IN_PLACE(recvbuf), "scatter: LOOM_IN_PLACE is for the root only");
    /* In place at the root: its own block stays where it is in sendbuf. */
    void *dst = IN_PLACE(recvbuf) ? (char *)sendbuf + (size_t)root * count * es : recvbuf;
    loom_coll_args_t a = {.coll = LOOM_COLL_SCATTER, .sendbuf = at_root ? sendbuf : NULL,
                          .recvbuf = dst, .count = count, .esize = es, .dtype = dt, .root = root};
    return run_or_queue(c, &a, req);
}

static loom_status_t do_barrier(loom_comm_t c, loom_request_t *req)
{
    loom_status_t st = check_comm(c, "barrier");
    if (st != LOOM_SUCCESS)
        return st;
    loom_coll_args_t a = {.coll = LOOM_COLL_BARRIER, .dtype = LOOM_UINT8, .esize = 1};
    return run_or_queue(c, &a, req);
}

/* peer ANY_PEER: a receive from whichever rank sends first (*source_out). */
#define ANY_PEER (-1)
static loom_status_t do_p2p(loom_op_kind_t kind, void *buf, size_t count, loom_dtype_t dt,
                            int peer, int tag, int *source_out, loom_comm_t c,
                            loom_request_t *req);

/* A blocking send/recv of a device buffer, run again on the host copy. */
struct p2p_host {
    loom_op_kind_t kind;
    size_t count;
    loom_dtype_t dt;
    int peer, tag;
    loom_comm_t c;
};

static loom_status_t p2p_host_run(void *hbuf, void *arg)
{
    struct p2p_host *h = arg;
    return do_p2p(h->kind, hbuf, h->count, h->dt, h->peer, h->tag, NULL, h->c, NULL);
}

static loom_status_t do_p2p(loom_op_kind_t kind, void *buf, size_t count, loom_dtype_t dt,
                            int peer, int tag, int *source_out, loom_comm_t c,
                            loom_request_t *req)
{
    const int any = peer == ANY_PEER;
    const char *fn = kind == LOOM_OP_SEND ? "send" : any ? "recv_any" : "recv";
    loom_status_t st;
    if ((st = check_comm(c, fn)) != LOOM_SUCCESS ||
        (st = check_common(c, fn, dt, 0, LOOM_SUM, 0, 0)) != LOOM_SUCCESS)
        return st;
    size_t es = loom_dtype_size(dt);
    CHECK(any || (peer >= 0 && peer < c->size),
          "%s: peer %d is not a rank of this communicator (size %d)", fn, peer, c->size);
    if (any && !c->tp_ops->probe)
        return loom_comm_fail(c, LOOM_ERR_UNSUPPORTED, "recv_any: the %s transport cannot "
                              "receive from any rank", c->tp_ops->name);
    CHECK(tag >= 0, "%s: tag %d is negative", fn, tag);
    CHECK(bytes_fit(count, 1, es), "%s: count %zu is too large", fn, count);
    CHECK(count == 0 || buf, "%s: NULL buffer", fn);
    int device, direct = 0;
    if (count > 0 && loom_accel->ptr_memory(buf, &device)) {
        if (any)
            return loom_comm_fail(c, LOOM_ERR_UNSUPPORTED, "recv_any: GPU buffers need a "
                                  "known source (loom_recv)");
        /* GPUDirect RDMA: the transport moves the GPU buffer itself, once the
         * device work queued before the call is done; else it is staged, which
         * only a blocking call can do (the copies are the call). A non-blocking
         * one goes direct as a host buffer would: after the wait, the bytes are
         * there (received) or may be reused (sent). */
        char why[256] = "the accelerator hands no GPU memory to transports";
        int gdr = peer != c->rank &&
                  loom_accel->size > offsetof(loom_accel_ops_t, device_ready) &&
                  loom_accel->device_ready ? gdr_to(c, peer, why, sizeof(why)) : 0;
        if (gdr < 0)
            return loom_comm_fail(c, LOOM_ERR_INVALID_ARG, "%s: LOOM_NET_GDR=1 but %s", fn, why);
        loom_err_t err = {0};
        if (gdr) {
            if ((st = loom_accel->device_ready(c, device, &err)) != LOOM_SUCCESS)
                return loom_comm_fail(c, st, "%s: %s", fn, err.msg);
            direct = 1;
        } else if (req) {
            return loom_comm_fail(c, LOOM_ERR_UNSUPPORTED,
                                  "i%s: GPU buffers without GPUDirect RDMA (%s) need the "
                                  "blocking loom_%s or loom_%s_stream",
                                  fn, peer == c->rank ? "a message to self" : why, fn, fn);
        } else {
            struct p2p_host h = {kind, count, dt, peer, tag, c};
            st = loom_accel->run_p2p(c, device, kind == LOOM_OP_SEND, buf, count * es,
                                     p2p_host_run, &h, &err);
            return st != LOOM_SUCCESS && err.msg[0] ? loom_comm_fail(c, st, "%s: %s", fn, err.msg)
                                                    : st;
        }
    }
    struct loom_request stack_op, *op = &stack_op;
    if (req && !(op = calloc(1, sizeof(*op))))
        return loom_comm_fail(c, LOOM_ERR_NO_MEMORY, "out of memory");
    if (!req)
        memset(op, 0, sizeof(*op));
    op->kind = kind;
    op->tp_req.on_device = direct;
    op->any_source = any;
    op->source_out = source_out;
    op->tp_req.peer = peer;
    op->tp_req.buf = buf;
    op->tp_req.len = count * es;
    op->tp_req.match.tag = (uint64_t)tag;
    op->tp_req.match.desc = loom_desc_make(LOOM_DESC_P2P, (int)dt, 0);
    op->tp_req.match.total = count;
    st = submit(c, op, req);
    if (req && st != LOOM_SUCCESS)
        free(op);
    return st;
}

/* ---- the public names ----------------------------------------------------- */

LOOM_API loom_status_t loom_allreduce(const void *s, void *r, size_t n, loom_dtype_t dt,
                                      loom_op_t op, loom_comm_t c)
{
    return do_allreduce(s, r, n, dt, op, c, NULL);
}
LOOM_API loom_status_t loom_iallreduce(const void *s, void *r, size_t n, loom_dtype_t dt,
                                       loom_op_t op, loom_comm_t c, loom_request_t *req)
{
    return req ? do_allreduce(s, r, n, dt, op, c, req)
               : loom_global_fail(LOOM_ERR_INVALID_ARG, "iallreduce: NULL request pointer");
}
LOOM_API loom_status_t loom_broadcast(void *b, size_t n, loom_dtype_t dt, int root, loom_comm_t c)
{
    return do_broadcast(b, n, dt, root, c, NULL);
}
LOOM_API loom_status_t loom_ibroadcast(void *b, size_t n, loom_dtype_t dt, int root,
                                       loom_comm_t c, loom_request_t *req)
{
    return req ? do_broadcast(b, n, dt, root, c, req)
               : loom_global_fail(LOOM_ERR_INVALID_ARG, "ibroadcast: NULL request pointer");
}
LOOM_API loom_status_t loom_reduce(const void *s, void *r, size_t n, loom_dtype_t dt,
                                   loom_op_t op, int root, loom_comm_t c)
{
    return do_reduce(s, r, n, dt, op, root, c, NULL);
}
LOOM_API loom_status_t loom_ireduce(const void *s, void *r, size_t n, loom_dtype_t dt,
                                    loom_op_t op, int root, loom_comm_t c, loom_request_t *req)
{
    return req ? do_reduce(s, r, n, dt, op, root, c, req)
               : loom_global_fail(LOOM_ERR_INVALID_ARG, "ireduce: NULL request pointer");
}
LOOM_API loom_status_t loom_allgather(const void *s, void *r, size_t n, loom_dtype_t dt,
                                      loom_comm_t c)
{
    return do_allgather(s, r, n, dt, c, NULL);
}
LOOM_API loom_status_t loom_iallgather(const void *s, void *r, size_t n, loom_dtype_t dt,
                                       loom_comm_t c, loom_request_t *req)
{
    return req ? do_allgather(s, r, n, dt, c, req)
               : loom_global_fail(LOOM_ERR_INVALID_ARG, "iallgather: NULL request pointer");
}
LOOM_API loom_status_t loom_allgatherv(const void *s, size_t n, void *r, const size_t *counts,
                                       const size_t *displs, loom_dtype_t dt, loom_comm_t c)
{
    return do_allgatherv(s, n, r, counts, displs, dt, c, NULL);
}
LOOM_API loom_status_t loom_iallgatherv(const void *s, size_t n, void *r, const size_t *counts,
                                        const size_t *displs, loom_dtype_t dt, loom_comm_t c,
                                        loom_request_t *req)
{
    return req ? do_allgatherv(s, n, r, counts, displs, dt, c, req)
               : loom_global_fail(LOOM_ERR_INVALID_ARG, "iallgatherv: NULL request pointer");
}
LOOM_API loom_status_t loom_reduce_scatter(const void *s, void *r, size_t n, loom_dtype_t dt,
                                           loom_op_t op, loom_comm_t c)
{
    return do_reduce_scatter(s, r, n, dt, op, c, NULL);
}
LOOM_API loom_status_t loom_ireduce_scatter(const void *s, void *r, size_t n, loom_dtype_t dt,
                                            loom_op_t op, loom_comm_t c, loom_request_t *req)
{
    return req ? do_reduce_scatter(s, r, n, dt, op, c, req)
               : loom_global_fail(LOOM_ERR_INVALID_ARG, "ireduce_scatter: NULL request pointer");
}
LOOM_API loom_status_t loom_alltoall(const void *s, void *r, size_t n, loom_dtype_t dt,
                                     loom_comm_t c)
{
    return do_alltoall(s, r, n, dt, c, NULL);
}
LOOM_API loom_status_t loom_ialltoall(const void *s, void *r, size_t n, loom_dtype_t dt,
                                      loom_comm_t c, loom_request_t *req)
{
    return req ? do_alltoall(s, r, n, dt, c, req)
               : loom_global_fail(LOOM_ERR_INVALID_ARG, "ialltoall: NULL request pointer");
}
LOOM_API loom_status_t loom_alltoallv(const void *s, const size_t *sc, const size_t *sd, void *r,
                                      const size_t *rc, const size_t *rd, loom_dtype_t dt,
                                      loom_comm_t c)
{
    return do_alltoallv(s, sc, sd, r, rc, rd, dt, c, NULL);
}
LOOM_API loom_status_t loom_ialltoallv(const void *s, const size_t *sc, const size_t *sd, void *r,
                                       const size_t *rc, const size_t *rd, loom_dtype_t dt,
                                       loom_comm_t c, loom_request_t *req)
{
    return req ? do_alltoallv(s, sc, sd, r, rc, rd, dt, c, req)
               : loom_global_fail(LOOM_ERR_INVALID_ARG, "ialltoallv: NULL request pointer");
}
LOOM_API loom_status_t loom_gather(const void *s, void *r, size_t n, loom_dtype_t dt, int root,
                                   loom_comm_t c)
{
    return do_gather(s, r, n, dt, root, c, NULL);
}
LOOM_API loom_status_t loom_igather(const void *s, void *r, size_t n, loom_dtype_t dt, int root,
                                    loom_comm_t c, loom_request_t *req)
{
    return req ? do_gather(s, r, n, dt, root, c, req)
               : loom_global_fail(LOOM_ERR_INVALID_ARG, "igather: NULL request pointer");
}
LOOM_API loom_status_t loom_scatter(const void *s, void *r, size_t n, loom_dtype_t dt, int root,
                                    loom_comm_t c)
{
    return do_scatter(s, r, n, dt, root, c, NULL);
}
LOOM_API loom_status_t loom_iscatter(const void *s, void *r, size_t n, loom_dtype_t dt, int root,
                                     loom_comm_t c, loom_request_t *req)
{
    return req ? do_scatter(s, r, n, dt, root, c, req)
               : loom_global_fail(LOOM_ERR_INVALID_ARG, "iscatter: NULL request pointer");
}
LOOM_API loom_status_t loom_barrier(loom_comm_t c)
{
    return do_barrier(c, NULL);
}
LOOM_API loom_status_t loom_ibarrier(loom_comm_t c, loom_request_t *req)
{
    return req ? do_barrier(c, req)
               : loom_global_fail(LOOM_ERR_INVALID_ARG, "ibarrier: NULL request pointer");
}
LOOM_API loom_status_t loom_send(const void *b, size_t n, loom_dtype_t dt, int peer, int tag,
                                 loom_comm_t c)
{
    return do_p2p(LOOM_OP_SEND, (void *)b, n, dt, peer, tag, NULL, c, NULL);
}
LOOM_API loom_status_t loom_isend(const void *b, size_t n, loom_dtype_t dt, int peer, int tag,
                                  loom_comm_t c, loom_request_t *req)
{
    return req ? do_p2p(LOOM_OP_SEND, (void *)b, n, dt, peer, tag, NULL, c, req)
               : loom_global_fail(LOOM_ERR_INVALID_ARG, "isend: NULL request pointer");
}
LOOM_API loom_status_t loom_recv(void *b, size_t n, loom_dtype_t dt, int peer, int tag,
                                 loom_comm_t c)
{
    return do_p2p(LOOM_OP_RECV, b, n, dt, peer, tag, NULL, c, NULL);
}
LOOM_API loom_status_t loom_irecv(void *b, size_t n, loom_dtype_t dt, int peer, int tag,
                                  loom_comm_t c, loom_request_t *req)
{
    return req ? do_p2p(LOOM_OP_RECV, b, n, dt, peer, tag, NULL, c, req)
               : loom_global_fail(LOOM_ERR_INVALID_ARG, "irecv: NULL request pointer");
}
LOOM_API loom_status_t loom_recv_any(void *b, size_t n, loom_dtype_t dt, int tag, int *source,
                                     loom_comm_t c)
{
    return do_p2p(LOOM_OP_RECV, b, n, dt, ANY_PEER, tag, source, c, NULL);
}
LOOM_API loom_status_t loom_irecv_any(void *b, size_t n, loom_dtype_t dt, int tag, int *source,
                                      loom_comm_t c, loom_request_t *req)
{
    return req ? do_p2p(LOOM_OP_RECV, b, n, dt, ANY_PEER, tag, source, c, req)
               : loom_global_fail(LOOM_ERR_INVALID_ARG, "irecv_any: NULL request pointer");
}
