/*
 * ibverbs.c - the InfiniBand / RoCE transport: one RC queue pair per peer,
 * connected through a short TCP side channel (QPN, PSN, LID, GID travel in a
 * record; no librdmacm), a send and a receive completion queue per instance
 * polled by whoever waits (no progress thread).
 *
 * Eager path: messages up to a slot (8 KiB with the header) are SENDs into
 * receive slots the peer pre-posted for us; each SEND spends a credit, and the
 * receiver returns credits by RDMA-writing how many slots it re-posted into a
 * word of ours (so credits never need a receive slot of their own). The user's
 * bytes are copied into a registered bounce slot, so an eager send completes
 * at once.
 * Rendezvous: larger messages announce themselves (RTS); the receiver, once a
 * matching receive is posted, registers its buffer and answers where to write
 * (CTS); the sender RDMA-WRITEs the payload and ends with WRITE_WITH_IMM, whose
 * immediate data names the receive, so the bytes land in place.
 * Send-queue accounting: every WR has a sequence number, one in SIGNAL_EVERY is
 * signalled (and every one whose completion a request waits for); a signalled
 * completion retires all earlier WRs of that QP, which frees bounce slots and
 * send-queue room.
 *
 * Registration of user memory: an HCA keeps the pages that were mapped when
 * a buffer was registered (pinned). Memory freed and mapped again at the same
 * address (glibc's free/malloc of large blocks: munmap, then mmap; a remap;
 * madvise DONTNEED) has new pages behind the same range, so a registration
 * kept across that moves bytes to and from pages nobody sees any more: wrong
 * results, silently. glibc's free calls munmap without going through the PLT,
 * so no hook on munmap can tell. Hence, by default:
 *  - the buffer of a rendezvous is registered for that message only (the
 *    user cannot free or remap it while the call is running), and
 *    deregistered when it completes;
 *  - where the HCA can (IBV_ACCESS_ON_DEMAND for RC send and write, LOOM_IB_ODP),
 *    user memory is registered on demand instead: the kernel follows changes
 *    of the mapping, so those registrations are cached;
 *  - memory the user registers through loom_comm_register_buffer (which
 *    promises it stays mapped until loom_comm_deregister_buffer), and Loom's
 *    own slots and credit words, stay registered.
 * LOOM_IB_REG_CACHE > 0 keeps idle pinned registrations too, for programs
 * that never free or remap a buffer they communicate from.
 *
 * With LOOM_AUTH_KEY both ends of the side channel prove the key (HMAC over
 * fresh nonces, as tcp.c) before a queue pair is brought up; the proofs cover
 * both records (QPN, PSN, LID, GID, rkey and address of the credit word) and
 * the addresses both ranks published, so a relay that rewrote an address in
 * the store, or a record changed on the way, fails the handshake. The RDMA
 * traffic itself is not sealed: the adapter moves it without the CPU.
 *
 * Liveness: the side-channel socket stays open. A goodbye byte on it tells a
 * peer that left on purpose from one that died (EOF without goodbye: PEER_LOST
 * at once), a gave-up byte one whose communicator failed (a mismatch it found,
 * an abort) from both; a work request to a dead peer ends in a retry-exceeded
 * completion.
 * Like tcp.c, any failure is sticky for the instance and the requests that
 * were pending are never touched again.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "ib_api.h"
#include "ib_regcache.h"
#include "ib_util.h"
#include "ibverbs.h"
#include "log.h"
#include "settings.h"
#include "sha256.h"
#include "tp_util.h"
#include "transport.h"
#include "wire.h"

#define SLOT_BYTES 8192
#define EAGER_MAX (SLOT_BYTES - LOOM_IB_HDR_BYTES)
#define RECV_SLOTS 32          /* per peer: receives posted, credits the peer holds */
#define SEND_SLOTS 32          /* per peer: bounce buffers for eager sends */
#define SQ_DEPTH 128
/* Below SEND_SLOTS and SQ_DEPTH: a signalled WR always follows a busy slot. */
#define SIGNAL_EVERY 8
#define CREDIT_BATCH (RECV_SLOTS / 4)
#define INLINE_WANT 128
#define ODP_CACHE_BYTES ((size_t)1 << 30)   /* idle on-demand registrations kept */
#define CHUNK_BYTES (1u << 30) /* one RDMA WRITE at most (sge length is 32 bits) */
#define BYE_GRACE_S 0.2        /* completions may trail a goodbye on the side channel */
#define SOCK_CHECK_S 0.005
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

/* wr_id: kind (4 bits) | peer rank (20 bits) | sequence number or id (40 bits). */
enum { WR_SEQ = 1, WR_RDV = 2, WR_RECV = 3 };
#define WRID(kind, peer, low) (((uint64_t)(kind) << 60) | ((uint64_t)(peer) << 40) | \
                               ((uint64_t)(low) & ((UINT64_C(1) << 40) - 1)))
#define WRID_KIND(w) ((int)((w) >> 60))
#define WRID_PEER(w) ((int)(((w) >> 40) & 0xfffff))
#define WRID_LOW(w) ((w) & ((UINT64_C(1) << 40) - 1))

enum { OP_EAGER = 1, OP_RTS, OP_CTS, OP_DATA };

typedef struct ib_op {
    struct ib_op *next;
    int kind;
    loom_tp_req_t *req;      /* EAGER, RTS */
    uint32_t id;             /* RTS, DATA: the send's id; CTS: unused */
    loom_ib_hdr_t hdr;       /* CTS */
} ib_op_t;

typedef struct ib_unexp {
    struct ib_unexp *next;
    loom_ib_hdr_t hdr;       /* EAGER (data holds the payload) or RTS */
    uint8_t *data;
} ib_unexp_t;

/* A rendezvous in flight: on the sender (an RTS went out) or the receiver (a CTS). */
typedef struct ib_rdv {
    int used;
    int peer;
    loom_tp_req_t *req;
    loom_rc_entry_t *reg;
    uint64_t seq;            /* sender: sequence number of the final WR */
    uint64_t raddr;          /* sender: where the receiver wants the bytes */
    uint32_t rkey, imm;
    int next_free;
} ib_rdv_t;

typedef struct ib_rdv_table {
    ib_rdv_t *v;
    int n, free_head;
} ib_rdv_table_t;

typedef struct ib_peer {
    int rank;
    int active;              /* served by us and connected */
    int idx;                 /* among active peers: which slots are its */
    struct ibv_qp *qp;
    uint32_t psn;
    int fd;                  /* side channel; -1 once closed */
    int said_bye;
    double bye_at;
    int hung_up;             /* side channel closed without a goodbye */
    int gave_up;             /* its communicator failed: it sends no more */
    double gave_up_at;
    double hangup_at;
    /* remote control region: our credit word in it */
    uint64_t remote_credit_addr;
    uint32_t remote_ctrl_rkey;
    /* send side */
    uint64_t consumed;       /* messages that took one of the peer's receive slots */
    uint64_t sq_posted, sq_done, sq_last_sig;
    uint32_t send_next;
    uint64_t send_slot_seq[SEND_SLOTS];
    uint8_t sq_opcode[SQ_DEPTH];          /* [seq % SQ_DEPTH]: what that WR was */
    uint32_t sq_bytes[SQ_DEPTH];
    ib_op_t *oq_head, *oq_tail;
    int rdv_out;             /* rendezvous sends in flight */
    /* receive side */
    uint64_t freed, advertised;
    int rdv_in;              /* rendezvous receives in flight */
    loom_req_queue_t rq;     /* posted receives, in posting order */
    ib_unexp_t *uq_head, *uq_tail;
} ib_peer_t;

