/*
 * check_transport.c - the transport conformance suite: the same cases, through
 * the ops table of transport.h, against every transport (the thread harness's
 * in-memory double, tcp, shm, the mux of shm and tcp, ibverbs over the
 * libibverbs test double): ordering per tag, sends to self, 0-byte and large
 * messages, length and descriptor mismatches, a lost peer, a receiver that
 * leaves as soon as it has its message, an abort from another thread, destroy
 * with requests pending. Ranks are threads of one
 * process (tests/transport_harness.h); every wait is bounded and ends on an
 * event, never on the clock.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "transport_harness.h"

/* Bounds on waits that end on events; a working transport is far inside them
 * even on a loaded machine. The endpoints' own timeout (LOOM_TIMEOUT) is 60 s,
 * so a failure reported before WAIT_S was detected, not timed out. */
#define WAIT_S 30.0
#define PROMPT_S 15.0

#define MAX_PEERS 3

static void fill(uint8_t *buf, size_t len, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (uint8_t)(x >> 16);
    }
}

/* 0 when buf holds what fill(seed) wrote. */
static int check_fill(const uint8_t *buf, size_t len, unsigned seed, size_t *bad_p)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x = x * 1103515245u + 12345u;
        if (buf[i] != (uint8_t)(x >> 16)) {
            *bad_p = i;
            return -1;
        }
    }
    return 0;
}

static unsigned seed_of(int src, int dst, int idx)
{
    return (unsigned)(src * 1000 + dst * 100 + idx + 1);
}

/* On rank threads: no ck_assert; a failed allocation is a failed case. */
static void *rmalloc(tph_rank_t *r, size_t len)
{
    void *p = malloc(len ? len : 1);
    if (!p)
        tph_fail(r, "out of memory for %zu bytes", len);
    return p;
}

static void run_case(int kind, int (*fn)(tph_rank_t *, void *), void *arg, const char *what)
{
    char why[512], msg[LOOM_ERRMSG_MAX + 256];
    if (!tph_available((tph_kind_t)kind, why, sizeof(why)))
        return;   /* main said so, once */
    int rc = tph_run((tph_kind_t)kind, fn, arg, msg, sizeof(msg));
    ck_assert_msg(rc == 0, "%s over %s: %s", what, tph_name((tph_kind_t)kind), msg);
}

static const char *st_name(loom_status_t st)
{
    return loom_strerror(st);
}

/* ---- ordering per tag -------------------------------------------------------------- */

/* Rank 0 sends every other rank five messages on two tags, interleaved, of
 * sizes that take the eager and the large-message paths; the receiver posts
 * tag B's receives before anything is sent and tag A's only once B's are
 * done, so A's messages wait unexpected. Each tag's messages must land in
 * send order, and a receive takes only its own tag. */
#define TAG_A 0x11
#define TAG_B 0x22
static const struct { uint64_t tag; size_t len; } order_msgs[] = {
    {TAG_A, 10}, {TAG_B, 1000}, {TAG_A, 70000}, {TAG_B, 300000}, {TAG_A, 3},
};
#define NORDER (int)(sizeof(order_msgs) / sizeof(order_msgs[0]))

