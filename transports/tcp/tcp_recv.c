/* tcp_recv.c - the TCP transport's receive path (see tcp.c for the design). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "base/byteorder.h"
#include "tcp_int.h"

/* ---- receiving ------------------------------------------------------------ */

loom_status_t tcp_irecv_owned(loom_tp_t *tp, loom_tp_req_t *req)
{
    if (tp->failed)
        return tp->failed;
    loom_req_start(req);
    tcp_peer_t *peer = &tp->peers[req->peer];
    /* Early messages arrived before the held one, so they match first. */
    tcp_unexp_t *u = loom_tp_unexp_match(&peer->uq, req, &tp->failed, tp->err, "tcp", tp->rank);
    if (tp->failed)
        return tp->failed;
    if (u) {
        loom_unexp_deliver(u, req);
        peer->early_bytes -= u->cap;
        if (!u->complete) {
            /* Still arriving: the rest goes straight into the posted buffer. */
            tcp_xfer_t *x = u->xfer;
            if (x) {
                for (int k = 1; k < tp->nstreams; k++) {
                    uint64_t beg, n;
                    loom_stripe_slice(x->frame.len, tp->nstreams, k, &beg, &n);
                    if (x->got[k])
                        memcpy((uint8_t *)req->buf + beg, u->data + beg, x->got[k]);
                }
                x->req = req;
                x->unexp = NULL;
            }
            if (peer->cur_unexp == u) {
                peer->cur_unexp = NULL;
                peer->cur_req = req;
            }
        }
        tcp_buf_put(tp, u->data, u->cap);
        free(u);
        return LOOM_SUCCESS;
    }
    if (peer->held && tag_matches(req, &peer->cur)) {
        loom_status_t st = loom_frame_check(&peer->cur, req, tp->rank, tp->err);
        if (st != LOOM_SUCCESS)
            return tp_fail(tp, st, "%s", tp->err->msg);
        peer->cur_req = req;
        if (peer->cur_x) {
            peer->cur_x->req = req;
            for (int k = 1; k < tp->nstreams; k++)
                lane_events(tp, peer, &peer->lanes[k - 1]);
        }
        set_held(tp, peer, 0);
        /* Bytes of it may already sit in the staging buffer. */
        int moved = 0;
        tcp_handle_read(tp, peer, &moved);
        return tp->failed;
    }
    if (peer->said_bye)
        return tp_lost(tp, peer->rank,
                       "rank %d waits for a message from rank %d, which has destroyed its "
                       "communicator", tp->rank, peer->rank);
    if (peer->gave_up)
        return gave_up_fail(tp, peer);
    loom_req_queue_push(&peer->rq, req);
    return LOOM_SUCCESS;
}

static loom_status_t early_full(loom_tp_t *tp, const tcp_peer_t *peer, uint64_t len)
{
    return tp_fail(tp, LOOM_ERR_NO_MEMORY,
                   "rank %d sent rank %d a %llu-byte message nobody has posted a receive for, "
                   "beyond the %zu bytes it may hold for one peer (LOOM_EARLY_MAX_BYTES)",
                   peer->rank, tp->rank, (unsigned long long)len, tp->early_max);
}

/* Stream 0 announced a striped message: the other streams take its slices
 * next, once it has somewhere to go (a receive, or an early buffer). */
static tcp_xfer_t *stripe_recv(loom_tp_t *tp, tcp_peer_t *peer, const loom_frame_t *f)
{
    for (int k = 1; k < tp->nstreams; k++)
        if (peer->lanes[k - 1].fd < 0) {
            tcp_lane_lost(tp, peer, &peer->lanes[k - 1], "it was closed before a slice came");
            return NULL;
        }
    tcp_xfer_t *x = calloc(1, sizeof(*x));
    if (!x) {
        tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory receiving a striped message from rank %d",
                peer->rank);
        return NULL;
    }
    x->frame = *f;
    tcp_xfer_queue(tp, peer, x, 0);
    tp->nstriped_recv++;
    return x;
}

