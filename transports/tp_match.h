/* tp_match.h - request queues in posting order, and matching: an arrived
 * message against the receives posted for its tag, a posted receive against
 * the messages that came before it (the unexpected queue), and sends to
 * ourselves (libfabric's util_srx does the same for its providers). */
#ifndef LOOM_TP_MATCH_H
#define LOOM_TP_MATCH_H

#include <stdlib.h>
#include <string.h>

#include "tp_fail.h"
#include "transport.h"
#include "wire.h"

typedef struct loom_req_queue {
    loom_tp_req_t *head, *tail;
} loom_req_queue_t;

void loom_req_queue_push(loom_req_queue_t *q, loom_tp_req_t *req);
/* Unlink the oldest request (the queue must not be empty). */
loom_tp_req_t *loom_req_queue_pop(loom_req_queue_t *q);
/* Reset a request's transport-owned fields before it is queued. */
void loom_req_start(loom_tp_req_t *req);
/* Mark a request finished, all bytes moved. */
void loom_req_complete(loom_tp_req_t *req);
/* Unlink and return the oldest request posted for f's tag, after checking that
 * f fits it (length, descriptor, total): a mismatch sets *st (with the message
 * in err) and returns NULL, as does finding none (*st untouched). */
loom_tp_req_t *loom_req_queue_take(loom_req_queue_t *q, const loom_frame_t *f, int my_rank,
                                   loom_err_t *err, loom_status_t *st);

/* loom_req_queue_take for an instance: a mismatch fails it (loom_tp_fail). */
static inline loom_tp_req_t *loom_tp_match(loom_req_queue_t *q, const loom_frame_t *f,
                                           loom_status_t *failed, loom_err_t *err,
                                           const char *subsys, int rank)
{
    loom_status_t st = LOOM_SUCCESS;
    loom_tp_req_t *r = loom_req_queue_take(q, f, rank, err, &st);
    if (st != LOOM_SUCCESS)
        loom_tp_fail(failed, err, subsys, rank, st, "%s", err->msg);
    return r;
}

/* A message that arrived before a receive was posted for it. Matching uses
 * frame; the payload is the transport's to move in, data and got record it. */
typedef struct loom_unexp {
    struct loom_unexp *next;
    loom_frame_t frame;     /* as announced: tag, descriptor, total, length */
    uint8_t *data;          /* bytes held; NULL while they stay with the sender (rendezvous) */
    size_t got, cap;        /* bytes data holds, and has room for */
    int complete;           /* every byte is in data */
    uint64_t token, addr;   /* a rendezvous: the sender's handle and buffer (shm, ibverbs) */
    void *xfer;             /* tcp: the striped transfer still filling data, else NULL */
} loom_unexp_t;

/* Oldest first; count and bytes (announced lengths) let a transport bound
 * what a peer may leave with it. */
typedef struct loom_unexp_queue {
    loom_unexp_t *head, *tail;
    size_t count;
    uint64_t bytes;
} loom_unexp_queue_t;

/* A zeroed entry for a message announced by f, holding no data yet; NULL when
 * out of memory. */
static inline loom_unexp_t *loom_unexp_new(const loom_frame_t *f)
{
    loom_unexp_t *u = calloc(1, sizeof(*u));
    if (u)
        u->frame = *f;
    return u;
}

/* Keep a copy of n bytes as u's data (its first, or all of them); -1 when out
 * of memory. */
static inline int loom_unexp_hold(loom_unexp_t *u, const void *bytes, size_t n)
{
    if (!(u->data = malloc(n ? n : 1)))
        return -1;
    if (n)
        memcpy(u->data, bytes, n);
    u->got = u->cap = n;
    u->complete = n == u->frame.len;
    return 0;
}

static inline void loom_unexp_push(loom_unexp_queue_t *q, loom_unexp_t *u)
{
    u->next = NULL;
    q->count++;
    q->bytes += u->frame.len;
    if (q->tail)
        q->tail->next = u;
    else
        q->head = u;
    q->tail = u;
}

/* Unlink and return the oldest early message for req's tag, after checking
 * that it fits req (length, descriptor, total): a mismatch sets *st (with the
 * message in err) and returns NULL, as does finding none (*st untouched). */
