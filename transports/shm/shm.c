/*
 * shm.c - the shared-memory transport between ranks of one node.
 *
 * Every rank owns one anonymous segment (memfd: it has no name, so nothing
 * can be left behind in /dev/shm, whatever way the process ends). The segment
 * holds one single-producer ring per peer: peer p writes its messages to us
 * into ring[p] of our segment, having mapped it through /proc/<pid>/fd/<fd>.
 *
 * Small messages travel inside the ring (two copies, no system call). Large
 * ones travel by cross-memory attach: the sender puts a descriptor of its
 * buffer in the ring, the receiver copies straight from the sender's memory
 * into its posted buffer with one process_vm_readv and answers with a FIN that
 * completes the send. Where the kernel or a container forbids that (checked
 * per peer at connect), large messages are streamed through the ring instead.
 *
 * An idle receiver sleeps on a futex in its own segment; writers wake it only
 * when it says it sleeps. A peer that dies is noticed by its pid vanishing.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "settings.h"
#include "tp_util.h"

#define RING_BYTES (256 * 1024)
/* Messages above this go by cross-memory attach when the receiver can read us. */
#define CMA_MIN_BYTES (32 * 1024)
/* Streamed messages are cut into records of at most this much payload. */
#define CHUNK_BYTES (RING_BYTES / 4)
#define SEGMENT_MAGIC UINT64_C(0x4c4f4f4d53484d31)   /* "LOOMSHM1" */
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

typedef struct segment {
    uint64_t magic;
    uint64_t size;                               /* communicator size: number of rings */
    _Alignas(64) _Atomic uint32_t doorbell;
    _Atomic uint32_t sleeping;
    _Atomic uint32_t closed;                     /* SEG_OPEN, SEG_DESTROYED or SEG_BROKEN */
    _Alignas(64) ring_t rings[];
} segment_t;

typedef struct shm_unexp {
    struct shm_unexp *next;
    loom_frame_t frame;
    uint8_t *data;      /* eager or streamed payload; NULL for an RTS */
    size_t got, cap;    /* cap: bytes data holds; grows as the stream arrives */
    int complete;
    uint64_t token, addr;   /* RTS */
} shm_unexp_t;

typedef struct shm_peer {
    int rank;
    int local;          /* served by this transport */
    pid_t pid;
    segment_t *seg;     /* the peer's segment: we produce into seg->rings[our rank] */
    size_t seg_bytes;
    int cma_to_peer;    /* the peer can read our memory: send large messages by RTS */
    int said_bye;
    /* send side */
    loom_req_queue_t sq;                /* not fully written to the ring yet */
    loom_tp_req_t *fin_wait;            /* RTS written, FIN not received */
    uint64_t *fins;                     /* FINs not yet written to the peer's ring */
    size_t nfins, fins_cap;
    int started;                        /* sq_head's first record is in the ring */
    /* receive side (our ring for this peer) */
    loom_req_queue_t rq;                /* posted receives */
    shm_unexp_t *uq_head, *uq_tail;
    size_t uq_count;                    /* entries and payload bytes in uq (UNEXP_MAX_*) */
    uint64_t uq_bytes;
    loom_tp_req_t *cur_req;             /* a streamed message arriving */
    shm_unexp_t *cur_unexp;
    size_t cur_len, cur_off;
} shm_peer_t;

struct loom_tp {
    int rank, size;
    loom_err_t *err;
    int memfd;
    segment_t *seg;
    size_t seg_bytes;
    shm_peer_t *peers;
    uint64_t probe;                    /* peers read it to learn whether CMA works */
    int use_cma;                       /* LOOM_SHM_CMA */
    loom_status_t failed;
    double next_liveness;
    _Atomic int abort_why;
};

static void futex_wake(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void futex_wait(_Atomic uint32_t *word, uint32_t seen, int timeout_ms)
{
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, timeout_ms < 0 ? NULL : &ts, NULL, 0);
}

static void ring_doorbell(segment_t *seg)
{
    if (atomic_load(&seg->sleeping)) {
        atomic_fetch_add(&seg->doorbell, 1);
        futex_wake(&seg->doorbell);
    }
}

#define tp_fail(tp, st, ...) loom_tp_fail(&(tp)->failed, (tp)->err, "shm", (tp)->rank, st, __VA_ARGS__)

