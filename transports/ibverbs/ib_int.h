/*
 * ib_int.h - what the files of the verbs transport share (see ibverbs.c's top
 * for the design): the constants of the data path, the wr_id layout, the
 * instance, the peer and the request records, and the functions one file
 * calls in another. Not installed; nothing outside transports/ibverbs/
 * includes it.
 */
#ifndef LOOM_IB_INT_H
#define LOOM_IB_INT_H

#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "ib_api.h"
#include "ib_regcache.h"
#include "ib_util.h"
#include "transports/tp_addr.h"
#include "transports/tp_fail.h"
#include "transports/tp_match.h"
#include "transports/transport.h"

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
/* GPU allocations kept registered (keyed on their identity, see reg_get):
 * a registration holds its GPU memory even after cudaFree, until evicted, so
 * both the bytes and the entries are bounded. */
#define GDR_CACHE_BYTES ((size_t)4 << 30)
#define GDR_CACHE_ENTRIES 256
#define CHUNK_BYTES (1u << 30) /* one RDMA WRITE at most (sge length is 32 bits) */
#define BYE_GRACE_S 0.2        /* a peer that hung up: what it sent may still trail */
/* A goodbye counts the messages its sender posted to us; more than this only
 * when some never come (the sender's WR failed as it revoked its memory). */
#define NOTE_WAIT_S 2.0
#define NOTE_BYTES 9           /* 'B' (goodbye) or 'G' (gave up), then a 64-bit count */
#define SOCK_CHECK_S 0.005

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

/* A rendezvous in flight: on the sender (an RTS went out) or the receiver (a CTS). */
typedef struct ib_rdv {
    int used;
    int peer;
    loom_tp_req_t *req;
    loom_rc_entry_t *reg;
    loom_rcache_t *rc;       /* the cache reg came from: rcache, or dcache (GPU memory) */
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
    uint64_t sent_to_us;     /* as its goodbye counts them: messages it posted to us */
    uint8_t note[NOTE_BYTES];   /* a goodbye being read from the side channel */
    int note_len;
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
    int rdv_landing;         /* of those, the ones whose data is posted: only their
                              * completion is awaited (the peer may have them already) */
    /* receive side */
    uint64_t freed, advertised;
    int rdv_in;              /* rendezvous receives in flight */
    loom_req_queue_t rq;     /* posted receives, in posting order */
    loom_unexp_queue_t uq;   /* EAGER (data holds the payload) or RTS (data NULL,
                              * token the sender's cookie) */
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
    /* GPUDirect RDMA: GPU memory registered a whole allocation at a time, by
     * dma-buf or on the device pointer (nvidia-peermem), decided at the first
     * GPU buffer, and cached under the allocation's identity. */
    loom_rcache_t dcache;
    const loom_tp_devmem_t *devmem;
    int gdr_net;             /* LOOM_NET_GDR: -1 auto, 0 off, 1 on */
    int gdr_path;            /* loom_gdr_path_t; -1 until decided */
    char gdr_why[400];
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

static inline uint8_t *ib_recv_slot(loom_tp_t *tp, const ib_peer_t *p, int i)
{
    return tp->slots + ((size_t)p->idx * (RECV_SLOTS + SEND_SLOTS) + (size_t)i) * SLOT_BYTES;
}

static inline uint8_t *ib_send_slot(loom_tp_t *tp, const ib_peer_t *p, int i)
{
    return ib_recv_slot(tp, p, RECV_SLOTS + i);
}

/* ib_init.c */
loom_status_t ib_create(const loom_tp_params_t *p, char *addr, size_t addrlen,
                        loom_tp_t **tp_p);
int ib_parse_addr(const char *text, struct sockaddr_storage *ss, socklen_t *len);

/* ib_connect.c */
loom_status_t ib_connect(loom_tp_t *tp, char *const *addrs, double timeout_s);
loom_status_t ib_post_recv_slot(loom_tp_t *tp, ib_peer_t *p, int slot);

/* ib_datapath.c */
loom_status_t ib_isend(loom_tp_t *tp, loom_tp_req_t *req);
loom_status_t ib_irecv(loom_tp_t *tp, loom_tp_req_t *req);
int ib_probe(loom_tp_t *tp, int rank, uint64_t tag);
loom_status_t ib_progress(loom_tp_t *tp, int timeout_ms, int *moved_p);
loom_status_t ib_mem_register(loom_tp_t *tp, void *buf, size_t len, void **handle_p);
void ib_mem_deregister(loom_tp_t *tp, void *handle);
int ib_credits(const loom_tp_t *tp, const ib_peer_t *p);
loom_status_t ib_write_credits(loom_tp_t *tp, ib_peer_t *p, int force_signal);
int ib_nothing_pending(const ib_peer_t *p);
void ib_check_sockets(loom_tp_t *tp, long timeout_us);

/* ib_teardown.c */
void ib_announce_failure(loom_tp_t *tp);
void ib_say_goodbye(loom_tp_t *tp, ib_peer_t *p, int gave_up);
void ib_abort(loom_tp_t *tp, loom_status_t why);
void ib_destroy(loom_tp_t *tp, double timeout_s);

#endif
