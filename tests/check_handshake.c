/* check_handshake.c - the hello handshake of tp_handshake.c (the one tcp.c
 * speaks) between two ends over a socketpair(), one step at a time: a good
 * handshake with and without LOOM_AUTH_KEY, a wrong key, a key on one side,
 * truncated and oversized hellos, a wrong rank, job or epoch, a replayed
 * proof, a duplicate stream and peers that close mid-handshake; and the
 * driver (loom_hs_run) over real loopback sockets, strangers included. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "transports/tp_handshake.h"
#include "transports/tp_addr.h"
#include "transports/tp_fail.h"
#include "transports/wire.h"

#define JOB  UINT64_C(0x1111222233334444)
#define COMM UINT64_C(0x5555666677778888)

static char *const ADDRS[3] = {"10.0.0.1:1000", "10.0.0.2:2000", "10.0.0.3:3000"};

/* One end: its identity, its failure, the streams it has up. */
typedef struct end {
    loom_hs_self_t self;
    loom_status_t failed;
    loom_err_t err;
    int taken[3];
    loom_hs_conn_t c;
    loom_ack_code_t refused;
    int up;
} end_t;

static int taken(void *arg, int rank, int stream)
{
    (void)stream;
    return ((end_t *)arg)->taken[rank];
}

static void end_init(end_t *e, int rank, int size, const char *key)
{
    memset(e, 0, sizeof(*e));
    loom_err_clear(&e->err);
    e->self = (loom_hs_self_t){.rank = rank, .size = size, .job_hash = JOB, .comm_hash = COMM,
                               .key = key, .keylen = key ? strlen(key) : 0, .nstreams = 1,
                               .my_addr = ADDRS[rank], .addrs = ADDRS, .taken = taken, .arg = e,
                               .failed = &e->failed, .err = &e->err, .subsys = "test"};
}

/* conn (rank self.rank) dials peer over fd; acc accepts over fd. */
static void as_connector(end_t *e, int fd, int peer)
{
    e->c = (loom_hs_conn_t){.fd = fd, .peer = peer, .phase = LOOM_HS_TALKING,
                            .step = LOOM_HS_SEND_HELLO};
}

static void as_acceptor(end_t *e, int fd)
{
    e->c = (loom_hs_conn_t){.fd = fd, .peer = -1, .phase = LOOM_HS_TALKING, .accepted = 1,
                            .stranger = 1, .step = LOOM_HS_WAIT_HELLO, .need = LOOM_HELLO_BYTES};
}

static void pair(int sv[2])
{
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
}

/* One step of e, unless it is finished, failed or closed. */
static void step(end_t *e)
{
    if (e->up || e->failed || e->c.fd < 0 || e->c.phase != LOOM_HS_TALKING)
        return;
    int up = 0;
    loom_hs_hello_step(&e->self, &e->c, loom_now_s(), &up, &e->refused);
    e->up = up;
}

/* Alternate the two ends until neither moves (a socketpair delivers at once). */
static void drive(end_t *conn, end_t *acc)
{
    for (int i = 0; i < 16; i++) {
        step(conn);
        step(acc);
    }
}

static void close_ends(end_t *a, end_t *b)
{
    if (a->c.fd >= 0)
        close(a->c.fd);
    if (b->c.fd >= 0)
        close(b->c.fd);
}

/* Rank cr (key ck) is to dial rank ar (key ak) of size over a socketpair. */
static void ends(end_t *conn, end_t *acc, int cr, int ar, int size, const char *ck,
                      const char *ak)
{
    int sv[2];
    pair(sv);
    end_init(conn, cr, size, ck);
    end_init(acc, ar, size, ak);
    as_connector(conn, sv[0], ar);
    as_acceptor(acc, sv[1]);
}

