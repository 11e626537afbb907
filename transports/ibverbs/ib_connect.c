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
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "ib_int.h"
#include "log.h"
#include "sha256.h"
#include "wire.h"

#define REC_BYTES 96
#define REC_MAGIC "LOOMIBV1"
#define REC_VERSION 1
#define REC_AUTH 1u            /* the sender holds LOOM_AUTH_KEY; a nonce follows */
#define REC_REFUSED 2u         /* the acceptor refuses: LOOM_AUTH_KEY on one side only */
#define PROOF_BYTES 32
/* Accepted side-channel connections get this long to prove themselves (at
 * most a third of LOOM_TIMEOUT); when the table is full the oldest one still
 * in its handshake makes room (tcp.c does the same). */
#define HS_STRANGER_S 3.0

/* ---- the side-channel record ------------------------------------------------ */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

static uint64_t get64(const uint8_t *p)
{
    return get32(p) | ((uint64_t)get32(p + 4) << 32);
}

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
    put32(out + 8, REC_VERSION);
    put32(out + 12, r->rank);
    put32(out + 16, r->size);
    put32(out + 20, r->qpn);
    put32(out + 24, r->psn);
    put32(out + 28, r->ctrl_rkey);
    put16(out + 32, r->lid);
    out[34] = r->link_layer;
    out[35] = r->mtu;
    memcpy(out + 36, r->gid, 16);
    put64(out + 52, r->job_hash);
    put64(out + 60, r->comm_hash);
    put64(out + 68, r->ctrl_addr);
    put32(out + 76, r->flags);
    memcpy(out + 80, r->nonce, 16);
}

