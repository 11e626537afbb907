/*
 * tcp_int.h - what the files of the TCP transport share (see tcp.c's top
 * comment for the design): the per-peer state, the small helpers every path
 * uses, and the calls that cross files.
 *
 * tcp.c: addresses, create, connect, progress, abort, destroy, the ops table.
 * tcp_send.c: the send path (frames, striping, flushing, early buffers).
 * tcp_recv.c: the receive path (matching, staging, direct reads, lanes).
 */
#ifndef LOOM_TCP_INT_H
#define LOOM_TCP_INT_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/settings.h"
#include "base/crypto.h"
#include "transports/tp_handshake.h"
#include "transports/tp_addr.h"
#include "transports/tp_fail.h"
#include "transports/tp_match.h"
#include "transports/wire.h"

#define STAGE_BYTES (64 * 1024)
/* Payload remainders at least this big are read straight into the user buffer. */
#define DIRECT_READ_MIN (16 * 1024)
#define MAX_EVENTS 64
/* Early messages at least this big borrow from a small cache of buffers: a
 * fresh malloc that large is an mmap whose page faults cost more than the copy. */
#define POOL_MIN_BYTES (64 * 1024)
#define POOL_SLOTS 8
/* Collective frames at least this big wait in the socket for their receive. */
#define HOLD_MIN_BYTES (32 * 1024)
#define COLL_TAG_BIT (UINT64_C(1) << 63)
/* An early message is allocated up to this size at once, beyond it as its
 * bytes arrive: an announced length alone never allocates much. */
#define EARLY_FIRST_BYTES (4u << 20)

/* With a key, frames are sealed (wire.h): MAC_HEADERS their headers only,
 * MAC_FULL payloads too (as associated data), MAC_ENCRYPT payloads encrypted. */
enum { MAC_NONE = 0, MAC_HEADERS = 1, MAC_FULL = 2, MAC_ENCRYPT = 3 };
/* Payloads up to this size are tagged before they are sent (their tag goes
 * out with them); larger ones as they are sent, while still in cache. */
#define TAG_FIRST_BYTES (64 * 1024)
/* A sealed payload moves in pieces of at most this size, each tagged or
 * encrypted (send) and tagged or decrypted (receive) right as it moves, while
 * still in cache: protection keeps step with the socket instead of running
 * over a whole large message at once. MAC_ENCRYPT: a send encrypts a piece
 * into the connection's own buffer (the user's stays untouched). */
#define CT_BYTES (256 * 1024)
/* A small frame (wire.h) is taken whole into the staging buffer before its
 * tag is checked, never held in the socket, and sealed at once into ct. */
_Static_assert(LOOM_FRAME_BYTES + LOOM_FRAME_SMALL_MAX + LOOM_MAC_BYTES <= STAGE_BYTES &&
               LOOM_FRAME_SMALL_MAX < HOLD_MIN_BYTES && LOOM_FRAME_SMALL_MAX <= CT_BYTES,
               "small frames must fit the staging and ciphertext buffers");

typedef struct tcp_xfer tcp_xfer_t;

/* An early message: got counts, for a striped one, slice 0 (stream 0's part)
 * until it is complete; xfer is the striped message still arriving, else NULL. */
typedef loom_unexp_t tcp_unexp_t;

/* A striped message in flight, sent or received: stream 0 moves slice 0 and
 * each other stream k slice k. Both sides keep them in one list per peer in
 * the order stream 0 framed them; each stream works through the list in that
 * order, so the message at the head always completes first. */
struct tcp_xfer {
    tcp_xfer_t *next;
    loom_frame_t frame;
    loom_tp_req_t *req;    /* the send; the receive once one matched */
    tcp_unexp_t *unexp;    /* receiving before a receive matched: the early buffer */
    int parts_left;        /* slices not yet moved whole */
    size_t moved;          /* bytes of all slices moved */
    size_t got[LOOM_MAX_STREAMS];   /* per stream >= 1: bytes of its slice moved */
};

/* Stream k >= 1 of a peer: only slices travel on it, each a SLICE header
 * (sealed under this connection's own session keys, as stream 0's frames
 * are), the slice, and its payload tag. */