static int case_order(tph_rank_t *r, void *arg)
{
    (void)arg;
    loom_tp_req_t reqs[MAX_PEERS * NORDER];
    loom_tp_req_t *rp[MAX_PEERS * NORDER];
    uint8_t *bufs[MAX_PEERS * NORDER] = {NULL};
    int n = 0, rc = 0;
    loom_status_t st;

    if (r->rank == 0) {
        if (tph_barrier(r) != 0)
            return -1;
        for (int k = 1; k < r->size; k++)
            for (int i = 0; i < NORDER; i++) {
                if (!(bufs[n] = rmalloc(r, order_msgs[i].len)))
                    goto out;
                fill(bufs[n], order_msgs[i].len, seed_of(0, k, i));
                rp[n] = &reqs[n];
                if ((st = tph_isend(r, &reqs[n], k, bufs[n], order_msgs[i].len,
                                    order_msgs[i].tag)) != LOOM_SUCCESS) {
                    rc = tph_fail(r, "isend %d to %d: %s: %s", i, k, st_name(st), r->err->msg);
                    goto out;
                }
                n++;
            }
        if ((st = tph_wait(r, rp, n, WAIT_S)) != LOOM_SUCCESS)
            rc = tph_fail(r, "sends: %s: %s", st_name(st), r->err->msg);
        goto out;
    }
    /* Tag B first (posted before the sends), then tag A. */
    for (int pass = 0; pass < 2; pass++) {
        uint64_t tag = pass == 0 ? TAG_B : TAG_A;
        int first = n;
        for (int i = 0; i < NORDER; i++) {
            if (order_msgs[i].tag != tag)
                continue;
            if (!(bufs[i] = rmalloc(r, order_msgs[i].len)))
                goto out;
            memset(bufs[i], 0xee, order_msgs[i].len);
            rp[n++] = &reqs[i];
            if ((st = tph_irecv(r, &reqs[i], 0, bufs[i], order_msgs[i].len, tag)) !=
                LOOM_SUCCESS) {
                rc = tph_fail(r, "irecv %d: %s: %s", i, st_name(st), r->err->msg);
                goto out;
            }
        }
        if (pass == 0 && tph_barrier(r) != 0) {
            rc = -1;
            goto out;
        }
        if ((st = tph_wait(r, rp + first, n - first, WAIT_S)) != LOOM_SUCCESS) {
            rc = tph_fail(r, "receives of tag %#llx: %s: %s", (unsigned long long)tag,
                          st_name(st), r->err->msg);
            goto out;
        }
    }
    for (int i = 0; i < NORDER; i++) {
        size_t bad = 0;
        if (reqs[i].off != order_msgs[i].len ||
            check_fill(bufs[i], order_msgs[i].len, seed_of(0, r->rank, i), &bad) != 0) {
            rc = tph_fail(r, "message %d (tag %#llx, %zu bytes) arrived wrong or out of order "
                          "(byte %zu differs, %zu bytes moved)", i,
                          (unsigned long long)order_msgs[i].tag, order_msgs[i].len, bad,
                          reqs[i].off);
            goto out;
        }
    }
out:
    tph_end(r);
    for (int i = 0; i < MAX_PEERS * NORDER; i++)
        free(bufs[i]);
    return rc;
}

START_TEST(test_order_per_tag)
{
    run_case(_i, case_order, NULL, "ordering per tag");
}
END_TEST

/* ---- sends to self ----------------------------------------------------------------- */

/* Every rank sends itself a small and a large message on one tag: the first
 * receive posted before, the second after its send. */
static int case_self(tph_rank_t *r, void *arg)
{
    (void)arg;
    const size_t len[2] = {100, 300000};
    uint8_t *out[2] = {NULL, NULL}, *in[2] = {NULL, NULL};
    loom_tp_req_t s[2], q[2];
    loom_tp_req_t *all[4] = {&s[0], &s[1], &q[0], &q[1]};
    loom_status_t st;
    int rc = -1;

    for (int i = 0; i < 2; i++) {
        if (!(out[i] = rmalloc(r, len[i])) || !(in[i] = rmalloc(r, len[i])))
            goto out;
        fill(out[i], len[i], seed_of(r->rank, r->rank, i));
        memset(in[i], 0, len[i]);
    }
    if ((st = tph_irecv(r, &q[0], r->rank, in[0], len[0], 5)) != LOOM_SUCCESS ||
        (st = tph_isend(r, &s[0], r->rank, out[0], len[0], 5)) != LOOM_SUCCESS ||
        (st = tph_isend(r, &s[1], r->rank, out[1], len[1], 5)) != LOOM_SUCCESS ||
        (st = tph_irecv(r, &q[1], r->rank, in[1], len[1], 5)) != LOOM_SUCCESS) {
        tph_fail(r, "posting to self: %s: %s", st_name(st), r->err->msg);
        goto out;
    }
    if ((st = tph_wait(r, all, 4, WAIT_S)) != LOOM_SUCCESS) {
        tph_fail(r, "sends to self: %s: %s", st_name(st), r->err->msg);
        goto out;
    }
    for (int i = 0; i < 2; i++) {
        size_t bad = 0;
        if (check_fill(in[i], len[i], seed_of(r->rank, r->rank, i), &bad) != 0) {
            tph_fail(r, "message %d to self differs at byte %zu", i, bad);
            goto out;
        }
    }
    rc = 0;
out:
    tph_end(r);
    for (int i = 0; i < 2; i++) {
        free(out[i]);
        free(in[i]);
    }
    return rc;
}

