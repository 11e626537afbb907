/*
 * ib_connect.c - connect: the completion queues, message slots and a queue
 * pair per peer, brought up through the side-channel exchange of records
 * (with the proofs of LOOM_AUTH_KEY).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/byteorder.h"
#include "base/clock.h"
#include "ib_int.h"
#include "base/log.h"
#include "base/crypto.h"
#include "transports/tp_handshake.h"
#include "transports/wire.h"

#define REC_BYTES 96
#define REC_MAGIC "LOOMIBV1"
#define REC_VERSION 1
#define REC_AUTH 1u            /* the sender holds LOOM_AUTH_KEY; a nonce follows */
#define REC_REFUSED 2u         /* the acceptor refuses: LOOM_AUTH_KEY on one side only */
#define PROOF_BYTES 32

/* ---- the side-channel record ------------------------------------------------ */

typedef struct ib_rec {
    uint32_t rank, size, qpn, psn, ctrl_rkey;
    uint16_t lid;
    uint8_t link_layer, mtu;
    uint8_t gid[16];
    uint64_t job_hash, comm_hash, ctrl_addr;
    uint32_t flags;
    uint8_t nonce[16];
} ib_rec_t;

static void rec_encode(const ib_rec_t *r, uint8_t out[REC_BYTES])
{
    memset(out, 0, REC_BYTES);
    memcpy(out, REC_MAGIC, 8);
    loom_put32(out + 8, REC_VERSION);
    loom_put32(out + 12, r->rank);
    loom_put32(out + 16, r->size);
    loom_put32(out + 20, r->qpn);
    loom_put32(out + 24, r->psn);
    loom_put32(out + 28, r->ctrl_rkey);
    loom_put16(out + 32, r->lid);
    out[34] = r->link_layer;
    out[35] = r->mtu;
    memcpy(out + 36, r->gid, 16);
    loom_put64(out + 52, r->job_hash);
    loom_put64(out + 60, r->comm_hash);
    loom_put64(out + 68, r->ctrl_addr);
    loom_put32(out + 76, r->flags);
    memcpy(out + 80, r->nonce, 16);
}

static int rec_decode(const uint8_t in[REC_BYTES], ib_rec_t *r)
{
    if (memcmp(in, REC_MAGIC, 8) != 0 || loom_get32(in + 8) != REC_VERSION)
        return -1;
    r->rank = loom_get32(in + 12);
    r->size = loom_get32(in + 16);
    r->qpn = loom_get32(in + 20);
    r->psn = loom_get32(in + 24);
    r->ctrl_rkey = loom_get32(in + 28);
    r->lid = loom_get16(in + 32);
    r->link_layer = in[34];
    r->mtu = in[35];
    memcpy(r->gid, in + 36, 16);
    r->job_hash = loom_get64(in + 52);
    r->comm_hash = loom_get64(in + 60);
    r->ctrl_addr = loom_get64(in + 68);
    r->flags = loom_get32(in + 76);
    memcpy(r->nonce, in + 80, 16);
    return 0;
}

/* ---- connect: QPs, slots, and the side-channel exchange -------------------- */

loom_status_t ib_post_recv_slot(loom_tp_t *tp, ib_peer_t *p, int slot)
{
    struct ibv_sge sge = {.addr = (uintptr_t)ib_recv_slot(tp, p, slot), .length = SLOT_BYTES,
                          .lkey = tp->slots_mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = WRID(WR_RECV, p->rank, slot), .sg_list = &sge,
                             .num_sge = 1}, *bad;
    int rc = ibv_post_recv(p->qp, &wr, &bad);
    if (rc)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: ibv_post_recv for rank %d: %s", p->rank,
                       strerror(rc));
    return LOOM_SUCCESS;
}

