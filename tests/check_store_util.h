/* check_store_util.h - what the store suites share: assertions on a store,
 * and a redis-server of their own. check_store.c runs one body per test over
 * every backend (tcp://, file://, redis://); check_store_redis.c holds what
 * only redis:// has. */
#ifndef LOOM_CHECK_STORE_UTIL_H
#define LOOM_CHECK_STORE_UTIL_H

#include <stddef.h>
#include <sys/types.h>
#include "store/store.h"

/* Generous: the suites also run under valgrind. */
#define LONG_TIMEOUT 20.0

loom_store_t *open_uri(const char *uri);
void put(loom_store_t *s, const char *key, const void *val, size_t len);
void put_str(loom_store_t *s, const char *key, const char *val);
/* Get key and check that it holds exactly want[0..wlen). */
void expect(loom_store_t *s, const char *key, const void *want, size_t wlen);
void expect_str(loom_store_t *s, const char *key, const char *want);
void expect_absent(loom_store_t *s, const char *key);

/* A socket bound to 127.0.0.1:port and not listening: connections to that
 * port are refused, and nobody else can take the port meanwhile. */
int reserve_port(int *port_p);

/* One inline redis command to 127.0.0.1:port; the first line of the answer
 * without its CRLF in line. 0 on success. */
int raw_command(int port, const char *cmd, char *line, size_t linelen);

typedef struct redis_server {
    pid_t pid;
    int port;
    char uri[96];   /* redis://127.0.0.1:port, no prefix */
} redis_server_t;

/* Start redis-server on port (0: a free one) with extra options (NULL-ended),
 * killed with the test process, and wait until it answers. */
void redis_start(redis_server_t *s, int port, const char *const *extra);
void redis_stop(redis_server_t *s);
/* Whether redis-server is on PATH. */
int have_redis_server(void);

#endif
