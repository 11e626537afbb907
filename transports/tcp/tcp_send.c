/* tcp_send.c - the TCP transport's send path (see tcp.c for the design). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tcp_int.h"

/* ---- sending -------------------------------------------------------------- */

/* Queue x behind the striped messages of its direction; streams with none
 * in hand take it next. */
void tcp_xfer_queue(loom_tp_t *tp, tcp_peer_t *peer, tcp_xfer_t *x, int sending)
{
    tcp_xfer_t **head = sending ? &peer->sx_head : &peer->rx_head;
    tcp_xfer_t **tail = sending ? &peer->sx_tail : &peer->rx_tail;
    x->parts_left = tp->nstreams;
    if (*tail)
        (*tail)->next = x;
    else
        *head = x;
    *tail = x;
    for (int k = 1; k < tp->nstreams; k++) {
        tcp_xfer_t **next = sending ? &peer->lanes[k - 1].sx : &peer->lanes[k - 1].rx;
        if (!*next)
            *next = x;
    }
}

/* A large send about to be framed on stream 0: its slices are queued on the
 * other streams behind the messages framed before it. */
static tcp_xfer_t *stripe_send(loom_tp_t *tp, tcp_peer_t *peer, loom_tp_req_t *req)
{
    tcp_xfer_t *x = calloc(1, sizeof(*x));
    if (!x) {
        tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory striping a %zu-byte message to rank %d",
                req->len, peer->rank);
        return NULL;
    }
    x->frame = (loom_frame_t){.kind = LOOM_FRAME_STRIPED, .match = req->match, .len = req->len};
    x->req = req;
    tcp_xfer_queue(tp, peer, x, 1);
    tp->nstriped_sent++;
    return x;
}

/* A frame that cannot be sealed is not sent. */
static loom_status_t seal_fail(loom_tp_t *tp, const tcp_peer_t *peer)
{
    return tp_fail(tp, LOOM_ERR_INTERNAL, "cannot seal a frame to rank %d: libcrypto failed, or "
                   "the connection's 2^64 sequence numbers are spent", peer->rank);
}

/* MAC_ENCRYPT: the next piece of a payload (bytes [off, n) of base still to
 * go) encrypted into *ct, once the previous piece is written out; the tag
 * once the last piece is in. 0, or -1 when libcrypto failed. */
static int encrypt_next(loom_seal_t *tx, uint8_t **ct, size_t *ct_beg, size_t *ct_len,
                        const uint8_t *base, size_t off, size_t n, uint8_t stag[LOOM_MAC_BYTES],
                        int *stag_ready)
{
    if (off != *ct_beg + *ct_len || off >= n)
        return 0;
    if (!*ct && !(*ct = malloc(CT_BYTES)))
        return -1;
    size_t k = n - off < CT_BYTES ? n - off : CT_BYTES;
    if (loom_aead_crypt(&tx->pay, base + off, *ct, k) != 0)
        return -1;
    *ct_beg = off;
    *ct_len = k;
    if (off + k == n) {
        if (loom_aead_seal_tag(&tx->pay, stag) != 0)
            return -1;
        *stag_ready = 1;
    }
    return 0;
}

/* A small frame (wire.h): its header, its payload (MAC_ENCRYPT: encrypted
 * into the connection's buffer) and the one tag over both, made before a
 * byte is sent. 0, or -1 when it cannot be sealed. */
static int seal_small(tcp_peer_t *peer, const loom_frame_t *f, const void *buf, int encrypt)
{
    loom_frame_encode(f, peer->shdr);
    peer->shdr_len = LOOM_FRAME_BYTES;
    if (peer->tx_seq == UINT64_MAX)   /* as seal_header_with: no nonce twice */
        return -1;
    peer->shdr_seq = peer->tx_seq++;
    if (encrypt && !peer->ct && !(peer->ct = malloc(CT_BYTES)))
        return -1;
    if (loom_frame_seal_small(&peer->tx_seal, peer->shdr_seq, peer->shdr, buf, peer->ct,
                              (size_t)f->len, encrypt, peer->stag) != 0)
        return -1;
    /* Nothing is left to tag or encrypt as the bytes go out. */
    peer->tx_hashed = (size_t)f->len;
    peer->ct_beg = 0;
    peer->ct_len = (size_t)f->len;
    peer->stag_ready = 1;
    return 0;
}

