/* check_store.c - unit tests of the rendezvous store: one body per test over
 * every backend through the generic API (tcp://, file://, and redis:// on a
 * redis-server of its own where hiredis and redis-server are there), the tcp
 * server against strangers and forged requests, and the protocol parser.
 * What only redis:// has is in check_store_redis.c. Network use is limited
 * to 127.0.0.1 and ::1. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_store_util.h"
#include "check_suites.h"
#include "store/store.h"
#include "store/proto.h"

enum { BK_TCP, BK_FILE, BK_REDIS, BK_COUNT };

typedef struct backend {
    int kind;
    loom_store_server_t *srv;
    redis_server_t redis;
    char dir[64];
    char uri[128];
} backend_t;

/* Whether redis:// can run here; else why not (said once, by the suite). */
static int redis_usable(char *why, size_t whylen)
{
#ifdef HAVE_HIREDIS
    if (have_redis_server())
        return 1;
    snprintf(why, whylen, "redis-server not installed");
#else
    snprintf(why, whylen, "this build has no redis:// store (libhiredis-dev)");
#endif
    return 0;
}

/* 0 when the backend cannot run here: the test passes without it (the
 * suite printed why). */
static int backend_up(backend_t *b, int kind)
{
    loom_err_t err;
    char why[128];
    loom_err_clear(&err);
    memset(b, 0, sizeof(*b));
    b->kind = kind;
    if (kind == BK_REDIS) {
        if (!redis_usable(why, sizeof(why)))
            return 0;
        redis_start(&b->redis, 0, NULL);
        snprintf(b->uri, sizeof(b->uri), "%s", b->redis.uri);
    } else if (kind == BK_TCP) {
        ck_assert_msg(loom_store_server_start("127.0.0.1", 0, &err, &b->srv) == LOOM_SUCCESS,
                      "server start: %s", err.msg);
        snprintf(b->uri, sizeof(b->uri), "tcp://127.0.0.1:%d", loom_store_server_port(b->srv));
    } else {
        strcpy(b->dir, "/tmp/loom_store_test.XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(b->dir));
        /* A subdirectory that does not exist yet: open must create it. */
        snprintf(b->uri, sizeof(b->uri), "file://%s/sub/dir", b->dir);
    }
    return 1;
}

#define BACKEND_UP(b, kind)           \
    do {                              \
        if (!backend_up(&(b), kind))  \
            return;                   \
    } while (0)

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void backend_down(backend_t *b)
{
    if (b->srv != NULL)
        loom_store_server_stop(b->srv);
    redis_stop(&b->redis);
    if (b->dir[0] != '\0')
        nftw(b->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- Threads that act as other ranks. ------------------------------------ */

typedef struct setter {
    const char *uri, *key, *val;
    double delay_s;
} setter_t;

static void *setter_main(void *arg)
{
    setter_t *st = arg;
    loom_err_t err;
    loom_store_t *s = NULL;
    loom_err_clear(&err);
    if (loom_store_open(st->uri, -1, LONG_TIMEOUT, &err, &s) != LOOM_SUCCESS)
        return (void *)1;
    usleep((useconds_t)(st->delay_s * 1e6));
    loom_status_t rc = loom_store_set(s, st->key, st->val, strlen(st->val), &err);
    loom_store_close(s);
    return rc == LOOM_SUCCESS ? NULL : (void *)1;
}

/* ---- Tests run on every backend (_i selects it). --------------------------- */

START_TEST(test_set_get)
{
    backend_t b;
    BACKEND_UP(b, _i);
    loom_store_t *s = open_uri(b.uri);
    put_str(s, "loom/job/addr/0", "10.0.0.1:4242");
    expect_str(s, "loom/job/addr/0", "10.0.0.1:4242");
    put_str(s, "loom/job/addr/0", "overwritten");
    expect_str(s, "loom/job/addr/0", "overwritten");
    put(s, "empty", "", 0);
    expect(s, "empty", "", 0);
    /* Keys that escape alike in a naive scheme stay distinct. */
    put_str(s, "a/b", "slash");
    put_str(s, "a%2Fb", "percent");
    put_str(s, "a_b", "underscore");
    put_str(s, "..", "dotdot");
    expect_str(s, "a/b", "slash");
    expect_str(s, "a%2Fb", "percent");
    expect_str(s, "a_b", "underscore");
    expect_str(s, "..", "dotdot");
    put_str(s, "a b\tc", "spaces");
    expect_str(s, "a b\tc", "spaces");
    if (b.kind != BK_FILE) {
        /* The address our connection to the store leaves from. */
        char host[64];
        ck_assert_int_eq(loom_store_local_host(s, host, sizeof(host)), 0);
        ck_assert_str_eq(host, "127.0.0.1");
        ck_assert_int_eq(loom_store_local_host(s, host, 3), -1);
    }
    loom_store_close(s);
    backend_down(&b);
}
END_TEST

START_TEST(test_get_missing_times_out)
{
    backend_t b;
    BACKEND_UP(b, _i);
    loom_store_t *s = open_uri(b.uri);
    loom_err_t err;
    void *val = (void *)&err;
    size_t len = 12345;
    loom_err_clear(&err);
    double t0 = loom_now_s();
    ck_assert_int_eq(loom_store_get(s, "loom/job/addr/7", &val, &len, 0.2, &err),
                     LOOM_ERR_TIMEOUT);
    double took = loom_now_s() - t0;
    ck_assert_msg(took >= 0.19 && took < 5.0, "took %.3f s", took);
    ck_assert_ptr_eq(val, (void *)&err);  /* outputs untouched on failure */
    ck_assert_uint_eq(len, 12345);
    ck_assert_int_eq(err.status, LOOM_ERR_TIMEOUT);
    ck_assert_msg(strstr(err.msg, "loom/job/addr/7") != NULL, "message: %s", err.msg);
    ck_assert_msg(strstr(err.msg, "timed out after 0.2 s") != NULL, "message: %s", err.msg);
    ck_assert_msg(strstr(err.msg, b.uri) != NULL, "message: %s", err.msg);
    /* The handle still works after a timeout. */
    put_str(s, "after", "ok");
    expect_str(s, "after", "ok");
    loom_store_close(s);
    backend_down(&b);
}
END_TEST

/* try_get looks once: absent is not an error and costs no wait. */
START_TEST(test_try_get)
{
    backend_t b;
    BACKEND_UP(b, _i);
    loom_store_t *s = open_uri(b.uri);
    loom_err_t err;
    loom_err_clear(&err);
    void *val = NULL;
    size_t len = 0;
    int found = 1;
    double t0 = loom_now_s();
    ck_assert_int_eq(loom_store_try_get(s, "loom/job/epoch", &val, &len, &found, &err),
                     LOOM_SUCCESS);
    ck_assert_int_eq(found, 0);
    ck_assert_ptr_null(val);
    put_str(s, "loom/job/epoch", "3");
    ck_assert_int_eq(loom_store_try_get(s, "loom/job/epoch", &val, &len, &found, &err),
                     LOOM_SUCCESS);
    ck_assert_int_eq(found, 1);
    ck_assert_uint_eq(len, 1);
    ck_assert_str_eq((char *)val, "3");   /* NUL-terminated as get's */
    free(val);
    ck_assert_msg(loom_now_s() - t0 < 5.0, "try_get waited");
    ck_assert_int_eq(loom_store_try_get(s, "", &val, &len, &found, &err), LOOM_ERR_INVALID_ARG);
    loom_store_close(s);
    backend_down(&b);
}
END_TEST

START_TEST(test_wait_several)
{
    backend_t b;
    BACKEND_UP(b, _i);
    loom_store_t *s = open_uri(b.uri);
    put_str(s, "loom/job/addr/0", "a");
    put_str(s, "loom/job/addr/1", "b");
    setter_t st = { b.uri, "loom/job/addr/2", "c", 0.1 };
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, setter_main, &st), 0);
    const char *keys[3] = { "loom/job/addr/0", "loom/job/addr/1", "loom/job/addr/2" };
    loom_err_t err;
    loom_err_clear(&err);
    double t0 = loom_now_s();
    ck_assert_msg(loom_store_wait(s, keys, 3, LONG_TIMEOUT, &err) == LOOM_SUCCESS, "%s",
                  err.msg);
    ck_assert(loom_now_s() - t0 >= 0.09);
    void *thr;
    pthread_join(th, &thr);
    ck_assert_ptr_null(thr);
    expect_str(s, "loom/job/addr/2", "c");
    /* No keys at all is a successful wait. */
    ck_assert_int_eq(loom_store_wait(s, NULL, 0, 0.0, &err), LOOM_SUCCESS);
    loom_store_close(s);
    backend_down(&b);
}
END_TEST

START_TEST(test_wait_lists_missing)
{
    backend_t b;
    BACKEND_UP(b, _i);
    loom_store_t *s = open_uri(b.uri);
    put_str(s, "loom/job/addr/1", "x");
    const char *keys[4] = { "loom/job/addr/0", "loom/job/addr/1", "loom/job/addr/2",
                            "loom/job/addr/3" };
    loom_err_t err;
    loom_err_clear(&err);
    double t0 = loom_now_s();
    ck_assert_int_eq(loom_store_wait(s, keys, 4, 0.2, &err), LOOM_ERR_TIMEOUT);
    double took = loom_now_s() - t0;
    ck_assert_msg(took >= 0.19 && took < 5.0, "took %.3f s", took);
    char want[256];
    snprintf(want, sizeof(want),
             "timed out after 0.2 s waiting for store key(s) loom/job/addr/0, "
             "loom/job/addr/2, loom/job/addr/3 at %s", b.uri);
    ck_assert_str_eq(err.msg, want);
    loom_store_close(s);
    backend_down(&b);
}
END_TEST


typedef struct waiter {
    const char *uri;
    loom_status_t rc;
    char msg[LOOM_ERRMSG_MAX];
} waiter_t;

static void *waiter_main(void *arg)
{
    waiter_t *w = arg;
    loom_err_t err;
    loom_store_t *s = NULL;
    const char *keys[1] = { "go" };
    loom_err_clear(&err);
    w->rc = loom_store_open(w->uri, -1, LONG_TIMEOUT, &err, &s);
    if (w->rc == LOOM_SUCCESS) {
        w->rc = loom_store_wait(s, keys, 1, LONG_TIMEOUT, &err);
        loom_store_close(s);
    }
    snprintf(w->msg, sizeof(w->msg), "%s", err.msg);
    return NULL;
}

START_TEST(test_wait_wakes_many)
{
    enum { N = 8 };
    backend_t b;
    BACKEND_UP(b, _i);
    pthread_t th[N];
    waiter_t w[N];
    for (int i = 0; i < N; i++) {
        w[i].uri = b.uri;
        w[i].rc = LOOM_ERR_INTERNAL;
        ck_assert_int_eq(pthread_create(&th[i], NULL, waiter_main, &w[i]), 0);
    }
    usleep(100000);
    loom_store_t *s = open_uri(b.uri);
    double t0 = loom_now_s();
    put_str(s, "go", "1");
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(w[i].rc == LOOM_SUCCESS, "waiter %d: %s", i, w[i].msg);
    }
    ck_assert(loom_now_s() - t0 < LONG_TIMEOUT / 2);
    loom_store_close(s);
    backend_down(&b);
}
END_TEST