static loom_status_t create_qp(loom_tp_t *tp, ib_peer_t *p)
{
    struct ibv_qp_init_attr ia = {
        .send_cq = tp->scq, .recv_cq = tp->rcq, .qp_type = IBV_QPT_RC, .sq_sig_all = 0,
        .cap = {.max_send_wr = SQ_DEPTH, .max_recv_wr = RECV_SLOTS, .max_send_sge = 1,
                .max_recv_sge = 1, .max_inline_data = INLINE_WANT}};
    p->qp = tp->api->create_qp(tp->pd, &ia);
    if (!p->qp) {
        /* Not every HCA inlines: ask again without. */
        ia.cap.max_inline_data = 0;
        p->qp = tp->api->create_qp(tp->pd, &ia);
    }
    if (!p->qp)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: ibv_create_qp for rank %d: %s", p->rank,
                       strerror(errno));
    if (p->idx == 0 || ia.cap.max_inline_data < tp->max_inline)
        tp->max_inline = ia.cap.max_inline_data;
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = tp->port,
                            .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
    int rc = tp->api->modify_qp(p->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                IBV_QP_ACCESS_FLAGS);
    if (rc)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: QP for rank %d to INIT: %s", p->rank,
                       strerror(rc));
    p->psn = (uint32_t)(((uintptr_t)p ^ (uint64_t)(loom_now_s() * 1e9)) & 0xffffff);
    return LOOM_SUCCESS;
}

static void my_record(loom_tp_t *tp, const ib_peer_t *p, uint32_t flags,
                      const uint8_t nonce[16], uint8_t out[REC_BYTES])
{
    ib_rec_t r = {.rank = (uint32_t)tp->rank, .size = (uint32_t)tp->size, .qpn = p->qp->qp_num,
                  .psn = p->psn, .ctrl_rkey = tp->ctrl_mr->rkey, .lid = tp->lid,
                  .link_layer = tp->link_layer, .mtu = (uint8_t)tp->mtu,
                  .job_hash = tp->job_hash, .comm_hash = tp->comm_hash,
                  .ctrl_addr = (uintptr_t)tp->ctrl.credit_in, .flags = flags};
    memcpy(r.gid, tp->gid, 16);
    if (nonce)
        memcpy(r.nonce, nonce, 16);
    rec_encode(&r, out);
}

/* RTR with the peer's record, receives posted, RTS. */
static loom_status_t qp_up(loom_tp_t *tp, ib_peer_t *p, const ib_rec_t *r)
{
    if (r->link_layer != tp->link_layer)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: rank %d is on %s, rank %d on %s: every "
                       "rank must use the same fabric (see LOOM_IB_HCA)", (int)r->rank,
                       r->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
                       tp->rank, tp->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand");
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = (enum ibv_mtu)r->mtu < tp->mtu ? (enum ibv_mtu)r->mtu : tp->mtu;
    a.dest_qp_num = r->qpn;
    a.rq_psn = r->psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = tp->port;
    a.ah_attr.dlid = r->lid;
    a.ah_attr.sl = tp->sl;
    if (tp->link_layer == IBV_LINK_LAYER_ETHERNET || r->lid == 0) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, r->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)tp->gid_index;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.grh.traffic_class = tp->tc;
    }
    int rc = tp->api->modify_qp(p->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                IBV_QP_MIN_RNR_TIMER);
    if (rc)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: QP for rank %d to RTR: %s", p->rank,
                       strerror(rc));
    for (int i = 0; i < RECV_SLOTS; i++)
        if (ib_post_recv_slot(tp, p, i) != LOOM_SUCCESS)
            return tp->failed;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    /* A slow link (soft-RoCE between two VMs: tens of ms for 8 bytes) takes
     * longer than 67 ms (timeout 14) to ack a large WRITE: the requester
     * retransmits what the responder is still taking in, and rxe broke the QP
     * on that (remote invalid request). LOOM_IB_TIMEOUT is 20 (4.3 s) by
     * default, as NCCL's. A dead peer is found through the side channel. */
    a.timeout = tp->qp_timeout;
    a.retry_cnt = tp->qp_retry_cnt;
    a.rnr_retry = tp->qp_rnr_retry;
    a.sq_psn = p->psn;
    a.max_rd_atomic = 1;
    rc = tp->api->modify_qp(p->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                            IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: QP for rank %d to RTS: %s", p->rank,
                       strerror(rc));
    p->remote_credit_addr = r->ctrl_addr + (uint64_t)tp->rank * sizeof(uint64_t);
    p->remote_ctrl_rkey = r->ctrl_rkey;
    return LOOM_SUCCESS;
}

