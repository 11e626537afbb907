/* tp_match.c - see tp_match.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tp_match.h"

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

void loom_unexp_free_all(loom_unexp_queue_t *q)
{
    for (loom_unexp_t *u = q->head, *next; u; u = next) {
        next = u->next;
        free(u->data);
        free(u);
    }
    q->head = q->tail = NULL;
    q->count = 0;
    q->bytes = 0;
}