START_TEST(test_good_no_key)
{
    end_t conn, acc;
    ends(&conn, &acc, 1, 0, 2, NULL, NULL);
    drive(&conn, &acc);
    ck_assert_int_eq(conn.failed, LOOM_SUCCESS);
    ck_assert_int_eq(acc.failed, LOOM_SUCCESS);
    ck_assert(conn.up && acc.up);
    ck_assert_int_eq(acc.c.peer, 1);
    ck_assert_int_eq(acc.c.stream, 0);
    ck_assert_int_eq(acc.refused, LOOM_ACK_OK);
    close_ends(&conn, &acc);
}
END_TEST

/* The wire: the connector's first message is the hello of wire.h, followed
 * by its 16-byte nonce with a key; nothing else. */
START_TEST(test_hello_bytes)
{
    for (int keyed = 0; keyed < 2; keyed++) {
        end_t conn;
        int sv[2];
        pair(sv);
        end_init(&conn, 1, 2, keyed ? "k" : NULL);
        as_connector(&conn, sv[0], 0);
        step(&conn);
        uint8_t got[128], want[LOOM_HELLO_BYTES];
        ssize_t n = recv(sv[1], got, sizeof(got), 0);
        ck_assert_int_eq(n, LOOM_HELLO_BYTES + (keyed ? LOOM_NONCE_BYTES : 0));
        loom_hello_t h = {LOOM_WIRE_VERSION, 1, 2,
                          (keyed ? LOOM_HELLO_AUTH : 0) | LOOM_HELLO_STREAMS(0, 1), JOB, COMM};
        loom_hello_encode(&h, want);
        ck_assert_mem_eq(got, want, LOOM_HELLO_BYTES);
        if (keyed)
            ck_assert_mem_eq(got + LOOM_HELLO_BYTES, conn.c.nonce_c, LOOM_NONCE_BYTES);
        ck_assert_int_eq(conn.c.step, LOOM_HS_WAIT_ACK);
        close(sv[0]);
        close(sv[1]);
    }
}
END_TEST

START_TEST(test_good_with_key)
{
    end_t conn, acc;
    ends(&conn, &acc, 2, 1, 3, "secret", "secret");
    drive(&conn, &acc);
    ck_assert_int_eq(conn.failed, LOOM_SUCCESS);
    ck_assert_int_eq(acc.failed, LOOM_SUCCESS);
    ck_assert(conn.up && acc.up);
    ck_assert_int_eq(acc.c.peer, 2);
    /* Both ends hold the same nonces and binding: the same session keys. */
    ck_assert_mem_eq(conn.c.nonce_c, acc.c.nonce_c, LOOM_NONCE_BYTES);
    ck_assert_mem_eq(conn.c.nonce_a, acc.c.nonce_a, LOOM_NONCE_BYTES);
    ck_assert_mem_eq(conn.c.bind, acc.c.bind, LOOM_BIND_BYTES);
    ck_assert(memcmp(conn.c.nonce_c, conn.c.nonce_a, LOOM_NONCE_BYTES) != 0);
    uint8_t c2a[32], a2c[32], c2a2[32], a2c2[32];
    loom_session_keys("secret", 6, conn.c.nonce_c, conn.c.nonce_a, conn.c.bind, c2a, a2c);
    loom_session_keys("secret", 6, acc.c.nonce_c, acc.c.nonce_a, acc.c.bind, c2a2, a2c2);
    ck_assert_mem_eq(c2a, c2a2, 32);
    ck_assert_mem_eq(a2c, a2c2, 32);
    close_ends(&conn, &acc);
}
END_TEST

START_TEST(test_wrong_key)
{
    end_t conn, acc;
    ends(&conn, &acc, 1, 0, 2, "one key", "another key");
    drive(&conn, &acc);
    /* The connector cannot check the acceptor's proof: it stops there. */
    ck_assert_int_eq(conn.failed, LOOM_ERR_AUTH);
    ck_assert_ptr_nonnull(strstr(conn.err.msg, "cannot prove LOOM_AUTH_KEY"));
    ck_assert(!acc.up);
    /* It hangs up: the acceptor learns that its key was not trusted. */
    close(conn.c.fd);
    conn.c.fd = -1;
    step(&acc);
    ck_assert_int_eq(acc.c.phase, LOOM_HS_DEAD);
    ck_assert_int_eq(acc.refused, LOOM_ACK_AUTH);
    ck_assert_int_eq(acc.failed, LOOM_SUCCESS);   /* a stranger never fails the acceptor */
}
END_TEST

