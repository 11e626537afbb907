/* redis.c - the redis:// store: redis://host:port[/prefix] through
 * hiredis, for clusters that already run a redis server (or would rather start
 * one than have rank 0 serve). One blocking connection per handle, one command
 * at a time; store.c's mutex serialises the callers.
 *
 * Every key lives under "<prefix>/" (default "loom/"), so jobs that share a
 * server stay apart by URI alone. Values are stored as they are (redis strings
 * are binary-safe); add uses INCRBY, which keeps decimal text as the other
 * backends do; cas is a small Lua script, which redis runs atomically.
 *
 * wait polls EXISTS with backoff instead of subscribing to keyspace
 * notifications: those are off by default (notify-keyspace-events), turning
 * them on needs CONFIG SET rights that a shared or managed server rarely
 * grants, and a notification missed between subscribing and checking would
 * need the poll anyway. A rendezvous waits for a few keys per rank, so the
 * polls (1 ms growing to 50 ms) cost the server little.
 *
 * A server that wants a password gets LOOM_REDIS_PASSWORD (and LOOM_REDIS_USER
 * for a named ACL user): never the URI, which appears in logs and messages. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "base/settings.h"
#include "store.h"

#define DEFAULT_PREFIX "loom"
#define DEFAULT_PORT   6379
#define PREFIX_MAX     256u
#define POLL_MIN_S     0.001
#define POLL_MAX_S     0.050
/* How long past a wait's own deadline one EXISTS may take to be answered
 * before the server counts as stalled (as WAIT_GRACE_S in store/tcp_client.c). */
#define WAIT_GRACE_S   5.0
#define PING_WORD      "loom-store-hello"

/* Compare-and-set in one step on the server. An absent key reads as false in
 * Lua; it matches only the empty expectation, and otherwise stays absent (the
 * empty string comes back, as from the other backends). */
static const char cas_script[] =
    "local v = redis.call('GET', KEYS[1])\n"
    "if v == false then\n"
    "  if ARGV[1] == '' then redis.call('SET', KEYS[1], ARGV[2]) return ARGV[2] end\n"
    "  return ''\n"
    "end\n"
    "if v == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) return ARGV[2] end\n"
    "return v\n";

/* GET, refused inside the server when the value is longer than the store's
 * limit (ARGV[1]): hiredis would read a reply of any length into memory, and
 * anyone who can write the key decides its length. */
#define TOO_BIG_WORD "LOOM_VALUE_TOO_BIG"
static const char get_script[] =
    "local n = redis.call('STRLEN', KEYS[1])\n"
    "if n > tonumber(ARGV[1]) then return redis.error_reply('" TOO_BIG_WORD " ' .. n) end\n"
    "return redis.call('GET', KEYS[1])\n";

typedef struct redis_store {
    char host[NI_MAXHOST];
    int port;
    char addr[NI_MAXHOST + 16];   /* "host:port" for messages */
    char *uri;                    /* "redis://..." as given, for messages */
    char prefix[PREFIX_MAX + 2];  /* "<prefix>/" */
    size_t prefix_len;
    char *user, *password;        /* NULL: no AUTH */
    redisContext *ctx;            /* NULL after a failure broke the connection */
    double ctx_timeout;           /* socket timeout now set on ctx, or < 0 */
    double op_timeout;
} redis_store_t;

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static struct timeval to_timeval(double s)
{
    /* A zero timeval means "no timeout" to setsockopt and hiredis. */
    if (!(s >= 0.001))
        s = 0.001;
    if (s > 1e7)
        s = 1e7;
    struct timeval tv = { (time_t)s, (suseconds_t)((s - (double)(time_t)s) * 1e6) };
    return tv;
}

/* ---- SIGPIPE. --------------------------------------------------------------
 * hiredis writes with write()/send() without MSG_NOSIGNAL, so a command sent
 * to a server that has gone away would kill the whole process with SIGPIPE.
 * The library must not install a process-wide handler, so the signal is
 * blocked on the calling thread for the command and a SIGPIPE the command
 * raised is taken off the thread's pending set before unblocking. */

typedef struct pipe_guard {
    sigset_t old;
    int was_pending;
} pipe_guard_t;

