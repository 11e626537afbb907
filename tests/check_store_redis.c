/* check_store_redis.c - unit tests of the redis:// store against a real
 * redis-server, started for each test on a free 127.0.0.1 port by a checked
 * fixture and killed in its teardown (or by the kernel, should the test
 * process die first). Where redis-server is not installed, the tests that need
 * it are replaced by one that says so; in a build without hiredis, the suite
 * checks that redis:// URIs fail with LOOM_ERR_UNSUPPORTED. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_store_util.h"
#include "check_suites.h"
#include "store.h"

#ifdef HAVE_HIREDIS

/* Generous: the suite also runs under valgrind. */

/* ---- A redis-server of our own. ------------------------------------------ */

typedef struct redis_server {
    pid_t pid;
    int port;
    char uri[96];   /* redis://127.0.0.1:port, no prefix */
} redis_server_t;

/* The fixture's server, and a second one a test may start (with other
 * options, or late); the teardown stops both. */
static redis_server_t srv, srv2;

/* A socket bound to 127.0.0.1:port and not listening: connections to that
 * port are refused, and nobody else can take the port meanwhile. */
static int reserve_port(int *port_p)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t sl = sizeof(a);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &sl), 0);
    *port_p = ntohs(a.sin_port);
    return fd;
}

/* Send one inline command to 127.0.0.1:port and read the first line of the
 * answer ("+PONG", ":1", ...) without its CRLF. 0 on success. */
static int raw_command(int port, const char *cmd, char *line, size_t linelen)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = { 2, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int rc = -1;
    char req[256];
    int n = snprintf(req, sizeof(req), "%s\r\n", cmd);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        send(fd, req, (size_t)n, MSG_NOSIGNAL) != n)
        goto out;
    size_t got = 0;
    while (got + 1 < linelen) {
        ssize_t r = recv(fd, line + got, 1, 0);
        if (r <= 0)
            goto out;
        if (line[got] == '\n') {
            if (got > 0 && line[got - 1] == '\r')
                got--;
            line[got] = '\0';
            rc = 0;
            goto out;
        }
        got++;
    }
out:
    close(fd);
    return rc;
}

static pid_t spawn_redis(int port, const char *const *extra)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid > 0)
        return pid;
    /* Die with the test process: in Check's fork mode a failed assertion ends
     * it with _exit, and the teardown never runs. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    int nul = open("/dev/null", O_RDWR);
    if (nul >= 0) {
        dup2(nul, 0);
        dup2(nul, 1);
        dup2(nul, 2);
    }
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    const char *argv[24] = { "redis-server", "--port", ps, "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no" };
    int argc = 9;
    for (int i = 0; extra != NULL && extra[i] != NULL && argc < 23; i++)
        argv[argc++] = extra[i];
    argv[argc] = NULL;
    execvp(argv[0], (char *const *)argv);
    _exit(127);
}

static void redis_stop(redis_server_t *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGKILL);
        while (waitpid(s->pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    s->pid = 0;
}

/* Start redis-server on port (0: a free one) with extra options (NULL-ended)
 * and wait until it answers. */
static void redis_start(redis_server_t *s, int port, const char *const *extra)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        int p = port;
        if (p == 0)
            close(reserve_port(&p));
        s->port = p;
        s->pid = spawn_redis(p, extra);
        snprintf(s->uri, sizeof(s->uri), "redis://127.0.0.1:%d", p);
        double deadline = loom_now_s() + 15.0;
        while (loom_now_s() < deadline) {
            char line[128];
            /* A server with a password answers -NOAUTH: up all the same. */
            if (raw_command(p, "PING", line, sizeof(line)) == 0 &&
                (strcmp(line, "+PONG") == 0 || strncmp(line, "-NOAUTH", 7) == 0))
                return;
            int status;
            if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
                s->pid = 0;   /* exited: most likely someone took the port meanwhile */
                break;
            }
            usleep(10000);
        }
        redis_stop(s);
        if (port != 0)
            break;
    }
    ck_abort_msg("redis-server did not come up on 127.0.0.1:%d", s->port);
}

static void setup(void)
{
    memset(&srv2, 0, sizeof(srv2));
    redis_start(&srv, 0, NULL);
}

