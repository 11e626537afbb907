/* tcp_client.c - the tcp:// store's client: one connection, one request
 * at a time, every call bounded by a deadline. The wire format is described in
 * store/proto.h; the server is store/tcp_server.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/crypto.h"
#include "store.h"
#include "proto.h"
#include "tcp_int.h"

/* How long past its own timeout a WAIT may take to be answered before the
 * client gives up on the server. */
#define WAIT_GRACE_S 5.0

/* ---- Deadline-bounded socket I/O for the client. ----------------------------- */

typedef enum { IO_OK, IO_TIMEOUT, IO_EOF, IO_ERRNO } io_rc_t;

static int ms_until(double deadline)
{
    double left = deadline - loom_now_s();
    if (left <= 0)
        return 0;
    if (left > (double)INT_MAX / 1000.0)
        return INT_MAX;
    /* Rounded up: waking a hair early would only cost another poll. */
    return (int)(left * 1000.0) + 1;
}

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Wait until fd is ready for events or the deadline passes. At least one check
 * even when the deadline is already past. */
static io_rc_t wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        struct pollfd p = { .fd = fd, .events = events };
        int n = poll(&p, 1, ms_until(deadline));
        if (n > 0)
            return IO_OK;  /* POLLERR and POLLHUP surface in the next send/recv */
        if (n == 0) {
            if (loom_now_s() >= deadline)
                return IO_TIMEOUT;
            continue;
        }
        if (errno != EINTR)
            return IO_ERRNO;
    }
}

static io_rc_t recv_all(int fd, void *buf, size_t len, double deadline)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = recv(fd, (char *)buf + got, len - got, MSG_DONTWAIT);
        if (r > 0) {
            got += (size_t)r;
        } else if (r == 0) {
            return IO_EOF;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            io_rc_t io = wait_fd(fd, POLLIN, deadline);
            if (io != IO_OK)
                return io;
        } else if (errno != EINTR) {
            return IO_ERRNO;
        }
    }
    return IO_OK;
}

/* Send every byte of iov[0..n) (modified in place). */
static io_rc_t sendv_all(int fd, struct iovec *iov, int n, double deadline)
{
    while (n > 0) {
        struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)n };
        /* MSG_NOSIGNAL: a closed peer must be an error, never SIGPIPE. */
        ssize_t r = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                io_rc_t io = wait_fd(fd, POLLOUT, deadline);
                if (io != IO_OK)
                    return io;
            } else if (errno != EINTR) {
                return IO_ERRNO;
            }
            continue;
        }
        size_t done = (size_t)r;
        while (n > 0 && done >= iov->iov_len) {
            done -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + done;
            iov->iov_len -= done;
        }
    }
    return IO_OK;
}

/* ---- The client. --------------------------------------------------------------- */

typedef struct tcp_store {
    char host[NI_MAXHOST];
    int port;
    char addr[NI_MAXHOST + 16];  /* "host:port" for messages */
    int fd;                      /* -1 after a failure broke the stream */
    double op_timeout;
    loom_store_server_t *srv;    /* served by this handle (rank 0), stopped on close */
    char key[1024];              /* LOOM_AUTH_KEY; keylen 0: none */
    size_t keylen;
    int warned_open;             /* said once that the server asks for no key */
} tcp_store_t;

/* One connect attempt to every address of the host. Returns a connected
 * non-blocking socket, or -1 with why filled. */
