/*
 * tcp.c - the TCP transport: one non-blocking socket per peer, an epoll loop
 * driven by whoever waits (no progress thread), a versioned handshake, and
 * frames whose headers are checked before a byte lands in a user buffer.
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
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "settings.h"
#include "sha256.h"
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
/* Strangers get this long to finish a handshake (never more than a third of
 * LOOM_TIMEOUT), so idle connections cannot hold the table through connect. */
#define HS_STRANGER_S 3.0

enum { MAC_NONE = 0, MAC_HEADERS = 1, MAC_FULL = 2 };
/* Payloads up to this size are hashed before they are sent (their tag goes
 * out with them); larger ones as they are sent, while still in cache. */
#define TAG_FIRST_BYTES (64 * 1024)

typedef struct tcp_unexp {
    struct tcp_unexp *next;
    loom_frame_t frame;
    size_t got;
    int complete;
    uint8_t *data;
    size_t cap;
} tcp_unexp_t;

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
    tcp_unexp_t *uq_head, *uq_tail;
    size_t early_bytes;  /* held in uq buffers, at most tp->early_max */
} tcp_peer_t;

struct loom_tp {
    int rank, size;
    uint64_t job_hash, comm_hash;
    int sockbuf;
    const char *auth_key;          /* LOOM_AUTH_KEY, or NULL */
    size_t auth_keylen;
    int mac_mode;                  /* with a key: MAC_FULL or MAC_HEADERS */
    size_t early_max;              /* LOOM_EARLY_MAX_BYTES */
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

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define tp_fail(tp, st, ...) loom_tp_fail(&(tp)->failed, (tp)->err, "tcp", (tp)->rank, st, __VA_ARGS__)

static void set_sock_opts(int fd, int sockbuf)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (sockbuf > 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof(sockbuf));
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof(sockbuf));
    }
}

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
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
                             .ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(host, port, &hints, &res) != 0)
        return -1;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

/* The numeric host to listen on: the named interface, else the address that
 * reaches the store, else the first interface that is up and not loopback. */
static loom_status_t choose_host(const loom_tp_params_t *p, char *host, size_t hostlen)
{
    if (p->ifname && *p->ifname) {
        struct ifaddrs *ifs, *ifa;
        if (getifaddrs(&ifs) != 0)
            return loom_err_set(p->err, LOOM_ERR_TRANSPORT, "getifaddrs: %s", strerror(errno));
        const struct sockaddr *v4 = NULL, *v6 = NULL;
        for (ifa = ifs; ifa; ifa = ifa->ifa_next) {
            if (!ifa->ifa_addr || strcmp(ifa->ifa_name, p->ifname) != 0)
                continue;
            if (ifa->ifa_addr->sa_family == AF_INET && !v4)
                v4 = ifa->ifa_addr;
            if (ifa->ifa_addr->sa_family == AF_INET6 && !v6)
                v6 = ifa->ifa_addr;
        }
        const struct sockaddr *pick = v4 ? v4 : v6;
        int rc = -1;
        if (pick) {
            char buf[INET6_ADDRSTRLEN + 32];
            struct sockaddr_storage ss;
            memcpy(&ss, pick, pick->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                                         : sizeof(struct sockaddr_in6));
            ((struct sockaddr_in *)&ss)->sin_port = 0;
            rc = format_addr((struct sockaddr *)&ss, buf, sizeof(buf));
            /* Keep only the host part: strip ":0" and IPv6 brackets. */
            char *colon = strrchr(buf, ':');
            if (colon)
                *colon = '\0';
            const char *h = buf[0] == '[' ? buf + 1 : buf;
            size_t hl = strlen(h);
            if (buf[0] == '[' && hl > 0)
                hl--;
            if (hl < hostlen) {
                memcpy(host, h, hl);
                host[hl] = '\0';
            } else {
                rc = -1;
            }
        }
        freeifaddrs(ifs);
        if (rc != 0)
            return loom_err_set(p->err, LOOM_ERR_INVALID_ARG,
                                "LOOM_SOCKET_IFNAME=%s: no such interface with an IPv4 or IPv6 "
                                "address", p->ifname);
        return LOOM_SUCCESS;
    }
    if (p->bind_host && *p->bind_host) {
        snprintf(host, hostlen, "%s", p->bind_host);
        return LOOM_SUCCESS;
    }
    snprintf(host, hostlen, "127.0.0.1");
    /* Nothing says which interface the others reach (a file:// store) and
     * the launcher says they all run here: loopback, which no other machine
     * reaches. */
    if (p->settings && p->settings->single_node)
        return LOOM_SUCCESS;
    struct ifaddrs *ifs, *ifa;
    if (getifaddrs(&ifs) == 0) {
        for (ifa = ifs; ifa; ifa = ifa->ifa_next) {
            if (ifa->ifa_addr && ifa->ifa_addr->sa_family == AF_INET &&
                (ifa->ifa_flags & IFF_UP) && !(ifa->ifa_flags & IFF_LOOPBACK)) {
                inet_ntop(AF_INET, &((struct sockaddr_in *)ifa->ifa_addr)->sin_addr, host,
                          (socklen_t)hostlen);
                break;
            }
        }
        freeifaddrs(ifs);
    }
    return LOOM_SUCCESS;
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
    if (p->settings) {
        tp->early_max = p->settings->early_max_bytes;
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
    }

    char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
    if ((st = choose_host(p, host, sizeof(host))) != LOOM_SUCCESS)
        goto err_free_peers;
    struct sockaddr_storage ss;
    socklen_t sslen;
    char hostport[sizeof(host) + 16];
    snprintf(hostport, sizeof(hostport), strchr(host, ':') ? "[%s]:0" : "%s:0", host);
    if (parse_addr(hostport, &ss, &sslen) != 0) {
        st = loom_err_set(p->err, LOOM_ERR_INVALID_ARG, "cannot listen on \"%s\"", host);
        goto err_free_peers;
    }
    tp->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (tp->listen_fd < 0) {
        st = loom_err_set(p->err, LOOM_ERR_TRANSPORT, "socket: %s", strerror(errno));
        goto err_free_peers;
    }
    /* Accepted sockets inherit the buffer sizes, which must be set before the
     * handshake for the window scale to be negotiated. */
    set_sock_opts(tp->listen_fd, tp->sockbuf);
    if (bind(tp->listen_fd, (struct sockaddr *)&ss, sslen) != 0 ||
        listen(tp->listen_fd, SOMAXCONN) != 0) {
        st = loom_err_set(p->err, LOOM_ERR_TRANSPORT, "cannot listen on %s: %s", host,
                          strerror(errno));
        goto err_close_listen;
    }
    sslen = sizeof(ss);
    getsockname(tp->listen_fd, (struct sockaddr *)&ss, &sslen);
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
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
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
    free(tp->peers);
err_free_tp:
    free(tp);
    return st;
}