static void teardown(void)
{
    redis_stop(&srv);
    redis_stop(&srv2);
    unsetenv("LOOM_REDIS_PASSWORD");
    unsetenv("LOOM_REDIS_USER");
}

/* ---- The store's semantics on a real server. ----------------------------- */

START_TEST(test_set_get)
{
    loom_store_t *s = open_uri(srv.uri);
    put_str(s, "loom/job/addr/0", "10.0.0.1:4242");
    expect_str(s, "loom/job/addr/0", "10.0.0.1:4242");
    put_str(s, "loom/job/addr/0", "overwritten");
    expect_str(s, "loom/job/addr/0", "overwritten");
    put(s, "empty", "", 0);
    expect(s, "empty", "", 0);
    put_str(s, "a b\tc", "spaces");
    expect_str(s, "a b\tc", "spaces");
    char host[64];
    ck_assert_int_eq(loom_store_local_host(s, host, sizeof(host)), 0);
    ck_assert_str_eq(host, "127.0.0.1");
    ck_assert_int_eq(loom_store_local_host(s, host, 3), -1);
    loom_store_close(s);
}
END_TEST

START_TEST(test_get_times_out_naming_key)
{
    loom_store_t *s = open_uri(srv.uri);
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
    ck_assert_msg(strstr(err.msg, "loom/job/addr/7") != NULL, "message: %s", err.msg);
    ck_assert_msg(strstr(err.msg, "timed out after 0.2 s") != NULL, "message: %s", err.msg);
    ck_assert_msg(strstr(err.msg, srv.uri) != NULL, "message: %s", err.msg);

    /* Several keys: the message lists the missing ones only. */
    put_str(s, "k1", "x");
    const char *keys[3] = { "k0", "k1", "k2" };
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_wait(s, keys, 3, 0.1, &err), LOOM_ERR_TIMEOUT);
    ck_assert_msg(strstr(err.msg, "k0, k2 at") != NULL, "message: %s", err.msg);
    /* The handle still works after a timeout. */
    put_str(s, "after", "ok");
    expect_str(s, "after", "ok");
    loom_store_close(s);
}
END_TEST

typedef struct setter {
    const char *uri;
    const char *const *keys;
    int nkeys;
    double delay_s;
    int failed;
} setter_t;

/* Another rank: its own handle, sets its keys one by one after a delay. */
static void *setter_main(void *arg)
{
    setter_t *st = arg;
    loom_err_t err;
    loom_store_t *s = NULL;
    loom_err_clear(&err);
    if (loom_store_open(st->uri, -1, LONG_TIMEOUT, &err, &s) != LOOM_SUCCESS) {
        st->failed = 1;
        return NULL;
    }
    for (int i = 0; i < st->nkeys; i++) {
        usleep((useconds_t)(st->delay_s * 1e6));
        if (loom_store_set(s, st->keys[i], "v", 1, &err) != LOOM_SUCCESS)
            st->failed = 1;
    }
    loom_store_close(s);
    return NULL;
}

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

START_TEST(test_wait_for_keys_set_later)
{
    loom_store_t *s = open_uri(srv.uri);
    static const char *const keys[3] = { "addr/0", "addr/1", "addr/2" };
    setter_t st = { srv.uri, keys, 3, 0.1, 0 };
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, setter_main, &st), 0);
    loom_err_t err;
    loom_err_clear(&err);
    double t0 = loom_now_s();
    ck_assert_msg(loom_store_wait(s, (const char *const *)keys, 3, LONG_TIMEOUT, &err) ==
                  LOOM_SUCCESS, "%s", err.msg);
    double took = loom_now_s() - t0;
    ck_assert_msg(took >= 0.29 && took < LONG_TIMEOUT / 2, "took %.3f s", took);
    pthread_join(th, NULL);
    ck_assert(!st.failed);
    expect_str(s, "addr/2", "v");

    /* Many waiters on one key, each with its own handle, all woken. */
    enum { N = 8 };
    pthread_t wt[N];
    waiter_t w[N];
    for (int i = 0; i < N; i++) {
        w[i].uri = srv.uri;
        w[i].rc = LOOM_ERR_INTERNAL;
        ck_assert_int_eq(pthread_create(&wt[i], NULL, waiter_main, &w[i]), 0);
    }
    usleep(100000);
    t0 = loom_now_s();
    put_str(s, "go", "1");
    for (int i = 0; i < N; i++) {
        pthread_join(wt[i], NULL);
        ck_assert_msg(w[i].rc == LOOM_SUCCESS, "waiter %d: %s", i, w[i].msg);
    }
    ck_assert(loom_now_s() - t0 < LONG_TIMEOUT / 2);
    loom_store_close(s);
}
END_TEST

