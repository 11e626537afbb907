/* Unit tests of elastic communicators (src/elastic.c) with ranks as threads
 * of one process on a tcp:// store served here, without a launcher: the first
 * round, a member that leaves without dying (left out after
 * LOOM_ELASTIC_TIMEOUT, then refused as stale), a newcomer that joins at a
 * commit point, a member the launcher reports dead (not waited for), revoke,
 * and the calls on communicators that are not elastic. Ids come from the
 * store's counter, since threads share one environment. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_suites.h"
#include "loom.h"
#include "store/store.h"

/* Long enough that no thread of a loaded machine misses a round it is part of
 * (a newcomer's loom_init is bounded by it too, and members reach their
 * rebuild only after a few join_pending rounds), short enough for the case
 * that waits it out on purpose (10 s was too short under ASan with two busy processes). */
#define ELASTIC_TIMEOUT_S 30.0

typedef struct member {
    loom_comm_t comm, next;
    loom_status_t st;
    int pending;
    int op;             /* what the thread does, see member_main */
    char msg[512];      /* the error of a failed op (errors are per thread) */
} member_t;

enum { OP_INIT, OP_REBUILD, OP_JOIN_THEN_REBUILD, OP_ALLREDUCE };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A loom_init that failed: members waiting at a commit point for a newcomer
 * stop waiting (else they would poll until the test's timeout, and the
 * newcomer's error would never be seen). */
static _Atomic int init_failed;

static void *member_main(void *arg)
{
    member_t *m = arg;
    switch (m->op) {
    case OP_INIT:
        m->st = loom_init(&m->comm);
        if (m->st != LOOM_SUCCESS)
            atomic_store(&init_failed, 1);
        break;
    case OP_REBUILD:
        m->st = loom_comm_rebuild(m->comm, &m->next);
        break;
    case OP_JOIN_THEN_REBUILD:
        /* A commit point, as a training loop would reach it every step; the
         * newcomer registers within its own bounded loom_init. */
        do {
            m->st = loom_comm_join_pending(m->comm, &m->pending);
            if (m->st == LOOM_SUCCESS && m->pending == 0) {
                if (atomic_load(&init_failed)) {
                    m->st = LOOM_ERR_INTERNAL;
                    snprintf(m->msg, sizeof(m->msg), "the newcomer's loom_init failed");
                    return NULL;
                }
                usleep(20000);
            }
        } while (m->st == LOOM_SUCCESS && m->pending == 0);
        /* The member that agreed first may already have revoked this epoch for
         * the rebuild while our agreement was still in flight: the call fails
         * (PEER_LOST), and we rebuild as a training loop does after any failed
         * call. */
        if (m->st == LOOM_SUCCESS || m->st == LOOM_ERR_PEER_LOST)
            m->st = loom_comm_rebuild(m->comm, &m->next);
        break;
    case OP_ALLREDUCE: {
        int32_t v = loom_comm_rank(m->comm) + 1;
        m->st = loom_allreduce(LOOM_IN_PLACE, &v, 1, LOOM_INT32, LOOM_SUM, m->comm);
        m->pending = v;
        break;
    }
    }
    if (m->st != LOOM_SUCCESS)
        snprintf(m->msg, sizeof(m->msg), "%s",
                 loom_comm_last_error(m->op == OP_INIT ? NULL : m->comm));
    return NULL;
}

/* Run op on members[i] for each i in idx (n of them) concurrently. */
static void run_all(member_t *members, const int *idx, int n, int op)
{
    pthread_t t[8];
    for (int i = 0; i < n; i++) {
        members[idx[i]].op = op;
        ck_assert_int_eq(pthread_create(&t[i], NULL, member_main, &members[idx[i]]), 0);
    }
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}

/* Adopt the rebuilt communicators. */
static void adopt(member_t *members, const int *idx, int n)
{
    for (int i = 0; i < n; i++) {
        member_t *m = &members[idx[i]];
        ck_assert_msg(m->st == LOOM_SUCCESS, "rebuild: %s: %s", loom_strerror(m->st),
                      loom_comm_last_error(m->comm));
        loom_comm_destroy(m->comm);
        m->comm = m->next;
        m->next = NULL;
    }
}

static loom_store_server_t *srv;
static loom_store_t *client;
static char job[64];

static void setup_env(void)
{
    loom_err_t err = {0};
    ck_assert_int_eq(loom_store_server_start("127.0.0.1", 0, &err, &srv), LOOM_SUCCESS);
    char uri[64], t[32];
    snprintf(uri, sizeof(uri), "tcp://127.0.0.1:%d", loom_store_server_port(srv));
    snprintf(job, sizeof(job), "check-elastic-%d", (int)getpid());
    snprintf(t, sizeof(t), "%g", ELASTIC_TIMEOUT_S);
    setenv("LOOM_ELASTIC", "1", 1);
    setenv("LOOM_STORE", uri, 1);
    setenv("LOOM_JOB_ID", job, 1);
    setenv("LOOM_RANK", "0", 1);
    setenv("LOOM_SIZE", "3", 1);
    setenv("LOOM_SHM", "0", 1);
    setenv("LOOM_TIMEOUT", "30", 1);
    setenv("LOOM_ELASTIC_TIMEOUT", t, 1);
    unsetenv("LOOM_ELASTIC_ID");
    unsetenv("LOOM_ELASTIC_MIN_NP");
    ck_assert_int_eq(loom_store_open(uri, -1, 10, &err, &client), LOOM_SUCCESS);
}

static void teardown_env(void)
{
    loom_store_close(client);
    loom_store_server_stop(srv);
    unsetenv("LOOM_ELASTIC");
    unsetenv("LOOM_ELASTIC_TIMEOUT");
}

/* The id the store gave the member with this rank in this epoch. */
static long long id_of(uint64_t epoch, int rank)
{
    char key[256];
    snprintf(key, sizeof(key), "loom/%s/elastic/e%llu/members", job, (unsigned long long)epoch);
    void *val;
    size_t len;
    loom_err_t err = {0};
    ck_assert_int_eq(loom_store_get(client, key, &val, &len, 5, &err), LOOM_SUCCESS);
    const char *p = val;
    for (int r = 0; r < rank && p; r++) {
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    ck_assert_ptr_nonnull(p);
    long long id = strtoll(p, NULL, 10);
    free(val);
    return id;
}

START_TEST(test_elastic_lifecycle)
{
    setup_env();
    member_t m[5];
    memset(m, 0, sizeof(m));

    /* Epoch 0: three processes, ranks in id order. */
    int first[3] = {0, 1, 2};
    run_all(m, first, 3, OP_INIT);
    int seen = 0;
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(m[i].st == LOOM_SUCCESS, "loom_init: %s", m[i].msg);
        ck_assert_int_eq(loom_comm_size(m[i].comm), 3);
        ck_assert_uint_eq(loom_comm_epoch(m[i].comm), 0);
        seen |= 1 << loom_comm_rank(m[i].comm);
    }
    ck_assert_int_eq(seen, 7);
    run_all(m, first, 3, OP_ALLREDUCE);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(m[i].pending, 6);

    /* The member of rank 1 revokes and stays away (alive, so nobody reports it
     * dead): the others rebuild without it after LOOM_ELASTIC_TIMEOUT and keep
     * their order. */
    int r0 = -1, r1 = -1, r2 = -1;
    for (int i = 0; i < 3; i++) {
        int r = loom_comm_rank(m[i].comm);
        *(r == 0 ? &r0 : r == 1 ? &r1 : &r2) = i;
    }
    ck_assert_int_eq(loom_comm_revoke(m[r1].comm), LOOM_SUCCESS);
    int32_t v = 1;
    ck_assert_int_eq(loom_allreduce(LOOM_IN_PLACE, &v, 1, LOOM_INT32, LOOM_SUM, m[r1].comm),
                     LOOM_ERR_PEER_LOST);
    int rest[2] = {r0, r2};
    double t0 = now_s();
    run_all(m, rest, 2, OP_REBUILD);
    double waited = now_s() - t0;
    adopt(m, rest, 2);
    ck_assert_msg(waited > ELASTIC_TIMEOUT_S - 0.5 && waited < ELASTIC_TIMEOUT_S + 60,
                  "waited %.1f s for the missing member", waited);
    ck_assert_int_eq(loom_comm_size(m[r0].comm), 2);
    ck_assert_int_eq(loom_comm_rank(m[r0].comm), 0);
    ck_assert_int_eq(loom_comm_rank(m[r2].comm), 1);
    ck_assert_uint_eq(loom_comm_epoch(m[r2].comm), 1);

    /* Its late rebuild is refused as stale. */
    loom_comm_t none = NULL;
    ck_assert_int_eq(loom_comm_rebuild(m[r1].comm, &none), LOOM_ERR_ABORTED);
    ck_assert_ptr_null(none);
    ck_assert_msg(strstr(loom_comm_last_error(m[r1].comm), "stale rank") != NULL, "%s",
                  loom_comm_last_error(m[r1].comm));
    loom_comm_destroy(m[r1].comm);
    m[r1].comm = NULL;

    /* A newcomer: its loom_init returns once the members rebuild at a commit
     * point; it comes last. */
    pthread_t nt;
    m[3].op = OP_INIT;
    ck_assert_int_eq(pthread_create(&nt, NULL, member_main, &m[3]), 0);
    run_all(m, rest, 2, OP_JOIN_THEN_REBUILD);
    pthread_join(nt, NULL);
    ck_assert_msg(m[3].st == LOOM_SUCCESS, "newcomer: %s: %s", loom_strerror(m[3].st), m[3].msg);
    adopt(m, rest, 2);
    ck_assert_msg(m[r0].pending == 1 || m[r2].pending == 1, "no member saw the newcomer");
    ck_assert_int_eq(loom_comm_size(m[3].comm), 3);
    ck_assert_int_eq(loom_comm_rank(m[3].comm), 2);
    ck_assert_int_eq(loom_comm_rank(m[r0].comm), 0);
    ck_assert_int_eq(loom_comm_rank(m[r2].comm), 1);
    ck_assert_uint_eq(loom_comm_epoch(m[3].comm), 2);
    int three[3] = {r0, r2, 3};
    run_all(m, three, 3, OP_ALLREDUCE);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(m[three[i]].pending, 6);

    /* A member the launcher reports dead is not waited for. */
    char key[256];
    snprintf(key, sizeof(key), "loom/%s/elastic/dead/%lld", job, id_of(2, 1));
    loom_err_t err = {0};
    ck_assert_int_eq(loom_store_set(client, key, "1", 1, &err), LOOM_SUCCESS);
    ck_assert_int_eq(loom_comm_revoke(m[r2].comm), LOOM_SUCCESS);
    int two[2] = {r0, 3};
    t0 = now_s();
    run_all(m, two, 2, OP_REBUILD);
    waited = now_s() - t0;
    adopt(m, two, 2);
    ck_assert_msg(waited < ELASTIC_TIMEOUT_S - 1, "waited %.1f s for a dead member", waited);
    ck_assert_int_eq(loom_comm_size(m[3].comm), 2);
    ck_assert_int_eq(loom_comm_rank(m[3].comm), 1);
    ck_assert_uint_eq(loom_comm_epoch(m[r0].comm), 3);
    run_all(m, two, 2, OP_ALLREDUCE);
    ck_assert_int_eq(m[3].pending, 3);

    loom_comm_destroy(m[r2].comm);
    loom_comm_destroy(m[r0].comm);
    loom_comm_destroy(m[3].comm);
    teardown_env();
}
END_TEST

START_TEST(test_not_elastic)
{
    unsetenv("LOOM_ELASTIC");
    loom_config_t cfg = LOOM_CONFIG_INIT;
    cfg.rank = 0;
    cfg.size = 1;
    loom_comm_t c, out = NULL;
    ck_assert_int_eq(loom_comm_create(&cfg, &c), LOOM_SUCCESS);
    ck_assert_uint_eq(loom_comm_epoch(c), 0);
    int pending = -1;
    ck_assert_int_eq(loom_comm_join_pending(c, &pending), LOOM_SUCCESS);
    ck_assert_int_eq(pending, 0);
    ck_assert_int_eq(loom_comm_rebuild(c, &out), LOOM_ERR_INVALID_ARG);
    ck_assert_ptr_null(out);
    ck_assert_ptr_nonnull(strstr(loom_comm_last_error(c), "not an elastic communicator"));
    ck_assert_int_eq(loom_comm_revoke(c), LOOM_SUCCESS);
    int32_t v = 1;
    ck_assert_int_eq(loom_allreduce(LOOM_IN_PLACE, &v, 1, LOOM_INT32, LOOM_SUM, c),
                     LOOM_ERR_PEER_LOST);
    ck_assert_ptr_nonnull(strstr(loom_comm_last_error(c), "revoked"));
    ck_assert_int_eq(loom_comm_revoke(NULL), LOOM_ERR_INVALID_ARG);
    ck_assert_int_eq(loom_comm_rebuild(NULL, &out), LOOM_ERR_INVALID_ARG);
    ck_assert_int_eq(loom_comm_join_pending(c, NULL), LOOM_ERR_INVALID_ARG);
    loom_comm_destroy(c);
}
END_TEST

Suite *loom_elastic_suite(void)
{
    Suite *su = suite_create("elastic");
    TCase *tc = tcase_create("elastic");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_elastic_lifecycle);
    tcase_add_test(tc, test_not_elastic);
    suite_add_tcase(su, tc);
    return su;
}
