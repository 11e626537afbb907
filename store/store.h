/* store.h - the rendezvous key-value store: set, get, wait, add, compare-and-set,
 * delete. Backends: tcp:// (store/tcp_client.c; the server, store/tcp_server.c,
 * runs in rank 0, loomrun or loom-store), file:// (store/file.c, a shared
 * directory) and redis:// (store/redis.c, a redis server). All calls are
 * thread-safe and bounded in time; a timeout message names the keys that never
 * appeared. Calls on
 * one handle are serialised (a wait holds up the other calls on that handle), so
 * threads that must not wait for each other use separate handles. */
#ifndef LOOM_STORE_H
#define LOOM_STORE_H

#include <stddef.h>
#include <stdint.h>
#include "base/clock.h"
#include "base/error.h"

typedef struct loom_store loom_store_t;

/* Open uri. For tcp://host:port, rank 0 (and only rank 0) serves the store in a
 * background thread when it can bind host:port locally; if the port is already
 * taken (loomrun or loom-store serves it) rank 0 connects as a client like the
 * others. rank < 0 means "client only". Connecting retries until timeout_s. */
loom_status_t loom_store_open(const char *uri, int rank, double timeout_s, loom_err_t *err,
                              loom_store_t **store_p);
/* The same with LOOM_AUTH_KEY (keylen 0: none): a tcp:// store must take the
 * client's proof of it (rank 0 serves its store requiring it), and the signed
 * calls below seal and check values with it. */
loom_status_t loom_store_open_key(const char *uri, int rank, double timeout_s, const void *key,
                                  size_t keylen, loom_err_t *err, loom_store_t **store_p);
void loom_store_close(loom_store_t *s);

/* The caller's callbacks as a store (store/cb.c): loom_comm_create_with_store.
 * key/keylen (LOOM_AUTH_KEY, keylen 0: none) sign and check values as for
 * loom_store_open_key; the callbacks never see the key. */
loom_status_t loom_store_open_callbacks(const loom_store_callbacks_t *cb, const void *key,
                                        size_t keylen, loom_err_t *err, loom_store_t **store_p);

/* Keys are NUL-terminated strings of at most 1024 bytes; values are bytes. */
loom_status_t loom_store_set(loom_store_t *s, const char *key, const void *val, size_t len,
                             loom_err_t *err);
/* Wait until key exists (at most timeout_s), then return a malloc'ed copy of its
 * value (caller frees) with an extra NUL byte after it for convenience. */
loom_status_t loom_store_get(loom_store_t *s, const char *key, void **val_p, size_t *len_p,
                             double timeout_s, loom_err_t *err);
/* One look, no waiting (one round trip where get would take two): *found_p
 * says whether key exists; if so, *val_p is as for loom_store_get. For
 * callers that poll a value now and then. */
loom_status_t loom_store_try_get(loom_store_t *s, const char *key, void **val_p, size_t *len_p,
                                 int *found_p, loom_err_t *err);
/* Wait until every key exists. On timeout the message lists the missing keys. */
loom_status_t loom_store_wait(loom_store_t *s, const char *const *keys, size_t nkeys,
                              double timeout_s, loom_err_t *err);
/* Values a rank publishes for others to trust (addresses, host ids,
 * membership): with the handle's key they carry an HMAC-SHA256 over the key
 * name and the value, so a file:// or redis:// store, or anyone who can write
 * to it, cannot forge them. get_signed fails with LOOM_ERR_AUTH naming
 * LOOM_AUTH_KEY when the MAC is missing or wrong, or when the value is signed
 * and this handle has no key. Without a key on either side they are plain set
 * and get. */
loom_status_t loom_store_set_signed(loom_store_t *s, const char *key, const void *val,
                                    size_t len, loom_err_t *err);
loom_status_t loom_store_get_signed(loom_store_t *s, const char *key, void **val_p,
                                    size_t *len_p, double timeout_s, loom_err_t *err);
/* The bytes set_signed would store for val under key (malloc'ed; the value
 * itself, copied, without a key), for callers that store them otherwise (CAS). */
loom_status_t loom_store_sign(loom_store_t *s, const char *key, const void *val, size_t len,
                              void **out_p, size_t *outlen_p, loom_err_t *err);
/* Check and strip the signature of a value got otherwise (loom_store_get). On
 * success *val_p and *len_p point into val, past the signature. */
loom_status_t loom_store_verify(loom_store_t *s, const char *key, const void *val, size_t len,
                                const void **val_p, size_t *len_p, loom_err_t *err);
/* Atomically add delta to the integer stored at key (absent counts as 0) and
 * return the new value. */
loom_status_t loom_store_add(loom_store_t *s, const char *key, int64_t delta, int64_t *value_p,
                             loom_err_t *err);
/* Atomically: if key's value equals expected (or key is absent and elen == 0),
 * set it to desired. Returns the value after the operation (malloc'ed). */