/* The steps of a side-channel connection within LOOM_HS_TALKING: a dialer
 * sends its record once connected, then both exchange (hs_advance). */
enum { IB_SEND_RECORD, IB_EXCHANGE };
/* Ours of the two nonces (tp_handshake.h keeps the dialer's and the acceptor's). */
#define OUR_NONCE(c) ((c)->accepted ? (c)->nonce_a : (c)->nonce_c)
_Static_assert(REC_BYTES <= LOOM_HS_OPENING_BYTES, "a record fits the opening");
_Static_assert(REC_BYTES + PROOF_BYTES + 1 <= LOOM_HS_BUF_BYTES, "an exchange fits the buffer");

static loom_status_t setup_resources(loom_tp_t *tp, char *const *addrs)
{
    tp->active = calloc((size_t)tp->size, sizeof(int));
    if (!tp->active)
        return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
    for (int j = 0; j < tp->size; j++)
        if (j != tp->rank && addrs[j] != NULL) {
            tp->peers[j].idx = tp->nactive;
            tp->active[tp->nactive++] = j;
        }
    int n = tp->nactive ? tp->nactive : 1;
    tp->scq = tp->api->create_cq(tp->ctx, n * SQ_DEPTH, NULL, NULL, 0);
    tp->rcq = tp->api->create_cq(tp->ctx, n * RECV_SLOTS, NULL, NULL, 0);
    if (!tp->scq || !tp->rcq)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: ibv_create_cq of %d entries: %s",
                       n * SQ_DEPTH, strerror(errno));
    tp->slots_bytes = (size_t)n * (RECV_SLOTS + SEND_SLOTS) * SLOT_BYTES;
    if (posix_memalign((void **)&tp->slots, 4096, tp->slots_bytes) != 0) {
        tp->slots = NULL;
        return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory for %zu bytes of message slots",
                       tp->slots_bytes);
    }
    memset(tp->slots, 0, tp->slots_bytes);
    tp->slots_mr = tp->api->reg_mr(tp->pd, tp->slots, tp->slots_bytes, IBV_ACCESS_LOCAL_WRITE);
    if (!tp->slots_mr)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: ibv_reg_mr of %zu bytes: %s",
                       tp->slots_bytes, strerror(errno));
    for (int i = 0; i < tp->nactive; i++)
        if (create_qp(tp, &tp->peers[tp->active[i]]) != LOOM_SUCCESS)
            return tp->failed;
    tp->pfds = calloc((size_t)tp->nactive + 1, sizeof(struct pollfd));
    if (!tp->pfds)
        return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
    return LOOM_SUCCESS;
}

/* With LOOM_AUTH_KEY both ends prove the key as tcp.c does (wire.h), over
 * the dialer's identity and both nonces; without it the proof is empty. */
static size_t proof_bytes(const loom_tp_t *tp)
{
    return tp->auth_key ? PROOF_BYTES : 0;
}

/* A side of the exchange as it published itself and as it spoke: its address
 * in the store and the record it sent. */
static size_t ident(const char *addr, const uint8_t rec[REC_BYTES], uint8_t *out)
{
    size_t n = strlen(addr) + 1;
    memcpy(out, addr, n);
    memcpy(out + n, rec, REC_BYTES);
    return n + REC_BYTES;
}