static int rec_decode(const uint8_t in[REC_BYTES], ib_rec_t *r)
{
    if (memcmp(in, REC_MAGIC, 8) != 0 || get32(in + 8) != REC_VERSION)
        return -1;
    r->rank = get32(in + 12);
    r->size = get32(in + 16);
    r->qpn = get32(in + 20);
    r->psn = get32(in + 24);
    r->ctrl_rkey = get32(in + 28);
    r->lid = get16(in + 32);
    r->link_layer = in[34];
    r->mtu = in[35];
    memcpy(r->gid, in + 36, 16);
    r->job_hash = get64(in + 52);
    r->comm_hash = get64(in + 60);
    r->ctrl_addr = get64(in + 68);
    r->flags = get32(in + 76);
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

typedef enum { HS_CONNECTING, HS_EXCHANGE, HS_DONE, HS_DEAD } hs_state_t;

typedef struct hs_conn {
    int fd;
    int peer;                /* -1: an accepted socket that has not said who it is */
    hs_state_t state;
    int dialer;              /* we connected (and spoke first) */
    int up;                  /* our QP is RTS and our ready byte went out */
    int proven;              /* the acceptor checked the dialer's proof of the key */
    uint8_t nonce[16];       /* ours, with LOOM_AUTH_KEY */
    uint8_t peer_nonce[16];
    uint8_t myrec[REC_BYTES];   /* the record we sent: the proofs cover it */
    uint8_t buf[REC_BYTES + PROOF_BYTES + 1];
    size_t have;
    double retry_at;
    double since;            /* accepted: when (strangers get HS_STRANGER_S) */
} hs_conn_t;

static int start_dial(hs_conn_t *c, const struct sockaddr_storage *ss, socklen_t sslen)
{
    c->fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        return -1;
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->have = 0;
    c->up = 0;
    /* Connected at once or not, the record goes out when poll says writable. */
    if (connect(c->fd, (const struct sockaddr *)ss, sslen) != 0 && errno != EINPROGRESS) {
        int saved = errno;   /* the caller's message names it */
        close(c->fd);        /* a slot not yet counted: no clean-up would close it */
        c->fd = -1;
        errno = saved;
        return -1;
    }
    c->state = HS_CONNECTING;
    return 0;
}

/* A small write on a fresh socket: always fits in its buffer. */
static int send_small(int fd, const void *buf, size_t len)
{
    return send(fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

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

static int fresh_nonce(uint8_t out[16])
{
    return getrandom(out, 16, 0) == 16 ? 0 : -1;
}

/* An accepted connection is refused: close it (after telling why when it
 * showed a record), and free the rank it claimed for an honest retry. */
static void hs_refuse(loom_tp_t *tp, hs_conn_t *c, const ib_rec_t *r, int for_key)
{
    if (r) {
        uint8_t rec[REC_BYTES];
        ib_rec_t no = {.rank = (uint32_t)tp->rank, .size = (uint32_t)tp->size,
                       .job_hash = tp->job_hash, .comm_hash = tp->comm_hash,
                       .flags = REC_REFUSED};
        rec_encode(&no, rec);
        if (send_small(c->fd, rec, sizeof(rec)) != 0) { /* it learns from the close */ }
    }
    if (c->peer >= 0 && tp->peers[c->peer].fd == c->fd)
        tp->peers[c->peer].fd = -1;
    if (for_key)
        tp->auth_refused++;
    LOOM_WARN("ibverbs", "rank %d refused a side-channel connection%s", tp->rank,
              for_key ? " that could not prove LOOM_AUTH_KEY" : " that is not a rank of this "
              "communicator");
    close(c->fd);
    c->fd = -1;
    c->state = HS_DEAD;
}

/* Bytes arrived on a handshake socket. The dialer sends its record (with a
 * nonce under LOOM_AUTH_KEY); the acceptor answers with its own (and its
 * proof); the dialer checks it and sends its proof. Each side brings its QP
 * up once it trusts the other, then sends a ready byte; the peer's ready byte
 * ends the handshake. */
static loom_status_t hs_advance(loom_tp_t *tp, hs_conn_t *c, char *const *addrs, int *established)
{
    size_t pb = proof_bytes(tp);
    size_t first = REC_BYTES + (c->dialer ? pb : 0);   /* what we read before we act */
    if (c->dialer && !c->up && c->have >= REC_BYTES && c->have < first) {
        /* A refusal comes without a proof. */
        ib_rec_t r;
        if (rec_decode(c->buf, &r) == 0 && (r.flags & REC_REFUSED))
            first = REC_BYTES;
    }
    if (c->have >= REC_BYTES && !c->up && !(c->dialer && c->have < first)) {
        ib_rec_t r;
        int bad = rec_decode(c->buf, &r) != 0 || r.job_hash != tp->job_hash ||
                  r.comm_hash != tp->comm_hash || r.size != (uint32_t)tp->size ||
                  r.rank >= (uint32_t)tp->size || r.rank == (uint32_t)tp->rank;
        int key_differs = !(r.flags & REC_AUTH) != !tp->auth_key;
        if (!c->dialer && c->peer < 0) {
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
            memcpy(c->peer_nonce, r.nonce, 16);
            uint8_t out[REC_BYTES + PROOF_BYTES];
            if (tp->auth_key && fresh_nonce(c->nonce) != 0)
                return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: getrandom: %s",
                               strerror(errno));
            my_record(tp, &tp->peers[c->peer], tp->auth_key ? REC_AUTH : 0, c->nonce, out);
            memcpy(c->myrec, out, REC_BYTES);
            if (tp->auth_key)
                make_proof(tp, 'A', c->peer, tp->rank, addrs[c->peer], c->buf, tp->my_addr,
                           c->myrec, out + REC_BYTES);
            if (send_small(c->fd, out, REC_BYTES + pb) != 0)
                return tp_fail(tp, LOOM_ERR_PEER_LOST, "ibverbs: handshake with rank %d: %s",
                               c->peer, strerror(errno));
            c->proven = !tp->auth_key;
        } else if (c->dialer && !c->proven) {
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
                make_proof(tp, 'A', tp->rank, c->peer, tp->my_addr, c->myrec, addrs[c->peer],
                           c->buf, want);
                if (!loom_equal_ct(want, c->buf + REC_BYTES, LOOM_SHA256_BYTES))
                    return tp_fail(tp, LOOM_ERR_AUTH, "ibverbs: rank %d cannot prove "
                                   "LOOM_AUTH_KEY for this connection: a different key, or a "
                                   "relay (its record or published address was changed)",
                                   c->peer);
                make_proof(tp, 'C', tp->rank, c->peer, tp->my_addr, c->myrec, addrs[c->peer],
                           c->buf, mine);
                if (send_small(c->fd, mine, sizeof(mine)) != 0)
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
                       c->myrec, want);
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
        if (send_small(c->fd, "R", 1) != 0)
            return tp_fail(tp, LOOM_ERR_PEER_LOST, "ibverbs: handshake with rank %d: %s",
                           c->peer, strerror(errno));
        c->up = 1;
    }
    if (c->up && c->have == REC_BYTES + pb + 1) {
        if (c->buf[REC_BYTES + pb] != 'R')
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: protocol error in the handshake "
                           "with rank %d", c->peer);
        tp->peers[c->peer].fd = c->fd;
        tp->peers[c->peer].active = 1;
        c->fd = -1;
        c->state = HS_DONE;
        (*established)++;
    }
    return LOOM_SUCCESS;
}

/* The side-channel connections of one ib_connect: those we dial (to the
 * lower ranks) first, then the accepted ones; pfds[0] is the listener. */
typedef struct hs_table {
    hs_conn_t *conns;
    struct pollfd *pfds;           /* [i + 1]: conns[i] */
    struct sockaddr_storage *ss;   /* [rank below ours]: where it listens */
    socklen_t *sslen;
    int nconn, maxconn;
    int nout, nin;                 /* peers we dial, peers that dial us */
    int established;
    double deadline;
} hs_table_t;

/* Like tcp.c: rank r dials every lower rank and accepts every higher one. */
static loom_status_t hs_dial_lower(loom_tp_t *tp, hs_table_t *t, char *const *addrs)
{
    for (int j = 0; j < tp->rank; j++) {
        if (addrs[j] == NULL)
            continue;
        if (ib_parse_addr(addrs[j], &t->ss[j], &t->sslen[j]) != 0)
            return tp_fail(tp, LOOM_ERR_INVALID_ARG, "ibverbs: rank %d published a bad address "
                           "\"%s\" (is it on another transport? set LOOM_TRANSPORT alike "
                           "everywhere)", j, addrs[j]);
        t->conns[t->nconn] = (hs_conn_t){.peer = j, .dialer = 1};
        if (start_dial(&t->conns[t->nconn], &t->ss[j], t->sslen[j]) != 0)
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: cannot connect to rank %d at %s: %s",
                           j, addrs[j], strerror(errno));
        t->nconn++;
    }
    return LOOM_SUCCESS;
}

