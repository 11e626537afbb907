/*
 * mp_failures - what users and networks do wrong, on real processes and
 * sockets: a rank killed mid-collective, a rank that exits without saying
 * goodbye, a wrong store port, strangers sending garbage to a rank's port,
 * ranks that disagree on count or dtype, abort from another thread, a peer
 * that never sends, bad arguments, missing ranks at rendezvous. Every case
 * must end in the documented status within its time bound, never a hang.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mp_util.h"
#include "store/store.h"

#define TIMEOUT_S 6.0

static loom_comm_t create_with_timeout(int rank, int size, double timeout_s)
{
    loom_config_t cfg = LOOM_CONFIG_INIT;
    cfg.rank = rank;
    cfg.size = size;
    cfg.store = getenv("LOOM_STORE");
    cfg.timeout_s = timeout_s;
    loom_comm_t c = NULL;
    loom_status_t st = loom_comm_create(&cfg, &c);
    if (st != LOOM_SUCCESS)
        fprintf(stderr, "rank %d: create: %s: %s\n", rank, loom_strerror(st),
                loom_comm_last_error(NULL));
    return c;
}

static int my_rank(void)
{
    return atoi(getenv("LOOM_RANK"));
}

/* Survivors of a death must see an error, within LOOM_TIMEOUT + 5 s; with
 * small vectors (how 2: SIGKILL), which one node reduces through its
 * windows' slots without a message, as fast as a wait for a message learns
 * it: well before LOOM_TIMEOUT, naming the lost rank. */
static int survivor_loop(loom_comm_t c, int victim, int how)
{
    const size_t N = how == 2 ? 4 : (size_t)1 << 18;
    float *buf = calloc(N, sizeof(float));
    int r = loom_comm_rank(c);
    double last_ok = mp_now();
    for (int it = 0; it < 100000; it++) {
        if (r == victim && it == 5) {
            if (how != 1)
                raise(SIGKILL);
            _exit(0);   /* exits without loom_comm_destroy */
        }
        loom_status_t st = loom_allreduce(LOOM_IN_PLACE, buf, N, LOOM_FLOAT32, LOOM_SUM, c);
        if (st != LOOM_SUCCESS) {
            double waited = mp_now() - last_ok;
            int ok = (st == LOOM_ERR_PEER_LOST || st == LOOM_ERR_TIMEOUT) &&
                     waited < TIMEOUT_S + 5 && strlen(loom_comm_last_error(c)) > 0;
            if (how == 2)
                ok = st == LOOM_ERR_PEER_LOST && waited < TIMEOUT_S / 2;
            fprintf(stderr, "rank %d: after %.2f s: %s: %s\n", r, waited, loom_strerror(st),
                    loom_comm_last_error(c));
            /* Later calls fail at once, with the same news. */
            double t0 = mp_now();
            loom_status_t again = loom_barrier(c);
            ok = ok && again != LOOM_SUCCESS && mp_now() - t0 < 1.0;
            free(buf);
            return ok ? 0 : 1;
        }
        last_ok = mp_now();
    }
    free(buf);
    fprintf(stderr, "rank %d: never noticed the death\n", r);
    return 1;
}

static int kill_rank(loom_comm_t c, void *arg)
{
    (void)c;
    int how = *(int *)arg;
    loom_comm_t comm = create_with_timeout(my_rank(), 4, TIMEOUT_S);
    if (!comm)
        return 1;
    int rc = survivor_loop(comm, 3, how);
    loom_comm_destroy(comm);
    return rc;
}

