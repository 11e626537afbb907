/* check_store_cb.c - communicators over the caller's store callbacks
 * (loom_comm_create_with_store): ranks as threads rendezvous through an
 * in-memory map, run collectives and a split; a missing rank times out naming
 * it; a callback's own message reaches loom_comm_last_error; release runs once;
 * with LOOM_AUTH_KEY the records are signed and any rewrite of rank 0's is
 * refused naming it. */
#include <check.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check_suites.h"
#include "loom.h"

#define MAP_MAX 256

/* The caller's store: a mutex-protected array with a condition for waiters. */
typedef struct map_store {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int n;
    char *keys[MAP_MAX];
    void *vals[MAP_MAX];
    size_t lens[MAP_MAX];
    atomic_int releases, gets, waits, fail_set;
    int rewrite;          /* REWRITE_*: how rank 0's record is altered on its way in */
    atomic_int rewrites;
} map_store_t;

/* What a writer of the store does to rank 0's address record ("size\naddress\n
 * host id\nshared-memory address", after the signature when there is one). */
enum {
    REWRITE_NONE = -1,
    REWRITE_SIZE, REWRITE_ADDR, REWRITE_HOST, REWRITE_SHM,   /* one field each */
    REWRITE_MAC,           /* one byte of the MAC */
    REWRITE_UNSIGNED,      /* the signature stripped, the value kept */
    REWRITE_CASES
};
static const char *const rewrite_names[REWRITE_CASES] = {
    "size", "transport address", "host id", "shared-memory address", "MAC", "signature removed"};

#define SIG_HEAD "LOOMSIG1"
#define SIG_HEAD_BYTES (8 + 32)

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    return n >= t && strcmp(s + n - t, tail) == 0;
}

/* The record as a rewrite leaves it (malloc'ed, *len_p updated): the
 * signature, when there is one, is kept as it was, as a writer without the key
 * must. */
static void *rewrite_record(int how, const void *val, size_t *len_p)
{
    size_t len = *len_p;
    size_t head = len >= SIG_HEAD_BYTES && memcmp(val, SIG_HEAD, 8) == 0 ? SIG_HEAD_BYTES : 0;
    char *out = malloc(len + 64);
    ck_assert_ptr_nonnull(out);
    if (how == REWRITE_MAC || how == REWRITE_UNSIGNED) {
        size_t skip = how == REWRITE_UNSIGNED ? head : 0;
        memcpy(out, (const char *)val + skip, len - skip);
        if (how == REWRITE_MAC)
            out[head ? 8 : 0] ^= 1;   /* unsigned: the size field's first digit */
        *len_p = len - skip;
        return out;
    }
    static const char *const repl[4] = {"3", "tcp:127.0.0.1:1", "elsewhere/0", "-"};
    char body[2048];
    ck_assert_uint_lt(len - head, sizeof(body));
    memcpy(body, (const char *)val + head, len - head);
    body[len - head] = '\0';
    char *f[4], *save = NULL;
    f[0] = strtok_r(body, "\n", &save);
    for (int i = 1; i < 4; i++)
        f[i] = strtok_r(NULL, "\n", &save);
    ck_assert_msg(f[3] != NULL, "rank 0's record has fewer than 4 fields");
    ck_assert_str_ne(f[how], repl[how]);
    f[how] = (char *)repl[how];
    memcpy(out, val, head);
    int n = snprintf(out + head, len + 64 - head, "%s\n%s\n%s\n%s", f[0], f[1], f[2], f[3]);
    *len_p = head + (size_t)n;
    return out;
}

static int map_find(map_store_t *m, const char *key)
{
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->keys[i], key) == 0)
            return i;
    return -1;
}

static loom_status_t map_set(void *ctx, const char *key, const void *val, size_t len, char *msg,
                             size_t msglen)
{
    map_store_t *m = ctx;
    if (atomic_load(&m->fail_set)) {
        snprintf(msg, msglen, "map store refuses key %s", key);
        return LOOM_ERR_TRANSPORT;
    }
    void *altered = NULL;
    if (m->rewrite != REWRITE_NONE && ends_with(key, "/addr/0")) {
        altered = rewrite_record(m->rewrite, val, &len);
        val = altered;
        atomic_fetch_add(&m->rewrites, 1);
    }
    pthread_mutex_lock(&m->mu);
    int i = map_find(m, key);
    if (i < 0) {
        ck_assert_int_lt(m->n, MAP_MAX);
        i = m->n++;
        m->keys[i] = strdup(key);
    } else {
        free(m->vals[i]);
    }
    m->vals[i] = malloc(len ? len : 1);
    memcpy(m->vals[i], val, len);
    m->lens[i] = len;
    pthread_cond_broadcast(&m->cond);
    pthread_mutex_unlock(&m->mu);
    free(altered);
    return LOOM_SUCCESS;
}

