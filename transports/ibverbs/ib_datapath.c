/*
 * ib_datapath.c - the data path: eager sends through bounce slots and
 * rendezvous through RDMA WRITEs, receive matching, completions and progress,
 * the side channels' liveness, and memory the user registers.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/byteorder.h"
#include "base/clock.h"
#include "ib_int.h"

/* ---- rendezvous tables ------------------------------------------------------ */

static int rdv_alloc(loom_tp_t *tp, ib_rdv_table_t *t)
{
    if (t->free_head < 0) {
        int n = t->n ? 2 * t->n : 16;
        ib_rdv_t *v = realloc(t->v, sizeof(*v) * (size_t)n);
        if (!v) {
            tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory for a rendezvous");
            return -1;
        }
        for (int i = t->n; i < n; i++)
            v[i] = (ib_rdv_t){.next_free = i + 1 < n ? i + 1 : -1};
        t->free_head = t->n;
        t->v = v;
        t->n = n;
    }
    int id = t->free_head;
    t->free_head = t->v[id].next_free;
    t->v[id] = (ib_rdv_t){.used = 1, .next_free = -1};
    return id;
}

static void rdv_free(ib_rdv_table_t *t, int id)
{
    t->v[id].used = 0;
    t->v[id].next_free = t->free_head;
    t->free_head = id;
}

/* ---- send side ------------------------------------------------------------- */

int ib_credits(const loom_tp_t *tp, const ib_peer_t *p)
{
    uint64_t freed = __atomic_load_n(&tp->ctrl.credit_in[p->rank], __ATOMIC_ACQUIRE);
    return RECV_SLOTS - (int)(p->consumed - freed);
}

static int sq_room(const ib_peer_t *p)
{
    return SQ_DEPTH - (int)(p->sq_posted - p->sq_done);
}

/* Post one WR; signalled when forced or when SIGNAL_EVERY went by unsignalled. */
static loom_status_t post_wr(loom_tp_t *tp, ib_peer_t *p, struct ibv_send_wr *wr, int kind,
                             uint64_t id, int force_signal, uint64_t *seq_p)
{
    uint64_t seq = p->sq_posted + 1;
    int sig = force_signal || seq - p->sq_last_sig >= SIGNAL_EVERY;
    if (sig)
        wr->send_flags |= IBV_SEND_SIGNALED;
    wr->wr_id = WRID(kind, p->rank, kind == WR_SEQ ? seq : id);
    struct ibv_send_wr *bad;
    int rc = ibv_post_send(p->qp, wr, &bad);
    if (rc)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: ibv_post_send to rank %d: %s", p->rank,
                       strerror(rc));
    p->sq_posted = seq;
    p->sq_opcode[seq % SQ_DEPTH] = (uint8_t)wr->opcode;
    p->sq_bytes[seq % SQ_DEPTH] = wr->num_sge ? wr->sg_list[0].length : 0;
    if (sig)
        p->sq_last_sig = seq;
    if (seq_p)
        *seq_p = seq;
    return LOOM_SUCCESS;
}

/* Tell the peer how many of its slots we re-posted (an RDMA WRITE into its
 * credit word; takes no receive of the peer). */
loom_status_t ib_write_credits(loom_tp_t *tp, ib_peer_t *p, int force_signal)
{
    if (sq_room(p) < 1)
        return LOOM_SUCCESS;
    tp->ctrl.credit_src[p->rank] = p->freed;
    struct ibv_sge sge = {.addr = (uintptr_t)&tp->ctrl.credit_src[p->rank],
                          .length = sizeof(uint64_t), .lkey = tp->ctrl_mr->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = tp->max_inline >= sizeof(uint64_t) ? IBV_SEND_INLINE
                                                                               : 0};
    wr.wr.rdma.remote_addr = p->remote_credit_addr;
    wr.wr.rdma.rkey = p->remote_ctrl_rkey;
    if (post_wr(tp, p, &wr, WR_SEQ, 0, force_signal, NULL) != LOOM_SUCCESS)
        return tp->failed;
    p->advertised = p->freed;
    return LOOM_SUCCESS;
}

/* A header (and eager payload) through the next bounce slot; 0 when the
 * peer has no credit, the slot is still in flight or the send queue is full. */
static int post_hdr(loom_tp_t *tp, ib_peer_t *p, const loom_ib_hdr_t *h, const void *payload,
                    size_t len)
{
    uint32_t s = p->send_next % SEND_SLOTS;
    if (ib_credits(tp, p) < 1 || sq_room(p) < 1 || p->send_slot_seq[s] > p->sq_done)
        return 0;
    uint8_t *slot = ib_send_slot(tp, p, (int)s);
    loom_ib_hdr_encode(h, slot);
    if (len)
        memcpy(slot + LOOM_IB_HDR_BYTES, payload, len);
    struct ibv_sge sge = {.addr = (uintptr_t)slot, .length = (uint32_t)(LOOM_IB_HDR_BYTES + len),
                          .lkey = tp->slots_mr->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = LOOM_IB_HDR_BYTES + len <= tp->max_inline
                                               ? IBV_SEND_INLINE : 0};
    uint64_t seq;
    if (post_wr(tp, p, &wr, WR_SEQ, 0, 0, &seq) != LOOM_SUCCESS)
        return -1;
    p->send_slot_seq[s] = seq;
    p->send_next++;
    p->consumed++;
    return 1;
}