static void test_rank_death(void)
{
    int how = 0;
    double t0 = mp_now();
    /* Exactly one rank fails (the victim); the others pass only if they saw the error. */
    int failed = mp_run_raw(4, kill_rank, &how, 60);
    char name[128];
    snprintf(name, sizeof(name), "SIGKILL of 1 of 4 ranks mid-allreduce: survivors fail in time (%.1f s)",
             mp_now() - t0);
    mp_result(name, failed == 1);
    how = 1;
    failed = mp_run_raw(4, kill_rank, &how, 60);
    mp_result("rank exits without loom_comm_destroy: survivors get PEER_LOST", failed == 0);
    how = 2;
    failed = mp_run_raw(4, kill_rank, &how, 60);
    mp_result("SIGKILL of 1 of 4 ranks mid small allreduce (window slots, no message): "
              "survivors get PEER_LOST well before LOOM_TIMEOUT", failed == 1);
}

/* A rank that leaves (destroys its communicator, here a split pair) at once
 * after a small allreduce, which inside a node waits on the peers' windows:
 * a peer still in that allreduce has its flag, and must not take the goodbye
 * that came after it for a failure. */
static int leave_after_allreduce_rank(loom_comm_t c, void *arg)
{
    (void)arg;
    int r = loom_comm_rank(c);
    for (int it = 0; it < 300; it++) {
        /* Pairs of ranks, the parent's own small allreduce between rounds. */
        loom_comm_t sub = NULL, in = c;
        int y = 1, x = r;
        loom_status_t st = loom_allreduce(LOOM_IN_PLACE, &y, 1, LOOM_INT32, LOOM_SUM, c);
        if (st == LOOM_SUCCESS && (st = loom_comm_split(c, r % 2, -r, &sub)) == LOOM_SUCCESS)
            st = loom_allreduce(LOOM_IN_PLACE, &x, 1, LOOM_INT32, LOOM_SUM, in = sub);
        if (st != LOOM_SUCCESS || y != loom_comm_size(c) || x != (r % 2 ? 1 + 3 : 0 + 2)) {
            fprintf(stderr, "rank %d, round %d: %s (sums %d, %d): %s\n", r, it, loom_strerror(st),
                    y, x, loom_comm_last_error(in));
            loom_comm_destroy(sub);
            return 1;
        }
        loom_comm_destroy(sub);
    }
    return 0;
}

static void test_wrong_port(void)
{
    /* A port that nobody listens on: bind, read it, close. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    getsockname(fd, (struct sockaddr *)&sa, &len);
    close(fd);
    char uri[64];
    snprintf(uri, sizeof(uri), "tcp://127.0.0.1:%d", ntohs(sa.sin_port));
    loom_config_t cfg = LOOM_CONFIG_INIT;
    cfg.rank = 1;
    cfg.size = 2;
    cfg.store = uri;
    cfg.timeout_s = 2;
    loom_comm_t c = NULL;
    double t0 = mp_now();
    loom_status_t st = loom_comm_create(&cfg, &c);
    double took = mp_now() - t0;
    const char *msg = loom_comm_last_error(NULL);
    fprintf(stderr, "wrong port: %s after %.1f s: %s\n", loom_strerror(st), took, msg);
    mp_result("store at a wrong port: create fails within its timeout and names the address",
              st != LOOM_SUCCESS && c == NULL && took < 2 + 3 && strstr(msg, uri + 6) != NULL);
}

/* Connect to rank 0's port and send junk, then a hello from another job. */
static void send_garbage(const char *addr)
{
    char host[64];
    int port;
    if (sscanf(addr, "%63[^:]:%d", host, &port) != 2)
        return;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &sa.sin_addr);
    static const char junk[] = "GET / HTTP/1.0\r\n\r\n\x01\x02\x03 garbage garbage garbage garbage";
    for (int i = 0; i < 3; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            if (i == 2) {   /* a well-formed hello that belongs to another job */
                uint8_t hello[40] = "LOOMHELO";
                hello[8] = 1;
                hello[12] = 1;
                hello[16] = 2;
                hello[24] = 0x42;
                if (write(fd, hello, sizeof(hello)) < 0)
                    perror("write");
            } else if (write(fd, junk, sizeof(junk) - (size_t)i * 20) < 0) {
                perror("write");
            }
            usleep(50000);
        }
        close(fd);
    }
}

