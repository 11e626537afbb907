/* store.c - the generic half of the rendezvous store: URI parsing, backend
 * selection, argument checks, deadlines and the messages users read when a key
 * never shows up. The backends (store/tcp_client.c, store/file.c, store/redis.c)
 * only move bytes. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/crypto.h"
#include "store.h"

/* Used when the caller passes no timeout, as LOOM_TIMEOUT's default. */
#define STORE_DEFAULT_TIMEOUT_S 300.0

struct loom_store {
    const loom_store_ops_t *ops;
    void *impl;
    /* One call at a time per handle: the tcp backend has one connection with one
     * request in flight, like torch's TCPStore. A wait therefore holds up other
     * calls on the same handle; threads that must not block each other (a waiter
     * and the thread that sets its key) use separate handles, as ranks do. */
    pthread_mutex_t mu;
    char *uri;
    uint8_t key[1024];   /* LOOM_AUTH_KEY for signed values; keylen 0: none */
    size_t keylen;
};

/* A signed value: this magic, the MAC, then the value. */
#define SIG_MAGIC "LOOMSIG1"
#define SIG_MAGIC_LEN 8
#define SIG_BYTES (SIG_MAGIC_LEN + LOOM_SHA256_BYTES)

static const loom_store_ops_t *const store_backends[] = {
    &loom_store_tcp_ops,
    &loom_store_file_ops,
#ifdef HAVE_HIREDIS
    &loom_store_redis_ops,
#endif
};

#ifdef HAVE_HIREDIS
#define STORE_SCHEMES "tcp://, file:// and redis://"
#else
#define STORE_SCHEMES "tcp:// and file://"
#endif

loom_status_t loom_store_parse_hostport(const char *hostport, const char *uri, char *host,
                                        size_t hostlen, int *port_p, loom_err_t *err)
{
    const char *shown = uri != NULL ? uri : hostport;
    const char *h, *hend, *p;

    if (hostport[0] == '[') {
        h = hostport + 1;
        hend = strchr(h, ']');
        if (hend == NULL || hend[1] != ':')
            return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                                "bad store URI '%s': expected [v6addr]:port", shown);
        p = hend + 2;
    } else {
        h = hostport;
        hend = strrchr(hostport, ':');
        if (hend == NULL)
            return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                                "bad store URI '%s': expected host:port", shown);
        if (memchr(h, ':', (size_t)(hend - h)) != NULL)
            return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                                "bad store URI '%s': write IPv6 addresses in brackets, "
                                "as tcp://[::1]:29500", shown);
        p = hend + 1;
    }
    size_t hl = (size_t)(hend - h);
    if (hl == 0)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "bad store URI '%s': empty host", shown);
    if (hl >= hostlen)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "bad store URI '%s': host too long",
                            shown);
    for (size_t i = 0; i < hl; i++) {
        unsigned char ch = (unsigned char)h[i];
        if (ch <= ' ' || ch == '/' || ch == '@' || ch == '[' || ch == ']' || ch >= 0x7f)
            return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                                "bad store URI '%s': bad character in host", shown);
    }
    /* Digits only: strtol would accept " +12" and "0x1f". */
    size_t pl = strlen(p);
    if (pl == 0 || pl > 5 || strspn(p, "0123456789") != pl)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "bad store URI '%s': the port must be a number in 0..65535", shown);
    int port = atoi(p);
    if (port > 65535)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "bad store URI '%s': the port must be a number in 0..65535", shown);
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port_p = port;
    return LOOM_SUCCESS;
}

void loom_store_format_hostport(const char *host, int port, char *buf, size_t buflen)
{
    if (strchr(host, ':') != NULL)
        snprintf(buf, buflen, "[%s]:%d", host, port);
    else
        snprintf(buf, buflen, "%s:%d", host, port);
}

