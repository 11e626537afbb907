/*
 * tcp.c - the TCP transport: non-blocking sockets to every peer, an epoll loop
 * driven by whoever waits (no progress thread), a versioned handshake, and
 * frames whose headers are checked before a byte lands in a user buffer.
 *
 * LOOM_SOCKETS_PER_PEER > 1: a pair has that many connections, all dialled
 * by the same rank, each with its own handshake (and with a key its own
 * proof and session keys). Stream 0 carries every frame as with one stream;
 * a message of LOOM_STRIPE_MIN_BYTES or more is announced there as STRIPED
 * and carries slice 0, while streams 1.. carry slices 1.. (SLICE frames),
 * each stream in the order stream 0 announced them. Matching, ordering and
 * mismatch checks are decided on stream 0 alone; a stream reads only once
 * the slice it expects has a place to go. This is for networks that cap
 * each flow below the link rate; the one progress loop serves every stream
 * (no helper threads: the copies are the kernel's, and one core fills a
 * link of a few GB/s).
 *
 * Receive path: bytes are read into a per-peer staging buffer so that many
 * small frames cost one recv(); a large payload bypasses it and is read
 * straight into the posted buffer. A frame nobody has posted for yet is kept
 * as an "unexpected" message in a buffer of its own until its receive comes.
 *
 * LOOM_AUTH_KEY: the handshake proves the key both ways over both ends'
 * published addresses and derives session keys (wire.h); every frame then
 * carries a tag over its header, right after it, and (LOOM_AUTH_MAC=full) one
 * over its payload, right after that, each under the sender's direction key
 * and the frame's sequence number. A header is checked before it is acted on;
 * payload bytes may land in the posted buffer before their tag arrives, but
 * the receive completes only once it matched.
 *
 * Failure: any error (a peer vanishing, a protocol violation, a mismatch) is
 * sticky for the instance: every later call returns it, and the requests that
 * were pending are never touched again (their memory may already be gone).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
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
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "settings.h"
#include "sha256.h"
#include "tp_handshake.h"
#include "tp_util.h"
#include "wire.h"

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

enum { MAC_NONE = 0, MAC_HEADERS = 1, MAC_FULL = 2 };
/* Payloads up to this size are hashed before they are sent (their tag goes
 * out with them); larger ones as they are sent, while still in cache. */
#define TAG_FIRST_BYTES (64 * 1024)

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
    loom_hmac_key_t tx_key, rx_key;
    uint64_t tx_seq, rx_seq;
    /* send: slice idx of sx */
    tcp_xfer_t *sx;
    uint8_t shdr[LOOM_FRAME_BYTES + LOOM_MAC_BYTES];
    size_t shdr_len, shdr_off;
    int shdr_ready;
    uint64_t shdr_seq;
    loom_hmac_t tx_mac;
    uint8_t stag[LOOM_MAC_BYTES];
    size_t stag_off;
    int stag_ready;
    /* receive: slice idx of rx */
    tcp_xfer_t *rx;
    uint8_t rhdr[LOOM_FRAME_BYTES + LOOM_MAC_BYTES];
    size_t rhdr_have;
    int rhdr_done;
    loom_hmac_t rx_mac;
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
    /* LOOM_AUTH_KEY: this connection's keys, one per direction, and counters */
    int mac;            /* MAC_NONE, MAC_HEADERS or MAC_FULL */
    loom_hmac_key_t tx_key, rx_key;
    uint64_t tx_seq, rx_seq;
    /* send side */
    loom_req_queue_t sq;
    uint8_t shdr[LOOM_FRAME_BYTES + LOOM_MAC_BYTES];
    size_t shdr_len;    /* header, and its tag when sealed */
    int shdr_ready;
    size_t shdr_off;
    uint64_t shdr_seq;
    loom_hmac_t tx_mac; /* over the payload sent so far (MAC_FULL) */
    size_t tx_hashed;
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
    loom_hmac_t rx_mac;  /* over the payload received so far (MAC_FULL) */
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
    int mac_mode;                  /* with a key: MAC_FULL or MAC_HEADERS */
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
    _Atomic int owner;             /* 1: a thread is in isend/irecv/progress, 2: abort */
};

/* What epoll tells us for each socket: its rank and stream (0: the wake fd). */
#define EV_KEY(rank, stream) ((((uint64_t)(rank) + 1) << 8) | (uint64_t)(stream))

#define tp_fail(tp, st, ...) loom_tp_fail(&(tp)->failed, (tp)->err, "tcp", (tp)->rank, st, __VA_ARGS__)

/* ---- addresses ------------------------------------------------------------ */

static int format_addr(const struct sockaddr *sa, char *out, size_t outlen)
{
    char host[INET6_ADDRSTRLEN];
    int port;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        port = ntohs(in->sin_port);
        return snprintf(out, outlen, "%s:%d", host, port) < (int)outlen ? 0 : -1;
    }
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
    if (in6->sin6_scope_id) {
        char ifname[IF_NAMESIZE] = "";
        if_indextoname(in6->sin6_scope_id, ifname);
        return snprintf(out, outlen, "[%s%%%s]:%d", host, ifname, port) < (int)outlen ? 0 : -1;
    }
    return snprintf(out, outlen, "[%s]:%d", host, port) < (int)outlen ? 0 : -1;
}

/* "1.2.3.4:5" or "[::1]:5" (an IPv6 scope may follow '%') into a sockaddr. */
static int parse_addr(const char *text, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[256];
    const char *port;
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (!close || close[1] != ':' || (size_t)(close - text - 1) >= sizeof(host))
            return -1;
        memcpy(host, text + 1, (size_t)(close - text - 1));
        host[close - text - 1] = '\0';
        port = close + 2;
    } else {
        const char *colon = strrchr(text, ':');
        if (!colon || (size_t)(colon - text) >= sizeof(host))
            return -1;
        memcpy(host, text, (size_t)(colon - text));
        host[colon - text] = '\0';
        port = colon + 1;
    }
    return loom_tp_numeric_addr(host, port, ss, len);
}