static int stranger_rank(loom_comm_t unused, void *arg)
{
    (void)unused;
    (void)arg;
    int r = my_rank();
    setenv("LOOM_SHM", "0", 1);   /* the strangers come over TCP */
    if (r == 1) {
        /* Find rank 0's address in the store, as an attacker on the network could. */
        loom_err_t err = {0};
        loom_store_t *s;
        if (loom_store_open(getenv("LOOM_STORE"), -1, 10, &err, &s) != LOOM_SUCCESS)
            return 1;
        /* The key names the how-many-th communicator this process creates. */
        char key[256];
        char *val = NULL;
        size_t len;
        for (double t0 = mp_now(); !val && mp_now() - t0 < 10;) {
            for (int k = 0; k < 8 && !val; k++) {
                loom_err_t probe = {0};
                snprintf(key, sizeof(key), "loom/%s/world%d/addr/0", getenv("LOOM_JOB_ID"), k);
                if (loom_store_get(s, key, (void **)&val, &len, 0.0, &probe) != LOOM_SUCCESS)
                    val = NULL;
            }
            if (!val)
                usleep(10000);
        }
        if (!val) {
            loom_store_close(s);
            return 1;
        }
        char *addr = strchr(val, '\n');
        if (addr) {
            char *end = strchr(addr + 1, '\n');
            if (end)
                *end = '\0';
            send_garbage(addr + 1);
        }
        free(val);
        loom_store_close(s);
    }
    loom_comm_t c = create_with_timeout(r, 2, 20);
    if (!c)
        return 1;
    int x = r + 1;
    loom_status_t st = loom_allreduce(LOOM_IN_PLACE, &x, 1, LOOM_INT32, LOOM_SUM, c);
    loom_comm_destroy(c);
    return st == LOOM_SUCCESS && x == 3 ? 0 : 1;
}

static void test_strangers(void)
{
    mp_result("strangers sending garbage and foreign hellos to a rank are refused; the job runs",
              mp_run_raw(2, stranger_rank, NULL, 60) == 0);
}

static int mismatch_rank(loom_comm_t c, void *arg)
{
    int kind = *(int *)arg, r = loom_comm_rank(c);
    float buf[64] = {0};
    loom_status_t st;
    /* In step, so that both messages are on their way before either rank
     * checks the other's (a rank that finds the mismatch first gives up). */
    loom_status_t bst = loom_barrier(c);
    /* Of three ranks, two may pass the barrier, meet the mismatch and give up
     * while the third still takes in the barrier's last message: it may learn
     * of their failure there (any call after a rank gave up may fail). */
    if (kind >= 2 && bst == LOOM_ERR_PEER_LOST && strstr(loom_comm_last_error(c), "gave up")) {
        fprintf(stderr, "rank %d: in the barrier before the mismatch: %s\n", r,
                loom_comm_last_error(c));
        return 0;
    }
    if (bst != LOOM_SUCCESS) {
        fprintf(stderr, "rank %d: the barrier before the mismatch failed: %s: %s\n", r,
                loom_strerror(bst), loom_comm_last_error(c));
        return 1;
    }
    double t0 = mp_now();
    if (kind == 0)   /* counts differ */
        st = loom_allreduce(LOOM_IN_PLACE, buf, r == 0 ? 40 : 41, LOOM_FLOAT32, LOOM_SUM, c);
    else if (kind == 1)   /* dtypes differ, same byte count */
        st = loom_allreduce(LOOM_IN_PLACE, buf, 40, r == 0 ? LOOM_FLOAT32 : LOOM_INT32, LOOM_SUM, c);
    else   /* three counts on three ranks: some pairs agree, every rank must still fail */
        st = loom_allreduce(LOOM_IN_PLACE, buf, (size_t)(4 + r), LOOM_FLOAT32, LOOM_SUM, c);
    double took = mp_now() - t0;
    fprintf(stderr, "rank %d: after %.1f s: %s: %s\n", r, took, loom_strerror(st),
            loom_comm_last_error(c));
    if (kind == 3) {
        /* Nobody destroys its communicator for a while: a rank that gave up
         * must say so itself, not by ending its connections at exit. */
        sleep(3);
        return st != LOOM_SUCCESS && took < 2 ? 0 : 1;
    }
    if (kind == 2)   /* a rank may learn it from its neighbour's failure */
        return st != LOOM_SUCCESS && took < 10 ? 0 : 1;
    /* Should the other rank still find the mismatch first, it gives up before
     * sending, and this one learns that at once instead. */
    if (st == LOOM_ERR_PEER_LOST && strstr(loom_comm_last_error(c), "gave up") && took < 10)
        return 0;
    return st == LOOM_ERR_MISMATCH && strstr(loom_comm_last_error(c), "mismatch") ? 0 : 1;
}