static size_t rec_space(size_t payload)
{
    return (sizeof(rec_t) + payload + 7) & ~(size_t)7;
}

/* ---- setup ---------------------------------------------------------------- */

static loom_status_t shm_create(const loom_tp_params_t *p, char *addr, size_t addrlen,
                                loom_tp_t **tp_p)
{
    loom_tp_t *tp = calloc(1, sizeof(*tp));
    if (!tp)
        return loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
    tp->rank = p->rank;
    tp->size = p->size;
    tp->err = p->err;
    tp->memfd = -1;
    tp->probe = SEGMENT_MAGIC ^ (uint64_t)getpid();
    tp->use_cma = p->settings ? p->settings->shm_cma : 1;
    tp->peers = calloc((size_t)p->size, sizeof(shm_peer_t));
    tp->seg_bytes = sizeof(segment_t) + (size_t)p->size * sizeof(ring_t) + WINDOW_BYTES;
    if (!tp->peers) {
        free(tp);
        return loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
    }
    for (int r = 0; r < p->size; r++)
        tp->peers[r].rank = r;
    /* Pages of rings no local peer uses are never touched, so a large job
     * costs address space, not memory. */
    tp->memfd = memfd_create("loom-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (tp->memfd < 0 || ftruncate(tp->memfd, (off_t)tp->seg_bytes) != 0 ||
        fcntl(tp->memfd, F_ADD_SEALS, SEGMENT_SEALS) != 0) {
        loom_status_t st = loom_err_set(p->err, LOOM_ERR_TRANSPORT,
                                        "shared memory: cannot create a %zu-byte segment: %s "
                                        "(LOOM_SHM=0 turns shared memory off)",
                                        tp->seg_bytes, strerror(errno));
        if (tp->memfd >= 0)
            close(tp->memfd);
        free(tp->peers);
        free(tp);
        return st;
    }
    tp->seg = mmap(NULL, tp->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, tp->memfd, 0);
    if (tp->seg == MAP_FAILED) {
        loom_status_t st = loom_err_set(p->err, LOOM_ERR_TRANSPORT,
                                        "shared memory: cannot map the segment: %s",
                                        strerror(errno));
        close(tp->memfd);
        free(tp->peers);
        free(tp);
        return st;
    }
    tp->seg->magic = SEGMENT_MAGIC;
    tp->seg->size = (uint64_t)p->size;
    snprintf(addr, addrlen, "shm:%d:%d:%zu:%llx", (int)getpid(), tp->memfd, tp->seg_bytes,
             (unsigned long long)(uintptr_t)&tp->probe);
    *tp_p = tp;
    return LOOM_SUCCESS;
}

/* Can we read the peer's memory? Read its probe word and compare. */
static int cma_works(pid_t pid, uint64_t probe_addr, uint64_t want)
{
    uint64_t got = 0;
    struct iovec l = {&got, sizeof(got)}, r = {(void *)(uintptr_t)probe_addr, sizeof(got)};
    return process_vm_readv(pid, &l, 1, &r, 1, 0) == (ssize_t)sizeof(got) && got == want;
}

