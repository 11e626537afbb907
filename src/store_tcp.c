/* store_tcp.c - the tcp:// store: a client (one connection, one request at a
 * time) and a server (one thread, epoll over non-blocking sockets). The wire
 * format is described in store_proto.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
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
#include "sha256.h"
#include "store.h"
#include "store_proto.h"

/* How long past its own timeout a WAIT may take to be answered before the
 * client gives up on the server. */
#define WAIT_GRACE_S 5.0
/* Buffers above this are freed once idle, so thousands of clients that once
 * sent a big value do not pin memory. */
#define IDLE_BUF_MAX (1u << 20)
/* listen() clamps this to net.core.somaxconn; thousands of ranks may connect at
 * once when a job starts. */
#define LISTEN_BACKLOG 65535

/* ---- Wire encoding. -------------------------------------------------------- */

static void put32(uint8_t *p, uint32_t v)
{
    v = htobe32(v);
    memcpy(p, &v, 4);
}

static void put64(uint8_t *p, uint64_t v)
{
    v = htobe64(v);
    memcpy(p, &v, 8);
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return be32toh(v);
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return be64toh(v);
}

void loom_store_auth_proof(const void *key, size_t keylen, char role,
                           const uint8_t nonce_c[LOOM_STORE_NONCE_LEN],
                           const uint8_t nonce_s[LOOM_STORE_NONCE_LEN],
                           uint8_t out[LOOM_STORE_PROOF_LEN])
{
    const char tag[10] = {'L', 'O', 'O', 'M', 'S', 'T', 'O', 'R', '-', role};
    const void *parts[3] = {tag, nonce_c, nonce_s};
    const size_t lens[3] = {sizeof(tag), LOOM_STORE_NONCE_LEN, LOOM_STORE_NONCE_LEN};
    loom_hmac_sha256(key, keylen, parts, lens, 3, out);
}

void loom_store_hello_pack(uint8_t out[LOOM_STORE_HELLO_LEN], uint32_t version, uint32_t word)
{
    memcpy(out, LOOM_STORE_MAGIC, LOOM_STORE_MAGIC_LEN);
    put32(out + 8, version);
    put32(out + 12, word);
}

void loom_store_req_pack(uint8_t out[LOOM_STORE_REQ_LEN], const loom_store_req_t *req)
{
    put32(out, req->op);
    put32(out + 4, req->klen);
    put32(out + 8, req->alen);
    put32(out + 12, req->blen);
    put64(out + 16, req->arg);
}

void loom_store_resp_pack(uint8_t out[LOOM_STORE_RESP_LEN], const loom_store_resp_t *resp)
{
    put32(out, resp->rc);
    put32(out + 4, resp->vlen);
    put64(out + 8, resp->arg);
}

int loom_store_req_unpack(const uint8_t in[LOOM_STORE_REQ_LEN], loom_store_req_t *req_p)
{
    loom_store_req_t r = {
        .op = get32(in), .klen = get32(in + 4), .alen = get32(in + 8),
        .blen = get32(in + 12), .arg = get64(in + 16),
    };

    if (r.klen == 0 || r.klen > LOOM_STORE_KEY_MAX)
        return -1;
    if (r.alen > LOOM_STORE_VALUE_MAX || r.blen > LOOM_STORE_VALUE_MAX)
        return -1;
    switch (r.op) {
    case LOOM_STORE_OP_SET:
        if (r.blen != 0)
            return -1;
        break;
    case LOOM_STORE_OP_CAS:
        break;
    case LOOM_STORE_OP_GET:
    case LOOM_STORE_OP_WAIT:
    case LOOM_STORE_OP_ADD:
    case LOOM_STORE_OP_DELETE:
        if (r.alen != 0 || r.blen != 0)
            return -1;
        break;
    default:
        return -1;
    }
    *req_p = r;
    return 0;
}

int loom_store_resp_unpack(const uint8_t in[LOOM_STORE_RESP_LEN], uint32_t op,
                           loom_store_resp_t *resp_p)
{
    loom_store_resp_t r = { .rc = get32(in), .vlen = get32(in + 4), .arg = get64(in + 8) };
    int ok;

    switch (op) {
    case LOOM_STORE_OP_GET:
        ok = r.rc == LOOM_STORE_RC_OK || r.rc == LOOM_STORE_RC_NOT_FOUND;
        break;
    case LOOM_STORE_OP_WAIT:
        ok = r.rc == LOOM_STORE_RC_OK || r.rc == LOOM_STORE_RC_TIMEOUT;
        break;
    case LOOM_STORE_OP_ADD:
        ok = r.rc == LOOM_STORE_RC_OK || r.rc == LOOM_STORE_RC_NOT_INTEGER ||
             r.rc == LOOM_STORE_RC_OVERFLOW || r.rc == LOOM_STORE_RC_FULL;
        break;
    case LOOM_STORE_OP_SET:
    case LOOM_STORE_OP_CAS:
        ok = r.rc == LOOM_STORE_RC_OK || r.rc == LOOM_STORE_RC_FULL;
        break;
    case LOOM_STORE_OP_DELETE:
        ok = r.rc == LOOM_STORE_RC_OK;
        break;
    default:
        ok = 0;
    }
    if (!ok || r.vlen > LOOM_STORE_VALUE_MAX)
        return -1;
    int has_value = (op == LOOM_STORE_OP_GET || op == LOOM_STORE_OP_CAS) &&
                    r.rc == LOOM_STORE_RC_OK;
    if (r.vlen != 0 && !has_value)
        return -1;
    *resp_p = r;
    return 0;
}