/* ---- create --------------------------------------------------------------- */

static loom_status_t tcp_create(const loom_tp_params_t *p, char *addr, size_t addrlen,
                                loom_tp_t **tp_p)
{
    loom_status_t st;
    loom_tp_t *tp = calloc(1, sizeof(*tp));
    if (!tp)
        return loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
    tp->rank = p->rank;
    tp->size = p->size;
    tp->job_hash = p->job_hash;
    tp->comm_hash = p->comm_hash;
    tp->sockbuf = p->sockbuf;
    tp->early_max = (size_t)1 << 30;
    tp->nstreams = 1;
    if (p->settings) {
        tp->early_max = p->settings->early_max_bytes;
        if (p->settings->sockets_per_peer > 1 && p->settings->sockets_per_peer <= LOOM_MAX_STREAMS) {
            tp->nstreams = p->settings->sockets_per_peer;
            tp->stripe_min = p->settings->stripe_min_bytes ? p->settings->stripe_min_bytes : 1;
        }
        if (p->settings->auth_keylen > 0) {
            tp->auth_key = p->settings->auth_key;
            tp->auth_keylen = p->settings->auth_keylen;
            tp->mac_mode = p->settings->auth_mac_headers_only ? MAC_HEADERS : MAC_FULL;
        }
    }
    tp->err = p->err;
    tp->listen_fd = tp->epfd = tp->wake_fd = -1;
    tp->peers = calloc((size_t)p->size, sizeof(tcp_peer_t));
    if (!tp->peers) {
        st = loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
        goto err_free_tp;
    }
    for (int i = 0; i < p->size; i++) {
        tp->peers[i].fd = -1;
        tp->peers[i].rank = i;
        if (tp->nstreams > 1 && i != p->rank) {
            tp->peers[i].lanes = calloc((size_t)tp->nstreams - 1, sizeof(tcp_lane_t));
            if (!tp->peers[i].lanes) {
                st = loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
                goto err_free_peers;
            }
            for (int k = 1; k < tp->nstreams; k++) {
                tp->peers[i].lanes[k - 1].fd = -1;
                tp->peers[i].lanes[k - 1].idx = k;
            }
        }
    }

    char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
    if ((st = loom_tp_choose_host(p, host, sizeof(host))) != LOOM_SUCCESS)
        goto err_free_peers;
    struct sockaddr_storage ss;
    socklen_t sslen;
    st = loom_hs_listen(host, tp->sockbuf, &tp->listen_fd, &ss, &sslen, p->err, "");
    if (st != LOOM_SUCCESS)
        goto err_free_peers;
    if (format_addr((struct sockaddr *)&ss, addr, addrlen) != 0 ||
        strlen(addr) >= sizeof(tp->my_addr)) {
        st = loom_err_set(p->err, LOOM_ERR_INTERNAL, "address buffer too small");
        goto err_close_listen;
    }
    snprintf(tp->my_addr, sizeof(tp->my_addr), "%s", addr);
    tp->epfd = epoll_create1(EPOLL_CLOEXEC);
    tp->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (tp->epfd < 0 || tp->wake_fd < 0) {
        st = loom_err_set(p->err, LOOM_ERR_TRANSPORT, "epoll/eventfd: %s", strerror(errno));
        goto err_close_ep;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
    epoll_ctl(tp->epfd, EPOLL_CTL_ADD, tp->wake_fd, &ev);
    LOOM_INFO("tcp", "rank %d listens on %s", tp->rank, addr);
    *tp_p = tp;
    return LOOM_SUCCESS;

err_close_ep:
    if (tp->epfd >= 0)
        close(tp->epfd);
    if (tp->wake_fd >= 0)
        close(tp->wake_fd);
err_close_listen:
    close(tp->listen_fd);
err_free_peers:
    for (int i = 0; i < p->size; i++)
        free(tp->peers[i].lanes);
    free(tp->peers);
err_free_tp:
    free(tp);
    return st;
}

/* ---- connect: every pair at once, one state machine per socket ------------ */

/* The socket of stream k (0: the one every frame is matched on) to rank j. */
static int *stream_fd(loom_tp_t *tp, int j, int k)
{
    return k == 0 ? &tp->peers[j].fd : &tp->peers[j].lanes[k - 1].fd;
}

static int peer_connected(loom_tp_t *tp, int j)
{
    for (int k = 0; k < tp->nstreams; k++)
        if (*stream_fd(tp, j, k) < 0)
            return 0;
    return 1;
}

/* Both ends proved the key: every frame from now on is sealed. Each stream
 * has keys of its own (its own nonces), so no frame of one stream passes for
 * another's. */
static void session_start(const loom_tp_t *tp, tcp_peer_t *peer, const loom_hs_conn_t *c,
                          int connector)
{
    uint8_t c2a[32], a2c[32];
    tcp_lane_t *lane = c->stream ? &peer->lanes[c->stream - 1] : NULL;
    loom_session_keys(tp->auth_key, tp->auth_keylen, c->nonce_c, c->nonce_a, c->bind, c2a, a2c);
    loom_hmac_key_init(lane ? &lane->tx_key : &peer->tx_key, connector ? c2a : a2c, sizeof(c2a));
    loom_hmac_key_init(lane ? &lane->rx_key : &peer->rx_key, connector ? a2c : c2a, sizeof(c2a));
    if (lane) {
        lane->mac = tp->mac_mode;
        lane->tx_seq = lane->rx_seq = 0;
    } else {
        peer->mac = tp->mac_mode;
        peer->tx_seq = peer->rx_seq = 0;
    }
    explicit_bzero(c2a, sizeof(c2a));
    explicit_bzero(a2c, sizeof(a2c));
}

/* One connect: who we are to the hello handshake, and why we last refused a
 * connection that looked like one of ours (for the timeout's message). */
typedef struct tcp_hs {
    loom_tp_t *tp;
    loom_hs_self_t self;
    loom_ack_code_t refused;
} tcp_hs_t;

static int hs_taken(void *arg, int rank, int stream)
{
    return *stream_fd(arg, rank, stream) >= 0;
}

/* The step of one connection (tp_handshake.h); an established one hands its
 * socket to its peer's stream. */
static int hs_step(void *arg, loom_hs_table_t *t, loom_hs_conn_t *c, double now)
{
    tcp_hs_t *h = arg;
    loom_tp_t *tp = h->tp;
    int up = 0;
    (void)t;
    if (loom_hs_hello_step(&h->self, c, now, &up, &h->refused) != LOOM_SUCCESS || !up)
        return 0;
    if (tp->auth_key)
        session_start(tp, &tp->peers[c->peer], c, !c->accepted);
    *stream_fd(tp, c->peer, c->stream) = c->fd;
    c->fd = -1;
    return 1;
}

static void hs_drop(void *arg, loom_hs_conn_t *c)
{
    (void)arg;
    loom_hs_close(c);
}

static void hs_timed_out(void *arg, loom_hs_table_t *t)
{
    tcp_hs_t *h = arg;
    loom_tp_t *tp = h->tp;
    char missing[256] = "";
    size_t off = 0;
    for (int j = 0; j < tp->size && off < sizeof(missing) - 16; j++)
        if (j != tp->rank && t->addrs[j] != NULL && !peer_connected(tp, j))
            off += (size_t)snprintf(missing + off, sizeof(missing) - off, "%s%d", off ? "," : "",
                                    j);
    loom_ack_code_t r = h->refused;
    loom_status_t st = r == LOOM_ACK_OK ? LOOM_ERR_TIMEOUT
                       : r == LOOM_ACK_STREAMS ? LOOM_ERR_INVALID_ARG : LOOM_ERR_AUTH;
    tp_fail(tp, st, "rank %d timed out after %.1f s connecting to rank(s) %s%s%s%s", tp->rank,
            t->timeout_s, missing,
            r ? " (it refused a connection: " : "", r ? loom_ack_reason(r) : "", r ? ")" : "");
}

/* The connected sockets join the epoll set; each peer gets its staging buffer. */
static loom_status_t register_peers(loom_tp_t *tp, char *const *addrs)
{
    for (int j = 0; j < tp->size; j++) {
        tcp_peer_t *peer = &tp->peers[j];
        if (j == tp->rank || addrs[j] == NULL)
            continue;
        loom_hs_sock_opts(peer->fd, 0);
        peer->stage = malloc(STAGE_BYTES);
        if (!peer->stage)
            return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = EV_KEY(j, 0)};
        if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, peer->fd, &ev) != 0)
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "epoll_ctl: %s", strerror(errno));
        for (int k = 1; k < tp->nstreams; k++) {
            tcp_lane_t *lane = &peer->lanes[k - 1];
            loom_hs_sock_opts(lane->fd, 0);
            /* Read only once stream 0 says where its bytes go (lane_events). */
            lane->events = EPOLLRDHUP;
            struct epoll_event lev = {.events = lane->events, .data.u64 = EV_KEY(j, k)};
            if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, lane->fd, &lev) != 0)
                return tp_fail(tp, LOOM_ERR_TRANSPORT, "epoll_ctl: %s", strerror(errno));
        }
    }
    return LOOM_SUCCESS;
}