static void make_proof(const loom_tp_t *tp, char role, int dialer_rank, int acceptor_rank,
                       const char *dialer_addr, const uint8_t dialer_rec[REC_BYTES],
                       const char *acceptor_addr, const uint8_t acceptor_rec[REC_BYTES],
                       uint8_t out[32])
{
    loom_hello_t h = {LOOM_WIRE_VERSION, (uint32_t)dialer_rank, (uint32_t)tp->size,
                      LOOM_HELLO_AUTH | 0x4942u, tp->job_hash, tp->comm_hash};
    uint8_t hello[LOOM_HELLO_BYTES], bind[LOOM_BIND_BYTES];
    uint8_t di[sizeof(tp->my_addr) + REC_BYTES], ai[sizeof(tp->my_addr) + REC_BYTES];
    size_t dl = ident(dialer_addr, dialer_rec, di), al = ident(acceptor_addr, acceptor_rec, ai);
    loom_auth_bind(tp->job_hash, tp->comm_hash, tp->size, dialer_rank, di, dl, acceptor_rank, ai,
                   al, bind);
    loom_hello_encode(&h, hello);
    /* The nonces travel inside the records, which the binding covers. */
    ib_rec_t dr, ar;
    rec_decode(dialer_rec, &dr);
    rec_decode(acceptor_rec, &ar);
    loom_auth_proof(tp->auth_key, tp->auth_keylen, role, hello, dr.nonce, ar.nonce, bind, out);
}

/* An accepted connection is refused: close it (after telling why when it
 * showed a record), and free the rank it claimed for an honest retry. */
static void hs_refuse(loom_tp_t *tp, loom_hs_conn_t *c, const ib_rec_t *r, int for_key)
{
    if (r) {
        uint8_t rec[REC_BYTES];
        ib_rec_t no = {.rank = (uint32_t)tp->rank, .size = (uint32_t)tp->size,
                       .job_hash = tp->job_hash, .comm_hash = tp->comm_hash,
                       .flags = REC_REFUSED};
        rec_encode(&no, rec);
        if (loom_hs_send(c->fd, rec, sizeof(rec)) != 0) { /* it learns from the close */ }
    }
    if (c->peer >= 0 && tp->peers[c->peer].fd == c->fd)
        tp->peers[c->peer].fd = -1;
    if (for_key)
        tp->auth_refused++;
    LOOM_WARN("ibverbs", "rank %d refused a side-channel connection%s", tp->rank,
              for_key ? " that could not prove LOOM_AUTH_KEY" : " that is not a rank of this "
              "communicator");
    loom_hs_close(c);
}

/* Bytes arrived on a handshake socket. The dialer sends its record (with a
 * nonce under LOOM_AUTH_KEY); the acceptor answers with its own (and its
 * proof); the dialer checks it and sends its proof. Each side brings its QP
 * up once it trusts the other, then sends a ready byte; the peer's ready byte
 * ends the handshake. */