static loom_status_t shm_connect(loom_tp_t *tp, char *const *addrs, double timeout_s)
{
    for (int r = 0; r < tp->size; r++) {
        shm_peer_t *peer = &tp->peers[r];
        if (r == tp->rank || addrs[r] == NULL)
            continue;
        int pid, fd;
        size_t bytes;
        unsigned long long probe;
        if (sscanf(addrs[r], "shm:%d:%d:%zu:%llx", &pid, &fd, &bytes, &probe) != 4 ||
            bytes != tp->seg_bytes)
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d published a bad shared-memory "
                           "address \"%s\"", r, addrs[r]);
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
        int pfd = open(path, O_RDWR | O_CLOEXEC);
        if (pfd < 0)
            return tp_fail(tp, LOOM_ERR_TRANSPORT,
                           "shared memory: cannot open rank %d's segment %s: %s (are the ranks "
                           "in one container, under one user? LOOM_SHM=0 turns shared memory "
                           "off)", r, path, strerror(errno));
        /* Only a sealed memfd of the announced size: mapping anything shorter
         * (or a file its owner may still shrink) would let a touch beyond its
         * end kill us with SIGBUS. */
        struct stat sb;
        int seals = fcntl(pfd, F_GET_SEALS);
        if (fstat(pfd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != bytes ||
            seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
            close(pfd);
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "shared memory: rank %d's segment %s is not "
                           "a sealed memfd of %zu bytes", r, path, bytes);
        }
        void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
        close(pfd);
        if (m == MAP_FAILED)
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "shared memory: cannot map rank %d's "
                           "segment: %s", r, strerror(errno));
        peer->seg = m;
        peer->seg_bytes = bytes;
        peer->pid = pid;
        peer->local = 1;
        if (peer->seg->magic != SEGMENT_MAGIC || peer->seg->size != (uint64_t)tp->size)
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d's shared-memory segment is not "
                           "one of this communicator", r);
        ring_t *mine = &tp->seg->rings[r];
        atomic_store(&mine->consumer_cma,
                     tp->use_cma && cma_works(pid, probe, SEGMENT_MAGIC ^ (uint64_t)pid) ? 1u : 0u);
        atomic_store(&peer->seg->rings[tp->rank].attached, 1u);
    }
    /* Each peer must have checked whether it can read us before we choose how
     * to send it large messages. */
    double deadline = loom_now_s() + timeout_s;
    for (int r = 0; r < tp->size; r++) {
        shm_peer_t *peer = &tp->peers[r];
        if (!peer->local)
            continue;
        while (!atomic_load(&tp->seg->rings[r].attached)) {
            if (loom_now_s() > deadline)
                return tp_fail(tp, LOOM_ERR_TIMEOUT, "rank %d timed out after %.1f s waiting "
                               "for rank %d to map its shared memory", tp->rank, timeout_s, r);
            if (kill(peer->pid, 0) != 0 && errno == ESRCH)
                return tp_fail(tp, LOOM_ERR_PEER_LOST, "rank %d died while connecting", r);
            usleep(200);
        }
        peer->cma_to_peer = (int)atomic_load(&peer->seg->rings[tp->rank].consumer_cma);
        if (!peer->cma_to_peer)
            LOOM_INFO("shm", "rank %d: rank %d cannot read our memory (cross-memory attach "
                      "refused); large messages go through the ring", tp->rank, r);
    }
    tp->next_liveness = loom_now_s() + LIVENESS_CHECK_S;
    return LOOM_SUCCESS;
}

/* ---- matching ------------------------------------------------------------- */

static void unexp_append(shm_peer_t *peer, shm_unexp_t *u)
{
    peer->uq_count++;
    peer->uq_bytes += u->frame.len;
    if (peer->uq_tail)
        peer->uq_tail->next = u;
    else
        peer->uq_head = u;
    peer->uq_tail = u;
}

/* The oldest receive posted for f's tag, unlinked; NULL when none is posted
 * or f does not fit it (then the instance has failed). */
static loom_tp_req_t *rq_take(loom_tp_t *tp, shm_peer_t *peer, const loom_frame_t *f)
{
    loom_status_t st = LOOM_SUCCESS;
    loom_tp_req_t *r = loom_req_queue_take(&peer->rq, f, tp->rank, tp->err, &st);
    if (st != LOOM_SUCCESS)
        tp_fail(tp, st, "%s", tp->err->msg);
    return r;
}

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

static int shm_peer_readable(loom_tp_t *tp, int peer)
{
    /* Both ways, so the two ranks agree on which algorithms can run. */
    return peer >= 0 && peer < tp->size && tp->peers[peer].local &&
           tp->peers[peer].cma_to_peer && atomic_load(&tp->seg->rings[peer].consumer_cma);
}

static void *window_of(segment_t *seg, size_t seg_bytes)
{
    return (char *)seg + seg_bytes - WINDOW_BYTES;
}

static void *shm_window(loom_tp_t *tp, int peer, size_t *len_p)
{
    *len_p = WINDOW_BYTES;
    if (peer == tp->rank)
        return window_of(tp->seg, tp->seg_bytes);
    if (peer < 0 || peer >= tp->size || !tp->peers[peer].local)
        return NULL;
    return window_of(tp->peers[peer].seg, tp->peers[peer].seg_bytes);
}