int loom_store_parse_int64(const void *buf, size_t len, int64_t *value_p)
{
    const unsigned char *s = buf;
    size_t i = 0;
    int neg = 0;

    if (len > 0 && s[0] == '-') {
        neg = 1;
        i = 1;
    }
    if (i == len || len > 20)
        return -1;
    /* Accumulate negatively so INT64_MIN parses without overflow. */
    int64_t v = 0;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        int d = s[i] - '0';
        if (v < (INT64_MIN + d) / 10)
            return -1;
        v = v * 10 - d;
    }
    if (!neg) {
        if (v == INT64_MIN)
            return -1;
        v = -v;
    }
    *value_p = v;
    return 0;
}

/* ---- Argument checks shared by the calls. -------------------------------- */

static loom_status_t check_key(const char *key, loom_err_t *err)
{
    if (key == NULL)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "store key is NULL");
    size_t n = strnlen(key, LOOM_STORE_KEY_MAX + 1);
    if (n == 0)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "store key is empty");
    if (n > LOOM_STORE_KEY_MAX)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "store key '%.40s...' is longer than %u bytes", key,
                            LOOM_STORE_KEY_MAX);
    return LOOM_SUCCESS;
}

static loom_status_t check_value(const char *what, const void *val, size_t len, loom_err_t *err)
{
    if (val == NULL && len != 0)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "store %s is NULL with length %zu",
                            what, len);
    if (len > LOOM_STORE_VALUE_MAX)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "store %s of %zu bytes is larger than the limit of %u bytes", what,
                            len, LOOM_STORE_VALUE_MAX);
    return LOOM_SUCCESS;
}

/* Pass a backend's failure on to the caller's err with its own message. */
static loom_status_t forward(loom_err_t *err, const loom_err_t *inner, loom_status_t st)
{
    if (inner->status != LOOM_SUCCESS)
        return loom_err_set(err, inner->status, "%s", inner->msg);
    /* A backend that failed without a message: a bug, but say something. */
    return loom_err_set(err, st, "store backend failed with status %d", (int)st);
}

/* ---- Open and close. ------------------------------------------------------ */

loom_status_t loom_store_open(const char *uri, int rank, double timeout_s, loom_err_t *err,
                              loom_store_t **store_p)
{
    return loom_store_open_key(uri, rank, timeout_s, NULL, 0, err, store_p);
}

/* A handle for backend ops named name (its URI), without its backend state yet. */
static loom_status_t handle_new(const loom_store_ops_t *ops, const char *name, loom_err_t *err,
                                loom_store_t **s_p)
{
    loom_store_t *s = calloc(1, sizeof(*s));
    if (s == NULL || (s->uri = strdup(name)) == NULL) {
        free(s);
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory opening store %s", name);
    }
    int rc = pthread_mutex_init(&s->mu, NULL);
    if (rc != 0) {
        free(s->uri);
        free(s);
        return loom_err_set(err, LOOM_ERR_INTERNAL, "pthread_mutex_init: %s", strerror(rc));
    }
    s->ops = ops;
    *s_p = s;
    return LOOM_SUCCESS;
}

static void handle_free(loom_store_t *s)
{
    pthread_mutex_destroy(&s->mu);
    free(s->uri);
    explicit_bzero(s->key, sizeof(s->key));
    free(s);
}

loom_status_t loom_store_open_key(const char *uri, int rank, double timeout_s, const void *key,
                                  size_t keylen, loom_err_t *err, loom_store_t **store_p)
{
    loom_status_t st;
    loom_err_t inner;

    if (uri == NULL || store_p == NULL)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "store URI or output pointer is NULL");
    const char *sep = strstr(uri, "://");
    if (sep == NULL || sep == uri)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "bad store URI '%s': expected tcp://host:port, file:///dir or "
                            "redis://host:port[/prefix]", uri);
    size_t slen = (size_t)(sep - uri);
    const loom_store_ops_t *ops = NULL;
    for (size_t i = 0; i < sizeof(store_backends) / sizeof(store_backends[0]); i++) {
        const char *name = store_backends[i]->scheme;
        if (strlen(name) == slen && strncmp(name, uri, slen) == 0)
            ops = store_backends[i];
    }