START_TEST(test_add)
{
    loom_store_t *s = open_uri(srv.uri);
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
    enum { T = 8, N = 200 };
    int64_t *seen = calloc(T * N, sizeof(*seen));
    ck_assert_ptr_nonnull(seen);
    adder_t a[T];
    pthread_t th[T];
    for (int t = 0; t < T; t++) {
        a[t] = (adder_t){ srv.uri, N, seen + t * N, 0 };
        ck_assert_int_eq(pthread_create(&th[t], NULL, adder_main, &a[t]), 0);
    }
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        ck_assert_msg(!a[t].failed, "adder %d failed", t);
    }
    /* Atomic adds hand out every value 1..T*N exactly once. */
    qsort(seen, T * N, sizeof(*seen), cmp_i64);
    for (int i = 0; i < T * N; i++)
        ck_assert_int_eq(seen[i], i + 1);
    loom_store_t *s = open_uri(srv.uri);
    char want[32];
    snprintf(want, sizeof(want), "%d", T * N);
    expect_str(s, "sum", want);
    loom_store_close(s);
    free(seen);
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
    loom_store_t *s = open_uri(srv.uri);
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
}
END_TEST

START_TEST(test_delete)
{
    loom_store_t *s = open_uri(srv.uri);
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
}
END_TEST

START_TEST(test_binary_and_big_values)
{
    loom_store_t *s = open_uri(srv.uri);
    unsigned char bin[256];
    for (int i = 0; i < 256; i++)
        bin[i] = (unsigned char)(255 - i);  /* includes NUL bytes, CR, LF and 0xff */
    put(s, "bin", bin, sizeof(bin));
    expect(s, "bin", bin, sizeof(bin));
    put(s, "nuls", "\0\0\0", 3);
    expect(s, "nuls", "\0\0\0", 3);
    put(s, "crlf", "$3\r\n+OK\r\n", 9);  /* looks like protocol, is only bytes */
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
    free(v);
    loom_store_close(s);
}
END_TEST

/* A value longer than the store's limit, written by someone else, is refused
 * without being read into memory. */
START_TEST(test_oversized_value_refused)
{
    loom_store_t *s = open_uri(srv.uri);
    char line[256], cmd[128];
    snprintf(cmd, sizeof(cmd), "SETRANGE loom/huge %u x", LOOM_STORE_VALUE_MAX);
    ck_assert_int_eq(raw_command(srv.port, cmd, line, sizeof(line)), 0);
    loom_err_t err;
    loom_err_clear(&err);
    void *v = NULL;
    size_t len;
    ck_assert_int_eq(loom_store_get(s, "huge", &v, &len, 5, &err), LOOM_ERR_TRANSPORT);
    ck_assert_msg(strstr(err.msg, "value limit") != NULL, "%s", err.msg);
    put_str(s, "after", "fine");
    expect_str(s, "after", "fine");
    loom_store_close(s);
}
END_TEST