static loom_status_t start_frame(loom_tp_t *tp, tcp_peer_t *peer, const loom_frame_t *f)
{
    /* No collective can complete once one rank gave up, so we fail now,
     * whatever we wait on (not when our own LOOM_TIMEOUT runs out), and pass
     * on whom it blames: our own announcement forwards it to every peer. */
    if (f->kind == LOOM_FRAME_GAVE_UP) {
        peer->gave_up = 1;
        loom_tp_fault_t fault;
        loom_gave_up_decode(f, peer->rank, tp->size, &fault);
        loom_tp_fault_keep(&tp->fault, &fault);
        return loom_tp_fail_fault(&tp->failed, tp->err, "tcp", tp->rank, peer->rank, &fault);
    }
    if (f->kind == LOOM_FRAME_KEEPALIVE)
        return LOOM_SUCCESS;   /* heard_at is set as its bytes come */
    if (f->kind == LOOM_FRAME_SLICE || (f->kind == LOOM_FRAME_STRIPED && tp->nstreams < 2))
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "protocol error: rank %d sent a %s frame on its "
                       "first stream (%d stream%s per peer here)", peer->rank,
                       f->kind == LOOM_FRAME_SLICE ? "slice" : "striped", tp->nstreams,
                       tp->nstreams > 1 ? "s" : "");
    if (f->kind == LOOM_FRAME_BYE) {
        peer->said_bye = 1;
        if (peer->rq.head)
            return tp_lost(tp, peer->rank,
                           "rank %d destroyed its communicator while rank %d still waits for a "
                           "message from it", peer->rank, tp->rank);
        /* Bytes of a send still unwritten will never be read. */
        if (peer->sq.head || peer->sx_head)
            return tp_lost(tp, peer->rank,
                           "rank %d destroyed its communicator while rank %d still sends it a "
                           "message", peer->rank, tp->rank);
        return LOOM_SUCCESS;
    }
    peer->cur = *f;
    peer->cur_off = 0;
    peer->cur_req = NULL;
    peer->cur_unexp = NULL;
    peer->cur_plen = f->len;
    peer->cur_x = NULL;
    peer->cur_req = rq_take(tp, peer, f);
    if (tp->failed)
        return tp->failed;
    tp->nframes++;
    peer->in_frame = 1;
    if (f->kind == LOOM_FRAME_STRIPED) {
        uint64_t beg, n;
        loom_stripe_slice(f->len, tp->nstreams, 0, &beg, &n);
        peer->cur_plen = (size_t)n;
        if ((peer->cur_x = stripe_recv(tp, peer, f)) == NULL)
            return tp->failed;
        peer->cur_x->req = peer->cur_req;
    }
    if (!peer->cur_req && (f->match.tag & COLL_TAG_BIT) && f->len >= HOLD_MIN_BYTES) {
        set_held(tp, peer, 1);
        return LOOM_SUCCESS;
    }
    if (!peer->cur_req) {
        tp->nunexpected++;
        tp->unexpected_bytes += f->len;
        if (f->len > tp->early_max || peer->early_bytes > tp->early_max - f->len)
            return early_full(tp, peer, f->len);
        peer->cur_unexp = tcp_unexp_new(tp, f, EARLY_FIRST_BYTES);
        if (!peer->cur_unexp)
            return tp->failed;
        peer->early_bytes += peer->cur_unexp->cap;
        loom_unexp_push(&peer->uq, peer->cur_unexp);
        if (peer->cur_x) {
            peer->cur_x->unexp = peer->cur_unexp;
            peer->cur_unexp->xfer = peer->cur_x;
        }
    }
    if (peer->cur_x)
        for (int k = 1; k < tp->nstreams; k++)
            lane_events(tp, peer, &peer->lanes[k - 1]);
    return LOOM_SUCCESS;
}

/* Grow u's buffer to hold need bytes (doubling, never past the message); 0,
 * or -1 with the instance failed. */
static int early_grow(loom_tp_t *tp, tcp_peer_t *peer, tcp_unexp_t *u, size_t need)
{
    if (u->cap >= need || u->cap >= u->frame.len)
        return 0;
    size_t cap = u->cap * 2 > need ? u->cap * 2 : need;
    if (cap > u->frame.len)
        cap = u->frame.len;
    uint8_t *data = realloc(u->data, cap);
    if (!data) {
        tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory holding a %llu-byte early message "
                "from rank %d", (unsigned long long)u->frame.len, peer->rank);
        return -1;
    }
    peer->early_bytes += cap - u->cap;
    u->data = data;
    u->cap = cap;
    return 0;
}

