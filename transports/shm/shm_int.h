/*
 * shm_int.h - what the files of the shared-memory transport share (see
 * shm.c's top for the design): the segment, ring and record layout, the
 * instance and its peers, the ring primitives both directions use, and the
 * functions one file calls in another. Not installed; outside
 * transports/shm/ only tests that forge records include it.
 */
#ifndef LOOM_SHM_INT_H
#define LOOM_SHM_INT_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "base/futex.h"
#include "transports/tp_fail.h"
#include "transports/tp_match.h"

extern const loom_transport_ops_t loom_shm_transport;

#define RING_BYTES (256 * 1024)
/* Messages above this go by cross-memory attach when the receiver can read us. */
#define CMA_MIN_BYTES (32 * 1024)
/* Streamed messages are cut into records of at most this much payload. */
#define CHUNK_BYTES (RING_BYTES / 4)
/* "LOOMSHM2": the header gained the binding (shm.c), the keepalive counter
 * and the fault its owner gave up on; a LOOMSHM1 peer, which would write into
 * a segment before checking whose it is, is refused. */
#define SEGMENT_MAGIC UINT64_C(0x4c4f4f4d53484d32)
#define LIVENESS_CHECK_S 0.1
/* After the rings: a window that node-local algorithms stage data in, which
 * every peer maps. Its pages are only touched when an algorithm uses it. */
#define WINDOW_BYTES ((size_t)2 << 20)
/* Messages a peer may have waiting for their receive (and the bytes they
 * hold): far beyond what an algorithm leaves early, yet a peer gone wrong
 * cannot grow our heap without end. */
#define UNEXP_MAX_MSGS 65536
#define UNEXP_MAX_BYTES ((uint64_t)16 << 30)
/* Seals every segment carries, so that a peer that mapped it can rely on its
 * size (a shrunk file would turn our next access into SIGBUS). */
#define SEGMENT_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

enum { REC_PAD = 1, REC_EAGER, REC_START, REC_CONT, REC_RTS, REC_FIN, REC_BYE };
/* segment_t.closed: a broken owner will never answer again, so its peers
 * fail at once instead of after LOOM_TIMEOUT. */
enum { SEG_OPEN = 0, SEG_DESTROYED = 1, SEG_BROKEN = 2 };

typedef struct rec {
    uint32_t kind;
    uint32_t desc;
    uint64_t len;      /* payload bytes following this record */
    uint64_t tag;
    uint64_t total;
    uint64_t msglen;   /* bytes of the whole message (EAGER, START, RTS) */
    uint64_t token;    /* RTS/FIN: the sender's request */
    uint64_t addr;     /* RTS: where the payload lies in the sender */
} rec_t;

typedef struct ring {
    _Alignas(64) _Atomic uint64_t head;          /* written by the producer */
    _Atomic uint32_t producer_waiting;           /* the producer sleeps until we free room */
    _Alignas(64) _Atomic uint64_t tail;          /* written by the consumer (the owner) */
    _Atomic uint32_t attached;                   /* the producer has mapped us and checked CMA */
    _Atomic uint32_t consumer_cma;               /* we (the owner) can read the producer's memory */
    _Alignas(64) uint8_t data[RING_BYTES];
} ring_t;

/* segment_t.bound: the owner wrote its binding; until then no peer writes. */
enum { SEG_UNBOUND = 0, SEG_BOUND = 1 };
#define BINDING_BYTES 32

typedef struct segment {
    uint64_t magic;
    uint64_t size;                               /* communicator size: number of rings */
    /* Which job's ranks may write here: a MAC (a hash without LOOM_AUTH_KEY)
     * over the job, communicator, owner's rank and every local rank's address
     * as the owner read them (shm.c, binding_of). Written once by the owner
     * before it sets bound; peers compare it before their first write. */
    uint8_t binding[BINDING_BYTES];
    _Atomic uint32_t bound;                      /* SEG_UNBOUND or SEG_BOUND */
    _Alignas(64) _Atomic uint32_t doorbell;
    _Atomic uint32_t sleeping;
    _Atomic uint32_t closed;                     /* SEG_OPEN, SEG_DESTROYED or SEG_BROKEN */
    /* Counted up by the owner at least every LOOM_TP_KEEPALIVE_S while it is
     * in progress: peers tell a rank that waits from one that stopped. */
    _Atomic uint64_t alive;
    /* SEG_BROKEN: the fault, written before closed is (the culprit and the
     * reporter + 1, 0: none; the status; the milliseconds waited). */
    _Atomic uint32_t fault_culprit, fault_reporter, fault_why, fault_waited_ms;
    _Alignas(64) ring_t rings[];
} segment_t;