typedef struct ib_ctrl {
    volatile uint64_t *credit_in;   /* [rank]: slots rank re-posted for us (it writes) */
    uint64_t *credit_src;           /* [rank]: what we write into rank's credit_in[our rank] */
} ib_ctrl_t;

struct loom_tp {
    int rank, size;
    uint64_t job_hash, comm_hash;
    const char *auth_key;    /* LOOM_AUTH_KEY (the communicator's settings), NULL: none */
    size_t auth_keylen;
    int auth_refused;        /* side-channel connections refused for the key */
    char my_addr[256];       /* as published: the proofs bind it */
    double timeout_s;
    loom_err_t *err;
    const loom_ib_api_t *api;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *scq, *rcq;
    char dev_name[64];
    uint8_t port;
    uint8_t link_layer;
    enum ibv_mtu mtu;
    uint16_t lid;
    int gid_index;
    uint8_t gid[16];
    uint8_t tc, sl;          /* LOOM_IB_TC, LOOM_IB_SL */
    uint32_t max_inline;
    int listen_fd, wake_fd;
    ib_peer_t *peers;
    int *active;             /* ranks of the active peers */
    int nactive;
    struct pollfd *pfds;     /* active peers' side channels, then wake_fd */
    /* memory */
    void *ctrl_mem;
    size_t ctrl_bytes;
    struct ibv_mr *ctrl_mr;
    ib_ctrl_t ctrl;
    uint8_t *slots;          /* [active idx][RECV_SLOTS + SEND_SLOTS][SLOT_BYTES] */
    size_t slots_bytes;
    struct ibv_mr *slots_mr;
    loom_rcache_t rcache;    /* user memory: see "Registration" at the top */
    int odp;                 /* user memory is registered on demand */
    int reg_pinned;          /* the next registration pins (loom_comm_register_buffer) */
    size_t pinned_cache;     /* LOOM_IB_REG_CACHE */
    uint8_t qp_timeout, qp_retry_cnt, qp_rnr_retry;
    ib_rdv_table_t rdv_send, rdv_recv;
    ib_op_t *op_free;
    int nqueued;             /* ops waiting in peers' queues */
    int credit_dirty;        /* some peer owes credits it could not write */
    double next_sock_check;
    loom_status_t failed;
    uint64_t neager, nrdv, nunexpected;   /* for LOOM_DEBUG=INFO */
    _Atomic int abort_why;
    int announced;           /* the peers were told of our failure */
    _Atomic int owner;       /* 1: a thread is in isend/irecv/progress, 2: abort */
};

#define tp_fail(tp, st, ...) \
    loom_tp_fail(&(tp)->failed, (tp)->err, "ibverbs", (tp)->rank, st, __VA_ARGS__)

static uint8_t *recv_slot(loom_tp_t *tp, const ib_peer_t *p, int i)
{
    return tp->slots + ((size_t)p->idx * (RECV_SLOTS + SEND_SLOTS) + (size_t)i) * SLOT_BYTES;
}

static uint8_t *send_slot(loom_tp_t *tp, const ib_peer_t *p, int i)
{
    return recv_slot(tp, p, RECV_SLOTS + i);
}

/* ---- registration cache callbacks ------------------------------------------ */

static int rc_reg(void *arg, void *addr, size_t len, void **mr_p, uint32_t *lkey, uint32_t *rkey)
{
    loom_tp_t *tp = arg;
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    struct ibv_mr *mr = NULL;
    if (tp->odp && !tp->reg_pinned) {
        mr = tp->api->reg_mr(tp->pd, addr, len, access | IBV_ACCESS_ON_DEMAND);
        if (!mr) {
            /* The device said yes and the driver no (a kernel without ODP for
             * this MR type): pin from now on, and keep nothing pinned idle
             * beyond what LOOM_IB_REG_CACHE allows. */
            LOOM_WARN("ibverbs", "rank %d: on-demand registration on %s failed (%s); pinning "
                      "instead", tp->rank, tp->dev_name, strerror(errno));
            tp->odp = 0;
            tp->rcache.max_bytes = tp->pinned_cache;
        }
    }
    if (!mr)
        mr = tp->api->reg_mr(tp->pd, addr, len, access);
    if (!mr)
        return -1;
    *mr_p = mr;
    *lkey = mr->lkey;
    *rkey = mr->rkey;
    return 0;
}

static void rc_dereg(void *arg, void *mr)
{
    loom_tp_t *tp = arg;
    tp->api->dereg_mr(mr);
}

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

/* ---- addresses and the side-channel record --------------------------------- */

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

/* "ibv1 HOST PORT ..." -> a socket address of the side channel. */
static int parse_addr(const char *text, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[INET6_ADDRSTRLEN + 1], port[16];
    if (sscanf(text, "ibv1 %46s %15s", host, port) != 2)
        return -1;
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
                             .ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(host, port, &hints, &res) != 0)
        return -1;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

/* The 16-byte form of a numeric host (IPv4-mapped for IPv4), for GID choice. */
static int host_to_gid(const char *host, uint8_t out[16])
{
    struct in_addr a4;
    if (inet_pton(AF_INET, host, &a4) == 1) {
        memset(out, 0, 10);
        out[10] = out[11] = 0xff;
        memcpy(out + 12, &a4, 4);
        return 0;
    }
    return inet_pton(AF_INET6, host, out) == 1 ? 0 : -1;
}

/* RoCE GID types from sysfs: 2 v2, 1 v1, 0 unknown (no sysfs, or a test provider). */
static int gid_type(const char *dev, int port, int index)
{
    char path[256], buf[32] = "";
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev,
             port, index);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    if (!fgets(buf, sizeof(buf), f))
        buf[0] = '\0';
    fclose(f);
    if (strstr(buf, "v2"))
        return 2;
    return buf[0] ? 1 : 0;
}

static int mtu_bytes(enum ibv_mtu m)
{
    return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? 128 << m : 0;
}

/* ---- create: device and port, protection domain, control region, listener -- */

typedef struct ib_cand {
    int dev;
    uint8_t port;
} ib_cand_t;