/* ---- Deadline-bounded socket I/O for the client. ----------------------------- */

typedef enum { IO_OK, IO_TIMEOUT, IO_EOF, IO_ERRNO } io_rc_t;

static int ms_until(double deadline)
{
    double left = deadline - loom_store_now();
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
            if (loom_store_now() >= deadline)
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
    double deadline = loom_store_now() + timeout_s;
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
        double now = loom_store_now();
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

    double deadline = loom_store_now() + timeout_s;
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

/* ---- The server. ----------------------------------------------------------------
 *
 * One thread owns everything below; the only outside contact is the eventfd
 * that loom_store_server_stop writes. Each client is a small state machine: the
 * hello, then a request header, then its payload. While a client has a response
 * pending or a WAIT parked, its input is not read (the protocol has one request
 * in flight), which also bounds its buffers to one request.
 *
 * Anyone who reaches the port is a client, so what one may take is bounded
 * (loom_store_limits_t): a deadline for the hello, an idle timeout, connection
 * caps in total and per source address, and a byte quota over keys, values and
 * request payloads. Values are shared blobs, so a GET costs no copy however
 * slowly its client reads, and a replaced value a reader still holds counts
 * against the quota until it is sent. */

typedef struct srv_client srv_client_t;

typedef struct srv_blob {
    size_t refs;
    uint32_t len;
    uint8_t data[];
} srv_blob_t;

/* What an entry costs the quota besides its value. */
#define ENTRY_COST(klen) (sizeof(srv_entry_t) + (size_t)(klen) + 1)
/* How often connections are checked against their deadlines. */
#define SWEEP_S 0.25

typedef struct srv_entry {
    struct srv_entry *next;       /* hash chain */
    uint64_t hash;
    uint32_t klen;
    char *key;
    srv_blob_t *val;              /* NULL when absent */
    int present;                  /* 0: a placeholder that only holds waiters */
    srv_client_t *waiters;        /* clients parked in WAIT on this key */
} srv_entry_t;

struct srv_client {
    srv_client_t *prev, *next;    /* the live list; next also links the dead list */
    int fd;
    uint32_t events;              /* epoll interest now registered */
    int hello_done, closing, dead;
    int hs;                       /* the hello's step: 0 hello, 1 nonce, 2 proof */
    uint8_t nonce_c[LOOM_STORE_NONCE_LEN], nonce_s[LOOM_STORE_NONCE_LEN];
    uint8_t *in;
    size_t in_len, in_cap, need;
    int have_req;
    loom_store_req_t req;
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    srv_blob_t *out_blob;         /* a value being sent after out, from blob_off */
    size_t blob_off;
    size_t reserved;              /* quota taken for the request being read */
    uint64_t discard;             /* payload bytes to read and drop, then answer FULL */
    srv_entry_t *parked;          /* the key this client waits for, or NULL */
    double deadline;
    srv_client_t *wprev, *wnext;  /* the entry's waiter list */
    double since;                 /* accepted at */
    double last_active;           /* hello or last request finished */
    uint8_t src[16];              /* source address, for the per-host cap */
    uint8_t src_len;
};

struct loom_store_server {
    int lfd, wfd, ep, port;
    pthread_t thread;
    srv_entry_t **tab;
    size_t tab_size, n_entries;
    srv_client_t *clients, *dead;
    size_t n_parked, n_clients;
    double accept_resume;         /* > 0: accepting paused (out of fds) until then */
    uint8_t key[1024];            /* LOOM_AUTH_KEY clients must prove; keylen 0: none */
    size_t keylen;
    double next_sweep;
    loom_store_limits_t lim;
    uint64_t held;                /* bytes counted against lim.max_bytes */
};

static srv_blob_t *blob_new(loom_store_server_t *srv, const void *val, uint32_t len)
{
    srv_blob_t *b = malloc(sizeof(*b) + len);
    if (b == NULL)
        return NULL;
    b->refs = 1;
    b->len = len;
    if (len > 0)
        memcpy(b->data, val, len);
    srv->held += sizeof(*b) + len;
    return b;
}

static void blob_unref(loom_store_server_t *srv, srv_blob_t *b)
{
    if (b != NULL && --b->refs == 0) {
        srv->held -= sizeof(*b) + b->len;
        free(b);
    }
}

/* Whether the quota has room for n more bytes. */
static int quota_has(const loom_store_server_t *srv, uint64_t n)
{
    return srv->held <= srv->lim.max_bytes && n <= srv->lim.max_bytes - srv->held;
}

static uint64_t key_hash(const char *key, size_t len)
{
    /* FNV-1a: keys are short and mostly distinct in their last bytes. */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)key[i];
        h *= 1099511628211ull;
    }
    return h;
}

static void table_grow(loom_store_server_t *srv)
{
    size_t n = srv->tab_size * 2;
    srv_entry_t **tab = calloc(n, sizeof(*tab));
    if (tab == NULL)
        return;  /* keep the old table: longer chains, still correct */
    for (size_t i = 0; i < srv->tab_size; i++) {
        srv_entry_t *e = srv->tab[i];
        while (e != NULL) {
            srv_entry_t *next = e->next;
            size_t j = e->hash & (n - 1);
            e->next = tab[j];
            tab[j] = e;
            e = next;
        }
    }
    free(srv->tab);
    srv->tab = tab;
    srv->tab_size = n;
}