START_TEST(test_add)
{
    backend_t b;
    BACKEND_UP(b, _i);
    loom_store_t *s = open_uri(b.uri);
    loom_err_t err;
    int64_t v = 0;
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_add(s, "counter", 2, &v, &err), LOOM_SUCCESS);
    ck_assert_int_eq(v, 2);
    ck_assert_int_eq(loom_store_add(s, "counter", 3, &v, &err), LOOM_SUCCESS);
    ck_assert_int_eq(v, 5);
    expect_str(s, "counter", "5");  /* stored as decimal text */
    ck_assert_int_eq(loom_store_add(s, "counter", -7, NULL, &err), LOOM_SUCCESS);
    expect_str(s, "counter", "-2");
    ck_assert_int_eq(loom_store_add(s, "counter", 0, &v, &err), LOOM_SUCCESS);
    ck_assert_int_eq(v, -2);
    /* A set value that is an integer can be added to. */
    put_str(s, "n", "40");
    ck_assert_int_eq(loom_store_add(s, "n", 2, &v, &err), LOOM_SUCCESS);
    ck_assert_int_eq(v, 42);

    put_str(s, "text", "hello");
    v = 99;
    ck_assert_int_eq(loom_store_add(s, "text", 1, &v, &err), LOOM_ERR_INVALID_ARG);
    ck_assert_int_eq(v, 99);
    ck_assert_msg(strstr(err.msg, "text") != NULL && strstr(err.msg, "decimal integer") != NULL,
                  "%s", err.msg);
    expect_str(s, "text", "hello");

    loom_err_clear(&err);
    put_str(s, "big", "9223372036854775807");
    ck_assert_int_eq(loom_store_add(s, "big", 1, &v, &err), LOOM_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err.msg, "overflow") != NULL, "%s", err.msg);
    expect_str(s, "big", "9223372036854775807");
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_add(s, "big", INT64_MIN, &v, &err), LOOM_SUCCESS);
    ck_assert_int_eq(v, -1);
    loom_store_close(s);
    backend_down(&b);
}
END_TEST

typedef struct adder {
    const char *uri;
    int n;
    int64_t *seen;   /* the value each add returned */
    int failed;
} adder_t;

static void *adder_main(void *arg)
{
    adder_t *a = arg;
    loom_err_t err;
    loom_store_t *s = NULL;
    loom_err_clear(&err);
    if (loom_store_open(a->uri, -1, LONG_TIMEOUT, &err, &s) != LOOM_SUCCESS) {
        a->failed = 1;
        return NULL;
    }
    for (int i = 0; i < a->n; i++)
        if (loom_store_add(s, "sum", 1, &a->seen[i], &err) != LOOM_SUCCESS)
            a->failed = 1;
    loom_store_close(s);
    return NULL;
}

static int cmp_i64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

START_TEST(test_add_concurrent)
{
    enum { T = 8 };
    int n = _i == BK_FILE ? 40 : 200;
    backend_t b;
    BACKEND_UP(b, _i);
    int64_t *seen = calloc((size_t)(T * n), sizeof(*seen));
    ck_assert_ptr_nonnull(seen);
    adder_t a[T];
    pthread_t th[T];
    for (int t = 0; t < T; t++) {
        a[t] = (adder_t){ b.uri, n, seen + t * n, 0 };
        ck_assert_int_eq(pthread_create(&th[t], NULL, adder_main, &a[t]), 0);
    }
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        ck_assert_msg(!a[t].failed, "adder %d failed", t);
    }
    /* Atomic adds hand out every value 1..T*n exactly once. */
    qsort(seen, (size_t)(T * n), sizeof(*seen), cmp_i64);
    for (int i = 0; i < T * n; i++)
        ck_assert_int_eq(seen[i], i + 1);
    loom_store_t *s = open_uri(b.uri);
    char want[32];
    snprintf(want, sizeof(want), "%d", T * n);
    expect_str(s, "sum", want);
    loom_store_close(s);
    free(seen);
    backend_down(&b);
}
END_TEST

static void cas(loom_store_t *s, const char *key, const char *expected, const char *desired,
                const char *want_after)
{
    loom_err_t err;
    void *val = NULL;
    size_t len = 0;
    loom_err_clear(&err);
    ck_assert_msg(loom_store_cas(s, key, expected, strlen(expected), desired, strlen(desired),
                                 &val, &len, &err) == LOOM_SUCCESS, "cas: %s", err.msg);
    ck_assert_uint_eq(len, strlen(want_after));
    ck_assert(memcmp(val, want_after, len) == 0);
    ck_assert_int_eq(((char *)val)[len], '\0');
    free(val);
}