static loom_status_t open_port(loom_tp_t *tp, const loom_tp_params_t *p)
{
    char why[512];
    const loom_settings_t *cfg = p->settings;
    loom_ib_hca_list_t hcas;
    if (loom_ib_hca_parse(cfg ? cfg->ib_hca : NULL, &hcas, why, sizeof(why)) != 0)
        return loom_err_set(p->err, LOOM_ERR_INVALID_ARG, "%s", why);
    int ndev = 0;
    struct ibv_device **devs = tp->api->get_device_list(&ndev);
    if (!devs || ndev == 0) {
        int e = errno;
        if (devs)
            tp->api->free_device_list(devs);
        return loom_err_set(p->err, LOOM_ERR_UNSUPPORTED, "ibverbs: no RDMA devices%s%s%s",
                            devs ? "" : " (ibv_get_device_list: ", devs ? "" : strerror(e),
                            devs ? "" : ")");
    }
    ib_cand_t cands[64];
    int ncand = 0, nports = 0;
    for (int d = 0; d < ndev && ncand < 64; d++) {
        const char *name = tp->api->get_device_name(devs[d]);
        struct ibv_context *ctx = tp->api->open_device(devs[d]);
        struct ibv_device_attr da;
        if (!ctx)
            continue;
        if (tp->api->query_device(ctx, &da) == 0) {
            for (int port = 1; port <= da.phys_port_cnt && ncand < 64; port++) {
                struct ibv_port_attr pa;
                memset(&pa, 0, sizeof(pa));
                if (tp->api->query_port(ctx, (uint8_t)port, &pa) != 0)
                    continue;
                nports++;
                if (pa.state == IBV_PORT_ACTIVE && loom_ib_hca_match(&hcas, name, port))
                    cands[ncand++] = (ib_cand_t){d, (uint8_t)port};
            }
        }
        tp->api->close_device(ctx);
    }
    if (ncand == 0) {
        tp->api->free_device_list(devs);
        return loom_err_set(p->err, LOOM_ERR_UNSUPPORTED,
                            "ibverbs: no active RDMA port%s%s (%d device(s), %d port(s))",
                            cfg && cfg->ib_hca[0] ? " matches LOOM_IB_HCA=" : "",
                            cfg && cfg->ib_hca[0] ? cfg->ib_hca : "", ndev, nports);
    }
    /* Ranks of a node spread over the ports (one rail each); every rank of the
     * job must sit on the same fabric type. */
    ib_cand_t c = cands[p->rank % ncand];
    snprintf(tp->dev_name, sizeof(tp->dev_name), "%s", tp->api->get_device_name(devs[c.dev]));
    tp->port = c.port;
    tp->ctx = tp->api->open_device(devs[c.dev]);
    tp->api->free_device_list(devs);
    if (!tp->ctx)
        return loom_err_set(p->err, LOOM_ERR_TRANSPORT, "ibverbs: cannot open %s: %s",
                            tp->dev_name, strerror(errno));
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof(pa));
    if (tp->api->query_port(tp->ctx, tp->port, &pa) != 0)
        return loom_err_set(p->err, LOOM_ERR_TRANSPORT, "ibverbs: ibv_query_port %s:%d: %s",
                            tp->dev_name, tp->port, strerror(errno));
    tp->link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_LINK_LAYER_ETHERNET
                                                              : IBV_LINK_LAYER_INFINIBAND;
    tp->mtu = pa.active_mtu;
    tp->lid = pa.lid;
    tp->gid_index = 0;
    int forced = cfg ? cfg->ib_gid_index : -1;
    if (tp->link_layer == IBV_LINK_LAYER_ETHERNET) {
        int n = pa.gid_tbl_len > 0 ? pa.gid_tbl_len : 1;
        if (n > 256)
            n = 256;
        uint8_t (*gids)[16] = calloc((size_t)n, 16);
        int *types = calloc((size_t)n, sizeof(int));
        if (!gids || !types) {
            free(gids);
            free(types);
            return loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
        }
        for (int i = 0; i < n; i++) {
            union ibv_gid g;
            if (tp->api->query_gid(tp->ctx, tp->port, i, &g) == 0)
                memcpy(gids[i], g.raw, 16);
            types[i] = gid_type(tp->dev_name, tp->port, i);
        }
        uint8_t pref[16];
        int have_pref = p->bind_host && *p->bind_host && host_to_gid(p->bind_host, pref) == 0;
        tp->gid_index = loom_ib_choose_gid((const uint8_t (*)[16])gids, types, n, forced,
                                           have_pref ? pref : NULL, why, sizeof(why));
        if (tp->gid_index >= 0)
            memcpy(tp->gid, gids[tp->gid_index], 16);
        free(gids);
        free(types);
        if (tp->gid_index < 0)
            return loom_err_set(p->err, LOOM_ERR_TRANSPORT, "ibverbs: %s:%d: %s", tp->dev_name,
                                tp->port, why);
    } else {
        if (forced >= 0)
            tp->gid_index = forced;
        union ibv_gid g;
        if (tp->api->query_gid(tp->ctx, tp->port, tp->gid_index, &g) == 0)
            memcpy(tp->gid, g.raw, 16);
    }
    return LOOM_SUCCESS;
}

/* Whether the HCA serves RC sends and writes from and into on-demand-paged
 * memory. ibv_query_device_ex is an inline of verbs.h that would link
 * ibv_query_device; the provider's entry is called the same way instead. */
static int odp_supported(loom_tp_t *tp)
{
    struct verbs_context *vctx = verbs_get_ctx_op(tp->ctx, query_device_ex);
    if (!vctx)
        return 0;
    struct ibv_device_attr_ex ax;
    memset(&ax, 0, sizeof(ax));
    if (vctx->query_device_ex(tp->ctx, NULL, &ax, sizeof(ax)) != 0)
        return 0;
    const uint32_t want = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE;
    return (ax.odp_caps.general_caps & IBV_ODP_SUPPORT) &&
           (ax.odp_caps.per_transport_caps.rc_odp_caps & want) == want;
}