static srv_entry_t *entry_find(loom_store_server_t *srv, const char *key, uint32_t klen,
                               uint64_t h, int create)
{
    for (srv_entry_t *e = srv->tab[h & (srv->tab_size - 1)]; e != NULL; e = e->next)
        if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0)
            return e;
    if (!create)
        return NULL;
    if (srv->n_entries >= srv->tab_size)
        table_grow(srv);
    srv_entry_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    e->key = malloc((size_t)klen + 1);
    if (e->key == NULL) {
        free(e);
        return NULL;
    }
    memcpy(e->key, key, klen);
    e->key[klen] = '\0';
    e->klen = klen;
    e->hash = h;
    srv->held += ENTRY_COST(klen);
    size_t i = h & (srv->tab_size - 1);
    e->next = srv->tab[i];
    srv->tab[i] = e;
    srv->n_entries++;
    return e;
}

/* Free e if it holds neither a value nor waiters. */
static void entry_maybe_free(loom_store_server_t *srv, srv_entry_t *e)
{
    if (e->present || e->waiters != NULL)
        return;
    srv_entry_t **pp = &srv->tab[e->hash & (srv->tab_size - 1)];
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
    srv->n_entries--;
    srv->held -= ENTRY_COST(e->klen);
    blob_unref(srv, e->val);
    free(e->key);
    free(e);
}

static int entry_set(loom_store_server_t *srv, srv_entry_t *e, const void *val, uint32_t len)
{
    srv_blob_t *v = blob_new(srv, val, len);
    if (v == NULL)
        return -1;
    blob_unref(srv, e->val);
    e->val = v;
    e->present = 1;
    return 0;
}

static void park(loom_store_server_t *srv, srv_client_t *c, srv_entry_t *e, double deadline)
{
    c->parked = e;
    c->deadline = deadline;
    c->wprev = NULL;
    c->wnext = e->waiters;
    if (e->waiters != NULL)
        e->waiters->wprev = c;
    e->waiters = c;
    srv->n_parked++;
}

static void unpark(loom_store_server_t *srv, srv_client_t *c)
{
    srv_entry_t *e = c->parked;
    if (c->wprev != NULL)
        c->wprev->wnext = c->wnext;
    else
        e->waiters = c->wnext;
    if (c->wnext != NULL)
        c->wnext->wprev = c->wprev;
    c->parked = NULL;
    c->wprev = c->wnext = NULL;
    srv->n_parked--;
    c->last_active = loom_store_now();   /* its idle time starts when the WAIT ends */
}

static int can_read(const srv_client_t *c)
{
    return !c->closing && c->parked == NULL && c->out_len == 0 && c->out_blob == NULL;
}

static int has_output(const srv_client_t *c)
{
    return c->out_off < c->out_len || c->out_blob != NULL;
}

static void update_interest(loom_store_server_t *srv, srv_client_t *c)
{
    if (c->dead)
        return;
    uint32_t want = EPOLLRDHUP | (can_read(c) ? EPOLLIN : 0) | (has_output(c) ? EPOLLOUT : 0);
    if (want == c->events)
        return;
    struct epoll_event ev = { .events = want, .data.ptr = c };
    epoll_ctl(srv->ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->events = want;
}

static void drop(loom_store_server_t *srv, srv_client_t *c)
{
    if (c->dead)
        return;
    epoll_ctl(srv->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (c->parked != NULL) {
        srv_entry_t *e = c->parked;
        unpark(srv, c);
        entry_maybe_free(srv, e);
    }
    blob_unref(srv, c->out_blob);
    c->out_blob = NULL;
    srv->held -= c->reserved;
    c->reserved = 0;
    srv->n_clients--;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        srv->clients = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    /* Freed at the end of the loop round: this round's events may still name it. */
    c->dead = 1;
    c->next = srv->dead;
    srv->dead = c;
}

static void free_client(srv_client_t *c)
{
    free(c->in);
    free(c->out);
    free(c);
}

static int flush(loom_store_server_t *srv, srv_client_t *c)
{
    while (has_output(c)) {
        struct iovec iov[2];
        int n = 0;
        size_t head = c->out_len - c->out_off;
        if (head > 0)
            iov[n++] = (struct iovec){ c->out + c->out_off, head };
        if (c->out_blob != NULL)
            iov[n++] = (struct iovec){ c->out_blob->data + c->blob_off,
                                       c->out_blob->len - c->blob_off };
        struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)n };
        ssize_t r = n > 0 ? sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) : 0;
        if (r >= 0) {
            size_t done = (size_t)r, h = done < head ? done : head;
            c->out_off += h;
            if (c->out_blob != NULL) {
                c->blob_off += done - h;
                if (c->blob_off == c->out_blob->len) {
                    blob_unref(srv, c->out_blob);
                    c->out_blob = NULL;
                }
            }
            if (r == 0 && n > 0)
                return 0;
        } else if (errno == EINTR)
            continue;
        else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        else
            return -1;
    }
    c->out_off = c->out_len = 0;
    if (c->out_cap > IDLE_BUF_MAX) {
        free(c->out);
        c->out = NULL;
        c->out_cap = 0;
    }
    return 0;
}

static int out_append(srv_client_t *c, const void *p, size_t n)
{
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 256;
        while (cap < c->out_len + n)
            cap *= 2;
        uint8_t *o = realloc(c->out, cap);
        if (o == NULL)
            return -1;
        c->out = o;
        c->out_cap = cap;
    }
    if (n > 0)
        memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
    return 0;
}