START_TEST(test_prefixes_keep_jobs_apart)
{
    char ua[160], ub[160], uroot[160], uloom[160];
    snprintf(ua, sizeof(ua), "%s/jobA", srv.uri);
    snprintf(ub, sizeof(ub), "%s/jobB", srv.uri);
    snprintf(uroot, sizeof(uroot), "%s/", srv.uri);
    snprintf(uloom, sizeof(uloom), "%s/loom", srv.uri);
    loom_store_t *a = open_uri(ua), *b = open_uri(ub), *d = open_uri(srv.uri);
    put_str(a, "rank/0", "in A");
    put_str(b, "rank/0", "in B");
    expect_str(a, "rank/0", "in A");
    expect_str(b, "rank/0", "in B");
    expect_absent(d, "rank/0");
    int64_t v;
    loom_err_t err;
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_add(a, "count", 5, &v, &err), LOOM_SUCCESS);
    ck_assert_int_eq(loom_store_add(b, "count", 1, &v, &err), LOOM_SUCCESS);
    ck_assert_int_eq(v, 1);
    ck_assert_int_eq(loom_store_delete(a, "rank/0", NULL, &err), LOOM_SUCCESS);
    expect_str(b, "rank/0", "in B");

    /* The names on the server: "<prefix>/<key>", "loom/" by default. */
    char line[64];
    ck_assert_int_eq(raw_command(srv.port, "EXISTS jobB/rank/0", line, sizeof(line)), 0);
    ck_assert_str_eq(line, ":1");
    ck_assert_int_eq(raw_command(srv.port, "EXISTS jobA/count", line, sizeof(line)), 0);
    ck_assert_str_eq(line, ":1");
    put_str(d, "plain", "default prefix");
    ck_assert_int_eq(raw_command(srv.port, "EXISTS loom/plain", line, sizeof(line)), 0);
    ck_assert_str_eq(line, ":1");
    loom_store_t *root = open_uri(uroot), *lo = open_uri(uloom);
    expect_str(root, "plain", "default prefix");
    expect_str(lo, "plain", "default prefix");
    loom_store_close(root);
    loom_store_close(lo);
    loom_store_close(a);
    loom_store_close(b);
    loom_store_close(d);
}
END_TEST

START_TEST(test_server_comes_up_late)
{
    /* Ranks may start before the server: open retries until it answers. */
    int port;
    int fd = reserve_port(&port);
    char uri[96];
    snprintf(uri, sizeof(uri), "redis://127.0.0.1:%d/late", port);
    waiter_t w = { uri, LOOM_ERR_INTERNAL, "" };
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, waiter_main, &w), 0);
    usleep(300000);
    close(fd);
    redis_start(&srv2, port, NULL);
    loom_store_t *s = open_uri(uri);
    put_str(s, "go", "now");
    pthread_join(th, NULL);
    ck_assert_msg(w.rc == LOOM_SUCCESS, "%s", w.msg);
    loom_store_close(s);
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

START_TEST(test_server_killed_while_waiting)
{
    loom_store_t *s = open_uri(srv.uri);
    loom_store_t *s2 = open_uri(srv.uri);
    put_str(s, "k", "v");
    long_waiter_t w = { s2, LOOM_ERR_INTERNAL, "" };
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, long_waiter_main, &w), 0);
    usleep(200000);
    double t0 = loom_now_s();
    redis_stop(&srv);
    /* The waiter learns at its next poll, not after its timeout. */
    pthread_join(th, NULL);
    ck_assert_msg(loom_now_s() - t0 < LONG_TIMEOUT / 2, "took %.1f s",
                  loom_now_s() - t0);
    ck_assert_msg(w.rc == LOOM_ERR_PEER_LOST, "%d: %s", w.rc, w.msg);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", srv.port);
    ck_assert_msg(strstr(w.msg, addr) != NULL, "%s", w.msg);
    ck_assert_msg(strstr(w.msg, "never") != NULL, "%s", w.msg);

    /* A command on the other handle (SIGPIPE must not kill us), then the one
     * reconnect attempt, refused at once. */
    loom_err_t err;
    loom_err_clear(&err);
    loom_status_t rc = loom_store_set(s, "k", "v", 1, &err);
    ck_assert_msg(rc == LOOM_ERR_PEER_LOST, "%d: %s", rc, err.msg);
    loom_err_clear(&err);
    t0 = loom_now_s();
    rc = loom_store_set(s, "k", "v", 1, &err);
    ck_assert_msg(rc == LOOM_ERR_PEER_LOST, "%d: %s", rc, err.msg);
    ck_assert_msg(strstr(err.msg, "could not reconnect") != NULL, "%s", err.msg);
    ck_assert_msg(strstr(err.msg, addr) != NULL, "%s", err.msg);
    ck_assert(loom_now_s() - t0 < LONG_TIMEOUT / 2);
    ck_assert_int_eq(loom_store_local_host(s, addr, sizeof(addr)), -1);
    loom_store_close(s);
    loom_store_close(s2);
}
END_TEST