static loom_status_t shm_peer_read(loom_tp_t *tp, int peer, void *buf, uint64_t addr, size_t len)
{
    if (tp->failed)
        return tp->failed;
    if (!shm_peer_readable(tp, peer))
        return tp_fail(tp, LOOM_ERR_INTERNAL, "rank %d cannot read rank %d's memory", tp->rank,
                       peer);
    return read_peer(tp, &tp->peers[peer], buf, addr, len);
}

/* ---- sending -------------------------------------------------------------- */

/* Whether a record of payload bytes fits now; *pad_p: bytes to skip first
 * because the record may not wrap around the ring's end. */
static int ring_fits(ring_t *ring, size_t payload, size_t *pad_p)
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
static rec_t *ring_reserve(ring_t *ring, size_t payload)
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

static void ring_publish(shm_peer_t *peer, ring_t *ring, size_t payload)
{
    uint64_t head = atomic_load_explicit(&ring->head, memory_order_relaxed);
    atomic_store(&ring->head, head + rec_space(payload));
    ring_doorbell(peer->seg);
}

/* Write what the ring takes of peer's control and send queues. */
static int goes_by_rts(const shm_peer_t *peer, const loom_tp_req_t *req)
{
    return peer->cma_to_peer && req->len >= CMA_MIN_BYTES;
}

/* Payload of the next record the send queue writes. */
static size_t next_payload(const shm_peer_t *peer)
{
    if (peer->nfins || !peer->sq.head || goes_by_rts(peer, peer->sq.head))
        return 0;
    size_t left = peer->sq.head->len - peer->sq.head->off;
    return left < CHUNK_BYTES ? left : CHUNK_BYTES;
}

static loom_status_t flush_sends(loom_tp_t *tp, shm_peer_t *peer, int *moved)
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

static loom_status_t self_send(loom_tp_t *tp, loom_tp_req_t *req)
{
    shm_peer_t *self = &tp->peers[tp->rank];
    loom_frame_t f = {.kind = LOOM_FRAME_DATA, .match = req->match, .len = req->len};
    loom_tp_req_t *r = rq_take(tp, self, &f);
    if (tp->failed)
        return tp->failed;
    if (r) {
        if (req->len)
            memcpy(r->buf, req->buf, req->len);
        loom_req_complete(r);
    } else {
        shm_unexp_t *u = calloc(1, sizeof(*u));
        if (u)
            u->data = malloc(req->len ? req->len : 1);
        if (!u || !u->data) {
            free(u);
            return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
        }
        u->frame = f;
        if (req->len)
            memcpy(u->data, req->buf, req->len);
        u->got = u->cap = req->len;
        u->complete = 1;
        unexp_append(self, u);
    }
    loom_req_complete(req);
    return LOOM_SUCCESS;
}

static loom_status_t shm_isend(loom_tp_t *tp, loom_tp_req_t *req)
{
    if (tp->failed)
        return tp->failed;
    loom_req_start(req);
    if (req->peer == tp->rank)
        return self_send(tp, req);
    shm_peer_t *peer = &tp->peers[req->peer];
    if (peer->said_bye || atomic_load(&peer->seg->closed))
        return tp_fail(tp, LOOM_ERR_PEER_LOST,
                       "rank %d sends to rank %d, which has destroyed or given up on its "
                       "communicator", tp->rank, peer->rank);
    int was_idle = peer->sq.head == NULL;
    loom_req_queue_push(&peer->sq, req);
    int moved = 0;
    return was_idle ? flush_sends(tp, peer, &moved) : LOOM_SUCCESS;
}

/* ---- receiving ------------------------------------------------------------ */

static int shm_probe(loom_tp_t *tp, int rank, uint64_t tag)
{
    for (const shm_unexp_t *u = tp->peers[rank].uq_head; u; u = u->next)
        if (u->frame.match.tag == tag)
            return 1;
    return 0;
}