START_TEST(test_key_on_one_side)
{
    for (int keyed_acceptor = 0; keyed_acceptor < 2; keyed_acceptor++) {
        end_t conn, acc;
        ends(&conn, &acc, 1, 0, 2, keyed_acceptor ? NULL : "k", keyed_acceptor ? "k" : NULL);
        drive(&conn, &acc);
        ck_assert_int_eq(conn.failed, LOOM_ERR_AUTH);
        ck_assert(!conn.up && !acc.up);
        ck_assert_int_eq(acc.c.phase, LOOM_HS_DEAD);
        ck_assert_int_eq(acc.refused, LOOM_ACK_AUTH);
        close_ends(&conn, &acc);
    }
}
END_TEST

/* A keyed acceptor whose peer, keyless, was accepted without a proof must
 * not count as authenticated: the connector with a key refuses a plain OK. */
START_TEST(test_ok_without_proof_refused)
{
    end_t conn;
    int sv[2];
    pair(sv);
    end_init(&conn, 1, 2, "k");
    as_connector(&conn, sv[0], 0);
    step(&conn);
    uint8_t junk[128], ack[LOOM_ACK_BYTES];
    ck_assert_int_gt(recv(sv[1], junk, sizeof(junk), 0), 0);
    loom_ack_encode(LOOM_ACK_OK, 0, ack);
    ck_assert_int_eq(send(sv[1], ack, sizeof(ack), 0), (ssize_t)sizeof(ack));
    step(&conn);
    ck_assert_int_eq(conn.failed, LOOM_ERR_AUTH);
    ck_assert(!conn.up);
    close(sv[0]);
    close(sv[1]);
}
END_TEST

/* Raw bytes to a fresh acceptor (rank 0 of 2), then the write side shut. */
static void feed_acceptor(end_t *acc, const void *bytes, size_t len, int *peer_fd)
{
    int sv[2];
    pair(sv);
    end_init(acc, 0, 2, NULL);
    as_acceptor(acc, sv[1]);
    ck_assert_int_eq(send(sv[0], bytes, len, 0), (ssize_t)len);
    shutdown(sv[0], SHUT_WR);
    for (int i = 0; i < 8; i++)
        step(acc);
    *peer_fd = sv[0];
}

START_TEST(test_truncated_hello)
{
    loom_hello_t h = {LOOM_WIRE_VERSION, 1, 2, LOOM_HELLO_STREAMS(0, 1), JOB, COMM};
    uint8_t hello[LOOM_HELLO_BYTES];
    loom_hello_encode(&h, hello);
    for (size_t cut = 0; cut < LOOM_HELLO_BYTES; cut += 7) {
        end_t acc;
        int fd;
        feed_acceptor(&acc, hello, cut, &fd);
        ck_assert(!acc.up);
        ck_assert_int_eq(acc.c.phase, LOOM_HS_DEAD);
        ck_assert_int_eq(acc.failed, LOOM_SUCCESS);
        /* Nothing answered a hello that never came whole. */
        uint8_t b;
        ck_assert_int_eq(recv(fd, &b, 1, MSG_DONTWAIT), 0);
        close(fd);
    }
    /* The whole hello (the control): accepted. */
    end_t acc;
    int fd;
    feed_acceptor(&acc, hello, sizeof(hello), &fd);
    ck_assert(acc.up);
    close(fd);
    close(acc.c.fd);
}
END_TEST

/* More than a hello: the acceptor reads the hello and no byte past it (what
 * follows is the connection's first frame), and garbage is refused with an
 * ack that says why. */