/* Queue a response, with value val (may be NULL), and push out what the
 * socket takes now. -1: drop c. */
static int reply(loom_store_server_t *srv, srv_client_t *c, uint32_t rc, uint64_t arg,
                 srv_blob_t *val)
{
    loom_store_resp_t r = { .rc = rc, .vlen = val != NULL ? val->len : 0, .arg = arg };
    uint8_t h[LOOM_STORE_RESP_LEN];
    loom_store_resp_pack(h, &r);
    if (out_append(c, h, sizeof(h)) != 0)
        return -1;
    if (val != NULL && val->len > 0) {
        val->refs++;
        c->out_blob = val;
        c->blob_off = 0;
    }
    return flush(srv, c);
}

/* Answer everyone parked on e, which now has a value. */
static void wake(loom_store_server_t *srv, srv_entry_t *e)
{
    while (e->waiters != NULL) {
        srv_client_t *w = e->waiters;
        unpark(srv, w);
        if (reply(srv, w, LOOM_STORE_RC_OK, 0, NULL) != 0)
            drop(srv, w);
        else
            update_interest(srv, w);
    }
}

/* Carry out the complete request in c->in. -1: drop c. */
static int execute(loom_store_server_t *srv, srv_client_t *c)
{
    const loom_store_req_t *r = &c->req;
    const char *key = (const char *)c->in + LOOM_STORE_REQ_LEN;
    const uint8_t *a = (const uint8_t *)key + r->klen;
    const uint8_t *b = a + r->alen;
    uint64_t h = key_hash(key, r->klen);
    srv_entry_t *e = entry_find(srv, key, r->klen, h, 0);
    int present = e != NULL && e->present;

    /* A new key costs the quota too: a flood of ADDs to fresh keys fills it. */
    if (e == NULL && r->op != LOOM_STORE_OP_GET && r->op != LOOM_STORE_OP_DELETE &&
        r->op != LOOM_STORE_OP_WAIT && !quota_has(srv, ENTRY_COST(r->klen) + 64))
        return reply(srv, c, LOOM_STORE_RC_FULL, 0, NULL);

    switch (r->op) {
    case LOOM_STORE_OP_SET:
        if (e == NULL && (e = entry_find(srv, key, r->klen, h, 1)) == NULL)
            return -1;
        if (entry_set(srv, e, a, r->alen) != 0) {
            entry_maybe_free(srv, e);
            return -1;
        }
        wake(srv, e);
        return reply(srv, c, LOOM_STORE_RC_OK, 0, NULL);

    case LOOM_STORE_OP_GET:
        if (!present)
            return reply(srv, c, LOOM_STORE_RC_NOT_FOUND, 0, NULL);
        return reply(srv, c, LOOM_STORE_RC_OK, 0, e->val);

    case LOOM_STORE_OP_WAIT:
        if (present)
            return reply(srv, c, LOOM_STORE_RC_OK, 0, NULL);
        if (r->arg == 0)
            return reply(srv, c, LOOM_STORE_RC_TIMEOUT, 0, NULL);
        if (e == NULL && (e = entry_find(srv, key, r->klen, h, 1)) == NULL)
            return -1;
        park(srv, c, e, loom_store_now() + (double)r->arg / 1000.0);
        return 0;

    case LOOM_STORE_OP_ADD: {
        int64_t cur = 0, delta, sum;
        memcpy(&delta, &r->arg, sizeof(delta));
        if (present && loom_store_parse_int64(e->val->data, e->val->len, &cur) != 0)
            return reply(srv, c, LOOM_STORE_RC_NOT_INTEGER, 0, NULL);
        if (__builtin_add_overflow(cur, delta, &sum))
            return reply(srv, c, LOOM_STORE_RC_OVERFLOW, 0, NULL);
        char text[24];
        int n = snprintf(text, sizeof(text), "%" PRId64, sum);
        if (e == NULL && (e = entry_find(srv, key, r->klen, h, 1)) == NULL)
            return -1;
        if (entry_set(srv, e, text, (uint32_t)n) != 0) {
            entry_maybe_free(srv, e);
            return -1;
        }
        wake(srv, e);
        uint64_t out;
        memcpy(&out, &sum, sizeof(out));
        return reply(srv, c, LOOM_STORE_RC_OK, out, NULL);
    }

    case LOOM_STORE_OP_CAS: {
        uint32_t clen = present ? e->val->len : 0;
        if (r->alen == clen && (clen == 0 || memcmp(a, e->val->data, clen) == 0)) {
            if (e == NULL && (e = entry_find(srv, key, r->klen, h, 1)) == NULL)
                return -1;
            if (entry_set(srv, e, b, r->blen) != 0) {
                entry_maybe_free(srv, e);
                return -1;
            }
            wake(srv, e);
            present = 1;
        }
        return reply(srv, c, LOOM_STORE_RC_OK, 0, present ? e->val : NULL);
    }

    case LOOM_STORE_OP_DELETE:
        if (present) {
            blob_unref(srv, e->val);
            e->val = NULL;
            e->present = 0;
            entry_maybe_free(srv, e);
        }
        return reply(srv, c, LOOM_STORE_RC_OK, present ? 1 : 0, NULL);
    }
    return -1;  /* unreachable: the header was validated */
}