/* ---- connect: every pair at once, one state machine per socket ------------ */

/* Outgoing: CONNECTING -> SEND_HELLO -> WAIT_ACK (an ack, or with a key a
 * challenge, after which we send our proof) -> WAIT_FINAL_ACK -> DONE.
 * Incoming: WAIT_HELLO (with a key: the hello and the connector's nonce; we
 * answer with a challenge) -> WAIT_PROOF -> DONE, or DEAD when refused. */
typedef enum {
    HS_CONNECTING, HS_SEND_HELLO, HS_WAIT_ACK, HS_WAIT_FINAL_ACK, HS_WAIT_HELLO, HS_WAIT_PROOF,
    HS_DONE, HS_DEAD
} hs_state_t;

typedef struct hs_conn {
    int fd;
    int peer;            /* known for outgoing; from the hello for incoming */
    hs_state_t state;
    uint8_t buf[LOOM_CHAL_BYTES];
    size_t have, need;   /* bytes read of the message expected, and its size */
    uint8_t hello[LOOM_HELLO_BYTES];   /* as sent or received: both proofs cover it */
    uint8_t nonce_c[LOOM_NONCE_BYTES], nonce_a[LOOM_NONCE_BYTES];
    uint8_t bind[LOOM_BIND_BYTES];     /* both ends as published: both proofs cover it */
    double retry_at;     /* outgoing: when to try again after a refusal */
    double since;        /* incoming: when accepted (strangers get HS_STRANGER_S) */
    int pending;         /* incoming: bytes were read at accept, look at them */
} hs_conn_t;

/* Read toward c->need bytes: 1 when they are all there, 0 when more must
 * come, -1 when the peer closed or failed. */
static int hs_read(hs_conn_t *c)
{
    if (c->have == c->need)
        return 1;
    ssize_t n = recv(c->fd, c->buf + c->have, c->need - c->have, 0);
    if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR)))
        return -1;
    if (n > 0)
        c->have += (size_t)n;
    return c->have == c->need;
}

static int fresh_nonce(uint8_t out[LOOM_NONCE_BYTES])
{
    return getrandom(out, LOOM_NONCE_BYTES, 0) == LOOM_NONCE_BYTES ? 0 : -1;
}

/* Who the connection between connector and acceptor joins, as the store
 * published them (our own address as we published it). */
static void conn_bind(const loom_tp_t *tp, char *const *addrs, int connector, int acceptor,
                      uint8_t out[LOOM_BIND_BYTES])
{
    const char *ca = connector == tp->rank ? tp->my_addr : addrs[connector];
    const char *aa = acceptor == tp->rank ? tp->my_addr : addrs[acceptor];
    loom_auth_bind(tp->job_hash, tp->comm_hash, tp->size, connector, ca, strlen(ca), acceptor,
                   aa, strlen(aa), out);
}

/* Both ends proved the key: every frame from now on is sealed. */
static void session_start(const loom_tp_t *tp, tcp_peer_t *peer, const hs_conn_t *c,
                          int connector)
{
    uint8_t c2a[32], a2c[32];
    loom_session_keys(tp->auth_key, tp->auth_keylen, c->nonce_c, c->nonce_a, c->bind, c2a, a2c);
    loom_hmac_key_init(&peer->tx_key, connector ? c2a : a2c, sizeof(c2a));
    loom_hmac_key_init(&peer->rx_key, connector ? a2c : c2a, sizeof(c2a));
    peer->mac = tp->mac_mode;
    peer->tx_seq = peer->rx_seq = 0;
    explicit_bzero(c2a, sizeof(c2a));
    explicit_bzero(a2c, sizeof(a2c));
}

static uint32_t hello_auth_bits(const loom_tp_t *tp)
{
    if (!tp->auth_key)
        return 0;
    return LOOM_HELLO_AUTH | (tp->mac_mode == MAC_HEADERS ? LOOM_HELLO_MAC_HEADERS : 0);
}