/* The payload of a rendezvous send, once the receiver said where: WRITEs,
 * the last one with the receiver's id as immediate data (it takes a receive
 * slot of the peer, so a credit). */
static int post_data(loom_tp_t *tp, ib_peer_t *p, uint32_t id)
{
    ib_rdv_t *s = &tp->rdv_send.v[id];
    size_t len = s->req->len;
    int nchunks = (int)((len + CHUNK_BYTES - 1) / CHUNK_BYTES);
    if (ib_credits(tp, p) < 1 || sq_room(p) < nchunks)
        return 0;
    for (int c = 0; c < nchunks; c++) {
        size_t off = (size_t)c * CHUNK_BYTES;
        size_t n = len - off < CHUNK_BYTES ? len - off : CHUNK_BYTES;
        int last = c == nchunks - 1;
        struct ibv_sge sge = {.addr = (uintptr_t)s->req->buf + off, .length = (uint32_t)n,
                              .lkey = s->reg->lkey};
        struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1,
                                 .opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE};
        wr.wr.rdma.remote_addr = s->raddr + off;
        wr.wr.rdma.rkey = s->rkey;
        if (last)
            wr.imm_data = htonl(s->imm);
        if (post_wr(tp, p, &wr, last ? WR_RDV : WR_SEQ, id, last, last ? &s->seq : NULL) !=
            LOOM_SUCCESS)
            return -1;
    }
    p->consumed++;
    p->rdv_landing++;
    return 1;
}

static int post_op(loom_tp_t *tp, ib_peer_t *p, ib_op_t *op)
{
    loom_tp_req_t *req = op->req;
    switch (op->kind) {
    case OP_EAGER: {
        loom_ib_hdr_t h = {.type = LOOM_IB_EAGER, .desc = req->match.desc, .tag = req->match.tag,
                           .total = req->match.total, .len = req->len};
        int r = post_hdr(tp, p, &h, req->buf, req->len);
        if (r == 1) {
            /* The bytes are in the bounce slot: the caller's buffer is free. */
            tp->neager++;
            req->off = req->len;
            req->status = LOOM_SUCCESS;
            req->done = 1;
        }
        return r;
    }
    case OP_RTS: {
        loom_ib_hdr_t h = {.type = LOOM_IB_RTS, .desc = req->match.desc, .tag = req->match.tag,
                           .total = req->match.total, .len = req->len, .cookie = op->id};
        return post_hdr(tp, p, &h, NULL, 0);
    }
    case OP_CTS:
        return post_hdr(tp, p, &op->hdr, NULL, 0);
    case OP_DATA:
        return post_data(tp, p, op->id);
    }
    return -1;
}

static loom_status_t enqueue(loom_tp_t *tp, ib_peer_t *p, int kind, loom_tp_req_t *req,
                             uint32_t id, const loom_ib_hdr_t *h)
{
    ib_op_t *op = tp->op_free;
    if (op)
        tp->op_free = op->next;
    else if (!(op = malloc(sizeof(*op))))
        return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
    *op = (ib_op_t){.kind = kind, .req = req, .id = id};
    if (h)
        op->hdr = *h;
    if (p->oq_tail)
        p->oq_tail->next = op;
    else
        p->oq_head = op;
    p->oq_tail = op;
    tp->nqueued++;
    return LOOM_SUCCESS;
}

/* Post what the peer's credits and our send queue allow, in order. */
static int pump(loom_tp_t *tp, ib_peer_t *p)
{
    int posted = 0;
    while (p->oq_head && !tp->failed) {
        int r = post_op(tp, p, p->oq_head);
        if (r <= 0)
            break;
        ib_op_t *op = p->oq_head;
        p->oq_head = op->next;
        if (!p->oq_head)
            p->oq_tail = NULL;
        op->next = tp->op_free;
        tp->op_free = op;
        tp->nqueued--;
        posted = 1;
    }
    return posted;
}

/* What to check when a registration fails. */
static const char *reg_hint(const loom_tp_req_t *req)
{
    return req->on_device ? "GPU memory: does the HCA driver take dma-bufs, or is "
                            "nvidia-peermem loaded?"
                          : "RLIMIT_MEMLOCK?";
}

/* The registration for a rendezvous of req. GPU memory is registered a whole
 * allocation at a time and kept under the allocation's identity (as NCCL keys
 * its cache on the buffer id): a collective reuses its buffers call after
 * call, and an allocation freed and made again at the same address has
 * another identity, so it is never served the old registration. */