static void pipe_guard_on(pipe_guard_t *g)
{
    sigset_t set, pending;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
    sigemptyset(&pending);
    sigpending(&pending);
    /* One that the program itself left pending is not ours to swallow. */
    g->was_pending = sigismember(&pending, SIGPIPE) == 1;
}

static void pipe_guard_off(pipe_guard_t *g)
{
    int saved = errno;
    if (!g->was_pending) {
        sigset_t set, pending;
        sigemptyset(&set);
        sigaddset(&set, SIGPIPE);
        sigemptyset(&pending);
        sigpending(&pending);
        if (sigismember(&pending, SIGPIPE) == 1) {
            struct timespec zero = { 0, 0 };
            while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR)
                ;
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
    errno = saved;
}

/* ---- Connecting. ---------------------------------------------------------- */

static void drop_ctx(redis_store_t *r)
{
    if (r->ctx != NULL)
        redisFree(r->ctx);
    r->ctx = NULL;
    r->ctx_timeout = -1;
}

static int set_timeout(redis_store_t *r, double s)
{
    if (s == r->ctx_timeout)
        return 0;
    if (redisSetTimeout(r->ctx, to_timeval(s)) != REDIS_OK)
        return -1;
    r->ctx_timeout = s;
    return 0;
}

/* One command on r->ctx, SIGPIPE held off. NULL on failure, with ctx->err set
 * and *errno_p the errno hiredis saw. */
static redisReply *command(redis_store_t *r, int argc, const char **argv, const size_t *argvlen,
                           int *errno_p)
{
    pipe_guard_t g;
    pipe_guard_on(&g);
    errno = 0;
    redisReply *reply = redisCommandArgv(r->ctx, argc, argv, argvlen);
    *errno_p = errno;
    pipe_guard_off(&g);
    return reply;
}

static int is_timeout(const redisContext *c, int e)
{
#ifdef REDIS_ERR_TIMEOUT
    if (c->err == REDIS_ERR_TIMEOUT)
        return 1;
#endif
    /* SO_RCVTIMEO/SO_SNDTIMEO expiring reads as EAGAIN. */
    return c->err == REDIS_ERR_IO && (e == EAGAIN || e == EWOULDBLOCK || e == ETIMEDOUT);
}

/* A handshake command (AUTH, PING) got no reply: say what the server is not. */
static loom_status_t handshake_fail(redis_store_t *r, const char *what, int e, double waited_s,
                                    loom_err_t *err)
{
    const redisContext *c = r->ctx;
    if (is_timeout(c, e))
        return loom_err_set(err, LOOM_ERR_TIMEOUT,
                            "the server at %s accepted the connection but did not answer %s "
                            "within %.1f s; is it a redis server?", r->addr, what, waited_s);
    if (c->err == REDIS_ERR_EOF ||
        (c->err == REDIS_ERR_IO && (e == ECONNRESET || e == EPIPE)))
        return loom_err_set(err, LOOM_ERR_MISMATCH,
                            "the server at %s does not speak the redis protocol (it closed the "
                            "connection after %s); is another service, such as a Loom tcp:// "
                            "store, using this port?", r->addr, what);
    if (c->err == REDIS_ERR_PROTOCOL)
        return loom_err_set(err, LOOM_ERR_MISMATCH,
                            "the server at %s does not speak the redis protocol (%s, in answer "
                            "to %s); is another service using this port?", r->addr, c->errstr,
                            what);
    if (c->err == REDIS_ERR_OOM)
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory talking to redis at %s",
                            r->addr);
    return loom_err_set(err, LOOM_ERR_TRANSPORT, "sending %s to the redis server at %s: %s",
                        what, r->addr, c->errstr);
}

/* Log in (when a password is set) and check with PING that the server speaks
 * redis, within deadline. On a transient refusal (the server is still loading
 * its data set) returns LOOM_ERR_TIMEOUT with *retry_p = 1 and why filled. */
