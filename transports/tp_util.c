/* tp_util.c - see tp_util.h. */
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

#include "log.h"
#include "tp_util.h"

loom_status_t loom_tp_fail_gave_up(loom_status_t *failed, loom_err_t *err, const char *subsys,
                                   int rank, int peer)
{
    return loom_tp_fail(failed, err, subsys, rank, LOOM_ERR_PEER_LOST,
                        "rank %d lost rank %d: rank %d gave up on this communicator (a failed "
                        "call or loom_comm_abort there)", rank, peer, peer);
}

void loom_tp_own(_Atomic int *owner)
{
    int idle = 0;
    while (!atomic_compare_exchange_weak(owner, &idle, 1)) {
        idle = 0;
        sched_yield();   /* an abort is telling the peers: a few sends */
    }
}

void loom_tp_disown(_Atomic int *owner)
{
    atomic_store(owner, 0);
}

int loom_tp_own_if_idle(_Atomic int *owner)
{
    int idle = 0;
    return atomic_compare_exchange_strong(owner, &idle, 2);
}

loom_status_t loom_tp_fail(loom_status_t *failed, loom_err_t *err, const char *subsys, int rank,
                           loom_status_t st, const char *fmt, ...)
{
    if (*failed == LOOM_SUCCESS) {
        char msg[LOOM_ERRMSG_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        loom_err_set(err, st, "%s", msg);
        LOOM_INFO(subsys, "rank %d: %s", rank, msg);
        *failed = st;
    }
    return *failed;
}

void loom_req_queue_push(loom_req_queue_t *q, loom_tp_req_t *req)
{
    req->next = NULL;
    if (q->tail)
        q->tail->next = req;
    else
        q->head = req;
    q->tail = req;
}

loom_tp_req_t *loom_req_queue_pop(loom_req_queue_t *q)
{
    loom_tp_req_t *req = q->head;
    q->head = req->next;
    if (!q->head)
        q->tail = NULL;
    return req;
}

void loom_req_start(loom_tp_req_t *req)
{
    req->done = 0;
    req->off = 0;
    req->status = LOOM_SUCCESS;
    req->next = NULL;
}

void loom_req_complete(loom_tp_req_t *req)
{
    req->off = req->len;
    req->status = LOOM_SUCCESS;
    req->done = 1;
}

loom_tp_req_t *loom_req_queue_take(loom_req_queue_t *q, const loom_frame_t *f, int my_rank,
                                   loom_err_t *err, loom_status_t *st)
{
    loom_tp_req_t *prev = NULL;
    for (loom_tp_req_t *r = q->head; r; prev = r, r = r->next) {
        if (r->match.tag != f->match.tag)
            continue;
        loom_status_t check = loom_frame_check(f, r, my_rank, err);
        if (check != LOOM_SUCCESS) {
            *st = check;
            return NULL;
        }
        if (prev)
            prev->next = r->next;
        else
            q->head = r->next;
        if (q->tail == r)
            q->tail = prev;
        return r;
    }
    return NULL;
}