typedef struct tcp_lane {
    int fd;
    int idx;
    uint32_t events;    /* registered with epoll */
    int eof;            /* the peer shut it while it carried nothing for us */
    int out_blocked;
    int mac;
    loom_seal_t tx_seal, rx_seal;   /* with a key: each direction's AEAD */
    uint64_t tx_seq, rx_seq;
    /* send: slice idx of sx */
    tcp_xfer_t *sx;
    uint8_t shdr[LOOM_FRAME_BYTES + LOOM_MAC_BYTES];
    size_t shdr_len, shdr_off;
    int shdr_ready;
    uint64_t shdr_seq;
    uint8_t *ct;        /* MAC_ENCRYPT: ciphertext of the slice's bytes [ct_beg, ct_beg + ct_len) */
    size_t ct_beg, ct_len;
    uint8_t stag[LOOM_MAC_BYTES];
    size_t stag_off;
    int stag_ready;
    /* receive: slice idx of rx */
    tcp_xfer_t *rx;
    uint8_t rhdr[LOOM_FRAME_BYTES + LOOM_MAC_BYTES];
    size_t rhdr_have;
    int rhdr_done;
    uint8_t rtag[LOOM_MAC_BYTES];
    size_t rtag_have;
} tcp_lane_t;

typedef struct tcp_peer {
    int fd;
    int rank;
    int epollout;       /* EPOLLOUT registered: a send is waiting for room */
    int said_bye;       /* the peer destroyed its communicator on purpose */
    int gave_up;        /* the peer's communicator failed: it sends no more */
    int held;           /* a frame waits in the socket for its receive (set_held) */
    double heard_at;    /* when anything (a byte, a keepalive) last came from it */
    /* LOOM_AUTH_KEY: this connection's keys, one per direction, and counters */
    int mac;            /* MAC_NONE, MAC_HEADERS, MAC_FULL or MAC_ENCRYPT */
    loom_seal_t tx_seal, rx_seal;   /* with a key: each direction's AEAD */
    uint64_t tx_seq, rx_seq;
    /* send side */
    loom_req_queue_t sq;
    uint8_t shdr[LOOM_FRAME_BYTES + LOOM_MAC_BYTES];
    size_t shdr_len;    /* header, and its tag when sealed */
    int shdr_ready;
    size_t shdr_off;
    uint64_t shdr_seq;
    size_t tx_hashed;   /* MAC_FULL: payload bytes tagged so far */
    uint8_t *ct;        /* MAC_ENCRYPT: ciphertext of the payload's [ct_beg, ct_beg + ct_len) */
    size_t ct_beg, ct_len;
    uint8_t stag[LOOM_MAC_BYTES];
    int stag_ready;
    size_t stag_off;
    /* receive side */
    uint8_t *stage;
    size_t stage_beg, stage_end;
    int in_frame;
    loom_frame_t cur;
    size_t cur_off;
    loom_tp_req_t *cur_req;
    tcp_unexp_t *cur_unexp;
    uint64_t cur_seq;
    loom_req_queue_t rq;
    loom_unexp_queue_t uq;
    size_t early_bytes;  /* held in uq buffers, at most tp->early_max */
    /* LOOM_SOCKETS_PER_PEER > 1: streams 1.. (lanes[k - 1] is stream k) */
    tcp_lane_t *lanes;
    size_t splen;        /* payload bytes of the frame being sent on stream 0 */
    tcp_xfer_t *s_x;     /* its striped message, else NULL */
    tcp_xfer_t *sx_head, *sx_tail;
    size_t cur_plen;     /* payload bytes of cur on stream 0 (slice 0 when striped) */
    tcp_xfer_t *cur_x;   /* cur's striped message, else NULL */
    tcp_xfer_t *rx_head, *rx_tail;
} tcp_peer_t;