static loom_status_t ib_create(const loom_tp_params_t *p, char *addr, size_t addrlen,
                               loom_tp_t **tp_p)
{
    char why[512];
    const loom_ib_api_t *api = loom_ib_api_load(why, sizeof(why));
    if (!api)
        return loom_err_set(p->err, LOOM_ERR_UNSUPPORTED, "ibverbs: %s", why);
    loom_status_t st;
    loom_tp_t *tp = calloc(1, sizeof(*tp));
    if (!tp)
        return loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
    tp->api = api;
    tp->rank = p->rank;
    tp->size = p->size;
    tp->job_hash = p->job_hash;
    tp->comm_hash = p->comm_hash;
    tp->timeout_s = p->settings ? p->settings->timeout_s : 300;
    tp->qp_timeout = 20;
    tp->qp_retry_cnt = 7;
    tp->qp_rnr_retry = 7;
    if (p->settings) {
        tp->tc = (uint8_t)p->settings->ib_tc;
        tp->sl = (uint8_t)p->settings->ib_sl;
        tp->pinned_cache = p->settings->ib_reg_cache;
        tp->qp_timeout = (uint8_t)p->settings->ib_timeout;
        tp->qp_retry_cnt = (uint8_t)p->settings->ib_retry_cnt;
        tp->qp_rnr_retry = (uint8_t)p->settings->ib_rnr_retry;
    }
    if (p->settings && p->settings->auth_keylen > 0) {
        tp->auth_key = p->settings->auth_key;
        tp->auth_keylen = p->settings->auth_keylen;
    }
    tp->err = p->err;
    tp->listen_fd = tp->wake_fd = -1;
    tp->rdv_send.free_head = tp->rdv_recv.free_head = -1;
    tp->peers = calloc((size_t)p->size, sizeof(ib_peer_t));
    if (!tp->peers) {
        st = loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
        goto err_free_tp;
    }
    for (int i = 0; i < p->size; i++) {
        tp->peers[i].rank = i;
        tp->peers[i].fd = -1;
    }
    if ((st = open_port(tp, p)) != LOOM_SUCCESS)
        goto err_close_dev;
    if (!(tp->pd = api->alloc_pd(tp->ctx))) {
        st = loom_err_set(p->err, LOOM_ERR_TRANSPORT, "ibverbs: ibv_alloc_pd on %s: %s",
                          tp->dev_name, strerror(errno));
        goto err_close_dev;
    }
    /* Credit words: one written by each peer, one we write from per peer. */
    tp->ctrl_bytes = ((size_t)p->size * 2 * sizeof(uint64_t) + 4095) & ~(size_t)4095;
    if (posix_memalign(&tp->ctrl_mem, 4096, tp->ctrl_bytes) != 0) {
        st = loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
        goto err_dealloc_pd;
    }
    memset(tp->ctrl_mem, 0, tp->ctrl_bytes);
    tp->ctrl.credit_in = (volatile uint64_t *)tp->ctrl_mem;
    tp->ctrl.credit_src = (uint64_t *)tp->ctrl_mem + p->size;
    tp->ctrl_mr = api->reg_mr(tp->pd, tp->ctrl_mem, tp->ctrl_bytes,
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!tp->ctrl_mr) {
        st = loom_err_set(p->err, LOOM_ERR_TRANSPORT, "ibverbs: ibv_reg_mr of %zu bytes: %s",
                          tp->ctrl_bytes, strerror(errno));
        goto err_free_ctrl;
    }
    tp->odp = (!p->settings || p->settings->ib_odp) && odp_supported(tp);
    loom_rcache_init(&tp->rcache, tp->odp ? ODP_CACHE_BYTES : tp->pinned_cache, 256, rc_reg,
                     rc_dereg, tp);
    LOOM_INFO("ibverbs", "rank %d: user memory is %s", tp->rank,
              tp->odp ? "registered on demand (ODP) and cached"
                      : tp->pinned_cache ? "pinned and cached (LOOM_IB_REG_CACHE: stale if freed)"
                                         : "pinned per message, unless registered by the user");

    char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
    if ((st = loom_tp_choose_host(p, host, sizeof(host))) != LOOM_SUCCESS)
        goto err_dereg_ctrl;
    /* The side channel's record carries a bare address (GID choice reads it too). */
    host[strcspn(host, "%")] = '\0';
    struct sockaddr_storage ss;
    socklen_t sslen;
    char tmp[128];
    snprintf(tmp, sizeof(tmp), "ibv1 %s 0", host);
    if (parse_addr(tmp, &ss, &sslen) != 0) {
        st = loom_err_set(p->err, LOOM_ERR_INVALID_ARG, "ibverbs: cannot listen on \"%s\"", host);
        goto err_dereg_ctrl;
    }
    tp->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (tp->listen_fd < 0 || bind(tp->listen_fd, (struct sockaddr *)&ss, sslen) != 0 ||
        listen(tp->listen_fd, SOMAXCONN) != 0) {
        st = loom_err_set(p->err, LOOM_ERR_TRANSPORT, "ibverbs: cannot listen on %s: %s", host,
                          strerror(errno));
        goto err_close_listen;
    }
    sslen = sizeof(ss);
    getsockname(tp->listen_fd, (struct sockaddr *)&ss, &sslen);
    int lport = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                              : ((struct sockaddr_in6 *)&ss)->sin6_port);
    tp->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (tp->wake_fd < 0) {
        st = loom_err_set(p->err, LOOM_ERR_TRANSPORT, "eventfd: %s", strerror(errno));
        goto err_close_listen;
    }
    char gidtxt[40];
    loom_ib_gid_format(tp->gid, gidtxt);
    /* The side channel first (peers parse it); the rest is for the logs. */
    if (snprintf(addr, addrlen, "ibv1 %s %d %s:%d %s lid=%u gid[%d]=%s mtu=%d", host, lport,
                 tp->dev_name, tp->port,
                 tp->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "IB", tp->lid,
                 tp->gid_index, gidtxt, mtu_bytes(tp->mtu)) >= (int)addrlen) {
        st = loom_err_set(p->err, LOOM_ERR_INTERNAL, "address buffer too small");
        goto err_close_wake;
    }
    LOOM_INFO("ibverbs", "rank %d: %s", tp->rank, addr);
    snprintf(tp->my_addr, sizeof(tp->my_addr), "%s", addr);
    *tp_p = tp;
    return LOOM_SUCCESS;

err_close_wake:
    close(tp->wake_fd);
err_close_listen:
    if (tp->listen_fd >= 0)
        close(tp->listen_fd);
err_dereg_ctrl:
    api->dereg_mr(tp->ctrl_mr);
err_free_ctrl:
    free(tp->ctrl_mem);
err_dealloc_pd:
    api->dealloc_pd(tp->pd);
err_close_dev:
    if (tp->ctx)
        api->close_device(tp->ctx);
    free(tp->peers);
err_free_tp:
    free(tp);
    return st;
}

/* ---- connect: QPs, slots, and the side-channel exchange -------------------- */