START_TEST(test_cas)
{
    backend_t b;
    BACKEND_UP(b, _i);
    loom_store_t *s = open_uri(b.uri);
    /* Absent and a non-empty expectation: nothing happens, the key stays absent. */
    cas(s, "leader", "someone", "me", "");
    expect_absent(s, "leader");
    /* Absent and the empty expectation: set. */
    cas(s, "leader", "", "rank3", "rank3");
    expect_str(s, "leader", "rank3");
    /* Mismatch: unchanged, and the current value comes back. */
    cas(s, "leader", "", "rank5", "rank3");
    cas(s, "leader", "rank4", "rank5", "rank3");
    cas(s, "leader", "rank", "rank5", "rank3");  /* a prefix is not a match */
    expect_str(s, "leader", "rank3");
    /* Match: swapped. */
    cas(s, "leader", "rank3", "rank5", "rank5");
    expect_str(s, "leader", "rank5");
    /* Swapping to the empty value, then from it. */
    cas(s, "leader", "rank5", "", "");
    expect_str(s, "leader", "");
    cas(s, "leader", "", "back", "back");
    /* Binary values compare on every byte. */
    loom_err_t err;
    void *val;
    size_t len;
    loom_err_clear(&err);
    put(s, "bin", "a\0b", 3);
    ck_assert_int_eq(loom_store_cas(s, "bin", "a\0c", 3, "x", 1, &val, &len, &err),
                     LOOM_SUCCESS);
    ck_assert_uint_eq(len, 3);
    ck_assert(memcmp(val, "a\0b", 3) == 0);
    free(val);
    ck_assert_int_eq(loom_store_cas(s, "bin", "a\0b", 3, "x\0y", 3, &val, &len, &err),
                     LOOM_SUCCESS);
    ck_assert_uint_eq(len, 3);
    free(val);
    expect(s, "bin", "x\0y", 3);
    loom_store_close(s);
    backend_down(&b);
}
END_TEST

START_TEST(test_delete)
{
    backend_t b;
    BACKEND_UP(b, _i);
    loom_store_t *s = open_uri(b.uri);
    loom_err_t err;
    int existed = -1;
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_delete(s, "never", &existed, &err), LOOM_SUCCESS);
    ck_assert_int_eq(existed, 0);
    put_str(s, "k", "v");
    ck_assert_int_eq(loom_store_delete(s, "k", &existed, &err), LOOM_SUCCESS);
    ck_assert_int_eq(existed, 1);
    expect_absent(s, "k");
    ck_assert_int_eq(loom_store_delete(s, "k", &existed, &err), LOOM_SUCCESS);
    ck_assert_int_eq(existed, 0);
    ck_assert_int_eq(loom_store_delete(s, "k", NULL, &err), LOOM_SUCCESS);
    void *val;
    size_t len;
    ck_assert_int_eq(loom_store_get(s, "k", &val, &len, 0.05, &err), LOOM_ERR_TIMEOUT);
    put_str(s, "k", "again");
    expect_str(s, "k", "again");
    /* A deleted counter starts again from 0. */
    int64_t v;
    ck_assert_int_eq(loom_store_add(s, "c", 5, &v, &err), LOOM_SUCCESS);
    ck_assert_int_eq(loom_store_delete(s, "c", NULL, &err), LOOM_SUCCESS);
    ck_assert_int_eq(loom_store_add(s, "c", 1, &v, &err), LOOM_SUCCESS);
    ck_assert_int_eq(v, 1);
    loom_store_close(s);
    backend_down(&b);
}
END_TEST

START_TEST(test_binary_and_big_values)
{
    backend_t b;
    BACKEND_UP(b, _i);
    loom_store_t *s = open_uri(b.uri);
    unsigned char bin[256];
    for (int i = 0; i < 256; i++)
        bin[i] = (unsigned char)(255 - i);  /* includes NUL bytes, CR, LF and 0xff */
    put(s, "bin", bin, sizeof(bin));
    expect(s, "bin", bin, sizeof(bin));
    put(s, "nuls", "\0\0\0", 3);
    expect(s, "nuls", "\0\0\0", 3);
    put(s, "crlf", "$3\r\n+OK\r\n", 9);  /* looks like a protocol, is only bytes */
    expect(s, "crlf", "$3\r\n+OK\r\n", 9);

    size_t big = 1u << 20;
    unsigned char *v = malloc(big);
    ck_assert_ptr_nonnull(v);
    for (size_t i = 0; i < big; i++)
        v[i] = (unsigned char)(i * 131 + (i >> 9));
    put(s, "big", v, big);
    expect(s, "big", v, big);
    /* The connection is still in step after a big transfer. */
    put_str(s, "small", "x");
    expect_str(s, "small", "x");

    loom_err_t err;
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_set(s, "huge", v, (size_t)LOOM_STORE_VALUE_MAX + 1, &err),
                     LOOM_ERR_INVALID_ARG);
    ck_assert_int_eq(loom_store_set(s, "null", NULL, 1, &err), LOOM_ERR_INVALID_ARG);
    free(v);
    loom_store_close(s);
    backend_down(&b);
}
END_TEST

START_TEST(test_keys)
{
    backend_t b;
    BACKEND_UP(b, _i);
    loom_store_t *s = open_uri(b.uri);
    loom_err_t err;
    char key[LOOM_STORE_KEY_MAX + 2];

    /* The longest key, full of bytes that need escaping, and one that differs
     * only in its last byte. */
    for (size_t i = 0; i < LOOM_STORE_KEY_MAX; i++)
        key[i] = "/%.a\x01\xff"[i % 6];
    key[LOOM_STORE_KEY_MAX] = '\0';
    put_str(s, key, "long1");
    key[LOOM_STORE_KEY_MAX - 1] = 'z';
    put_str(s, key, "long2");
    expect_str(s, key, "long2");
    key[LOOM_STORE_KEY_MAX - 1] = "/%.a\x01\xff"[(LOOM_STORE_KEY_MAX - 1) % 6];
    expect_str(s, key, "long1");
    int64_t v;
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_add(s, key + 1, 3, &v, &err), LOOM_SUCCESS);
    ck_assert_int_eq(v, 3);

    loom_err_clear(&err);
    key[LOOM_STORE_KEY_MAX] = 'x';
    key[LOOM_STORE_KEY_MAX + 1] = '\0';
    ck_assert_int_eq(loom_store_set(s, key, "v", 1, &err), LOOM_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err.msg, "1024") != NULL, "%s", err.msg);
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_set(s, "", "v", 1, &err), LOOM_ERR_INVALID_ARG);
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_set(s, NULL, "v", 1, &err), LOOM_ERR_INVALID_ARG);

    /* Thousands of keys (the server's table grows several times). */
    int n = _i == BK_TCP ? 5000 : 1000;
    char k[32], val[32];
    for (int i = 0; i < n; i++) {
        snprintf(k, sizeof(k), "many/%d", i);
        snprintf(val, sizeof(val), "v%d", i * 7);
        put_str(s, k, val);
    }
    for (int i = 0; i < n; i += 7) {
        snprintf(k, sizeof(k), "many/%d", i);
        snprintf(val, sizeof(val), "v%d", i * 7);
        expect_str(s, k, val);
    }
    loom_store_close(s);
    backend_down(&b);
}
END_TEST

/* ---- Fork-based test of the file backend across processes. --------------- */

START_TEST(test_file_multiprocess_add)
{
    enum { P = 4, N = 50 };
    backend_t b;
    backend_up(&b, BK_FILE);
    pid_t pid[P];
    for (int p = 0; p < P; p++) {
        pid[p] = fork();
        ck_assert_int_ge(pid[p], 0);
        if (pid[p] == 0) {
            loom_err_t err;
            loom_store_t *s = NULL;
            int ok = 1;
            loom_err_clear(&err);
            if (loom_store_open(b.uri, p, LONG_TIMEOUT, &err, &s) != LOOM_SUCCESS)
                _exit(2);
            for (int i = 0; i < N; i++)
                ok &= loom_store_add(s, "procs/sum", 1, NULL, &err) == LOOM_SUCCESS;
            loom_store_close(s);
            _exit(ok ? 0 : 1);
        }
    }
    for (int p = 0; p < P; p++) {
        int status;
        ck_assert_int_eq(waitpid(pid[p], &status, 0), pid[p]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: status %d", p,
                      status);
    }
    loom_store_t *s = open_uri(b.uri);
    char want[16];
    snprintf(want, sizeof(want), "%d", P * N);
    expect_str(s, "procs/sum", want);
    loom_store_close(s);
    backend_down(&b);
}
END_TEST