static void reset_input(loom_store_server_t *srv, srv_client_t *c)
{
    srv->held -= c->reserved;
    c->reserved = 0;
    c->discard = 0;
    c->in_len = 0;
    c->need = LOOM_STORE_REQ_LEN;
    c->have_req = 0;
    if (c->in_cap > IDLE_BUF_MAX) {
        free(c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
}

/* Answer the hello with word; closing: then drop the client. */
static int hello_answer(loom_store_server_t *srv, srv_client_t *c, uint32_t word, int closing,
                        const void *more, size_t morelen)
{
    uint8_t h[LOOM_STORE_HELLO_LEN];
    loom_store_hello_pack(h, LOOM_STORE_PROTO_VERSION, word);
    c->hello_done = word != LOOM_STORE_HELLO_CHALLENGE;
    c->closing = closing;
    reset_input(srv, c);
    if (out_append(c, h, sizeof(h)) != 0 || (morelen && out_append(c, more, morelen) != 0))
        return -1;
    return flush(srv, c);
}

/* The hello, and with a key on either side the nonces and proofs (store_proto.h):
 * nothing is served to a client before it proved the server's key. */
static int hello_step(loom_store_server_t *srv, srv_client_t *c)
{
    if (c->hs == 0) {
        if (memcmp(c->in, LOOM_STORE_MAGIC, LOOM_STORE_MAGIC_LEN) != 0)
            return -1;
        if (get32(c->in + 8) != LOOM_STORE_PROTO_VERSION)
            return hello_answer(srv, c, LOOM_STORE_HELLO_REFUSED, 1, NULL, 0);
        if (get32(c->in + 12) == LOOM_STORE_HELLO_AUTH) {
            c->hs = 1;
            c->in_len = 0;
            c->need = LOOM_STORE_NONCE_LEN;
            return 0;
        }
        if (srv->keylen)
            return hello_answer(srv, c, LOOM_STORE_HELLO_AUTH_REQUIRED, 1, NULL, 0);
        return hello_answer(srv, c, LOOM_STORE_HELLO_OK, 0, NULL, 0);
    }
    if (c->hs == 1) {
        memcpy(c->nonce_c, c->in, LOOM_STORE_NONCE_LEN);
        if (!srv->keylen)
            return hello_answer(srv, c, LOOM_STORE_HELLO_OK, 0, NULL, 0);
        uint8_t chal[LOOM_STORE_NONCE_LEN + LOOM_STORE_PROOF_LEN];
        if (getrandom(c->nonce_s, sizeof(c->nonce_s), 0) != (ssize_t)sizeof(c->nonce_s))
            return -1;
        memcpy(chal, c->nonce_s, sizeof(c->nonce_s));
        loom_store_auth_proof(srv->key, srv->keylen, 'S', c->nonce_c, c->nonce_s,
                              chal + LOOM_STORE_NONCE_LEN);
        if (hello_answer(srv, c, LOOM_STORE_HELLO_CHALLENGE, 0, chal, sizeof(chal)) != 0)
            return -1;
        c->hs = 2;
        c->in_len = 0;
        c->need = LOOM_STORE_PROOF_LEN;
        return 0;
    }
    uint8_t want[LOOM_STORE_PROOF_LEN];
    loom_store_auth_proof(srv->key, srv->keylen, 'C', c->nonce_c, c->nonce_s, want);
    if (!loom_equal_ct(want, c->in, sizeof(want)))
        return hello_answer(srv, c, LOOM_STORE_HELLO_REFUSED_AUTH, 1, NULL, 0);
    return hello_answer(srv, c, LOOM_STORE_HELLO_OK, 0, NULL, 0);
}

/* c->in holds c->need bytes: the hello, a header or a whole request. -1: drop c. */
static int process(loom_store_server_t *srv, srv_client_t *c)
{
    if (!c->hello_done)
        return hello_step(srv, c);
    if (!c->have_req) {
        if (loom_store_req_unpack(c->in, &c->req) != 0)
            return -1;
        c->have_req = 1;
        /* At most 24 + 1024 + 2 * 64 MiB: no overflow in size_t. */
        size_t payload = (size_t)c->req.klen + c->req.alen + c->req.blen;
        c->need = LOOM_STORE_REQ_LEN + payload;
        if (c->req.alen + (uint64_t)c->req.blen > 0 && !quota_has(srv, payload)) {
            /* Read the payload into nothing, then say why: the client learns the
             * store is full instead of seeing its connection drop. */
            c->discard = payload;
            return 0;
        }
        c->reserved = payload;
        srv->held += payload;
        return 0;
    }
    /* Keys are C strings on the client side; an embedded NUL is a forged request. */
    if (memchr(c->in + LOOM_STORE_REQ_LEN, 0, c->req.klen) != NULL)
        return -1;
    int rc = execute(srv, c);
    reset_input(srv, c);
    c->last_active = loom_store_now();
    return rc;
}

/* Read and drop what c->discard says is left of a refused request. -1: drop c,
 * 0: would block or done. */
static int discard_input(loom_store_server_t *srv, srv_client_t *c)
{
    uint8_t sink[16384];
    while (c->discard > 0) {
        size_t want = c->discard < sizeof(sink) ? (size_t)c->discard : sizeof(sink);
        ssize_t r = recv(c->fd, sink, want, 0);
        if (r == 0)
            return -1;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        }
        c->discard -= (uint64_t)r;
    }
    reset_input(srv, c);
    c->last_active = loom_store_now();
    return reply(srv, c, LOOM_STORE_RC_FULL, 0, NULL);
}

/* Read what c may send now and act on every complete unit. -1: drop c. */
static int client_read(loom_store_server_t *srv, srv_client_t *c)
{
    while (can_read(c)) {
        if (c->discard > 0) {
            if (discard_input(srv, c) != 0)
                return -1;
            if (c->discard > 0)
                return 0;
            continue;
        }
        if (c->in_len == c->need) {
            if (process(srv, c) != 0)
                return -1;
            continue;
        }
        if (c->in_len == c->in_cap) {
            /* Grow as bytes arrive, not to the announced length at once: a client
             * that announces 128 MiB and sends nothing should cost nothing. */
            size_t cap = c->in_cap < 4096 ? 4096 : c->in_cap * 2;
            if (cap > c->need)
                cap = c->need;
            uint8_t *in = realloc(c->in, cap);
            if (in == NULL)
                return -1;
            c->in = in;
            c->in_cap = cap;
        }
        size_t want = (c->need < c->in_cap ? c->need : c->in_cap) - c->in_len;
        ssize_t r = recv(c->fd, c->in + c->in_len, want, 0);
        if (r == 0)
            return -1;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -1;
        }
        c->in_len += (size_t)r;
    }
    return 0;
}