static void hs_shed_strangers(loom_tp_t *tp, hs_table_t *t, double now, double stranger_s)
{
    for (int i = t->nout; i < t->nconn; i++)
        if (t->conns[i].state == HS_EXCHANGE && !t->conns[i].dialer && !t->conns[i].up &&
            now - t->conns[i].since > stranger_s)
            hs_refuse(tp, &t->conns[i], NULL, 0);
}

/* The deadline passed: name the ranks still missing. */
static void hs_fail_timeout(loom_tp_t *tp, double timeout_s)
{
    char missing[256] = "";
    size_t off = 0;
    for (int i = 0; i < tp->nactive && off < sizeof(missing) - 16; i++)
        if (!tp->peers[tp->active[i]].active)
            off += (size_t)snprintf(missing + off, sizeof(missing) - off, "%s%d",
                                    off ? "," : "", tp->active[i]);
    if (tp->auth_refused)
        tp_fail(tp, LOOM_ERR_AUTH, "ibverbs: rank %d timed out after %.1f s waiting for "
                "rank(s) %s; it refused %d connection(s) that could not prove "
                "LOOM_AUTH_KEY", tp->rank, timeout_s, missing, tp->auth_refused);
    else
        tp_fail(tp, LOOM_ERR_TIMEOUT, "ibverbs: rank %d timed out after %.1f s "
                "connecting to rank(s) %s", tp->rank, timeout_s, missing);
}

/* Wait (20 ms at most) for the listener and every connection that waits for
 * its socket; the revents are left in t->pfds. */
static loom_status_t hs_poll(loom_tp_t *tp, hs_table_t *t, double now)
{
    t->pfds[0] = (struct pollfd){.fd = t->nin > 0 ? tp->listen_fd : -1, .events = POLLIN};
    for (int i = 0; i < t->nconn; i++) {
        hs_conn_t *c = &t->conns[i];
        short ev = c->state == HS_CONNECTING ? POLLOUT : c->state == HS_EXCHANGE ? POLLIN : 0;
        if (c->fd < 0 || c->retry_at > now)
            ev = 0;
        t->pfds[i + 1] = (struct pollfd){.fd = ev ? c->fd : -1, .events = ev};
    }
    int wait_ms = (int)((t->deadline - now) * 1000) + 1;
    if (poll(t->pfds, (nfds_t)t->nconn + 1, wait_ms < 20 ? wait_ms : 20) < 0 && errno != EINTR)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "poll: %s", strerror(errno));
    return LOOM_SUCCESS;
}