/* ---- URIs. ------------------------------------------------------------------ */

START_TEST(test_bad_uris)
{
    static const char *bad[] = {
        "", "tcp", "127.0.0.1:29500", "://x:1", "redis2://host:1", "udp://127.0.0.1:1",
        "tcp://", "tcp://host", "tcp://host:", "tcp://:29500", "tcp://host:70000",
        "tcp://host:12x", "tcp://host:-1", "tcp://host: 1", "tcp://::1:29500",
        "tcp://[::1:29500", "tcp://[::1]29500", "tcp://[]:1", "tcp://host:1/path",
        "tcp://a b:1", "tcp://127.0.0.1:0", "file://relative/dir", "file://", "file:",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        loom_err_t err;
        loom_store_t *s = (loom_store_t *)&err;
        loom_err_clear(&err);
        loom_status_t rc = loom_store_open(bad[i], 1, 1.0, &err, &s);
        ck_assert_msg(rc == LOOM_ERR_INVALID_ARG, "'%s' gave %d (%s)", bad[i], rc, err.msg);
        ck_assert_msg(err.msg[0] != '\0', "'%s': no message", bad[i]);
        ck_assert_ptr_eq(s, (loom_store_t *)&err);
    }
    loom_err_t err;
    loom_err_clear(&err);
    loom_store_t *s;
    ck_assert_int_eq(loom_store_open(NULL, 0, 1.0, &err, &s), LOOM_ERR_INVALID_ARG);
    /* redis:// URIs: check_store_redis.c. */

    /* The parser itself. */
    char host[64];
    int port = -1;
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_parse_hostport("[fe80::1%eth0]:65535", NULL, host,
                                               sizeof(host), &port, &err), LOOM_SUCCESS);
    ck_assert_str_eq(host, "fe80::1%eth0");
    ck_assert_int_eq(port, 65535);
    ck_assert_int_eq(loom_store_parse_hostport("node-01.cluster:0", NULL, host, sizeof(host),
                                               &port, &err), LOOM_SUCCESS);
    ck_assert_str_eq(host, "node-01.cluster");
    ck_assert_int_eq(port, 0);
    ck_assert_int_eq(loom_store_parse_hostport("averyveryverylonghostname:1", NULL, host, 8,
                                               &port, &err), LOOM_ERR_INVALID_ARG);
    char buf[64];
    loom_store_format_hostport("::1", 80, buf, sizeof(buf));
    ck_assert_str_eq(buf, "[::1]:80");
    loom_store_format_hostport("10.1.2.3", 80, buf, sizeof(buf));
    ck_assert_str_eq(buf, "10.1.2.3:80");

    int64_t v;
    ck_assert_int_eq(loom_store_parse_int64("-9223372036854775808", 20, &v), 0);
    ck_assert(v == INT64_MIN);
    ck_assert_int_eq(loom_store_parse_int64("9223372036854775807", 19, &v), 0);
    ck_assert(v == INT64_MAX);
    ck_assert_int_eq(loom_store_parse_int64("9223372036854775808", 19, &v), -1);
    ck_assert_int_eq(loom_store_parse_int64("-9223372036854775809", 20, &v), -1);
    ck_assert_int_eq(loom_store_parse_int64("", 0, &v), -1);
    ck_assert_int_eq(loom_store_parse_int64("-", 1, &v), -1);
    ck_assert_int_eq(loom_store_parse_int64("+1", 2, &v), -1);
    ck_assert_int_eq(loom_store_parse_int64(" 1", 2, &v), -1);
    ck_assert_int_eq(loom_store_parse_int64("1\0", 2, &v), -1);
    ck_assert_int_eq(loom_store_parse_int64("007", 3, &v), 0);
    ck_assert_int_eq(v, 7);
}
END_TEST

/* ---- tcp: connecting, rank 0, strangers, forged requests. ----------------- */

START_TEST(test_connect_nobody_listening)
{
    int port;
    int fd = reserve_port(&port);
    char uri[64];
    snprintf(uri, sizeof(uri), "tcp://127.0.0.1:%d", port);
    loom_err_t err;
    loom_store_t *s = NULL;
    loom_err_clear(&err);
    double t0 = loom_now_s();
    ck_assert_int_eq(loom_store_open(uri, 1, 0.5, &err, &s), LOOM_ERR_TIMEOUT);
    double took = loom_now_s() - t0;
    ck_assert_msg(took >= 0.45 && took < 5.0, "took %.3f s", took);
    ck_assert_ptr_null(s);
    char want[160];
    snprintf(want, sizeof(want), "timed out after 0.5 s connecting to the store at %s", uri);
    ck_assert_msg(strstr(err.msg, want) != NULL, "%s", err.msg);
    ck_assert_msg(strstr(err.msg, "refused") != NULL, "%s", err.msg);
    close(fd);
}
END_TEST

START_TEST(test_connect_before_server)
{
    /* Ranks start before rank 0: the client retries until the server is up. */
    int port;
    int fd = reserve_port(&port);
    char uri[64];
    snprintf(uri, sizeof(uri), "tcp://127.0.0.1:%d", port);
    waiter_t w = { uri, LOOM_ERR_INTERNAL, "" };
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, waiter_main, &w), 0);
    usleep(300000);
    close(fd);
    loom_err_t err;
    loom_store_t *s0 = NULL;
    loom_err_clear(&err);
    /* Rank 0 binds the port and serves in-process. */
    ck_assert_msg(loom_store_open(uri, 0, LONG_TIMEOUT, &err, &s0) == LOOM_SUCCESS, "%s",
                  err.msg);
    put_str(s0, "go", "now");
    pthread_join(th, NULL);
    ck_assert_msg(w.rc == LOOM_SUCCESS, "%s", w.msg);
    loom_store_close(s0);
}
END_TEST

START_TEST(test_rank0_serves)
{
    loom_err_t err;
    loom_store_t *s = NULL;
    loom_err_clear(&err);
    ck_assert_msg(loom_store_open("tcp://127.0.0.1:0", 0, LONG_TIMEOUT, &err, &s) ==
                  LOOM_SUCCESS, "%s", err.msg);
    put_str(s, "k", "v");
    expect_str(s, "k", "v");
    char host[64];
    ck_assert_int_eq(loom_store_local_host(s, host, sizeof(host)), 0);
    ck_assert_str_eq(host, "127.0.0.1");
    ck_assert_int_eq(loom_store_local_host(s, host, 3), -1);
    loom_store_close(s);

    /* The port is already served (by loomrun or loom-store): rank 0 is a client. */
    backend_t b;
    backend_up(&b, BK_TCP);
    loom_err_clear(&err);
    ck_assert_msg(loom_store_open(b.uri, 0, LONG_TIMEOUT, &err, &s) == LOOM_SUCCESS, "%s",
                  err.msg);
    put_str(s, "from-rank0", "hi");
    loom_store_close(s);
    /* The data lives in the external server, which outlives rank 0's handle. */
    s = open_uri(b.uri);
    expect_str(s, "from-rank0", "hi");
    loom_store_close(s);
    backend_down(&b);

    /* file:// has no local host. */
    backend_up(&b, BK_FILE);
    s = open_uri(b.uri);
    ck_assert_int_eq(loom_store_local_host(s, host, sizeof(host)), -1);
    loom_store_close(s);
    backend_down(&b);
}
END_TEST