static int reg_get(loom_tp_t *tp, const loom_tp_req_t *req, loom_rcache_t **rc_p,
                   loom_rc_entry_t **e_p)
{
    if (!req->on_device) {
        *rc_p = &tp->rcache;
        return loom_rcache_get(&tp->rcache, req->buf, req->len, e_p);
    }
    *rc_p = &tp->dcache;
    uintptr_t base = 0, at = (uintptr_t)req->buf;
    size_t size = 0;
    uint64_t id = 0;
    if (tp->devmem && tp->devmem->alloc_range &&
        tp->devmem->alloc_range(req->buf, &base, &size, &id) == 0 && id && base <= at &&
        at + req->len <= base + size) {
        /* An allocation that would crowd the cache (a whole model's flat
         * buffer): only the message's pages, still under its identity. */
        if (size > tp->dcache.max_bytes / 4) {
            base = at;
            size = req->len;
        }
        return loom_rcache_get_keyed(&tp->dcache, (void *)base, size, id, e_p);
    }
    return loom_rcache_get_keyed(&tp->dcache, req->buf, req->len, 0, e_p);
}

static loom_status_t isend_owned(loom_tp_t *tp, loom_tp_req_t *req)
{
    if (tp->failed)
        return tp->failed;
    loom_req_start(req);
    ib_peer_t *p = &tp->peers[req->peer];
    if (req->on_device && (req->peer == tp->rank || (tp->gdr_path != LOOM_GDR_DMABUF &&
                                                     tp->gdr_path != LOOM_GDR_PEERMEM)))
        return tp_fail(tp, LOOM_ERR_INTERNAL, "ibverbs: a GPU buffer posted to rank %d without "
                       "GPUDirect RDMA", req->peer);
    if (req->peer == tp->rank)   /* matched in memory */
        return loom_tp_self_send(tp, &p->rq, &p->uq, req, &tp->failed, tp->err, "ibverbs",
                                 tp->rank, NULL);
    if (!p->active)
        return tp_fail(tp, LOOM_ERR_INTERNAL, "ibverbs: rank %d is not connected to rank %d",
                       tp->rank, req->peer);
    if (p->said_bye)
        return tp_fail(tp, LOOM_ERR_PEER_LOST, "rank %d sends to rank %d, which has destroyed "
                       "its communicator", tp->rank, p->rank);
    if (p->gave_up)
        return loom_tp_fail_gave_up(&tp->failed, tp->err, "ibverbs", tp->rank, p->rank);
    /* GPU memory never goes through a bounce slot (the host cannot read it). */
    if (req->len <= EAGER_MAX && !(req->on_device && req->len)) {
        if (enqueue(tp, p, OP_EAGER, req, 0, NULL) != LOOM_SUCCESS)
            return tp->failed;
    } else {
        int id = rdv_alloc(tp, &tp->rdv_send);
        if (id < 0)
            return tp->failed;
        ib_rdv_t *s = &tp->rdv_send.v[id];
        /* Registered now, so it overlaps the round trip to the receiver. */
        if (reg_get(tp, req, &s->rc, &s->reg) != 0) {
            int e = errno;
            rdv_free(&tp->rdv_send, id);
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: cannot register %zu bytes at %p "
                           "for rank %d: %s (%s)", req->len, req->buf, p->rank, strerror(e),
                           reg_hint(req));
        }
        s->peer = p->rank;
        s->req = req;
        p->rdv_out++;
        tp->nrdv++;
        if (enqueue(tp, p, OP_RTS, req, (uint32_t)id, NULL) != LOOM_SUCCESS)
            return tp->failed;
    }
    pump(tp, p);
    return tp->failed;
}

/* ---- receive side ---------------------------------------------------------- */

static loom_frame_t hdr_frame(const loom_ib_hdr_t *h)
{
    loom_frame_t f = {.kind = LOOM_FRAME_DATA, .len = h->len,
                      .match = {.tag = h->tag, .desc = h->desc, .total = h->total}};
    return f;
}

/* The oldest receive posted for f's tag, unlinked; NULL when none is posted
 * or f does not fit it (then the instance has failed). */
#define rq_take(tp, p, f) \
    loom_tp_match(&(p)->rq, f, &(tp)->failed, (tp)->err, "ibverbs", (tp)->rank)

/* A receive matched an RTS: register the buffer and say where to write. */
static loom_status_t start_rdv_recv(loom_tp_t *tp, ib_peer_t *p, loom_tp_req_t *req,
                                    uint32_t cookie)
{
    int id = rdv_alloc(tp, &tp->rdv_recv);
    if (id < 0)
        return tp->failed;
    ib_rdv_t *r = &tp->rdv_recv.v[id];
    if (reg_get(tp, req, &r->rc, &r->reg) != 0) {
        int e = errno;
        rdv_free(&tp->rdv_recv, id);
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: cannot register %zu bytes at %p for a "
                       "message from rank %d: %s (%s)", req->len, req->buf, p->rank, strerror(e),
                       reg_hint(req));
    }
    r->peer = p->rank;
    r->req = req;
    p->rdv_in++;
    loom_ib_hdr_t cts = {.type = LOOM_IB_CTS, .len = req->len, .cookie = cookie,
                         .peer_cookie = (uint32_t)id, .rkey = r->reg->rkey,
                         .addr = (uintptr_t)req->buf};
    if (enqueue(tp, p, OP_CTS, NULL, 0, &cts) != LOOM_SUCCESS)
        return tp->failed;
    pump(tp, p);
    return tp->failed;
}