static loom_status_t tcp_connect(loom_tp_t *tp, char *const *addrs, double timeout_s)
{
    static const loom_hs_ops_t ops = {.step = hs_step, .drop = hs_drop,
                                      .timed_out = hs_timed_out};
    /* Rank r dials every lower rank and accepts every higher one; a NULL
     * address is a peer another transport serves. Every pair has nstreams
     * connections, dialled by the same rank. */
    int nout = 0, nin = 0, nstreams = tp->nstreams;
    for (int j = 0; j < tp->size; j++)
        if (j != tp->rank && addrs[j] != NULL)
            *(j < tp->rank ? &nout : &nin) += 1;
    tcp_hs_t h = {.tp = tp,
                  .self = {.rank = tp->rank, .size = tp->size, .job_hash = tp->job_hash,
                           .comm_hash = tp->comm_hash, .key = tp->auth_key,
                           .keylen = tp->auth_keylen, .mac_headers = tp->mac_mode == MAC_HEADERS,
                           .nstreams = nstreams, .my_addr = tp->my_addr, .addrs = addrs,
                           .taken = hs_taken, .arg = tp, .failed = &tp->failed, .err = tp->err,
                           .subsys = "tcp"}};
    loom_hs_table_t t;
    loom_hs_params_t hp = {
        .rank = tp->rank, .ndial = nout * nstreams, .naccept = nin * nstreams,
        .timeout_s = timeout_s, .failed = &tp->failed, .err = tp->err, .subsys = "tcp",
        .prefix = "", .addrs = addrs, .listen_fd = tp->listen_fd, .sockbuf = tp->sockbuf,
        .accept_step = LOOM_HS_WAIT_HELLO, .accept_need = LOOM_HELLO_BYTES};
    if (loom_hs_table_init(&t, &hp) != 0)
        goto out;
    for (int j = 0; j < tp->rank; j++) {
        if (addrs[j] == NULL)
            continue;
        if (parse_addr(addrs[j], &t.ss[j], &t.sslen[j]) != 0) {
            tp_fail(tp, LOOM_ERR_INVALID_ARG, "rank %d published a bad address \"%s\"", j,
                    addrs[j]);
            goto out;
        }
        for (int k = 0; k < nstreams; k++)
            if (loom_hs_table_dial(&t, j, k, &t.ss[j], t.sslen[j]) != 0)
                goto out;
    }
    if (loom_hs_run(&t, &ops, &h) != LOOM_SUCCESS)
        goto out;
    if (register_peers(tp, addrs) != LOOM_SUCCESS)
        goto out;
    LOOM_INFO("tcp", "rank %d connected to %d peers, %d stream%s each", tp->rank, nout + nin,
              nstreams, nstreams > 1 ? "s" : "");
out:
    loom_hs_table_free(&t);
    close(tp->listen_fd);
    tp->listen_fd = -1;
    return tp->failed;
}