/* An incoming connection to drop for a newcomer when the table is full: the
 * oldest that has said nothing, else the oldest still in its handshake. */
static int evict_stranger(hs_conn_t *conns, int from, int nconn)
{
    int victim = -1, silent = 0;
    for (int i = from; i < nconn; i++) {
        hs_conn_t *c = &conns[i];
        if (c->state != HS_WAIT_HELLO && c->state != HS_WAIT_PROOF)
            continue;
        int quiet = c->state == HS_WAIT_HELLO && c->have == 0;
        if (victim < 0 || (quiet && !silent) ||
            (quiet == silent && c->since < conns[victim].since)) {
            victim = i;
            silent = quiet;
        }
    }
    if (victim >= 0) {
        close(conns[victim].fd);
        conns[victim].fd = -1;
        conns[victim].state = HS_DEAD;
    }
    return victim;
}

static int start_connect(loom_tp_t *tp, hs_conn_t *c, const struct sockaddr_storage *ss,
                         socklen_t sslen)
{
    c->fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        return -1;
    set_sock_opts(c->fd, tp->sockbuf);
    c->have = 0;
    if (connect(c->fd, (const struct sockaddr *)ss, sslen) == 0)
        c->state = HS_SEND_HELLO;
    else if (errno == EINPROGRESS)
        c->state = HS_CONNECTING;
    else
        return -1;
    return 0;
}