static loom_status_t handshake(redis_store_t *r, double deadline, int *retry_p, char *why,
                               size_t whylen, loom_err_t *err)
{
    redisReply *reply;
    int e;
    double left = deadline - loom_now_s();

    if (set_timeout(r, left) != 0)
        return handshake_fail(r, "the socket timeout", errno, left, err);
    if (r->password != NULL) {
        const char *argv[3] = { "AUTH" };
        size_t argvlen[3] = { 4 };
        int argc = 1;
        if (r->user != NULL) {
            argv[argc] = r->user;
            argvlen[argc++] = strlen(r->user);
        }
        argv[argc] = r->password;
        argvlen[argc++] = strlen(r->password);
        reply = command(r, argc, argv, argvlen, &e);
        if (reply == NULL)
            return handshake_fail(r, "AUTH", e, left, err);
        if (reply->type == REDIS_REPLY_ERROR) {
            loom_status_t st = loom_err_set(err, LOOM_ERR_AUTH,
                                            "the redis server at %s refused the login with "
                                            "LOOM_REDIS_PASSWORD%s: %s", r->addr,
                                            r->user != NULL ? " and LOOM_REDIS_USER" : "",
                                            reply->str);
            freeReplyObject(reply);
            return st;
        }
        freeReplyObject(reply);
    }

    /* PING with an argument, which redis echoes: the request is then longer
     * than the hello a Loom tcp:// store server reads before it judges (and
     * drops) a stranger, so pointing redis:// at one fails at once. */
    const char *ping[2] = { "PING", PING_WORD };
    size_t pinglen[2] = { 4, sizeof(PING_WORD) - 1 };
    reply = command(r, 2, ping, pinglen, &e);
    if (reply == NULL)
        return handshake_fail(r, "PING", e, left, err);
    loom_status_t st = LOOM_SUCCESS;
    if (reply->type == REDIS_REPLY_STRING && (size_t)reply->len == sizeof(PING_WORD) - 1 &&
        memcmp(reply->str, PING_WORD, sizeof(PING_WORD) - 1) == 0) {
        /* a redis server */
    } else if (reply->type == REDIS_REPLY_ERROR && strncmp(reply->str, "NOAUTH", 6) == 0) {
        st = loom_err_set(err, LOOM_ERR_AUTH,
                          "the redis server at %s requires a password (%s): set "
                          "LOOM_REDIS_PASSWORD, and LOOM_REDIS_USER for a named user", r->addr,
                          reply->str);
    } else if (reply->type == REDIS_REPLY_ERROR && strncmp(reply->str, "LOADING", 7) == 0) {
        snprintf(why, whylen, "%s", reply->str);
        *retry_p = 1;
        st = LOOM_ERR_TIMEOUT;
    } else if (reply->type == REDIS_REPLY_ERROR) {
        st = loom_err_set(err, LOOM_ERR_TRANSPORT,
                          "the redis server at %s answered PING with an error: %s", r->addr,
                          reply->str);
    } else {
        st = loom_err_set(err, LOOM_ERR_MISMATCH,
                          "the server at %s did not echo PING's argument as redis does; is "
                          "it a redis server?", r->addr);
    }
    freeReplyObject(reply);
    return st;
}

/* Connect and shake hands. With retry, a refused or failed connection (and a
 * server still loading) is retried with backoff until timeout_s: the server
 * may come up after the ranks. Without, one attempt. */
static loom_status_t rd_connect(redis_store_t *r, double timeout_s, int retry, loom_err_t *err)
{
    double deadline = loom_now_s() + timeout_s;
    double backoff = 0.01;
    char why[160] = "no attempt";

    for (;;) {
        double left = deadline - loom_now_s();
        /* At least 10 ms: an attempt made as the deadline passes still gets a
         * fair chance on a near server. */
        r->ctx = redisConnectWithTimeout(r->host, r->port, to_timeval(left > 0.01 ? left : 0.01));
        r->ctx_timeout = -1;
        if (r->ctx == NULL)
            return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory connecting to redis at %s",
                                r->addr);
        if (r->ctx->err != 0) {
            snprintf(why, sizeof(why), "%s", r->ctx->errstr);
            drop_ctx(r);
        } else {
            int again = 0;
            loom_err_t herr;
            loom_err_clear(&herr);
            loom_status_t st = handshake(r, deadline, &again, why, sizeof(why), &herr);
            if (st == LOOM_SUCCESS)
                return LOOM_SUCCESS;
            drop_ctx(r);
            if (!again)
                return loom_err_set(err, st, "%s", herr.msg);
        }
        double now = loom_now_s();
        if (!retry || now >= deadline)
            break;
        sleep_s(backoff < deadline - now ? backoff : deadline - now);
        backoff = backoff * 2 < 1.0 ? backoff * 2 : 1.0;
    }
    if (!retry)
        return loom_err_set(err, LOOM_ERR_PEER_LOST,
                            "lost the connection to the redis store at %s and could not "
                            "reconnect (%s)", r->addr, why);
    return loom_err_set(err, LOOM_ERR_TIMEOUT,
                        "timed out after %.1f s connecting to the redis store at %s (last "
                        "error: %s); is redis-server running there?", timeout_s, r->uri, why);
}

