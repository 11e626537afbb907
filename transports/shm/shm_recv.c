/*
 * shm_recv.c - our side of the rings: matching arrivals against posted
 * receives and posted receives against early messages, reading RTS'd
 * payloads by cross-memory attach, draining records, progress and liveness.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "base/clock.h"
#include "shm_int.h"

/* ---- matching ------------------------------------------------------------- */

/* The oldest receive posted for f's tag, unlinked; NULL when none is posted
 * or f does not fit it (then the instance has failed). */
#define rq_take(tp, peer, f) \
    loom_tp_match(&(peer)->rq, f, &(tp)->failed, (tp)->err, "shm", (tp)->rank)

static loom_status_t queue_fin(loom_tp_t *tp, shm_peer_t *peer, uint64_t token)
{
    if (peer->nfins == peer->fins_cap) {
        size_t cap = peer->fins_cap ? peer->fins_cap * 2 : 16;
        uint64_t *f = realloc(peer->fins, cap * sizeof(*f));
        if (!f)
            return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
        peer->fins = f;
        peer->fins_cap = cap;
    }
    peer->fins[peer->nfins++] = token;
    return LOOM_SUCCESS;
}

/* Copy len bytes at addr in peer's memory into buf. */
static loom_status_t read_peer(loom_tp_t *tp, shm_peer_t *peer, void *buf, uint64_t addr,
                               size_t len)
{
    size_t done = 0;
    while (done < len) {
        struct iovec l = {(uint8_t *)buf + done, len - done};
        struct iovec r = {(void *)(uintptr_t)(addr + done), len - done};
        ssize_t n = process_vm_readv(peer->pid, &l, 1, &r, 1, 0);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            return tp_fail(tp, errno == ESRCH ? LOOM_ERR_PEER_LOST : LOOM_ERR_TRANSPORT,
                           "rank %d: reading %zu bytes from rank %d failed: %s", tp->rank, len,
                           peer->rank, n < 0 ? strerror(errno) : "nothing copied");
        }
        done += (size_t)n;
    }
    return LOOM_SUCCESS;
}

/* Copy an RTS'd payload straight out of the sender, then tell it so. */
static loom_status_t cma_read(loom_tp_t *tp, shm_peer_t *peer, loom_tp_req_t *req, uint64_t addr,
                              uint64_t token)
{
    if (read_peer(tp, peer, req->buf, addr, req->len) != LOOM_SUCCESS)
        return tp->failed;
    loom_req_complete(req);
    return queue_fin(tp, peer, token);
}

int shm_peer_readable(loom_tp_t *tp, int peer)
{
    /* Both ways, so the two ranks agree on which algorithms can run. */
    return peer >= 0 && peer < tp->size && tp->peers[peer].local &&
           tp->peers[peer].cma_to_peer && atomic_load(&tp->seg->rings[peer].consumer_cma);
}

static void *window_of(segment_t *seg, size_t seg_bytes)
{
    return (char *)seg + seg_bytes - WINDOW_BYTES;
}

void *shm_window(loom_tp_t *tp, int peer, size_t *len_p)
{
    *len_p = WINDOW_BYTES;
    if (peer == tp->rank)
        return window_of(tp->seg, tp->seg_bytes);
    if (peer < 0 || peer >= tp->size || !tp->peers[peer].local)
        return NULL;
    return window_of(tp->peers[peer].seg, tp->peers[peer].seg_bytes);
}

loom_status_t shm_peer_read(loom_tp_t *tp, int peer, void *buf, uint64_t addr, size_t len)
{
    if (tp->failed)
        return tp->failed;
    if (!shm_peer_readable(tp, peer))
        return tp_fail(tp, LOOM_ERR_INTERNAL, "rank %d cannot read rank %d's memory", tp->rank,
                       peer);
    return read_peer(tp, &tp->peers[peer], buf, addr, len);
}

/* ---- receiving ------------------------------------------------------------ */

int shm_probe(loom_tp_t *tp, int rank, uint64_t tag)
{
    return loom_unexp_probe(&tp->peers[rank].uq, tag);
}