static int connect_once(tcp_store_t *t, double deadline, char *why, size_t whylen)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_NUMERICSERV };
    struct addrinfo *res;
    char ps[8];

    snprintf(ps, sizeof(ps), "%d", t->port);
    int g = getaddrinfo(t->host, ps, &hints, &res);
    if (g != 0) {
        snprintf(why, whylen, "cannot resolve %.200s: %s", t->host,
                 g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
        if (fd < 0) {
            snprintf(why, whylen, "socket: %s", strerror(errno));
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        int e = errno;
        if (e == EINPROGRESS) {
            io_rc_t io = wait_fd(fd, POLLOUT, deadline);
            socklen_t sl = sizeof(e);
            if (io == IO_TIMEOUT)
                e = ETIMEDOUT;
            else if (io == IO_ERRNO)
                e = errno;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl) != 0)
                e = errno;
            if (e == 0)
                break;
        }
        snprintf(why, whylen, "%s", strerror(e));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

/* Exchange hellos on a fresh connection. The answer is checked byte by byte so
 * a stranger that sends a short banner and then waits is caught at once. */
static loom_status_t auth_exchange(tcp_store_t *t, int fd, const uint8_t *nonce_c,
                                   double deadline, loom_err_t *err);

static loom_status_t hello(tcp_store_t *t, int fd, double deadline, loom_err_t *err)
{
    uint8_t h[LOOM_STORE_HELLO_LEN], nonce_c[LOOM_STORE_NONCE_LEN];
    loom_store_hello_pack(h, LOOM_STORE_PROTO_VERSION, t->keylen ? LOOM_STORE_HELLO_AUTH : 0);
    if (t->keylen && getrandom(nonce_c, sizeof(nonce_c), 0) != (ssize_t)sizeof(nonce_c))
        return loom_err_set(err, LOOM_ERR_INTERNAL, "getrandom: %s", strerror(errno));
    struct iovec hv[2] = { { h, sizeof(h) }, { nonce_c, sizeof(nonce_c) } };
    io_rc_t io = sendv_all(fd, hv, t->keylen ? 2 : 1, deadline);
    if (io == IO_TIMEOUT)
        return loom_err_set(err, LOOM_ERR_TIMEOUT,
                            "the server at %s accepted the connection but did not take the "
                            "Loom store hello", t->addr);
    if (io != IO_OK)
        return loom_err_set(err, LOOM_ERR_MISMATCH,
                            "the server at %s does not speak the Loom store protocol (sending "
                            "the hello failed: %s)", t->addr, strerror(errno));

    size_t got = 0;
    while (got < sizeof(h)) {
        ssize_t r = recv(fd, h + got, sizeof(h) - got, MSG_DONTWAIT);
        if (r > 0) {
            size_t end = got + (size_t)r;
            size_t cmp = end < LOOM_STORE_MAGIC_LEN ? end : LOOM_STORE_MAGIC_LEN;
            if (memcmp(h, LOOM_STORE_MAGIC, cmp) != 0) {
                char shown[LOOM_STORE_HELLO_LEN + 1];
                for (size_t i = 0; i < end; i++)
                    shown[i] = h[i] >= 0x20 && h[i] < 0x7f ? (char)h[i] : '.';
                shown[end] = '\0';
                return loom_err_set(err, LOOM_ERR_MISMATCH,
                                    "the server at %s does not speak the Loom store protocol "
                                    "(it answered \"%s\"); is another service, such as "
                                    "torch's TCPStore, using this port?", t->addr, shown);
            }
            got = end;
        } else if (r == 0 || errno == ECONNRESET) {
            return loom_err_set(err, LOOM_ERR_MISMATCH,
                                "the server at %s does not speak the Loom store protocol (it "
                                "closed the connection after the Loom hello); is another "
                                "service, such as torch's TCPStore, using this port?", t->addr);
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            io = wait_fd(fd, POLLIN, deadline);
            if (io == IO_TIMEOUT)
                return loom_err_set(err, LOOM_ERR_TIMEOUT,
                                    "the server at %s accepted the connection but did not "
                                    "answer the Loom store hello in time (is it a Loom store?)",
                                    t->addr);
            if (io != IO_OK)
                return loom_err_set(err, LOOM_ERR_TRANSPORT, "poll: %s", strerror(errno));
        } else if (errno != EINTR) {
            return loom_err_set(err, LOOM_ERR_TRANSPORT,
                                "reading the hello of the store server at %s: %s", t->addr,
                                strerror(errno));
        }
    }
    uint32_t version = get32(h + 8), word = get32(h + 12);
    if (word == LOOM_STORE_HELLO_AUTH_REQUIRED)
        return loom_err_set(err, LOOM_ERR_AUTH,
                            "the store server at %s requires LOOM_AUTH_KEY, which this process "
                            "does not have", t->addr);
    if (word == LOOM_STORE_HELLO_CHALLENGE && t->keylen)
        return auth_exchange(t, fd, nonce_c, deadline, err);
    if (word == LOOM_STORE_HELLO_OK && t->keylen && !t->warned_open) {
        /* The values ranks trust carry MACs, so this costs availability, not integrity. */
        t->warned_open = 1;
        LOOM_WARN("store", "the store server at %s does not ask for LOOM_AUTH_KEY: anyone who "
                  "reaches it can read and delete keys", t->addr);
    }
    if (word != LOOM_STORE_HELLO_OK)
        return loom_err_set(err, LOOM_ERR_MISMATCH,
                            "the Loom store server at %s speaks protocol version %" PRIu32
                            " and refused this library's version %u", t->addr, version,
                            LOOM_STORE_PROTO_VERSION);
    return LOOM_SUCCESS;
}

/* The server holds a key too: check its proof, give ours, read its verdict. */
static loom_status_t auth_exchange(tcp_store_t *t, int fd, const uint8_t *nonce_c,
                                   double deadline, loom_err_t *err)
{
    uint8_t chal[LOOM_STORE_NONCE_LEN + LOOM_STORE_PROOF_LEN], want[LOOM_STORE_PROOF_LEN];
    uint8_t mine[LOOM_STORE_PROOF_LEN], verdict[LOOM_STORE_HELLO_LEN];
    io_rc_t io = recv_all(fd, chal, sizeof(chal), deadline);
    if (io != IO_OK)
        return loom_err_set(err, io == IO_TIMEOUT ? LOOM_ERR_TIMEOUT : LOOM_ERR_PEER_LOST,
                            "the store server at %s did not finish its LOOM_AUTH_KEY challenge",
                            t->addr);
    loom_store_auth_proof(t->key, t->keylen, 'S', nonce_c, chal, want);
    if (!loom_equal_ct(want, chal + LOOM_STORE_NONCE_LEN, sizeof(want)))
        return loom_err_set(err, LOOM_ERR_AUTH,
                            "the store server at %s cannot prove LOOM_AUTH_KEY: it holds a "
                            "different key", t->addr);
    loom_store_auth_proof(t->key, t->keylen, 'C', nonce_c, chal, mine);
    struct iovec iov = { mine, sizeof(mine) };
    if ((io = sendv_all(fd, &iov, 1, deadline)) == IO_OK)
        io = recv_all(fd, verdict, sizeof(verdict), deadline);
    if (io != IO_OK)
        return loom_err_set(err, io == IO_TIMEOUT ? LOOM_ERR_TIMEOUT : LOOM_ERR_PEER_LOST,
                            "the store server at %s closed the connection during the "
                            "LOOM_AUTH_KEY exchange", t->addr);
    if (memcmp(verdict, LOOM_STORE_MAGIC, LOOM_STORE_MAGIC_LEN) != 0 ||
        get32(verdict + 12) != LOOM_STORE_HELLO_OK)
        return loom_err_set(err, LOOM_ERR_AUTH,
                            "the store server at %s refused this process's proof of "
                            "LOOM_AUTH_KEY: the keys differ", t->addr);
    return LOOM_SUCCESS;
}

/* Connect and say hello. With retry, refused connections are retried with
 * backoff until the deadline (the server may not be up yet); without, one try. */
static loom_status_t tcp_connect(tcp_store_t *t, double timeout_s, int retry, loom_err_t *err)
{
    double deadline = loom_now_s() + timeout_s;
    double backoff = 0.01;
    char why[256] = "no attempt";

    for (;;) {
        int fd = connect_once(t, deadline, why, sizeof(why));
        if (fd >= 0) {
            int one = 1;
            /* Requests are small and answered one by one: Nagle would only add delay. */
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            loom_status_t st = hello(t, fd, deadline, err);
            if (st != LOOM_SUCCESS) {
                close(fd);
                return st;
            }
            t->fd = fd;
            return LOOM_SUCCESS;
        }
        double now = loom_now_s();
        if (!retry || now >= deadline)
            break;
        sleep_s(backoff < deadline - now ? backoff : deadline - now);
        backoff = backoff * 2 < 1.0 ? backoff * 2 : 1.0;
    }
    if (!retry)
        return loom_err_set(err, LOOM_ERR_PEER_LOST,
                            "lost the connection to the store server at %s and could not "
                            "reconnect (%s)", t->addr, why);
    return loom_err_set(err, LOOM_ERR_TIMEOUT,
                        "timed out after %.1f s connecting to the store at tcp://%s (last "
                        "error: %s); is rank 0, loomrun or loom-store serving it?",
                        timeout_s, t->addr, why);
}

/* Close a connection whose stream is out of step and say why. */
static loom_status_t conn_fail(tcp_store_t *t, io_rc_t io, int e, double waited_s,
                               loom_err_t *err)
{
    close(t->fd);
    t->fd = -1;
    switch (io) {
    case IO_TIMEOUT:
        return loom_err_set(err, LOOM_ERR_TIMEOUT,
                            "the store server at %s did not answer within %.1f s", t->addr,
                            waited_s);
    case IO_EOF:
        return loom_err_set(err, LOOM_ERR_PEER_LOST,
                            "the store server at %s closed the connection", t->addr);
    default:
        if (e == ECONNRESET || e == EPIPE)
            return loom_err_set(err, LOOM_ERR_PEER_LOST,
                                "the connection to the store server at %s was reset", t->addr);
        return loom_err_set(err, LOOM_ERR_TRANSPORT, "talking to the store server at %s: %s",
                            t->addr, strerror(e));
    }
}

/* One request and its response. *val_p (may be NULL when the op returns no
 * value) gets a malloc'ed copy of the value plus a NUL byte. */
static loom_status_t tcp_call(tcp_store_t *t, uint32_t op, const char *key, const void *a,
                              size_t alen, const void *b, size_t blen, uint64_t arg,
                              double timeout_s, loom_store_resp_t *resp_p, void **val_p,
                              size_t *len_p, loom_err_t *err)
{
    loom_status_t st;

    /* A connection the server closed while we were idle (its idle timeout, or
     * room made for others) reads as EOF before we send: replace it. */
    if (t->fd >= 0) {
        char peek;
        ssize_t r = recv(t->fd, &peek, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            close(t->fd);
            t->fd = -1;
        }
    }
    /* A broken stream is replaced before the next request, never during one, so
     * no request is ever sent twice; the attempt fits in this call's time. */
    if (t->fd < 0 &&
        (st = tcp_connect(t, timeout_s < t->op_timeout ? timeout_s : t->op_timeout, 0, err)) !=
            LOOM_SUCCESS)
        return st;

    double deadline = loom_now_s() + timeout_s;
    size_t klen = strlen(key);
    loom_store_req_t req = { .op = op, .klen = (uint32_t)klen, .alen = (uint32_t)alen,
                             .blen = (uint32_t)blen, .arg = arg };
    uint8_t hdr[LOOM_STORE_REQ_LEN];
    loom_store_req_pack(hdr, &req);
    struct iovec iov[4];
    int n = 0;
    iov[n++] = (struct iovec){ hdr, sizeof(hdr) };
    iov[n++] = (struct iovec){ (void *)key, klen };
    if (alen > 0)
        iov[n++] = (struct iovec){ (void *)a, alen };
    if (blen > 0)
        iov[n++] = (struct iovec){ (void *)b, blen };
    io_rc_t io = sendv_all(t->fd, iov, n, deadline);
    if (io != IO_OK)
        return conn_fail(t, io, errno, timeout_s, err);

    uint8_t rh[LOOM_STORE_RESP_LEN];
    io = recv_all(t->fd, rh, sizeof(rh), deadline);
    if (io != IO_OK)
        return conn_fail(t, io, errno, timeout_s, err);
    loom_store_resp_t resp;
    if (loom_store_resp_unpack(rh, op, &resp) != 0) {
        close(t->fd);
        t->fd = -1;
        return loom_err_set(err, LOOM_ERR_MISMATCH,
                            "the store server at %s sent a malformed response", t->addr);
    }
    uint8_t *val = NULL;
    if (val_p != NULL) {
        val = malloc((size_t)resp.vlen + 1);
        if (val == NULL) {
            /* The value is still on the wire: the stream cannot be reused. */
            close(t->fd);
            t->fd = -1;
            return loom_err_set(err, LOOM_ERR_NO_MEMORY,
                                "out of memory for a store value of %" PRIu32 " bytes",
                                resp.vlen);
        }
        io = recv_all(t->fd, val, resp.vlen, deadline);
        if (io != IO_OK) {
            free(val);
            return conn_fail(t, io, errno, timeout_s, err);
        }
        val[resp.vlen] = '\0';
    }
    if (resp.rc == LOOM_STORE_RC_FULL) {
        free(val);
        return loom_err_set(err, LOOM_ERR_NO_MEMORY,
                            "the store server at %s refused to store key %s (%zu bytes): it "
                            "already holds what its LOOM_STORE_MAX_BYTES allows", t->addr, key,
                            alen + blen);
    }
    *resp_p = resp;
    if (val_p != NULL) {
        *val_p = val;
        *len_p = resp.vlen;
    }
    return LOOM_SUCCESS;
}

static loom_status_t tcp_open_key(const char *rest, int rank, double timeout_s,
                                  const void *key, size_t keylen, loom_err_t *err, void **impl_p)
{
    loom_status_t st;
    char uri[NI_MAXHOST + 32];

    snprintf(uri, sizeof(uri), "tcp://%s", rest);
    tcp_store_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory opening store %s", uri);
    if (keylen > sizeof(t->key)) {
        free(t);
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "LOOM_AUTH_KEY is too long");
    }
    if (keylen > 0)
        memcpy(t->key, key, keylen);
    t->keylen = keylen;
    t->fd = -1;
    t->op_timeout = timeout_s;
    st = loom_store_parse_hostport(rest, uri, t->host, sizeof(t->host), &t->port, err);
    if (st != LOOM_SUCCESS)
        goto free_store;
    if (t->port == 0 && rank != 0) {
        st = loom_err_set(err, LOOM_ERR_INVALID_ARG,
                          "bad store URI '%s': port 0 (any free port) can only be served "
                          "by rank 0 of the same process", uri);
        goto free_store;
    }

    if (rank == 0) {
        /* Serve when host:port can be bound here; if someone already serves it
         * (loomrun, loom-store) or host is another machine, be a client. */
        loom_err_t serr;
        int e = 0;
        loom_err_clear(&serr);
        st = loom_store_server_start_key(t->host, t->port, t->key, t->keylen, &e, &serr,
                                         &t->srv);
        if (st == LOOM_SUCCESS) {
            t->port = loom_store_server_port(t->srv);
        } else if ((e != EADDRINUSE && e != EADDRNOTAVAIL) || t->port == 0) {
            /* With port 0 there is nobody else to connect to. */
            st = loom_err_set(err, st == LOOM_ERR_TRANSPORT && t->port == 0 ?
                                       LOOM_ERR_INVALID_ARG : st,
                              "%s", serr.msg);
            goto free_store;
        }
    }
    loom_store_format_hostport(t->host, t->port, t->addr, sizeof(t->addr));

    st = tcp_connect(t, timeout_s, 1, err);
    if (st != LOOM_SUCCESS)
        goto stop_server;
    *impl_p = t;
    return LOOM_SUCCESS;

stop_server:
    if (t->srv != NULL)
        loom_store_server_stop(t->srv);
free_store:
    free(t);
    return st;
}