static void client_event(loom_store_server_t *srv, srv_client_t *c, uint32_t ev)
{
    if (c->dead)
        return;
    if (ev & EPOLLERR)
        goto drop_client;
    if ((ev & EPOLLOUT) && flush(srv, c) != 0)
        goto drop_client;
    if (can_read(c)) {
        if ((ev & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)) && client_read(srv, c) != 0)
            goto drop_client;
    } else if (ev & (EPOLLHUP | EPOLLRDHUP)) {
        /* Gone while parked or while we had an answer for it: nobody to tell. */
        goto drop_client;
    }
    if (c->closing && !has_output(c))
        goto drop_client;
    update_interest(srv, c);
    return;

drop_client:
    drop(srv, c);
}

/* Whether c may be closed to make room: it has not finished its hello, or it
 * sits between requests with nothing parked (its owner reconnects). */
static int evictable(const srv_client_t *c)
{
    if (!c->hello_done)
        return 1;
    if (c->parked != NULL || has_output(c) || c->in_len != 0 || c->have_req || c->discard != 0)
        return 0;
    /* A request already on its way would be answered by EOF: keep that one. */
    char b;
    return recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) < 0 && (errno == EAGAIN ||
                                                               errno == EWOULDBLOCK);
}

/* Close the oldest connection without a finished hello, else the longest
 * idle one, to make room for a new one. 0 when one was closed. */
static int evict_one(loom_store_server_t *srv)
{
    srv_client_t *victim = NULL;
    for (srv_client_t *c = srv->clients; c != NULL; c = c->next) {
        if (!evictable(c))
            continue;
        if (victim == NULL || (!c->hello_done && victim->hello_done) ||
            (c->hello_done == victim->hello_done &&
             (c->hello_done ? c->last_active < victim->last_active : c->since < victim->since)))
            victim = c;
    }
    if (victim == NULL)
        return -1;
    drop(srv, victim);
    return 0;
}

static void source_of(const struct sockaddr_storage *ss, uint8_t src[16], uint8_t *len_p)
{
    if (ss->ss_family == AF_INET6) {
        memcpy(src, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
        *len_p = 16;
    } else if (ss->ss_family == AF_INET) {
        memcpy(src, &((const struct sockaddr_in *)ss)->sin_addr, 4);
        *len_p = 4;
    } else {
        *len_p = 0;
    }
}

static long clients_from(const loom_store_server_t *srv, const uint8_t *src, uint8_t len)
{
    long n = 0;
    for (const srv_client_t *c = srv->clients; c != NULL; c = c->next)
        n += c->src_len == len && memcmp(c->src, src, len) == 0;
    return n;
}

static void accept_clients(loom_store_server_t *srv)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept4(srv->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            /* Out of descriptors: a stranger's idle connections must not keep
             * the ranks out, so one of them (or an idle client) goes. */
            if ((errno == EMFILE || errno == ENFILE) && evict_one(srv) == 0)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* The listener stays readable while the backlog is full; stop
                 * watching it for a moment instead of spinning. */
                struct epoll_event ev = { .events = 0, .data.ptr = &srv->lfd };
                epoll_ctl(srv->ep, EPOLL_CTL_MOD, srv->lfd, &ev);
                srv->accept_resume = loom_store_now() + 0.1;
            }
            return;
        }
        uint8_t src[16], src_len;
        source_of(&ss, src, &src_len);
        if (src_len > 0 && clients_from(srv, src, src_len) >= srv->lim.max_clients_per_host) {
            close(fd);
            continue;
        }
        if ((long)srv->n_clients >= srv->lim.max_clients && evict_one(srv) != 0) {
            close(fd);
            continue;
        }
        srv_client_t *c = calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->fd = fd;
        c->need = LOOM_STORE_HELLO_LEN;
        c->events = EPOLLIN | EPOLLRDHUP;
        c->since = c->last_active = loom_store_now();
        memcpy(c->src, src, sizeof(src));
        c->src_len = src_len;
        struct epoll_event ev = { .events = c->events, .data.ptr = c };
        if (epoll_ctl(srv->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            free(c);
            continue;
        }
        c->next = srv->clients;
        if (srv->clients != NULL)
            srv->clients->prev = c;
        srv->clients = c;
        srv->n_clients++;
    }
}