loom_status_t shm_irecv(loom_tp_t *tp, loom_tp_req_t *req)
{
    if (tp->failed)
        return tp->failed;
    loom_req_start(req);
    shm_peer_t *peer = &tp->peers[req->peer];
    loom_unexp_t *u = loom_tp_unexp_match(&peer->uq, req, &tp->failed, tp->err, "shm", tp->rank);
    if (tp->failed)
        return tp->failed;
    if (u) {
        loom_status_t st = LOOM_SUCCESS;
        if (!u->data) {
            st = cma_read(tp, peer, req, u->addr, u->token);
        } else {
            loom_unexp_deliver(u, req);
            if (!u->complete) {
                /* Still streaming in: the rest lands in the posted buffer. */
                peer->cur_unexp = NULL;
                peer->cur_req = req;
            }
        }
        free(u->data);
        free(u);
        if (st == LOOM_SUCCESS && peer->nfins) {
            int moved = 0;
            st = shm_flush_sends(tp, peer, &moved);
        }
        return st;
    }
    if (peer->said_bye)
        return tp_fail(tp, LOOM_ERR_PEER_LOST,
                       "rank %d waits for a message from rank %d, which has destroyed its "
                       "communicator", tp->rank, peer->rank);
    loom_req_queue_push(&peer->rq, req);
    return LOOM_SUCCESS;
}

static loom_status_t take_fin(loom_tp_t *tp, shm_peer_t *peer, uint64_t token)
{
    loom_tp_req_t *prev = NULL;
    for (loom_tp_req_t *r = peer->fin_wait; r; prev = r, r = r->next)
        if ((uint64_t)(uintptr_t)r == token) {
            if (prev)
                prev->next = r->next;
            else
                peer->fin_wait = r->next;
            loom_req_complete(r);
            return LOOM_SUCCESS;
        }
    return tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d acknowledged a message rank %d never sent",
                   peer->rank, tp->rank);
}

/* Whether peer may leave one more early message of len bytes with us. */
static loom_status_t unexp_admit(loom_tp_t *tp, shm_peer_t *peer, uint64_t len)
{
    if (peer->uq.count >= UNEXP_MAX_MSGS || len > UNEXP_MAX_BYTES - peer->uq.bytes)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d sent more early messages than rank %d "
                       "keeps (%zu messages, %llu bytes waiting for their receive)", peer->rank,
                       tp->rank, peer->uq.count, (unsigned long long)peer->uq.bytes);
    return LOOM_SUCCESS;
}

/* Make room for got + len bytes in u's buffer, growing as bytes arrive (not
 * to the announced length at once, which the peer could inflate). */
static loom_status_t unexp_reserve(loom_tp_t *tp, shm_peer_t *peer, loom_unexp_t *u, size_t len)
{
    size_t want = u->got + len;
    if (want <= u->cap && u->data)
        return LOOM_SUCCESS;
    size_t cap = u->cap ? u->cap : CHUNK_BYTES;
    while (cap < want)
        cap *= 2;
    if (cap > u->frame.len)
        cap = u->frame.len;
    if (cap == 0)
        cap = 1;
    uint8_t *d = realloc(u->data, cap);
    if (!d)
        return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory holding a %llu-byte early "
                       "message from rank %d", (unsigned long long)u->frame.len, peer->rank);
    u->data = d;
    u->cap = cap;
    return LOOM_SUCCESS;
}

/* A record that opens a message: match it or keep it for later. rec is our
 * own copy of the record; payload (rec->len bytes) still lies in the ring. */
static loom_status_t open_message(loom_tp_t *tp, shm_peer_t *peer, const rec_t *rec,
                                  const uint8_t *payload)
{
    loom_frame_t f = {.kind = LOOM_FRAME_DATA,
                      .match = {.tag = rec->tag, .desc = rec->desc, .total = rec->total},
                      .len = rec->msglen};
    loom_tp_req_t *req = rq_take(tp, peer, &f);
    if (tp->failed)
        return tp->failed;
    if (rec->kind == REC_RTS) {
        if (req)
            return cma_read(tp, peer, req, rec->addr, rec->token);
        if (unexp_admit(tp, peer, 0) != LOOM_SUCCESS)
            return tp->failed;
        loom_unexp_t *u = loom_unexp_new(&f);
        if (!u)
            return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
        u->token = rec->token;
        u->addr = rec->addr;
        loom_unexp_push(&peer->uq, u);
        return LOOM_SUCCESS;
    }
    if (req) {
        if (rec->len)   /* a zero-length receive may have no buffer */
            memcpy(req->buf, payload, rec->len);
        req->off = rec->len;
        if (rec->kind == REC_EAGER)
            loom_req_complete(req);
        else
            peer->cur_req = req;
        return LOOM_SUCCESS;
    }
    if (unexp_admit(tp, peer, rec->msglen) != LOOM_SUCCESS)
        return tp->failed;
    loom_unexp_t *u = loom_unexp_new(&f);
    if (!u)
        return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
    if (unexp_reserve(tp, peer, u, rec->len) != LOOM_SUCCESS) {
        free(u);
        return tp->failed;
    }
    if (rec->len)
        memcpy(u->data, payload, rec->len);
    u->got = rec->len;
    u->complete = rec->kind == REC_EAGER;
    loom_unexp_push(&peer->uq, u);
    if (!u->complete)
        peer->cur_unexp = u;
    return LOOM_SUCCESS;
}

