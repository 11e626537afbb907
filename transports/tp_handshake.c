/* tp_handshake.c - see tp_handshake.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/crypto.h"
#include "tp_handshake.h"
#include "tp_addr.h"
#include "tp_fail.h"

_Static_assert(LOOM_HS_BUF_BYTES >= LOOM_CHAL_BYTES, "a challenge fits the buffer");
_Static_assert(LOOM_HS_OPENING_BYTES >= LOOM_HELLO_BYTES, "a hello fits the opening");

#define hs_fail(t, st, ...) loom_tp_fail((t)->failed, (t)->err, (t)->subsys, (t)->rank, st, \
                                         __VA_ARGS__)

/* ---- one connection ---------------------------------------------------------- */

int loom_hs_read(loom_hs_conn_t *c)
{
    if (c->have == c->need)
        return 1;
    ssize_t n = recv(c->fd, c->buf + c->have, c->need - c->have, 0);
    if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR)))
        return -1;
    if (n > 0) {
        c->have += (size_t)n;
        c->heard = 1;
    }
    return c->have == c->need;
}

void loom_hs_close(loom_hs_conn_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->phase = LOOM_HS_DEAD;
}

void loom_hs_redial_later(loom_hs_conn_t *c, double now, double delay_s)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->phase = LOOM_HS_DIALING;
    c->retry_at = now + delay_s;
}

int loom_hs_send(int fd, const void *buf, size_t len)
{
    return send(fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

int loom_hs_nonce(uint8_t out[LOOM_NONCE_BYTES])
{
    return getrandom(out, LOOM_NONCE_BYTES, 0) == LOOM_NONCE_BYTES ? 0 : -1;
}

int loom_hs_proof_ok(const void *key, size_t keylen, char role,
                     const uint8_t hello[LOOM_HELLO_BYTES], const uint8_t nonce_c[LOOM_NONCE_BYTES],
                     const uint8_t nonce_a[LOOM_NONCE_BYTES], const uint8_t bind[LOOM_BIND_BYTES],
                     const uint8_t theirs[32])
{
    uint8_t want[32];
    loom_auth_proof(key, keylen, role, hello, nonce_c, nonce_a, bind, want);
    int ok = loom_equal_ct(theirs, want, sizeof(want));
    explicit_bzero(want, sizeof(want));
    return ok;
}

void loom_hs_sock_opts(int fd, int sockbuf)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (sockbuf > 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof(sockbuf));
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof(sockbuf));
    }
}

loom_status_t loom_hs_listen(const char *host, int sockbuf, int *fd_p,
                             struct sockaddr_storage *ss, socklen_t *sslen, loom_err_t *err,
                             const char *prefix)
{
    if (loom_tp_numeric_addr(host, "0", ss, sslen) != 0)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "%scannot listen on \"%s\"", prefix, host);
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0)
        loom_hs_sock_opts(fd, sockbuf);
    if (fd < 0 || bind(fd, (struct sockaddr *)ss, *sslen) != 0 || listen(fd, SOMAXCONN) != 0) {
        loom_status_t st = loom_err_set(err, LOOM_ERR_TRANSPORT, "%scannot listen on %s: %s",
                                        prefix, host, strerror(errno));
        if (fd >= 0)
            close(fd);
        return st;
    }
    *sslen = sizeof(*ss);
    getsockname(fd, (struct sockaddr *)ss, sslen);
    *fd_p = fd;
    return LOOM_SUCCESS;
}

/* Dial: connected at once or not, the driver calls the step once poll says
 * the socket is writable. */
static int dial(loom_hs_conn_t *c, const struct sockaddr_storage *ss, socklen_t sslen, int sockbuf)
{
    c->fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        return -1;
    loom_hs_sock_opts(c->fd, sockbuf);
    c->have = 0;
    c->heard = 0;
    c->up = 0;
    c->phase = LOOM_HS_DIALING;
    if (connect(c->fd, (const struct sockaddr *)ss, sslen) != 0 && errno != EINPROGRESS) {
        int saved = errno;   /* the caller's message names it */
        close(c->fd);
        c->fd = -1;
        errno = saved;
        return -1;
    }
    return 0;
}

/* ---- the table ---------------------------------------------------------------- */