START_TEST(test_oversized_hello)
{
    loom_hello_t h = {LOOM_WIRE_VERSION, 1, 2, LOOM_HELLO_STREAMS(0, 1), JOB, COMM};
    uint8_t msg[LOOM_HELLO_BYTES + 200];
    memset(msg, 0xab, sizeof(msg));
    loom_hello_encode(&h, msg);
    end_t acc;
    int fd;
    feed_acceptor(&acc, msg, sizeof(msg), &fd);
    ck_assert(acc.up);
    ck_assert_uint_eq(acc.c.have, LOOM_HELLO_BYTES);
    uint8_t rest[256];
    ck_assert_int_eq(recv(acc.c.fd, rest, sizeof(rest), 0), 200);
    close(fd);
    close(acc.c.fd);

    memset(msg, 0xab, sizeof(msg));   /* no magic at all */
    feed_acceptor(&acc, msg, sizeof(msg), &fd);
    ck_assert(!acc.up);
    ck_assert_int_eq(acc.c.phase, LOOM_HS_DEAD);
    uint8_t ack[LOOM_ACK_BYTES];
    loom_ack_code_t code;
    uint32_t who;
    ck_assert_int_eq(recv(fd, ack, sizeof(ack), 0), (ssize_t)sizeof(ack));
    ck_assert_int_eq(loom_ack_decode(ack, &code, &who), 0);
    ck_assert_int_eq(code, LOOM_ACK_BAD_MAGIC);
    close(fd);
}
END_TEST

/* A connector that is refused for who it is: the ack names why and the
 * connector fails with that reason. */
static void refused_as(int conn_rank, int acc_rank, int size, uint64_t job, uint64_t comm,
                       loom_ack_code_t want)
{
    end_t conn, acc;
    ends(&conn, &acc, conn_rank, acc_rank, size, NULL, NULL);
    conn.self.job_hash = job;
    conn.self.comm_hash = comm;
    drive(&conn, &acc);
    ck_assert(!conn.up && !acc.up);
    ck_assert_int_eq(acc.c.phase, LOOM_HS_DEAD);
    ck_assert_int_eq(conn.failed, LOOM_ERR_AUTH);
    ck_assert_ptr_nonnull(strstr(conn.err.msg, loom_ack_reason(want)));
    close_ends(&conn, &acc);
}

START_TEST(test_wrong_rank_job_epoch)
{
    refused_as(0, 1, 3, JOB, COMM, LOOM_ACK_BAD_RANK);       /* a lower rank never dials */
    refused_as(1, 0, 2, JOB ^ 1, COMM, LOOM_ACK_OTHER_JOB);  /* another job */
    refused_as(1, 0, 2, JOB, COMM ^ 1, LOOM_ACK_OTHER_JOB);  /* another epoch of the communicator */
}
END_TEST

START_TEST(test_duplicate_stream)
{
    end_t conn, acc;
    ends(&conn, &acc, 1, 0, 2, NULL, NULL);
    acc.taken[1] = 1;   /* rank 1's stream is up already */
    drive(&conn, &acc);
    ck_assert(!acc.up);
    ck_assert_int_eq(conn.failed, LOOM_ERR_AUTH);
    ck_assert_ptr_nonnull(strstr(conn.err.msg, loom_ack_reason(LOOM_ACK_DUPLICATE)));
    close_ends(&conn, &acc);
}
END_TEST

/* Pass what arrives on from to to, keeping a copy of it in log. */
static void relay(int from, int to, uint8_t *log, size_t *loglen)
{
    uint8_t b[256];
    ssize_t n;
    while ((n = recv(from, b, sizeof(b), 0)) > 0) {
        ck_assert_int_eq(send(to, b, (size_t)n, 0), n);
        memcpy(log + *loglen, b, (size_t)n);
        *loglen += (size_t)n;
    }
}

/* A man in the middle records a good keyed handshake, then replays the
 * connector's hello, nonce and proof to a fresh acceptor: its own nonce makes
 * the old proof worthless. */