static void test_mismatch(void)
{
    int kind = 0;
    mp_result("ranks disagree on count: LOOM_ERR_MISMATCH on both",
              mp_run(2, mismatch_rank, &kind, 30) == 0);
    kind = 1;
    mp_result("ranks disagree on dtype: LOOM_ERR_MISMATCH on both",
              mp_run(2, mismatch_rank, &kind, 30) == 0);
    kind = 2;
    mp_result("3 ranks, 3 different counts: every rank fails at once, none waits for LOOM_TIMEOUT",
              mp_run(3, mismatch_rank, &kind, 60) == 0);
    kind = 3;
    mp_result("the same, the ranks lingering after their failure: each learns within 2 s",
              mp_run(3, mismatch_rank, &kind, 60) == 0);
}

static void *abort_later(void *arg)
{
    usleep(500000);
    loom_comm_abort(arg);
    return NULL;
}

/* *arg 0: in a receive; 1: in a small allreduce, where the rank watches its
 * peers' windows instead of waiting for a message. */
static int abort_rank(loom_comm_t c, void *arg)
{
    int in_allreduce = *(int *)arg;
    int r = loom_comm_rank(c), x = 1;
    if (r == 1) {
        sleep(2);
        return 0;
    }
    pthread_t t;
    pthread_create(&t, NULL, abort_later, c);
    double t0 = mp_now();
    loom_status_t st = in_allreduce
                           ? loom_allreduce(LOOM_IN_PLACE, &x, 1, LOOM_INT32, LOOM_SUM, c)
                           : loom_recv(&x, 1, LOOM_INT32, 1, 5, c);
    double took = mp_now() - t0;
    pthread_join(t, NULL);
    loom_status_t again = loom_barrier(c);
    fprintf(stderr, "abort%s: %s after %.2f s, then %s\n", in_allreduce ? " in allreduce" : "",
            loom_strerror(st), took, loom_strerror(again));
    return st == LOOM_ERR_ABORTED && took < 2.0 && again == LOOM_ERR_ABORTED ? 0 : 1;
}

/* A receive abandoned by a failed communicator: its buffer is the user's
 * again when the call returns, even though the peer was told where to write
 * (over ibverbs a rendezvous CTS went out and the peer's RDMA WRITE may be
 * on its way: without deregistration at the failure it landed afterwards). */
#define ABANDONED_BYTES ((size_t)4 << 20)
static int abandoned_fds[2] = {-1, -1};