/* A small message sent from host memory (eager) for a receive into GPU
 * memory: the host cannot write GPU memory, the accelerator copies it in. */
static loom_status_t deliver_to_device(loom_tp_t *tp, loom_tp_req_t *req, const void *data,
                                       size_t len)
{
    if (len && (!tp->devmem || !tp->devmem->copy_in || tp->devmem->copy_in(req->buf, data, len)))
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: cannot copy a %zu-byte message of "
                       "rank %d into GPU memory", len, req->peer);
    req->off = len;
    loom_req_complete(req);
    return LOOM_SUCCESS;
}

static loom_status_t irecv_owned(loom_tp_t *tp, loom_tp_req_t *req)
{
    if (tp->failed)
        return tp->failed;
    loom_req_start(req);
    ib_peer_t *p = &tp->peers[req->peer];
    if (req->peer != tp->rank && !p->active)
        return tp_fail(tp, LOOM_ERR_INTERNAL, "ibverbs: rank %d is not connected to rank %d",
                       tp->rank, req->peer);
    loom_unexp_t *u = loom_tp_unexp_match(&p->uq, req, &tp->failed, tp->err, "ibverbs", tp->rank);
    if (tp->failed)
        return tp->failed;
    if (u) {
        if (u->data && req->on_device)
            deliver_to_device(tp, req, u->data, u->got);
        else if (u->data)
            loom_unexp_deliver(u, req);
        else
            start_rdv_recv(tp, p, req, (uint32_t)u->token);
        free(u->data);
        free(u);
        return tp->failed;
    }
    loom_req_queue_push(&p->rq, req);
    return LOOM_SUCCESS;
}

static loom_status_t on_message(loom_tp_t *tp, ib_peer_t *p, const uint8_t *slot, uint32_t bytes)
{
    loom_ib_hdr_t h;
    if (bytes < LOOM_IB_HDR_BYTES || loom_ib_hdr_decode(slot, &h) != 0 ||
        (h.type == LOOM_IB_EAGER && h.len != bytes - LOOM_IB_HDR_BYTES))
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: protocol error: rank %d sent a "
                       "malformed message (%u bytes)", p->rank, bytes);
    if (h.type == LOOM_IB_CTS) {
        ib_rdv_t *s = h.cookie < (uint32_t)tp->rdv_send.n ? &tp->rdv_send.v[h.cookie] : NULL;
        if (!s || !s->used || s->peer != p->rank || h.len != s->req->len)
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: protocol error: rank %d answered "
                           "a rendezvous that is not pending", p->rank);
        s->raddr = h.addr;
        s->rkey = h.rkey;
        s->imm = h.peer_cookie;
        if (enqueue(tp, p, OP_DATA, s->req, h.cookie, NULL) != LOOM_SUCCESS)
            return tp->failed;
        pump(tp, p);
        return tp->failed;
    }
    loom_frame_t f = hdr_frame(&h);
    loom_tp_req_t *req = rq_take(tp, p, &f);
    if (tp->failed)
        return tp->failed;
    if (req) {
        if (h.type == LOOM_IB_RTS)
            return start_rdv_recv(tp, p, req, h.cookie);
        if (req->on_device)
            return deliver_to_device(tp, req, slot + LOOM_IB_HDR_BYTES, h.len);
        if (h.len)
            memcpy(req->buf, slot + LOOM_IB_HDR_BYTES, h.len);
        loom_req_complete(req);
        return LOOM_SUCCESS;
    }
    loom_unexp_t *u = loom_unexp_new(&f);
    if (!u)
        return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
    u->token = h.cookie;
    if (h.type == LOOM_IB_EAGER) {
        tp->nunexpected++;
        if (loom_unexp_hold(u, slot + LOOM_IB_HDR_BYTES, h.len) != 0) {
            free(u);
            return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory holding a %llu-byte early "
                           "message", (unsigned long long)h.len);
        }
    }
    loom_unexp_push(&p->uq, u);
    return LOOM_SUCCESS;
}

