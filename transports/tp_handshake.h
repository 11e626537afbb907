/* tp_handshake.h - bringing up the sockets of a network transport, once for
 * tcp.c and ibverbs (whose side channel is a socket too): every pair at once,
 * rank r dials every lower rank and accepts every higher one, one small state
 * machine per socket, strangers shed when they stall or crowd the table; and
 * the hello handshake of wire.h (hello, with LOOM_AUTH_KEY a challenge and a
 * proof each way, then an ack), which tcp.c speaks and a new transport can
 * reuse for its bootstrap. ibverbs exchanges its own records over the same
 * table (ib_connect.c), proven with the same proofs.
 *
 * The driver (loom_hs_run) polls, dials again after a refusal, accepts, and
 * calls the transport's step for each socket that is connected or readable;
 * the step moves that one connection on and says when it is established. */
#ifndef LOOM_TP_HANDSHAKE_H
#define LOOM_TP_HANDSHAKE_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "transport.h"
#include "wire.h"

/* Room for the largest message a step waits for (ibverbs: a record, a proof
 * and a ready byte; tcp: a challenge). */
#define LOOM_HS_BUF_BYTES 160
#define LOOM_HS_OPENING_BYTES 96

/* Where a connection is, as the driver sees it. */
enum { LOOM_HS_DIALING, LOOM_HS_TALKING, LOOM_HS_DONE, LOOM_HS_DEAD };

/* The steps of the hello handshake within LOOM_HS_TALKING. Connector:
 * SEND_HELLO -> WAIT_ACK (an ack, or with a key a challenge, after which it
 * sends its proof) -> WAIT_FINAL_ACK. Acceptor: WAIT_HELLO (with a key: the
 * hello and the connector's nonce; it answers with a challenge) ->
 * WAIT_PROOF; then an ack. */
enum {
    LOOM_HS_SEND_HELLO, LOOM_HS_WAIT_ACK, LOOM_HS_WAIT_FINAL_ACK, LOOM_HS_WAIT_HELLO,
    LOOM_HS_WAIT_PROOF
};

typedef struct loom_hs_conn {
    int fd;
    int peer;            /* known when dialled; from its first message when accepted, -1 before */
    int stream;          /* likewise: which of the pair's streams (tcp) */
    int phase;           /* LOOM_HS_DIALING .. LOOM_HS_DEAD */
    int step;            /* the transport's step within LOOM_HS_TALKING */
    int accepted;        /* we accepted it (else we dialled it) */
    int stranger;        /* accepted and not yet trusted: may be shed or evicted */
    int heard;           /* it sent us a byte */
    int pending;         /* accepted: bytes were read at accept, look at them */
    int up, proven;      /* ibverbs: our QP is up; the acceptor checked the dialer's proof */
    uint8_t buf[LOOM_HS_BUF_BYTES];
    size_t have, need;   /* bytes read of the message expected, and its size */
    /* The opening message (tcp: the connector's hello, as sent or received;
     * ibverbs: the record we sent): the proofs cover it. */
    uint8_t opening[LOOM_HS_OPENING_BYTES];
    uint8_t nonce_c[LOOM_NONCE_BYTES], nonce_a[LOOM_NONCE_BYTES];   /* dialer's, acceptor's */
    uint8_t bind[LOOM_BIND_BYTES];     /* both ends as published: both proofs cover it */
    double retry_at;     /* dialled: when to try again after a refusal */
    double since;        /* accepted: when (strangers get stranger_s) */
} loom_hs_conn_t;

typedef struct loom_hs_table loom_hs_table_t;

typedef struct loom_hs_ops {
    /* c is connected (a dial, called once as it completes) or readable: move
     * it on; 1 when it is now established. A fatal error goes to *t->failed. */
    int (*step)(void *arg, loom_hs_table_t *t, loom_hs_conn_t *c, double now);
    /* Refuse and close an accepted connection (shed or evicted). */
    void (*drop)(void *arg, loom_hs_conn_t *c);
    /* The deadline passed: record why in *t->failed. */
    void (*timed_out)(void *arg, loom_hs_table_t *t);
    /* Optional: a status to stop with (an abort), else LOOM_SUCCESS. */
    loom_status_t (*check)(void *arg);
} loom_hs_ops_t;

/* The connections of one connect: those we dial first ([0, nout)), then the
 * accepted ones; pfds[0] is the listener. */
struct loom_hs_table {
    loom_hs_conn_t *conns;
    struct pollfd *pfds;           /* [i + 1]: conns[i] */
    struct sockaddr_storage *ss;   /* [rank below ours]: where it listens */
    socklen_t *sslen;
    int nconn, maxconn, nout;
    int want, established;         /* connections to bring up, and those up */
    int listen_fd;                 /* -1: nobody dials us */
    int sockbuf;                   /* SO_SNDBUF/SO_RCVBUF of dialled sockets, 0: default */
    int accept_step;               /* an accepted connection starts at this step */
    size_t accept_need;            /* waiting for this many bytes */
    double timeout_s, deadline, stranger_s;
    /* Failures: the instance's sticky status and message, as loom_tp_fail. */
    loom_status_t *failed;
    loom_err_t *err;
    const char *subsys;            /* "tcp", "ibverbs" */
    const char *prefix;            /* put before messages: "", "ibverbs: " */
    int rank;
    char *const *addrs;            /* as published, for messages */
};