START_TEST(test_ipv6)
{
    loom_err_t err;
    loom_store_server_t *srv;
    loom_err_clear(&err);
    if (loom_store_server_start("::1", 0, &err, &srv) != LOOM_SUCCESS)
        return;  /* no IPv6 loopback here */
    char uri[64];
    snprintf(uri, sizeof(uri), "tcp://[::1]:%d", loom_store_server_port(srv));
    loom_store_t *s = open_uri(uri);
    put_str(s, "k6", "v6");
    expect_str(s, "k6", "v6");
    char host[64];
    ck_assert_int_eq(loom_store_local_host(s, host, sizeof(host)), 0);
    ck_assert_str_eq(host, "::1");
    loom_store_close(s);
    loom_store_server_stop(srv);

    /* All interfaces: one dual-stack socket answers on both loopbacks. */
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_server_start(NULL, 0, &err, &srv), LOOM_SUCCESS);
    int port = loom_store_server_port(srv);
    snprintf(uri, sizeof(uri), "tcp://127.0.0.1:%d", port);
    s = open_uri(uri);
    put_str(s, "k4", "v4");
    loom_store_close(s);
    snprintf(uri, sizeof(uri), "tcp://[::1]:%d", port);
    s = open_uri(uri);
    expect_str(s, "k4", "v4");
    loom_store_close(s);
    loom_store_server_stop(srv);
}
END_TEST

/* A listening socket on 127.0.0.1 that is not a Loom store. */
typedef enum { STRANGER_JUNK, STRANGER_CLOSE, STRANGER_SILENT, STRANGER_BAD_RESPONSE,
               STRANGER_OLD_VERSION } stranger_kind_t;

typedef struct stranger {
    int lfd, port;
    stranger_kind_t kind;
    pthread_t th;
} stranger_t;