static loom_status_t post_recv_slot(loom_tp_t *tp, ib_peer_t *p, int slot)
{
    struct ibv_sge sge = {.addr = (uintptr_t)recv_slot(tp, p, slot), .length = SLOT_BYTES,
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
        if (post_recv_slot(tp, p, i) != LOOM_SUCCESS)
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
    if (connect(c->fd, (const struct sockaddr *)ss, sslen) != 0 && errno != EINPROGRESS)
        return -1;
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

static loom_status_t ib_connect(loom_tp_t *tp, char *const *addrs, double timeout_s)
{
    if (setup_resources(tp, addrs) != LOOM_SUCCESS)
        return tp->failed;
    int nout = 0, nin = 0;
    for (int i = 0; i < tp->nactive; i++)
        *(tp->active[i] < tp->rank ? &nout : &nin) += 1;
    int maxconn = nout + nin + 64;
    hs_conn_t *conns = calloc((size_t)maxconn, sizeof(*conns));
    struct pollfd *pfds = calloc((size_t)maxconn + 1, sizeof(*pfds));
    struct sockaddr_storage *ss = calloc((size_t)(tp->rank ? tp->rank : 1), sizeof(*ss));
    socklen_t *sslen = calloc((size_t)(tp->rank ? tp->rank : 1), sizeof(*sslen));
    int nconn = 0, established = 0;
    double deadline = loom_now_s() + timeout_s;
    if (!conns || !pfds || !ss || !sslen) {
        tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    /* Like tcp.c: rank r dials every lower rank and accepts every higher one. */
    for (int j = 0; j < tp->rank; j++) {
        if (addrs[j] == NULL)
            continue;
        if (parse_addr(addrs[j], &ss[j], &sslen[j]) != 0) {
            tp_fail(tp, LOOM_ERR_INVALID_ARG, "ibverbs: rank %d published a bad address \"%s\" "
                    "(is it on another transport? set LOOM_TRANSPORT alike everywhere)", j,
                    addrs[j]);
            goto out;
        }
        conns[nconn] = (hs_conn_t){.peer = j, .dialer = 1};
        if (start_dial(&conns[nconn], &ss[j], sslen[j]) != 0) {
            tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: cannot connect to rank %d at %s: %s", j,
                    addrs[j], strerror(errno));
            goto out;
        }
        nconn++;
    }
    double stranger_s = timeout_s / 3 < HS_STRANGER_S ? timeout_s / 3 : HS_STRANGER_S;
    while (established < nout + nin && !tp->failed) {
        double now = loom_now_s();
        for (int i = nout; i < nconn; i++)
            if (conns[i].state == HS_EXCHANGE && !conns[i].dialer && !conns[i].up &&
                now - conns[i].since > stranger_s)
                hs_refuse(tp, &conns[i], NULL, 0);
        if (now > deadline) {
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
            break;
        }
        if (atomic_load(&tp->abort_why)) {
            tp_fail(tp, (loom_status_t)atomic_load(&tp->abort_why), "the communicator was aborted");
            break;
        }
        pfds[0] = (struct pollfd){.fd = nin > 0 ? tp->listen_fd : -1, .events = POLLIN};
        for (int i = 0; i < nconn; i++) {
            hs_conn_t *c = &conns[i];
            short ev = c->state == HS_CONNECTING ? POLLOUT : c->state == HS_EXCHANGE ? POLLIN : 0;
            if (c->fd < 0 || c->retry_at > now)
                ev = 0;
            pfds[i + 1] = (struct pollfd){.fd = ev ? c->fd : -1, .events = ev};
        }
        int wait_ms = (int)((deadline - now) * 1000) + 1;
        if (poll(pfds, (nfds_t)nconn + 1, wait_ms < 20 ? wait_ms : 20) < 0 && errno != EINTR) {
            tp_fail(tp, LOOM_ERR_TRANSPORT, "poll: %s", strerror(errno));
            break;
        }
        now = loom_now_s();
        for (int i = 0; i < nconn && !tp->failed; i++) {
            hs_conn_t *c = &conns[i];
            if (c->state == HS_CONNECTING && c->fd < 0 && c->retry_at <= now) {
                c->retry_at = 0;
                if (start_dial(c, &ss[c->peer], sslen[c->peer]) != 0)
                    tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: cannot connect to rank %d at %s: "
                            "%s", c->peer, addrs[c->peer], strerror(errno));
                continue;
            }
            short re = pfds[i + 1].revents;
            if (!re)
                continue;
            if (c->state == HS_CONNECTING) {
                int soerr = 0;
                socklen_t sl = sizeof(soerr);
                getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
                if (soerr == ECONNREFUSED || soerr == ETIMEDOUT || soerr == EHOSTUNREACH) {
                    close(c->fd);
                    c->fd = -1;
                    c->retry_at = now + 0.01;
                    continue;
                }
                uint8_t rec[REC_BYTES];
                if (tp->auth_key && fresh_nonce(c->nonce) != 0) {
                    tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: getrandom: %s", strerror(errno));
                    break;
                }
                my_record(tp, &tp->peers[c->peer], tp->auth_key ? REC_AUTH : 0, c->nonce, rec);
                memcpy(c->myrec, rec, REC_BYTES);
                if (soerr != 0 || send_small(c->fd, rec, sizeof(rec)) != 0) {
                    tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: cannot connect to rank %d at %s: "
                            "%s", c->peer, addrs[c->peer], strerror(soerr ? soerr : errno));
                    break;
                }
                c->state = HS_EXCHANGE;
                continue;
            }
            if (c->state == HS_EXCHANGE) {
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
                        continue;
                    }
                    if (c->dialer || c->up) {
                        tp_fail(tp, LOOM_ERR_PEER_LOST, "ibverbs: rank %d closed the connection "
                                "during the handshake", c->peer);
                        break;
                    }
                    /* A stranger went away, or a dialer that found our proof wrong. */
                    hs_refuse(tp, c, NULL, c->peer >= 0);
                    continue;
                }
                if (n > 0)
                    c->have += (size_t)n;
                hs_advance(tp, c, addrs, &established);
            }
        }
        if (!tp->failed && (pfds[0].revents & POLLIN)) {
            for (;;) {
                int fd = accept4(tp->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0)
                    break;
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                int slot = -1;
                for (int i = nout; i < nconn && slot < 0; i++)
                    if (conns[i].state == HS_DEAD || conns[i].state == HS_DONE)
                        slot = i;
                if (slot < 0 && nconn < maxconn)
                    slot = nconn++;
                for (int i = nout; i < nconn && slot < 0; i++) {
                    /* Full: the oldest accepted connection not yet proven makes room,
                     * one that has said nothing first. */
                    hs_conn_t *v = NULL;
                    for (int j = nout; j < nconn; j++) {
                        hs_conn_t *w = &conns[j];
                        if (w->state != HS_EXCHANGE || w->dialer || w->up)
                            continue;
                        if (!v || (w->have == 0 && v->have > 0) ||
                            ((w->have == 0) == (v->have == 0) && w->since < v->since))
                            v = w;
                    }
                    if (v) {
                        hs_refuse(tp, v, NULL, 0);
                        slot = (int)(v - conns);
                    }
                    break;
                }
                if (slot < 0) {
                    close(fd);
                    continue;
                }
                conns[slot] = (hs_conn_t){.fd = fd, .peer = -1, .state = HS_EXCHANGE,
                                          .since = loom_now_s()};
            }
        }
    }
    if (!tp->failed) {
        for (int i = 0; i < tp->nactive; i++)
            tp->pfds[i] = (struct pollfd){.fd = tp->peers[tp->active[i]].fd, .events = POLLIN};
        tp->pfds[tp->nactive] = (struct pollfd){.fd = tp->wake_fd, .events = POLLIN};
        LOOM_INFO("ibverbs", "rank %d connected to %d peers over %s:%d (inline %u bytes)",
                  tp->rank, tp->nactive, tp->dev_name, tp->port, tp->max_inline);
    }
out:
    if (conns)
        for (int i = 0; i < nconn; i++)
            if (conns[i].fd >= 0 && conns[i].state != HS_DONE) {
                if (conns[i].peer >= 0 && tp->peers[conns[i].peer].fd == conns[i].fd)
                    tp->peers[conns[i].peer].fd = -1;
                close(conns[i].fd);
            }
    close(tp->listen_fd);
    tp->listen_fd = -1;
    free(conns);
    free(pfds);
    free(ss);
    free(sslen);
    return tp->failed;
}

/* ---- send side ------------------------------------------------------------- */

static int credits(const loom_tp_t *tp, const ib_peer_t *p)
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
static loom_status_t write_credits(loom_tp_t *tp, ib_peer_t *p, int force_signal)
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
    if (credits(tp, p) < 1 || sq_room(p) < 1 || p->send_slot_seq[s] > p->sq_done)
        return 0;
    uint8_t *slot = send_slot(tp, p, (int)s);
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
    if (credits(tp, p) < 1 || sq_room(p) < nchunks)
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

/* A message to ourselves: matched in memory, as in tcp.c. */
static loom_status_t self_send(loom_tp_t *tp, loom_tp_req_t *req);