/* ---- Commands. ------------------------------------------------------------ */

/* The connection failed mid-command: it is out of step, so close it (the next
 * call reconnects once) and say why. */
static loom_status_t conn_fail(redis_store_t *r, int e, double waited_s, loom_err_t *err)
{
    const redisContext *c = r->ctx;
    loom_status_t st;

    if (is_timeout(c, e))
        st = loom_err_set(err, LOOM_ERR_TIMEOUT,
                          "the redis server at %s did not answer within %.1f s", r->addr,
                          waited_s);
    else if (c->err == REDIS_ERR_EOF)
        st = loom_err_set(err, LOOM_ERR_PEER_LOST,
                          "the redis server at %s closed the connection", r->addr);
    else if (c->err == REDIS_ERR_IO && (e == ECONNRESET || e == EPIPE))
        st = loom_err_set(err, LOOM_ERR_PEER_LOST,
                          "the connection to the redis server at %s was reset", r->addr);
    else if (c->err == REDIS_ERR_PROTOCOL)
        st = loom_err_set(err, LOOM_ERR_MISMATCH,
                          "the redis server at %s sent a malformed reply (%s)", r->addr,
                          c->errstr);
    else if (c->err == REDIS_ERR_OOM)
        st = loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory reading a reply of redis at %s",
                          r->addr);
    else
        st = loom_err_set(err, LOOM_ERR_TRANSPORT, "talking to the redis server at %s: %s",
                          r->addr, c->errstr);
    drop_ctx(r);
    return st;
}

/* Run one command on key (argv[slot] is filled with the prefixed key), its
 * answer bounded by timeout_s. *reply_p (caller frees) may be an error reply. */
static loom_status_t rd_call(redis_store_t *r, double timeout_s, const char *key, int slot,
                             int argc, const char **argv, size_t *argvlen, redisReply **reply_p,
                             loom_err_t *err)
{
    loom_status_t st;
    char full[PREFIX_MAX + 2 + LOOM_STORE_KEY_MAX + 1];
    size_t klen = strlen(key);

    /* A broken connection is replaced before the next command, never during
     * one, so no command is ever sent twice. */
    if (r->ctx == NULL &&
        (st = rd_connect(r, timeout_s < r->op_timeout ? timeout_s : r->op_timeout, 0, err)) !=
            LOOM_SUCCESS)
        return st;
    memcpy(full, r->prefix, r->prefix_len);
    memcpy(full + r->prefix_len, key, klen + 1);
    argv[slot] = full;
    argvlen[slot] = r->prefix_len + klen;
    if (set_timeout(r, timeout_s) != 0)
        return conn_fail(r, errno, timeout_s, err);
    int e;
    redisReply *reply = command(r, argc, argv, argvlen, &e);
    if (reply == NULL)
        return conn_fail(r, e, timeout_s, err);
    *reply_p = reply;
    return LOOM_SUCCESS;
}

/* The reply is not the one the command gives: an error reply (the key holds a
 * list, the server is out of memory, ...) or a stranger. Frees reply. */
static loom_status_t bad_reply(redis_store_t *r, const char *cmd, const char *key,
                               redisReply *reply, loom_err_t *err)
{
    loom_status_t st;
    if (reply->type == REDIS_REPLY_ERROR)
        st = loom_err_set(err, LOOM_ERR_TRANSPORT,
                          "the redis server at %s refused %s of store key %s: %s", r->addr, cmd,
                          key, reply->str);
    else
        st = loom_err_set(err, LOOM_ERR_MISMATCH,
                          "the redis server at %s answered %s of store key %s with an unexpected "
                          "reply (type %d)", r->addr, cmd, key, reply->type);
    freeReplyObject(reply);
    return st;
}