static loom_status_t on_rdv_written(loom_tp_t *tp, ib_peer_t *p, uint32_t id, uint32_t bytes)
{
    ib_rdv_t *r = id < (uint32_t)tp->rdv_recv.n ? &tp->rdv_recv.v[id] : NULL;
    if (!r || !r->used || r->peer != p->rank)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: protocol error: rank %d completed a "
                       "rendezvous that is not pending", p->rank);
    if ((uint64_t)bytes != (r->req->len - 1) % CHUNK_BYTES + 1)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: rank %d wrote %u bytes of a %zu-byte "
                       "message", p->rank, bytes, r->req->len);
    loom_req_complete(r->req);
    loom_rcache_put(r->rc, r->reg);
    rdv_free(&tp->rdv_recv, (int)id);
    p->rdv_in--;
    return LOOM_SUCCESS;
}

/* ---- completions, progress ------------------------------------------------- */

int ib_nothing_pending(const ib_peer_t *p)
{
    return !p->rq.head && !p->oq_head && p->rdv_in == 0 && p->rdv_out == 0;
}

static const char *wr_opcode_name(int op)
{
    switch (op) {
    case IBV_WR_SEND: return "SEND";
    case IBV_WR_RDMA_WRITE: return "RDMA_WRITE";
    case IBV_WR_RDMA_WRITE_WITH_IMM: return "RDMA_WRITE_WITH_IMM";
    default: return "work request";
    }
}

/* What the failed WR was: an error completion's opcode is undefined (IB
 * spec), so it is looked up from what we posted under that wr_id. */
static void describe_wr(const loom_tp_t *tp, const struct ibv_wc *wc, int is_recv, char *out,
                        size_t outlen)
{
    int peer = WRID_PEER(wc->wr_id);
    uint64_t low = WRID_LOW(wc->wr_id);
    const ib_peer_t *p = peer < tp->size ? &tp->peers[peer] : NULL;
    if (is_recv || WRID_KIND(wc->wr_id) == WR_RECV)
        snprintf(out, outlen, "RECV (receive slot %u) from rank %d", (unsigned)low, peer);
    else if (WRID_KIND(wc->wr_id) == WR_RDV && low < (uint64_t)tp->rdv_send.n &&
             tp->rdv_send.v[low].used && tp->rdv_send.v[low].req)
        snprintf(out, outlen, "RDMA_WRITE_WITH_IMM (end of a %zu-byte message) to rank %d",
                 tp->rdv_send.v[low].req->len, peer);
    else if (p && WRID_KIND(wc->wr_id) == WR_SEQ && low <= p->sq_posted &&
             p->sq_posted - low < SQ_DEPTH)
        snprintf(out, outlen, "%s of %u bytes to rank %d",
                 wr_opcode_name(p->sq_opcode[low % SQ_DEPTH]), p->sq_bytes[low % SQ_DEPTH],
                 peer);
    else
        snprintf(out, outlen, "work request to rank %d", peer);
}

static const char *wc_hint(enum ibv_wc_status st)
{
    switch (st) {
    case IBV_WC_RETRY_EXC_ERR:
        return "; no acknowledgement within LOOM_IB_TIMEOUT, LOOM_IB_RETRY_CNT times: the peer "
               "process or its node is gone, the fabric path is down, or the link is slower than "
               "LOOM_IB_TIMEOUT allows";
    case IBV_WC_RNR_RETRY_EXC_ERR:
        return "; the peer had no receive posted, LOOM_IB_RNR_RETRY times";
    case IBV_WC_REM_ACCESS_ERR:
        return "; the peer refused the access (memory not registered there any more, a bad "
               "rkey or range)";
    case IBV_WC_LOC_PROT_ERR:
        return "; local memory not registered for this access (deregistered or unmapped?)";
    case IBV_WC_WR_FLUSH_ERR:
        return "; the queue pair went to the error state before this request ran: no earlier "
               "error completion was found here (the peer may report the cause)";
    default:
        return "";
    }
}

/* The first error completion of a QP is its cause; the ones after it are
 * flushes (WR_FLUSH_ERR). The send and receive CQs are separate and a flush
 * can be polled from one before the cause from the other: on a flush, look at
 * everything the CQs hold (a little while: an HCA may still be writing it) for
 * the cause. The instance is failing, so what is drained is dropped. */
static void find_cause(loom_tp_t *tp, struct ibv_wc *first, int *is_recv)
{
    if (first->status != IBV_WC_WR_FLUSH_ERR)
        return;
    double until = loom_now_s() + 0.05;
    do {
        struct ibv_wc wc[32];
        int got = 0;
        for (int q = 0; q < 2; q++) {
            int n = ibv_poll_cq(q ? tp->rcq : tp->scq, 32, wc);
            for (int i = 0; i < n; i++)
                if (wc[i].status != IBV_WC_SUCCESS && wc[i].status != IBV_WC_WR_FLUSH_ERR) {
                    *first = wc[i];
                    *is_recv = q;
                    return;
                }
            got += n > 0 ? n : 0;
        }
        if (!got)
            sched_yield();
    } while (loom_now_s() < until);
}

static loom_status_t report_wc(loom_tp_t *tp, const struct ibv_wc *wcp, int is_recv);