static int expired(const loom_store_server_t *srv, const srv_client_t *c, double now)
{
    if (!c->hello_done)
        return now - c->since > srv->lim.hello_timeout_s;
    return c->parked == NULL && !has_output(c) && now - c->last_active > srv->lim.idle_timeout_s;
}

/* Close connections past their hello deadline, and clients idle too long. */
static void sweep(loom_store_server_t *srv, double now)
{
    srv_client_t *c_next;
restart:
    for (srv_client_t *c = srv->clients; c != NULL; c = c_next) {
        c_next = c->next;
        if (!expired(srv, c, now))
            continue;
        /* If this thread was starved, the bytes that keep c alive may wait
         * unread: act on them first. */
        client_event(srv, c, EPOLLIN);
        if (!c->dead && expired(srv, c, now))
            drop(srv, c);
        if (c_next != NULL && c_next->dead)
            goto restart;   /* answering c dropped others: the list changed */
    }
}

/* Answer parked WAITs whose time is up; returns the epoll timeout (ms) until
 * the next deadline, -1 for none. */
static int expire(loom_store_server_t *srv)
{
    double now = loom_store_now(), next = -1;

    if (srv->clients != NULL) {
        if (now >= srv->next_sweep) {
            sweep(srv, now);
            srv->next_sweep = now + SWEEP_S;
        }
        next = srv->next_sweep;
    }

    if (srv->accept_resume > 0) {
        if (now >= srv->accept_resume) {
            struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &srv->lfd };
            epoll_ctl(srv->ep, EPOLL_CTL_MOD, srv->lfd, &ev);
            srv->accept_resume = 0;
        } else if (next < 0 || srv->accept_resume < next) {
            next = srv->accept_resume;
        }
    }
    if (srv->n_parked > 0) {
        srv_client_t *c_next;
        for (srv_client_t *c = srv->clients; c != NULL; c = c_next) {
            c_next = c->next;
            if (c->parked == NULL)
                continue;
            if (c->deadline <= now) {
                srv_entry_t *e = c->parked;
                unpark(srv, c);
                entry_maybe_free(srv, e);
                if (reply(srv, c, LOOM_STORE_RC_TIMEOUT, 0, NULL) != 0)
                    drop(srv, c);
                else
                    update_interest(srv, c);
            } else if (next < 0 || c->deadline < next) {
                next = c->deadline;
            }
        }
    }
    if (next < 0)
        return -1;
    double ms = (next - now) * 1000.0 + 1.0;
    return ms > (double)INT_MAX ? INT_MAX : (int)ms;
}

static void *server_main(void *arg)
{
    loom_store_server_t *srv = arg;
    struct epoll_event evs[64];
    int stop = 0;

    while (!stop) {
        int timeout = expire(srv);
        while (srv->dead != NULL) {
            srv_client_t *c = srv->dead;
            srv->dead = c->next;
            free_client(c);
        }
        int n = epoll_wait(srv->ep, evs, 64, timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            break;  /* a bug (EBADF...): clients see their connections close */
        }
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &srv->wfd)
                stop = 1;
            else if (p == &srv->lfd)
                accept_clients(srv);
            else
                client_event(srv, p, evs[i].events);
        }
    }
    return NULL;
}

/* Bind and listen on host:port (host NULL: every interface, IPv6 and IPv4). */
static int listen_on(const char *host, int port, int *sys_errno_p, loom_err_t *err)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
    struct addrinfo *res;
    char ps[8], shown[NI_MAXHOST + 16];

    snprintf(ps, sizeof(ps), "%d", port);
    loom_store_format_hostport(host != NULL ? host : "*", port, shown, sizeof(shown));
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) {
        *sys_errno_p = EADDRNOTAVAIL;
        loom_err_set(err, LOOM_ERR_INVALID_ARG, "cannot listen on %s: %s", shown,
                     g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
        return -1;
    }
    int fd = -1, e = 0, in_use = 0;
    /* For all interfaces, one dual-stack IPv6 socket serves both families; an
     * IPv4 socket is the fallback on hosts without IPv6. */
    for (int pass = 0; pass < 2 && fd < 0; pass++) {
        for (struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
            if (host == NULL && (pass == 0) != (ai->ai_family == AF_INET6))
                continue;
            if (host != NULL && pass == 1)
                continue;
            fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                        ai->ai_protocol);
            if (fd < 0) {
                e = errno;
                continue;
            }
            int one = 1, zero = 0;
            /* Rank 0 of a restarted job must get its port back from TIME_WAIT. */
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
            if (host == NULL && ai->ai_family == AF_INET6)
                setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
            if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
                listen(fd, LISTEN_BACKLOG) != 0) {
                e = errno;
                in_use |= e == EADDRINUSE;
                close(fd);
                fd = -1;
            }
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        if (in_use)
            e = EADDRINUSE;
        *sys_errno_p = e;
        loom_err_set(err, LOOM_ERR_TRANSPORT, "cannot listen on %s: %s", shown, strerror(e));
    }
    return fd;
}