int loom_hs_table_init(loom_hs_table_t *t, const loom_hs_params_t *p)
{
    memset(t, 0, sizeof(*t));
    t->failed = p->failed;
    t->err = p->err;
    t->subsys = p->subsys;
    t->prefix = p->prefix;
    t->rank = p->rank;
    t->addrs = p->addrs;
    t->listen_fd = p->naccept > 0 ? p->listen_fd : -1;
    t->sockbuf = p->sockbuf;
    t->accept_step = p->accept_step;
    t->accept_need = p->accept_need;
    t->want = p->ndial + p->naccept;
    t->maxconn = t->want + 64;   /* room for strangers that connect too */
    t->timeout_s = p->timeout_s;
    t->deadline = loom_now_s() + p->timeout_s;
    /* Strangers get this long to finish (never more than a third of the
     * timeout), so idle connections cannot hold the table through connect. */
    t->stranger_s = p->timeout_s / 3 < 3.0 ? p->timeout_s / 3 : 3.0;
    t->conns = calloc((size_t)t->maxconn, sizeof(*t->conns));
    t->pfds = calloc((size_t)t->maxconn + 1, sizeof(*t->pfds));
    t->ss = calloc((size_t)(p->rank ? p->rank : 1), sizeof(*t->ss));
    t->sslen = calloc((size_t)(p->rank ? p->rank : 1), sizeof(*t->sslen));
    if (!t->conns || !t->pfds || !t->ss || !t->sslen) {
        loom_hs_table_free(t);
        hs_fail(t, LOOM_ERR_NO_MEMORY, "out of memory");
        return -1;
    }
    return 0;
}

void loom_hs_table_free(loom_hs_table_t *t)
{
    if (t->conns)
        for (int i = 0; i < t->nconn; i++)
            if (t->conns[i].fd >= 0)
                close(t->conns[i].fd);
    free(t->conns);
    free(t->pfds);
    free(t->ss);
    free(t->sslen);
    t->conns = NULL;
    t->pfds = NULL;
    t->ss = NULL;
    t->sslen = NULL;
    t->nconn = 0;
}

int loom_hs_table_dial(loom_hs_table_t *t, int peer, int stream, const struct sockaddr_storage *ss,
                       socklen_t sslen)
{
    loom_hs_conn_t *c = &t->conns[t->nconn];
    *c = (loom_hs_conn_t){.fd = -1, .peer = peer, .stream = stream};
    if (dial(c, ss, sslen, t->sockbuf) != 0) {
        hs_fail(t, LOOM_ERR_TRANSPORT, "%scannot connect to rank %d at %s: %s", t->prefix, peer,
                t->addrs[peer], strerror(errno));
        return -1;
    }
    t->nconn++;
    t->nout = t->nconn;
    return 0;
}

/* Accepted connections that stalled in their handshake are dropped. */
static void shed_strangers(loom_hs_table_t *t, const loom_hs_ops_t *ops, void *arg, double now)
{
    for (int i = t->nout; i < t->nconn; i++) {
        loom_hs_conn_t *c = &t->conns[i];
        if (c->phase == LOOM_HS_TALKING && c->stranger && now - c->since > t->stranger_s) {
            LOOM_WARN(t->subsys, "rank %d dropped a connection that did not finish its "
                      "handshake within %.1f s", t->rank, t->stranger_s);
            ops->drop(arg, c);
        }
    }
}

/* Where an accepted connection goes: a finished entry, a new one, or, when
 * the table is full, the entry of a stranger (the oldest that has said
 * nothing, else the oldest), which is dropped; -1: none. */
static int take_slot(loom_hs_table_t *t, const loom_hs_ops_t *ops, void *arg)
{
    for (int i = t->nout; i < t->nconn; i++)
        if (t->conns[i].phase == LOOM_HS_DEAD || t->conns[i].phase == LOOM_HS_DONE)
            return i;
    if (t->nconn < t->maxconn)
        return t->nconn++;
    loom_hs_conn_t *v = NULL;
    for (int i = t->nout; i < t->nconn; i++) {
        loom_hs_conn_t *w = &t->conns[i];
        if (w->phase != LOOM_HS_TALKING || !w->stranger)
            continue;
        if (!v || (!w->heard && v->heard) || (w->heard == v->heard && w->since < v->since))
            v = w;
    }
    if (!v)
        return -1;
    ops->drop(arg, v);
    return (int)(v - t->conns);
}