START_TEST(test_self)
{
    run_case(_i, case_self, NULL, "sends to self");
}
END_TEST

/* ---- 0-byte and large messages ----------------------------------------------------- */

#define LARGE (((size_t)6 << 20) + 13)  /* several MiB, not a multiple of anything */

/* Rank 0 and each other rank swap, both ways at once: a 0-byte message, a
 * large one, and a 0-byte one again, on one tag (the empty ones must neither
 * be lost nor take the large one's place). */
static int case_sizes(tph_rank_t *r, void *arg)
{
    (void)arg;
    enum { PER = 3 };
    const size_t len[PER] = {0, LARGE, 0};
    int peers[MAX_PEERS], np = 0;
    loom_tp_req_t reqs[2 * MAX_PEERS * PER];
    loom_tp_req_t *rp[2 * MAX_PEERS * PER] = {NULL};
    uint8_t *out = NULL, *in[MAX_PEERS] = {NULL};
    uint8_t empty_in[MAX_PEERS][PER][1], empty_out[1] = {0x5a};
    loom_status_t st;
    int n = 0, rc = -1;

    if (r->rank == 0)
        for (int k = 1; k < r->size; k++)
            peers[np++] = k;
    else
        peers[np++] = 0;
    if (!(out = rmalloc(r, LARGE)))
        goto out;
    fill(out, LARGE, seed_of(r->rank, 0, 9));
    for (int p = 0; p < np; p++) {
        if (!(in[p] = rmalloc(r, LARGE)))
            goto out;
        memset(in[p], 0, LARGE);
        for (int i = 0; i < PER; i++) {
            void *rb = len[i] ? (void *)in[p] : (void *)empty_in[p][i];
            empty_in[p][i][0] = 0x77;
            rp[n] = &reqs[n];
            if ((st = tph_irecv(r, &reqs[n++], peers[p], rb, len[i], 40)) != LOOM_SUCCESS)
                goto post_failed;
        }
    }
    for (int p = 0; p < np; p++)
        for (int i = 0; i < PER; i++) {
            const void *sb = len[i] ? (const void *)out : (const void *)empty_out;
            rp[n] = &reqs[n];
            if ((st = tph_isend(r, &reqs[n++], peers[p], sb, len[i], 40)) != LOOM_SUCCESS)
                goto post_failed;
        }
    if ((st = tph_wait(r, rp, n, WAIT_S)) != LOOM_SUCCESS) {
        tph_fail(r, "0-byte and %zu-byte messages: %s: %s", LARGE, st_name(st), r->err->msg);
        goto out;
    }
    for (int p = 0; p < np; p++) {
        size_t bad = 0;
        for (int i = 0; i < PER; i++) {
            loom_tp_req_t *q = &reqs[p * PER + i];
            if (q->off != len[i]) {
                tph_fail(r, "message %d from rank %d: %zu bytes moved, %zu sent", i, peers[p],
                         q->off, len[i]);
                goto out;
            }
            if (len[i] == 0 && empty_in[p][i][0] != 0x77) {
                tph_fail(r, "a 0-byte message from rank %d wrote into its buffer", peers[p]);
                goto out;
            }
        }
        if (check_fill(in[p], LARGE, seed_of(peers[p], 0, 9), &bad) != 0) {
            tph_fail(r, "the %zu-byte message from rank %d differs at byte %zu", LARGE,
                     peers[p], bad);
            goto out;
        }
    }
    rc = 0;
    goto out;
post_failed:
    tph_fail(r, "posting: %s: %s", st_name(st), r->err->msg);
out:
    tph_end(r);
    free(out);
    for (int p = 0; p < MAX_PEERS; p++)
        free(in[p]);
    return rc;
}

START_TEST(test_zero_and_large)
{
    run_case(_i, case_sizes, NULL, "0-byte and large messages");
}
END_TEST

/* ---- mismatches -------------------------------------------------------------------- */

typedef struct mismatch {
    size_t send_len, recv_len;
    uint32_t recv_desc;      /* the sender's is 0x1234 */
    uint64_t recv_total;     /* the sender's is 7 */
    const char *what;
} mismatch_t;