static loom_status_t shm_irecv(loom_tp_t *tp, loom_tp_req_t *req)
{
    if (tp->failed)
        return tp->failed;
    loom_req_start(req);
    shm_peer_t *peer = &tp->peers[req->peer];
    shm_unexp_t *prev = NULL;
    for (shm_unexp_t *u = peer->uq_head; u; prev = u, u = u->next) {
        if (u->frame.match.tag != req->match.tag)
            continue;
        if (loom_frame_check(&u->frame, req, tp->rank, tp->err) != LOOM_SUCCESS)
            return tp_fail(tp, LOOM_ERR_MISMATCH, "%s", tp->err->msg);
        if (prev)
            prev->next = u->next;
        else
            peer->uq_head = u->next;
        if (peer->uq_tail == u)
            peer->uq_tail = prev;
        peer->uq_count--;
        peer->uq_bytes -= u->frame.len;
        loom_status_t st = LOOM_SUCCESS;
        if (!u->data) {
            st = cma_read(tp, peer, req, u->addr, u->token);
        } else {
            if (u->got)
                memcpy(req->buf, u->data, u->got);
            req->off = u->got;
            if (u->complete) {
                loom_req_complete(req);
            } else {
                /* Still streaming in: the rest lands in the posted buffer. */
                peer->cur_unexp = NULL;
                peer->cur_req = req;
            }
        }
        free(u->data);
        free(u);
        if (st == LOOM_SUCCESS && peer->nfins) {
            int moved = 0;
            st = flush_sends(tp, peer, &moved);
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
    if (peer->uq_count >= UNEXP_MAX_MSGS || len > UNEXP_MAX_BYTES - peer->uq_bytes)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d sent more early messages than rank %d "
                       "keeps (%zu messages, %llu bytes waiting for their receive)", peer->rank,
                       tp->rank, peer->uq_count, (unsigned long long)peer->uq_bytes);
    return LOOM_SUCCESS;
}

/* Make room for got + len bytes in u's buffer, growing as bytes arrive (not
 * to the announced length at once, which the peer could inflate). */
static loom_status_t unexp_reserve(loom_tp_t *tp, shm_peer_t *peer, shm_unexp_t *u, size_t len)
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
        shm_unexp_t *u = calloc(1, sizeof(*u));
        if (!u)
            return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
        u->frame = f;
        u->token = rec->token;
        u->addr = rec->addr;
        unexp_append(peer, u);
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
    shm_unexp_t *u = calloc(1, sizeof(*u));
    if (!u)
        return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
    u->frame = f;
    if (unexp_reserve(tp, peer, u, rec->len) != LOOM_SUCCESS) {
        free(u);
        return tp->failed;
    }
    if (rec->len)
        memcpy(u->data, payload, rec->len);
    u->got = rec->len;
    u->complete = rec->kind == REC_EAGER;
    unexp_append(peer, u);
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
        shm_unexp_t *u = peer->cur_unexp;
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
static loom_status_t drain(loom_tp_t *tp, shm_peer_t *peer, int *moved)
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
            if (peer->rq.head || peer->cur_req)
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
        futex_wake(&peer->seg->doorbell);
    }
    return tp->failed;
}

static int has_work(const shm_peer_t *peer)
{
    return peer->rq.head || peer->cur_req || peer->sq.head || peer->fin_wait || peer->nfins;
}

/* Peers we wait for that vanished: their pid is gone. */
static loom_status_t check_liveness(loom_tp_t *tp)
{
    for (int r = 0; r < tp->size; r++) {
        shm_peer_t *peer = &tp->peers[r];
        if (!peer->local || !has_work(peer))
            continue;
        /* The flag first: a rank that gave up may have exited by now too. */
        if (atomic_load(&peer->seg->closed) == SEG_BROKEN)
            return tp_fail(tp, LOOM_ERR_PEER_LOST,
                           "rank %d gave up on this communicator (a failed call or "
                           "loom_comm_abort there) while rank %d waits for it", r, tp->rank);
        if (kill(peer->pid, 0) != 0 && errno == ESRCH)
            return tp_fail(tp, LOOM_ERR_PEER_LOST,
                           "rank %d lost rank %d: its process (pid %d) exited without "
                           "loom_comm_destroy", tp->rank, r, (int)peer->pid);
    }
    return LOOM_SUCCESS;
}

static loom_status_t poll_once(loom_tp_t *tp, int *moved)
{
    for (int r = 0; r < tp->size && !tp->failed; r++) {
        shm_peer_t *peer = &tp->peers[r];
        if (!peer->local)
            continue;
        if (drain(tp, peer, moved) != LOOM_SUCCESS)
            break;
        if (peer->sq.head || peer->nfins)
            flush_sends(tp, peer, moved);
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
            ring_fits(&peer->seg->rings[tp->rank], next_payload(peer), NULL))
            return 1;
    }
    return 0;
}