START_TEST(test_replayed_proof)
{
    end_t conn, acc;
    int a[2], b[2];
    pair(a);
    pair(b);
    end_init(&conn, 1, 2, "k");
    end_init(&acc, 0, 2, "k");
    as_connector(&conn, a[0], 0);
    as_acceptor(&acc, b[1]);
    uint8_t from_conn[256], from_acc[256];
    size_t nc = 0, na = 0;
    for (int i = 0; i < 16; i++) {
        step(&conn);
        relay(a[1], b[0], from_conn, &nc);
        step(&acc);
        relay(b[0], a[1], from_acc, &na);
    }
    ck_assert(conn.up && acc.up);
    ck_assert_uint_eq(nc, LOOM_HELLO_BYTES + LOOM_NONCE_BYTES + LOOM_PROOF_BYTES);
    close(a[0]);
    close(a[1]);
    close(b[0]);
    close(b[1]);

    end_t fresh;
    int sv[2];
    pair(sv);
    end_init(&fresh, 0, 2, "k");
    as_acceptor(&fresh, sv[1]);
    size_t first = LOOM_HELLO_BYTES + LOOM_NONCE_BYTES;
    ck_assert_int_eq(send(sv[0], from_conn, first, 0), (ssize_t)first);
    step(&fresh);
    step(&fresh);
    ck_assert_int_eq(fresh.c.step, LOOM_HS_WAIT_PROOF);   /* it sent a challenge */
    ck_assert(memcmp(fresh.c.nonce_a, acc.c.nonce_a, LOOM_NONCE_BYTES) != 0);
    ck_assert_int_eq(send(sv[0], from_conn + first, nc - first, 0), (ssize_t)(nc - first));
    step(&fresh);
    ck_assert(!fresh.up);
    ck_assert_int_eq(fresh.c.phase, LOOM_HS_DEAD);
    ck_assert_int_eq(fresh.refused, LOOM_ACK_AUTH);
    /* Its answer: the challenge, then a refusal for the key. */
    uint8_t got[LOOM_CHAL_BYTES + LOOM_ACK_BYTES];
    ck_assert_int_eq(recv(sv[0], got, sizeof(got), 0), (ssize_t)sizeof(got));
    loom_ack_code_t code;
    uint32_t who;
    ck_assert_int_eq(loom_ack_decode(got + LOOM_CHAL_BYTES, &code, &who), 0);
    ck_assert_int_eq(code, LOOM_ACK_AUTH);
    close(sv[0]);
}
END_TEST

START_TEST(test_close_mid_handshake)
{
    /* The acceptor hangs up on the hello before a word: the connector dials
     * again (a full acceptor sheds strangers so), it does not fail. */
    end_t conn, acc;
    int sv[2];
    pair(sv);
    end_init(&conn, 1, 2, NULL);
    as_connector(&conn, sv[0], 0);
    step(&conn);
    close(sv[1]);
    step(&conn);
    ck_assert_int_eq(conn.failed, LOOM_SUCCESS);
    ck_assert_int_eq(conn.c.phase, LOOM_HS_DIALING);
    ck_assert_int_eq(conn.c.fd, -1);
    ck_assert(conn.c.retry_at > 0);
    ck_assert_int_eq(conn.c.step, LOOM_HS_SEND_HELLO);

    /* Part of an ack, then the close: the connector fails, naming the peer. */
    pair(sv);
    end_init(&conn, 1, 2, NULL);
    as_connector(&conn, sv[0], 0);
    step(&conn);
    uint8_t ack[LOOM_ACK_BYTES];
    loom_ack_encode(LOOM_ACK_OK, 0, ack);
    ck_assert_int_eq(send(sv[1], ack, 5, 0), 5);
    close(sv[1]);
    step(&conn);
    step(&conn);
    ck_assert_int_eq(conn.failed, LOOM_ERR_PEER_LOST);
    ck_assert_ptr_nonnull(strstr(conn.err.msg, "rank 0 closed the connection"));
    close(sv[0]);

    /* The connector hangs up on the challenge: the acceptor drops it and
     * keeps why (its key was not trusted). */
    pair(sv);
    end_init(&conn, 1, 2, "k");
    end_init(&acc, 0, 2, "k");
    as_connector(&conn, sv[0], 0);
    as_acceptor(&acc, sv[1]);
    step(&conn);
    step(&acc);
    step(&acc);
    ck_assert_int_eq(acc.c.step, LOOM_HS_WAIT_PROOF);
    close(sv[0]);
    step(&acc);
    ck_assert_int_eq(acc.c.phase, LOOM_HS_DEAD);
    ck_assert_int_eq(acc.refused, LOOM_ACK_AUTH);
    ck_assert(!acc.up);
}
END_TEST