/* A dialled socket became writable: connected (our record goes out), or
 * refused (dial again a little later). */
static void hs_on_connected(loom_tp_t *tp, hs_conn_t *c, char *const *addrs, double now)
{
    int soerr = 0;
    socklen_t sl = sizeof(soerr);
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
    if (soerr == ECONNREFUSED || soerr == ETIMEDOUT || soerr == EHOSTUNREACH) {
        close(c->fd);
        c->fd = -1;
        c->retry_at = now + 0.01;
        return;
    }
    uint8_t rec[REC_BYTES];
    if (tp->auth_key && fresh_nonce(c->nonce) != 0) {
        tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: getrandom: %s", strerror(errno));
        return;
    }
    my_record(tp, &tp->peers[c->peer], tp->auth_key ? REC_AUTH : 0, c->nonce, rec);
    memcpy(c->myrec, rec, REC_BYTES);
    if (soerr != 0 || send_small(c->fd, rec, sizeof(rec)) != 0) {
        tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: cannot connect to rank %d at %s: "
                "%s", c->peer, addrs[c->peer], strerror(soerr ? soerr : errno));
        return;
    }
    c->state = HS_EXCHANGE;
}

/* A socket in the exchange is readable: take what came, act on it. */
static void hs_on_readable(loom_tp_t *tp, hs_conn_t *c, char *const *addrs, double now,
                           int *established)
{
    /* Never past the ready byte: a goodbye may follow it. */
    size_t want = REC_BYTES + proof_bytes(tp) + 1;
    ssize_t n = recv(c->fd, c->buf + c->have, want - c->have, 0);
    if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR))) {
        if (c->dialer && !c->up && c->have == 0) {
            /* Shed before a word, as a full acceptor sheds strangers: dial again. */
            close(c->fd);
            c->fd = -1;
            c->state = HS_CONNECTING;
            c->retry_at = now + 0.05;
            return;
        }
        if (c->dialer || c->up) {
            tp_fail(tp, LOOM_ERR_PEER_LOST, "ibverbs: rank %d closed the connection "
                    "during the handshake", c->peer);
            return;
        }
        /* A stranger went away, or a dialer that found our proof wrong. */
        hs_refuse(tp, c, NULL, c->peer >= 0);
        return;
    }
    if (n > 0)
        c->have += (size_t)n;
    hs_advance(tp, c, addrs, established);
}

/* Every connection after a poll: redial those whose pause is over, move the
 * ones whose socket is ready. */
static void hs_service(loom_tp_t *tp, hs_table_t *t, char *const *addrs, double now)
{
    for (int i = 0; i < t->nconn && !tp->failed; i++) {
        hs_conn_t *c = &t->conns[i];
        if (c->state == HS_CONNECTING && c->fd < 0 && c->retry_at <= now) {
            c->retry_at = 0;
            if (start_dial(c, &t->ss[c->peer], t->sslen[c->peer]) != 0)
                tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: cannot connect to rank %d at %s: "
                        "%s", c->peer, addrs[c->peer], strerror(errno));
            continue;
        }
        if (!t->pfds[i + 1].revents)
            continue;
        if (c->state == HS_CONNECTING)
            hs_on_connected(tp, c, addrs, now);
        else if (c->state == HS_EXCHANGE)
            hs_on_readable(tp, c, addrs, now, &t->established);
    }
}

/* Where an accepted connection goes: a finished entry, a new one, or, when
 * the table is full, the entry of the oldest accepted connection not yet
 * proven (one that has said nothing first), which is refused; -1: none. */