/* Room in the early message being filled for at least one more byte, and
 * for want if growing by doubling allows: its buffer grows with what came. */
static uint8_t *early_room(loom_tp_t *tp, tcp_peer_t *peer, size_t want, size_t *room_p)
{
    tcp_unexp_t *u = peer->cur_unexp;
    if (early_grow(tp, peer, u, peer->cur_off + want) != 0)
        return NULL;
    *room_p = u->cap - peer->cur_off;
    return u->data;
}

static void finish_frame(loom_tp_t *tp, tcp_peer_t *peer)
{
    if (peer->cur_x) {
        /* Slice 0 is in; the message completes with its last slice. */
        tcp_xfer_t *x = peer->cur_x;
        peer->cur_x = NULL;
        peer->cur_req = NULL;
        peer->cur_unexp = NULL;
        peer->in_frame = 0;
        tcp_xfer_part_done(tp, peer, x, 0);
        return;
    }
    if (peer->cur_req) {
        peer->cur_req->off = peer->cur.len;
        peer->cur_req->status = LOOM_SUCCESS;
        peer->cur_req->done = 1;
    } else {
        peer->cur_unexp->got = peer->cur.len;
        peer->cur_unexp->complete = 1;
    }
    peer->cur_req = NULL;
    peer->cur_unexp = NULL;
    peer->in_frame = 0;
}

static loom_status_t peer_eof(loom_tp_t *tp, tcp_peer_t *peer)
{
    if ((peer->said_bye || peer->gave_up) && !peer->in_frame) {
        epoll_ctl(tp->epfd, EPOLL_CTL_DEL, peer->fd, NULL);
        close(peer->fd);
        peer->fd = -1;
        return LOOM_SUCCESS;
    }
    return tp_lost(tp, peer->rank,
                   "rank %d lost rank %d: the connection closed without a goodbye (the process "
                   "died or exited without loom_comm_destroy)", tp->rank, peer->rank);
}

/* recv() into the staging buffer; returns 1 when bytes came, 0 when none are
 * ready, -1 when the instance failed or the peer is gone. */