static int read_full(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = recv(fd, (char *)buf + got, len - got, 0);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

static void *stranger_main(void *arg)
{
    stranger_t *st = arg;
    int fd = accept(st->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    uint8_t buf[LOOM_STORE_KEY_MAX + LOOM_STORE_REQ_LEN];
    switch (st->kind) {
    case STRANGER_JUNK: {
        static const char junk[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
        send(fd, junk, sizeof(junk) - 1, MSG_NOSIGNAL);
        break;
    }
    case STRANGER_CLOSE:
        /* What a server does with a request it cannot parse. */
        recv(fd, buf, 1, 0);
        close(fd);
        return NULL;
    case STRANGER_SILENT:
        break;
    case STRANGER_OLD_VERSION:
        if (read_full(fd, buf, LOOM_STORE_HELLO_LEN) == 0) {
            loom_store_hello_pack(buf, 7, LOOM_STORE_HELLO_REFUSED);
            send(fd, buf, LOOM_STORE_HELLO_LEN, MSG_NOSIGNAL);
        }
        break;
    case STRANGER_BAD_RESPONSE:
        /* A proper hello, then an answer to GET that claims a 4 GiB value. */
        if (read_full(fd, buf, LOOM_STORE_HELLO_LEN) != 0)
            break;
        loom_store_hello_pack(buf, LOOM_STORE_PROTO_VERSION, LOOM_STORE_HELLO_OK);
        send(fd, buf, LOOM_STORE_HELLO_LEN, MSG_NOSIGNAL);
        for (;;) {
            loom_store_req_t req;
            if (read_full(fd, buf, LOOM_STORE_REQ_LEN) != 0 ||
                loom_store_req_unpack(buf, &req) != 0)
                break;
            /* The client sends only GET and WAIT: a key and no payload. */
            if (read_full(fd, buf, req.klen) != 0)
                break;
            loom_store_resp_t resp = { LOOM_STORE_RC_OK, 0, 0 };
            if (req.op == LOOM_STORE_OP_GET)
                resp.vlen = 0xffffffffu;
            loom_store_resp_pack(buf, &resp);
            send(fd, buf, LOOM_STORE_RESP_LEN, MSG_NOSIGNAL);
        }
        break;
    }
    /* Hold the connection until the client gives up. */
    while (recv(fd, buf, sizeof(buf), 0) > 0)
        ;
    close(fd);
    return NULL;
}

static void stranger_up(stranger_t *st, stranger_kind_t kind)
{
    st->kind = kind;
    st->lfd = reserve_port(&st->port);
    ck_assert_int_eq(listen(st->lfd, 4), 0);
    ck_assert_int_eq(pthread_create(&st->th, NULL, stranger_main, st), 0);
}

static void stranger_down(stranger_t *st)
{
    pthread_join(st->th, NULL);
    close(st->lfd);
}

static loom_status_t open_stranger(stranger_t *st, double timeout_s, loom_err_t *err)
{
    char uri[64];
    loom_store_t *s = NULL;
    snprintf(uri, sizeof(uri), "tcp://127.0.0.1:%d", st->port);
    loom_err_clear(err);
    loom_status_t rc = loom_store_open(uri, 1, timeout_s, err, &s);
    ck_assert_ptr_null(s);
    return rc;
}

START_TEST(test_stranger_server)
{
    stranger_t st;
    loom_err_t err;
    char want[96];

    stranger_up(&st, STRANGER_JUNK);
    ck_assert_int_eq(open_stranger(&st, LONG_TIMEOUT, &err), LOOM_ERR_MISMATCH);
    snprintf(want, sizeof(want),
             "the server at 127.0.0.1:%d does not speak the Loom store protocol", st.port);
    ck_assert_msg(strstr(err.msg, want) != NULL, "%s", err.msg);
    ck_assert_msg(strstr(err.msg, "HTTP/1.1") != NULL, "%s", err.msg);
    stranger_down(&st);

    stranger_up(&st, STRANGER_CLOSE);
    ck_assert_int_eq(open_stranger(&st, LONG_TIMEOUT, &err), LOOM_ERR_MISMATCH);
    snprintf(want, sizeof(want),
             "the server at 127.0.0.1:%d does not speak the Loom store protocol", st.port);
    ck_assert_msg(strstr(err.msg, want) != NULL, "%s", err.msg);
    stranger_down(&st);

    stranger_up(&st, STRANGER_SILENT);
    ck_assert_int_eq(open_stranger(&st, 0.3, &err), LOOM_ERR_TIMEOUT);
    ck_assert_msg(strstr(err.msg, "did not answer the Loom store hello") != NULL, "%s",
                  err.msg);
    stranger_down(&st);

    stranger_up(&st, STRANGER_OLD_VERSION);
    ck_assert_int_eq(open_stranger(&st, LONG_TIMEOUT, &err), LOOM_ERR_MISMATCH);
    ck_assert_msg(strstr(err.msg, "version 7") != NULL, "%s", err.msg);
    stranger_down(&st);
}
END_TEST

START_TEST(test_bad_response)
{
    stranger_t st;
    stranger_up(&st, STRANGER_BAD_RESPONSE);
    char uri[64];
    snprintf(uri, sizeof(uri), "tcp://127.0.0.1:%d", st.port);
    loom_store_t *s = open_uri(uri);
    loom_err_t err;
    void *val = NULL;
    size_t len;
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_get(s, "k", &val, &len, 1.0, &err), LOOM_ERR_MISMATCH);
    ck_assert_msg(strstr(err.msg, "malformed response") != NULL, "%s", err.msg);
    ck_assert_ptr_null(val);
    loom_store_close(s);
    stranger_down(&st);
}
END_TEST

START_TEST(test_proto_parser)
{
    uint8_t h[LOOM_STORE_REQ_LEN];
    loom_store_req_t r, out;

    r = (loom_store_req_t){ LOOM_STORE_OP_SET, LOOM_STORE_KEY_MAX, LOOM_STORE_VALUE_MAX, 0, 0 };
    loom_store_req_pack(h, &r);
    ck_assert_int_eq(loom_store_req_unpack(h, &out), 0);
    ck_assert_uint_eq(out.klen, LOOM_STORE_KEY_MAX);
    ck_assert_uint_eq(out.alen, LOOM_STORE_VALUE_MAX);

    static const loom_store_req_t bad[] = {
        { LOOM_STORE_OP_SET, LOOM_STORE_KEY_MAX + 1, 1, 0, 0 },      /* key too long */
        { LOOM_STORE_OP_SET, 0, 1, 0, 0 },                           /* empty key */
        { LOOM_STORE_OP_SET, 0xffffffffu, 1, 0, 0 },
        { LOOM_STORE_OP_SET, 4, LOOM_STORE_VALUE_MAX + 1, 0, 0 },    /* value too big */
        { LOOM_STORE_OP_SET, 4, 0xffffffffu, 0, 0 },
        { LOOM_STORE_OP_SET, 4, 1, 1, 0 },                           /* SET has no b */
        { LOOM_STORE_OP_CAS, 4, 1, LOOM_STORE_VALUE_MAX + 1, 0 },
        { LOOM_STORE_OP_CAS, 4, 0xffffffffu, 0xffffffffu, 0 },
        { LOOM_STORE_OP_GET, 4, 1, 0, 0 },                           /* GET has no payload */
        { LOOM_STORE_OP_WAIT, 4, 0, 1, 0 },
        { LOOM_STORE_OP_ADD, 4, 8, 0, 0 },
        { LOOM_STORE_OP_DELETE, 4, 1, 0, 0 },
        { 0, 4, 0, 0, 0 },                                           /* unknown ops */
        { 99, 4, 0, 0, 0 },
        { 0xffffffffu, 4, 0, 0, 0 },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        loom_store_req_pack(h, &bad[i]);
        out.op = 12345;
        ck_assert_msg(loom_store_req_unpack(h, &out) == -1, "bad request %zu accepted", i);
        ck_assert_uint_eq(out.op, 12345);
    }

    uint8_t rh[LOOM_STORE_RESP_LEN];
    loom_store_resp_t rs, rout;
    rs = (loom_store_resp_t){ LOOM_STORE_RC_OK, LOOM_STORE_VALUE_MAX, 0 };
    loom_store_resp_pack(rh, &rs);
    ck_assert_int_eq(loom_store_resp_unpack(rh, LOOM_STORE_OP_GET, &rout), 0);
    ck_assert_int_eq(loom_store_resp_unpack(rh, LOOM_STORE_OP_CAS, &rout), 0);
    static const struct { uint32_t op; loom_store_resp_t r; } rbad[] = {
        { LOOM_STORE_OP_GET, { LOOM_STORE_RC_OK, LOOM_STORE_VALUE_MAX + 1, 0 } },
        { LOOM_STORE_OP_GET, { LOOM_STORE_RC_OK, 0xffffffffu, 0 } },
        { LOOM_STORE_OP_GET, { LOOM_STORE_RC_NOT_FOUND, 1, 0 } },   /* value with NOT_FOUND */
        { LOOM_STORE_OP_SET, { LOOM_STORE_RC_OK, 1, 0 } },          /* SET returns no value */
        { LOOM_STORE_OP_WAIT, { LOOM_STORE_RC_NOT_INTEGER, 0, 0 } },
        { LOOM_STORE_OP_SET, { LOOM_STORE_RC_TIMEOUT, 0, 0 } },
        { LOOM_STORE_OP_GET, { 77, 0, 0 } },
        { 42, { LOOM_STORE_RC_OK, 0, 0 } },
    };
    for (size_t i = 0; i < sizeof(rbad) / sizeof(rbad[0]); i++) {
        loom_store_resp_pack(rh, &rbad[i].r);
        ck_assert_msg(loom_store_resp_unpack(rh, rbad[i].op, &rout) == -1,
                      "bad response %zu accepted", i);
    }
}
END_TEST

/* A raw connection to the server, with a receive timeout so a test cannot hang. */
static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct timeval tv = { 5, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

static void raw_hello(int fd)
{
    uint8_t h[LOOM_STORE_HELLO_LEN];
    loom_store_hello_pack(h, LOOM_STORE_PROTO_VERSION, 0);
    ck_assert_int_eq(send(fd, h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
    ck_assert_int_eq(read_full(fd, h, sizeof(h)), 0);
    ck_assert(memcmp(h, LOOM_STORE_MAGIC, LOOM_STORE_MAGIC_LEN) == 0);
}

static void raw_send_req(int fd, uint32_t op, uint32_t klen, uint32_t alen, uint32_t blen,
                         uint64_t arg, const void *payload, size_t plen)
{
    uint8_t h[LOOM_STORE_REQ_LEN];
    loom_store_req_t r = { op, klen, alen, blen, arg };
    loom_store_req_pack(h, &r);
    send(fd, h, sizeof(h), MSG_NOSIGNAL);
    if (plen > 0)
        send(fd, payload, plen, MSG_NOSIGNAL);
}

/* The server must close the connection: EOF or reset, never a timeout. */
static void expect_dropped(int fd)
{
    uint8_t buf[64];
    ssize_t r;
    while ((r = recv(fd, buf, sizeof(buf), 0)) > 0)
        ;
    ck_assert_msg(r == 0 || errno == ECONNRESET, "not dropped: %s", strerror(errno));
    close(fd);
}

START_TEST(test_malformed_requests)
{
    backend_t b;
    backend_up(&b, BK_TCP);
    int port = loom_store_server_port(b.srv);
    loom_store_t *s = open_uri(b.uri);
    put_str(s, "keep", "me");

    /* No hello: an HTTP request. */
    int fd = raw_connect(port);
    static const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    send(fd, http, sizeof(http) - 1, MSG_NOSIGNAL);
    expect_dropped(fd);

    /* Lengths out of range, unknown op, payload where none belongs. */
    uint32_t hdrs[][4] = {
        { LOOM_STORE_OP_SET, LOOM_STORE_KEY_MAX + 1, 1, 0 },
        { LOOM_STORE_OP_SET, 0xffffffffu, 0xffffffffu, 0 },
        { LOOM_STORE_OP_SET, 3, LOOM_STORE_VALUE_MAX + 1, 0 },
        { LOOM_STORE_OP_CAS, 3, 0xffffffffu, 0xffffffffu },
        { LOOM_STORE_OP_GET, 3, 5, 0 },
        { 0, 3, 0, 0 },
        { 1000, 3, 0, 0 },
    };
    for (size_t i = 0; i < sizeof(hdrs) / sizeof(hdrs[0]); i++) {
        fd = raw_connect(port);
        raw_hello(fd);
        raw_send_req(fd, hdrs[i][0], hdrs[i][1], hdrs[i][2], hdrs[i][3], 0, "abcdefgh", 8);
        expect_dropped(fd);
    }

    /* A key with a NUL inside. */
    fd = raw_connect(port);
    raw_hello(fd);
    raw_send_req(fd, LOOM_STORE_OP_SET, 3, 1, 0, 0, "a\0bv", 4);
    expect_dropped(fd);

    /* Another protocol version: refused, with the server's version, then closed. */
    fd = raw_connect(port);
    uint8_t h[LOOM_STORE_HELLO_LEN];
    loom_store_hello_pack(h, 999, 0);
    send(fd, h, sizeof(h), MSG_NOSIGNAL);
    ck_assert_int_eq(read_full(fd, h, sizeof(h)), 0);
    ck_assert(memcmp(h, LOOM_STORE_MAGIC, LOOM_STORE_MAGIC_LEN) == 0);
    ck_assert_uint_eq(ntohl(*(uint32_t *)(h + 12)), LOOM_STORE_HELLO_REFUSED);
    expect_dropped(fd);

    /* Gone halfway through a request, and gone while parked in a WAIT whose key
     * is set afterwards: the server must not touch the departed client. */
    fd = raw_connect(port);
    raw_hello(fd);
    raw_send_req(fd, LOOM_STORE_OP_SET, 100, 1000, 0, 0, "partial", 7);
    close(fd);
    fd = raw_connect(port);
    raw_hello(fd);
    raw_send_req(fd, LOOM_STORE_OP_WAIT, 6, 0, 0, 60000, "parked", 6);
    usleep(50000);
    close(fd);
    usleep(50000);
    put_str(s, "parked", "x");

    /* Two requests in one send are answered in order. */
    fd = raw_connect(port);
    raw_hello(fd);
    uint8_t two[2 * LOOM_STORE_REQ_LEN + 8];
    loom_store_req_t r1 = { LOOM_STORE_OP_GET, 4, 0, 0, 0 };
    loom_store_req_pack(two, &r1);
    memcpy(two + LOOM_STORE_REQ_LEN, "keep", 4);
    loom_store_req_pack(two + LOOM_STORE_REQ_LEN + 4, &r1);
    memcpy(two + 2 * LOOM_STORE_REQ_LEN + 4, "nope", 4);
    ck_assert_int_eq(send(fd, two, sizeof(two), MSG_NOSIGNAL), (ssize_t)sizeof(two));
    uint8_t resp[LOOM_STORE_RESP_LEN + 2];
    loom_store_resp_t rr;
    ck_assert_int_eq(read_full(fd, resp, LOOM_STORE_RESP_LEN + 2), 0);
    ck_assert_int_eq(loom_store_resp_unpack(resp, LOOM_STORE_OP_GET, &rr), 0);
    ck_assert_uint_eq(rr.rc, LOOM_STORE_RC_OK);
    ck_assert_uint_eq(rr.vlen, 2);
    ck_assert(memcmp(resp + LOOM_STORE_RESP_LEN, "me", 2) == 0);
    ck_assert_int_eq(read_full(fd, resp, LOOM_STORE_RESP_LEN), 0);
    ck_assert_int_eq(loom_store_resp_unpack(resp, LOOM_STORE_OP_GET, &rr), 0);
    ck_assert_uint_eq(rr.rc, LOOM_STORE_RC_NOT_FOUND);
    close(fd);

    /* The server still serves a proper client, data intact. */
    expect_str(s, "keep", "me");
    expect_str(s, "parked", "x");
    loom_store_t *s2 = open_uri(b.uri);
    put_str(s2, "new", "client");
    expect_str(s, "new", "client");
    loom_store_close(s2);
    loom_store_close(s);
    backend_down(&b);
}
END_TEST

typedef struct long_waiter {
    loom_store_t *s;
    loom_status_t rc;
    char msg[LOOM_ERRMSG_MAX];
} long_waiter_t;

static void *long_waiter_main(void *arg)
{
    long_waiter_t *w = arg;
    loom_err_t err;
    const char *keys[1] = { "never" };
    loom_err_clear(&err);
    w->rc = loom_store_wait(w->s, keys, 1, LONG_TIMEOUT, &err);
    snprintf(w->msg, sizeof(w->msg), "%s", err.msg);
    return NULL;
}

START_TEST(test_server_gone)
{
    backend_t b;
    backend_up(&b, BK_TCP);
    loom_store_t *s = open_uri(b.uri);
    loom_store_t *s2 = open_uri(b.uri);
    put_str(s, "k", "v");
    long_waiter_t w = { s2, LOOM_ERR_INTERNAL, "" };
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, long_waiter_main, &w), 0);
    usleep(100000);
    double t0 = loom_now_s();
    loom_store_server_stop(b.srv);
    b.srv = NULL;
    /* A parked waiter learns at once, not after its timeout. */
    pthread_join(th, NULL);
    ck_assert(loom_now_s() - t0 < LONG_TIMEOUT / 2);
    ck_assert_msg(w.rc == LOOM_ERR_PEER_LOST, "%d: %s", w.rc, w.msg);
    ck_assert_msg(strstr(w.msg, "closed the connection") != NULL, "%s", w.msg);

    loom_err_t err;
    loom_err_clear(&err);
    loom_status_t rc = loom_store_set(s, "k", "v", 1, &err);
    ck_assert_msg(rc == LOOM_ERR_PEER_LOST, "%d: %s", rc, err.msg);
    /* And later calls fail fast too: the one reconnect attempt is refused. */
    loom_err_clear(&err);
    t0 = loom_now_s();
    rc = loom_store_set(s, "k", "v", 1, &err);
    ck_assert_msg(rc == LOOM_ERR_PEER_LOST, "%d: %s", rc, err.msg);
    ck_assert_msg(strstr(err.msg, "could not reconnect") != NULL, "%s", err.msg);
    ck_assert(loom_now_s() - t0 < LONG_TIMEOUT / 2);
    loom_store_close(s);
    loom_store_close(s2);
    backend_down(&b);
}
END_TEST

/* LOOM_AUTH_KEY on the tcp:// server: nothing is served before the proof. */
START_TEST(test_auth_server)
{
    static const char key[] = "correct horse";
    loom_err_t err;
    loom_err_clear(&err);
    loom_store_server_t *srv;
    ck_assert_int_eq(loom_store_server_start_auth("127.0.0.1", 0, key, strlen(key), &err, &srv),
                     LOOM_SUCCESS);
    int port = loom_store_server_port(srv);
    char uri[64];
    snprintf(uri, sizeof(uri), "tcp://127.0.0.1:%d", port);

    /* The right key: served. */
    loom_store_t *s = NULL;
    ck_assert_msg(loom_store_open_key(uri, -1, LONG_TIMEOUT, key, strlen(key), &err, &s) ==
                  LOOM_SUCCESS, "%s", err.msg);
    put_str(s, "secret", "value");
    expect_str(s, "secret", "value");

    /* No key, or another one: LOOM_ERR_AUTH naming the key. */
    loom_store_t *s2 = NULL;
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_open(uri, -1, LONG_TIMEOUT, &err, &s2), LOOM_ERR_AUTH);
    ck_assert_msg(strstr(err.msg, "LOOM_AUTH_KEY") != NULL, "%s", err.msg);
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_open_key(uri, -1, LONG_TIMEOUT, "battery", 7, &err, &s2),
                     LOOM_ERR_AUTH);
    ck_assert_msg(strstr(err.msg, "LOOM_AUTH_KEY") != NULL, "%s", err.msg);

    /* A client that says hello without a key is told so and dropped, and a
     * request it sends anyway is never answered. */
    int fd = raw_connect(port);
    uint8_t h[LOOM_STORE_HELLO_LEN];
    loom_store_hello_pack(h, LOOM_STORE_PROTO_VERSION, 0);
    ck_assert_int_eq(send(fd, h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
    raw_send_req(fd, LOOM_STORE_OP_GET, 6, 0, 0, 0, "secret", 6);
    ck_assert_int_eq(read_full(fd, h, sizeof(h)), 0);
    ck_assert_int_eq(h[15], LOOM_STORE_HELLO_AUTH_REQUIRED);
    expect_dropped(fd);

    /* One that claims a key and sends a wrong proof: refused and dropped. */
    fd = raw_connect(port);
    uint8_t msg[LOOM_STORE_HELLO_LEN + LOOM_STORE_NONCE_LEN] = {0};
    loom_store_hello_pack(msg, LOOM_STORE_PROTO_VERSION, LOOM_STORE_HELLO_AUTH);
    send(fd, msg, sizeof(msg), MSG_NOSIGNAL);
    uint8_t chal[LOOM_STORE_HELLO_LEN + LOOM_STORE_NONCE_LEN + LOOM_STORE_PROOF_LEN];
    ck_assert_int_eq(read_full(fd, chal, sizeof(chal)), 0);
    ck_assert_int_eq(chal[15], LOOM_STORE_HELLO_CHALLENGE);
    uint8_t proof[LOOM_STORE_PROOF_LEN] = {0};
    send(fd, proof, sizeof(proof), MSG_NOSIGNAL);
    raw_send_req(fd, LOOM_STORE_OP_GET, 6, 0, 0, 0, "secret", 6);
    ck_assert_int_eq(read_full(fd, h, sizeof(h)), 0);
    ck_assert_int_eq(h[15], LOOM_STORE_HELLO_REFUSED_AUTH);
    expect_dropped(fd);

    /* The server stays available to the rank that holds the key. */
    expect_str(s, "secret", "value");
    loom_store_close(s);
    loom_store_server_stop(srv);
}
END_TEST

/* Signed values: a reader with the key accepts only values written with it,
 * under the key name they were written for; on every backend. */
START_TEST(test_signed_values)
{
    static const char key[] = "correct horse";
    backend_t b;
    BACKEND_UP(b, _i);
    loom_err_t err;
    loom_err_clear(&err);
    loom_store_t *s, *plain = open_uri(b.uri);
    ck_assert_msg(loom_store_open_key(b.uri, -1, LONG_TIMEOUT, key, strlen(key), &err, &s) ==
                  LOOM_SUCCESS, "%s", err.msg);
    ck_assert_int_eq(loom_store_set_signed(s, "addr/0", "10.0.0.1:5", 10, &err), LOOM_SUCCESS);
    void *val;
    size_t len;
    ck_assert_int_eq(loom_store_get_signed(s, "addr/0", &val, &len, 1.0, &err), LOOM_SUCCESS);
    ck_assert_uint_eq(len, 10);
    ck_assert_str_eq(val, "10.0.0.1:5");
    free(val);

    /* A keyless reader is told the value is signed. */
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_get_signed(plain, "addr/0", &val, &len, 1.0, &err),
                     LOOM_ERR_AUTH);
    ck_assert_msg(strstr(err.msg, "LOOM_AUTH_KEY") != NULL, "%s", err.msg);

    /* A forged value (written by anyone who can write the store), a signed
     * value with a byte changed, and a signed value moved to another key. */
    put_str(plain, "addr/1", "10.6.6.6:1");
    ck_assert_int_eq(loom_store_get(plain, "addr/0", &val, &len, 1.0, &err), LOOM_SUCCESS);
    ((char *)val)[len - 1] ^= 1;
    put(plain, "addr/2", val, len);
    ((char *)val)[len - 1] ^= 1;
    put(plain, "addr/3", val, len);
    free(val);
    for (int k = 1; k <= 3; k++) {
        char name[16];
        snprintf(name, sizeof(name), "addr/%d", k);
        loom_err_clear(&err);
        ck_assert_int_eq(loom_store_get_signed(s, name, &val, &len, 1.0, &err), LOOM_ERR_AUTH);
        ck_assert_msg(strstr(err.msg, "LOOM_AUTH_KEY") && strstr(err.msg, name), "%s", err.msg);
    }
    loom_store_close(plain);
    loom_store_close(s);
    backend_down(&b);
}
END_TEST

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static loom_store_server_t *limited_server(uint64_t max_bytes, long max_clients,
                                           long per_host, double hello_s, double idle_s)
{
    loom_store_limits_t lim = { max_bytes, max_clients, per_host, hello_s, idle_s };
    loom_store_server_t *srv;
    loom_err_t err;
    loom_err_clear(&err);
    ck_assert_msg(loom_store_server_start_limits("127.0.0.1", 0, &lim, NULL, &err, &srv) ==
                  LOOM_SUCCESS, "server start: %s", err.msg);
    return srv;
}

/* The byte quota refuses a SET with a clear error and keeps the connection;
 * freeing room lets the next one in. */
START_TEST(test_server_quota)
{
    loom_store_server_t *srv = limited_server(1u << 20, 64, 64, 5, 60);
    char uri[64];
    snprintf(uri, sizeof(uri), "tcp://127.0.0.1:%d", loom_store_server_port(srv));
    loom_store_t *s = open_uri(uri);
    size_t big = 600u << 10;
    char *v = calloc(1, big);
    loom_err_t err;
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_set(s, "a", v, big, &err), LOOM_SUCCESS);
    ck_assert_int_eq(loom_store_set(s, "b", v, big, &err), LOOM_ERR_NO_MEMORY);
    ck_assert_msg(strstr(err.msg, "LOOM_STORE_MAX_BYTES") != NULL, "%s", err.msg);
    put_str(s, "small", "ok");
    expect_str(s, "small", "ok");
    int existed;
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_delete(s, "a", &existed, &err), LOOM_SUCCESS);
    ck_assert_int_eq(loom_store_set(s, "b", v, big, &err), LOOM_SUCCESS);
    free(v);
    loom_store_close(s);
    loom_store_server_stop(srv);
}
END_TEST