/* A malloc'ed copy of a string reply with a NUL after it. Frees reply. */
static loom_status_t take_string(redis_store_t *r, redisReply *reply, void **val_p,
                                 size_t *len_p, loom_err_t *err)
{
    size_t len = (size_t)reply->len;
    if (len > LOOM_STORE_VALUE_MAX) {
        freeReplyObject(reply);
        return loom_err_set(err, LOOM_ERR_TRANSPORT,
                            "the redis server at %s returned a value of %zu bytes, more than "
                            "the store's limit of %u", r->addr, len, LOOM_STORE_VALUE_MAX);
    }
    char *val = malloc(len + 1);
    if (val == NULL) {
        freeReplyObject(reply);
        return loom_err_set(err, LOOM_ERR_NO_MEMORY,
                            "out of memory for a store value of %zu bytes from redis at %s", len,
                            r->addr);
    }
    memcpy(val, reply->str, len);
    val[len] = '\0';
    freeReplyObject(reply);
    *val_p = val;
    *len_p = len;
    return LOOM_SUCCESS;
}

/* ---- The ops. --------------------------------------------------------------- */

static void redis_free(redis_store_t *r)
{
    drop_ctx(r);
    free(r->uri);
    free(r->user);
    if (r->password != NULL) {
        explicit_bzero(r->password, strlen(r->password));
        free(r->password);
    }
    free(r);
}

static loom_status_t redis_open(const char *rest, int rank, double timeout_s, loom_err_t *err,
                                void **impl_p)
{
    loom_status_t st;
    char hostport[NI_MAXHOST + 16];

    redis_store_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory opening a redis store");
    r->ctx_timeout = -1;
    r->op_timeout = timeout_s;
    if (asprintf(&r->uri, "redis://%s", rest) < 0) {
        r->uri = NULL;
        st = loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory opening a redis store");
        goto fail;
    }

    const char *slash = strchr(rest, '/');
    size_t hplen = slash != NULL ? (size_t)(slash - rest) : strlen(rest);
    if (memchr(rest, '@', hplen) != NULL) {
        /* Not echoed: the part before '@' is likely a password. */
        st = loom_err_set(err, LOOM_ERR_INVALID_ARG,
                          "bad store URI redis://...@...: put the redis password in "
                          "LOOM_REDIS_PASSWORD (and the user in LOOM_REDIS_USER), not in the "
                          "URI, which appears in logs");
        goto fail;
    }
    if (hplen + sizeof(":6379") > sizeof(hostport)) {
        st = loom_err_set(err, LOOM_ERR_INVALID_ARG, "bad store URI '%s': host too long",
                          r->uri);
        goto fail;
    }
    memcpy(hostport, rest, hplen);
    hostport[hplen] = '\0';
    /* The port may be left out, as in redis-cli's URIs. */
    int has_port = hplen > 0 && hostport[0] == '[' ? hostport[hplen - 1] != ']'
                                                   : strchr(hostport, ':') != NULL;
    if (!has_port && hplen > 0)
        snprintf(hostport + hplen, sizeof(hostport) - hplen, ":%d", DEFAULT_PORT);
    st = loom_store_parse_hostport(hostport, r->uri, r->host, sizeof(r->host), &r->port, err);
    if (st != LOOM_SUCCESS)
        goto fail;
    if (r->port == 0) {
        st = loom_err_set(err, LOOM_ERR_INVALID_ARG,
                          "bad store URI '%s': port 0 names no redis server", r->uri);
        goto fail;
    }
    loom_store_format_hostport(r->host, r->port, r->addr, sizeof(r->addr));

    const char *prefix = slash != NULL && slash[1] != '\0' ? slash + 1 : DEFAULT_PREFIX;
    size_t plen = strlen(prefix);
    if (plen > PREFIX_MAX) {
        st = loom_err_set(err, LOOM_ERR_INVALID_ARG,
                          "bad store URI '%.80s...': the key prefix is longer than %u bytes",
                          r->uri, PREFIX_MAX);
        goto fail;
    }
    memcpy(r->prefix, prefix, plen);
    r->prefix[plen] = '/';
    r->prefix[plen + 1] = '\0';
    r->prefix_len = plen + 1;

    loom_store_env_t env = {0};
    st = loom_settings_load_group(LOOM_SG_STORE_REDIS, &env, loom_getenv_process, NULL, err);
    if (st != LOOM_SUCCESS)
        goto fail;
    const char *pw = env.redis_password;
    const char *user = env.redis_user;
    if (pw != NULL && pw[0] != '\0') {
        r->password = strdup(pw);
        if (user != NULL && user[0] != '\0')
            r->user = strdup(user);
        if (r->password == NULL || (user != NULL && user[0] != '\0' && r->user == NULL)) {
            st = loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory opening store %s",
                              r->uri);
            goto fail;
        }
    }

    st = rd_connect(r, timeout_s, 1, err);
    if (st != LOOM_SUCCESS)
        goto fail;
    *impl_p = r;
    return LOOM_SUCCESS;