static void accept_all(loom_hs_table_t *t, const loom_hs_ops_t *ops, void *arg)
{
    for (;;) {
        int fd = accept4(t->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            break;
        loom_hs_sock_opts(fd, 0);
        int slot = take_slot(t, ops, arg);
        if (slot < 0) {
            close(fd);
            continue;
        }
        loom_hs_conn_t *c = &t->conns[slot];
        *c = (loom_hs_conn_t){.fd = fd, .peer = -1, .phase = LOOM_HS_TALKING, .accepted = 1,
                              .stranger = 1, .step = t->accept_step, .need = t->accept_need,
                              .since = loom_now_s()};
        /* An honest rank spoke as it connected: read it now, so that it is not
         * the one evicted when a crowd of silent strangers follows. */
        if (loom_hs_read(c) < 0)
            loom_hs_close(c);
        else if (c->have > 0)
            c->pending = 1;
    }
}

/* Wait (20 ms at most: refused dials are retried on this tick) for the
 * listener and every connection that waits for its socket. */
static int poll_all(loom_hs_table_t *t, double now)
{
    t->pfds[0] = (struct pollfd){.fd = t->listen_fd, .events = POLLIN};
    for (int i = 0; i < t->nconn; i++) {
        loom_hs_conn_t *c = &t->conns[i];
        short ev = c->phase == LOOM_HS_DIALING ? POLLOUT : c->phase == LOOM_HS_TALKING ? POLLIN : 0;
        if (c->fd < 0 || c->retry_at > now)
            ev = 0;
        t->pfds[i + 1] = (struct pollfd){.fd = ev ? c->fd : -1, .events = ev};
    }
    int wait_ms = (int)((t->deadline - now) * 1000) + 1;
    if (poll(t->pfds, (nfds_t)t->nconn + 1, wait_ms < 20 ? wait_ms : 20) < 0 && errno != EINTR) {
        hs_fail(t, LOOM_ERR_TRANSPORT, "poll: %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* A dialled socket became writable: 1 connected, 0 refused (dial again a
 * little later: the peer's backlog may be full), -1 failed. */
static int dialled(loom_hs_table_t *t, loom_hs_conn_t *c, double now)
{
    int soerr = 0;
    socklen_t sl = sizeof(soerr);
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
    if (soerr == ECONNREFUSED || soerr == ETIMEDOUT || soerr == EHOSTUNREACH) {
        loom_hs_redial_later(c, now, 0.01);
        return 0;
    }
    if (soerr != 0) {
        hs_fail(t, LOOM_ERR_TRANSPORT, "%scannot connect to rank %d at %s: %s", t->prefix,
                c->peer, t->addrs[c->peer], strerror(soerr));
        return -1;
    }
    c->phase = LOOM_HS_TALKING;
    return 1;
}

/* Every connection after a poll: dial again those whose pause is over, move
 * the ones whose socket is ready. */
static void service(loom_hs_table_t *t, const loom_hs_ops_t *ops, void *arg, double now)
{
    for (int i = 0; i < t->nconn && !*t->failed; i++) {
        loom_hs_conn_t *c = &t->conns[i];
        short re = t->pfds[i + 1].revents;
        if (c->phase == LOOM_HS_DIALING && c->fd < 0) {
            if (c->retry_at > now)
                continue;
            c->retry_at = 0;
            if (dial(c, &t->ss[c->peer], t->sslen[c->peer], t->sockbuf) != 0)
                hs_fail(t, LOOM_ERR_TRANSPORT, "%scannot connect to rank %d at %s: %s",
                        t->prefix, c->peer, t->addrs[c->peer], strerror(errno));
            continue;
        }
        if (c->pending) {
            c->pending = 0;
            re |= POLLIN;
        }
        if (!re || c->fd < 0)
            continue;
        if (c->phase == LOOM_HS_DIALING && dialled(t, c, now) <= 0)
            continue;
        if (c->phase == LOOM_HS_TALKING && ops->step(arg, t, c, now) == 1) {
            c->phase = LOOM_HS_DONE;
            c->stranger = 0;
            t->established++;
        }
    }
}

loom_status_t loom_hs_run(loom_hs_table_t *t, const loom_hs_ops_t *ops, void *arg)
{
    while (t->established < t->want && !*t->failed) {
        double now = loom_now_s();
        shed_strangers(t, ops, arg, now);
        if (now > t->deadline) {
            ops->timed_out(arg, t);
            break;
        }
        loom_status_t why = ops->check ? ops->check(arg) : LOOM_SUCCESS;
        if (why != LOOM_SUCCESS) {
            hs_fail(t, why, "the communicator was aborted");
            break;
        }
        if (poll_all(t, now) != 0)
            break;
        service(t, ops, arg, loom_now_s());
        if (!*t->failed && (t->pfds[0].revents & POLLIN))
            accept_all(t, ops, arg);
    }
    return *t->failed;
}

/* ---- the hello handshake ------------------------------------------------------- */

#define self_fail(s, st, ...) loom_tp_fail((s)->failed, (s)->err, (s)->subsys, (s)->rank, st, \
                                           __VA_ARGS__)

/* Who the connection between connector and acceptor joins, as the store
 * published them (our own address as we published it). */
static void conn_bind(const loom_hs_self_t *s, int connector, int acceptor,
                      uint8_t out[LOOM_BIND_BYTES])
{
    const char *ca = connector == s->rank ? s->my_addr : s->addrs[connector];
    const char *aa = acceptor == s->rank ? s->my_addr : s->addrs[acceptor];
    loom_auth_bind(s->job_hash, s->comm_hash, s->size, connector, ca, strlen(ca), acceptor, aa,
                   strlen(aa), out);
}

static uint32_t hello_auth_bits(const loom_hs_self_t *s)
{
    if (!s->key)
        return 0;
    return LOOM_HELLO_AUTH |
           (s->mac_mode == LOOM_AUTH_MAC_HEADERS ? LOOM_HELLO_MAC_HEADERS : 0) |
           (s->mac_mode == LOOM_AUTH_MAC_ENCRYPT ? LOOM_HELLO_MAC_ENCRYPT : 0) |
           (s->chacha ? LOOM_HELLO_CHACHA : 0);
}

static loom_status_t send_hello(const loom_hs_self_t *s, loom_hs_conn_t *c)
{
    loom_hello_t h = {LOOM_WIRE_VERSION, (uint32_t)s->rank, (uint32_t)s->size,
                      hello_auth_bits(s) | LOOM_HELLO_STREAMS(c->stream, s->nstreams),
                      s->job_hash, s->comm_hash};
    uint8_t msg[LOOM_HELLO_BYTES + LOOM_NONCE_BYTES];
    loom_hello_encode(&h, c->opening);
    memcpy(msg, c->opening, LOOM_HELLO_BYTES);
    size_t len = LOOM_HELLO_BYTES;
    conn_bind(s, s->rank, c->peer, c->bind);
    if (s->key) {
        if (loom_hs_nonce(c->nonce_c) != 0)
            return self_fail(s, LOOM_ERR_INTERNAL, "getrandom: %s", strerror(errno));
        memcpy(msg + len, c->nonce_c, LOOM_NONCE_BYTES);
        len += LOOM_NONCE_BYTES;
    }
    if (loom_hs_send(c->fd, msg, len) != 0)
        return self_fail(s, LOOM_ERR_TRANSPORT, "handshake with rank %d: %s", c->peer,
                         strerror(errno));
    c->step = LOOM_HS_WAIT_ACK;
    c->have = 0;
    c->need = LOOM_ACK_BYTES;   /* a challenge is longer: need grows once it shows */
    return LOOM_SUCCESS;
}

/* The acceptor's challenge came: check its proof, send ours. */
static loom_status_t answer_challenge(const loom_hs_self_t *s, loom_hs_conn_t *c)
{
    uint8_t theirs[32], mine[32], msg[LOOM_PROOF_BYTES];
    if (!s->key)
        return self_fail(s, LOOM_ERR_AUTH, "rank %d requires LOOM_AUTH_KEY, which rank %d does "
                         "not have", c->peer, s->rank);
    loom_chal_decode(c->buf, c->nonce_a, theirs);
    if (!loom_hs_proof_ok(s->key, s->keylen, 'A', c->opening, c->nonce_c, c->nonce_a, c->bind,
                          theirs))
        return self_fail(s, LOOM_ERR_AUTH, "the process at %s (rank %d) cannot prove "
                         "LOOM_AUTH_KEY for this connection: a different key, or a relay (the "
                         "address rank %d published is not the one it listens on)",
                         s->addrs[c->peer], c->peer, c->peer);
    loom_auth_proof(s->key, s->keylen, 'C', c->opening, c->nonce_c, c->nonce_a, c->bind, mine);
    loom_proof_encode(mine, msg);
    if (loom_hs_send(c->fd, msg, sizeof(msg)) != 0)
        return self_fail(s, LOOM_ERR_TRANSPORT, "handshake with rank %d: %s", c->peer,
                         strerror(errno));
    c->step = LOOM_HS_WAIT_FINAL_ACK;
    c->have = 0;
    c->need = LOOM_ACK_BYTES;
    return LOOM_SUCCESS;
}

static loom_status_t connector_step(const loom_hs_self_t *s, loom_hs_conn_t *c, double now,
                                    int *up)
{
    if (c->step == LOOM_HS_SEND_HELLO)
        return send_hello(s, c);
    int got = loom_hs_read(c);
    if (got < 0 && c->have == 0) {
        /* Closed before a word: the acceptor sheds strangers when its table
         * is full, and cannot tell us from them yet. Dial again. */
        loom_hs_redial_later(c, now, 0.05);
        c->step = LOOM_HS_SEND_HELLO;
        return LOOM_SUCCESS;
    }
    if (got < 0)
        return self_fail(s, LOOM_ERR_PEER_LOST, "rank %d closed the connection during the "
                         "handshake", c->peer);
    if (c->step == LOOM_HS_WAIT_ACK && c->have >= 8 && memcmp(c->buf, LOOM_CHAL_MAGIC, 8) == 0)
        c->need = LOOM_CHAL_BYTES;
    if (c->have < c->need)
        return LOOM_SUCCESS;
    if (c->need == LOOM_CHAL_BYTES)
        return answer_challenge(s, c);
    loom_ack_code_t code;
    uint32_t who;
    if (loom_ack_decode(c->buf, &code, &who) != 0 || who != (uint32_t)c->peer)
        return self_fail(s, LOOM_ERR_AUTH, "the process at %s is not rank %d of this job",
                         s->addrs[c->peer], c->peer);
    if (code == LOOM_ACK_OK && s->key && c->step == LOOM_HS_WAIT_ACK)
        code = LOOM_ACK_AUTH;   /* accepted without proving the key */
    if (code != LOOM_ACK_OK)
        return self_fail(s, code == LOOM_ACK_STREAMS ? LOOM_ERR_INVALID_ARG : LOOM_ERR_AUTH,
                         "rank %d refused the connection of rank %d: %s", c->peer, s->rank,
                         loom_ack_reason(code));
    *up = 1;
    return LOOM_SUCCESS;
}

/* The whole hello is in: why to refuse it, or LOOM_ACK_OK (c->peer and
 * c->stream set). */
static loom_ack_code_t check_hello(const loom_hs_self_t *s, loom_hs_conn_t *c, int *authed)
{
    loom_hello_t h;
    loom_ack_code_t code = loom_hello_decode(c->buf, s->job_hash, s->comm_hash, s->rank, s->size,
                                             &h);
    if (code != LOOM_ACK_OK)
        return code;
    *authed = (h.stream & LOOM_HELLO_AUTH) != 0;
    if (h.rank < (uint32_t)s->rank || s->addrs[h.rank] == NULL)
        return LOOM_ACK_BAD_RANK;   /* lower ranks are dialled, never accepted */
    if (LOOM_HELLO_STREAM_COUNT(h.stream) != (uint32_t)s->nstreams ||
        LOOM_HELLO_STREAM_INDEX(h.stream) >= (uint32_t)s->nstreams)
        return LOOM_ACK_STREAMS;
    c->peer = (int)h.rank;
    c->stream = (int)LOOM_HELLO_STREAM_INDEX(h.stream);
    if (s->taken(s->arg, c->peer, c->stream))
        return LOOM_ACK_DUPLICATE;
    if (*authed != (s->key != NULL))
        return LOOM_ACK_AUTH;
    const uint32_t modes = LOOM_HELLO_MAC_HEADERS | LOOM_HELLO_MAC_ENCRYPT;
    if (*authed && (h.stream & modes) != (hello_auth_bits(s) & modes))
        return LOOM_ACK_MAC_MODE;
    if (*authed && (h.stream & LOOM_HELLO_CHACHA) != (hello_auth_bits(s) & LOOM_HELLO_CHACHA))
        return LOOM_ACK_CIPHER;
    return LOOM_ACK_OK;
}

/* A keyed hello and its nonce are in: challenge the connector. 0, or -1
 * when it is gone (c closed). */
static loom_status_t send_challenge(const loom_hs_self_t *s, loom_hs_conn_t *c)
{
    uint8_t proof[32], msg[LOOM_CHAL_BYTES];
    memcpy(c->opening, c->buf, LOOM_HELLO_BYTES);
    memcpy(c->nonce_c, c->buf + LOOM_HELLO_BYTES, LOOM_NONCE_BYTES);
    if (loom_hs_nonce(c->nonce_a) != 0)
        return self_fail(s, LOOM_ERR_INTERNAL, "getrandom: %s", strerror(errno));
    conn_bind(s, c->peer, s->rank, c->bind);
    loom_auth_proof(s->key, s->keylen, 'A', c->opening, c->nonce_c, c->nonce_a, c->bind, proof);
    loom_chal_encode(c->nonce_a, proof, msg);
    if (loom_hs_send(c->fd, msg, sizeof(msg)) != 0) {
        loom_hs_close(c);
        return LOOM_SUCCESS;
    }
    c->step = LOOM_HS_WAIT_PROOF;
    c->have = 0;
    c->need = LOOM_PROOF_BYTES;
    return LOOM_SUCCESS;
}

static loom_status_t acceptor_step(const loom_hs_self_t *s, loom_hs_conn_t *c, int *up,
                                   loom_ack_code_t *refused)
{
    int got = loom_hs_read(c);
    if (got < 0) {
        if (c->step == LOOM_HS_WAIT_PROOF)
            *refused = LOOM_ACK_AUTH;   /* it hung up on our challenge: it does not trust our key */
        loom_hs_close(c);
        return LOOM_SUCCESS;
    }
    if (!got)
        return LOOM_SUCCESS;
    loom_ack_code_t code = LOOM_ACK_OK;
    if (c->step == LOOM_HS_WAIT_HELLO) {
        int authed = 0;
        code = check_hello(s, c, &authed);
        if (code == LOOM_ACK_OK && authed && c->need == LOOM_HELLO_BYTES) {
            c->need += LOOM_NONCE_BYTES;   /* the connector's nonce follows */
            return LOOM_SUCCESS;
        }
        if (code == LOOM_ACK_OK && authed)
            return send_challenge(s, c);
    } else {
        uint8_t theirs[32];
        if (loom_proof_decode(c->buf, theirs) != 0 ||
            !loom_hs_proof_ok(s->key, s->keylen, 'C', c->opening, c->nonce_c, c->nonce_a,
                              c->bind, theirs))
            code = LOOM_ACK_AUTH;
        else if (s->taken(s->arg, c->peer, c->stream))
            code = LOOM_ACK_DUPLICATE;
    }
    uint8_t ack[LOOM_ACK_BYTES];
    loom_ack_encode(code, (uint32_t)s->rank, ack);
    int sent = loom_hs_send(c->fd, ack, sizeof(ack)) == 0;
    if (code != LOOM_ACK_OK || !sent) {
        /* A stranger or a confused process: refuse it, keep waiting for ours. */
        LOOM_WARN(s->subsys, "rank %d refused a connection: %s", s->rank, loom_ack_reason(code));
        if (code == LOOM_ACK_AUTH || code == LOOM_ACK_STREAMS)
            *refused = code;
        loom_hs_close(c);
        return LOOM_SUCCESS;
    }
    *up = 1;
    return LOOM_SUCCESS;
}

loom_status_t loom_hs_hello_step(const loom_hs_self_t *s, loom_hs_conn_t *c, double now, int *up,
                                 loom_ack_code_t *refused)
{
    *up = 0;
    if (c->accepted)
        return acceptor_step(s, c, up, refused);
    return connector_step(s, c, now, up);
}