#ifndef HAVE_HIREDIS
    if (ops == NULL && slen == 5 && strncmp(uri, "redis", 5) == 0)
        return loom_err_set(err, LOOM_ERR_UNSUPPORTED,
                            "store URI '%s': this build of Loom has no redis:// store: install "
                            "libhiredis-dev and re-run configure", uri);
#endif
    if (ops == NULL)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "unknown store scheme '%.*s' in '%s' (this build knows "
                            STORE_SCHEMES ")", (int)slen, uri, uri);
    if (!(timeout_s > 0))
        timeout_s = STORE_DEFAULT_TIMEOUT_S;
    if (keylen > sizeof(((loom_store_t *)0)->key))
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "LOOM_AUTH_KEY is too long");

    loom_store_t *s;
    if ((st = handle_new(ops, uri, err, &s)) != LOOM_SUCCESS)
        return st;
    if (keylen > 0)
        memcpy(s->key, key, keylen);
    s->keylen = keylen;
    loom_err_clear(&inner);
    if (keylen > 0 && ops->open_key != NULL)
        st = ops->open_key(sep + 3, rank, timeout_s, key, keylen, &inner, &s->impl);
    else
        st = ops->open(sep + 3, rank, timeout_s, &inner, &s->impl);
    if (st != LOOM_SUCCESS) {
        handle_free(s);
        return forward(err, &inner, st);
    }
    *store_p = s;
    return LOOM_SUCCESS;
}

loom_status_t loom_store_wrap(const loom_store_ops_t *ops, void *impl, const char *name,
                              const void *key, size_t keylen, loom_err_t *err,
                              loom_store_t **store_p)
{
    loom_store_t *s;
    if (keylen > sizeof(((loom_store_t *)0)->key)) {
        ops->close(impl);
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "LOOM_AUTH_KEY is too long");
    }
    loom_status_t st = handle_new(ops, name, err, &s);
    if (st != LOOM_SUCCESS) {
        ops->close(impl);
        return st;
    }
    if (keylen > 0)
        memcpy(s->key, key, keylen);
    s->keylen = keylen;
    s->impl = impl;
    *store_p = s;
    return LOOM_SUCCESS;
}

void loom_store_close(loom_store_t *s)
{
    if (s == NULL)
        return;
    s->ops->close(s->impl);
    handle_free(s);
}

/* ---- Signed values. ------------------------------------------------------- */

static void value_mac(const loom_store_t *s, const char *key, const void *val, size_t len,
                      uint8_t out[LOOM_SHA256_BYTES])
{
    /* The key name is covered, so a value cannot be moved to another key
     * (rank 0's address passed off as rank 1's). */
    static const char domain[] = "loom store value v1";
    const void *parts[4] = {domain, key, "", val};
    const size_t lens[4] = {sizeof(domain), strlen(key), 1, len};
    loom_hmac_sha256(s->key, s->keylen, parts, lens, 4, out);
}

loom_status_t loom_store_sign(loom_store_t *s, const char *key, const void *val, size_t len,
                              void **out_p, size_t *outlen_p, loom_err_t *err)
{
    loom_status_t st;
    if (s == NULL)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "store handle is NULL");
    if ((st = check_key(key, err)) != LOOM_SUCCESS ||
        (st = check_value("value", val, len, err)) != LOOM_SUCCESS)
        return st;
    size_t head = s->keylen ? SIG_BYTES : 0;
    if (len > LOOM_STORE_VALUE_MAX - head)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "signed store value of %zu bytes is larger than the limit", len);
    uint8_t *buf = malloc(head + len + 1);
    if (buf == NULL)
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory");
    if (head) {
        memcpy(buf, SIG_MAGIC, SIG_MAGIC_LEN);
        value_mac(s, key, val, len, buf + SIG_MAGIC_LEN);
    }
    if (len > 0)
        memcpy(buf + head, val, len);
    *out_p = buf;
    *outlen_p = head + len;
    return LOOM_SUCCESS;
}