static loom_status_t on_wc_error(loom_tp_t *tp, const struct ibv_wc *wc_in, int is_recv)
{
    struct ibv_wc wc = *wc_in;
    int peer = WRID_PEER(wc.wr_id);
    ib_peer_t *p = peer < tp->size ? &tp->peers[peer] : NULL;
    /* A peer that left on purpose tears its QP down: what we still had in
     * flight to it fails, harmlessly if nothing of ours waits on it. */
    if (p && !p->said_bye)
        ib_check_sockets(tp, 0);
    if (tp->failed)
        return tp->failed;
    if (p && p->said_bye && ib_nothing_pending(p))
        return LOOM_SUCCESS;
    find_cause(tp, &wc, &is_recv);
    return report_wc(tp, &wc, is_recv);
}

static loom_status_t report_wc(loom_tp_t *tp, const struct ibv_wc *wcp, int is_recv)
{
    struct ibv_wc wc = *wcp;
    int peer = WRID_PEER(wc.wr_id);
    ib_peer_t *p = peer < tp->size ? &tp->peers[peer] : NULL;
    char what[128];
    describe_wr(tp, &wc, is_recv, what, sizeof(what));
    int lost = wc.status == IBV_WC_RETRY_EXC_ERR || (p && p->hung_up);
    return tp_fail(tp, lost ? LOOM_ERR_PEER_LOST : LOOM_ERR_TRANSPORT,
                   "ibverbs: rank %d: %s failed on %s:%d: %s (status %d, vendor error 0x%x)%s%s",
                   tp->rank, what, tp->dev_name, tp->port, tp->api->wc_status_str(wc.status),
                   (int)wc.status, wc.vendor_err, wc_hint(wc.status),
                   !p || (!p->hung_up && !p->gave_up) ? ""
                   : p->gave_up ? "; that rank gave up on this communicator (a failed call or "
                                  "loom_comm_abort there)"
                                : "; that rank's side channel closed without a goodbye");
}

static int poll_cqs(loom_tp_t *tp)
{
    struct ibv_wc wc[32];
    int total = 0;
    int n = ibv_poll_cq(tp->scq, 32, wc);
    if (n < 0) {
        tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: polling the send completion queue failed "
                "(overrun?)");
        return 0;
    }
    for (int i = 0; i < n && !tp->failed; i++) {
        total++;
        if (wc[i].status != IBV_WC_SUCCESS) {
            on_wc_error(tp, &wc[i], 0);
            continue;
        }
        int peer = WRID_PEER(wc[i].wr_id);
        if (peer >= tp->size) {
            tp_fail(tp, LOOM_ERR_INTERNAL, "ibverbs: a completion names rank %d", peer);
            break;
        }
        ib_peer_t *p = &tp->peers[peer];
        uint64_t seq = WRID_LOW(wc[i].wr_id);
        if (WRID_KIND(wc[i].wr_id) == WR_RDV) {
            ib_rdv_t *s = &tp->rdv_send.v[seq];
            seq = s->seq;
            loom_req_complete(s->req);
            loom_rcache_put(s->rc, s->reg);
            rdv_free(&tp->rdv_send, (int)WRID_LOW(wc[i].wr_id));
            p->rdv_out--;
            p->rdv_landing--;
        }
        if (seq > p->sq_done)
            p->sq_done = seq;
    }
    n = ibv_poll_cq(tp->rcq, 32, wc);
    if (n < 0) {
        tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: polling the receive completion queue failed "
                "(overrun?)");
        return total;
    }
    for (int i = 0; i < n && !tp->failed; i++) {
        total++;
        if (wc[i].status != IBV_WC_SUCCESS) {
            on_wc_error(tp, &wc[i], 1);
            continue;
        }
        int peer = WRID_PEER(wc[i].wr_id);
        int slot = (int)WRID_LOW(wc[i].wr_id);
        if (peer >= tp->size || slot >= RECV_SLOTS || !tp->peers[peer].active) {
            tp_fail(tp, LOOM_ERR_INTERNAL, "ibverbs: a receive completion names rank %d slot %d",
                    peer, slot);
            break;
        }
        ib_peer_t *p = &tp->peers[peer];
        if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM)
            on_rdv_written(tp, p, ntohl(wc[i].imm_data), wc[i].byte_len);
        else
            on_message(tp, p, ib_recv_slot(tp, p, slot), wc[i].byte_len);
        if (tp->failed)
            break;
        if (ib_post_recv_slot(tp, p, slot) != LOOM_SUCCESS)
            break;
        p->freed++;
        if (p->freed - p->advertised >= CREDIT_BATCH && !p->said_bye) {
            ib_write_credits(tp, p, 0);
            if (p->advertised != p->freed)
                tp->credit_dirty = 1;
        }
    }
    return total;
}