struct loom_tp {
    int rank, size;
    uint64_t job_hash, comm_hash;
    int sockbuf;
    const char *auth_key;          /* LOOM_AUTH_KEY, or NULL */
    size_t auth_keylen;
    int mac_mode;                  /* with a key: MAC_FULL, MAC_HEADERS or MAC_ENCRYPT */
    loom_aead_alg_t cipher;        /* with a key: the AEAD (LOOM_AUTH_CIPHER) */
    size_t early_max;              /* LOOM_EARLY_MAX_BYTES */
    int nstreams;                  /* LOOM_SOCKETS_PER_PEER */
    size_t stripe_min;             /* LOOM_STRIPE_MIN_BYTES */
    uint64_t nstriped_sent, nstriped_recv;   /* for LOOM_DEBUG=INFO */
    char my_addr[256];             /* as published: the proofs bind it */
    loom_err_t *err;
    int listen_fd, epfd, wake_fd;
    tcp_peer_t *peers;
    loom_status_t failed;          /* touched only by the progressing thread */
    uint64_t nframes, nunexpected, unexpected_bytes;   /* for LOOM_DEBUG=INFO */
    struct { uint8_t *buf; size_t cap; } pool[POOL_SLOTS];
    _Atomic int abort_why;         /* set by loom_comm_abort from any thread */
    int announced;                 /* the peers were told of our failure */
    loom_tp_fault_t fault;         /* what they are told: the first fault we learned of */
    double keepalive_at;           /* when the peers are next told we are alive */
    double last_moved;             /* when progress last moved anything */
    double keepalive_idle_s;       /* keepalives only after this long without */
    _Atomic int owner;             /* 1: a thread is in isend/irecv/progress, 2: abort */
};

/* What epoll tells us for each socket: its rank and stream (0: the wake fd). */
#define EV_KEY(rank, stream) ((((uint64_t)(rank) + 1) << 8) | (uint64_t)(stream))

#define tp_fail(tp, st, ...) loom_tp_fail(&(tp)->failed, (tp)->err, "tcp", (tp)->rank, st, __VA_ARGS__)
/* Fail because the connection to rank who broke: that rank is the one the
 * peers hear was lost (unless we already learned of another fault). */
#define tp_lost(tp, who, ...)                                                                  \
    (loom_tp_fault_keep(&(tp)->fault, &(loom_tp_fault_t){.culprit = (who),                    \
                                                         .reporter = (tp)->rank,              \
                                                         .why = LOOM_ERR_PEER_LOST}),         \
     tp_fail(tp, LOOM_ERR_PEER_LOST, __VA_ARGS__))

static inline void update_events(loom_tp_t *tp, tcp_peer_t *peer)
{
    struct epoll_event ev = {.events = (peer->held ? 0 : EPOLLIN) | (peer->epollout ? EPOLLOUT : 0),
                             .data.u64 = EV_KEY(peer->rank, 0)};
    epoll_ctl(tp->epfd, EPOLL_CTL_MOD, peer->fd, &ev);
}

/* A lane reads only while the slice it expects next has somewhere to go
 * (bytes it cannot place stay in the socket, and TCP's window makes the
 * sender wait); while it reads nothing, a shut stream is seen by RDHUP. */
static inline void lane_events(loom_tp_t *tp, tcp_peer_t *peer, tcp_lane_t *lane)
{
    if (lane->fd < 0)
        return;
    int reading = lane->rx && (lane->rx->req || lane->rx->unexp);
    uint32_t events = (reading ? EPOLLIN : 0) | (lane->out_blocked ? EPOLLOUT : 0) |
                      (lane->eof ? 0 : EPOLLRDHUP);
    if (events == lane->events)
        return;
    lane->events = events;
    struct epoll_event ev = {.events = events, .data.u64 = EV_KEY(peer->rank, lane->idx)};
    epoll_ctl(tp->epfd, EPOLL_CTL_MOD, lane->fd, &ev);
}

static inline void want_out(loom_tp_t *tp, tcp_peer_t *peer, int on)
{
    if (peer->epollout == on)
        return;
    peer->epollout = on;
    update_events(tp, peer);
}

/* Hold (or release) a large collective frame whose receive is not posted yet:
 * its bytes stay in the socket until the receive comes, so they land in place
 * instead of being copied through a buffer of ours, and TCP's window makes the
 * sender wait. Only collective frames are held: algorithms post a peer's
 * receives in the order that peer sends, so the held frame is always the next
 * one needed; user messages may be received in any order and are buffered. */