/* Wait for key until timeout_s; returns its index or -1. Called with mu held. */
static int map_wait_locked(map_store_t *m, const char *key, double timeout_s)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    double end = (double)dl.tv_sec + (double)dl.tv_nsec * 1e-9 + timeout_s;
    dl.tv_sec = (time_t)end;
    dl.tv_nsec = (long)((end - (double)dl.tv_sec) * 1e9);
    int i;
    while ((i = map_find(m, key)) < 0)
        if (timeout_s <= 0 || pthread_cond_timedwait(&m->cond, &m->mu, &dl) != 0)
            return map_find(m, key);
    return i;
}

static loom_status_t map_get(void *ctx, const char *key, double timeout_s, void **val_p,
                             size_t *len_p, char *msg, size_t msglen)
{
    map_store_t *m = ctx;
    (void)msg, (void)msglen;
    atomic_fetch_add(&m->gets, 1);
    pthread_mutex_lock(&m->mu);
    int i = map_wait_locked(m, key, timeout_s);
    if (i >= 0) {
        *val_p = malloc(m->lens[i] ? m->lens[i] : 1);
        memcpy(*val_p, m->vals[i], m->lens[i]);
        *len_p = m->lens[i];
    }
    pthread_mutex_unlock(&m->mu);
    return i >= 0 ? LOOM_SUCCESS : LOOM_ERR_TIMEOUT;
}

static loom_status_t map_wait(void *ctx, const char *key, double timeout_s, char *msg,
                              size_t msglen)
{
    map_store_t *m = ctx;
    (void)msg, (void)msglen;
    atomic_fetch_add(&m->waits, 1);
    pthread_mutex_lock(&m->mu);
    int i = map_wait_locked(m, key, timeout_s);
    pthread_mutex_unlock(&m->mu);
    return i >= 0 ? LOOM_SUCCESS : LOOM_ERR_TIMEOUT;
}

static loom_status_t map_add(void *ctx, const char *key, int64_t delta, int64_t *value_p,
                             char *msg, size_t msglen)
{
    map_store_t *m = ctx;
    (void)msg, (void)msglen;
    pthread_mutex_lock(&m->mu);
    int i = map_find(m, key);
    int64_t v = delta;
    if (i >= 0) {
        char buf[32] = "";
        memcpy(buf, m->vals[i], m->lens[i] < 31 ? m->lens[i] : 31);
        v += strtoll(buf, NULL, 10);
    }
    pthread_mutex_unlock(&m->mu);
    char out[32];
    int n = snprintf(out, sizeof(out), "%" PRId64, v);
    map_set(ctx, key, out, (size_t)n, NULL, 0);
    *value_p = v;
    return LOOM_SUCCESS;
}

static void map_release(void *ctx)
{
    map_store_t *m = ctx;
    atomic_fetch_add(&m->releases, 1);
}

static void map_init(map_store_t *m)
{
    memset(m, 0, sizeof(*m));
    m->rewrite = REWRITE_NONE;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cond, NULL);
}

static void map_free(map_store_t *m)
{
    for (int i = 0; i < m->n; i++) {
        free(m->keys[i]);
        free(m->vals[i]);
    }
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cond);
}

static loom_store_callbacks_t map_callbacks(map_store_t *m, int with_wait)
{
    loom_store_callbacks_t cb;
    memset(&cb, 0, sizeof(cb));
    cb.struct_size = sizeof(cb);
    cb.ctx = m;
    cb.set = map_set;
    cb.get = map_get;
    cb.add = map_add;
    cb.wait = with_wait ? map_wait : NULL;
    cb.release = map_release;
    return cb;
}

/* Each rank has a store handle of its own over one shared map, as each
 * process of a job has its own client of torch's TCPStore. */