static loom_status_t hs_advance(loom_tp_t *tp, loom_hs_conn_t *c, char *const *addrs, int *done)
{
    size_t pb = proof_bytes(tp);
    size_t first = REC_BYTES + (c->accepted ? 0 : pb);   /* what we read before we act */
    if (!c->accepted && !c->up && c->have >= REC_BYTES && c->have < first) {
        /* A refusal comes without a proof. */
        ib_rec_t r;
        if (rec_decode(c->buf, &r) == 0 && (r.flags & REC_REFUSED))
            first = REC_BYTES;
    }
    if (c->have >= REC_BYTES && !c->up && !(!c->accepted && c->have < first)) {
        ib_rec_t r;
        int bad = rec_decode(c->buf, &r) != 0 || r.job_hash != tp->job_hash ||
                  r.comm_hash != tp->comm_hash || r.size != (uint32_t)tp->size ||
                  r.rank >= (uint32_t)tp->size || r.rank == (uint32_t)tp->rank;
        int key_differs = !(r.flags & REC_AUTH) != !tp->auth_key;
        if (c->accepted && c->peer < 0) {
            /* Accepted: only higher ranks dial us, once each. */
            if (!bad && (r.rank < (uint32_t)tp->rank || addrs[r.rank] == NULL ||
                         tp->peers[r.rank].fd >= 0))
                bad = 1;
            if (bad || key_differs || (r.flags & REC_REFUSED)) {
                hs_refuse(tp, c, bad ? NULL : &r, !bad);
                return LOOM_SUCCESS;
            }
            c->peer = (int)r.rank;
            /* Without a key the record is all there is to check: claim the rank now.
             * With one, only a proof claims it, so a stranger that names a rank
             * cannot keep the real one out. */
            if (!tp->auth_key)
                tp->peers[c->peer].fd = c->fd;
            memcpy(c->nonce_c, r.nonce, 16);
            uint8_t out[REC_BYTES + PROOF_BYTES];
            if (tp->auth_key && loom_hs_nonce(OUR_NONCE(c)) != 0)
                return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: getrandom: %s",
                               strerror(errno));
            my_record(tp, &tp->peers[c->peer], tp->auth_key ? REC_AUTH : 0, OUR_NONCE(c), out);
            memcpy(c->opening, out, REC_BYTES);
            if (tp->auth_key)
                make_proof(tp, 'A', c->peer, tp->rank, addrs[c->peer], c->buf, tp->my_addr,
                           c->opening, out + REC_BYTES);
            if (loom_hs_send(c->fd, out, REC_BYTES + pb) != 0)
                return tp_fail(tp, LOOM_ERR_PEER_LOST, "ibverbs: handshake with rank %d: %s",
                               c->peer, strerror(errno));
            c->proven = !tp->auth_key;
        } else if (!c->accepted && !c->proven) {
            if (!bad && r.rank == (uint32_t)c->peer && (r.flags & REC_REFUSED))
                return tp_fail(tp, LOOM_ERR_AUTH, "ibverbs: rank %d refused the connection of "
                               "rank %d: LOOM_AUTH_KEY is set on one of them only", c->peer,
                               tp->rank);
            if (bad || r.rank != (uint32_t)c->peer)
                return tp_fail(tp, LOOM_ERR_AUTH, "ibverbs: the process at \"%s\" is not rank %d "
                               "of this communicator", addrs[c->peer], c->peer);
            if (key_differs)
                return tp_fail(tp, LOOM_ERR_AUTH, "ibverbs: rank %d and rank %d disagree on "
                               "LOOM_AUTH_KEY (set on one of them only)", c->peer, tp->rank);
            if (tp->auth_key) {
                uint8_t want[32], mine[32];
                make_proof(tp, 'A', tp->rank, c->peer, tp->my_addr, c->opening, addrs[c->peer],
                           c->buf, want);
                if (!loom_equal_ct(want, c->buf + REC_BYTES, LOOM_SHA256_BYTES))
                    return tp_fail(tp, LOOM_ERR_AUTH, "ibverbs: rank %d cannot prove "
                                   "LOOM_AUTH_KEY for this connection: a different key, or a "
                                   "relay (its record or published address was changed)",
                                   c->peer);
                make_proof(tp, 'C', tp->rank, c->peer, tp->my_addr, c->opening, addrs[c->peer],
                           c->buf, mine);
                if (loom_hs_send(c->fd, mine, sizeof(mine)) != 0)
                    return tp_fail(tp, LOOM_ERR_PEER_LOST, "ibverbs: handshake with rank %d: %s",
                                   c->peer, strerror(errno));
            }
            c->proven = 1;
        }
        if (!c->proven) {
            /* The acceptor waits for the dialer's proof. */
            if (c->have < REC_BYTES + pb)
                return LOOM_SUCCESS;
            uint8_t want[32];
            make_proof(tp, 'C', c->peer, tp->rank, addrs[c->peer], c->buf, tp->my_addr,
                       c->opening, want);
            if (!loom_equal_ct(want, c->buf + REC_BYTES, LOOM_SHA256_BYTES)) {
                hs_refuse(tp, c, NULL, 1);
                return LOOM_SUCCESS;
            }
            if (tp->peers[c->peer].fd >= 0) {
                hs_refuse(tp, c, NULL, 0);   /* proven twice: the first one holds the rank */
                return LOOM_SUCCESS;
            }
            tp->peers[c->peer].fd = c->fd;
            c->proven = 1;
        }
        if (qp_up(tp, &tp->peers[c->peer], &r) != LOOM_SUCCESS)
            return tp->failed;
        if (loom_hs_send(c->fd, "R", 1) != 0)
            return tp_fail(tp, LOOM_ERR_PEER_LOST, "ibverbs: handshake with rank %d: %s",
                           c->peer, strerror(errno));
        c->up = 1;
        c->stranger = 0;
    }
    if (c->up && c->have == REC_BYTES + pb + 1) {
        if (c->buf[REC_BYTES + pb] != 'R')
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: protocol error in the handshake "
                           "with rank %d", c->peer);
        tp->peers[c->peer].fd = c->fd;
        tp->peers[c->peer].active = 1;
        c->fd = -1;
        *done = 1;
    }
    return LOOM_SUCCESS;
}