static int hs_slot(loom_tp_t *tp, hs_table_t *t)
{
    int slot = -1;
    for (int i = t->nout; i < t->nconn && slot < 0; i++)
        if (t->conns[i].state == HS_DEAD || t->conns[i].state == HS_DONE)
            slot = i;
    if (slot < 0 && t->nconn < t->maxconn)
        slot = t->nconn++;
    if (slot < 0 && t->nout < t->nconn) {
        hs_conn_t *v = NULL;
        for (int j = t->nout; j < t->nconn; j++) {
            hs_conn_t *w = &t->conns[j];
            if (w->state != HS_EXCHANGE || w->dialer || w->up)
                continue;
            if (!v || (w->have == 0 && v->have > 0) ||
                ((w->have == 0) == (v->have == 0) && w->since < v->since))
                v = w;
        }
        if (v) {
            hs_refuse(tp, v, NULL, 0);
            slot = (int)(v - t->conns);
        }
    }
    return slot;
}

static void hs_accept(loom_tp_t *tp, hs_table_t *t)
{
    for (;;) {
        int fd = accept4(tp->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            break;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        int slot = hs_slot(tp, t);
        if (slot < 0) {
            close(fd);
            continue;
        }
        t->conns[slot] = (hs_conn_t){.fd = fd, .peer = -1, .state = HS_EXCHANGE,
                                     .since = loom_now_s()};
    }
}

/* The sockets of unfinished handshakes are closed, and the ranks they held
 * are freed; the finished ones now belong to their peers. */
static void hs_close_unfinished(loom_tp_t *tp, hs_table_t *t)
{
    if (!t->conns)
        return;
    for (int i = 0; i < t->nconn; i++)
        if (t->conns[i].fd >= 0 && t->conns[i].state != HS_DONE) {
            if (t->conns[i].peer >= 0 && tp->peers[t->conns[i].peer].fd == t->conns[i].fd)
                tp->peers[t->conns[i].peer].fd = -1;
            close(t->conns[i].fd);
        }
}

loom_status_t ib_connect(loom_tp_t *tp, char *const *addrs, double timeout_s)
{
    if (setup_resources(tp, addrs) != LOOM_SUCCESS)
        return tp->failed;
    hs_table_t t = {0};
    for (int i = 0; i < tp->nactive; i++)
        *(tp->active[i] < tp->rank ? &t.nout : &t.nin) += 1;
    t.maxconn = t.nout + t.nin + 64;
    t.conns = calloc((size_t)t.maxconn, sizeof(*t.conns));
    t.pfds = calloc((size_t)t.maxconn + 1, sizeof(*t.pfds));
    t.ss = calloc((size_t)(tp->rank ? tp->rank : 1), sizeof(*t.ss));
    t.sslen = calloc((size_t)(tp->rank ? tp->rank : 1), sizeof(*t.sslen));
    t.deadline = loom_now_s() + timeout_s;
    if (!t.conns || !t.pfds || !t.ss || !t.sslen) {
        tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    if (hs_dial_lower(tp, &t, addrs) != LOOM_SUCCESS)
        goto out;
    double stranger_s = timeout_s / 3 < HS_STRANGER_S ? timeout_s / 3 : HS_STRANGER_S;
    while (t.established < t.nout + t.nin && !tp->failed) {
        double now = loom_now_s();
        hs_shed_strangers(tp, &t, now, stranger_s);
        if (now > t.deadline) {
            hs_fail_timeout(tp, timeout_s);
            break;
        }
        if (atomic_load(&tp->abort_why)) {
            tp_fail(tp, (loom_status_t)atomic_load(&tp->abort_why), "the communicator was aborted");
            break;
        }
        if (hs_poll(tp, &t, now) != LOOM_SUCCESS)
            break;
        hs_service(tp, &t, addrs, loom_now_s());
        if (!tp->failed && (t.pfds[0].revents & POLLIN))
            hs_accept(tp, &t);
    }
    if (!tp->failed) {
        for (int i = 0; i < tp->nactive; i++)
            tp->pfds[i] = (struct pollfd){.fd = tp->peers[tp->active[i]].fd, .events = POLLIN};
        tp->pfds[tp->nactive] = (struct pollfd){.fd = tp->wake_fd, .events = POLLIN};
        LOOM_INFO("ibverbs", "rank %d connected to %d peers over %s:%d (inline %u bytes)",
                  tp->rank, tp->nactive, tp->dev_name, tp->port, tp->max_inline);
    }
out:
    hs_close_unfinished(tp, &t);
    close(tp->listen_fd);
    tp->listen_fd = -1;
    free(t.conns);
    free(t.pfds);
    free(t.ss);
    free(t.sslen);
    return tp->failed;
}