loom_status_t loom_store_set_signed(loom_store_t *s, const char *key, const void *val,
                                    size_t len, loom_err_t *err)
{
    void *buf;
    size_t blen;
    loom_status_t st = loom_store_sign(s, key, val, len, &buf, &blen, err);
    if (st != LOOM_SUCCESS)
        return st;
    st = loom_store_set(s, key, buf, blen, err);
    free(buf);
    return st;
}

loom_status_t loom_store_verify(loom_store_t *s, const char *key, const void *val, size_t len,
                                const void **val_p, size_t *len_p, loom_err_t *err)
{
    const uint8_t *v = val;
    int signed_ = len >= SIG_BYTES && memcmp(v, SIG_MAGIC, SIG_MAGIC_LEN) == 0;
    if (s->keylen == 0) {
        if (signed_)
            return loom_err_set(err, LOOM_ERR_AUTH,
                                "the value of %s in the store is signed with LOOM_AUTH_KEY, "
                                "which this process does not have", key);
        *val_p = val;
        *len_p = len;
        return LOOM_SUCCESS;
    }
    uint8_t want[LOOM_SHA256_BYTES];
    if (signed_)
        value_mac(s, key, v + SIG_BYTES, len - SIG_BYTES, want);
    if (!signed_ || !loom_equal_ct(want, v + SIG_MAGIC_LEN, sizeof(want)))
        return loom_err_set(err, LOOM_ERR_AUTH,
                            "the value of %s in the store %s: forged, or written by a process "
                            "with another LOOM_AUTH_KEY or none", key,
                            signed_ ? "does not match its LOOM_AUTH_KEY MAC"
                                    : "carries no LOOM_AUTH_KEY MAC");
    *val_p = v + SIG_BYTES;
    *len_p = len - SIG_BYTES;
    return LOOM_SUCCESS;
}

loom_status_t loom_store_get_signed(loom_store_t *s, const char *key, void **val_p,
                                    size_t *len_p, double timeout_s, loom_err_t *err)
{
    void *val;
    size_t len;
    const void *inner;
    size_t ilen;
    loom_status_t st = loom_store_get(s, key, &val, &len, timeout_s, err);
    if (st != LOOM_SUCCESS)
        return st;
    if ((st = loom_store_verify(s, key, val, len, &inner, &ilen, err)) != LOOM_SUCCESS) {
        free(val);
        return st;
    }
    if (inner != val) {
        /* Callers free what they get and read a NUL after it. */
        memmove(val, inner, ilen);
        ((uint8_t *)val)[ilen] = '\0';
    }
    *val_p = val;
    *len_p = ilen;
    return LOOM_SUCCESS;
}

/* ---- The calls. ----------------------------------------------------------- */

loom_status_t loom_store_set(loom_store_t *s, const char *key, const void *val, size_t len,
                             loom_err_t *err)
{
    loom_status_t st;
    loom_err_t inner;

    if (s == NULL)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "store handle is NULL");
    if ((st = check_key(key, err)) != LOOM_SUCCESS ||
        (st = check_value("value", val, len, err)) != LOOM_SUCCESS)
        return st;
    loom_err_clear(&inner);
    pthread_mutex_lock(&s->mu);
    st = s->ops->set(s->impl, key, val, len, &inner);
    pthread_mutex_unlock(&s->mu);
    return st == LOOM_SUCCESS ? st : forward(err, &inner, st);
}

/* Keys of keys[] not in the store yet, as "a, b, c", at most bufsize bytes.
 * first_missing is known to be missing; later ones are checked without waiting. */