static loom_status_t tcp_open(const char *rest, int rank, double timeout_s, loom_err_t *err,
                              void **impl_p)
{
    return tcp_open_key(rest, rank, timeout_s, NULL, 0, err, impl_p);
}

static void tcp_close(void *impl)
{
    tcp_store_t *t = impl;
    explicit_bzero(t->key, sizeof(t->key));
    if (t->fd >= 0)
        close(t->fd);
    /* After our own connection, so the server never sees a client vanish mid-call. */
    if (t->srv != NULL)
        loom_store_server_stop(t->srv);
    free(t);
}

static loom_status_t tcp_set(void *impl, const char *key, const void *val, size_t len,
                             loom_err_t *err)
{
    tcp_store_t *t = impl;
    loom_store_resp_t resp;
    return tcp_call(t, LOOM_STORE_OP_SET, key, val, len, NULL, 0, 0, t->op_timeout, &resp,
                    NULL, NULL, err);
}

static loom_status_t tcp_try_get(void *impl, const char *key, void **val_p, size_t *len_p,
                                 int *found_p, loom_err_t *err)
{
    tcp_store_t *t = impl;
    loom_store_resp_t resp;
    void *val;
    size_t len;
    loom_status_t st = tcp_call(t, LOOM_STORE_OP_GET, key, NULL, 0, NULL, 0, 0, t->op_timeout,
                                &resp, &val, &len, err);
    if (st != LOOM_SUCCESS)
        return st;
    if (resp.rc != LOOM_STORE_RC_OK) {
        free(val);
        *found_p = 0;
        return LOOM_SUCCESS;
    }
    *val_p = val;
    *len_p = len;
    *found_p = 1;
    return LOOM_SUCCESS;
}