typedef struct shm_peer {
    int rank;
    int local;          /* served by this transport */
    pid_t pid;
    segment_t *seg;     /* the peer's segment: we produce into seg->rings[our rank] */
    size_t seg_bytes;
    int cma_to_peer;    /* the peer can read our memory: send large messages by RTS */
    int said_bye;
    uint64_t alive_seen;                /* its keepalive counter when last looked at */
    double heard_at;                    /* when that counter last moved */
    /* send side */
    loom_req_queue_t sq;                /* not fully written to the ring yet */
    loom_tp_req_t *fin_wait;            /* RTS written, FIN not received */
    uint64_t *fins;                     /* FINs not yet written to the peer's ring */
    size_t nfins, fins_cap;
    int started;                        /* sq_head's first record is in the ring */
    /* receive side (our ring for this peer) */
    loom_req_queue_t rq;                /* posted receives */
    loom_unexp_queue_t uq;              /* early messages (at most UNEXP_MAX_*); data is
                                         * NULL for an RTS, grows as a stream arrives */
    loom_tp_req_t *cur_req;             /* a streamed message arriving */
    loom_unexp_t *cur_unexp;
    size_t cur_len, cur_off;
} shm_peer_t;

struct loom_tp {
    int rank, size;
    loom_err_t *err;
    char addr[128];                    /* what create published: peers' view of us */
    uint64_t job_hash, comm_hash;
    char job_id[128];
    uint8_t key[1024];                 /* LOOM_AUTH_KEY for the binding; keylen 0: none */
    size_t keylen;
    int memfd;
    segment_t *seg;
    size_t seg_bytes;
    shm_peer_t *peers;
    uint64_t probe;                    /* peers read it to learn whether CMA works */
    int use_cma;                       /* LOOM_SHM_CMA */
    loom_status_t failed;
    double next_liveness;
    double keepalive_at;               /* when the counter is next moved and read */
    loom_tp_fault_t fault;             /* the first fault we learned of: what peers read */
    _Atomic int abort_why;
};

static inline void ring_doorbell(segment_t *seg)
{
    if (atomic_load(&seg->sleeping)) {
        atomic_fetch_add(&seg->doorbell, 1);
        loom_futex_wake(&seg->doorbell);
    }
}

#define tp_fail(tp, st, ...) loom_tp_fail(&(tp)->failed, (tp)->err, "shm", (tp)->rank, st, __VA_ARGS__)

static inline size_t rec_space(size_t payload)
{
    return (sizeof(rec_t) + payload + 7) & ~(size_t)7;
}

/* ---- the ring ------------------------------------------------------------- */

/* Whether a record of payload bytes fits now; *pad_p: bytes to skip first
 * because the record may not wrap around the ring's end. */
static inline int ring_fits(ring_t *ring, size_t payload, size_t *pad_p)
{
    uint64_t head = atomic_load_explicit(&ring->head, memory_order_relaxed);
    uint64_t tail = atomic_load(&ring->tail);
    size_t need = rec_space(payload);
    size_t to_end = RING_BYTES - (size_t)(head % RING_BYTES);
    size_t pad = to_end < need ? to_end : 0;
    if (pad_p)
        *pad_p = pad;
    return RING_BYTES - (head - tail) >= pad + need;
}

/* Room for a record of payload bytes in ring; returns where it starts, or
 * NULL when it must wait. Writes a pad record over a too-short ring end. */
static inline rec_t *ring_reserve(ring_t *ring, size_t payload)
{
    size_t pad;
    if (!ring_fits(ring, payload, &pad))
        return NULL;
    uint64_t head = atomic_load_explicit(&ring->head, memory_order_relaxed);
    size_t off = (size_t)(head % RING_BYTES);
    if (pad) {
        if (pad >= sizeof(rec_t))
            ((rec_t *)(ring->data + off))->kind = REC_PAD;
        atomic_store_explicit(&ring->head, head + pad, memory_order_release);
        off = 0;
    }
    return (rec_t *)(ring->data + off);
}

static inline void ring_publish(shm_peer_t *peer, ring_t *ring, size_t payload)
{
    uint64_t head = atomic_load_explicit(&ring->head, memory_order_relaxed);
    atomic_store(&ring->head, head + rec_space(payload));
    ring_doorbell(peer->seg);
}


/* shm_send.c */
loom_status_t shm_flush_sends(loom_tp_t *tp, shm_peer_t *peer, int *moved);
size_t shm_next_payload(const shm_peer_t *peer);
loom_status_t shm_isend(loom_tp_t *tp, loom_tp_req_t *req);

/* shm_recv.c */
loom_status_t shm_drain(loom_tp_t *tp, shm_peer_t *peer, int *moved);
loom_status_t shm_irecv(loom_tp_t *tp, loom_tp_req_t *req);
int shm_probe(loom_tp_t *tp, int rank, uint64_t tag);
loom_status_t shm_progress(loom_tp_t *tp, int timeout_ms, int *moved_p);
int shm_peer_readable(loom_tp_t *tp, int peer);
void *shm_window(loom_tp_t *tp, int peer, size_t *len_p);
loom_status_t shm_watch(loom_tp_t *tp, int peer);
loom_status_t shm_peer_read(loom_tp_t *tp, int peer, void *buf, uint64_t addr, size_t len);

#endif