START_TEST(test_password)
{
    static const char *const opts[] = { "--requirepass", "s3cret-pw", NULL };
    redis_start(&srv2, 0, opts);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", srv2.port);
    loom_err_t err;
    loom_store_t *s = NULL;

    /* No password: refused at once, not retried until the timeout. */
    unsetenv("LOOM_REDIS_PASSWORD");
    loom_err_clear(&err);
    double t0 = loom_now_s();
    ck_assert_int_eq(loom_store_open(srv2.uri, -1, LONG_TIMEOUT, &err, &s), LOOM_ERR_AUTH);
    ck_assert(loom_now_s() - t0 < LONG_TIMEOUT / 2);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(err.msg, addr) != NULL && strstr(err.msg, "LOOM_REDIS_PASSWORD") != NULL,
                  "%s", err.msg);

    setenv("LOOM_REDIS_PASSWORD", "not-the-pw-42", 1);
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_open(srv2.uri, -1, LONG_TIMEOUT, &err, &s), LOOM_ERR_AUTH);
    ck_assert_msg(strstr(err.msg, addr) != NULL && strstr(err.msg, "refused") != NULL,
                  "%s", err.msg);
    ck_assert_msg(strstr(err.msg, "not-the-pw-42") == NULL, "the password leaked: %s", err.msg);

    setenv("LOOM_REDIS_PASSWORD", "s3cret-pw", 1);
    s = open_uri(srv2.uri);
    put_str(s, "k", "authenticated");
    expect_str(s, "k", "authenticated");
    loom_store_close(s);
    unsetenv("LOOM_REDIS_PASSWORD");
}
END_TEST

/* ---- Failures that need no redis-server. --------------------------------- */

START_TEST(test_nobody_listening)
{
    int port;
    int fd = reserve_port(&port);
    char uri[64], addr[64];
    snprintf(uri, sizeof(uri), "redis://127.0.0.1:%d/job", port);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    loom_err_t err;
    loom_store_t *s = NULL;
    loom_err_clear(&err);
    double t0 = loom_now_s();
    ck_assert_int_eq(loom_store_open(uri, 1, 0.5, &err, &s), LOOM_ERR_TIMEOUT);
    double took = loom_now_s() - t0;
    ck_assert_msg(took >= 0.45 && took < 5.0, "took %.3f s", took);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(err.msg, addr) != NULL, "%s", err.msg);
    ck_assert_msg(strstr(err.msg, "timed out after 0.5 s") != NULL, "%s", err.msg);
    ck_assert_msg(strstr(err.msg, "refused") != NULL, "%s", err.msg);
    close(fd);
}
END_TEST

START_TEST(test_not_a_redis_server)
{
    /* A Loom tcp:// store server: it hangs up on a PING. */
    loom_err_t err;
    loom_store_server_t *tcp;
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_server_start("127.0.0.1", 0, &err, &tcp), LOOM_SUCCESS);
    char uri[64], addr[64];
    snprintf(uri, sizeof(uri), "redis://127.0.0.1:%d", loom_store_server_port(tcp));
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", loom_store_server_port(tcp));
    loom_store_t *s = NULL;
    loom_err_clear(&err);
    double t0 = loom_now_s();
    ck_assert_int_eq(loom_store_open(uri, -1, LONG_TIMEOUT, &err, &s), LOOM_ERR_MISMATCH);
    ck_assert(loom_now_s() - t0 < LONG_TIMEOUT / 2);
    ck_assert_msg(strstr(err.msg, addr) != NULL &&
                  strstr(err.msg, "does not speak the redis protocol") != NULL, "%s", err.msg);
    loom_store_server_stop(tcp);

    /* A server that accepts and says nothing: timed out, and said so. */
    int port;
    int fd = reserve_port(&port);
    ck_assert_int_eq(listen(fd, 4), 0);
    snprintf(uri, sizeof(uri), "redis://127.0.0.1:%d", port);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    loom_err_clear(&err);
    t0 = loom_now_s();
    ck_assert_int_eq(loom_store_open(uri, -1, 0.5, &err, &s), LOOM_ERR_TIMEOUT);
    double took = loom_now_s() - t0;
    ck_assert_msg(took >= 0.4 && took < 5.0, "took %.3f s", took);
    ck_assert_msg(strstr(err.msg, addr) != NULL && strstr(err.msg, "PING") != NULL, "%s",
                  err.msg);
    close(fd);
}
END_TEST