loom_status_t loom_store_cas(loom_store_t *s, const char *key, const void *expected, size_t elen,
                             const void *desired, size_t dlen, void **value_p, size_t *len_p,
                             loom_err_t *err);
/* Delete key; *existed_p (may be NULL) tells whether it was there. */
loom_status_t loom_store_delete(loom_store_t *s, const char *key, int *existed_p,
                                loom_err_t *err);
/* Local address (numeric host) of the connection to a tcp:// store, so the
 * transport can listen on the interface that reaches the other ranks. Returns
 * 0 and fills host, or -1 (file:// store, or unknown). */
int loom_store_local_host(loom_store_t *s, char *host, size_t hostlen);
/* The numeric local address of connected socket fd, for backends' local_host. */
int loom_store_fd_local_host(int fd, char *host, size_t hostlen);

/* ---- The tcp:// server, used by rank 0, loomrun and loom-store. ---------- */
typedef struct loom_store_server loom_store_server_t;
/* Listen on host:port (port 0: any free port; host NULL: all interfaces) and
 * serve from a background thread until stopped. */
loom_status_t loom_store_server_start(const char *host, int port, loom_err_t *err,
                                      loom_store_server_t **srv_p);
/* The same, requiring LOOM_AUTH_KEY (key, keylen > 0) of every client before
 * anything is served (loomrun, loom-store --auth-key-file). */
loom_status_t loom_store_server_start_auth(const char *host, int port, const void *key,
                                           size_t keylen, loom_err_t *err,
                                           loom_store_server_t **srv_p);
int loom_store_server_port(const loom_store_server_t *srv);
void loom_store_server_stop(loom_store_server_t *srv);

/* ---- Backend ops table (store/tcp_client.c, store/file.c, store/redis.c). - */
typedef struct loom_store_ops {
    size_t size;
    const char *scheme;  /* "tcp", "file", "redis" */
    loom_status_t (*open)(const char *rest, int rank, double timeout_s, loom_err_t *err,
                          void **impl_p);
    void (*close)(void *impl);
    loom_status_t (*set)(void *impl, const char *key, const void *val, size_t len, loom_err_t *err);
    /* non-blocking: *found_p = 0 when the key is absent */
    loom_status_t (*try_get)(void *impl, const char *key, void **val_p, size_t *len_p,
                             int *found_p, loom_err_t *err);
    /* block until key exists or timeout_s passes (LOOM_ERR_TIMEOUT) */
    loom_status_t (*wait)(void *impl, const char *key, double timeout_s, loom_err_t *err);
    loom_status_t (*add)(void *impl, const char *key, int64_t delta, int64_t *value_p,
                         loom_err_t *err);
    loom_status_t (*cas)(void *impl, const char *key, const void *expected, size_t elen,
                         const void *desired, size_t dlen, void **value_p, size_t *len_p,
                         loom_err_t *err);
    loom_status_t (*del)(void *impl, const char *key, int *existed_p, loom_err_t *err);
    int (*local_host)(void *impl, char *host, size_t hostlen);
    /* open with LOOM_AUTH_KEY (tcp://: the hello proves it); NULL: the backend has
     * no handshake of its own, and open serves. */
    loom_status_t (*open_key)(const char *rest, int rank, double timeout_s, const void *key,
                              size_t keylen, loom_err_t *err, void **impl_p);
} loom_store_ops_t;

extern const loom_store_ops_t loom_store_tcp_ops;
extern const loom_store_ops_t loom_store_file_ops;
/* redis://host:port[/prefix] (store/redis.c), built when configure found hiredis. */
extern const loom_store_ops_t loom_store_redis_ops;

/* A store over an open backend instance impl (named name in messages), whose
 * signed calls use key (keylen 0: none); takes impl: on failure it is closed. */
loom_status_t loom_store_wrap(const loom_store_ops_t *ops, void *impl, const char *name,
                              const void *key, size_t keylen, loom_err_t *err,
                              loom_store_t **store_p);

/* ---- Helpers shared by store.c and the backends (internal). --------------- */
#define LOOM_STORE_KEY_MAX   1024u         /* bytes, without the NUL */
#define LOOM_STORE_VALUE_MAX (64u << 20)   /* bytes */

/* Split "host:port" or "[v6addr]:port" into host (brackets removed) and port
 * (0..65535). The message names uri, the full URI, when it is not NULL. */
loom_status_t loom_store_parse_hostport(const char *hostport, const char *uri, char *host,
                                        size_t hostlen, int *port_p, loom_err_t *err);
/* "host:port", or "[host]:port" when host holds a ':' (IPv6). */
void loom_store_format_hostport(const char *host, int port, char *buf, size_t buflen);
/* Strict decimal int64 ("-12"; no spaces, no '+', no empty string): 0, or -1. */
int loom_store_parse_int64(const void *buf, size_t len, int64_t *value_p);

#endif