static const mismatch_t mismatches[] = {
    {4096, 1024, 0x1234, 7, "a receive smaller than the message"},
    {1 << 20, (1 << 20) - 8, 0x1234, 7, "a large message into a smaller receive"},
    {100, 200, 0x1234, 7, "a receive larger than the message"},
    {256, 256, 0x4321, 7, "another descriptor"},
    {256, 256, 0x1234, 8, "another total count"},
};
#define NMISMATCH (int)(sizeof(mismatches) / sizeof(mismatches[0]))

/* Rank 0 sends each other rank a message its receive does not fit: the
 * receive fails with LOOM_ERR_MISMATCH and a message that names the sender
 * (and both lengths, for a length mismatch). The sender's wait ends too
 * (completed, or failed once the receiver leaves), bounded. */
static int case_mismatch(tph_rank_t *r, void *arg)
{
    const mismatch_t *m = arg;
    loom_tp_req_t reqs[MAX_PEERS];
    loom_tp_req_t *rp[MAX_PEERS];
    uint8_t *buf = NULL;
    loom_status_t st;
    int rc = -1;
    size_t len = m->send_len > m->recv_len ? m->send_len : m->recv_len;

    if (!(buf = rmalloc(r, len)))
        goto out;
    memset(buf, 1, len);
    if (r->rank == 0) {
        for (int k = 1; k < r->size; k++) {
            rp[k - 1] = &reqs[k - 1];
            if ((st = tph_isend(r, &reqs[k - 1], k, buf, m->send_len, 9)) != LOOM_SUCCESS) {
                tph_fail(r, "isend: %s: %s", st_name(st), r->err->msg);
                goto out;
            }
        }
        st = tph_wait(r, rp, r->size - 1, WAIT_S);
        if (st == LOOM_ERR_TIMEOUT) {
            tph_fail(r, "the sender still waits %.0f s after the receiver refused the "
                     "message", WAIT_S);
            goto out;
        }
        rc = 0;
        goto out;
    }
    loom_tp_match_t expect = {.tag = 9, .desc = m->recv_desc, .total = m->recv_total};
    if ((st = tph_irecv_match(r, &reqs[0], 0, buf, m->recv_len, &expect)) != LOOM_SUCCESS) {
        /* A transport may find the mismatch at once (the message is there). */
    } else {
        rp[0] = &reqs[0];
        st = tph_wait(r, rp, 1, WAIT_S);
    }
    /* As the core does with a failed call (coll.c, mark_broken): the peers
     * must learn that this endpoint gave up. */
    r->ops->abort(r->tp, st);
    /* With several receivers, one may hear first that another refused the
     * message (a failure spreads to every rank, wire.h's GAVE_UP). */
    if (st == LOOM_ERR_PEER_LOST && r->size > 2 && strstr(r->err->msg, "gave up") &&
        strstr(r->err->msg, loom_strerror(LOOM_ERR_MISMATCH))) {
        rc = 0;
        goto out;
    }
    if (st != LOOM_ERR_MISMATCH) {
        tph_fail(r, "%s: the receive ended with %s (%s), not LOOM_ERR_MISMATCH", m->what,
                 st_name(st), r->err->msg);
        goto out;
    }
    char sent[32], want[32];
    snprintf(sent, sizeof(sent), "%zu", m->send_len);
    snprintf(want, sizeof(want), "%zu", m->recv_len);
    if (strstr(r->err->msg, "rank 0") == NULL ||
        (m->send_len != m->recv_len &&
         (strstr(r->err->msg, sent) == NULL || strstr(r->err->msg, want) == NULL))) {
        tph_fail(r, "%s: the error does not name the sender and both lengths: \"%s\"", m->what,
                 r->err->msg);
        goto out;
    }
    rc = 0;
out:
    tph_end(r);
    free(buf);
    return rc;
}

START_TEST(test_mismatch)
{
    for (int i = 0; i < NMISMATCH; i++)
        run_case(_i, case_mismatch, (void *)&mismatches[i], mismatches[i].what);
}
END_TEST

/* ---- a lost peer ------------------------------------------------------------------- */

enum { LOST_RECV, LOST_GAVE_UP, LOST_SEND };
static const char *const lost_what[] = {
    "a peer that destroys its endpoint while we wait to receive",
    "a peer that gives up while we wait to receive",
    "a peer that destroys its endpoint while we wait to send it a large message",
};

/* Rank 0 waits for a message from every other rank (or, LOST_SEND, for its
 * large sends to them to complete); they destroy their endpoints instead
 * (after an abort, LOST_GAVE_UP: a rank whose call failed). Rank 0 fails
 * with LOOM_ERR_PEER_LOST (or its sends complete, buffered), long before
 * its timeout. */