static loom_status_t isend_owned(loom_tp_t *tp, loom_tp_req_t *req)
{
    if (tp->failed)
        return tp->failed;
    loom_req_start(req);
    if (req->peer == tp->rank)
        return self_send(tp, req);
    ib_peer_t *p = &tp->peers[req->peer];
    if (!p->active)
        return tp_fail(tp, LOOM_ERR_INTERNAL, "ibverbs: rank %d is not connected to rank %d",
                       tp->rank, req->peer);
    if (p->said_bye)
        return tp_fail(tp, LOOM_ERR_PEER_LOST, "rank %d sends to rank %d, which has destroyed "
                       "its communicator", tp->rank, p->rank);
    if (p->gave_up)
        return loom_tp_fail_gave_up(&tp->failed, tp->err, "ibverbs", tp->rank, p->rank);
    if (req->len <= EAGER_MAX) {
        if (enqueue(tp, p, OP_EAGER, req, 0, NULL) != LOOM_SUCCESS)
            return tp->failed;
    } else {
        int id = rdv_alloc(tp, &tp->rdv_send);
        if (id < 0)
            return tp->failed;
        ib_rdv_t *s = &tp->rdv_send.v[id];
        /* Registered now, so it overlaps the round trip to the receiver. */
        if (loom_rcache_get(&tp->rcache, req->buf, req->len, &s->reg) != 0) {
            int e = errno;
            rdv_free(&tp->rdv_send, id);
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: cannot register %zu bytes at %p "
                           "for rank %d: %s (RLIMIT_MEMLOCK?)", req->len, req->buf, p->rank,
                           strerror(e));
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

/* Unlink and return the oldest receive posted for h's tag after checking that
 * h fits it (a mismatch fails the instance); NULL when none is posted. */
static loom_tp_req_t *rq_take(loom_tp_t *tp, ib_peer_t *p, const loom_ib_hdr_t *h)
{
    loom_frame_t f = hdr_frame(h);
    loom_status_t st = LOOM_SUCCESS;
    loom_tp_req_t *r = loom_req_queue_take(&p->rq, &f, tp->rank, tp->err, &st);
    if (st != LOOM_SUCCESS)
        tp_fail(tp, st, "%s", tp->err->msg);
    return r;
}

/* A receive matched an RTS: register the buffer and say where to write. */
static loom_status_t start_rdv_recv(loom_tp_t *tp, ib_peer_t *p, loom_tp_req_t *req,
                                    const loom_ib_hdr_t *rts)
{
    int id = rdv_alloc(tp, &tp->rdv_recv);
    if (id < 0)
        return tp->failed;
    ib_rdv_t *r = &tp->rdv_recv.v[id];
    if (loom_rcache_get(&tp->rcache, req->buf, req->len, &r->reg) != 0) {
        int e = errno;
        rdv_free(&tp->rdv_recv, id);
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: cannot register %zu bytes at %p for a "
                       "message from rank %d: %s (RLIMIT_MEMLOCK?)", req->len, req->buf, p->rank,
                       strerror(e));
    }
    r->peer = p->rank;
    r->req = req;
    p->rdv_in++;
    loom_ib_hdr_t cts = {.type = LOOM_IB_CTS, .len = req->len, .cookie = rts->cookie,
                         .peer_cookie = (uint32_t)id, .rkey = r->reg->rkey,
                         .addr = (uintptr_t)req->buf};
    if (enqueue(tp, p, OP_CTS, NULL, 0, &cts) != LOOM_SUCCESS)
        return tp->failed;
    pump(tp, p);
    return tp->failed;
}

static loom_status_t self_send(loom_tp_t *tp, loom_tp_req_t *req)
{
    ib_peer_t *self = &tp->peers[tp->rank];
    loom_ib_hdr_t h = {.type = LOOM_IB_EAGER, .desc = req->match.desc, .tag = req->match.tag,
                       .total = req->match.total, .len = req->len};
    loom_tp_req_t *r = rq_take(tp, self, &h);
    if (tp->failed)
        return tp->failed;
    if (r) {
        if (req->len)
            memcpy(r->buf, req->buf, req->len);
        loom_req_complete(r);
        loom_req_complete(req);
        return LOOM_SUCCESS;
    }
    ib_unexp_t *u = calloc(1, sizeof(*u));
    if (u)
        u->data = malloc(req->len ? req->len : 1);
    if (!u || !u->data) {
        free(u);
        return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
    }
    u->hdr = h;
    if (req->len)
        memcpy(u->data, req->buf, req->len);
    if (self->uq_tail)
        self->uq_tail->next = u;
    else
        self->uq_head = u;
    self->uq_tail = u;
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
    ib_unexp_t *prev = NULL;
    for (ib_unexp_t *u = p->uq_head; u; prev = u, u = u->next) {
        if (u->hdr.tag != req->match.tag)
            continue;
        loom_frame_t f = hdr_frame(&u->hdr);
        loom_status_t st = loom_frame_check(&f, req, tp->rank, tp->err);
        if (st != LOOM_SUCCESS)
            return tp_fail(tp, st, "%s", tp->err->msg);
        if (prev)
            prev->next = u->next;
        else
            p->uq_head = u->next;
        if (p->uq_tail == u)
            p->uq_tail = prev;
        if (u->hdr.type == LOOM_IB_EAGER) {
            if (req->len)
                memcpy(req->buf, u->data, req->len);
            loom_req_complete(req);
        } else {
            start_rdv_recv(tp, p, req, &u->hdr);
        }
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
    loom_tp_req_t *req = rq_take(tp, p, &h);
    if (tp->failed)
        return tp->failed;
    if (req) {
        if (h.type == LOOM_IB_RTS)
            return start_rdv_recv(tp, p, req, &h);
        if (h.len)
            memcpy(req->buf, slot + LOOM_IB_HDR_BYTES, h.len);
        loom_req_complete(req);
        return LOOM_SUCCESS;
    }
    ib_unexp_t *u = calloc(1, sizeof(*u));
    if (!u)
        return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
    u->hdr = h;
    if (h.type == LOOM_IB_EAGER) {
        tp->nunexpected++;
        if (!(u->data = malloc(h.len ? h.len : 1))) {
            free(u);
            return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory holding a %llu-byte early "
                           "message", (unsigned long long)h.len);
        }
        if (h.len)
            memcpy(u->data, slot + LOOM_IB_HDR_BYTES, h.len);
    }
    if (p->uq_tail)
        p->uq_tail->next = u;
    else
        p->uq_head = u;
    p->uq_tail = u;
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
    loom_rcache_put(&tp->rcache, r->reg);
    rdv_free(&tp->rdv_recv, (int)id);
    p->rdv_in--;
    return LOOM_SUCCESS;
}

/* ---- completions, progress ------------------------------------------------- */

static int nothing_pending(const ib_peer_t *p)
{
    return !p->rq.head && !p->oq_head && p->rdv_in == 0 && p->rdv_out == 0;
}

static void check_sockets(loom_tp_t *tp, long timeout_us);

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
        check_sockets(tp, 0);
    if (tp->failed)
        return tp->failed;
    if (p && p->said_bye && nothing_pending(p))
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
            loom_rcache_put(&tp->rcache, s->reg);
            rdv_free(&tp->rdv_send, (int)WRID_LOW(wc[i].wr_id));
            p->rdv_out--;
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
            on_message(tp, p, recv_slot(tp, p, slot), wc[i].byte_len);
        if (tp->failed)
            break;
        if (post_recv_slot(tp, p, slot) != LOOM_SUCCESS)
            break;
        p->freed++;
        if (p->freed - p->advertised >= CREDIT_BATCH && !p->said_bye) {
            write_credits(tp, p, 0);
            if (p->advertised != p->freed)
                tp->credit_dirty = 1;
        }
    }
    return total;
}