/* A connection that never finishes its hello, or idles after it, is closed by
 * its deadline; a library client that idled reconnects on its own. */
START_TEST(test_server_deadlines)
{
    loom_store_server_t *srv = limited_server(1u << 20, 64, 64, 0.5, 1.0);
    int port = loom_store_server_port(srv);
    char uri[64];
    snprintf(uri, sizeof(uri), "tcp://127.0.0.1:%d", port);
    loom_store_t *s = open_uri(uri);
    put_str(s, "k", "v");

    double t0 = now_s();
    int fd = raw_connect(port);
    send(fd, "LOOM", 4, MSG_NOSIGNAL);   /* a slowloris: part of the hello, then nothing */
    expect_dropped(fd);
    double took = now_s() - t0;
    ck_assert_msg(took < 3.0, "half a hello stayed %.2f s", took);

    t0 = now_s();
    fd = raw_connect(port);
    raw_hello(fd);
    expect_dropped(fd);
    took = now_s() - t0;
    ck_assert_msg(took >= 0.9 && took < 4.0, "an idle client was dropped after %.2f s", took);
    /* s idled longer than that connection: the server closed it too. */
    expect_str(s, "k", "v");
    loom_store_close(s);
    loom_store_server_stop(srv);
}
END_TEST

/* Caps: one source address gets at most per_host connections; past the total,
 * a connection without its hello makes room for a newcomer. */