static loom_status_t tcp_connect(loom_tp_t *tp, char *const *addrs, double timeout_s)
{
    /* Rank r dials every lower rank and accepts every higher one; a NULL
     * address is a peer another transport serves. */
    int nout = 0, nin = 0;
    for (int j = 0; j < tp->size; j++)
        if (j != tp->rank && addrs[j] != NULL)
            *(j < tp->rank ? &nout : &nin) += 1;
    int maxconn = nout + nin + 64;   /* room for strangers that connect too */
    hs_conn_t *conns = calloc((size_t)maxconn, sizeof(*conns));
    struct sockaddr_storage *peer_ss = calloc((size_t)(tp->rank ? tp->rank : 1), sizeof(*peer_ss));
    socklen_t *peer_sslen = calloc((size_t)(tp->rank ? tp->rank : 1), sizeof(socklen_t));
    struct pollfd *pfds = calloc((size_t)maxconn + 1, sizeof(*pfds));
    loom_status_t st = LOOM_SUCCESS;
    int nconn = 0, established = 0;
    /* Why we last refused a connection that looked like one of ours. */
    loom_ack_code_t refused = LOOM_ACK_OK;
    loom_status_t refused_st = LOOM_ERR_TIMEOUT;
    double deadline = monotonic_s() + timeout_s;
    if (!conns || !peer_ss || !peer_sslen || !pfds) {
        st = loom_err_set(tp->err, LOOM_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    for (int j = 0; j < tp->rank; j++) {
        if (addrs[j] == NULL)
            continue;
        if (parse_addr(addrs[j], &peer_ss[j], &peer_sslen[j]) != 0) {
            st = loom_err_set(tp->err, LOOM_ERR_INVALID_ARG, "rank %d published a bad address "
                              "\"%s\"", j, addrs[j]);
            goto out;
        }
        conns[nconn].peer = j;
        conn_bind(tp, addrs, tp->rank, j, conns[nconn].bind);
        if (start_connect(tp, &conns[nconn], &peer_ss[j], peer_sslen[j]) != 0) {
            st = loom_err_set(tp->err, LOOM_ERR_TRANSPORT, "cannot connect to rank %d at %s: %s",
                              j, addrs[j], strerror(errno));
            goto out;
        }
        nconn++;
    }

    double stranger_s = timeout_s / 3 < HS_STRANGER_S ? timeout_s / 3 : HS_STRANGER_S;
    while (established < nout + nin) {
        double now = monotonic_s();
        for (int i = nout; i < nconn; i++)
            if ((conns[i].state == HS_WAIT_HELLO || conns[i].state == HS_WAIT_PROOF) &&
                now - conns[i].since > stranger_s) {
                LOOM_WARN("tcp", "rank %d dropped a connection that did not finish its handshake "
                          "within %.1f s", tp->rank, stranger_s);
                close(conns[i].fd);
                conns[i].fd = -1;
                conns[i].state = HS_DEAD;
            }
        if (now > deadline) {
            char missing[256] = "";
            size_t off = 0;
            for (int j = 0; j < tp->size && off < sizeof(missing) - 16; j++)
                if (j != tp->rank && addrs[j] != NULL && tp->peers[j].fd < 0)
                    off += (size_t)snprintf(missing + off, sizeof(missing) - off, "%s%d",
                                            off ? "," : "", j);
            st = loom_err_set(tp->err, refused ? refused_st : LOOM_ERR_TIMEOUT,
                              "rank %d timed out after %.1f s connecting to rank(s) %s%s%s%s",
                              tp->rank, timeout_s, missing,
                              refused ? " (it refused a connection: " : "",
                              refused ? loom_ack_reason(refused) : "", refused ? ")" : "");
            goto out;
        }
        int npfd = 0;
        pfds[npfd++] = (struct pollfd){.fd = nin > 0 ? tp->listen_fd : -1, .events = POLLIN};
        for (int i = 0; i < nconn; i++) {
            hs_conn_t *c = &conns[i];
            short events = 0;
            if (c->state == HS_CONNECTING || c->state == HS_SEND_HELLO)
                events = POLLOUT;
            else if (c->state == HS_WAIT_ACK || c->state == HS_WAIT_HELLO ||
                     c->state == HS_WAIT_FINAL_ACK || c->state == HS_WAIT_PROOF)
                events = POLLIN;
            if (c->fd >= 0 && c->retry_at > now)
                events = 0;
            pfds[npfd++] = (struct pollfd){.fd = events ? c->fd : -1, .events = events};
        }
        int wait_ms = (int)((deadline - now) * 1000) + 1;
        if (wait_ms > 20)
            wait_ms = 20;  /* refused dials are retried on this tick */
        if (poll(pfds, (nfds_t)npfd, wait_ms) < 0 && errno != EINTR) {
            st = loom_err_set(tp->err, LOOM_ERR_TRANSPORT, "poll: %s", strerror(errno));
            goto out;
        }
        now = monotonic_s();
        for (int i = 0; i < nconn; i++) {
            hs_conn_t *c = &conns[i];
            short re = pfds[i + 1].revents;
            if (c->state == HS_CONNECTING && c->retry_at > 0 && c->retry_at <= now) {
                c->retry_at = 0;
                if (start_connect(tp, c, &peer_ss[c->peer], peer_sslen[c->peer]) != 0) {
                    st = loom_err_set(tp->err, LOOM_ERR_TRANSPORT,
                                      "cannot connect to rank %d at %s: %s", c->peer,
                                      addrs[c->peer], strerror(errno));
                    goto out;
                }
                continue;
            }
            if (c->pending) {
                c->pending = 0;
                re |= POLLIN;
            }
            if (!re)
                continue;
            if (c->state == HS_CONNECTING) {
                int soerr = 0;
                socklen_t sl = sizeof(soerr);
                getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
                if (soerr == ECONNREFUSED || soerr == ETIMEDOUT || soerr == EHOSTUNREACH) {
                    /* The peer's backlog may be full: try again shortly. */
                    close(c->fd);
                    c->fd = -1;
                    c->retry_at = now + 0.01;
                    continue;
                }
                if (soerr != 0) {
                    st = loom_err_set(tp->err, LOOM_ERR_TRANSPORT,
                                      "cannot connect to rank %d at %s: %s", c->peer,
                                      addrs[c->peer], strerror(soerr));
                    goto out;
                }
                c->state = HS_SEND_HELLO;
            }
            if (c->state == HS_SEND_HELLO) {
                loom_hello_t h = {LOOM_WIRE_VERSION, (uint32_t)tp->rank, (uint32_t)tp->size,
                                  hello_auth_bits(tp), tp->job_hash, tp->comm_hash};
                uint8_t msg[LOOM_HELLO_BYTES + LOOM_NONCE_BYTES];
                loom_hello_encode(&h, c->hello);
                memcpy(msg, c->hello, LOOM_HELLO_BYTES);
                size_t len = LOOM_HELLO_BYTES;
                if (tp->auth_key) {
                    if (fresh_nonce(c->nonce_c) != 0) {
                        st = loom_err_set(tp->err, LOOM_ERR_INTERNAL, "getrandom: %s",
                                          strerror(errno));
                        goto out;
                    }
                    memcpy(msg + len, c->nonce_c, LOOM_NONCE_BYTES);
                    len += LOOM_NONCE_BYTES;
                }
                /* 56 bytes always fit in a fresh socket's buffer. */
                if (send(c->fd, msg, len, MSG_NOSIGNAL) != (ssize_t)len) {
                    st = loom_err_set(tp->err, LOOM_ERR_TRANSPORT, "handshake with rank %d: %s",
                                      c->peer, strerror(errno));
                    goto out;
                }
                c->state = HS_WAIT_ACK;
                c->have = 0;
                c->need = LOOM_ACK_BYTES;   /* a challenge is longer: need grows below */
                continue;
            }
            if (c->state == HS_WAIT_ACK || c->state == HS_WAIT_FINAL_ACK) {
                int got = hs_read(c);
                if (got < 0 && c->have == 0) {
                    /* Closed before a word: the acceptor sheds strangers when its table
                     * is full, and cannot tell us from them yet. Dial again. */
                    close(c->fd);
                    c->fd = -1;
                    c->state = HS_CONNECTING;
                    c->retry_at = now + 0.05;
                    continue;
                }
                if (got < 0) {
                    st = loom_err_set(tp->err, LOOM_ERR_PEER_LOST,
                                      "rank %d closed the connection during the handshake",
                                      c->peer);
                    goto out;
                }
                if (c->state == HS_WAIT_ACK && c->have >= 8 &&
                    memcmp(c->buf, LOOM_CHAL_MAGIC, 8) == 0)
                    c->need = LOOM_CHAL_BYTES;
                if (c->have < c->need)
                    continue;
                if (c->need == LOOM_CHAL_BYTES) {
                    uint8_t theirs[32], want[32], mine[32], msg[LOOM_PROOF_BYTES];
                    if (!tp->auth_key) {
                        st = loom_err_set(tp->err, LOOM_ERR_AUTH,
                                          "rank %d requires LOOM_AUTH_KEY, which rank %d does "
                                          "not have", c->peer, tp->rank);
                        goto out;
                    }
                    loom_chal_decode(c->buf, c->nonce_a, theirs);
                    loom_auth_proof(tp->auth_key, tp->auth_keylen, 'A', c->hello, c->nonce_c,
                                    c->nonce_a, c->bind, want);
                    if (!loom_equal_ct(theirs, want, sizeof(want))) {
                        st = loom_err_set(tp->err, LOOM_ERR_AUTH,
                                          "the process at %s (rank %d) cannot prove "
                                          "LOOM_AUTH_KEY for this connection: a different key, "
                                          "or a relay (the address rank %d published is not "
                                          "the one it listens on)", addrs[c->peer], c->peer,
                                          c->peer);
                        goto out;
                    }
                    loom_auth_proof(tp->auth_key, tp->auth_keylen, 'C', c->hello, c->nonce_c,
                                    c->nonce_a, c->bind, mine);
                    loom_proof_encode(mine, msg);
                    if (send(c->fd, msg, sizeof(msg), MSG_NOSIGNAL) != (ssize_t)sizeof(msg)) {
                        st = loom_err_set(tp->err, LOOM_ERR_TRANSPORT,
                                          "handshake with rank %d: %s", c->peer, strerror(errno));
                        goto out;
                    }
                    c->state = HS_WAIT_FINAL_ACK;
                    c->have = 0;
                    c->need = LOOM_ACK_BYTES;
                    continue;
                }
                loom_ack_code_t code;
                uint32_t who;
                if (loom_ack_decode(c->buf, &code, &who) != 0 || who != (uint32_t)c->peer) {
                    st = loom_err_set(tp->err, LOOM_ERR_AUTH,
                                      "the process at %s is not rank %d of this job", addrs[c->peer],
                                      c->peer);
                    goto out;
                }
                if (code == LOOM_ACK_OK && tp->auth_key && c->state == HS_WAIT_ACK)
                    code = LOOM_ACK_AUTH;   /* accepted without proving the key */
                if (code != LOOM_ACK_OK) {
                    st = loom_err_set(tp->err, LOOM_ERR_AUTH,
                                      "rank %d refused the connection of rank %d: %s", c->peer,
                                      tp->rank, loom_ack_reason(code));
                    goto out;
                }
                if (tp->auth_key)
                    session_start(tp, &tp->peers[c->peer], c, 1);
                tp->peers[c->peer].fd = c->fd;
                c->fd = -1;
                c->state = HS_DONE;
                established++;
                continue;
            }
            if (c->state == HS_WAIT_HELLO || c->state == HS_WAIT_PROOF) {
                int got = hs_read(c);
                if (got < 0) {
                    if (c->state == HS_WAIT_PROOF) {
                        /* It hung up on our challenge: it does not trust our key. */
                        refused = LOOM_ACK_AUTH;
                        refused_st = LOOM_ERR_AUTH;
                    }
                    close(c->fd);
                    c->fd = -1;
                    c->state = HS_DEAD;
                    continue;
                }
                if (!got)
                    continue;
                loom_ack_code_t code = LOOM_ACK_OK;
                loom_hello_t h;
                if (c->state == HS_WAIT_HELLO) {
                    code = loom_hello_decode(c->buf, tp->job_hash, tp->comm_hash, tp->rank,
                                             tp->size, &h);
                    int authed = code == LOOM_ACK_OK && (h.stream & LOOM_HELLO_AUTH);
                    if (code == LOOM_ACK_OK &&
                        (h.rank < (uint32_t)tp->rank || addrs[h.rank] == NULL))
                        code = LOOM_ACK_BAD_RANK;  /* lower ranks are dialled, never accepted */
                    if (code == LOOM_ACK_OK && tp->peers[h.rank].fd >= 0)
                        code = LOOM_ACK_DUPLICATE;
                    if (code == LOOM_ACK_OK && authed != (tp->auth_key != NULL))
                        code = LOOM_ACK_AUTH;
                    if (code == LOOM_ACK_OK && authed &&
                        (h.stream & LOOM_HELLO_MAC_HEADERS) != (hello_auth_bits(tp) &
                                                                 LOOM_HELLO_MAC_HEADERS))
                        code = LOOM_ACK_MAC_MODE;
                    if (code == LOOM_ACK_OK && authed && c->need == LOOM_HELLO_BYTES) {
                        c->need += LOOM_NONCE_BYTES;   /* the connector's nonce follows */
                        continue;
                    }
                    if (code == LOOM_ACK_OK && authed) {
                        uint8_t proof[32], msg[LOOM_CHAL_BYTES];
                        memcpy(c->hello, c->buf, LOOM_HELLO_BYTES);
                        memcpy(c->nonce_c, c->buf + LOOM_HELLO_BYTES, LOOM_NONCE_BYTES);
                        if (fresh_nonce(c->nonce_a) != 0) {
                            st = loom_err_set(tp->err, LOOM_ERR_INTERNAL, "getrandom: %s",
                                              strerror(errno));
                            goto out;
                        }
                        conn_bind(tp, addrs, (int)h.rank, tp->rank, c->bind);
                        loom_auth_proof(tp->auth_key, tp->auth_keylen, 'A', c->hello,
                                        c->nonce_c, c->nonce_a, c->bind, proof);
                        loom_chal_encode(c->nonce_a, proof, msg);
                        if (send(c->fd, msg, sizeof(msg), MSG_NOSIGNAL) != (ssize_t)sizeof(msg)) {
                            close(c->fd);
                            c->fd = -1;
                            c->state = HS_DEAD;
                            continue;
                        }
                        c->peer = (int)h.rank;
                        c->state = HS_WAIT_PROOF;
                        c->have = 0;
                        c->need = LOOM_PROOF_BYTES;
                        continue;
                    }
                    c->peer = (int)h.rank;
                } else {
                    uint8_t theirs[32], want[32];
                    loom_auth_proof(tp->auth_key, tp->auth_keylen, 'C', c->hello, c->nonce_c,
                                    c->nonce_a, c->bind, want);
                    if (loom_proof_decode(c->buf, theirs) != 0 ||
                        !loom_equal_ct(theirs, want, sizeof(want)))
                        code = LOOM_ACK_AUTH;
                    else if (tp->peers[c->peer].fd >= 0)
                        code = LOOM_ACK_DUPLICATE;
                }
                uint8_t ack[LOOM_ACK_BYTES];
                loom_ack_encode(code, (uint32_t)tp->rank, ack);
                ssize_t sent = send(c->fd, ack, sizeof(ack), MSG_NOSIGNAL);
                if (code != LOOM_ACK_OK || sent != (ssize_t)sizeof(ack)) {
                    /* A stranger or a confused process: refuse it, keep waiting for ours. */
                    LOOM_WARN("tcp", "rank %d refused a connection: %s", tp->rank,
                              loom_ack_reason(code));
                    if (code == LOOM_ACK_AUTH) {
                        refused = code;
                        refused_st = LOOM_ERR_AUTH;
                    }
                    close(c->fd);
                    c->fd = -1;
                    c->state = HS_DEAD;
                    continue;
                }
                if (tp->auth_key)
                    session_start(tp, &tp->peers[c->peer], c, 0);
                tp->peers[c->peer].fd = c->fd;
                c->fd = -1;
                c->state = HS_DONE;
                established++;
            }
        }
        if (pfds[0].revents & POLLIN) {
            for (;;) {
                int fd = accept4(tp->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0)
                    break;
                /* Reuse a dead slot so strangers cannot exhaust the table. */
                int slot = -1;
                for (int i = nout; i < nconn; i++)
                    if (conns[i].state == HS_DEAD || conns[i].state == HS_DONE) {
                        slot = i;
                        break;
                    }
                if (slot < 0 && nconn < maxconn)
                    slot = nconn++;
                if (slot < 0)
                    slot = evict_stranger(conns, nout, nconn);
                if (slot < 0) {
                    close(fd);
                    continue;
                }
                conns[slot] = (hs_conn_t){.fd = fd, .peer = -1, .state = HS_WAIT_HELLO,
                                          .need = LOOM_HELLO_BYTES, .since = monotonic_s()};
                /* An honest rank spoke as it connected: read it now, so that it is not
                 * the one evicted when a crowd of silent strangers follows. */
                if (hs_read(&conns[slot]) < 0) {
                    close(fd);
                    conns[slot].fd = -1;
                    conns[slot].state = HS_DEAD;
                } else if (conns[slot].have > 0) {
                    conns[slot].pending = 1;
                }
            }
        }
    }

    for (int j = 0; j < tp->size; j++) {
        tcp_peer_t *peer = &tp->peers[j];
        if (j == tp->rank || addrs[j] == NULL)
            continue;
        set_sock_opts(peer->fd, 0);
        peer->stage = malloc(STAGE_BYTES);
        if (!peer->stage) {
            st = loom_err_set(tp->err, LOOM_ERR_NO_MEMORY, "out of memory");
            goto out;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = peer};
        if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, peer->fd, &ev) != 0) {
            st = loom_err_set(tp->err, LOOM_ERR_TRANSPORT, "epoll_ctl: %s", strerror(errno));
            goto out;
        }
    }
    LOOM_INFO("tcp", "rank %d connected to %d peers", tp->rank, nout + nin);

out:
    if (conns)
        for (int i = 0; i < nconn; i++)
            if (conns[i].fd >= 0)
                close(conns[i].fd);
    close(tp->listen_fd);
    tp->listen_fd = -1;
    free(conns);
    free(peer_ss);
    free(peer_sslen);
    free(pfds);
    if (st != LOOM_SUCCESS)
        tp->failed = st;
    return st;
}