START_TEST(test_bad_uris)
{
    static const char *bad[] = {
        "redis://", "redis://:6379", "redis://host:70000", "redis://host:0",
        "redis://host:12x/job", "redis://::1:6379", "redis://[::1/job", "redis://a b:1",
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
    /* A password in the URI is refused, and not repeated in the message. */
    loom_err_t err;
    loom_store_t *s = NULL;
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_open("redis://:hunter2@127.0.0.1:6379/job", 1, 1.0, &err, &s),
                     LOOM_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err.msg, "hunter2") == NULL, "%s", err.msg);
    ck_assert_msg(strstr(err.msg, "LOOM_REDIS_PASSWORD") != NULL, "%s", err.msg);
    char longp[400];
    memset(longp, 'p', sizeof(longp));
    memcpy(longp, "redis://h:1/", 12);
    longp[sizeof(longp) - 1] = '\0';
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_open(longp, 1, 1.0, &err, &s), LOOM_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err.msg, "prefix") != NULL, "%s", err.msg);
}
END_TEST

START_TEST(test_skipped_redis_server_not_installed)
{
    /* Passes only because redis-server is missing: the suite said so. */
    printf("redis-server not installed: skipping redis store tests\n");
}
END_TEST

static int have_redis_server(void)
{
    const char *path = getenv("PATH");
    if (path == NULL)
        return 0;
    char *dirs = strdup(path), *save = NULL;
    if (dirs == NULL)
        return 0;
    int found = 0;
    for (char *d = strtok_r(dirs, ":", &save); d != NULL && !found;
         d = strtok_r(NULL, ":", &save)) {
        char p[4096];
        snprintf(p, sizeof(p), "%s/redis-server", d);
        found = access(p, X_OK) == 0;
    }
    free(dirs);
    return found;
}

Suite *loom_store_redis_suite(void)
{
    Suite *su = suite_create("store_redis");

    TCase *tc = tcase_create("redis_failures");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_nobody_listening);
    tcase_add_test(tc, test_not_a_redis_server);
    tcase_add_test(tc, test_bad_uris);
    suite_add_tcase(su, tc);

    tc = tcase_create("redis_server");
    tcase_set_timeout(tc, 120);
    if (!have_redis_server()) {
        printf("redis-server not installed: skipping redis store tests\n");
        tcase_add_test(tc, test_skipped_redis_server_not_installed);
        suite_add_tcase(su, tc);
        return su;
    }
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_set_get);
    tcase_add_test(tc, test_get_times_out_naming_key);
    tcase_add_test(tc, test_wait_for_keys_set_later);
    tcase_add_test(tc, test_add);
    tcase_add_test(tc, test_add_concurrent);
    tcase_add_test(tc, test_cas);
    tcase_add_test(tc, test_delete);
    tcase_add_test(tc, test_binary_and_big_values);
    tcase_add_test(tc, test_oversized_value_refused);
    tcase_add_test(tc, test_prefixes_keep_jobs_apart);
    tcase_add_test(tc, test_server_comes_up_late);
    tcase_add_test(tc, test_server_killed_while_waiting);
    tcase_add_test(tc, test_password);
    suite_add_tcase(su, tc);
    return su;
}

#else /* !HAVE_HIREDIS */

START_TEST(test_unsupported_without_hiredis)
{
    loom_err_t err;
    loom_store_t *s = (loom_store_t *)&err;
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_open("redis://127.0.0.1:6379/job", 0, 1.0, &err, &s),
                     LOOM_ERR_UNSUPPORTED);
    ck_assert_ptr_eq(s, (loom_store_t *)&err);
    ck_assert_msg(strstr(err.msg, "no redis:// store") != NULL &&
                  strstr(err.msg, "libhiredis-dev") != NULL, "%s", err.msg);
    /* A scheme that merely starts like it is still unknown. */
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_open("rediss://127.0.0.1:6379", 0, 1.0, &err, &s),
                     LOOM_ERR_INVALID_ARG);
}
END_TEST

Suite *loom_store_redis_suite(void)
{
    Suite *su = suite_create("store_redis");
    TCase *tc = tcase_create("built_without_hiredis");
    tcase_add_test(tc, test_unsupported_without_hiredis);
    suite_add_tcase(su, tc);
    return su;
}

#endif