/* ---- the driver over loopback ------------------------------------------------ */

typedef struct drv {
    end_t e;
    int fds[3];   /* established sockets by peer rank */
    int drops;
} drv_t;

static int drv_step(void *arg, loom_hs_table_t *t, loom_hs_conn_t *c, double now)
{
    drv_t *d = arg;
    int up = 0;
    (void)t;
    if (loom_hs_hello_step(&d->e.self, c, now, &up, &d->e.refused) != LOOM_SUCCESS || !up)
        return 0;
    d->e.taken[c->peer] = 1;
    d->fds[c->peer] = c->fd;
    c->fd = -1;
    return 1;
}

static void drv_drop(void *arg, loom_hs_conn_t *c)
{
    ((drv_t *)arg)->drops++;
    loom_hs_close(c);
}

static void drv_timed_out(void *arg, loom_hs_table_t *t)
{
    drv_t *d = arg;
    loom_tp_fail(t->failed, t->err, "test", d->e.self.rank, LOOM_ERR_TIMEOUT, "timed out");
}

static const loom_hs_ops_t drv_ops = {.step = drv_step, .drop = drv_drop,
                                      .timed_out = drv_timed_out};

static int listener(char *addr, size_t len, struct sockaddr_storage *ss, socklen_t *sslen)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in in = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&in, sizeof(in)), 0);
    ck_assert_int_eq(listen(fd, 256), 0);
    socklen_t l = sizeof(in);
    getsockname(fd, (struct sockaddr *)&in, &l);
    char port[16];
    snprintf(port, sizeof(port), "%d", ntohs(in.sin_port));
    snprintf(addr, len, "127.0.0.1:%s", port);
    ck_assert_int_eq(loom_tp_numeric_addr("127.0.0.1", port, ss, sslen), 0);
    return fd;
}

/* Rank 0 accepts rank 1, run by one thread each side in turn: the driver of
 * rank 1 dials, rank 0's accepts, both with keys. A crowd of silent
 * strangers connects to rank 0 first and is shed; rank 1 still gets in. */
typedef struct rank_run {
    loom_hs_table_t t;
    drv_t d;
} rank_run_t;

static void *run_rank(void *arg)
{
    rank_run_t *r = arg;
    loom_hs_run(&r->t, &drv_ops, &r->d);
    return NULL;
}

/* More than the table holds (rank 0 expects one peer: 65 entries). */
#define NSTRANGERS 70

