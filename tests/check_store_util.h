/* check_store_util.h - assertions on a store shared by the store suites
 * (check_store.c for tcp:// and file://, check_store_redis.c for redis://). */
#ifndef LOOM_CHECK_STORE_UTIL_H
#define LOOM_CHECK_STORE_UTIL_H

#include <stddef.h>
#include "store.h"

/* Generous: the suites also run under valgrind. */
#define LONG_TIMEOUT 20.0

loom_store_t *open_uri(const char *uri);
void put(loom_store_t *s, const char *key, const void *val, size_t len);
void put_str(loom_store_t *s, const char *key, const char *val);
/* Get key and check that it holds exactly want[0..wlen). */
void expect(loom_store_t *s, const char *key, const void *want, size_t wlen);
void expect_str(loom_store_t *s, const char *key, const char *want);
void expect_absent(loom_store_t *s, const char *key);

#endif