fail:
    redis_free(r);
    return st;
}

static void redis_close(void *impl)
{
    redis_free(impl);
}

static loom_status_t redis_set(void *impl, const char *key, const void *val, size_t len,
                               loom_err_t *err)
{
    redis_store_t *r = impl;
    const char *argv[3] = { "SET", NULL, len > 0 ? val : "" };
    size_t argvlen[3] = { 3, 0, len };
    redisReply *reply;

    loom_status_t st = rd_call(r, r->op_timeout, key, 1, 3, argv, argvlen, &reply, err);
    if (st != LOOM_SUCCESS)
        return st;
    if (reply->type != REDIS_REPLY_STATUS)
        return bad_reply(r, "SET", key, reply, err);
    freeReplyObject(reply);
    return LOOM_SUCCESS;
}

static loom_status_t redis_try_get(void *impl, const char *key, void **val_p, size_t *len_p,
                                   int *found_p, loom_err_t *err)
{
    redis_store_t *r = impl;
    char max[16];
    int maxlen = snprintf(max, sizeof(max), "%u", LOOM_STORE_VALUE_MAX);
    const char *argv[5] = { "EVAL", get_script, "1", NULL, max };
    size_t argvlen[5] = { 4, sizeof(get_script) - 1, 1, 0, (size_t)maxlen };
    redisReply *reply;

    loom_status_t st = rd_call(r, r->op_timeout, key, 3, 5, argv, argvlen, &reply, err);
    if (st != LOOM_SUCCESS)
        return st;
    if (reply->type == REDIS_REPLY_NIL) {
        freeReplyObject(reply);
        *found_p = 0;
        return LOOM_SUCCESS;
    }
    if (reply->type == REDIS_REPLY_ERROR && reply->str != NULL &&
        strstr(reply->str, TOO_BIG_WORD) != NULL) {
        const char *n = strstr(reply->str, TOO_BIG_WORD) + sizeof(TOO_BIG_WORD);
        st = loom_err_set(err, LOOM_ERR_TRANSPORT,
                          "store key %s at redis %s holds %.20s bytes, more than the store's "
                          "value limit of %u: refused unread", key, r->addr, n,
                          LOOM_STORE_VALUE_MAX);
        freeReplyObject(reply);
        return st;
    }
    if (reply->type != REDIS_REPLY_STRING)
        return bad_reply(r, "GET", key, reply, err);
    st = take_string(r, reply, val_p, len_p, err);
    if (st == LOOM_SUCCESS)
        *found_p = 1;
    return st;
}

static loom_status_t redis_wait(void *impl, const char *key, double timeout_s, loom_err_t *err)
{
    redis_store_t *r = impl;
    double backoff = POLL_MIN_S;

    if (!(timeout_s > 0))
        timeout_s = 0;
    double deadline = loom_now_s() + timeout_s;
    for (;;) {
        const char *argv[2] = { "EXISTS" };
        size_t argvlen[2] = { 6 };
        redisReply *reply;
        /* EXISTS, not GET: a large value would cross the wire at every poll. */
        double left = deadline - loom_now_s();
        double bound = (left > 0 ? left : 0) + WAIT_GRACE_S;
        loom_status_t st = rd_call(r, bound < r->op_timeout ? bound : r->op_timeout, key, 1,
                                   2, argv, argvlen, &reply, err);
        if (st != LOOM_SUCCESS)
            return st;
        if (reply->type != REDIS_REPLY_INTEGER)
            return bad_reply(r, "EXISTS", key, reply, err);
        long long n = reply->integer;
        freeReplyObject(reply);
        if (n > 0)
            return LOOM_SUCCESS;
        double now = loom_now_s();
        if (now >= deadline)
            return loom_err_set(err, LOOM_ERR_TIMEOUT,
                                "timed out after %.1f s waiting for store key %s at %s",
                                timeout_s, key, r->uri);
        sleep_s(backoff < deadline - now ? backoff : deadline - now);
        backoff = backoff * 2 < POLL_MAX_S ? backoff * 2 : POLL_MAX_S;
    }
}