static loom_status_t shm_progress(loom_tp_t *tp, int timeout_ms, int *moved_p)
{
    *moved_p = 0;
    int why = atomic_load(&tp->abort_why);
    if (why)
        return tp_fail(tp, (loom_status_t)why, "communicator aborted");
    if (tp->failed)
        return tp->failed;
    poll_once(tp, moved_p);
    if (*moved_p || tp->failed || timeout_ms == 0)
        return tp->failed;
    if (timeout_ms < 0 || timeout_ms > 100)
        timeout_ms = 100;   /* wake up to look for dead peers */
    atomic_store(&tp->seg->sleeping, 1u);
    uint32_t seen = atomic_load(&tp->seg->doorbell);
    if (!anything_arrived(tp) && !atomic_load(&tp->abort_why))
        futex_wait(&tp->seg->doorbell, seen, timeout_ms);
    atomic_store(&tp->seg->sleeping, 0u);
    if ((why = atomic_load(&tp->abort_why)) != 0)
        return tp_fail(tp, (loom_status_t)why, "communicator aborted");
    poll_once(tp, moved_p);
    double now = loom_now_s();
    if (!*moved_p && !tp->failed && now >= tp->next_liveness) {
        tp->next_liveness = now + LIVENESS_CHECK_S;
        check_liveness(tp);
    }
    return tp->failed;
}

/* Called on every failure of the communicator (and by loom_comm_abort): we
 * will not answer our peers again, so tell them and wake them to look. */
static void shm_abort(loom_tp_t *tp, loom_status_t why)
{
    atomic_store(&tp->abort_why, (int)why);
    atomic_fetch_add(&tp->seg->doorbell, 1);
    futex_wake(&tp->seg->doorbell);
    uint32_t open = SEG_OPEN;
    atomic_compare_exchange_strong(&tp->seg->closed, &open, (uint32_t)SEG_BROKEN);
    for (int r = 0; r < tp->size; r++)
        if (tp->peers[r].local) {
            atomic_fetch_add(&tp->peers[r].seg->doorbell, 1);
            futex_wake(&tp->peers[r].seg->doorbell);
        }
}

static void shm_destroy(loom_tp_t *tp, double timeout_s)
{
    if (!tp)
        return;
    /* Say goodbye so a peer still waiting for us fails at once. The ring may
     * be full of messages the peer never received; then it learns from our
     * closed flag or our pid. */
    double deadline = loom_now_s() + timeout_s;
    uint32_t open = SEG_OPEN;
    atomic_compare_exchange_strong(&tp->seg->closed, &open, (uint32_t)SEG_DESTROYED);
    for (int r = 0; r < tp->size; r++) {
        shm_peer_t *peer = &tp->peers[r];
        if (!peer->local)
            continue;
        if (!tp->failed) {
            ring_t *ring = &peer->seg->rings[tp->rank];
            rec_t *rec;
            while ((rec = ring_reserve(ring, 0)) == NULL && loom_now_s() < deadline &&
                   !(kill(peer->pid, 0) != 0 && errno == ESRCH)) {
                int moved = 0;
                drain(tp, peer, &moved);
                usleep(100);
            }
            if (rec) {
                memset(rec, 0, sizeof(*rec));
                rec->kind = REC_BYE;
                ring_publish(peer, ring, 0);
            }
        }
        munmap(peer->seg, peer->seg_bytes);
        for (shm_unexp_t *u = peer->uq_head, *next; u; u = next) {
            next = u->next;
            free(u->data);
            free(u);
        }
        free(peer->fins);
    }
    shm_peer_t *self = &tp->peers[tp->rank];
    for (shm_unexp_t *u = self->uq_head, *next; u; u = next) {
        next = u->next;
        free(u->data);
        free(u);
    }
    munmap(tp->seg, tp->seg_bytes);
    close(tp->memfd);
    free(tp->peers);
    free(tp);
}

const loom_transport_ops_t loom_shm_transport = {
    .size = sizeof(loom_transport_ops_t),
    .name = "shm",
    .create = shm_create,
    .connect = shm_connect,
    .isend = shm_isend,
    .irecv = shm_irecv,
    .probe = shm_probe,
    .progress = shm_progress,
    .abort = shm_abort,
    .destroy = shm_destroy,
    .peer_readable = shm_peer_readable,
    .peer_read = shm_peer_read,
    .window = shm_window,
};