static void on_goodbye(ib_peer_t *p)
{
    uint64_t sent = loom_get64(p->note + 1);
    if (sent > p->sent_to_us)
        p->sent_to_us = sent;
    if (p->note[0] == 'G') {
        if (!p->gave_up)
            p->gave_up_at = loom_now_s();
        p->gave_up = 1;
    } else {
        if (!p->said_bye)
            p->bye_at = loom_now_s();
        p->said_bye = 1;
    }
    p->note_len = 0;
}

/* Goodbyes and deaths on the side channels; a wake-up from abort. */
void ib_check_sockets(loom_tp_t *tp, long timeout_us)
{
    if (!tp->pfds)
        return;
    struct timespec ts = {timeout_us / 1000000, (timeout_us % 1000000) * 1000};
    int n = ppoll(tp->pfds, (nfds_t)tp->nactive + 1, &ts, NULL);
    if (n <= 0)
        return;
    for (int i = 0; i < tp->nactive && !tp->failed; i++) {
        if (!tp->pfds[i].revents)
            continue;
        ib_peer_t *p = &tp->peers[tp->active[i]];
        uint8_t buf[4 * NOTE_BYTES];
        ssize_t got = recv(p->fd, buf, sizeof(buf), MSG_DONTWAIT);
        for (ssize_t k = 0; k < got; k++) {
            if (p->note_len == 0 && buf[k] != 'G' && buf[k] != 'B') {
                tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: protocol error on the side channel "
                        "of rank %d", p->rank);
                return;
            }
            p->note[p->note_len++] = buf[k];
            if (p->note_len == NOTE_BYTES)
                on_goodbye(p);
        }
        if (got < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (got == 0 || got < 0) {
            close(p->fd);
            p->fd = tp->pfds[i].fd = -1;
            /* Judged a little later (check_goodbyes): what the peer sent before it
             * went, a mismatch it found for instance, may still be on its way. */
            if (!p->said_bye) {
                p->hung_up = 1;
                p->hangup_at = loom_now_s();
            }
        }
    }
    if (tp->pfds[tp->nactive].revents) {
        uint64_t v;
        if (read(tp->wake_fd, &v, sizeof(v)) < 0) { /* drained already */ }
    }
    int why = atomic_load(&tp->abort_why);
    if (why)
        tp_fail(tp, (loom_status_t)why, "the communicator was aborted");
}

/* Before blaming a peer that gave up: when our own queue pair with it broke,
 * that is this rank's failure, reported with its own cause. */
static int own_qp_failed(loom_tp_t *tp, ib_peer_t *p)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    if (!p->qp || tp->api->query_qp(p->qp, &a, IBV_QP_STATE, &ia) != 0 ||
        a.qp_state != IBV_QPS_ERR)
        return 0;
    struct ibv_wc wc = {.wr_id = WRID(WR_RECV, p->rank, 0), .status = IBV_WC_WR_FLUSH_ERR};
    int is_recv = 1;
    find_cause(tp, &wc, &is_recv);
    if (wc.status == IBV_WC_WR_FLUSH_ERR) {
        tp_fail(tp, LOOM_ERR_PEER_LOST, "ibverbs: rank %d: its queue pair with rank %d on %s:%d "
                "is in the error state, with no error completion here (the peer may report the "
                "cause); rank %d gave up on this communicator", tp->rank, p->rank, tp->dev_name,
                tp->port, p->rank);
        return 1;
    }
    report_wc(tp, &wc, is_recv);
    return 1;
}

/* A peer that said goodbye or gave up is judged once all it sent us is in:
 * its messages may arrive after the side channel told us (a busy machine, a
 * slow HCA), even after the channel closed. Should some never come,
 * NOTE_WAIT_S ends the wait. Only a peer that closed without a note (it
 * died) is judged by the short grace, as nothing counts what it sent. */
static void check_goodbyes(loom_tp_t *tp, double now)
{
    for (int i = 0; i < tp->nactive && !tp->failed; i++) {
        ib_peer_t *p = &tp->peers[tp->active[i]];
        int all_in = p->freed >= p->sent_to_us;
        /* A rendezvous whose data is posted may have reached the peer before
         * its goodbye did: its completion (or its error) tells, not the goodbye. */
        int waits = p->rq.head || p->oq_head || p->rdv_in || p->rdv_out > p->rdv_landing;
        if (p->said_bye && waits &&
            (all_in || now - p->bye_at > NOTE_WAIT_S))
            tp_fail(tp, LOOM_ERR_PEER_LOST, "rank %d destroyed its communicator while rank %d "
                    "still exchanges messages with it", p->rank, tp->rank);
        else if (p->gave_up && (p->hung_up || !ib_nothing_pending(p)) &&
                 (all_in || now - p->gave_up_at > NOTE_WAIT_S))
        {
            if (!own_qp_failed(tp, p))
                loom_tp_fail_gave_up(&tp->failed, tp->err, "ibverbs", tp->rank, p->rank);
        } else if (p->hung_up && !p->gave_up && now - p->hangup_at > BYE_GRACE_S)
            tp_fail(tp, LOOM_ERR_PEER_LOST, "rank %d lost rank %d: its side channel closed "
                    "without a goodbye (the process died or exited without "
                    "loom_comm_destroy)", tp->rank, p->rank);
    }
}