static int abandoned_recv_rank(loom_comm_t c, void *arg)
{
    (void)arg;
    unsigned char *buf = malloc(ABANDONED_BYTES);
    loom_request_t req;
    int bad = 0;
    if (!buf)
        return 1;
    memset(buf, 0x5a, ABANDONED_BYTES);
    if (loom_comm_rank(c) == 1) {
        loom_status_t st = loom_isend(buf, ABANDONED_BYTES, LOOM_UINT8, 0, 3, c, &req);
        if (st == LOOM_SUCCESS)
            loom_barrier(c);
        if (st == LOOM_SUCCESS)
            loom_wait(req);   /* fails one way or another once rank 0 gave up */
        bad = write(abandoned_fds[1], "d", 1) != 1;
        free(buf);
        return bad;
    }
    memset(buf, 0, ABANDONED_BYTES);
    loom_status_t st = loom_irecv(buf, ABANDONED_BYTES, LOOM_UINT8, 1, 3, c, &req);
    /* Rank 1's announcement comes before its barrier message: once the
     * barrier is through, the receive has matched it and said where to write. */
    if (st == LOOM_SUCCESS)
        st = loom_barrier(c);
    loom_comm_abort(c);
    loom_status_t wst = loom_wait(req);
    /* As a program would after the failed call: the memory is reused. */
    memset(buf, 0, ABANDONED_BYTES);
    struct pollfd pfd = {.fd = abandoned_fds[0], .events = POLLIN};
    char ch;
    if (poll(&pfd, 1, 30000) != 1 || read(abandoned_fds[0], &ch, 1) != 1) {
        fprintf(stderr, "abandoned receive: rank 1 did not finish its send\n");
        bad = 1;
    }
    size_t changed = 0;
    for (size_t i = 0; i < ABANDONED_BYTES; i++)
        changed += buf[i] != 0;
    fprintf(stderr, "abandoned receive: barrier %s, wait %s, %zu bytes written after the "
            "failed call returned\n", loom_strerror(st), loom_strerror(wst), changed);
    free(buf);
    return st == LOOM_SUCCESS && changed == 0 && !bad ? 0 : 1;
}

/* A receive nobody sends to: LOOM_ERR_TIMEOUT after LOOM_TIMEOUT (from rank 1,
 * or from any rank, naming the tag); from any rank, a sender whose count
 * differs: a mismatch. */
enum { SILENT_PEER, SILENT_ANY, ANY_WRONG_COUNT };

static int silent_rank(loom_comm_t unused, void *arg)
{
    (void)unused;
    int kind = *(int *)arg, r = my_rank(), x[4] = {0}, src = -1;
    static const char *const names[] = {"silent peer", "recv_any, silent", "recv_any, count 3 sent"};
    loom_comm_t c = create_with_timeout(r, 2, 1.5);
    if (!c)
        return 1;
    int rc = 0;
    if (r == 0) {
        double t0 = mp_now();
        loom_status_t st = kind == SILENT_PEER ? loom_recv(x, 1, LOOM_INT32, 1, 5, c)
                                               : loom_recv_any(x, 2, LOOM_INT32, 5, &src, c);
        double took = mp_now() - t0;
        fprintf(stderr, "%s: %s after %.2f s: %s\n", names[kind], loom_strerror(st), took,
                loom_comm_last_error(c));
        if (kind == ANY_WRONG_COUNT)
            rc = st == LOOM_ERR_MISMATCH && strstr(loom_comm_last_error(c), "count") ? 0 : 1;
        else
            rc = st == LOOM_ERR_TIMEOUT && took >= 1.4 && took < 1.5 + 5 &&
                         strstr(loom_comm_last_error(c), "LOOM_TIMEOUT") &&
                         (kind == SILENT_PEER || strstr(loom_comm_last_error(c), "tag 5 from any rank"))
                     ? 0 : 1;
    } else if (kind == ANY_WRONG_COUNT) {
        loom_send(x, 3, LOOM_INT32, 0, 5, c);   /* fails once rank 0 gave up, or not */
        sleep(2);
    } else {
        sleep(4);
    }
    loom_comm_destroy(c);
    return rc;
}