static int case_peer_lost(tph_rank_t *r, void *arg)
{
    int mode = (int)(intptr_t)arg;
    loom_tp_req_t reqs[MAX_PEERS];
    loom_tp_req_t *rp[MAX_PEERS];
    uint8_t buf[MAX_PEERS][64];
    uint8_t *big = NULL;
    loom_status_t st;
    int gave_up = mode == LOST_GAVE_UP;

    if (r->rank != 0) {
        if (tph_barrier(r) != 0)
            return -1;
        if (gave_up)
            r->ops->abort(r->tp, LOOM_ERR_ABORTED);
        tph_destroy(r, 5.0);
        return 0;
    }
    int rc = -1;
    loom_tp_req_t again;
    loom_tp_req_t *ap = &again;
    if (mode == LOST_SEND) {
        if (!(big = rmalloc(r, LARGE)))
            goto out;
        memset(big, 6, LARGE);
    }
    for (int k = 1; k < r->size; k++) {
        rp[k - 1] = &reqs[k - 1];
        st = mode == LOST_SEND ? tph_isend(r, &reqs[k - 1], k, big, LARGE, 3)
                               : tph_irecv(r, &reqs[k - 1], k, buf[k - 1], 64, 3);
        if (st != LOOM_SUCCESS) {
            tph_fail(r, "posting: %s: %s", st_name(st), r->err->msg);
            goto out;
        }
    }
    if (tph_barrier(r) != 0)
        goto out;
    double t0 = tph_now();
    st = tph_wait(r, rp, r->size - 1, WAIT_S);
    double waited = tph_now() - t0;
    /* A send may also complete: the transport buffered it (the harness's
     * eager copy), which is all a send promises. */
    if (mode == LOST_SEND && st == LOOM_SUCCESS) {
        rc = 0;
        goto out;
    }
    if (st != LOOM_ERR_PEER_LOST) {
        tph_fail(r, "%s: %s after %.1f s (%s), not LOOM_ERR_PEER_LOST", lost_what[mode],
                 st_name(st), waited, r->err->msg);
        goto out;
    }
    if (strstr(r->err->msg, "rank ") == NULL) {
        tph_fail(r, "the PEER_LOST message names no rank: \"%s\"", r->err->msg);
        goto out;
    }
    /* Later requests fail the same way (a lost peer is sticky). */
    st = tph_irecv(r, &again, 1, buf[0], 64, 4);
    if (st == LOOM_SUCCESS)
        st = tph_wait(r, &ap, 1, WAIT_S);
    if (st != LOOM_ERR_PEER_LOST)
        tph_fail(r, "a receive from the lost rank posted afterwards ended with %s", st_name(st));
    else
        rc = 0;
out:
    /* The requests and buffer stay valid until the endpoint is gone. */
    tph_destroy(r, 5.0);
    free(big);
    return rc;
}

START_TEST(test_peer_lost)
{
    for (intptr_t mode = LOST_RECV; mode <= LOST_SEND; mode++)
        run_case(_i, case_peer_lost, (void *)mode, lost_what[mode]);
}
END_TEST

/* ---- a receiver that leaves at once ---------------------------------------------- */

/* Rank 0 sends every other rank a large message; each waits until it has
 * arrived (probe, where the transport has one), posts its receive, waits
 * only while the receive is not done, and destroys its endpoint right away,
 * without another progress call. The sends complete: whatever the receiver
 * still owed its sender (an acknowledgement) goes out before its goodbye. */
