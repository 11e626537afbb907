/* cb.c - a store made of the caller's callbacks (loom_store_callbacks_t,
 * loom_comm_create_with_store): torch.distributed's c10d::Store, or any other
 * key-value service a framework already rendezvouses through. store.c does the
 * argument checks, locking and messages, as for the URI backends; this file
 * maps the backend's ops onto the callbacks and their messages onto loom_err_t. */
#include <stdlib.h>
#include <string.h>

#include "store.h"

typedef struct cb_store {
    loom_store_callbacks_t cb;
} cb_store_t;

/* The callback's status and message as the store's error: a callback that
 * failed without a message still says which call and key failed. */
static loom_status_t cb_fail(loom_err_t *err, loom_status_t st, const char *call, const char *key,
                             const char *msg)
{
    if (st == LOOM_SUCCESS)
        st = LOOM_ERR_INTERNAL;
    if (msg[0])
        return loom_err_set(err, st, "%s", msg);
    return loom_err_set(err, st, "the caller's store failed to %s key '%s': %s", call, key,
                        loom_strerror(st));
}

static void cb_close(void *impl)
{
    cb_store_t *s = impl;
    if (s->cb.release)
        s->cb.release(s->cb.ctx);
    free(s);
}

static loom_status_t cb_set(void *impl, const char *key, const void *val, size_t len,
                            loom_err_t *err)
{
    cb_store_t *s = impl;
    char msg[LOOM_ERRMSG_MAX] = "";
    loom_status_t st = s->cb.set(s->cb.ctx, key, val, len, msg, sizeof(msg));
    msg[sizeof(msg) - 1] = '\0';
    return st == LOOM_SUCCESS ? st : cb_fail(err, st, "set", key, msg);
}

static loom_status_t cb_try_get(void *impl, const char *key, void **val_p, size_t *len_p,
                                int *found_p, loom_err_t *err)
{
    cb_store_t *s = impl;
    char msg[LOOM_ERRMSG_MAX] = "";
    void *val = NULL;
    size_t len = 0;
    loom_status_t st = s->cb.get(s->cb.ctx, key, 0.0, &val, &len, msg, sizeof(msg));
    msg[sizeof(msg) - 1] = '\0';
    if (st == LOOM_ERR_TIMEOUT) {
        free(val);
        *found_p = 0;
        return LOOM_SUCCESS;
    }
    if (st != LOOM_SUCCESS) {
        free(val);
        return cb_fail(err, st, "get", key, msg);
    }
    /* store.h promises a NUL after the value; the callback's malloc did not. */
    void *copy = malloc(len + 1);
    if (copy == NULL) {
        free(val);
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory reading store key '%s'",
                            key);
    }
    if (len)
        memcpy(copy, val, len);
    ((char *)copy)[len] = '\0';
    free(val);
    *val_p = copy;
    *len_p = len;
    *found_p = 1;
    return LOOM_SUCCESS;
}

static loom_status_t cb_wait(void *impl, const char *key, double timeout_s, loom_err_t *err)
{
    cb_store_t *s = impl;
    char msg[LOOM_ERRMSG_MAX] = "";
    loom_status_t st;
    if (s->cb.wait) {
        st = s->cb.wait(s->cb.ctx, key, timeout_s, msg, sizeof(msg));
    } else {
        void *val = NULL;
        size_t len = 0;
        st = s->cb.get(s->cb.ctx, key, timeout_s, &val, &len, msg, sizeof(msg));
        free(val);
    }
    msg[sizeof(msg) - 1] = '\0';
    if (st == LOOM_ERR_TIMEOUT)   /* store.c names the missing keys */
        return loom_err_set(err, st, "timed out");
    return st == LOOM_SUCCESS ? st : cb_fail(err, st, "wait for", key, msg);
}

static loom_status_t cb_add(void *impl, const char *key, int64_t delta, int64_t *value_p,
                            loom_err_t *err)
{
    cb_store_t *s = impl;
    char msg[LOOM_ERRMSG_MAX] = "";
    loom_status_t st = s->cb.add(s->cb.ctx, key, delta, value_p, msg, sizeof(msg));
    msg[sizeof(msg) - 1] = '\0';
    return st == LOOM_SUCCESS ? st : cb_fail(err, st, "add to", key, msg);
}

static loom_status_t cb_cas(void *impl, const char *key, const void *expected, size_t elen,
                            const void *desired, size_t dlen, void **value_p, size_t *len_p,
                            loom_err_t *err)
{
    (void)impl, (void)expected, (void)elen, (void)desired, (void)dlen, (void)value_p,
        (void)len_p;
    /* Only elastic membership compares and sets, and it opens its own store. */
    return loom_err_set(err, LOOM_ERR_UNSUPPORTED,
                        "the caller's store has no compare-and-set (key '%s')", key);
}

static loom_status_t cb_del(void *impl, const char *key, int *existed_p, loom_err_t *err)
{
    cb_store_t *s = impl;
    char msg[LOOM_ERRMSG_MAX] = "";
    if (s->cb.del == NULL) {
        *existed_p = 0;
        return LOOM_SUCCESS;
    }
    loom_status_t st = s->cb.del(s->cb.ctx, key, existed_p, msg, sizeof(msg));
    msg[sizeof(msg) - 1] = '\0';
    return st == LOOM_SUCCESS ? st : cb_fail(err, st, "delete", key, msg);
}

static const loom_store_ops_t cb_ops = {
    .size = sizeof(loom_store_ops_t),
    .scheme = "callbacks",
    .open = NULL,
    .close = cb_close,
    .set = cb_set,
    .try_get = cb_try_get,
    .wait = cb_wait,
    .add = cb_add,
    .cas = cb_cas,
    .del = cb_del,
    .local_host = NULL,
};

loom_status_t loom_store_open_callbacks(const loom_store_callbacks_t *cb, const void *key,
                                        size_t keylen, loom_err_t *err, loom_store_t **store_p)
{
    loom_store_callbacks_t in;
    memset(&in, 0, sizeof(in));
    if (cb == NULL)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "store callbacks are NULL");
    /* Read only the fields the caller's version of the struct has. */
    size_t n = cb->struct_size < sizeof(in) ? cb->struct_size : sizeof(in);
    memcpy(&in, cb, n);
    if (n < offsetof(loom_store_callbacks_t, del) || in.set == NULL || in.get == NULL ||
        in.add == NULL) {
        if (n >= offsetof(loom_store_callbacks_t, release) + sizeof(in.release) && in.release)
            in.release(in.ctx);
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "store callbacks: set, get and add are required (struct_size %zu)",
                            cb->struct_size);
    }
    cb_store_t *s = malloc(sizeof(*s));
    if (s == NULL) {
        if (in.release)
            in.release(in.ctx);
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory opening the caller's store");
    }
    s->cb = in;
    /* The caller's store is as open to others as any file:// or redis:// one
     * (torch's TCPStore takes any client), so the records read through it are
     * signed and checked with LOOM_AUTH_KEY like theirs. */
    return loom_store_wrap(&cb_ops, s, "the caller's store", key, keylen, err, store_p);
}