static void test_abort_and_timeout(void)
{
    int in_allreduce = 0;
    mp_result("loom_comm_abort from another thread unblocks a pending recv",
              mp_run(2, abort_rank, &in_allreduce, 30) == 0);
    in_allreduce = 1;
    mp_result("loom_comm_abort from another thread unblocks a small allreduce",
              mp_run(2, abort_rank, &in_allreduce, 30) == 0);
    int kind = SILENT_PEER;
    mp_result("a peer that never sends: LOOM_ERR_TIMEOUT after LOOM_TIMEOUT",
              mp_run_raw(2, silent_rank, &kind, 30) == 0);
    kind = SILENT_ANY;
    mp_result("a receive from any rank that nobody sends to: LOOM_ERR_TIMEOUT naming the tag",
              mp_run_raw(2, silent_rank, &kind, 30) == 0);
    kind = ANY_WRONG_COUNT;
    mp_result("a receive from any rank, a sender with another count: LOOM_ERR_MISMATCH",
              mp_run_raw(2, silent_rank, &kind, 30) == 0);
    int ok = pipe(abandoned_fds) == 0;
    mp_result("a receive abandoned by abort: no byte lands in its buffer after the call returns",
              ok && mp_run(2, abandoned_recv_rank, NULL, 60) == 0);
    if (ok) {
        close(abandoned_fds[0]);
        close(abandoned_fds[1]);
    }
}

static int destroyed_peer_rank(loom_comm_t c, void *arg)
{
    (void)arg;
    int x;
    if (loom_comm_rank(c) == 1)
        return 0;   /* destroys its communicator and leaves */
    loom_status_t st = loom_recv(&x, 1, LOOM_INT32, 1, 9, c);
    fprintf(stderr, "destroyed peer: %s: %s\n", loom_strerror(st), loom_comm_last_error(c));
    return st == LOOM_ERR_PEER_LOST && strstr(loom_comm_last_error(c), "destroyed") ? 0 : 1;
}

/* The same while we wait in a small allreduce (the windows' slots: no
 * message we could be waiting for). */
static int destroyed_peer_allreduce_rank(loom_comm_t c, void *arg)
{
    (void)arg;
    int x = 1;
    if (loom_comm_rank(c) == 1)
        return 0;
    double t0 = mp_now();
    loom_status_t st = loom_allreduce(LOOM_IN_PLACE, &x, 1, LOOM_INT32, LOOM_SUM, c);
    double took = mp_now() - t0;
    fprintf(stderr, "destroyed peer, allreduce: %s after %.2f s: %s\n", loom_strerror(st), took,
            loom_comm_last_error(c));
    return st == LOOM_ERR_PEER_LOST && strstr(loom_comm_last_error(c), "destroyed") &&
                   took < TIMEOUT_S / 2 ? 0 : 1;
}