START_TEST(test_driver_with_strangers)
{
    static char a0[64], a1[64];
    static char *addrs[2] = {a0, a1};
    struct sockaddr_storage ss0, ss1;
    socklen_t l0, l1;
    int lfd0 = listener(a0, sizeof(a0), &ss0, &l0);
    int lfd1 = listener(a1, sizeof(a1), &ss1, &l1);
    close(lfd1);   /* rank 1 dials only */

    /* Strangers that say nothing, more than the table has room for. */
    int strangers[NSTRANGERS];
    for (int i = 0; i < NSTRANGERS; i++) {
        strangers[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ck_assert_int_eq(connect(strangers[i], (struct sockaddr *)&ss0, l0), 0);
    }

    rank_run_t r0, r1;
    memset(&r0, 0, sizeof(r0));
    memset(&r1, 0, sizeof(r1));
    end_init(&r0.d.e, 0, 2, "key");
    end_init(&r1.d.e, 1, 2, "key");
    r0.d.e.self.addrs = r1.d.e.self.addrs = addrs;
    r0.d.e.self.my_addr = a0;
    r1.d.e.self.my_addr = a1;
    drv_t *ds[2] = {&r0.d, &r1.d};
    for (int i = 0; i < 2; i++) {
        loom_hs_params_t p = {.rank = i, .ndial = i, .naccept = 1 - i, .timeout_s = 10.0,
                              .failed = &ds[i]->e.failed, .err = &ds[i]->e.err, .subsys = "test",
                              .prefix = "", .addrs = addrs, .listen_fd = i ? -1 : lfd0,
                              .accept_step = LOOM_HS_WAIT_HELLO, .accept_need = LOOM_HELLO_BYTES};
        ck_assert_int_eq(loom_hs_table_init(i ? &r1.t : &r0.t, &p), 0);
    }
    ck_assert_int_eq(loom_hs_table_dial(&r1.t, 0, 0, &ss0, l0), 0);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, run_rank, &r1), 0);
    loom_status_t st0 = loom_hs_run(&r0.t, &drv_ops, &r0.d);
    pthread_join(th, NULL);
    ck_assert_msg(st0 == LOOM_SUCCESS, "rank 0: %s", r0.d.e.err.msg);
    ck_assert_msg(r1.d.e.failed == LOOM_SUCCESS, "rank 1: %s", r1.d.e.err.msg);
    ck_assert_int_ge(r0.d.drops, NSTRANGERS + 1 - r0.t.maxconn);   /* the table overflowed */
    ck_assert_int_ge(r0.d.fds[1], 0);
    ck_assert_int_ge(r1.d.fds[0], 0);
    /* The two sockets are one connection. */
    ck_assert_int_eq(send(r1.d.fds[0], "x", 1, 0), 1);
    char b = 0;
    for (int i = 0; i < 1000 && recv(r0.d.fds[1], &b, 1, MSG_DONTWAIT) != 1; i++)
        usleep(1000);
    ck_assert_int_eq(b, 'x');
    close(r0.d.fds[1]);
    close(r1.d.fds[0]);
    loom_hs_table_free(&r0.t);
    loom_hs_table_free(&r1.t);
    close(lfd0);
    for (int i = 0; i < NSTRANGERS; i++)
        close(strangers[i]);
}
END_TEST

START_TEST(test_numeric_addr)
{
    struct sockaddr_storage ss;
    socklen_t len;
    ck_assert_int_eq(loom_tp_numeric_addr("127.0.0.1", "80", &ss, &len), 0);
    ck_assert_int_eq(ss.ss_family, AF_INET);
    ck_assert_int_eq(ntohs(((struct sockaddr_in *)&ss)->sin_port), 80);
    ck_assert_int_eq(loom_tp_numeric_addr("::1", "80", &ss, &len), 0);
    ck_assert_int_eq(ss.ss_family, AF_INET6);
    ck_assert_int_ne(loom_tp_numeric_addr("localhost", "80", &ss, &len), 0);
    ck_assert_int_ne(loom_tp_numeric_addr("127.0.0.1", "http", &ss, &len), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("handshake");
    TCase *tc = tcase_create("hello");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_good_no_key);
    tcase_add_test(tc, test_hello_bytes);
    tcase_add_test(tc, test_good_with_key);
    tcase_add_test(tc, test_wrong_key);
    tcase_add_test(tc, test_key_on_one_side);
    tcase_add_test(tc, test_ok_without_proof_refused);
    tcase_add_test(tc, test_truncated_hello);
    tcase_add_test(tc, test_oversized_hello);
    tcase_add_test(tc, test_wrong_rank_job_epoch);
    tcase_add_test(tc, test_duplicate_stream);
    tcase_add_test(tc, test_replayed_proof);
    tcase_add_test(tc, test_close_mid_handshake);
    tcase_add_test(tc, test_driver_with_strangers);
    tcase_add_test(tc, test_numeric_addr);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