static void list_missing(loom_store_t *s, const char *const *keys, size_t nkeys,
                         size_t first_missing, char *buf, size_t bufsize)
{
    size_t used = 0, listed = 0, missing = 0;
    int check = 1;

    buf[0] = '\0';
    for (size_t i = first_missing; i < nkeys; i++) {
        if (i != first_missing && check) {
            loom_err_t inner;
            loom_err_clear(&inner);
            /* Only a key that is there now is left out. After an error (the
             * server went away) the rest are listed unchecked rather than each
             * costing another failed attempt. */
            loom_status_t st = s->ops->wait(s->impl, keys[i], 0.0, &inner);
            if (st == LOOM_SUCCESS)
                continue;
            check = st == LOOM_ERR_TIMEOUT;
        }
        missing++;
        size_t klen = strlen(keys[i]);
        /* Leave room for the ", ... (N more)" tail. */
        if (used + klen + 2 + 24 < bufsize) {
            used += (size_t)snprintf(buf + used, bufsize - used, "%s%s", listed ? ", " : "",
                                     keys[i]);
            listed++;
        }
    }
    if (missing > listed)
        snprintf(buf + used, bufsize - used, "%s... (%zu more)", listed ? ", " : "",
                 missing - listed);
}

/* Wait for every key with one overall deadline; on timeout, the message names
 * the missing keys. Called with s->mu held. */
static loom_status_t wait_locked(loom_store_t *s, const char *const *keys, size_t nkeys,
                                 double timeout_s, double deadline, loom_err_t *err)
{
    for (size_t i = 0; i < nkeys; i++) {
        loom_err_t inner;
        loom_err_clear(&inner);
        double left = deadline - loom_now_s();
        loom_status_t st = s->ops->wait(s->impl, keys[i], left > 0 ? left : 0.0, &inner);
        if (st == LOOM_ERR_TIMEOUT) {
            char missing[320];
            list_missing(s, keys, nkeys, i, missing, sizeof(missing));
            return loom_err_set(err, LOOM_ERR_TIMEOUT,
                                "timed out after %.1f s waiting for store key(s) %s at %s",
                                timeout_s, missing, s->uri);
        }
        if (st != LOOM_SUCCESS) {
            /* Usually the serving rank gave up first: still say what was missing. */
            char missing[320];
            list_missing(s, keys, nkeys, i, missing, sizeof(missing));
            return loom_err_set(err, st, "%s, while waiting for store key(s) %s",
                                inner.status != LOOM_SUCCESS ? inner.msg : "store failure",
                                missing);
        }
    }
    return LOOM_SUCCESS;
}

loom_status_t loom_store_get(loom_store_t *s, const char *key, void **val_p, size_t *len_p,
                             double timeout_s, loom_err_t *err)
{
    loom_status_t st;

    if (s == NULL || val_p == NULL || len_p == NULL)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "store handle or output pointer is NULL");
    if ((st = check_key(key, err)) != LOOM_SUCCESS)
        return st;
    if (!(timeout_s >= 0))
        timeout_s = 0;
    double deadline = loom_now_s() + timeout_s;
    const char *keys[1] = { key };

    pthread_mutex_lock(&s->mu);
    for (;;) {
        st = wait_locked(s, keys, 1, timeout_s, deadline, err);
        if (st != LOOM_SUCCESS)
            break;
        loom_err_t inner;
        loom_err_clear(&inner);
        void *val;
        size_t len;
        int found;
        st = s->ops->try_get(s->impl, key, &val, &len, &found, &inner);
        if (st != LOOM_SUCCESS) {
            st = forward(err, &inner, st);
            break;
        }
        if (found) {
            *val_p = val;
            *len_p = len;
            break;
        }
        /* Deleted between the wait and the read: wait again, within the deadline. */
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

loom_status_t loom_store_try_get(loom_store_t *s, const char *key, void **val_p, size_t *len_p,
                                 int *found_p, loom_err_t *err)
{
    loom_status_t st;

    if (s == NULL || val_p == NULL || len_p == NULL || found_p == NULL)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "store handle or output pointer is NULL");
    if ((st = check_key(key, err)) != LOOM_SUCCESS)
        return st;
    loom_err_t inner;
    loom_err_clear(&inner);
    *found_p = 0;
    pthread_mutex_lock(&s->mu);
    st = s->ops->try_get(s->impl, key, val_p, len_p, found_p, &inner);
    pthread_mutex_unlock(&s->mu);
    return st == LOOM_SUCCESS ? st : forward(err, &inner, st);
}