/* ---- sending -------------------------------------------------------------- */

static void update_events(loom_tp_t *tp, tcp_peer_t *peer)
{
    struct epoll_event ev = {.events = (peer->held ? 0 : EPOLLIN) | (peer->epollout ? EPOLLOUT : 0),
                             .data.u64 = EV_KEY(peer->rank, 0)};
    epoll_ctl(tp->epfd, EPOLL_CTL_MOD, peer->fd, &ev);
}

/* A lane reads only while the slice it expects next has somewhere to go
 * (bytes it cannot place stay in the socket, and TCP's window makes the
 * sender wait); while it reads nothing, a shut stream is seen by RDHUP. */
static void lane_events(loom_tp_t *tp, tcp_peer_t *peer, tcp_lane_t *lane)
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

static void want_out(loom_tp_t *tp, tcp_peer_t *peer, int on)
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
static void set_held(loom_tp_t *tp, tcp_peer_t *peer, int held)
{
    if (peer->held == held)
        return;
    peer->held = held;
    update_events(tp, peer);
}

/* Encode f into out with its header tag when the connection is sealed; the
 * length on the wire. The frame takes the next sequence number. */
static size_t seal_header_with(int mac, const loom_hmac_key_t *key, uint64_t *tx_seq,
                               const loom_frame_t *f, uint8_t *out, uint64_t *seq_p)
{
    loom_frame_encode(f, out);
    if (mac == MAC_NONE)
        return LOOM_FRAME_BYTES;
    *seq_p = (*tx_seq)++;
    loom_frame_tag_header(key, *seq_p, out, out + LOOM_FRAME_BYTES);
    return LOOM_FRAME_BYTES + LOOM_MAC_BYTES;
}

static size_t seal_header(tcp_peer_t *peer, const loom_frame_t *f, uint8_t *out, uint64_t *seq_p)
{
    return seal_header_with(peer->mac, &peer->tx_key, &peer->tx_seq, f, out, seq_p);
}

static int payload_sealed(const tcp_peer_t *peer, uint64_t len)
{
    return peer->mac == MAC_FULL && len > 0;
}

static void xfer_part_done(loom_tp_t *tp, tcp_peer_t *peer, tcp_xfer_t *x, int sending);
static loom_status_t lane_flush(loom_tp_t *tp, tcp_peer_t *peer, tcp_lane_t *lane, int *moved);

/* Queue x behind the striped messages of its direction; streams with none
 * in hand take it next. */
static void xfer_queue(loom_tp_t *tp, tcp_peer_t *peer, tcp_xfer_t *x, int sending)
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
    xfer_queue(tp, peer, x, 1);
    tp->nstriped_sent++;
    return x;
}