/* Write as much of the send queue as the socket takes. */
loom_status_t tcp_flush_sends(loom_tp_t *tp, tcp_peer_t *peer, int *moved)
{
    while (peer->sq.head) {
        loom_tp_req_t *req = peer->sq.head;
        if (!peer->shdr_ready) {
            peer->s_x = NULL;
            peer->splen = req->len;
            if (tp->nstreams > 1 && req->len >= tp->stripe_min) {
                if ((peer->s_x = stripe_send(tp, peer, req)) == NULL)
                    return tp->failed;
                uint64_t beg, n;
                loom_stripe_slice(req->len, tp->nstreams, 0, &beg, &n);
                peer->splen = (size_t)n;
                for (int k = 1; k < tp->nstreams && !tp->failed; k++)
                    tcp_lane_flush(tp, peer, &peer->lanes[k - 1], moved);
                if (tp->failed)
                    return tp->failed;
            }
        }
        /* Stream 0 moves the first splen bytes: all of a plain frame, slice 0 of a striped one. */
        size_t plen = peer->splen;
        int sealed = payload_sealed(peer, plen);
        int encrypt = sealed && peer->mac == MAC_ENCRYPT;
        if (!peer->shdr_ready) {
            loom_frame_t f = {.kind = peer->s_x ? LOOM_FRAME_STRIPED : LOOM_FRAME_DATA,
                              .match = req->match, .len = req->len};
            peer->shdr_ready = 1;
            peer->shdr_off = 0;
            peer->stag_ready = 0;
            peer->stag_off = 0;
            if (sealed && loom_frame_small(f.kind, f.len)) {
                if (seal_small(peer, &f, req->buf, encrypt) != 0)
                    return seal_fail(tp, peer);
            } else if ((peer->shdr_len = seal_header(peer, &f, peer->shdr, &peer->shdr_seq)) == 0) {
                return seal_fail(tp, peer);
            } else if (sealed) {
                if (loom_frame_payload_start(&peer->tx_seal, peer->shdr_seq) != 0)
                    return seal_fail(tp, peer);
                peer->tx_hashed = req->off;   /* 0: a send starts at its beginning */
                peer->ct_beg = req->off;
                peer->ct_len = 0;
                if (!encrypt && plen <= TAG_FIRST_BYTES) {
                    /* Small: tagged now, so the tag leaves in the same segment as the
                     * payload instead of costing the receiver another wake-up. */
                    if (loom_aead_aad(&peer->tx_seal.pay, req->buf, plen) != 0 ||
                        loom_aead_seal_tag(&peer->tx_seal.pay, peer->stag) != 0)
                        return seal_fail(tp, peer);
                    peer->stag_ready = 1;
                    peer->tx_hashed = plen;
                }
            }
        }
        if (encrypt && encrypt_next(&peer->tx_seal, &peer->ct, &peer->ct_beg, &peer->ct_len, req->buf,
                                    req->off, plen, peer->stag, &peer->stag_ready) != 0)
            return seal_fail(tp, peer);
        if (sealed && !encrypt && req->off == plen && !peer->stag_ready) {
            if (loom_aead_seal_tag(&peer->tx_seal.pay, peer->stag) != 0)
                return seal_fail(tp, peer);
            peer->stag_ready = 1;
        }
        struct iovec iov[3];
        int niov = 0;
        if (peer->shdr_off < peer->shdr_len)
            iov[niov++] = (struct iovec){peer->shdr + peer->shdr_off,
                                         peer->shdr_len - peer->shdr_off};
        if (req->off < plen && encrypt)
            iov[niov++] = (struct iovec){peer->ct + (req->off - peer->ct_beg),
                                         peer->ct_beg + peer->ct_len - req->off};
        else if (req->off < plen)
            iov[niov++] = (struct iovec){(uint8_t *)req->buf + req->off,
                                         sealed && plen - req->off > CT_BYTES ? CT_BYTES
                                                                             : plen - req->off};
        if (peer->stag_ready && peer->stag_off < LOOM_MAC_BYTES)
            iov[niov++] = (struct iovec){peer->stag + peer->stag_off,
                                         LOOM_MAC_BYTES - peer->stag_off};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t n = sendmsg(peer->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                want_out(tp, peer, 1);
                return LOOM_SUCCESS;
            }
            return tp_lost(tp, peer->rank, "lost the connection to rank %d: %s",
                           peer->rank, strerror(errno));
        }
        *moved = 1;
        size_t left = (size_t)n;
        if (peer->shdr_off < peer->shdr_len) {
            size_t h = peer->shdr_len - peer->shdr_off;
            h = h < left ? h : left;
            peer->shdr_off += h;
            left -= h;
        }
        size_t p = plen - req->off < left ? plen - req->off : left;
        req->off += p;
        left -= p;
        peer->stag_off += left;
        if (sealed && !encrypt && req->off > peer->tx_hashed) {
            /* The bytes just sent, still in cache. */
            if (loom_aead_aad(&peer->tx_seal.pay, (const uint8_t *)req->buf + peer->tx_hashed,
                              req->off - peer->tx_hashed) != 0)
                return seal_fail(tp, peer);
            peer->tx_hashed = req->off;
        }
        if (peer->shdr_off == peer->shdr_len && req->off == plen &&
            (!sealed || peer->stag_off == LOOM_MAC_BYTES)) {
            loom_req_queue_pop(&peer->sq);
            peer->shdr_ready = 0;
            if (peer->s_x) {
                tcp_xfer_t *x = peer->s_x;
                peer->s_x = NULL;
                tcp_xfer_part_done(tp, peer, x, 1);
            } else {
                req->status = LOOM_SUCCESS;
                req->done = 1;
            }
        }
    }
    want_out(tp, peer, 0);
    return LOOM_SUCCESS;
}