/* ---- sending -------------------------------------------------------------- */

static void update_events(loom_tp_t *tp, tcp_peer_t *peer)
{
    struct epoll_event ev = {.events = (peer->held ? 0 : EPOLLIN) | (peer->epollout ? EPOLLOUT : 0),
                             .data.ptr = peer};
    epoll_ctl(tp->epfd, EPOLL_CTL_MOD, peer->fd, &ev);
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
static size_t seal_header(tcp_peer_t *peer, const loom_frame_t *f, uint8_t *out, uint64_t *seq_p)
{
    loom_frame_encode(f, out);
    if (peer->mac == MAC_NONE)
        return LOOM_FRAME_BYTES;
    *seq_p = peer->tx_seq++;
    loom_frame_tag_header(&peer->tx_key, *seq_p, out, out + LOOM_FRAME_BYTES);
    return LOOM_FRAME_BYTES + LOOM_MAC_BYTES;
}

static int payload_sealed(const tcp_peer_t *peer, uint64_t len)
{
    return peer->mac == MAC_FULL && len > 0;
}

/* Write as much of the send queue as the socket takes. */
static loom_status_t flush_sends(loom_tp_t *tp, tcp_peer_t *peer, int *moved)
{
    while (peer->sq.head) {
        loom_tp_req_t *req = peer->sq.head;
        int sealed = payload_sealed(peer, req->len);
        if (!peer->shdr_ready) {
            loom_frame_t f = {.kind = LOOM_FRAME_DATA, .match = req->match, .len = req->len};
            peer->shdr_len = seal_header(peer, &f, peer->shdr, &peer->shdr_seq);
            peer->shdr_ready = 1;
            peer->shdr_off = 0;
            peer->stag_ready = 0;
            peer->stag_off = 0;
            if (sealed) {
                loom_frame_tag_payload_start(&peer->tx_mac, &peer->tx_key, peer->shdr_seq);
                peer->tx_hashed = req->off;   /* 0: a send starts at its beginning */
                if (req->len <= TAG_FIRST_BYTES) {
                    /* Small: hashed now, so the tag leaves in the same segment as the
                     * payload instead of costing the receiver another wake-up. */
                    uint8_t full[LOOM_SHA256_BYTES];
                    loom_hmac_update(&peer->tx_mac, req->buf, req->len);
                    loom_hmac_final(&peer->tx_mac, full);
                    memcpy(peer->stag, full, LOOM_MAC_BYTES);
                    peer->stag_ready = 1;
                    peer->tx_hashed = req->len;
                }
            }
        }
        if (sealed && req->off == req->len && !peer->stag_ready) {
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
        if (req->off < req->len)
            iov[niov++] = (struct iovec){(uint8_t *)req->buf + req->off, req->len - req->off};
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
        size_t p = req->len - req->off < left ? req->len - req->off : left;
        req->off += p;
        left -= p;
        peer->stag_off += left;
        if (sealed && req->off > peer->tx_hashed) {
            /* The bytes just sent, still in cache. */
            loom_hmac_update(&peer->tx_mac, (const uint8_t *)req->buf + peer->tx_hashed,
                             req->off - peer->tx_hashed);
            peer->tx_hashed = req->off;
        }
        if (peer->shdr_off == peer->shdr_len && req->off == req->len &&
            (!sealed || peer->stag_off == LOOM_MAC_BYTES)) {
            loom_req_queue_pop(&peer->sq);
            peer->shdr_ready = 0;
            req->status = LOOM_SUCCESS;
            req->done = 1;
        }
    }
    want_out(tp, peer, 0);
    return LOOM_SUCCESS;
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
    tcp_unexp_t *u = calloc(1, sizeof(*u));
    if (u)
        u->data = buf_get(tp, f->len < first ? f->len : first, &u->cap);
    if (!u || !u->data) {
        free(u);
        tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory holding a %llu-byte early message",
                (unsigned long long)f->len);
        return NULL;
    }
    u->frame = *f;
    return u;
}

static void unexp_append(tcp_peer_t *peer, tcp_unexp_t *u)
{
    if (peer->uq_tail)
        peer->uq_tail->next = u;
    else
        peer->uq_head = u;
    peer->uq_tail = u;
}

static void unexp_remove(tcp_peer_t *peer, tcp_unexp_t *u, tcp_unexp_t *prev)
{
    if (prev)
        prev->next = u->next;
    else
        peer->uq_head = u->next;
    if (peer->uq_tail == u)
        peer->uq_tail = prev;
}

/* The oldest receive posted for f's tag, unlinked; NULL when none is posted
 * or f does not fit it (then the instance has failed). */
static loom_tp_req_t *rq_take(loom_tp_t *tp, tcp_peer_t *peer, const loom_frame_t *f)
{
    loom_status_t st = LOOM_SUCCESS;
    loom_tp_req_t *r = loom_req_queue_take(&peer->rq, f, tp->rank, tp->err, &st);
    if (st != LOOM_SUCCESS)
        tp_fail(tp, st, "%s", tp->err->msg);
    return r;
}

/* A message to ourselves (user send/recv to self): matched in memory. */
static loom_status_t self_send(loom_tp_t *tp, loom_tp_req_t *req)
{
    tcp_peer_t *self = &tp->peers[tp->rank];
    loom_frame_t f = {.kind = LOOM_FRAME_DATA, .match = req->match, .len = req->len};
    loom_tp_req_t *r = rq_take(tp, self, &f);
    if (tp->failed)
        return tp->failed;
    if (r) {
        if (req->len)
            memcpy(r->buf, req->buf, req->len);
        r->off = r->len;
        r->done = 1;
        req->off = req->len;
        req->done = 1;
        return LOOM_SUCCESS;
    }
    tcp_unexp_t *u = unexp_new(tp, &f, req->len);
    if (!u)
        return tp->failed;
    if (req->len)
        memcpy(u->data, req->buf, req->len);
    u->got = req->len;
    u->complete = 1;
    self->early_bytes += u->cap;
    unexp_append(self, u);
    req->off = req->len;
    req->done = 1;
    return LOOM_SUCCESS;
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
    if (req->peer == tp->rank)
        return self_send(tp, req);
    tcp_peer_t *peer = &tp->peers[req->peer];
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
    tcp_unexp_t *prev = NULL;
    for (tcp_unexp_t *u = peer->uq_head; u; prev = u, u = u->next) {
        if (!tag_matches(req, &u->frame))
            continue;
        loom_status_t st = loom_frame_check(&u->frame, req, tp->rank, tp->err);
        if (st != LOOM_SUCCESS)
            return tp_fail(tp, st, "%s", tp->err->msg);
        if (u->got)
            memcpy(req->buf, u->data, u->got);
        req->off = u->got;
        unexp_remove(peer, u, prev);
        peer->early_bytes -= u->cap;
        if (u->complete) {
            req->done = 1;
        } else {
            /* Still arriving: the rest goes straight into the posted buffer. */
            peer->cur_unexp = NULL;
            peer->cur_req = req;
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

static loom_status_t start_frame(loom_tp_t *tp, tcp_peer_t *peer, const loom_frame_t *f)
{
    /* What it sent before still counts; an exchange with it from now on fails. */
    if (f->kind == LOOM_FRAME_GAVE_UP) {
        peer->gave_up = 1;
        return peer->rq.head ? gave_up_fail(tp, peer) : LOOM_SUCCESS;
    }
    if (f->kind == LOOM_FRAME_BYE) {
        peer->said_bye = 1;
        if (peer->rq.head)
            return tp_fail(tp, LOOM_ERR_PEER_LOST,
                           "rank %d destroyed its communicator while rank %d still waits for a "
                           "message from it", peer->rank, tp->rank);
        return LOOM_SUCCESS;
    }
    peer->cur = *f;
    peer->cur_off = 0;
    peer->cur_req = NULL;
    peer->cur_unexp = NULL;
    peer->cur_req = rq_take(tp, peer, f);
    if (tp->failed)
        return tp->failed;
    tp->nframes++;
    peer->in_frame = 1;
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
        unexp_append(peer, peer->cur_unexp);
    }
    return LOOM_SUCCESS;
}

/* Room in the early message being filled for at least one more byte, and
 * for want if growing by doubling allows: its buffer grows with what came. */
static uint8_t *early_room(loom_tp_t *tp, tcp_peer_t *peer, size_t want, size_t *room_p)
{
    tcp_unexp_t *u = peer->cur_unexp;
    if (u->cap - peer->cur_off < want && u->cap < u->frame.len) {
        size_t cap = u->cap * 2 > peer->cur_off + want ? u->cap * 2 : peer->cur_off + want;
        if (cap > u->frame.len)
            cap = u->frame.len;
        uint8_t *data = realloc(u->data, cap);
        if (!data) {
            tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory holding a %llu-byte early message "
                    "from rank %d", (unsigned long long)u->frame.len, peer->rank);
            return NULL;
        }
        peer->early_bytes += cap - u->cap;
        u->data = data;
        u->cap = cap;
    }
    *room_p = u->cap - peer->cur_off;
    return u->data;
}

static void finish_frame(tcp_peer_t *peer)
{
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

static void mac_fail(loom_tp_t *tp, const tcp_peer_t *peer, const char *what)
{
    tp_fail(tp, LOOM_ERR_AUTH,
            "rank %d received a frame from rank %d whose %s does not match its LOOM_AUTH_KEY "
            "MAC: the connection was altered on the way (or a peer is broken)", tp->rank,
            peer->rank, what);
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
                    mac_fail(tp, peer, "header");
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
            if (peer->in_frame && f.len == 0)
                finish_frame(peer);
            continue;
        }
        size_t remaining = peer->cur.len - peer->cur_off;
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
                mac_fail(tp, peer, "payload");
                return;
            }
            peer->stage_beg += LOOM_MAC_BYTES;
            finish_frame(peer);
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
        if (peer->cur_off > before && payload_sealed(peer, peer->cur.len))
            loom_hmac_update(&peer->rx_mac, dst + before, peer->cur_off - before);
        if (peer->cur_req)
            peer->cur_req->off = peer->cur_off;
        else
            peer->cur_unexp->got = peer->cur_off;
        if (peer->cur_off == peer->cur.len && !payload_sealed(peer, peer->cur.len))
            finish_frame(peer);
    }
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
        if (peer->fd < 0 || j == tp->rank)
            continue;
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
        tcp_peer_t *peer = evs[i].data.ptr;
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
static loom_status_t disown(loom_tp_t *tp, loom_status_t st)
{
    if (tp->failed)
        announce_failure(tp);
    loom_tp_disown(&tp->owner);
    return st;
}

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
    int found = peer->held && peer->cur.match.tag == tag;
    for (const tcp_unexp_t *u = peer->uq_head; u && !found; u = u->next)
        found = u->frame.match.tag == tag;
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
        int ms = (int)((deadline - monotonic_s()) * 1000);
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
    double deadline = monotonic_s() + (timeout_s < 5 ? timeout_s : 5);
    if (tp->failed || atomic_load(&tp->abort_why))
        announce_failure(tp);
    for (int j = 0; j < tp->size; j++) {
        tcp_peer_t *peer = &tp->peers[j];
        if (peer->fd < 0)
            continue;
        if (!tp->announced && !peer->sq.head) {   /* (a failed instance has announced) */
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
    for (int j = 0; j < tp->size; j++) {
        tcp_peer_t *peer = &tp->peers[j];
        for (tcp_unexp_t *u = peer->uq_head, *next; u; u = next) {
            next = u->next;
            free(u->data);
            free(u);
        }
        free(peer->stage);
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