/* Write as much of the send queue as the socket takes. */
static loom_status_t flush_sends(loom_tp_t *tp, tcp_peer_t *peer, int *moved)
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
                    lane_flush(tp, peer, &peer->lanes[k - 1], moved);
                if (tp->failed)
                    return tp->failed;
            }
        }
        /* Stream 0 moves the first splen bytes: all of a plain frame, slice 0 of a striped one. */
        size_t plen = peer->splen;
        int sealed = payload_sealed(peer, plen);
        if (!peer->shdr_ready) {
            loom_frame_t f = {.kind = peer->s_x ? LOOM_FRAME_STRIPED : LOOM_FRAME_DATA,
                              .match = req->match, .len = req->len};
            peer->shdr_len = seal_header(peer, &f, peer->shdr, &peer->shdr_seq);
            peer->shdr_ready = 1;
            peer->shdr_off = 0;
            peer->stag_ready = 0;
            peer->stag_off = 0;
            if (sealed) {
                loom_frame_tag_payload_start(&peer->tx_mac, &peer->tx_key, peer->shdr_seq);
                peer->tx_hashed = req->off;   /* 0: a send starts at its beginning */
                if (plen <= TAG_FIRST_BYTES) {
                    /* Small: hashed now, so the tag leaves in the same segment as the
                     * payload instead of costing the receiver another wake-up. */
                    uint8_t full[LOOM_SHA256_BYTES];
                    loom_hmac_update(&peer->tx_mac, req->buf, plen);
                    loom_hmac_final(&peer->tx_mac, full);
                    memcpy(peer->stag, full, LOOM_MAC_BYTES);
                    peer->stag_ready = 1;
                    peer->tx_hashed = plen;
                }
            }
        }
        if (sealed && req->off == plen && !peer->stag_ready) {
            uint8_t full[LOOM_SHA256_BYTES];
            loom_hmac_final(&peer->tx_mac, full);
            memcpy(peer->stag, full, LOOM_MAC_BYTES);
            peer->stag_ready = 1;
        }
        struct iovec iov[3];
        int niov = 0;
        if (peer->shdr_off < peer->shdr_len)
            iov[niov++] = (struct iovec){peer->shdr + peer->shdr_off,
                                         peer->shdr_len - peer->shdr_off};
        if (req->off < plen)
            iov[niov++] = (struct iovec){(uint8_t *)req->buf + req->off, plen - req->off};
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
            return tp_fail(tp, LOOM_ERR_PEER_LOST, "lost the connection to rank %d: %s",
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
        if (sealed && req->off > peer->tx_hashed) {
            /* The bytes just sent, still in cache. */
            loom_hmac_update(&peer->tx_mac, (const uint8_t *)req->buf + peer->tx_hashed,
                             req->off - peer->tx_hashed);
            peer->tx_hashed = req->off;
        }
        if (peer->shdr_off == peer->shdr_len && req->off == plen &&
            (!sealed || peer->stag_off == LOOM_MAC_BYTES)) {
            loom_req_queue_pop(&peer->sq);
            peer->shdr_ready = 0;
            if (peer->s_x) {
                tcp_xfer_t *x = peer->s_x;
                peer->s_x = NULL;
                xfer_part_done(tp, peer, x, 1);
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
static void xfer_part_done(loom_tp_t *tp, tcp_peer_t *peer, tcp_xfer_t *x, int sending)
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

static loom_status_t lane_lost(loom_tp_t *tp, tcp_peer_t *peer, tcp_lane_t *lane,
                               const char *why)
{
    if (peer->gave_up)
        return loom_tp_fail_gave_up(&tp->failed, tp->err, "tcp", tp->rank, peer->rank);
    return tp_fail(tp, LOOM_ERR_PEER_LOST, "lost the connection to rank %d (stream %d of %d): %s",
                   peer->rank, lane->idx, tp->nstreams, why);
}

/* Write as much of this stream's slices as its socket takes. */
static loom_status_t lane_flush(loom_tp_t *tp, tcp_peer_t *peer, tcp_lane_t *lane, int *moved)
{
    while (lane->sx && !tp->failed) {
        if (lane->fd < 0)
            return lane_lost(tp, peer, lane, "it was closed with a slice still to send");
        tcp_xfer_t *x = lane->sx;
        uint64_t beg, n;
        loom_stripe_slice(x->frame.len, tp->nstreams, lane->idx, &beg, &n);
        const uint8_t *base = (const uint8_t *)x->req->buf + beg;
        size_t *off = &x->got[lane->idx];
        int sealed = lane->mac == MAC_FULL && n > 0;
        if (!lane->shdr_ready) {
            loom_frame_t f = {.kind = LOOM_FRAME_SLICE, .match = x->frame.match, .len = n};
            lane->shdr_len = seal_header_with(lane->mac, &lane->tx_key, &lane->tx_seq, &f,
                                              lane->shdr, &lane->shdr_seq);
            lane->shdr_ready = 1;
            lane->shdr_off = 0;
            lane->stag_off = sealed ? 0 : LOOM_MAC_BYTES;
            lane->stag_ready = 0;
            if (sealed)
                loom_frame_tag_payload_start(&lane->tx_mac, &lane->tx_key, lane->shdr_seq);
        }
        if (sealed && *off == n && !lane->stag_ready) {
            uint8_t full[LOOM_SHA256_BYTES];
            loom_hmac_final(&lane->tx_mac, full);
            memcpy(lane->stag, full, LOOM_MAC_BYTES);
            lane->stag_ready = 1;
        }
        struct iovec iov[3];
        int niov = 0;
        if (lane->shdr_off < lane->shdr_len)
            iov[niov++] = (struct iovec){lane->shdr + lane->shdr_off,
                                         lane->shdr_len - lane->shdr_off};
        if (*off < n)
            iov[niov++] = (struct iovec){(uint8_t *)base + *off, n - *off};
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
                return lane_lost(tp, peer, lane, strerror(errno));
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
                if (sealed)   /* the bytes just sent, still in cache */
                    loom_hmac_update(&lane->tx_mac, base + *off, p);
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
            xfer_part_done(tp, peer, x, 1);
        }
    }
    if (lane->out_blocked) {
        lane->out_blocked = 0;
        lane_events(tp, peer, lane);
    }
    return tp->failed;
}

static int tag_matches(const loom_tp_req_t *req, const loom_frame_t *f)
{
    return req->match.tag == f->match.tag;
}

static uint8_t *buf_get(loom_tp_t *tp, size_t len, size_t *cap_p)
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

static void buf_put(loom_tp_t *tp, uint8_t *buf, size_t cap)
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
static tcp_unexp_t *unexp_new(loom_tp_t *tp, const loom_frame_t *f, size_t first)
{
    tcp_unexp_t *u = loom_unexp_new(f);
    if (u)
        u->data = buf_get(tp, f->len < first ? f->len : first, &u->cap);
    if (!u || !u->data) {
        free(u);
        tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory holding a %llu-byte early message",
                (unsigned long long)f->len);
        return NULL;
    }
    return u;
}

/* The oldest receive posted for f's tag, unlinked; NULL when none is posted
 * or f does not fit it (then the instance has failed). */
#define rq_take(tp, peer, f) \
    loom_tp_match(&(peer)->rq, f, &(tp)->failed, (tp)->err, "tcp", (tp)->rank)

/* Room for a whole message to ourselves, from the pool as early messages are. */
static tcp_unexp_t *self_hold(loom_tp_t *tp, const loom_frame_t *f)
{
    tcp_unexp_t *u = unexp_new(tp, f, f->len);
    if (u)
        tp->peers[tp->rank].early_bytes += u->cap;
    return u;
}

static loom_status_t gave_up_fail(loom_tp_t *tp, const tcp_peer_t *peer)
{
    return loom_tp_fail_gave_up(&tp->failed, tp->err, "tcp", tp->rank, peer->rank);
}

static loom_status_t isend_owned(loom_tp_t *tp, loom_tp_req_t *req)
{
    if (tp->failed)
        return tp->failed;
    loom_req_start(req);
    tcp_peer_t *peer = &tp->peers[req->peer];
    if (req->peer == tp->rank)   /* matched in memory */
        return loom_tp_self_send(tp, &peer->rq, &peer->uq, req, &tp->failed, tp->err, "tcp",
                                 tp->rank, self_hold);
    if (peer->said_bye)
        return tp_fail(tp, LOOM_ERR_PEER_LOST,
                       "rank %d sends to rank %d, which has destroyed its communicator", tp->rank,
                       peer->rank);
    if (peer->gave_up)
        return gave_up_fail(tp, peer);
    int was_idle = peer->sq.head == NULL;
    loom_req_queue_push(&peer->sq, req);
    /* Start writing now: for small messages this is the whole send. */
    int moved = 0;
    return was_idle ? flush_sends(tp, peer, &moved) : LOOM_SUCCESS;
}

/* ---- receiving ------------------------------------------------------------ */

static void handle_read(loom_tp_t *tp, tcp_peer_t *peer, int *moved);

static loom_status_t irecv_owned(loom_tp_t *tp, loom_tp_req_t *req)
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
        buf_put(tp, u->data, u->cap);
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
        handle_read(tp, peer, &moved);
        return tp->failed;
    }
    if (peer->said_bye)
        return tp_fail(tp, LOOM_ERR_PEER_LOST,
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
            lane_lost(tp, peer, &peer->lanes[k - 1], "it was closed before a slice came");
            return NULL;
        }
    tcp_xfer_t *x = calloc(1, sizeof(*x));
    if (!x) {
        tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory receiving a striped message from rank %d",
                peer->rank);
        return NULL;
    }
    x->frame = *f;
    xfer_queue(tp, peer, x, 0);
    tp->nstriped_recv++;
    return x;
}