static inline void set_held(loom_tp_t *tp, tcp_peer_t *peer, int held)
{
    if (peer->held == held)
        return;
    peer->held = held;
    update_events(tp, peer);
}

/* Encode f into out with its header tag when the connection is sealed; the
 * length on the wire, or 0 when it cannot be sealed (libcrypto failed, or
 * the sequence numbers are spent: a nonce is never used twice, and with
 * 2^64 of them per connection and direction this is never reached in
 * practice, so a connection fails there instead of rekeying). The frame
 * takes the next sequence number. */
static inline size_t seal_header_with(int mac, loom_seal_t *seal, uint64_t *tx_seq,
                                      const loom_frame_t *f, uint8_t *out, uint64_t *seq_p)
{
    loom_frame_encode(f, out);
    if (mac == MAC_NONE)
        return LOOM_FRAME_BYTES;
    if (*tx_seq == UINT64_MAX)
        return 0;
    *seq_p = (*tx_seq)++;
    if (loom_frame_seal_header(seal, *seq_p, out, out + LOOM_FRAME_BYTES) != 0)
        return 0;
    return LOOM_FRAME_BYTES + LOOM_MAC_BYTES;
}

static inline size_t seal_header(tcp_peer_t *peer, const loom_frame_t *f, uint8_t *out, uint64_t *seq_p)
{
    return seal_header_with(peer->mac, &peer->tx_seal, &peer->tx_seq, f, out, seq_p);
}

static inline int payload_sealed(const tcp_peer_t *peer, uint64_t len)
{
    return peer->mac >= MAC_FULL && len > 0;
}

/* Bytes [at, at + len) of a sealed payload just placed in dst (received):
 * into the tag (MAC_FULL), or decrypted where they lie (MAC_ENCRYPT). */
static inline int open_payload_bytes(int mac, loom_seal_t *rx, uint8_t *dst, size_t len)
{
    return mac == MAC_ENCRYPT ? loom_aead_crypt(&rx->pay, dst, dst, len)
                              : loom_aead_aad(&rx->pay, dst, len);
}

static inline int tag_matches(const loom_tp_req_t *req, const loom_frame_t *f)
{
    return req->match.tag == f->match.tag;
}

static inline loom_status_t gave_up_fail(loom_tp_t *tp, const tcp_peer_t *peer)
{
    return loom_tp_fail_gave_up(&tp->failed, tp->err, "tcp", tp->rank, peer->rank);
}

/* The oldest receive posted for f's tag, unlinked; NULL when none is posted
 * or f does not fit it (then the instance has failed). */
#define rq_take(tp, peer, f) \
    loom_tp_match(&(peer)->rq, f, &(tp)->failed, (tp)->err, "tcp", (tp)->rank)

/* The send path (tcp_send.c). */
void tcp_xfer_part_done(loom_tp_t *tp, tcp_peer_t *peer, tcp_xfer_t *x, int sending);
loom_status_t tcp_lane_flush(loom_tp_t *tp, tcp_peer_t *peer, tcp_lane_t *lane, int *moved);
void tcp_xfer_queue(loom_tp_t *tp, tcp_peer_t *peer, tcp_xfer_t *x, int sending);
loom_status_t tcp_flush_sends(loom_tp_t *tp, tcp_peer_t *peer, int *moved);
loom_status_t tcp_lane_lost(loom_tp_t *tp, tcp_peer_t *peer, tcp_lane_t *lane,
                            const char *why);
void tcp_buf_put(loom_tp_t *tp, uint8_t *buf, size_t cap);
tcp_unexp_t *tcp_unexp_new(loom_tp_t *tp, const loom_frame_t *f, size_t first);
loom_status_t tcp_isend_owned(loom_tp_t *tp, loom_tp_req_t *req);
uint8_t *tcp_buf_get(loom_tp_t *tp, size_t len, size_t *cap_p);

/* The receive path (tcp_recv.c). */
void tcp_handle_read(loom_tp_t *tp, tcp_peer_t *peer, int *moved);
loom_status_t tcp_irecv_owned(loom_tp_t *tp, loom_tp_req_t *req);
void tcp_lane_read(loom_tp_t *tp, tcp_peer_t *peer, tcp_lane_t *lane, int *moved);

#endif