static int case_leave_after_recv(tph_rank_t *r, void *arg)
{
    (void)arg;
    loom_tp_req_t reqs[MAX_PEERS];
    loom_tp_req_t *rp[MAX_PEERS];
    uint8_t *buf = rmalloc(r, LARGE);
    loom_status_t st;
    int rc = -1;

    if (!buf)
        goto out;
    if (r->rank == 0) {
        fill(buf, LARGE, 77);
        for (int k = 1; k < r->size; k++) {
            rp[k - 1] = &reqs[k - 1];
            if ((st = tph_isend(r, &reqs[k - 1], k, buf, LARGE, 12)) != LOOM_SUCCESS) {
                tph_fail(r, "isend: %s: %s", st_name(st), r->err->msg);
                goto out;
            }
        }
        if ((st = tph_wait(r, rp, r->size - 1, WAIT_S)) != LOOM_SUCCESS) {
            tph_fail(r, "sends to receivers that left once they had them: %s (%s)",
                     st_name(st), r->err->msg);
            goto out;
        }
        rc = 0;
        goto out;
    }
    double t0 = tph_now();
    while (r->ops->probe && !r->ops->probe(r->tp, 0, 12)) {
        int moved = 0;
        if ((st = r->ops->progress(r->tp, 50, &moved)) != LOOM_SUCCESS || tph_now() - t0 > WAIT_S) {
            tph_fail(r, "the message never arrived: %s (%s)", st_name(st), r->err->msg);
            goto out;
        }
    }
    rp[0] = &reqs[0];
    memset(buf, 0, LARGE);
    if ((st = tph_irecv(r, &reqs[0], 0, buf, LARGE, 12)) != LOOM_SUCCESS ||
        (st = tph_wait(r, rp, 1, WAIT_S)) != LOOM_SUCCESS) {
        tph_fail(r, "receive: %s: %s", st_name(st), r->err->msg);
        goto out;
    }
    size_t bad = 0;
    if (check_fill(buf, LARGE, 77, &bad) != 0) {
        tph_fail(r, "the message differs at byte %zu", bad);
        goto out;
    }
    rc = 0;
out:
    /* No barrier: the receivers leave as soon as they have the message. */
    tph_destroy(r, 10.0);
    free(buf);
    return rc;
}

START_TEST(test_leave_after_recv)
{
    run_case(_i, case_leave_after_recv, NULL, "a receiver that leaves once it has the message");
}
END_TEST

/* ---- abort from another thread ----------------------------------------------------- */

typedef struct aborter {
    tph_rank_t *r;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int go;
    double at;               /* when abort was called */
} aborter_t;

static void *aborter_main(void *p)
{
    aborter_t *a = p;
    pthread_mutex_lock(&a->lock);
    while (!a->go)
        pthread_cond_wait(&a->cond, &a->lock);
    pthread_mutex_unlock(&a->lock);
    a->at = tph_now();
    a->r->ops->abort(a->r->tp, LOOM_ERR_ABORTED);
    return NULL;
}

/* Rank 1 blocks in progress (a 20 s wait per call) on a receive from rank 0
 * that never comes, while another thread aborts the endpoint: progress
 * returns LOOM_ERR_ABORTED promptly, and later requests fail too. The other
 * ranks stay until it is done, so no goodbye of theirs ends its wait instead
 * (and only one rank aborts: the others would learn that it gave up). */