static inline loom_unexp_t *loom_unexp_take(loom_unexp_queue_t *q, const loom_tp_req_t *req,
                                            int my_rank, loom_err_t *err, loom_status_t *st)
{
    loom_unexp_t *prev = NULL;
    for (loom_unexp_t *u = q->head; u; prev = u, u = u->next) {
        if (u->frame.match.tag != req->match.tag)
            continue;
        loom_status_t check = loom_frame_check(&u->frame, req, my_rank, err);
        if (check != LOOM_SUCCESS) {
            *st = check;
            return NULL;
        }
        if (prev)
            prev->next = u->next;
        else
            q->head = u->next;
        if (q->tail == u)
            q->tail = prev;
        q->count--;
        q->bytes -= u->frame.len;
        return u;
    }
    return NULL;
}

/* loom_unexp_take for an instance: a mismatch fails it (loom_tp_fail). */
static inline loom_unexp_t *loom_tp_unexp_match(loom_unexp_queue_t *q, const loom_tp_req_t *req,
                                                loom_status_t *failed, loom_err_t *err,
                                                const char *subsys, int rank)
{
    loom_status_t st = LOOM_SUCCESS;
    loom_unexp_t *u = loom_unexp_take(q, req, rank, err, &st);
    if (st != LOOM_SUCCESS)
        loom_tp_fail(failed, err, subsys, rank, st, "%s", err->msg);
    return u;
}

/* Whether a message for tag waits in q. */
static inline int loom_unexp_probe(const loom_unexp_queue_t *q, uint64_t tag)
{
    for (const loom_unexp_t *u = q->head; u; u = u->next)
        if (u->frame.match.tag == tag)
            return 1;
    return 0;
}

/* Copy the bytes u holds into req, the receive it matched; req completes when
 * u has them all (else the rest is the transport's to move in). */
static inline void loom_unexp_deliver(const loom_unexp_t *u, loom_tp_req_t *req)
{
    if (u->got)
        memcpy(req->buf, u->data, u->got);
    req->off = u->got;
    if (u->complete)
        loom_req_complete(req);
}

/* Free every entry left in q, with its data. */
void loom_unexp_free_all(loom_unexp_queue_t *q);

/* A message to ourselves, matched in memory: copied into the oldest receive
 * posted for its tag in rq, else kept in uq as an early message, in an entry
 * hold returns with room for all of it (NULL: out of memory, the instance
 * failed), or one from malloc when hold is NULL. req completes either way.
 * A receive it does not fit, or want of memory, fails the instance
 * (loom_tp_fail); returns the status in force. */
static inline loom_status_t loom_tp_self_send(loom_tp_t *tp, loom_req_queue_t *rq,
                                              loom_unexp_queue_t *uq, loom_tp_req_t *req,
                                              loom_status_t *failed, loom_err_t *err,
                                              const char *subsys, int rank,
                                              loom_unexp_t *(*hold)(loom_tp_t *,
                                                                    const loom_frame_t *))
{
    loom_frame_t f = {.kind = LOOM_FRAME_DATA, .match = req->match, .len = req->len};
    loom_tp_req_t *r = loom_tp_match(rq, &f, failed, err, subsys, rank);
    if (*failed)
        return *failed;
    if (r) {
        if (req->len)
            memcpy(r->buf, req->buf, req->len);
        loom_req_complete(r);
    } else {
        loom_unexp_t *u = hold ? hold(tp, &f) : loom_unexp_new(&f);
        if (u && !hold && loom_unexp_hold(u, req->buf, req->len) != 0) {
            free(u);
            u = NULL;
        }
        if (!u)
            return loom_tp_fail(failed, err, subsys, rank, LOOM_ERR_NO_MEMORY, "out of memory "
                                "holding a %zu-byte message to ourselves", req->len);
        if (hold && req->len)
            memcpy(u->data, req->buf, req->len);
        u->got = req->len;
        u->complete = 1;
        loom_unexp_push(uq, u);
    }
    loom_req_complete(req);
    return LOOM_SUCCESS;
}

#endif