static loom_status_t continue_message(loom_tp_t *tp, shm_peer_t *peer, const rec_t *rec,
                                      const uint8_t *payload)
{
    if (peer->cur_req) {
        loom_tp_req_t *req = peer->cur_req;
        if (req->off + rec->len > req->len)
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d streamed more than it announced",
                           peer->rank);
        memcpy((uint8_t *)req->buf + req->off, payload, rec->len);
        req->off += rec->len;
        if (req->off == req->len) {
            loom_req_complete(req);
            peer->cur_req = NULL;
        }
    } else if (peer->cur_unexp) {
        loom_unexp_t *u = peer->cur_unexp;
        if (u->got + rec->len > u->frame.len)
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d streamed more than it announced",
                           peer->rank);
        if (unexp_reserve(tp, peer, u, rec->len) != LOOM_SUCCESS)
            return tp->failed;
        memcpy(u->data + u->got, payload, rec->len);
        u->got += rec->len;
        if (u->got == u->frame.len) {
            u->complete = 1;
            peer->cur_unexp = NULL;
        }
    } else {
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d continued a message it never began",
                       peer->rank);
    }
    return LOOM_SUCCESS;
}

/* A peer that gave up: no collective can complete, so we fail whatever we
 * wait on, naming whom it blamed, and our own segment passes that on. */
static loom_status_t peer_gave_up(loom_tp_t *tp, int r)
{
    const segment_t *seg = tp->peers[r].seg;
    uint32_t culprit = atomic_load(&seg->fault_culprit);
    uint32_t reporter = atomic_load(&seg->fault_reporter);
    uint32_t why = atomic_load(&seg->fault_why);
    loom_tp_fault_t f = {
        .culprit = culprit >= 1 && culprit <= (uint32_t)tp->size ? (int)culprit - 1 : -1,
        .reporter = reporter >= 1 && reporter <= (uint32_t)tp->size ? (int)reporter - 1 : r,
        .why = why > 0 && why <= (uint32_t)LOOM_ERR_INTERNAL ? (loom_status_t)why
                                                             : LOOM_ERR_PEER_LOST,
        .waited_ms = atomic_load(&seg->fault_waited_ms)};
    loom_tp_fault_keep(&tp->fault, &f);
    return loom_tp_fail_fault(&tp->failed, tp->err, "shm", tp->rank, r, &f);
}

/* Whether a record of this kind, as we copied it, is well formed. */
static int rec_valid(const rec_t *rec)
{
    if (rec->len > CHUNK_BYTES || rec->msglen > LOOM_FRAME_MAX_LEN)
        return 0;
    switch (rec->kind) {
    case REC_EAGER:
        return rec->len == rec->msglen;
    case REC_START:   /* the first chunk of a longer message */
        return rec->len < rec->msglen;
    case REC_CONT:
        return 1;     /* checked against the message it continues */
    case REC_RTS:
    case REC_FIN:
    case REC_BYE:
        return rec->len == 0;
    default:
        return 0;
    }
}

/* Consume every record peer has written to us. Everything in the ring is the
 * peer's to write at any time, so each record is copied before it is checked
 * and the walk never trusts head, tail or a length beyond the ring. */
