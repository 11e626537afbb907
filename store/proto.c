/* proto.c - the tcp:// store's wire encoding (store/proto.h): packing and
 * checking the fixed headers, and the proofs of the LOOM_AUTH_KEY handshake.
 * Used by the client (store/tcp_client.c) and the server (store/tcp_server.c). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <string.h>

#include "base/crypto.h"
#include "store.h"
#include "proto.h"
#include "tcp_int.h"

void loom_store_auth_proof(const void *key, size_t keylen, char role,
                           const uint8_t nonce_c[LOOM_STORE_NONCE_LEN],
                           const uint8_t nonce_s[LOOM_STORE_NONCE_LEN],
                           uint8_t out[LOOM_STORE_PROOF_LEN])
{
    const char tag[10] = {'L', 'O', 'O', 'M', 'S', 'T', 'O', 'R', '-', role};
    const void *parts[3] = {tag, nonce_c, nonce_s};
    const size_t lens[3] = {sizeof(tag), LOOM_STORE_NONCE_LEN, LOOM_STORE_NONCE_LEN};
    loom_hmac_sha256(key, keylen, parts, lens, 3, out);
}

void loom_store_hello_pack(uint8_t out[LOOM_STORE_HELLO_LEN], uint32_t version, uint32_t word)
{
    memcpy(out, LOOM_STORE_MAGIC, LOOM_STORE_MAGIC_LEN);
    put32(out + 8, version);
    put32(out + 12, word);
}

void loom_store_req_pack(uint8_t out[LOOM_STORE_REQ_LEN], const loom_store_req_t *req)
{
    put32(out, req->op);
    put32(out + 4, req->klen);
    put32(out + 8, req->alen);
    put32(out + 12, req->blen);
    put64(out + 16, req->arg);
}

void loom_store_resp_pack(uint8_t out[LOOM_STORE_RESP_LEN], const loom_store_resp_t *resp)
{
    put32(out, resp->rc);
    put32(out + 4, resp->vlen);
    put64(out + 8, resp->arg);
}

int loom_store_req_unpack(const uint8_t in[LOOM_STORE_REQ_LEN], loom_store_req_t *req_p)
{
    loom_store_req_t r = {
        .op = get32(in), .klen = get32(in + 4), .alen = get32(in + 8),
        .blen = get32(in + 12), .arg = get64(in + 16),
    };

    if (r.klen == 0 || r.klen > LOOM_STORE_KEY_MAX)
        return -1;
    if (r.alen > LOOM_STORE_VALUE_MAX || r.blen > LOOM_STORE_VALUE_MAX)
        return -1;
    switch (r.op) {
    case LOOM_STORE_OP_SET:
        if (r.blen != 0)
            return -1;
        break;
    case LOOM_STORE_OP_CAS:
        break;
    case LOOM_STORE_OP_GET:
    case LOOM_STORE_OP_WAIT:
    case LOOM_STORE_OP_ADD:
    case LOOM_STORE_OP_DELETE:
        if (r.alen != 0 || r.blen != 0)
            return -1;
        break;
    default:
        return -1;
    }
    *req_p = r;
    return 0;
}

int loom_store_resp_unpack(const uint8_t in[LOOM_STORE_RESP_LEN], uint32_t op,
                           loom_store_resp_t *resp_p)
{
    loom_store_resp_t r = { .rc = get32(in), .vlen = get32(in + 4), .arg = get64(in + 8) };
    int ok;

    switch (op) {
    case LOOM_STORE_OP_GET:
        ok = r.rc == LOOM_STORE_RC_OK || r.rc == LOOM_STORE_RC_NOT_FOUND;
        break;
    case LOOM_STORE_OP_WAIT:
        ok = r.rc == LOOM_STORE_RC_OK || r.rc == LOOM_STORE_RC_TIMEOUT;
        break;
    case LOOM_STORE_OP_ADD:
        ok = r.rc == LOOM_STORE_RC_OK || r.rc == LOOM_STORE_RC_NOT_INTEGER ||
             r.rc == LOOM_STORE_RC_OVERFLOW || r.rc == LOOM_STORE_RC_FULL;
        break;
    case LOOM_STORE_OP_SET:
    case LOOM_STORE_OP_CAS:
        ok = r.rc == LOOM_STORE_RC_OK || r.rc == LOOM_STORE_RC_FULL;
        break;
    case LOOM_STORE_OP_DELETE:
        ok = r.rc == LOOM_STORE_RC_OK;
        break;
    default:
        ok = 0;
    }
    if (!ok || r.vlen > LOOM_STORE_VALUE_MAX)
        return -1;
    int has_value = (op == LOOM_STORE_OP_GET || op == LOOM_STORE_OP_CAS) &&
                    r.rc == LOOM_STORE_RC_OK;
    if (r.vlen != 0 && !has_value)
        return -1;
    *resp_p = r;
    return 0;
}
