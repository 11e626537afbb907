/* proto.h - the wire protocol of the tcp:// store (store/tcp_client.c,
 * store/tcp_server.c; encoded by store/proto.c).
 *
 * One TCP connection per client; all integers big-endian.
 *
 * Hello, 16 bytes each way, client first:
 *     "LOOMSTOR" | u32 version | u32 word
 * The client's word is 0; the server answers with its own version and word
 * LOOM_STORE_HELLO_OK, or LOOM_STORE_HELLO_REFUSED (then closes) when it does not
 * speak the client's version. Anything else back means the port is served by
 * something that is not a Loom store (torch's TCPStore on MASTER_PORT, say).
 *
 * With LOOM_AUTH_KEY the client's word is LOOM_STORE_HELLO_AUTH and its nonce
 * (16 bytes) follows. A server that holds a key answers LOOM_STORE_HELLO_CHALLENGE
 * followed by its nonce (16) and its proof (32), HMAC-SHA256(key, "LOOMSTOR-S"
 * || client nonce || server nonce); the client checks it and sends its own
 * proof (32, role "LOOMSTOR-C"); the server answers OK, or
 * LOOM_STORE_HELLO_REFUSED_AUTH and closes. A server with a key answers a
 * client without one LOOM_STORE_HELLO_AUTH_REQUIRED and closes: nothing is
 * served before the proof. A server without a key reads the nonce and
 * answers OK (values published for other ranks carry their own MACs, store.h).
 *
 * Then strictly one request, one response, in order:
 *     request  (24 bytes): u32 op | u32 klen | u32 alen | u32 blen | u64 arg,
 *                          then klen key bytes (no NUL), alen bytes, blen bytes
 *     response (16 bytes): u32 rc | u32 vlen | u64 arg, then vlen value bytes
 *
 *     op      a          b         arg in          response
 *     SET     value      -         -               OK
 *     GET     -          -         -               OK + value | NOT_FOUND
 *     WAIT    -          -         timeout (ms)    OK | TIMEOUT (server parks it)
 *     ADD     -          -         delta (int64)   OK, arg = new value | NOT_INTEGER | OVERFLOW
 *     CAS     expected   desired   -               OK + value after the operation
 *     DELETE  -          -         -               OK, arg = 1 if the key existed
 *
 * SET, CAS and ADD may also answer FULL: the server holds as much as its
 * LOOM_STORE_MAX_BYTES allows (the request's payload was read and dropped).
 * ADD stores the sum as decimal text, so GET returns "5". For CAS an absent key
 * reads as the empty value. Lengths are checked on both sides against
 * LOOM_STORE_KEY_MAX and LOOM_STORE_VALUE_MAX; the server drops a client whose
 * request breaks the rules instead of answering it. */
#ifndef LOOM_STORE_PROTO_H
#define LOOM_STORE_PROTO_H

#include <stdint.h>
#include "base/settings.h"
#include "store.h"

#define LOOM_STORE_MAGIC         "LOOMSTOR"
#define LOOM_STORE_MAGIC_LEN     8
#define LOOM_STORE_PROTO_VERSION 1u
#define LOOM_STORE_HELLO_LEN     16
#define LOOM_STORE_REQ_LEN       24
#define LOOM_STORE_RESP_LEN      16

enum {
    LOOM_STORE_HELLO_OK = 0,
    LOOM_STORE_HELLO_REFUSED = 1,
    LOOM_STORE_HELLO_AUTH = 2,            /* client: I hold a key, my nonce follows */
    LOOM_STORE_HELLO_CHALLENGE = 3,       /* server: my nonce and proof follow */
    LOOM_STORE_HELLO_AUTH_REQUIRED = 4,   /* server: prove LOOM_AUTH_KEY first */
    LOOM_STORE_HELLO_REFUSED_AUTH = 5,    /* server: your proof is wrong */
};
#define LOOM_STORE_NONCE_LEN 16
#define LOOM_STORE_PROOF_LEN 32

/* HMAC-SHA256(key, role || client nonce || server nonce); role 'S' or 'C'. */
void loom_store_auth_proof(const void *key, size_t keylen, char role,
                           const uint8_t nonce_c[LOOM_STORE_NONCE_LEN],
                           const uint8_t nonce_s[LOOM_STORE_NONCE_LEN],
                           uint8_t out[LOOM_STORE_PROOF_LEN]);

enum {
    LOOM_STORE_OP_SET = 1,
    LOOM_STORE_OP_GET,
    LOOM_STORE_OP_WAIT,
    LOOM_STORE_OP_ADD,
    LOOM_STORE_OP_CAS,
    LOOM_STORE_OP_DELETE,
};

enum {
    LOOM_STORE_RC_OK = 0,
    LOOM_STORE_RC_NOT_FOUND,
    LOOM_STORE_RC_TIMEOUT,
    LOOM_STORE_RC_NOT_INTEGER,
    LOOM_STORE_RC_OVERFLOW,
    LOOM_STORE_RC_FULL,
};

typedef struct loom_store_req {
    uint32_t op, klen, alen, blen;
    uint64_t arg;
} loom_store_req_t;

typedef struct loom_store_resp {
    uint32_t rc, vlen;
    uint64_t arg;
} loom_store_resp_t;

void loom_store_hello_pack(uint8_t out[LOOM_STORE_HELLO_LEN], uint32_t version, uint32_t word);
void loom_store_req_pack(uint8_t out[LOOM_STORE_REQ_LEN], const loom_store_req_t *req);
void loom_store_resp_pack(uint8_t out[LOOM_STORE_RESP_LEN], const loom_store_resp_t *resp);
/* Decode and validate a request header: known op, 1 <= klen <= LOOM_STORE_KEY_MAX,
 * payload lengths within LOOM_STORE_VALUE_MAX and allowed for the op.
 * 0 and *req_p set, or -1. */
int loom_store_req_unpack(const uint8_t in[LOOM_STORE_REQ_LEN], loom_store_req_t *req_p);
/* Decode and validate a response header to a request of type op: a return code
 * that op can get, vlen within LOOM_STORE_VALUE_MAX and only where op returns a
 * value. 0 and *resp_p set, or -1. */
int loom_store_resp_unpack(const uint8_t in[LOOM_STORE_RESP_LEN], uint32_t op,
                           loom_store_resp_t *resp_p);

/* loom_store_server_start with explicit limits (NULL: from the environment). */
loom_status_t loom_store_server_start_limits(const char *host, int port,
                                             const loom_store_limits_t *lim, int *sys_errno_p,
                                             loom_err_t *err, loom_store_server_t **srv_p);

/* loom_store_server_start that also tells, in *sys_errno_p, why it could not
 * listen (EADDRINUSE: someone serves the port already; EADDRNOTAVAIL: host is
 * not an address of this machine or does not resolve), 0 otherwise. */
loom_status_t loom_store_server_start_errno(const char *host, int port, int *sys_errno_p,
                                            loom_err_t *err, loom_store_server_t **srv_p);
/* The same, for a server that requires key (keylen > 0) of every client. */
loom_status_t loom_store_server_start_key(const char *host, int port, const void *key,
                                          size_t keylen, int *sys_errno_p, loom_err_t *err,
                                          loom_store_server_t **srv_p);
/* Both: a key (keylen 0: none) and explicit limits (NULL: from the environment). */
loom_status_t loom_store_server_start_opts(const char *host, int port, const void *key,
                                           size_t keylen, const loom_store_limits_t *lim,
                                           int *sys_errno_p, loom_err_t *err,
                                           loom_store_server_t **srv_p);

#endif