static loom_status_t start_frame(loom_tp_t *tp, tcp_peer_t *peer, const loom_frame_t *f)
{
    /* What it sent before still counts; an exchange with it from now on fails. */
    if (f->kind == LOOM_FRAME_GAVE_UP) {
        peer->gave_up = 1;
        /* A send it will never read waits for nothing, as a receive would. */
        return peer->rq.head || peer->rx_head || peer->sq.head || peer->sx_head
                   ? gave_up_fail(tp, peer) : LOOM_SUCCESS;
    }
    if (f->kind == LOOM_FRAME_SLICE || (f->kind == LOOM_FRAME_STRIPED && tp->nstreams < 2))
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "protocol error: rank %d sent a %s frame on its "
                       "first stream (%d stream%s per peer here)", peer->rank,
                       f->kind == LOOM_FRAME_SLICE ? "slice" : "striped", tp->nstreams,
                       tp->nstreams > 1 ? "s" : "");
    if (f->kind == LOOM_FRAME_BYE) {
        peer->said_bye = 1;
        if (peer->rq.head)
            return tp_fail(tp, LOOM_ERR_PEER_LOST,
                           "rank %d destroyed its communicator while rank %d still waits for a "
                           "message from it", peer->rank, tp->rank);
        /* Bytes of a send still unwritten will never be read. */
        if (peer->sq.head || peer->sx_head)
            return tp_fail(tp, LOOM_ERR_PEER_LOST,
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
        peer->cur_unexp = unexp_new(tp, f, EARLY_FIRST_BYTES);
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
        xfer_part_done(tp, peer, x, 0);
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
    return tp_fail(tp, LOOM_ERR_PEER_LOST,
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
        tp_fail(tp, LOOM_ERR_PEER_LOST, "lost the connection to rank %d: %s", peer->rank,
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

static void handle_read(loom_tp_t *tp, tcp_peer_t *peer, int *moved)
{
    size_t hdr_bytes = LOOM_FRAME_BYTES + (peer->mac ? LOOM_MAC_BYTES : 0);
    while (!tp->failed && peer->fd >= 0 && !peer->held) {
        size_t avail = peer->stage_end - peer->stage_beg;
        if (!peer->in_frame) {
            if (avail < hdr_bytes) {
                if (fill_stage(tp, peer, moved) <= 0)
                    return;
                continue;
            }
            const uint8_t *hdr = peer->stage + peer->stage_beg;
            if (peer->mac) {
                uint8_t want[LOOM_MAC_BYTES];
                peer->cur_seq = peer->rx_seq++;
                loom_frame_tag_header(&peer->rx_key, peer->cur_seq, hdr, want);
                if (!loom_equal_ct(want, hdr + LOOM_FRAME_BYTES, sizeof(want))) {
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
            if (payload_sealed(peer, f.len))
                loom_frame_tag_payload_start(&peer->rx_mac, &peer->rx_key, peer->cur_seq);
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
                if (fill_stage(tp, peer, moved) <= 0)
                    return;
                continue;
            }
            uint8_t full[LOOM_SHA256_BYTES];
            loom_hmac_final(&peer->rx_mac, full);
            if (!loom_equal_ct(full, peer->stage + peer->stage_beg, LOOM_MAC_BYTES)) {
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
        } else if (room >= DIRECT_READ_MIN) {
            ssize_t n = recv(peer->fd, dst + peer->cur_off, room, MSG_DONTWAIT);
            if (n > 0) {
                peer->cur_off += (size_t)n;
                *moved = 1;
            } else if (n == 0) {
                peer_eof(tp, peer);
                return;
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                return;
            } else if (errno != EINTR) {
                tp_fail(tp, LOOM_ERR_PEER_LOST, "lost the connection to rank %d: %s",
                        peer->rank, strerror(errno));
                return;
            }
        } else if (fill_stage(tp, peer, moved) <= 0) {
            return;
        }
        if (peer->cur_off > before && payload_sealed(peer, peer->cur_plen))
            loom_hmac_update(&peer->rx_mac, dst + before, peer->cur_off - before);
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
static void lane_read(loom_tp_t *tp, tcp_peer_t *peer, tcp_lane_t *lane, int *moved)
{
    size_t hdr_bytes = LOOM_FRAME_BYTES + (lane->mac ? LOOM_MAC_BYTES : 0);
    while (!tp->failed && lane->fd >= 0 && lane->rx && (lane->rx->req || lane->rx->unexp)) {
        tcp_xfer_t *x = lane->rx;
        uint64_t beg, n;
        loom_stripe_slice(x->frame.len, tp->nstreams, lane->idx, &beg, &n);
        size_t *got = &x->got[lane->idx];
        int sealed = lane->mac == MAC_FULL && n > 0;
        uint8_t *dst = NULL;
        size_t want = 0;
        if (!lane->rhdr_done) {
            dst = lane->rhdr + lane->rhdr_have;
            want = hdr_bytes - lane->rhdr_have;
        } else if (*got < n) {
            if (x->req) {
                dst = (uint8_t *)x->req->buf + beg + *got;
                want = (size_t)n - *got;
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
                lane_lost(tp, peer, lane, "it closed in the middle of a striped message");
                return;
            }
            if (r < 0) {
                if (errno == EINTR)
                    continue;
                if (errno != EAGAIN && errno != EWOULDBLOCK)
                    lane_lost(tp, peer, lane, strerror(errno));
                break;
            }
            *moved = 1;
            if (!lane->rhdr_done) {
                lane->rhdr_have += (size_t)r;
                if (lane->rhdr_have < hdr_bytes)
                    continue;
                uint64_t seq = 0;
                if (lane->mac) {
                    uint8_t tag[LOOM_MAC_BYTES];
                    seq = lane->rx_seq++;
                    loom_frame_tag_header(&lane->rx_key, seq, lane->rhdr, tag);
                    if (!loom_equal_ct(tag, lane->rhdr + LOOM_FRAME_BYTES, sizeof(tag))) {
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
                if (sealed)
                    loom_frame_tag_payload_start(&lane->rx_mac, &lane->rx_key, seq);
                continue;
            }
            if (*got < n) {
                if (sealed)
                    loom_hmac_update(&lane->rx_mac, dst, (size_t)r);
                *got += (size_t)r;
                x->moved += (size_t)r;
                continue;
            }
            lane->rtag_have += (size_t)r;
            if (lane->rtag_have < LOOM_MAC_BYTES)
                continue;
            uint8_t full[LOOM_SHA256_BYTES];
            loom_hmac_final(&lane->rx_mac, full);
            if (!loom_equal_ct(full, lane->rtag, LOOM_MAC_BYTES)) {
                mac_fail(tp, peer, lane->idx, "payload");
                return;
            }
        }
        /* The slice is in (and its tag matched): on to the next message's. */
        lane->rhdr_done = 0;
        lane->rhdr_have = 0;
        lane->rtag_have = 0;
        lane->rx = x->next;
        xfer_part_done(tp, peer, x, 0);
    }
    lane_events(tp, peer, lane);
}

/* A stream that carries nothing for us now was shut or reset. A peer shuts
 * its streams when it says goodbye or gives up, possibly right after the
 * last slices we have not read yet (stream 0 has not announced them): those
 * stay readable, and a stream that ends too early fails in lane_read. A
 * reset loses what was in flight: the peer is lost at once, unless it left
 * on purpose (then only a message that still needs the stream fails). */
static void lane_hangup(loom_tp_t *tp, tcp_peer_t *peer, tcp_lane_t *lane, uint32_t events)
{
    if (events & EPOLLERR) {
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        getsockopt(lane->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (!peer->said_bye && !peer->gave_up) {
            lane_lost(tp, peer, lane, soerr ? strerror(soerr) : "connection error");
            return;
        }
        epoll_ctl(tp->epfd, EPOLL_CTL_DEL, lane->fd, NULL);
        close(lane->fd);
        lane->fd = -1;
        return;
    }
    lane->eof = 1;
    lane_events(tp, peer, lane);
}

/* A failed instance tells its peers at once, so that none waits for it until
 * LOOM_TIMEOUT while this process lives on (a rank that found a mismatch, or
 * one busy rebuilding an elastic job): a gave-up frame where the stream is
 * between two frames, then the write side shut, which ends the peer's stream. */
static void announce_failure(loom_tp_t *tp)
{
    if (tp->announced)
        return;
    tp->announced = 1;
    uint8_t gave_up[LOOM_FRAME_BYTES + LOOM_MAC_BYTES];
    loom_frame_t f = {.kind = LOOM_FRAME_GAVE_UP};
    for (int j = 0; j < tp->size; j++) {
        tcp_peer_t *peer = &tp->peers[j];
        if (j == tp->rank)
            continue;
        /* Streams 1.. end after stream 0 said why, so a peer reading both
         * learns that we gave up rather than that a stream broke. */
        if (peer->fd < 0)
            goto shut_lanes;
        int between = !peer->shdr_ready || (peer->shdr_off == 0 && peer->sq.head->off == 0);
        if (!between)
            goto shut;
        /* A frame prepared but not started never goes out: this one takes its number. */
        if (peer->shdr_ready)
            peer->tx_seq = peer->shdr_seq;
        uint64_t seq;
        size_t len = seal_header(peer, &f, gave_up, &seq);
        if (send(peer->fd, gave_up, len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
            /* no room or gone: the shut write side says enough */
        }
shut:
        shutdown(peer->fd, SHUT_WR);
shut_lanes:
        for (int k = 1; k < tp->nstreams && peer->lanes; k++)
            if (peer->lanes[k - 1].fd >= 0)
                shutdown(peer->lanes[k - 1].fd, SHUT_WR);
    }
}

static loom_status_t progress_owned(loom_tp_t *tp, int timeout_ms, int *moved_p)
{
    int moved = 0;
    if (!tp->failed) {
        int why = atomic_load(&tp->abort_why);
        if (why)
            tp_fail(tp, (loom_status_t)why, "the communicator was aborted");
    }
    if (tp->failed) {
        *moved_p = 0;
        return tp->failed;
    }
    struct epoll_event evs[MAX_EVENTS];
    int n = epoll_wait(tp->epfd, evs, MAX_EVENTS, timeout_ms);
    for (int i = 0; i < n && !tp->failed; i++) {
        uint64_t key = evs[i].data.u64;
        if (key) {
            tcp_peer_t *peer = &tp->peers[(key >> 8) - 1];
            int k = (int)(key & 0xff);
            if (k > 0) {
                tcp_lane_t *lane = &peer->lanes[k - 1];
                uint32_t e = evs[i].events;
                if (lane->fd >= 0 && (e & EPOLLIN))
                    lane_read(tp, peer, lane, &moved);
                if (!tp->failed && lane->fd >= 0 && (e & EPOLLOUT))
                    lane_flush(tp, peer, lane, &moved);
                if (!tp->failed && lane->fd >= 0 && !(lane->events & EPOLLIN) &&
                    (e & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
                    lane_hangup(tp, peer, lane, e);
                continue;
            }
        }
        tcp_peer_t *peer = key ? &tp->peers[(key >> 8) - 1] : NULL;
        if (!peer) {
            uint64_t v;
            if (read(tp->wake_fd, &v, sizeof(v)) < 0) { /* nothing to drain */ }
            int why = atomic_load(&tp->abort_why);
            if (why)
                tp_fail(tp, (loom_status_t)why, "the communicator was aborted");
            continue;
        }
        if (peer->fd < 0)
            continue;
        if (peer->held && (evs[i].events & (EPOLLHUP | EPOLLERR))) {
            tp_fail(tp, LOOM_ERR_PEER_LOST, "lost the connection to rank %d", peer->rank);
            break;
        }
        if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
            handle_read(tp, peer, &moved);
        if (!tp->failed && peer->fd >= 0 && (evs[i].events & EPOLLOUT))
            flush_sends(tp, peer, &moved);
    }
    *moved_p = moved;
    return tp->failed;
}

/* Who may touch the sockets: see loom_tp_own. The owner tells the peers of a
 * failure on its way out. */
#define disown(tp, st) loom_tp_leave(&(tp)->owner, &(tp)->failed, announce_failure, tp, st)

static loom_status_t tcp_isend(loom_tp_t *tp, loom_tp_req_t *req)
{
    loom_tp_own(&tp->owner);
    return disown(tp, isend_owned(tp, req));
}

static loom_status_t tcp_irecv(loom_tp_t *tp, loom_tp_req_t *req)
{
    loom_tp_own(&tp->owner);
    return disown(tp, irecv_owned(tp, req));
}

/* Early messages, and the collective frame held in the socket (never a
 * user's: only collective frames are held). */
static int tcp_probe(loom_tp_t *tp, int rank, uint64_t tag)
{
    loom_tp_own(&tp->owner);
    const tcp_peer_t *peer = &tp->peers[rank];
    int found = (peer->held && peer->cur.match.tag == tag) || loom_unexp_probe(&peer->uq, tag);
    loom_tp_disown(&tp->owner);
    return found;
}

static loom_status_t tcp_progress(loom_tp_t *tp, int timeout_ms, int *moved_p)
{
    loom_tp_own(&tp->owner);
    return disown(tp, progress_owned(tp, timeout_ms, moved_p));
}

static void tcp_abort(loom_tp_t *tp, loom_status_t why)
{
    int expected = 0;
    atomic_compare_exchange_strong(&tp->abort_why, &expected, (int)why);
    uint64_t one = 1;
    if (write(tp->wake_fd, &one, sizeof(one)) < 0) { /* already signalled */ }
    /* Nobody progressing (the failed call has returned, or none runs): tell
     * the peers now; otherwise the owner does when it sees abort_why. */
    if (loom_tp_own_if_idle(&tp->owner)) {
        announce_failure(tp);
        loom_tp_disown(&tp->owner);
    }
}

/* Write all of buf within the deadline (used for the farewell only). */
static int send_all(int fd, const void *buf, size_t len, double deadline)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, (const uint8_t *)buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return -1;
        int ms = (int)((deadline - loom_now_s()) * 1000);
        if (ms <= 0)
            return -1;
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        poll(&pfd, 1, ms);
    }
    return 0;
}

static void tcp_destroy(loom_tp_t *tp, double timeout_s)
{
    LOOM_INFO("tcp", "rank %d received %llu frames, %llu before their receive was posted "
              "(%llu bytes copied once more)", tp->rank, (unsigned long long)tp->nframes,
              (unsigned long long)tp->nunexpected, (unsigned long long)tp->unexpected_bytes);
    if (tp->nstreams > 1)
        LOOM_INFO("tcp", "rank %d striped %llu messages it sent and %llu it received across %d "
                  "streams per peer", tp->rank, (unsigned long long)tp->nstriped_sent,
                  (unsigned long long)tp->nstriped_recv, tp->nstreams);
    double deadline = loom_now_s() + (timeout_s < 5 ? timeout_s : 5);
    if (tp->failed || atomic_load(&tp->abort_why))
        announce_failure(tp);
    for (int j = 0; j < tp->size; j++) {
        tcp_peer_t *peer = &tp->peers[j];
        if (peer->fd < 0)
            continue;
        if (!tp->announced && !peer->sq.head && !peer->sx_head) {
            /* (a failed instance has announced) */
            /* Say goodbye, so the peer can tell a finished rank from a dead one. */
            uint8_t bye[LOOM_FRAME_BYTES + LOOM_MAC_BYTES];
            loom_frame_t f = {.kind = LOOM_FRAME_BYE};
            uint64_t seq;
            size_t len = seal_header(peer, &f, bye, &seq);
            send_all(peer->fd, bye, len, deadline);
        }
        shutdown(peer->fd, SHUT_WR);
        close(peer->fd);
    }
    for (int j = 0; j < tp->size; j++)
        for (int k = 1; k < tp->nstreams && tp->peers[j].lanes; k++) {
            tcp_lane_t *lane = &tp->peers[j].lanes[k - 1];
            if (lane->fd >= 0) {
                shutdown(lane->fd, SHUT_WR);
                close(lane->fd);
            }
        }
    for (int j = 0; j < tp->size; j++) {
        tcp_peer_t *peer = &tp->peers[j];
        loom_unexp_free_all(&peer->uq);
        free(peer->stage);
        /* Requests a failed instance left pending are the caller's: only ours are freed. */
        for (tcp_xfer_t *x = peer->sx_head, *next; x; x = next) {
            next = x->next;
            free(x);
        }
        for (tcp_xfer_t *x = peer->rx_head, *next; x; x = next) {
            next = x->next;
            free(x);
        }
        free(peer->lanes);
    }
    for (int i = 0; i < POOL_SLOTS; i++)
        free(tp->pool[i].buf);
    if (tp->listen_fd >= 0)
        close(tp->listen_fd);
    close(tp->epfd);
    close(tp->wake_fd);
    free(tp->peers);
    free(tp);
}

const loom_transport_ops_t loom_tcp_transport = {
    .size = sizeof(loom_transport_ops_t),
    .name = "tcp",
    .create = tcp_create,
    .connect = tcp_connect,
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .probe = tcp_probe,
    .progress = tcp_progress,
    .mem_register = NULL,
    .mem_deregister = NULL,
    .abort = tcp_abort,
    .destroy = tcp_destroy,
};