typedef struct rank_arg {
    map_store_t *shared;
    int rank, size, with_wait;
    double timeout_s;
    loom_status_t st;
    char msg[512];
    double sum, split_sum;
} rank_arg_t;

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    loom_config_t cfg = LOOM_CONFIG_INIT;
    cfg.rank = a->rank;
    cfg.size = a->size;
    cfg.timeout_s = a->timeout_s;
    loom_store_callbacks_t cb = map_callbacks(a->shared, a->with_wait);
    loom_comm_t c = NULL;
    a->st = loom_comm_create_with_store(&cfg, &cb, &c);
    if (a->st != LOOM_SUCCESS) {
        snprintf(a->msg, sizeof(a->msg), "%s", loom_comm_last_error(NULL));
        return NULL;
    }
    double x = a->rank + 1, y = 0;
    a->st = loom_allreduce(&x, &a->sum, 1, LOOM_FLOAT64, LOOM_SUM, c);
    loom_comm_t sub = NULL;
    if (a->st == LOOM_SUCCESS)
        a->st = loom_comm_split(c, a->rank % 2, 0, &sub);
    if (a->st == LOOM_SUCCESS)
        a->st = loom_allreduce(&x, &y, 1, LOOM_FLOAT64, LOOM_SUM, sub);
    a->split_sum = y;
    if (a->st != LOOM_SUCCESS)
        snprintf(a->msg, sizeof(a->msg), "%s", loom_comm_last_error(c));
    loom_comm_destroy(sub);
    loom_comm_destroy(c);
    return NULL;
}

static void run_ranks(map_store_t *m, rank_arg_t *a, int nstart, int size, int with_wait,
                      double timeout_s)
{
    pthread_t th[8];
    for (int r = 0; r < nstart; r++) {
        a[r] = (rank_arg_t){ .shared = m, .rank = r, .size = size, .with_wait = with_wait,
                             .timeout_s = timeout_s };
        ck_assert_int_eq(pthread_create(&th[r], NULL, rank_main, &a[r]), 0);
    }
    for (int r = 0; r < nstart; r++)
        pthread_join(th[r], NULL);
}

START_TEST(test_cb_collectives)
{
    map_store_t m;
    map_init(&m);
    setenv("LOOM_SHM", "0", 1);
    rank_arg_t a[3];
    int with_wait = _i;
    run_ranks(&m, a, 3, 3, with_wait, 20.0);
    for (int r = 0; r < 3; r++) {
        ck_assert_msg(a[r].st == LOOM_SUCCESS, "rank %d: %s", r, a[r].msg);
        ck_assert(a[r].sum == 6.0);
        /* ranks 0 and 2 form one split (1 + 3), rank 1 the other */
        ck_assert(a[r].split_sum == (r % 2 ? 2.0 : 4.0));
    }
    /* One store per rank, shared by its split: released once each. */
    ck_assert_int_eq(atomic_load(&m.releases), 3);
    ck_assert_int_gt(m.n, 0);
    if (with_wait)
        ck_assert_int_gt(atomic_load(&m.waits), 0);
    else
        ck_assert_int_eq(atomic_load(&m.waits), 0);
    map_free(&m);
}
END_TEST

START_TEST(test_cb_missing_rank_times_out)
{
    map_store_t m;
    map_init(&m);
    rank_arg_t a[2];
    time_t t0 = time(NULL);
    run_ranks(&m, a, 1, 2, 1, 1.0);   /* rank 1 never comes */
    ck_assert_int_eq(a[0].st, LOOM_ERR_TIMEOUT);
    ck_assert_msg(strstr(a[0].msg, "rank") != NULL && strstr(a[0].msg, "1") != NULL,
                  "message does not name rank 1: %s", a[0].msg);
    ck_assert_int_lt(time(NULL) - t0, 20);
    ck_assert_int_eq(atomic_load(&m.releases), 1);
    map_free(&m);
}
END_TEST

START_TEST(test_cb_error_message)
{
    map_store_t m;
    map_init(&m);
    atomic_store(&m.fail_set, 1);
    rank_arg_t a[2];
    run_ranks(&m, a, 1, 2, 1, 5.0);
    ck_assert_int_eq(a[0].st, LOOM_ERR_TRANSPORT);
    ck_assert_msg(strstr(a[0].msg, "map store refuses key") != NULL, "%s", a[0].msg);
    ck_assert_int_eq(atomic_load(&m.releases), 1);
    map_free(&m);
}
END_TEST