static int fill_stage(loom_tp_t *tp, tcp_peer_t *peer, int *moved)
{
    if (peer->stage_beg > 0) {
        memmove(peer->stage, peer->stage + peer->stage_beg, peer->stage_end - peer->stage_beg);
        peer->stage_end -= peer->stage_beg;
        peer->stage_beg = 0;
    }
    for (;;) {
        ssize_t n = recv(peer->fd, peer->stage + peer->stage_end, STAGE_BYTES - peer->stage_end,
                         MSG_DONTWAIT);
        if (n > 0) {
            peer->stage_end += (size_t)n;
            *moved = 1;
            return 1;
        }
        if (n == 0) {
            peer_eof(tp, peer);
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        /* A peer that said goodbye may close before reading all we sent it
         * (a keepalive): its kernel resets the connection, which ends it as
         * a close would. */
        if (errno == ECONNRESET && (peer->said_bye || peer->gave_up)) {
            peer_eof(tp, peer);
            return -1;
        }
        tp_lost(tp, peer->rank, "lost the connection to rank %d: %s", peer->rank,
                strerror(errno));
        return -1;
    }
}

static void mac_fail(loom_tp_t *tp, const tcp_peer_t *peer, int stream, const char *what)
{
    char where[32] = "";
    if (stream > 0)
        snprintf(where, sizeof(where), " on stream %d", stream);
    tp_fail(tp, LOOM_ERR_AUTH,
            "rank %d received a frame from rank %d%s whose %s does not match its LOOM_AUTH_KEY "
            "MAC: the connection was altered on the way (or a peer is broken)", tp->rank,
            peer->rank, where, what);
}

/* A small frame (wire.h) at hdr, avail bytes staged: taken whole, opened,
 * and only then matched and delivered. 1 when it was (or more bytes were
 * staged), 0 when it waits for bytes, -1 when the instance failed. */
static int small_frame(loom_tp_t *tp, tcp_peer_t *peer, uint8_t *hdr, size_t avail,
                       int *staged, int *moved)
{
    /* The length is not checked yet; it only says where the tag lies. */
    size_t len = (size_t)loom_get64(hdr + 24);
    if (avail < LOOM_FRAME_BYTES + len + LOOM_MAC_BYTES)
        return fill_stage(tp, peer, staged);
    uint8_t *pay = hdr + LOOM_FRAME_BYTES;
    peer->cur_seq = peer->rx_seq++;
    if (loom_frame_open_small(&peer->rx_seal, peer->cur_seq, hdr, pay, len,
                              peer->mac == MAC_ENCRYPT, pay + len) != 0) {
        mac_fail(tp, peer, 0, "header or payload");
        return -1;
    }
    loom_frame_t f;
    if (loom_frame_decode(hdr, peer->rank, &f, tp->err) != LOOM_SUCCESS) {
        tp_fail(tp, LOOM_ERR_TRANSPORT, "%s", tp->err->msg);
        return -1;
    }
    /* The stage is not touched again before the payload is copied out. */
    peer->stage_beg += LOOM_FRAME_BYTES + len + LOOM_MAC_BYTES;
    *moved = 1;
    if (start_frame(tp, peer, &f) != LOOM_SUCCESS)
        return -1;
    uint8_t *dst = peer->cur_req ? (uint8_t *)peer->cur_req->buf : peer->cur_unexp->data;
    memcpy(dst, pay, len);
    peer->cur_off = len;
    finish_frame(tp, peer);
    return 1;
}

/* *moved tells of frames and payload, not of keepalives: a peer that only
 * says it is alive (it waits too) must not hold off our LOOM_TIMEOUT. */
void tcp_handle_read(loom_tp_t *tp, tcp_peer_t *peer, int *moved)
{
    size_t hdr_bytes = LOOM_FRAME_BYTES + (peer->mac ? LOOM_MAC_BYTES : 0);
    int staged = 0;
    while (!tp->failed && peer->fd >= 0 && !peer->held) {
        size_t avail = peer->stage_end - peer->stage_beg;
        if (!peer->in_frame) {
            if (avail < hdr_bytes) {
                if (fill_stage(tp, peer, &staged) <= 0)
                    return;
                continue;
            }
            uint8_t *hdr = peer->stage + peer->stage_beg;
            if (peer->mac >= MAC_FULL && loom_frame_small_hdr(hdr)) {
                if (small_frame(tp, peer, hdr, avail, &staged, moved) <= 0)
                    return;
                continue;
            }
            if (peer->mac) {
                peer->cur_seq = peer->rx_seq++;
                if (loom_frame_open_header(&peer->rx_seal, peer->cur_seq, hdr,
                                           hdr + LOOM_FRAME_BYTES) != 0) {
                    mac_fail(tp, peer, 0, "header");
                    return;
                }
            }
            loom_frame_t f;
            if (loom_frame_decode(hdr, peer->rank, &f, tp->err) != LOOM_SUCCESS) {
                tp_fail(tp, LOOM_ERR_TRANSPORT, "%s", tp->err->msg);
                return;
            }
            peer->stage_beg += hdr_bytes;
            if (f.kind != LOOM_FRAME_KEEPALIVE)
                *moved = 1;
            if (payload_sealed(peer, f.len) &&
                loom_frame_payload_start(&peer->rx_seal, peer->cur_seq) != 0) {
                mac_fail(tp, peer, 0, "payload");
                return;
            }
            if (start_frame(tp, peer, &f) != LOOM_SUCCESS)
                return;
            if (peer->in_frame && !peer->held && peer->cur_plen == 0)
                finish_frame(tp, peer);
            continue;
        }
        size_t remaining = peer->cur_plen - peer->cur_off;
        if (remaining == 0 && !payload_sealed(peer, peer->cur_plen)) {
            finish_frame(tp, peer);   /* an empty slice 0, once its message was held */
            continue;
        }
        if (remaining == 0) {
            /* The payload is in; its tag decides whether the receive completes. */
            if (avail < LOOM_MAC_BYTES) {
                if (fill_stage(tp, peer, &staged) <= 0)
                    return;
                continue;
            }
            if (loom_aead_open_tag(&peer->rx_seal.pay, peer->stage + peer->stage_beg) != 0) {
                mac_fail(tp, peer, 0, "payload");
                return;
            }
            peer->stage_beg += LOOM_MAC_BYTES;
            finish_frame(tp, peer);
            continue;
        }
        uint8_t *dst;
        size_t room = remaining;
        if (peer->cur_req) {
            dst = (uint8_t *)peer->cur_req->buf;
        } else if ((dst = early_room(tp, peer, avail > 0 ? avail : DIRECT_READ_MIN, &room)) ==
                   NULL) {
            return;
        }
        room = room < remaining ? room : remaining;
        size_t before = peer->cur_off;
        if (avail > 0) {
            size_t k = avail < room ? avail : room;
            memcpy(dst + peer->cur_off, peer->stage + peer->stage_beg, k);
            peer->stage_beg += k;
            peer->cur_off += k;
            *moved = 1;
        } else if (room >= DIRECT_READ_MIN) {
            if (payload_sealed(peer, peer->cur_plen) && room > CT_BYTES)
                room = CT_BYTES;   /* opened while in cache */
            ssize_t n = recv(peer->fd, dst + peer->cur_off, room, MSG_DONTWAIT);
            if (n > 0) {
                peer->cur_off += (size_t)n;
                *moved = 1;
            } else if (n == 0) {
                peer_eof(tp, peer);
                return;
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                return;
            } else if (errno == ECONNRESET && (peer->said_bye || peer->gave_up)) {
                peer_eof(tp, peer);   /* as in fill_stage */
                return;
            } else if (errno != EINTR) {
                tp_lost(tp, peer->rank, "lost the connection to rank %d: %s",
                        peer->rank, strerror(errno));
                return;
            }
        } else if (fill_stage(tp, peer, &staged) <= 0) {
            return;
        }
        if (peer->cur_off > before && payload_sealed(peer, peer->cur_plen) &&
            open_payload_bytes(peer->mac, &peer->rx_seal, dst + before, peer->cur_off - before) != 0) {
            mac_fail(tp, peer, 0, "payload");
            return;
        }
        if (peer->cur_req)
            peer->cur_req->off = peer->cur_off;
        else
            peer->cur_unexp->got = peer->cur_off;
        if (peer->cur_off == peer->cur_plen && !payload_sealed(peer, peer->cur_plen))
            finish_frame(tp, peer);
    }
}

/* Room in an early buffer for a slice's next bytes at offset at: it grows
 * with what arrives, as early_room does for stream 0. */
static uint8_t *lane_room(loom_tp_t *tp, tcp_peer_t *peer, tcp_unexp_t *u, size_t at,
                          size_t rest, size_t *room_p)
{
    size_t step = rest < DIRECT_READ_MIN * 16 ? rest : DIRECT_READ_MIN * 16;
    if (early_grow(tp, peer, u, at + step) != 0)
        return NULL;
    *room_p = u->cap - at < rest ? u->cap - at : rest;
    return u->data + at;
}

/* Read this stream's slices while stream 0 has said where they go. Its
 * header is checked (its tag, then that it is the slice expected: same
 * message, same length) before a byte of the slice is read. */
void tcp_lane_read(loom_tp_t *tp, tcp_peer_t *peer, tcp_lane_t *lane, int *moved)
{
    size_t hdr_bytes = LOOM_FRAME_BYTES + (lane->mac ? LOOM_MAC_BYTES : 0);
    while (!tp->failed && lane->fd >= 0 && lane->rx && (lane->rx->req || lane->rx->unexp)) {
        tcp_xfer_t *x = lane->rx;
        uint64_t beg, n;
        loom_stripe_slice(x->frame.len, tp->nstreams, lane->idx, &beg, &n);
        size_t *got = &x->got[lane->idx];
        int sealed = lane->mac >= MAC_FULL && n > 0;
        uint8_t *dst = NULL;
        size_t want = 0;
        if (!lane->rhdr_done) {
            dst = lane->rhdr + lane->rhdr_have;
            want = hdr_bytes - lane->rhdr_have;
        } else if (*got < n) {
            if (x->req) {
                dst = (uint8_t *)x->req->buf + beg + *got;
                want = (size_t)n - *got;
                if (sealed && want > CT_BYTES)
                    want = CT_BYTES;   /* opened while in cache */
            } else if ((dst = lane_room(tp, peer, x->unexp, (size_t)beg + *got, (size_t)n - *got,
                                        &want)) == NULL) {
                return;
            }
        } else if (sealed && lane->rtag_have < LOOM_MAC_BYTES) {
            dst = lane->rtag + lane->rtag_have;
            want = LOOM_MAC_BYTES - lane->rtag_have;
        }
        if (want > 0) {
            ssize_t r = recv(lane->fd, dst, want, MSG_DONTWAIT);
            if (r == 0) {
                tcp_lane_lost(tp, peer, lane, "it closed in the middle of a striped message");
                return;
            }
            if (r < 0) {
                if (errno == EINTR)
                    continue;
                if (errno != EAGAIN && errno != EWOULDBLOCK)
                    tcp_lane_lost(tp, peer, lane, strerror(errno));
                break;
            }
            *moved = 1;
            if (!lane->rhdr_done) {
                lane->rhdr_have += (size_t)r;
                if (lane->rhdr_have < hdr_bytes)
                    continue;
                uint64_t seq = 0;
                if (lane->mac) {
                    seq = lane->rx_seq++;
                    if (loom_frame_open_header(&lane->rx_seal, seq, lane->rhdr,
                                               lane->rhdr + LOOM_FRAME_BYTES) != 0) {
                        mac_fail(tp, peer, lane->idx, "header");
                        return;
                    }
                }
                loom_frame_t f;
                if (loom_frame_decode(lane->rhdr, peer->rank, &f, tp->err) != LOOM_SUCCESS) {
                    tp_fail(tp, LOOM_ERR_TRANSPORT, "%s", tp->err->msg);
                    return;
                }
                if (f.kind != LOOM_FRAME_SLICE || f.match.tag != x->frame.match.tag ||
                    f.match.desc != x->frame.match.desc || f.match.total != x->frame.match.total ||
                    f.len != n) {
                    tp_fail(tp, LOOM_ERR_TRANSPORT, "protocol error: rank %d sent on stream %d a "
                            "frame (kind %u, %llu bytes) that is not the %llu-byte slice it "
                            "announced there", peer->rank, lane->idx, f.kind,
                            (unsigned long long)f.len, (unsigned long long)n);
                    return;
                }
                lane->rhdr_done = 1;
                if (sealed && loom_frame_payload_start(&lane->rx_seal, seq) != 0) {
                    mac_fail(tp, peer, lane->idx, "payload");
                    return;
                }
                continue;
            }
            if (*got < n) {
                if (sealed && open_payload_bytes(lane->mac, &lane->rx_seal, dst, (size_t)r) != 0) {
                    mac_fail(tp, peer, lane->idx, "payload");
                    return;
                }
                *got += (size_t)r;
                x->moved += (size_t)r;
                continue;
            }
            lane->rtag_have += (size_t)r;
            if (lane->rtag_have < LOOM_MAC_BYTES)
                continue;
            if (loom_aead_open_tag(&lane->rx_seal.pay, lane->rtag) != 0) {
                mac_fail(tp, peer, lane->idx, "payload");
                return;
            }
        }
        /* The slice is in (and its tag matched): on to the next message's. */
        lane->rhdr_done = 0;
        lane->rhdr_have = 0;
        lane->rtag_have = 0;
        lane->rx = x->next;
        tcp_xfer_part_done(tp, peer, x, 0);
    }
    lane_events(tp, peer, lane);
}

/* A stream that carries nothing for us now was shut or reset. A peer shuts
 * its streams when it says goodbye or gives up, possibly right after the
 * last slices we have not read yet (stream 0 has not announced them): those
 * stay readable, and a stream that ends too early fails in lane_read. A
 * reset loses what was in flight: the peer is lost at once, unless it left
 * on purpose (then only a message that still needs the stream fails). */