/* A striped message's slice moved whole; the last one completes it (always
 * the oldest of the peer's list: every stream takes them in order). */
void tcp_xfer_part_done(loom_tp_t *tp, tcp_peer_t *peer, tcp_xfer_t *x, int sending)
{
    if (--x->parts_left > 0)
        return;
    tcp_xfer_t **head = sending ? &peer->sx_head : &peer->rx_head;
    tcp_xfer_t **tail = sending ? &peer->sx_tail : &peer->rx_tail;
    if (*head != x) {
        tp_fail(tp, LOOM_ERR_INTERNAL, "striped messages to or from rank %d completed out of "
                "order", peer->rank);
        return;
    }
    *head = x->next;
    if (!*head)
        *tail = NULL;
    if (x->req) {
        x->req->off = x->req->len;
        x->req->status = LOOM_SUCCESS;
        x->req->done = 1;
    } else {
        x->unexp->got = x->unexp->frame.len;
        x->unexp->complete = 1;
        x->unexp->xfer = NULL;
    }
    free(x);
}

loom_status_t tcp_lane_lost(loom_tp_t *tp, tcp_peer_t *peer, tcp_lane_t *lane,
                               const char *why)
{
    if (peer->gave_up)
        return loom_tp_fail_gave_up(&tp->failed, tp->err, "tcp", tp->rank, peer->rank);
    return tp_lost(tp, peer->rank, "lost the connection to rank %d (stream %d of %d): %s",
                   peer->rank, lane->idx, tp->nstreams, why);
}