START_TEST(test_cb_bad_args)
{
    map_store_t m;
    map_init(&m);
    loom_config_t cfg = LOOM_CONFIG_INIT;
    cfg.rank = 0;
    cfg.size = 2;
    loom_store_callbacks_t cb = map_callbacks(&m, 1);
    cb.add = NULL;
    loom_comm_t c = NULL;
    ck_assert_int_eq(loom_comm_create_with_store(&cfg, &cb, &c), LOOM_ERR_INVALID_ARG);
    ck_assert(strstr(loom_comm_last_error(NULL), "required") != NULL);
    ck_assert_ptr_null(c);
    cb = map_callbacks(&m, 1);
    cfg.rank = 2;
    ck_assert_int_eq(loom_comm_create_with_store(&cfg, &cb, &c), LOOM_ERR_INVALID_ARG);
    ck_assert_int_eq(loom_comm_create_with_store(&cfg, NULL, &c), LOOM_ERR_INVALID_ARG);
    /* release runs on every failure that had callbacks to release */
    ck_assert_int_eq(atomic_load(&m.releases), 2);
    /* A single rank needs no peer, but still releases its store once. */
    cfg.rank = 0;
    cfg.size = 1;
    ck_assert_int_eq(loom_comm_create_with_store(&cfg, &cb, &c), LOOM_SUCCESS);
    int x = 5, y = 0;
    ck_assert_int_eq(loom_allreduce(&x, &y, 1, LOOM_INT32, LOOM_SUM, c), LOOM_SUCCESS);
    ck_assert_int_eq(y, 5);
    loom_comm_destroy(c);
    ck_assert_int_eq(atomic_load(&m.releases), 3);
    map_free(&m);
}
END_TEST

/* With LOOM_AUTH_KEY, the records ranks publish through the caller's store
 * (torch.distributed's c10d::Store) are signed like those of any other store:
 * every one carries the MAC, and the group works over shared memory. */
START_TEST(test_cb_records_signed)
{
    map_store_t m;
    map_init(&m);
    setenv("LOOM_SHM", "1", 1);
    setenv("LOOM_AUTH_KEY", "cb-store-key", 1);
    rank_arg_t a[2];
    run_ranks(&m, a, 2, 2, 1, 20.0);
    unsetenv("LOOM_AUTH_KEY");
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(a[r].st == LOOM_SUCCESS, "rank %d: %s", r, a[r].msg);
        ck_assert(a[r].sum == 3.0);
    }
    int records = 0;
    for (int i = 0; i < m.n; i++)
        if (strstr(m.keys[i], "/addr/") != NULL) {
            records++;
            ck_assert_msg(m.lens[i] > SIG_HEAD_BYTES && memcmp(m.vals[i], SIG_HEAD, 8) == 0,
                          "%s is stored unsigned", m.keys[i]);
        }
    ck_assert_int_ge(records, 2);
    map_free(&m);
}
END_TEST

/* A writer of the caller's store rewrites one part of rank 0's record as it
 * is stored: each rewrite fails both ranks with LOOM_ERR_AUTH naming rank 0
 * and LOOM_AUTH_KEY, at once, never a group that quietly uses the record. */
START_TEST(test_cb_rewrite_refused)
{
    map_store_t m;
    map_init(&m);
    m.rewrite = _i;
    setenv("LOOM_SHM", "1", 1);
    setenv("LOOM_AUTH_KEY", "cb-store-key", 1);
    rank_arg_t a[2];
    run_ranks(&m, a, 2, 2, 1, 20.0);
    unsetenv("LOOM_AUTH_KEY");
    ck_assert_int_ge(atomic_load(&m.rewrites), 1);
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(a[r].st == LOOM_ERR_AUTH, "rewrite of the %s: rank %d got %s: %s",
                      rewrite_names[_i], r, loom_strerror(a[r].st), a[r].msg);
        ck_assert_msg(strstr(a[r].msg, "rank 0's record") != NULL &&
                      strstr(a[r].msg, "LOOM_AUTH_KEY") != NULL,
                      "rewrite of the %s: rank %d's message names neither rank 0 nor the "
                      "key: %s", rewrite_names[_i], r, a[r].msg);
    }
    map_free(&m);
}
END_TEST

Suite *loom_store_cb_suite(void)
{
    Suite *s = suite_create("store_callbacks");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_cb_collectives, 0, 2);
    tcase_add_test(tc, test_cb_missing_rank_times_out);
    tcase_add_test(tc, test_cb_error_message);
    tcase_add_test(tc, test_cb_bad_args);
    tcase_add_test(tc, test_cb_records_signed);
    tcase_add_loop_test(tc, test_cb_rewrite_refused, 0, REWRITE_CASES);
    suite_add_tcase(s, tc);
    return s;
}