loom_status_t loom_store_server_start_opts(const char *host, int port, const void *key,
                                           size_t keylen, const loom_store_limits_t *lim,
                                           int *sys_errno_p, loom_err_t *err,
                                           loom_store_server_t **srv_p)
{
    loom_status_t st;
    int e = 0;
    loom_store_limits_t env_lim;

    if (sys_errno_p != NULL)
        *sys_errno_p = 0;
    if (srv_p == NULL || port < 0 || port > 65535)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "store server: port %d out of range or output pointer NULL", port);
    if (keylen > sizeof(((loom_store_server_t *)0)->key))
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "store server: the key is too long");
    if (lim == NULL) {
        if ((st = loom_store_limits_from_env(&env_lim, err)) != LOOM_SUCCESS)
            return st;
        lim = &env_lim;
    }
    loom_store_server_t *srv = calloc(1, sizeof(*srv));
    if (srv == NULL)
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory starting the store server");
    if (keylen > 0)
        memcpy(srv->key, key, keylen);
    srv->keylen = keylen;
    srv->lim = *lim;
    srv->tab_size = 256;
    srv->tab = calloc(srv->tab_size, sizeof(*srv->tab));
    if (srv->tab == NULL) {
        st = loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory starting the store server");
        goto free_server;
    }
    srv->lfd = listen_on(host, port, &e, err);
    if (srv->lfd < 0) {
        st = err != NULL && err->status != LOOM_SUCCESS ? err->status : LOOM_ERR_TRANSPORT;
        if (sys_errno_p != NULL)
            *sys_errno_p = e;
        goto free_table;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(srv->lfd, (struct sockaddr *)&ss, &sl) != 0) {
        st = loom_err_set(err, LOOM_ERR_TRANSPORT, "getsockname: %s", strerror(errno));
        goto close_listener;
    }
    srv->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    srv->ep = epoll_create1(EPOLL_CLOEXEC);
    if (srv->ep < 0) {
        st = loom_err_set(err, LOOM_ERR_TRANSPORT, "epoll_create1: %s", strerror(errno));
        goto close_listener;
    }
    srv->wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (srv->wfd < 0) {
        st = loom_err_set(err, LOOM_ERR_TRANSPORT, "eventfd: %s", strerror(errno));
        goto close_epoll;
    }
    struct epoll_event lev = { .events = EPOLLIN, .data.ptr = &srv->lfd };
    struct epoll_event wev = { .events = EPOLLIN, .data.ptr = &srv->wfd };
    if (epoll_ctl(srv->ep, EPOLL_CTL_ADD, srv->lfd, &lev) != 0 ||
        epoll_ctl(srv->ep, EPOLL_CTL_ADD, srv->wfd, &wev) != 0) {
        st = loom_err_set(err, LOOM_ERR_TRANSPORT, "epoll_ctl: %s", strerror(errno));
        goto close_eventfd;
    }
    /* The server thread takes no signals: they belong to the application's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&srv->thread, NULL, server_main, srv);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        st = loom_err_set(err, LOOM_ERR_INTERNAL, "starting the store server thread: %s",
                          strerror(rc));
        goto close_eventfd;
    }
    *srv_p = srv;
    return LOOM_SUCCESS;

close_eventfd:
    close(srv->wfd);
close_epoll:
    close(srv->ep);
close_listener:
    close(srv->lfd);
free_table:
    free(srv->tab);
free_server:
    free(srv);
    return st;
}

loom_status_t loom_store_server_start_key(const char *host, int port, const void *key,
                                          size_t keylen, int *sys_errno_p, loom_err_t *err,
                                          loom_store_server_t **srv_p)
{
    return loom_store_server_start_opts(host, port, key, keylen, NULL, sys_errno_p, err, srv_p);
}

loom_status_t loom_store_server_start_limits(const char *host, int port,
                                             const loom_store_limits_t *lim, int *sys_errno_p,
                                             loom_err_t *err, loom_store_server_t **srv_p)
{
    return loom_store_server_start_opts(host, port, NULL, 0, lim, sys_errno_p, err, srv_p);
}

loom_status_t loom_store_server_start_errno(const char *host, int port, int *sys_errno_p,
                                            loom_err_t *err, loom_store_server_t **srv_p)
{
    return loom_store_server_start_opts(host, port, NULL, 0, NULL, sys_errno_p, err, srv_p);
}

loom_status_t loom_store_server_start(const char *host, int port, loom_err_t *err,
                                      loom_store_server_t **srv_p)
{
    return loom_store_server_start_key(host, port, NULL, 0, NULL, err, srv_p);
}

loom_status_t loom_store_server_start_auth(const char *host, int port, const void *key,
                                           size_t keylen, loom_err_t *err,
                                           loom_store_server_t **srv_p)
{
    return loom_store_server_start_key(host, port, key, keylen, NULL, err, srv_p);
}

int loom_store_server_port(const loom_store_server_t *srv)
{
    return srv->port;
}

/* Everything of a server whose thread has ended (or never ran: the fuzzer,
 * tests/fuzz/fuzz_store_server.c, drives clients by hand). */
static void server_free(loom_store_server_t *srv)
{
    while (srv->clients != NULL)
        drop(srv, srv->clients);
    while (srv->dead != NULL) {
        srv_client_t *c = srv->dead;
        srv->dead = c->next;
        free_client(c);
    }
    for (size_t i = 0; i < srv->tab_size; i++) {
        srv_entry_t *e = srv->tab[i];
        while (e != NULL) {
            srv_entry_t *next = e->next;
            blob_unref(srv, e->val);
            free(e->key);
            free(e);
            e = next;
        }
    }
    free(srv->tab);
    close(srv->wfd);
    close(srv->ep);
    close(srv->lfd);
    free(srv);
}

void loom_store_server_stop(loom_store_server_t *srv)
{
    if (srv == NULL)
        return;
    uint64_t one = 1;
    while (write(srv->wfd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
    pthread_join(srv->thread, NULL);
    server_free(srv);
}