loom_status_t shm_drain(loom_tp_t *tp, shm_peer_t *peer, int *moved)
{
    ring_t *ring = &tp->seg->rings[peer->rank];
    uint64_t tail = atomic_load_explicit(&ring->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&ring->head, memory_order_acquire);
    if (tail == head)
        return LOOM_SUCCESS;
    if (head - tail > RING_BYTES)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d's shared-memory ring claims %llu "
                       "unread bytes, more than the ring holds (%d)", peer->rank,
                       (unsigned long long)(head - tail), RING_BYTES);
    while (tail != head && !tp->failed) {
        size_t off = (size_t)(tail % RING_BYTES);
        size_t to_end = RING_BYTES - off;
        rec_t rec;
        size_t step;
        if (to_end < sizeof(rec_t)) {
            rec.kind = REC_PAD;
        } else {
            memcpy(&rec, ring->data + off, sizeof(rec));
        }
        if (rec.kind == REC_PAD) {
            step = to_end;
        } else {
            if (!rec_valid(&rec))
                return tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d wrote a malformed shared-memory "
                               "record (kind %u, %llu of %llu bytes)", peer->rank, rec.kind,
                               (unsigned long long)rec.len, (unsigned long long)rec.msglen);
            step = rec_space(rec.len);
            if (step > to_end)
                return tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d wrote a shared-memory record "
                               "that runs past the ring's end", peer->rank);
        }
        if (step > head - tail)
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d wrote a shared-memory record that "
                           "runs past what it published", peer->rank);
        const uint8_t *payload = ring->data + off + sizeof(rec_t);
        switch (rec.kind) {
        case REC_PAD:
            break;
        case REC_EAGER:
        case REC_START:
        case REC_RTS:
            if (peer->cur_req || peer->cur_unexp)
                return tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d began a message inside another",
                               peer->rank);
            open_message(tp, peer, &rec, payload);
            break;
        case REC_CONT:
            continue_message(tp, peer, &rec, payload);
            break;
        case REC_FIN:
            take_fin(tp, peer, rec.token);
            break;
        case REC_BYE:
            peer->said_bye = 1;
            /* A rank that gave up (a timeout of its own, say) and then
             * destroyed its communicator: what it blamed is the news. */
            if ((peer->rq.head || peer->cur_req || peer->sq.head || peer->fin_wait) &&
                atomic_load(&peer->seg->closed) == SEG_BROKEN)
                peer_gave_up(tp, peer->rank);
            else if (peer->rq.head || peer->cur_req)
                tp_fail(tp, LOOM_ERR_PEER_LOST, "rank %d destroyed its communicator while rank "
                        "%d still waits for a message from it", peer->rank, tp->rank);
            /* A send it did not take (or whose FIN it will never write) would
             * otherwise wait until the timeout. */
            else if (peer->sq.head || peer->fin_wait)
                tp_fail(tp, LOOM_ERR_PEER_LOST, "rank %d destroyed its communicator while rank "
                        "%d still sends it a message", peer->rank, tp->rank);
            break;
        }
        tail += step;
    }
    atomic_store(&ring->tail, tail);
    *moved = 1;
    /* The producer may sleep until we make room. */
    if (atomic_load(&ring->producer_waiting)) {
        atomic_store(&ring->producer_waiting, 0u);
        atomic_fetch_add(&peer->seg->doorbell, 1);
        loom_futex_wake(&peer->seg->doorbell);
    }
    return tp->failed;
}

static int has_work(const shm_peer_t *peer)
{
    return peer->rq.head || peer->cur_req || peer->sq.head || peer->fin_wait || peer->nfins;
}

/* Whether peer r gave up, or, when we wait for it (wanted), vanished: its
 * pid is gone. */
static loom_status_t check_peer(loom_tp_t *tp, int r, int wanted)
{
    shm_peer_t *peer = &tp->peers[r];
    /* The flag first: a rank that gave up may have exited by now too. */
    if (atomic_load(&peer->seg->closed) == SEG_BROKEN)
        return peer_gave_up(tp, r);
    if (wanted && peer->said_bye)
        return tp_fail(tp, LOOM_ERR_PEER_LOST, "rank %d destroyed its communicator while rank "
                       "%d still waits for it", r, tp->rank);
    if (wanted && kill(peer->pid, 0) != 0 && errno == ESRCH) {
        loom_tp_fault_keep(&tp->fault, &(loom_tp_fault_t){
            .culprit = r, .reporter = tp->rank, .why = LOOM_ERR_PEER_LOST});
        return tp_fail(tp, LOOM_ERR_PEER_LOST,
                       "rank %d lost rank %d: its process (pid %d) exited without "
                       "loom_comm_destroy", tp->rank, r, (int)peer->pid);
    }
    return LOOM_SUCCESS;
}

