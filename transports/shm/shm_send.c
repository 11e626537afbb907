/*
 * shm_send.c - writing to a peer's ring: eager and streamed records, RTS
 * descriptors for cross-memory attach, FINs; and messages to ourselves.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>

#include "shm_int.h"

static int goes_by_rts(const shm_peer_t *peer, const loom_tp_req_t *req)
{
    return peer->cma_to_peer && req->len >= CMA_MIN_BYTES;
}

/* Payload of the next record the send queue writes. */
size_t shm_next_payload(const shm_peer_t *peer)
{
    if (peer->nfins || !peer->sq.head || goes_by_rts(peer, peer->sq.head))
        return 0;
    size_t left = peer->sq.head->len - peer->sq.head->off;
    return left < CHUNK_BYTES ? left : CHUNK_BYTES;
}

/* Write what the ring takes of peer's control and send queues. */
loom_status_t shm_flush_sends(loom_tp_t *tp, shm_peer_t *peer, int *moved)
{
    ring_t *ring = &peer->seg->rings[tp->rank];
    while (peer->nfins > 0) {
        rec_t *rec = ring_reserve(ring, 0);
        if (!rec)
            goto full;
        memset(rec, 0, sizeof(*rec));
        rec->kind = REC_FIN;
        rec->token = peer->fins[0];
        ring_publish(peer, ring, 0);
        memmove(peer->fins, peer->fins + 1, --peer->nfins * sizeof(*peer->fins));
        *moved = 1;
    }
    while (peer->sq.head) {
        loom_tp_req_t *req = peer->sq.head;
        int rts = goes_by_rts(peer, req);
        size_t chunk = rts ? 0 : req->len - req->off;
        if (chunk > CHUNK_BYTES)
            chunk = CHUNK_BYTES;
        rec_t *rec = ring_reserve(ring, chunk);
        if (!rec)
            goto full;
        rec->desc = req->match.desc;
        rec->tag = req->match.tag;
        rec->total = req->match.total;
        rec->msglen = req->len;
        rec->len = chunk;
        rec->token = (uint64_t)(uintptr_t)req;
        rec->addr = (uint64_t)(uintptr_t)req->buf;
        if (rts)
            rec->kind = REC_RTS;
        else if (peer->started)
            rec->kind = REC_CONT;
        else
            rec->kind = chunk == req->len ? REC_EAGER : REC_START;
        if (chunk)
            memcpy(rec + 1, (const uint8_t *)req->buf + req->off, chunk);
        ring_publish(peer, ring, chunk);
        *moved = 1;
        peer->started = 1;
        req->off += chunk;
        if (rts || req->off == req->len) {
            loom_req_queue_pop(&peer->sq);
            peer->started = 0;
            if (rts) {
                req->next = peer->fin_wait;
                peer->fin_wait = req;
            } else {
                loom_req_complete(req);
            }
        }
    }
    atomic_store(&ring->producer_waiting, 0u);
    return LOOM_SUCCESS;
full:
    atomic_store(&ring->producer_waiting, 1u);
    return LOOM_SUCCESS;
}

loom_status_t shm_isend(loom_tp_t *tp, loom_tp_req_t *req)
{
    if (tp->failed)
        return tp->failed;
    loom_req_start(req);
    shm_peer_t *peer = &tp->peers[req->peer];
    if (req->peer == tp->rank)   /* matched in memory */
        return loom_tp_self_send(tp, &peer->rq, &peer->uq, req, &tp->failed, tp->err, "shm",
                                 tp->rank, NULL);
    if (peer->said_bye || atomic_load(&peer->seg->closed))
        return tp_fail(tp, LOOM_ERR_PEER_LOST,
                       "rank %d sends to rank %d, which has destroyed or given up on its "
                       "communicator", tp->rank, peer->rank);
    int was_idle = peer->sq.head == NULL;
    loom_req_queue_push(&peer->sq, req);
    int moved = 0;
    return was_idle ? shm_flush_sends(tp, peer, &moved) : LOOM_SUCCESS;
}