/* What a table is for: who owns it, where its failure goes, how accepted
 * connections start. */
typedef struct loom_hs_params {
    int rank;
    int ndial, naccept;            /* connections we dial, and that dial us */
    double timeout_s;
    loom_status_t *failed;         /* the instance's sticky status, as loom_tp_fail */
    loom_err_t *err;
    const char *subsys;            /* "tcp", "ibverbs" */
    const char *prefix;            /* put before messages: "", "ibverbs: " */
    char *const *addrs;            /* as published, for messages */
    int listen_fd;                 /* ours (used when naccept > 0) */
    int sockbuf;                   /* SO_SNDBUF/SO_RCVBUF of dialled sockets, 0: default */
    int accept_step;               /* an accepted connection starts at this step */
    size_t accept_need;            /* waiting for this many bytes */
} loom_hs_params_t;

/* Room for p's connections (plus some for strangers) against a deadline
 * p->timeout_s away; -1 (the failure recorded) when out of memory. */
int loom_hs_table_init(loom_hs_table_t *t, const loom_hs_params_t *p);
/* Close the sockets not handed over (fd >= 0) and free the table. */
void loom_hs_table_free(loom_hs_table_t *t);
/* Add a connection to dial to rank peer (stream) at ss; 0, or -1 with the
 * failure recorded. */
int loom_hs_table_dial(loom_hs_table_t *t, int peer, int stream, const struct sockaddr_storage *ss,
                       socklen_t sslen);
/* Until every connection is established, a failure, or the deadline. */
loom_status_t loom_hs_run(loom_hs_table_t *t, const loom_hs_ops_t *ops, void *arg);

/* TCP_NODELAY, and with sockbuf > 0 that SO_SNDBUF and SO_RCVBUF. */
void loom_hs_sock_opts(int fd, int sockbuf);
/* Listen on the numeric host (any port) for the peers' dials: *fd_p and the
 * bound address in ss, or a failure in err (messages start with prefix).
 * sockbuf > 0 sets the buffer sizes accepted sockets inherit (before the
 * handshake, so that the window scale is negotiated). */
loom_status_t loom_hs_listen(const char *host, int sockbuf, int *fd_p,
                             struct sockaddr_storage *ss, socklen_t *sslen, loom_err_t *err,
                             const char *prefix);

/* Read toward c->need bytes: 1 when they are all there, 0 when more must
 * come, -1 when the peer closed or failed. */
int loom_hs_read(loom_hs_conn_t *c);
/* Close c, to be dialled again after delay_s (shed before a word). */
void loom_hs_redial_later(loom_hs_conn_t *c, double now, double delay_s);
/* Close c for good. */
void loom_hs_close(loom_hs_conn_t *c);
/* A small write on a fresh socket (it always fits its buffer): 0 or -1. */
int loom_hs_send(int fd, const void *buf, size_t len);
/* A fresh nonce from the kernel: 0, or -1 with errno. */
int loom_hs_nonce(uint8_t out[LOOM_NONCE_BYTES]);
/* theirs is the proof of role ('A' acceptor, 'C' connector) over hello,
 * both nonces and bind under key: compared in constant time, 1 when equal. */
int loom_hs_proof_ok(const void *key, size_t keylen, char role,
                     const uint8_t hello[LOOM_HELLO_BYTES], const uint8_t nonce_c[LOOM_NONCE_BYTES],
                     const uint8_t nonce_a[LOOM_NONCE_BYTES], const uint8_t bind[LOOM_BIND_BYTES],
                     const uint8_t theirs[32]);

/* ---- the hello handshake ----------------------------------------------------- */

/* Who this end is. */
typedef struct loom_hs_self {
    int rank, size;
    uint64_t job_hash, comm_hash;
    const char *key;               /* LOOM_AUTH_KEY, or NULL */
    size_t keylen;
    int mac_mode;                  /* LOOM_AUTH_MAC (LOOM_AUTH_MAC_*; both ends must agree) */
    int chacha;                    /* ChaCha20-Poly1305, else AES-256-GCM (both must agree) */
    int nstreams;                  /* connections per pair */
    const char *my_addr;           /* ours as published: the binding names it */
    char *const *addrs;            /* every rank's as published; NULL: another transport's */
    /* 1 when stream of rank is already connected (a second one is refused). */
    int (*taken)(void *arg, int rank, int stream);
    void *arg;
    loom_status_t *failed;
    loom_err_t *err;
    const char *subsys;
} loom_hs_self_t;

/* One step of the hello handshake on c (connected, or readable). *up: 1
 * when c is established (peer, stream, nonces and binding set; the socket is
 * the caller's to take). An acceptor refuses what does not fit (c closed,
 * phase LOOM_HS_DEAD) and, when the refusal is one an honest rank would get
 * (the key, the stream count), says why in *refused. A connector's failure
 * is fatal: recorded in *s->failed and returned. */
loom_status_t loom_hs_hello_step(const loom_hs_self_t *s, loom_hs_conn_t *c, double now, int *up,
                                 loom_ack_code_t *refused);

#endif