/* The deadline passed: name the ranks still missing. */
static void hs_timed_out(void *arg, loom_hs_table_t *t)
{
    loom_tp_t *tp = arg;
    char missing[256] = "";
    size_t off = 0;
    for (int i = 0; i < tp->nactive && off < sizeof(missing) - 16; i++)
        if (!tp->peers[tp->active[i]].active)
            off += (size_t)snprintf(missing + off, sizeof(missing) - off, "%s%d",
                                    off ? "," : "", tp->active[i]);
    if (tp->auth_refused)
        tp_fail(tp, LOOM_ERR_AUTH, "ibverbs: rank %d timed out after %.1f s waiting for "
                "rank(s) %s; it refused %d connection(s) that could not prove "
                "LOOM_AUTH_KEY", tp->rank, t->timeout_s, missing, tp->auth_refused);
    else
        tp_fail(tp, LOOM_ERR_TIMEOUT, "ibverbs: rank %d timed out after %.1f s "
                "connecting to rank(s) %s", tp->rank, t->timeout_s, missing);
}

/* A dialled socket is connected: our record goes out. */
static void hs_send_record(loom_tp_t *tp, loom_hs_table_t *t, loom_hs_conn_t *c)
{
    uint8_t rec[REC_BYTES];
    if (tp->auth_key && loom_hs_nonce(OUR_NONCE(c)) != 0) {
        tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: getrandom: %s", strerror(errno));
        return;
    }
    my_record(tp, &tp->peers[c->peer], tp->auth_key ? REC_AUTH : 0, OUR_NONCE(c), rec);
    memcpy(c->opening, rec, REC_BYTES);
    if (loom_hs_send(c->fd, rec, sizeof(rec)) != 0) {
        tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: cannot connect to rank %d at %s: %s", c->peer,
                t->addrs[c->peer], strerror(errno));
        return;
    }
    c->step = IB_EXCHANGE;
    c->have = 0;
    /* Never past the ready byte: a goodbye may follow it. */
    c->need = REC_BYTES + proof_bytes(tp) + 1;
}

/* The step of one side-channel connection (tp_handshake.h). */
static int hs_step(void *arg, loom_hs_table_t *t, loom_hs_conn_t *c, double now)
{
    loom_tp_t *tp = arg;
    if (c->step == IB_SEND_RECORD) {
        hs_send_record(tp, t, c);
        return 0;
    }
    if (loom_hs_read(c) < 0) {
        if (!c->accepted && !c->up && c->have == 0) {
            /* Shed before a word, as a full acceptor sheds strangers: dial again. */
            loom_hs_redial_later(c, now, 0.05);
            c->step = IB_SEND_RECORD;
        } else if (!c->accepted || c->up) {
            tp_fail(tp, LOOM_ERR_PEER_LOST, "ibverbs: rank %d closed the connection during the "
                    "handshake", c->peer);
        } else {
            /* A stranger went away, or a dialer that found our proof wrong. */
            hs_refuse(tp, c, NULL, c->peer >= 0);
        }
        return 0;
    }
    int done = 0;
    hs_advance(tp, c, t->addrs, &done);
    return done;
}