/* Peers that gave up (any of them), and peers we wait for that vanished. */
static loom_status_t check_liveness(loom_tp_t *tp)
{
    for (int r = 0; r < tp->size; r++) {
        shm_peer_t *peer = &tp->peers[r];
        loom_status_t st = peer->local ? check_peer(tp, r, has_work(peer)) : LOOM_SUCCESS;
        if (st != LOOM_SUCCESS)
            return st;
    }
    return LOOM_SUCCESS;
}

loom_status_t shm_watch(loom_tp_t *tp, int peer)
{
    if (tp->failed || peer < 0 || peer >= tp->size || !tp->peers[peer].local)
        return tp->failed;
    return check_peer(tp, peer, 1);
}

/* Move our keepalive counter and read the peers': a counter that moved
 * means its owner is alive and inside progress. */
static void keepalive(loom_tp_t *tp, double now)
{
    tp->keepalive_at = now + LOOM_TP_KEEPALIVE_S;
    atomic_fetch_add_explicit(&tp->seg->alive, 1, memory_order_relaxed);
    for (int r = 0; r < tp->size; r++) {
        shm_peer_t *peer = &tp->peers[r];
        if (!peer->local)
            continue;
        uint64_t v = atomic_load_explicit(&peer->seg->alive, memory_order_relaxed);
        if (v != peer->alive_seen) {
            peer->alive_seen = v;
            peer->heard_at = now;
        }
    }
}

static loom_status_t poll_once(loom_tp_t *tp, int *moved)
{
    for (int r = 0; r < tp->size && !tp->failed; r++) {
        shm_peer_t *peer = &tp->peers[r];
        if (!peer->local)
            continue;
        if (shm_drain(tp, peer, moved) != LOOM_SUCCESS)
            break;
        if (peer->sq.head || peer->nfins)
            shm_flush_sends(tp, peer, moved);
    }
    return tp->failed;
}

static int anything_arrived(loom_tp_t *tp)
{
    for (int r = 0; r < tp->size; r++) {
        if (!tp->peers[r].local)
            continue;
        ring_t *ring = &tp->seg->rings[r];
        if (atomic_load(&ring->head) != atomic_load(&ring->tail))
            return 1;
        /* Room appeared in a ring we wait to write into. */
        const shm_peer_t *peer = &tp->peers[r];
        if ((peer->sq.head || peer->nfins) &&
            ring_fits(&peer->seg->rings[tp->rank], shm_next_payload(peer), NULL))
            return 1;
    }
    return 0;
}

loom_status_t shm_progress(loom_tp_t *tp, int timeout_ms, int *moved_p)
{
    *moved_p = 0;
    int why = atomic_load(&tp->abort_why);
    if (why)
        return tp_fail(tp, (loom_status_t)why, "communicator aborted");
    if (tp->failed)
        return tp->failed;
    double now = loom_now_s();
    if (now >= tp->keepalive_at)
        keepalive(tp, now);
    poll_once(tp, moved_p);
    if (*moved_p || tp->failed || timeout_ms == 0)
        return tp->failed;
    if (timeout_ms < 0 || timeout_ms > 100)
        timeout_ms = 100;   /* wake up to look for dead peers */
    atomic_store(&tp->seg->sleeping, 1u);
    uint32_t seen = atomic_load(&tp->seg->doorbell);
    if (!anything_arrived(tp) && !atomic_load(&tp->abort_why))
        loom_futex_wait(&tp->seg->doorbell, seen, timeout_ms);
    atomic_store(&tp->seg->sleeping, 0u);
    if ((why = atomic_load(&tp->abort_why)) != 0)
        return tp_fail(tp, (loom_status_t)why, "communicator aborted");
    poll_once(tp, moved_p);
    now = loom_now_s();
    if (!*moved_p && !tp->failed && now >= tp->next_liveness) {
        tp->next_liveness = now + LIVENESS_CHECK_S;
        check_liveness(tp);
    }
    return tp->failed;
}