static int case_abort(tph_rank_t *r, void *arg)
{
    (void)arg;
    if (r->rank != 1)
        return tph_end(r);

    aborter_t a = {.r = r, .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    pthread_t tid;
    loom_tp_req_t req;
    uint8_t buf[64];
    loom_status_t st;
    int rc = -1;

    if ((st = tph_irecv(r, &req, 0, buf, sizeof(buf), 77)) != LOOM_SUCCESS) {
        tph_fail(r, "irecv: %s: %s", st_name(st), r->err->msg);
        tph_end(r);
        return -1;
    }
    if (pthread_create(&tid, NULL, aborter_main, &a) != 0) {
        tph_fail(r, "cannot start the aborting thread");
        tph_end(r);
        return -1;
    }
    pthread_mutex_lock(&a.lock);
    a.go = 1;
    pthread_cond_signal(&a.cond);
    pthread_mutex_unlock(&a.lock);
    double t0 = tph_now();
    st = LOOM_SUCCESS;
    while (st == LOOM_SUCCESS && !req.done && tph_now() - t0 < WAIT_S) {
        int moved = 0;
        st = r->ops->progress(r->tp, 20000, &moved);
    }
    double back = tph_now();
    pthread_join(tid, NULL);
    if (st == LOOM_SUCCESS && req.done)
        st = req.status;
    if (st != LOOM_ERR_ABORTED) {
        tph_fail(r, "a receive blocked in progress ended with %s (%s), not LOOM_ERR_ABORTED",
                 st_name(st), r->err->msg);
    } else if (back - a.at > PROMPT_S) {
        tph_fail(r, "progress returned %.1f s after the abort", back - a.at);
    } else {
        loom_tp_req_t again;
        loom_tp_req_t *ap = &again;
        st = tph_irecv(r, &again, 0, buf, sizeof(buf), 78);
        if (st == LOOM_SUCCESS)
            st = tph_wait(r, &ap, 1, WAIT_S);
        if (st != LOOM_ERR_ABORTED)
            tph_fail(r, "a receive posted after the abort ended with %s", st_name(st));
        else
            rc = 0;
    }
    tph_end(r);   /* the request on our stack stays valid until the endpoint is gone */
    return rc;
}

START_TEST(test_abort_from_thread)
{
    run_case(_i, case_abort, NULL, "abort from another thread");
}
END_TEST

/* ---- destroy with requests pending ------------------------------------------------- */

/* Every rank posts receives nobody serves and sends nobody takes (small and
 * large), to each peer and to itself, then destroys its endpoint at once and
 * frees the requests and buffers: destroy returns, bounded, and nothing
 * touches them afterwards (AddressSanitizer or valgrind see to that, and to
 * leaks). */
static int case_destroy_pending(tph_rank_t *r, void *arg)
{
    (void)arg;
    enum { PER = 4 };
    int n = 0;
    loom_tp_req_t *reqs = rmalloc(r, sizeof(loom_tp_req_t) * MAX_PEERS * PER);
    uint8_t *big = rmalloc(r, LARGE), *small = rmalloc(r, 512);
    loom_status_t st;
    int rc = -1;

    if (!reqs || !big || !small)
        goto out;
    memset(big, 3, LARGE);
    memset(small, 4, 512);
    for (int p = 0; p < r->size; p++) {
        if ((st = tph_irecv(r, &reqs[n++], p, small, 512, 1000 + (uint64_t)r->rank)) !=
                LOOM_SUCCESS ||
            (st = tph_irecv(r, &reqs[n++], p, big, LARGE, 2000 + (uint64_t)r->rank)) !=
                LOOM_SUCCESS ||
            (st = tph_isend(r, &reqs[n++], p, small, 512, 3000)) != LOOM_SUCCESS ||
            (st = tph_isend(r, &reqs[n++], p, big, LARGE, 4000)) != LOOM_SUCCESS) {
            tph_fail(r, "posting: %s: %s", st_name(st), r->err->msg);
            goto out;
        }
    }
    /* Some progress, so that messages are under way when the endpoints go. */
    for (int i = 0; i < 5; i++) {
        int moved = 0;
        r->ops->progress(r->tp, 0, &moved);
    }
    if (tph_barrier(r) != 0)
        goto out;
    double t0 = tph_now();
    tph_destroy(r, 5.0);
    double took = tph_now() - t0;
    if (took > WAIT_S)
        tph_fail(r, "destroy with requests pending took %.1f s", took);
    else
        rc = 0;
out:
    tph_destroy(r, 5.0);   /* done already, unless posting failed */
    /* A transport that still touched them now would be a use after free
     * under AddressSanitizer or valgrind. */
    free(reqs);
    free(big);
    free(small);
    return rc;
}

START_TEST(test_destroy_pending)
{
    run_case(_i, case_destroy_pending, NULL, "destroy with requests pending");
}
END_TEST

static Suite *transport_suite(void)
{
    Suite *s = suite_create("transport");
    struct { const char *name; const TTest *t; } cases[] = {
        {"order", test_order_per_tag},
        {"self", test_self},
        {"sizes", test_zero_and_large},
        {"mismatch", test_mismatch},
        {"peer_lost", test_peer_lost},
        {"leave_after_recv", test_leave_after_recv},
        {"abort", test_abort_from_thread},
        {"destroy_pending", test_destroy_pending},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        TCase *tc = tcase_create(cases[i].name);
        /* Bounded by the waits inside; this only ends a hang. */
        tcase_set_timeout(tc, 300);
        tcase_add_loop_test(tc, cases[i].t, 0, TPH_KINDS);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    char why[512];
    /* Load the verbs double here, once, so that every forked test uses it and
     * one registry, removed at the end. */
    if (!tph_available(TPH_IBVERBS, why, sizeof(why)))
        printf("SKIP: the conformance cases over ibverbs: %s\n", why);
    SRunner *sr = srunner_create(transport_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    const char *registry = getenv("FAKEVERBS_REGISTRY");
    if (registry)
        shm_unlink(registry);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
