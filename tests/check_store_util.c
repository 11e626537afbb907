#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "check_store_util.h"

loom_store_t *open_uri(const char *uri)
{
    loom_err_t err;
    loom_store_t *s = NULL;
    loom_err_clear(&err);
    ck_assert_msg(loom_store_open(uri, -1, LONG_TIMEOUT, &err, &s) == LOOM_SUCCESS,
                  "open %s: %s", uri, err.msg);
    ck_assert_ptr_nonnull(s);
    return s;
}

void put(loom_store_t *s, const char *key, const void *val, size_t len)
{
    loom_err_t err;
    loom_err_clear(&err);
    ck_assert_msg(loom_store_set(s, key, val, len, &err) == LOOM_SUCCESS, "set %s: %s", key,
                  err.msg);
}

void put_str(loom_store_t *s, const char *key, const char *val)
{
    put(s, key, val, strlen(val));
}

void expect(loom_store_t *s, const char *key, const void *want, size_t wlen)
{
    loom_err_t err;
    void *val = NULL;
    size_t len = 0;
    loom_err_clear(&err);
    ck_assert_msg(loom_store_get(s, key, &val, &len, LONG_TIMEOUT, &err) == LOOM_SUCCESS,
                  "get %s: %s", key, err.msg);
    ck_assert_uint_eq(len, wlen);
    ck_assert(memcmp(val, want, wlen) == 0);
    ck_assert_int_eq(((char *)val)[len], '\0');
    free(val);
}

void expect_str(loom_store_t *s, const char *key, const char *want)
{
    expect(s, key, want, strlen(want));
}

void expect_absent(loom_store_t *s, const char *key)
{
    loom_err_t err;
    const char *keys[1] = { key };
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_wait(s, keys, 1, 0.0, &err), LOOM_ERR_TIMEOUT);
}