static loom_status_t tcp_wait(void *impl, const char *key, double timeout_s, loom_err_t *err)
{
    tcp_store_t *t = impl;
    loom_store_resp_t resp;

    if (!(timeout_s > 0))
        timeout_s = 0;
    double ms = timeout_s * 1000.0;
    uint64_t arg = ms >= 9.0e15 ? (uint64_t)9.0e15 : (uint64_t)ms + (ms > (double)(uint64_t)ms);
    loom_status_t st = tcp_call(t, LOOM_STORE_OP_WAIT, key, NULL, 0, NULL, 0, arg,
                                timeout_s + WAIT_GRACE_S, &resp, NULL, NULL, err);
    if (st != LOOM_SUCCESS)
        return st;
    if (resp.rc == LOOM_STORE_RC_TIMEOUT)
        return loom_err_set(err, LOOM_ERR_TIMEOUT,
                            "timed out after %.1f s waiting for store key %s at tcp://%s",
                            timeout_s, key, t->addr);
    return LOOM_SUCCESS;
}

static loom_status_t tcp_add(void *impl, const char *key, int64_t delta, int64_t *value_p,
                             loom_err_t *err)
{
    tcp_store_t *t = impl;
    loom_store_resp_t resp;
    uint64_t arg;

    memcpy(&arg, &delta, sizeof(arg));
    loom_status_t st = tcp_call(t, LOOM_STORE_OP_ADD, key, NULL, 0, NULL, 0, arg,
                                t->op_timeout, &resp, NULL, NULL, err);
    if (st != LOOM_SUCCESS)
        return st;
    if (resp.rc == LOOM_STORE_RC_NOT_INTEGER)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "store key %s does not hold a decimal integer, so it cannot be "
                            "added to", key);
    if (resp.rc == LOOM_STORE_RC_OVERFLOW)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "adding %" PRId64 " to store key %s would overflow int64", delta,
                            key);
    int64_t v;
    memcpy(&v, &resp.arg, sizeof(v));
    *value_p = v;
    return LOOM_SUCCESS;
}