loom_status_t loom_store_wait(loom_store_t *s, const char *const *keys, size_t nkeys,
                              double timeout_s, loom_err_t *err)
{
    loom_status_t st;

    if (s == NULL || (keys == NULL && nkeys != 0))
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "store handle or key array is NULL");
    for (size_t i = 0; i < nkeys; i++)
        if ((st = check_key(keys[i], err)) != LOOM_SUCCESS)
            return st;
    if (!(timeout_s >= 0))
        timeout_s = 0;
    double deadline = loom_now_s() + timeout_s;
    pthread_mutex_lock(&s->mu);
    st = wait_locked(s, keys, nkeys, timeout_s, deadline, err);
    pthread_mutex_unlock(&s->mu);
    return st;
}

loom_status_t loom_store_add(loom_store_t *s, const char *key, int64_t delta, int64_t *value_p,
                             loom_err_t *err)
{
    loom_status_t st;
    loom_err_t inner;
    int64_t v;

    if (s == NULL)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "store handle is NULL");
    if ((st = check_key(key, err)) != LOOM_SUCCESS)
        return st;
    loom_err_clear(&inner);
    pthread_mutex_lock(&s->mu);
    st = s->ops->add(s->impl, key, delta, &v, &inner);
    pthread_mutex_unlock(&s->mu);
    if (st != LOOM_SUCCESS)
        return forward(err, &inner, st);
    if (value_p != NULL)
        *value_p = v;
    return LOOM_SUCCESS;
}

loom_status_t loom_store_cas(loom_store_t *s, const char *key, const void *expected, size_t elen,
                             const void *desired, size_t dlen, void **value_p, size_t *len_p,
                             loom_err_t *err)
{
    loom_status_t st;
    loom_err_t inner;
    void *val;
    size_t len;

    if (s == NULL || value_p == NULL || len_p == NULL)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "store handle or output pointer is NULL");
    if ((st = check_key(key, err)) != LOOM_SUCCESS ||
        (st = check_value("expected value", expected, elen, err)) != LOOM_SUCCESS ||
        (st = check_value("desired value", desired, dlen, err)) != LOOM_SUCCESS)
        return st;
    loom_err_clear(&inner);
    pthread_mutex_lock(&s->mu);
    st = s->ops->cas(s->impl, key, expected, elen, desired, dlen, &val, &len, &inner);
    pthread_mutex_unlock(&s->mu);
    if (st != LOOM_SUCCESS)
        return forward(err, &inner, st);
    *value_p = val;
    *len_p = len;
    return LOOM_SUCCESS;
}

loom_status_t loom_store_delete(loom_store_t *s, const char *key, int *existed_p,
                                loom_err_t *err)
{
    loom_status_t st;
    loom_err_t inner;
    int existed;

    if (s == NULL)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "store handle is NULL");
    if ((st = check_key(key, err)) != LOOM_SUCCESS)
        return st;
    loom_err_clear(&inner);
    pthread_mutex_lock(&s->mu);
    st = s->ops->del(s->impl, key, &existed, &inner);
    pthread_mutex_unlock(&s->mu);
    if (st != LOOM_SUCCESS)
        return forward(err, &inner, st);
    if (existed_p != NULL)
        *existed_p = existed;
    return LOOM_SUCCESS;
}

int loom_store_fd_local_host(int fd, char *host, size_t hostlen)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char buf[NI_MAXHOST];

    if (fd < 0 || getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
        return -1;
    if (getnameinfo((struct sockaddr *)&ss, sl, buf, sizeof(buf), NULL, 0, NI_NUMERICHOST) != 0)
        return -1;
    if (strlen(buf) >= hostlen)
        return -1;
    strcpy(host, buf);
    return 0;
}

int loom_store_local_host(loom_store_t *s, char *host, size_t hostlen)
{
    if (s == NULL || host == NULL || hostlen == 0 || s->ops->local_host == NULL)
        return -1;
    pthread_mutex_lock(&s->mu);
    int rc = s->ops->local_host(s->impl, host, hostlen);
    pthread_mutex_unlock(&s->mu);
    return rc;
}