/* Write as much of this stream's slices as its socket takes. */
loom_status_t tcp_lane_flush(loom_tp_t *tp, tcp_peer_t *peer, tcp_lane_t *lane, int *moved)
{
    while (lane->sx && !tp->failed) {
        if (lane->fd < 0)
            return tcp_lane_lost(tp, peer, lane, "it was closed with a slice still to send");
        tcp_xfer_t *x = lane->sx;
        uint64_t beg, n;
        loom_stripe_slice(x->frame.len, tp->nstreams, lane->idx, &beg, &n);
        const uint8_t *base = (const uint8_t *)x->req->buf + beg;
        size_t *off = &x->got[lane->idx];
        int sealed = lane->mac >= MAC_FULL && n > 0;
        int encrypt = sealed && lane->mac == MAC_ENCRYPT;
        if (!lane->shdr_ready) {
            loom_frame_t f = {.kind = LOOM_FRAME_SLICE, .match = x->frame.match, .len = n};
            lane->shdr_len = seal_header_with(lane->mac, &lane->tx_seal, &lane->tx_seq, &f,
                                              lane->shdr, &lane->shdr_seq);
            if (lane->shdr_len == 0)
                return seal_fail(tp, peer);
            lane->shdr_ready = 1;
            lane->shdr_off = 0;
            lane->stag_off = sealed ? 0 : LOOM_MAC_BYTES;
            lane->stag_ready = 0;
            lane->ct_beg = *off;
            lane->ct_len = 0;
            if (sealed && loom_frame_payload_start(&lane->tx_seal, lane->shdr_seq) != 0)
                return seal_fail(tp, peer);
        }
        if (encrypt && encrypt_next(&lane->tx_seal, &lane->ct, &lane->ct_beg, &lane->ct_len, base,
                                    *off, (size_t)n, lane->stag, &lane->stag_ready) != 0)
            return seal_fail(tp, peer);
        if (sealed && !encrypt && *off == n && !lane->stag_ready) {
            if (loom_aead_seal_tag(&lane->tx_seal.pay, lane->stag) != 0)
                return seal_fail(tp, peer);
            lane->stag_ready = 1;
        }
        struct iovec iov[3];
        int niov = 0;
        if (lane->shdr_off < lane->shdr_len)
            iov[niov++] = (struct iovec){lane->shdr + lane->shdr_off,
                                         lane->shdr_len - lane->shdr_off};
        if (*off < n && encrypt)
            iov[niov++] = (struct iovec){lane->ct + (*off - lane->ct_beg),
                                         lane->ct_beg + lane->ct_len - *off};
        else if (*off < n)
            iov[niov++] = (struct iovec){(uint8_t *)base + *off,
                                         sealed && n - *off > CT_BYTES ? CT_BYTES : n - *off};
        else if (lane->stag_off < LOOM_MAC_BYTES)
            iov[niov++] = (struct iovec){lane->stag + lane->stag_off,
                                         LOOM_MAC_BYTES - lane->stag_off};
        if (niov > 0) {
            struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
            ssize_t sent = sendmsg(lane->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (sent < 0) {
                if (errno == EINTR)
                    continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) {
                    lane->out_blocked = 1;
                    lane_events(tp, peer, lane);
                    return LOOM_SUCCESS;
                }
                return tcp_lane_lost(tp, peer, lane, strerror(errno));
            }
            *moved = 1;
            size_t left = (size_t)sent;
            if (lane->shdr_off < lane->shdr_len) {
                size_t h = lane->shdr_len - lane->shdr_off;
                h = h < left ? h : left;
                lane->shdr_off += h;
                left -= h;
            }
            if (*off < n) {
                size_t p = n - *off < left ? (size_t)n - *off : left;
                if (sealed && !encrypt &&   /* the bytes just sent, still in cache */
                    loom_aead_aad(&lane->tx_seal.pay, base + *off, p) != 0)
                    return seal_fail(tp, peer);
                *off += p;
                x->moved += p;
                left -= p;
            } else {
                lane->stag_off += left;
            }
        }
        if (lane->shdr_off == lane->shdr_len && *off == n && lane->stag_off == LOOM_MAC_BYTES) {
            lane->shdr_ready = 0;
            lane->sx = x->next;
            tcp_xfer_part_done(tp, peer, x, 1);
        }
    }
    if (lane->out_blocked) {
        lane->out_blocked = 0;
        lane_events(tp, peer, lane);
    }
    return tp->failed;
}