START_TEST(test_server_caps)
{
    loom_store_server_t *srv = limited_server(1u << 20, 64, 4, 30, 60);
    int port = loom_store_server_port(srv);
    int fds[4];
    for (int i = 0; i < 4; i++)
        fds[i] = raw_connect(port);
    int extra = raw_connect(port);
    expect_dropped(extra);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
    loom_store_server_stop(srv);

    srv = limited_server(1u << 20, 4, 64, 30, 60);
    port = loom_store_server_port(srv);
    for (int i = 0; i < 4; i++)
        fds[i] = raw_connect(port);
    char uri[64];
    snprintf(uri, sizeof(uri), "tcp://127.0.0.1:%d", port);
    loom_store_t *s = open_uri(uri);
    put_str(s, "k", "v");
    expect_str(s, "k", "v");
    loom_store_close(s);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
    loom_store_server_stop(srv);
}
END_TEST

Suite *loom_store_suite(void)
{
    Suite *su = suite_create("store");
    char why[128];
    if (!redis_usable(why, sizeof(why)))
        printf("SKIP: the store tests over redis:// (%s)\n", why);

    TCase *tc = tcase_create("backends");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_set_get, 0, BK_COUNT);
    tcase_add_loop_test(tc, test_get_missing_times_out, 0, BK_COUNT);
    tcase_add_loop_test(tc, test_try_get, 0, BK_COUNT);
    tcase_add_loop_test(tc, test_wait_several, 0, BK_COUNT);
    tcase_add_loop_test(tc, test_wait_lists_missing, 0, BK_COUNT);
    tcase_add_loop_test(tc, test_wait_wakes_many, 0, BK_COUNT);
    tcase_add_loop_test(tc, test_add, 0, BK_COUNT);
    tcase_add_loop_test(tc, test_add_concurrent, 0, BK_COUNT);
    tcase_add_loop_test(tc, test_cas, 0, BK_COUNT);
    tcase_add_loop_test(tc, test_delete, 0, BK_COUNT);
    tcase_add_loop_test(tc, test_binary_and_big_values, 0, BK_COUNT);
    tcase_add_loop_test(tc, test_keys, 0, BK_COUNT);
    tcase_add_test(tc, test_file_multiprocess_add);
    tcase_add_test(tc, test_bad_uris);
    tcase_add_loop_test(tc, test_signed_values, 0, BK_COUNT);
    suite_add_tcase(su, tc);

    tc = tcase_create("tcp");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_connect_nobody_listening);
    tcase_add_test(tc, test_connect_before_server);
    tcase_add_test(tc, test_rank0_serves);
    tcase_add_test(tc, test_ipv6);
    tcase_add_test(tc, test_stranger_server);
    tcase_add_test(tc, test_bad_response);
    tcase_add_test(tc, test_proto_parser);
    tcase_add_test(tc, test_malformed_requests);
    tcase_add_test(tc, test_server_gone);
    tcase_add_test(tc, test_auth_server);
    tcase_add_test(tc, test_server_quota);
    tcase_add_test(tc, test_server_deadlines);
    tcase_add_test(tc, test_server_caps);
    suite_add_tcase(su, tc);
    return su;
}