static int service(loom_tp_t *tp)
{
    int moved = poll_cqs(tp) > 0;
    if (!tp->failed && tp->nqueued)
        for (int i = 0; i < tp->nactive && !tp->failed; i++)
            if (tp->peers[tp->active[i]].oq_head)
                moved |= pump(tp, &tp->peers[tp->active[i]]);
    if (!tp->failed && tp->credit_dirty) {
        tp->credit_dirty = 0;
        for (int i = 0; i < tp->nactive && !tp->failed; i++) {
            ib_peer_t *p = &tp->peers[tp->active[i]];
            if (p->freed - p->advertised >= CREDIT_BATCH && !p->said_bye) {
                ib_write_credits(tp, p, 0);
                if (p->advertised != p->freed)
                    tp->credit_dirty = 1;
            }
        }
    }
    return moved;
}

static loom_status_t progress_owned(loom_tp_t *tp, int timeout_ms, int *moved_p)
{
    *moved_p = 0;
    if (!tp->failed) {
        int why = atomic_load(&tp->abort_why);
        if (why)
            tp_fail(tp, (loom_status_t)why, "the communicator was aborted");
    }
    if (tp->failed)
        return tp->failed;
    double now = loom_now_s();
    double deadline = now + (timeout_ms > 0 ? timeout_ms / 1000.0 : 0);
    long nap_us = 0;
    for (;;) {
        int moved = service(tp);
        now = loom_now_s();
        if (!tp->failed && (now >= tp->next_sock_check || nap_us)) {
            ib_check_sockets(tp, 0);
            check_goodbyes(tp, now);
            tp->next_sock_check = now + SOCK_CHECK_S;
        }
        if (moved)
            *moved_p = 1;
        if (tp->failed || moved || timeout_ms == 0 || (timeout_ms > 0 && now >= deadline))
            break;
        /* Nothing to do: no completion channel is used (a test provider need
         * not have one), so doze on the side channels and the abort eventfd in
         * naps that grow from 20 us to 1 ms, polling the CQs in between. */
        long left_us = timeout_ms < 0 ? 1000000 : (long)((deadline - now) * 1e6);
        nap_us = nap_us ? (nap_us < 1000 ? 2 * nap_us : 1000) : 20;
        if (left_us < 1)
            left_us = 1;
        ib_check_sockets(tp, nap_us < left_us ? nap_us : left_us);
    }
    return tp->failed;
}

/* Who may touch the side channels and queues: see loom_tp_own; loom_tp_leave tells the
 * peers of a failure on the way out. */
#define disown(tp, st) loom_tp_leave(&(tp)->owner, &(tp)->failed, ib_announce_failure, tp, st)

loom_status_t ib_isend(loom_tp_t *tp, loom_tp_req_t *req)
{
    loom_tp_own(&tp->owner);
    return disown(tp, isend_owned(tp, req));
}

loom_status_t ib_irecv(loom_tp_t *tp, loom_tp_req_t *req)
{
    loom_tp_own(&tp->owner);
    return disown(tp, irecv_owned(tp, req));
}

/* Early eager messages and announced rendezvous (their RTS) alike. */
int ib_probe(loom_tp_t *tp, int rank, uint64_t tag)
{
    loom_tp_own(&tp->owner);
    int found = loom_unexp_probe(&tp->peers[rank].uq, tag);
    loom_tp_disown(&tp->owner);
    return found;
}

loom_status_t ib_progress(loom_tp_t *tp, int timeout_ms, int *moved_p)
{
    loom_tp_own(&tp->owner);
    return disown(tp, progress_owned(tp, timeout_ms, moved_p));
}

/* ---- memory the user registers (loom_comm_register_buffer) ----------------- */

/* A pinned registration held until ib_mem_deregister: the caller promised the
 * range stays mapped, so messages inside it reuse it (a cache hit). */
loom_status_t ib_mem_register(loom_tp_t *tp, void *buf, size_t len, void **handle_p)
{
    loom_rc_entry_t *e;
    loom_tp_own(&tp->owner);
    tp->reg_pinned = 1;
    int rc = loom_rcache_get_new(&tp->rcache, buf, len, &e);
    int saved = errno;
    tp->reg_pinned = 0;
    loom_tp_disown(&tp->owner);
    if (rc != 0) {
        /* Not through tp->err: an operation running on another thread owns it. */
        errno = saved;
        return LOOM_ERR_TRANSPORT;
    }
    *handle_p = e;
    return LOOM_SUCCESS;
}

void ib_mem_deregister(loom_tp_t *tp, void *handle)
{
    if (!handle)
        return;
    loom_tp_own(&tp->owner);
    loom_rcache_put(&tp->rcache, handle);
    loom_tp_disown(&tp->owner);
}