/* Goodbyes and deaths on the side channels; a wake-up from abort. */
static void check_sockets(loom_tp_t *tp, long timeout_us)
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
        char buf[16];
        ssize_t got = recv(p->fd, buf, sizeof(buf), MSG_DONTWAIT);
        for (ssize_t k = 0; k < got; k++) {
            if (buf[k] == 'G') {
                if (!p->gave_up)
                    p->gave_up_at = loom_now_s();
                p->gave_up = 1;
                continue;
            }
            if (buf[k] != 'B') {
                tp_fail(tp, LOOM_ERR_TRANSPORT, "ibverbs: protocol error on the side channel "
                        "of rank %d", p->rank);
                return;
            }
            if (!p->said_bye)
                p->bye_at = loom_now_s();
            p->said_bye = 1;
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

static void check_goodbyes(loom_tp_t *tp, double now)
{
    for (int i = 0; i < tp->nactive && !tp->failed; i++) {
        ib_peer_t *p = &tp->peers[tp->active[i]];
        if (p->said_bye && !nothing_pending(p) && now - p->bye_at > BYE_GRACE_S)
            tp_fail(tp, LOOM_ERR_PEER_LOST, "rank %d destroyed its communicator while rank %d "
                    "still exchanges messages with it", p->rank, tp->rank);
        else if (p->gave_up && (p->hung_up || !nothing_pending(p)) &&
                 now - p->gave_up_at > BYE_GRACE_S)
        {
            if (!own_qp_failed(tp, p))
                loom_tp_fail_gave_up(&tp->failed, tp->err, "ibverbs", tp->rank, p->rank);
        } else if (p->hung_up && now - p->hangup_at > BYE_GRACE_S)
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
                write_credits(tp, p, 0);
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
            check_sockets(tp, 0);
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
        check_sockets(tp, nap_us < left_us ? nap_us : left_us);
    }
    return tp->failed;
}

/* A failed instance tells its peers at once, on the side channels, so that
 * none waits for it until LOOM_TIMEOUT while this process lives on. And it
 * deregisters user memory before the failed call returns: a peer that got a
 * receive's address (CTS) may still write there, into memory the user frees
 * and reuses from then on; after ibv_dereg_mr the HCA writes no more (the
 * peer's write fails with a remote access error: it learns of the failure). */
static void announce_failure(loom_tp_t *tp)
{
    if (tp->announced)
        return;
    tp->announced = 1;
    loom_rcache_revoke(&tp->rcache);
    for (int i = 0; i < tp->nactive; i++) {
        ib_peer_t *p = &tp->peers[tp->active[i]];
        if (p->fd >= 0 && send(p->fd, "G", 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
            /* it is gone, or its side channel is full of our bytes: it knows */
        }
    }
}

/* Who may touch the side channels and queues: see loom_tp_own. */
static loom_status_t disown(loom_tp_t *tp, loom_status_t st)
{
    if (tp->failed)
        announce_failure(tp);
    loom_tp_disown(&tp->owner);
    return st;
}

static loom_status_t ib_isend(loom_tp_t *tp, loom_tp_req_t *req)
{
    loom_tp_own(&tp->owner);
    return disown(tp, isend_owned(tp, req));
}

static loom_status_t ib_irecv(loom_tp_t *tp, loom_tp_req_t *req)
{
    loom_tp_own(&tp->owner);
    return disown(tp, irecv_owned(tp, req));
}

/* Early eager messages and announced rendezvous (their RTS) alike. */
static int ib_probe(loom_tp_t *tp, int rank, uint64_t tag)
{
    loom_tp_own(&tp->owner);
    int found = 0;
    for (const ib_unexp_t *u = tp->peers[rank].uq_head; u && !found; u = u->next)
        found = u->hdr.tag == tag;
    loom_tp_disown(&tp->owner);
    return found;
}

static loom_status_t ib_progress(loom_tp_t *tp, int timeout_ms, int *moved_p)
{
    loom_tp_own(&tp->owner);
    return disown(tp, progress_owned(tp, timeout_ms, moved_p));
}

static void ib_abort(loom_tp_t *tp, loom_status_t why)
{
    int expected = 0;
    atomic_compare_exchange_strong(&tp->abort_why, &expected, (int)why);
    uint64_t one = 1;
    if (write(tp->wake_fd, &one, sizeof(one)) < 0) { /* already signalled */ }
    if (tp->pfds && loom_tp_own_if_idle(&tp->owner)) {
        announce_failure(tp);
        loom_tp_disown(&tp->owner);
    }
}

/* ---- memory the user registers (loom_comm_register_buffer) ----------------- */

/* A pinned registration held until ib_mem_deregister: the caller promised the
 * range stays mapped, so messages inside it reuse it (a cache hit). */
static loom_status_t ib_mem_register(loom_tp_t *tp, void *buf, size_t len, void **handle_p)
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

static void ib_mem_deregister(loom_tp_t *tp, void *handle)
{
    if (!handle)
        return;
    loom_tp_own(&tp->owner);
    loom_rcache_put(&tp->rcache, handle);
    loom_tp_disown(&tp->owner);
}

/* ---- destroy --------------------------------------------------------------- */

/* Eager sends completed when posted: let the last WRs of every queue pair
 * finish before the QPs go, or the peers would lose them (after a failure
 * too: a mismatch we found must still reach the peer, which reports it as
 * well). Completions are only counted here, never acted on. */
static void drain_sends(loom_tp_t *tp, double deadline)
{
    for (int i = 0; i < tp->nactive; i++) {
        ib_peer_t *p = &tp->peers[tp->active[i]];
        if (!p->said_bye && !p->hung_up && p->sq_posted > p->sq_last_sig)
            write_credits(tp, p, 1);
    }
    for (;;) {
        int busy = 0;
        for (int i = 0; i < tp->nactive && !busy; i++) {
            ib_peer_t *p = &tp->peers[tp->active[i]];
            busy = !p->said_bye && !p->hung_up && p->sq_done < p->sq_last_sig;
        }
        if (!busy || loom_now_s() > deadline)
            return;
        struct ibv_wc wc[32];
        int n = ibv_poll_cq(tp->scq, 32, wc);
        if (n < 0)
            return;
        for (int k = 0; k < n; k++) {
            int peer = WRID_PEER(wc[k].wr_id);
            if (peer >= tp->size)
                continue;
            ib_peer_t *p = &tp->peers[peer];
            uint64_t low = WRID_LOW(wc[k].wr_id);
            uint64_t seq = WRID_KIND(wc[k].wr_id) == WR_RDV
                               ? (low < (uint64_t)tp->rdv_send.n ? tp->rdv_send.v[low].seq : 0)
                               : low;
            if (seq > p->sq_done)
                p->sq_done = seq;
        }
        if (n == 0) {
            check_sockets(tp, 1000);
            if (atomic_load(&tp->abort_why))
                return;
        }
    }
}

static void ib_destroy(loom_tp_t *tp, double timeout_s)
{
    LOOM_INFO("ibverbs", "rank %d sent %llu eager and %llu rendezvous messages; %llu arrived "
              "before their receive; registration cache: %llu hits, %llu misses, %llu evictions",
              tp->rank, (unsigned long long)tp->neager, (unsigned long long)tp->nrdv,
              (unsigned long long)tp->nunexpected, (unsigned long long)tp->rcache.hits,
              (unsigned long long)tp->rcache.misses, (unsigned long long)tp->rcache.evictions);
    for (int i = 0; i < tp->nactive; i++) {
        const ib_peer_t *p = &tp->peers[tp->active[i]];
        if (!nothing_pending(p))
            LOOM_INFO("ibverbs", "rank %d, unfinished with rank %d: receives %s, queued ops %s, "
                      "rendezvous in %d out %d, credits %d (consumed %llu, peer freed %llu), "
                      "freed %llu advertised %llu, send queue posted %llu done %llu",
                      tp->rank, p->rank, p->rq.head ? "posted" : "none",
                      p->oq_head ? "yes" : "none", p->rdv_in, p->rdv_out, credits(tp, p),
                      (unsigned long long)p->consumed,
                      (unsigned long long)tp->ctrl.credit_in[p->rank],
                      (unsigned long long)p->freed, (unsigned long long)p->advertised,
                      (unsigned long long)p->sq_posted, (unsigned long long)p->sq_done);
    }
    double deadline = loom_now_s() + (timeout_s < 5 ? timeout_s : 5);
    if (tp->pfds)
        drain_sends(tp, deadline);
    for (int i = 0; i < tp->nactive; i++) {
        ib_peer_t *p = &tp->peers[tp->active[i]];
        if (p->fd < 0)
            continue;
        /* Say goodbye, so the peer can tell a finished rank from a dead one, or
         * that this one gave up, so it does not wait for it past the grace. */
        int gave_up = tp->failed || tp->announced || atomic_load(&tp->abort_why);
        if (send(p->fd, gave_up ? "G" : "B", 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
            /* it is gone */
        }
        close(p->fd);
    }
    for (int j = 0; j < tp->size; j++) {
        ib_peer_t *p = &tp->peers[j];
        if (p->qp)
            tp->api->destroy_qp(p->qp);
        for (ib_unexp_t *u = p->uq_head, *next; u; u = next) {
            next = u->next;
            free(u->data);
            free(u);
        }
        for (ib_op_t *op = p->oq_head, *next; op; op = next) {
            next = op->next;
            free(op);
        }
    }
    for (ib_op_t *op = tp->op_free, *next; op; op = next) {
        next = op->next;
        free(op);
    }
    if (tp->scq)
        tp->api->destroy_cq(tp->scq);
    if (tp->rcq)
        tp->api->destroy_cq(tp->rcq);
    if (tp->slots_mr)
        tp->api->dereg_mr(tp->slots_mr);
    free(tp->slots);
    loom_rcache_fini(&tp->rcache);
    tp->api->dereg_mr(tp->ctrl_mr);
    free(tp->ctrl_mem);
    tp->api->dealloc_pd(tp->pd);
    tp->api->close_device(tp->ctx);
    if (tp->listen_fd >= 0)
        close(tp->listen_fd);
    close(tp->wake_fd);
    free(tp->rdv_send.v);
    free(tp->rdv_recv.v);
    free(tp->pfds);
    free(tp->active);
    free(tp->peers);
    free(tp);
}

const loom_transport_ops_t loom_ibverbs_transport = {
    .size = sizeof(loom_transport_ops_t),
    .name = "ibverbs",
    .create = ib_create,
    .connect = ib_connect,
    .isend = ib_isend,
    .irecv = ib_irecv,
    .probe = ib_probe,
    .progress = ib_progress,
    .mem_register = ib_mem_register,
    .mem_deregister = ib_mem_deregister,
    .abort = ib_abort,
    .destroy = ib_destroy,
};

/* ---- loom-info ------------------------------------------------------------- */

static const char *port_state_name(enum ibv_port_state s)
{
    switch (s) {
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default: return "NOP";
    }
}

int loom_ibverbs_list_devices(FILE *out)
{
    char why[512];
    const loom_ib_api_t *api = loom_ib_api_load(why, sizeof(why));
    if (!api) {
        fprintf(out, "#   no RDMA devices (%s)\n", why);
        return 0;
    }
    int ndev = 0;
    struct ibv_device **devs = api->get_device_list(&ndev);
    if (!devs || ndev == 0) {
        fprintf(out, "#   no RDMA devices%s%s%s\n", devs ? "" : " (ibv_get_device_list: ",
                devs ? "" : strerror(errno), devs ? "" : ")");
        if (devs)
            api->free_device_list(devs);
        return 0;
    }
    fprintf(out, "#   %d device(s)\n", ndev);
    for (int d = 0; d < ndev; d++) {
        const char *name = api->get_device_name(devs[d]);
        struct ibv_context *ctx = api->open_device(devs[d]);
        unsigned long long guid = (unsigned long long)be64toh(api->get_device_guid(devs[d]));
        struct ibv_device_attr da;
        if (!ctx || api->query_device(ctx, &da) != 0) {
            fprintf(out, "#     %s: cannot open: %s\n", name, strerror(errno));
            if (ctx)
                api->close_device(ctx);
            continue;
        }
        fprintf(out, "#     %s  guid %016llx  %d port(s)\n", name, guid, da.phys_port_cnt);
        for (int port = 1; port <= da.phys_port_cnt; port++) {
            struct ibv_port_attr pa;
            memset(&pa, 0, sizeof(pa));
            if (api->query_port(ctx, (uint8_t)port, &pa) != 0)
                continue;
            int roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
            fprintf(out, "#       port %d: %s, %s, lid %u, MTU %d (max %d)\n", port,
                    port_state_name(pa.state), roce ? "Ethernet (RoCE)" : "InfiniBand", pa.lid,
                    mtu_bytes(pa.active_mtu), mtu_bytes(pa.max_mtu));
            int n = pa.gid_tbl_len < 256 ? pa.gid_tbl_len : 256;
            for (int i = 0; i < n; i++) {
                union ibv_gid g;
                if (api->query_gid(ctx, (uint8_t)port, i, &g) != 0 || loom_ib_gid_is_zero(g.raw))
                    continue;
                char txt[40];
                loom_ib_gid_format(g.raw, txt);
                int type = gid_type(name, port, i);
                fprintf(out, "#         gid[%d] %s%s\n", i, txt,
                        type == 2 ? "  RoCE v2" : type == 1 ? (roce ? "  RoCE v1" : "  IB") : "");
            }
        }
        api->close_device(ctx);
    }
    api->free_device_list(devs);
    return ndev;
}