static loom_status_t redis_add(void *impl, const char *key, int64_t delta, int64_t *value_p,
                               loom_err_t *err)
{
    redis_store_t *r = impl;
    char num[24];
    int nlen = snprintf(num, sizeof(num), "%" PRId64, delta);
    const char *argv[3] = { "INCRBY", NULL, num };
    size_t argvlen[3] = { 6, 0, (size_t)nlen };
    redisReply *reply;

    loom_status_t st = rd_call(r, r->op_timeout, key, 1, 3, argv, argvlen, &reply, err);
    if (st != LOOM_SUCCESS)
        return st;
    if (reply->type == REDIS_REPLY_ERROR && strstr(reply->str, "overflow") != NULL) {
        freeReplyObject(reply);
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "adding %" PRId64 " to store key %s would overflow int64", delta,
                            key);
    }
    if (reply->type == REDIS_REPLY_ERROR && strstr(reply->str, "not an integer") != NULL) {
        freeReplyObject(reply);
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "store key %s does not hold a decimal integer, so it cannot be "
                            "added to", key);
    }
    if (reply->type != REDIS_REPLY_INTEGER)
        return bad_reply(r, "INCRBY", key, reply, err);
    *value_p = (int64_t)reply->integer;
    freeReplyObject(reply);
    return LOOM_SUCCESS;
}

static loom_status_t redis_cas(void *impl, const char *key, const void *expected, size_t elen,
                               const void *desired, size_t dlen, void **value_p, size_t *len_p,
                               loom_err_t *err)
{
    redis_store_t *r = impl;
    const char *argv[6] = { "EVAL", cas_script, "1", NULL, elen > 0 ? expected : "",
                            dlen > 0 ? desired : "" };
    size_t argvlen[6] = { 4, sizeof(cas_script) - 1, 1, 0, elen, dlen };
    redisReply *reply;

    loom_status_t st = rd_call(r, r->op_timeout, key, 3, 6, argv, argvlen, &reply, err);
    if (st != LOOM_SUCCESS)
        return st;
    if (reply->type != REDIS_REPLY_STRING)
        return bad_reply(r, "the compare-and-set script (EVAL)", key, reply, err);
    return take_string(r, reply, value_p, len_p, err);
}

static loom_status_t redis_del(void *impl, const char *key, int *existed_p, loom_err_t *err)
{
    redis_store_t *r = impl;
    const char *argv[2] = { "DEL" };
    size_t argvlen[2] = { 3 };
    redisReply *reply;

    loom_status_t st = rd_call(r, r->op_timeout, key, 1, 2, argv, argvlen, &reply, err);
    if (st != LOOM_SUCCESS)
        return st;
    if (reply->type != REDIS_REPLY_INTEGER)
        return bad_reply(r, "DEL", key, reply, err);
    *existed_p = reply->integer > 0;
    freeReplyObject(reply);
    return LOOM_SUCCESS;
}

static int redis_local_host(void *impl, char *host, size_t hostlen)
{
    redis_store_t *r = impl;
    return r->ctx == NULL ? -1 : loom_store_fd_local_host(r->ctx->fd, host, hostlen);
}

const loom_store_ops_t loom_store_redis_ops = {
    .size = sizeof(loom_store_ops_t),
    .scheme = "redis",
    .open = redis_open,
    .close = redis_close,
    .set = redis_set,
    .try_get = redis_try_get,
    .wait = redis_wait,
    .add = redis_add,
    .cas = redis_cas,
    .del = redis_del,
    .local_host = redis_local_host,
};