static loom_status_t tcp_cas(void *impl, const char *key, const void *expected, size_t elen,
                             const void *desired, size_t dlen, void **value_p, size_t *len_p,
                             loom_err_t *err)
{
    tcp_store_t *t = impl;
    loom_store_resp_t resp;
    return tcp_call(t, LOOM_STORE_OP_CAS, key, expected, elen, desired, dlen, 0, t->op_timeout,
                    &resp, value_p, len_p, err);
}

static loom_status_t tcp_del(void *impl, const char *key, int *existed_p, loom_err_t *err)
{
    tcp_store_t *t = impl;
    loom_store_resp_t resp;
    loom_status_t st = tcp_call(t, LOOM_STORE_OP_DELETE, key, NULL, 0, NULL, 0, 0,
                                t->op_timeout, &resp, NULL, NULL, err);
    if (st != LOOM_SUCCESS)
        return st;
    *existed_p = resp.arg != 0;
    return LOOM_SUCCESS;
}

static int tcp_local_host(void *impl, char *host, size_t hostlen)
{
    tcp_store_t *t = impl;
    return loom_store_fd_local_host(t->fd, host, hostlen);
}

const loom_store_ops_t loom_store_tcp_ops = {
    .size = sizeof(loom_store_ops_t),
    .scheme = "tcp",
    .open = tcp_open,
    .close = tcp_close,
    .set = tcp_set,
    .try_get = tcp_try_get,
    .wait = tcp_wait,
    .add = tcp_add,
    .cas = tcp_cas,
    .del = tcp_del,
    .local_host = tcp_local_host,
    .open_key = tcp_open_key,
};