uint8_t *tcp_buf_get(loom_tp_t *tp, size_t len, size_t *cap_p)
{
    int best = -1;
    if (len >= POOL_MIN_BYTES)
        for (int i = 0; i < POOL_SLOTS; i++)
            if (tp->pool[i].buf && tp->pool[i].cap >= len &&
                (best < 0 || tp->pool[i].cap < tp->pool[best].cap))
                best = i;
    if (best >= 0) {
        uint8_t *b = tp->pool[best].buf;
        *cap_p = tp->pool[best].cap;
        tp->pool[best].buf = NULL;
        return b;
    }
    *cap_p = len ? len : 1;
    return malloc(*cap_p);
}

void tcp_buf_put(loom_tp_t *tp, uint8_t *buf, size_t cap)
{
    if (cap >= POOL_MIN_BYTES) {
        /* Keep it in a free slot, or in place of the smallest cached one. */
        int slot = 0;
        for (int i = 0; i < POOL_SLOTS; i++) {
            if (!tp->pool[i].buf) {
                slot = i;
                break;
            }
            if (tp->pool[i].cap < tp->pool[slot].cap)
                slot = i;
        }
        if (!tp->pool[slot].buf || tp->pool[slot].cap < cap) {
            free(tp->pool[slot].buf);
            tp->pool[slot].buf = buf;
            tp->pool[slot].cap = cap;
            return;
        }
    }
    free(buf);
}

/* An early message with room for its first bytes (at most first of them). */
tcp_unexp_t *tcp_unexp_new(loom_tp_t *tp, const loom_frame_t *f, size_t first)
{
    tcp_unexp_t *u = loom_unexp_new(f);
    if (u)
        u->data = tcp_buf_get(tp, f->len < first ? f->len : first, &u->cap);
    if (!u || !u->data) {
        free(u);
        tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory holding a %llu-byte early message",
                (unsigned long long)f->len);
        return NULL;
    }
    return u;
}

/* Room for a whole message to ourselves, from the pool as early messages are. */
static tcp_unexp_t *self_hold(loom_tp_t *tp, const loom_frame_t *f)
{
    tcp_unexp_t *u = tcp_unexp_new(tp, f, f->len);
    if (u)
        tp->peers[tp->rank].early_bytes += u->cap;
    return u;
}

loom_status_t tcp_isend_owned(loom_tp_t *tp, loom_tp_req_t *req)
{
    if (tp->failed)
        return tp->failed;
    loom_req_start(req);
    tcp_peer_t *peer = &tp->peers[req->peer];
    if (req->peer == tp->rank)   /* matched in memory */
        return loom_tp_self_send(tp, &peer->rq, &peer->uq, req, &tp->failed, tp->err, "tcp",
                                 tp->rank, self_hold);
    if (peer->said_bye)
        return tp_lost(tp, peer->rank,
                       "rank %d sends to rank %d, which has destroyed its communicator", tp->rank,
                       peer->rank);
    if (peer->gave_up)
        return gave_up_fail(tp, peer);
    int was_idle = peer->sq.head == NULL;
    loom_req_queue_push(&peer->sq, req);
    /* Start writing now: for small messages this is the whole send. */
    int moved = 0;
    return was_idle ? tcp_flush_sends(tp, peer, &moved) : LOOM_SUCCESS;
}