#define EXPECT_INVALID(call)                                                          \
    do {                                                                              \
        loom_status_t s_ = (call);                                                    \
        if (s_ != LOOM_ERR_INVALID_ARG || !*loom_comm_last_error(c)) {                \
            fprintf(stderr, "%s returned %s\n", #call, loom_strerror(s_));            \
            bad++;                                                                    \
        }                                                                             \
    } while (0)

static int bad_args_rank(loom_comm_t c, void *arg)
{
    (void)arg;
    int n = loom_comm_size(c), bad = 0;
    float f[4] = {1, 1, 1, 1}, g[64];
    loom_request_t req;
    EXPECT_INVALID(loom_allreduce(NULL, g, 4, LOOM_FLOAT32, LOOM_SUM, c));
    EXPECT_INVALID(loom_allreduce(f, NULL, 4, LOOM_FLOAT32, LOOM_SUM, c));
    EXPECT_INVALID(loom_allreduce(f, g, 4, (loom_dtype_t)99, LOOM_SUM, c));
    EXPECT_INVALID(loom_allreduce(f, g, 4, LOOM_FLOAT32, (loom_op_t)-1, c));
    EXPECT_INVALID(loom_allreduce(f, g, 4, LOOM_FLOAT32, LOOM_BXOR, c));
    EXPECT_INVALID(loom_reduce_scatter(f, g, 1, LOOM_FLOAT32, LOOM_BAND, c));
    EXPECT_INVALID(loom_allreduce(f, g, SIZE_MAX / 2, LOOM_FLOAT32, LOOM_SUM, c));
    EXPECT_INVALID(loom_broadcast(f, 4, LOOM_FLOAT32, n, c));
    EXPECT_INVALID(loom_reduce(f, g, 4, LOOM_FLOAT32, LOOM_SUM, -1, c));
    EXPECT_INVALID(loom_send(f, 4, LOOM_FLOAT32, n, 0, c));
    EXPECT_INVALID(loom_send(f, 4, LOOM_FLOAT32, 0, -3, c));
    EXPECT_INVALID(loom_recv(NULL, 4, LOOM_FLOAT32, 0, 1, c));
    EXPECT_INVALID(loom_gather(f, g, 4, LOOM_FLOAT32, 7 + n, c));
    size_t counts[8] = {1, 1, 1, 1, 1, 1, 1, 1}, displs[8] = {0};
    EXPECT_INVALID(loom_allgatherv(f, 2, g, counts, displs, LOOM_FLOAT32, c));
    EXPECT_INVALID(loom_comm_split(c, -5, 0, &(loom_comm_t){0}));
    if (loom_iallreduce(f, g, 4, LOOM_FLOAT32, LOOM_SUM, NULL, &req) != LOOM_ERR_INVALID_ARG ||
        loom_allreduce(f, g, 4, LOOM_FLOAT32, LOOM_SUM, NULL) != LOOM_ERR_INVALID_ARG ||
        !*loom_comm_last_error(NULL))
        bad++;
    /* Count 0 is legal and does nothing, even with NULL buffers. */
    if (loom_allreduce(NULL, NULL, 0, LOOM_FLOAT32, LOOM_SUM, c) != LOOM_SUCCESS ||
        loom_iallreduce(NULL, NULL, 0, LOOM_FLOAT32, LOOM_SUM, c, &req) != LOOM_SUCCESS ||
        loom_wait(req) != LOOM_SUCCESS)
        bad++;
    /* After all that, the communicator still works. */
    if (loom_allreduce(LOOM_IN_PLACE, f, 4, LOOM_FLOAT32, LOOM_SUM, c) != LOOM_SUCCESS ||
        f[0] != (float)n)
        bad++;
    if (strcmp(loom_strerror(LOOM_ERR_PEER_LOST), "peer lost") != 0 ||
        loom_strerror((loom_status_t)1234) == NULL)
        bad++;
    return bad;
}

static int missing_rank(loom_comm_t unused, void *arg)
{
    (void)unused;
    (void)arg;
    int r = my_rank();
    double t0 = mp_now();
    loom_comm_t c = create_with_timeout(r, 3, 2);   /* rank 2 never comes */
    double took = mp_now() - t0;
    const char *msg = loom_comm_last_error(NULL);
    int ok = c == NULL && took < 2 + 5 && strstr(msg, "rank(s) 2 of 3") != NULL;
    fprintf(stderr, "missing rank: after %.1f s: %s\n", took, msg);
    if (c)
        loom_comm_destroy(c);
    return ok ? 0 : 1;
}

/* LOOM_AUTH_KEY guards the TCP connections between ranks (shared memory is
 * guarded by the kernel: only the same user can map a rank's segment).
 * mode 0: the same key everywhere, the job runs; 1: rank 1 holds another key;
 * 2: rank 1 holds none. Rank 1 dials rank 0, so rank 1 learns of the refusal
 * at once (LOOM_ERR_AUTH) and rank 0 keeps waiting for a rank that can prove
 * the key until its timeout, then says why it refused. */
static int auth_rank(loom_comm_t unused, void *arg)
{
    (void)unused;
    int mode = *(int *)arg, r = my_rank();
    setenv("LOOM_SHM", "0", 1);
    const char *key = mode == 1 && r == 1 ? "battery staple" : "correct horse";
    if (mode == 2 && r == 1)
        unsetenv("LOOM_AUTH_KEY");
    else
        setenv("LOOM_AUTH_KEY", key, 1);
    double t0 = mp_now();
    loom_comm_t c = create_with_timeout(r, 2, 3);
    double took = mp_now() - t0;
    if (mode == 0) {
        int x = r + 1;
        int ok = c && loom_allreduce(LOOM_IN_PLACE, &x, 1, LOOM_INT32, LOOM_SUM, c) ==
                          LOOM_SUCCESS && x == 3;
        if (c)
            loom_comm_destroy(c);
        return ok ? 0 : 1;
    }
    const char *msg = loom_comm_last_error(NULL);
    fprintf(stderr, "auth mode %d rank %d: after %.1f s: %s\n", mode, r, took, msg);
    if (c) {
        loom_comm_destroy(c);
        return 1;
    }
    if (took > 3 + 5)
        return 1;
    return strstr(msg, "LOOM_AUTH_KEY") ? 0 : 1;
}

static void test_auth(void)
{
    static const char *const what[] = {
        "LOOM_AUTH_KEY: ranks with the same key connect and run",
        "LOOM_AUTH_KEY: a rank with another key is refused (LOOM_ERR_AUTH naming the key)",
        "LOOM_AUTH_KEY: a rank without the key is refused (LOOM_ERR_AUTH naming the key)",
    };
    for (int mode = 0; mode < 3; mode++)
        mp_result(what[mode], mp_run_raw(2, auth_rank, &mode, 30) == 0);
}

static int bad_algo_rank(loom_comm_t c, void *arg)
{
    (void)arg;
    float f = 1;
    setenv("LOOM_ALGO", "allreduce=nonesuch", 1);
    loom_comm_t c2 = create_with_timeout(loom_comm_rank(c), loom_comm_size(c), 10);
    if (!c2)
        return 1;
    loom_status_t st = loom_allreduce(LOOM_IN_PLACE, &f, 1, LOOM_FLOAT32, LOOM_SUM, c2);
    int ok = st == LOOM_ERR_INVALID_ARG && strstr(loom_comm_last_error(c2), "nonesuch");
    loom_comm_destroy(c2);
    return ok ? 0 : 1;
}

int main(void)
{
    test_rank_death();
    test_wrong_port();
    test_strangers();
    test_auth();
    test_mismatch();
    test_abort_and_timeout();
    mp_result("peer destroyed its communicator while we wait: PEER_LOST",
              mp_run(2, destroyed_peer_rank, NULL, 30) == 0);
    mp_result("300 times: pairs of ranks split off, a small allreduce in each, the pair's "
              "communicator destroyed at once: no rank takes a peer that left after it for a "
              "failure",
              mp_run(4, leave_after_allreduce_rank, NULL, 60) == 0);
    mp_result("peer destroyed its communicator while we wait in a small allreduce: PEER_LOST",
              mp_run(2, destroyed_peer_allreduce_rank, NULL, 30) == 0);
    mp_result("bad arguments: LOOM_ERR_INVALID_ARG with a message, communicator still usable (1 rank)",
              mp_run(1, bad_args_rank, NULL, 30) == 0);
    mp_result("bad arguments on 3 ranks", mp_run(3, bad_args_rank, NULL, 30) == 0);
    mp_result("a rank missing at rendezvous: timeout names it",
              mp_run_raw(2, missing_rank, NULL, 30) == 0);
    mp_result("LOOM_ALGO naming an unknown algorithm: INVALID_ARG naming it",
              mp_run(2, bad_algo_rank, NULL, 30) == 0);
    return mp_summary();
}