static void hs_drop(void *arg, loom_hs_conn_t *c)
{
    hs_refuse(arg, c, NULL, 0);
}

static loom_status_t hs_check(void *arg)
{
    loom_tp_t *tp = arg;
    return (loom_status_t)atomic_load(&tp->abort_why);
}

/* Like tcp.c: rank r dials every lower rank and accepts every higher one. */
static loom_status_t hs_dial_lower(loom_tp_t *tp, loom_hs_table_t *t, char *const *addrs)
{
    for (int j = 0; j < tp->rank; j++) {
        if (addrs[j] == NULL)
            continue;
        if (ib_parse_addr(addrs[j], &t->ss[j], &t->sslen[j]) != 0)
            return tp_fail(tp, LOOM_ERR_INVALID_ARG, "ibverbs: rank %d published a bad address "
                           "\"%s\" (is it on another transport? set LOOM_TRANSPORT alike "
                           "everywhere)", j, addrs[j]);
        if (loom_hs_table_dial(t, j, 0, &t->ss[j], t->sslen[j]) != 0)
            return tp->failed;
    }
    return LOOM_SUCCESS;
}

/* The sockets of unfinished handshakes are closed, and the ranks they held
 * are freed; the finished ones now belong to their peers. */
static void hs_release_unfinished(loom_tp_t *tp, loom_hs_table_t *t)
{
    for (int i = 0; t->conns && i < t->nconn; i++)
        if (t->conns[i].fd >= 0 && t->conns[i].peer >= 0 &&
            tp->peers[t->conns[i].peer].fd == t->conns[i].fd)
            tp->peers[t->conns[i].peer].fd = -1;
    loom_hs_table_free(t);
}

loom_status_t ib_connect(loom_tp_t *tp, char *const *addrs, double timeout_s)
{
    static const loom_hs_ops_t ops = {.step = hs_step, .drop = hs_drop,
                                      .timed_out = hs_timed_out, .check = hs_check};
    if (setup_resources(tp, addrs) != LOOM_SUCCESS)
        return tp->failed;
    int nout = 0, nin = 0;
    for (int i = 0; i < tp->nactive; i++)
        *(tp->active[i] < tp->rank ? &nout : &nin) += 1;
    loom_hs_table_t t;
    loom_hs_params_t hp = {.rank = tp->rank, .ndial = nout, .naccept = nin, .timeout_s = timeout_s,
                           .failed = &tp->failed, .err = tp->err, .subsys = "ibverbs",
                           .prefix = "ibverbs: ", .addrs = addrs, .listen_fd = tp->listen_fd,
                           .accept_step = IB_EXCHANGE,
                           .accept_need = REC_BYTES + proof_bytes(tp) + 1};
    if (loom_hs_table_init(&t, &hp) != 0)
        goto out;
    if (hs_dial_lower(tp, &t, addrs) != LOOM_SUCCESS || loom_hs_run(&t, &ops, tp) != LOOM_SUCCESS)
        goto out;
    for (int i = 0; i < tp->nactive; i++)
        tp->pfds[i] = (struct pollfd){.fd = tp->peers[tp->active[i]].fd, .events = POLLIN};
    tp->pfds[tp->nactive] = (struct pollfd){.fd = tp->wake_fd, .events = POLLIN};
    LOOM_INFO("ibverbs", "rank %d connected to %d peers over %s:%d (inline %u bytes)",
              tp->rank, tp->nactive, tp->dev_name, tp->port, tp->max_inline);
out:
    hs_release_unfinished(tp, &t);
    close(tp->listen_fd);
    tp->listen_fd = -1;
    return tp->failed;
}
