#include <stdio.h>
#include <string.h>

#include "base/coll_kind.h"
#include "base/crypto.h"
#include "base/types.h"
#include "base/byteorder.h"
#include "wire.h"

void loom_hello_encode(const loom_hello_t *h, uint8_t out[LOOM_HELLO_BYTES])
{
    memcpy(out, LOOM_HELLO_MAGIC, 8);
    loom_put32(out + 8, h->version);
    loom_put32(out + 12, h->rank);
    loom_put32(out + 16, h->size);
    loom_put32(out + 20, h->stream);
    loom_put64(out + 24, h->job_hash);
    loom_put64(out + 32, h->comm_hash);
}

loom_ack_code_t loom_hello_decode(const uint8_t in[LOOM_HELLO_BYTES], uint64_t job_hash,
                                  uint64_t comm_hash, int my_rank, int size, loom_hello_t *h)
{
    if (memcmp(in, LOOM_HELLO_MAGIC, 8) != 0)
        return LOOM_ACK_BAD_MAGIC;
    h->version = loom_get32(in + 8);
    h->rank = loom_get32(in + 12);
    h->size = loom_get32(in + 16);
    h->stream = loom_get32(in + 20);
    h->job_hash = loom_get64(in + 24);
    h->comm_hash = loom_get64(in + 32);
    if (h->version != LOOM_WIRE_VERSION)
        return LOOM_ACK_BAD_VERSION;
    if (h->job_hash != job_hash || h->comm_hash != comm_hash)
        return LOOM_ACK_OTHER_JOB;
    if (h->size != (uint32_t)size)
        return LOOM_ACK_BAD_SIZE;
    if (h->rank >= (uint32_t)size || h->rank == (uint32_t)my_rank)
        return LOOM_ACK_BAD_RANK;
    return LOOM_ACK_OK;
}

void loom_ack_encode(loom_ack_code_t code, uint32_t rank, uint8_t out[LOOM_ACK_BYTES])
{
    memcpy(out, LOOM_ACK_MAGIC, 8);
    loom_put32(out + 8, (uint32_t)code);
    loom_put32(out + 12, rank);
}

int loom_ack_decode(const uint8_t in[LOOM_ACK_BYTES], loom_ack_code_t *code, uint32_t *rank)
{
    if (memcmp(in, LOOM_ACK_MAGIC, 8) != 0)
        return -1;
    uint32_t c = loom_get32(in + 8);
    if (c > LOOM_ACK_CIPHER)
        return -1;
    *code = (loom_ack_code_t)c;
    *rank = loom_get32(in + 12);
    return 0;
}

const char *loom_ack_reason(loom_ack_code_t code)
{
    switch (code) {
    case LOOM_ACK_OK: return "accepted";
    case LOOM_ACK_BAD_MAGIC: return "not a Loom handshake";
    case LOOM_ACK_BAD_VERSION:
        return "different Loom wire protocol version (a rank of another Loom release: every rank "
               "must run the same one)";
    case LOOM_ACK_OTHER_JOB: return "belongs to another job or communicator";
    case LOOM_ACK_BAD_RANK: return "rank out of range or equal to the acceptor's";
    case LOOM_ACK_BAD_SIZE: return "disagrees on the communicator size";
    case LOOM_ACK_DUPLICATE: return "rank already connected";
    case LOOM_ACK_AUTH:
        return "authentication failed: LOOM_AUTH_KEY differs, or is set on one side only";
    case LOOM_ACK_MAC_MODE:
        return "LOOM_AUTH_MAC differs (full, headers or encrypt: set it the same on every rank)";
    case LOOM_ACK_STREAMS:
        return "LOOM_SOCKETS_PER_PEER differs (or a stream index out of range)";
    case LOOM_ACK_CIPHER:
        return "the ranks chose different ciphers (LOOM_AUTH_CIPHER, or auto on CPUs with and "
               "without AES instructions): set LOOM_AUTH_CIPHER the same on every rank";
    }
    return "unknown reason";
}

void loom_frame_encode(const loom_frame_t *f, uint8_t out[LOOM_FRAME_BYTES])
{
    loom_put32(out, LOOM_FRAME_MAGIC);
    out[4] = f->kind;
    out[5] = out[6] = out[7] = 0;
    loom_put32(out + 8, f->match.desc);
    loom_put32(out + 12, 0);
    loom_put64(out + 16, f->match.tag);
    loom_put64(out + 24, f->len);
    loom_put64(out + 32, f->match.total);
}

loom_status_t loom_frame_decode(const uint8_t in[LOOM_FRAME_BYTES], int peer, loom_frame_t *f,
                                loom_err_t *err)
{
    uint32_t magic = loom_get32(in);
    if (magic != LOOM_FRAME_MAGIC)
        return loom_err_set(err, LOOM_ERR_TRANSPORT,
                            "protocol error: rank %d sent a frame with bad magic 0x%08x", peer,
                            magic);
    if (in[4] < LOOM_FRAME_DATA || in[4] > LOOM_FRAME_KEEPALIVE)
        return loom_err_set(err, LOOM_ERR_TRANSPORT,
                            "protocol error: rank %d sent a frame of unknown kind %u", peer, in[4]);
    if (in[5] != 0 || in[6] != 0 || in[7] != 0 || loom_get32(in + 12) != 0)
        return loom_err_set(err, LOOM_ERR_TRANSPORT,
                            "protocol error: rank %d sent a frame with reserved bits set", peer);
    uint64_t len = loom_get64(in + 24);
    if (len > LOOM_FRAME_MAX_LEN)
        return loom_err_set(err, LOOM_ERR_TRANSPORT,
                            "protocol error: rank %d announced a frame of %llu bytes", peer,
                            (unsigned long long)len);
    if ((in[4] == LOOM_FRAME_BYE || in[4] == LOOM_FRAME_GAVE_UP) && len != 0)
        return loom_err_set(err, LOOM_ERR_TRANSPORT,
                            "protocol error: rank %d sent a farewell frame with a payload", peer);
    if (in[4] == LOOM_FRAME_KEEPALIVE && len != 0)
        return loom_err_set(err, LOOM_ERR_TRANSPORT,
                            "protocol error: rank %d sent a keepalive frame with a payload", peer);
    f->kind = in[4];
    f->match.desc = loom_get32(in + 8);
    f->match.tag = loom_get64(in + 16);
    f->len = len;
    f->match.total = loom_get64(in + 32);
    return LOOM_SUCCESS;
}

void loom_stripe_slice(uint64_t len, int nstreams, int k, uint64_t *beg_p, uint64_t *len_p)
{
    uint64_t n = nstreams > 0 ? (uint64_t)nstreams : 1;
    uint64_t part = len / n;
    /* Page-sized slices let each land in its own pages of the receive buffer. */
    if (part >= 4096)
        part &= ~(uint64_t)4095;
    uint64_t beg = part * (uint64_t)k;
    *beg_p = beg;
    *len_p = (uint64_t)k + 1 == n ? len - beg : part;
}

uint32_t loom_desc_make(int coll, int dtype, int op)
{
    return ((uint32_t)(coll & 0xff) << 16) | ((uint32_t)(dtype & 0xff) << 8) |
           (uint32_t)(op & 0xff);
}

const char *loom_desc_str(uint32_t desc, char *buf, size_t len)
{
    unsigned coll = (desc >> 16) & 0xff, dtype = (desc >> 8) & 0xff, op = desc & 0xff;
    const char *cname = coll == 0xff ? "send/recv" : loom_coll_name((loom_coll_t)coll);
    /* The op byte of a call that does not reduce is 0, which would read "sum". */
    int reduces = coll == LOOM_COLL_ALLREDUCE || coll == LOOM_COLL_REDUCE ||
                  coll == LOOM_COLL_REDUCE_SCATTER;
    snprintf(buf, len, "%s %s%s%s", cname, loom_dtype_name((loom_dtype_t)dtype),
             reduces ? " " : "", reduces ? loom_op_name((loom_op_t)op) : "");
    return buf;
}

loom_status_t loom_frame_check(const loom_frame_t *f, const loom_tp_req_t *posted, int my_rank,
                               loom_err_t *err)
{
    char theirs[64], mine[64];
    if (f->match.desc != posted->match.desc)
        return loom_err_set(err, LOOM_ERR_MISMATCH,
                            "mismatch: rank %d is in %s while rank %d is in %s", posted->peer,
                            loom_desc_str(f->match.desc, theirs, sizeof(theirs)), my_rank,
                            loom_desc_str(posted->match.desc, mine, sizeof(mine)));
    if (f->match.total != posted->match.total)
        return loom_err_set(err, LOOM_ERR_MISMATCH,
                            "mismatch in %s: rank %d passed count %llu, rank %d passed %llu",
                            loom_desc_str(f->match.desc, mine, sizeof(mine)), posted->peer,
                            (unsigned long long)f->match.total, my_rank,
                            (unsigned long long)posted->match.total);
    if (f->len != posted->len)
        return loom_err_set(err, LOOM_ERR_MISMATCH,
                            "mismatch in %s: rank %d sent %llu bytes, rank %d expected %zu",
                            loom_desc_str(f->match.desc, mine, sizeof(mine)), posted->peer,
                            (unsigned long long)f->len, my_rank, posted->len);
    return LOOM_SUCCESS;
}

void loom_auth_bind(uint64_t job_hash, uint64_t comm_hash, int size, int connector,
                    const void *cident, size_t cidentlen, int acceptor, const void *aident,
                    size_t aidentlen, uint8_t out[LOOM_BIND_BYTES])
{
    /* Lengths go in too, so that no two pairs of identities hash alike. */
    uint8_t head[48];
    memcpy(head, "LOOMBIND", 8);
    loom_put64(head + 8, job_hash);
    loom_put64(head + 16, comm_hash);
    loom_put32(head + 24, (uint32_t)size);
    loom_put32(head + 28, (uint32_t)connector);
    loom_put32(head + 32, (uint32_t)acceptor);
    loom_put32(head + 36, (uint32_t)cidentlen);
    loom_put64(head + 40, (uint64_t)aidentlen);
    loom_sha256_t s;
    loom_sha256_init(&s);
    loom_sha256_update(&s, head, sizeof(head));
    loom_sha256_update(&s, cident, cidentlen);
    loom_sha256_update(&s, aident, aidentlen);
    loom_sha256_final(&s, out);
}

void loom_auth_proof(const void *key, size_t keylen, char role,
                     const uint8_t hello[LOOM_HELLO_BYTES],
                     const uint8_t nonce_c[LOOM_NONCE_BYTES],
                     const uint8_t nonce_a[LOOM_NONCE_BYTES],
                     const uint8_t bind[LOOM_BIND_BYTES], uint8_t out[32])
{
    const void *parts[5] = {&role, hello, nonce_c, nonce_a, bind};
    const size_t lens[5] = {1, LOOM_HELLO_BYTES, LOOM_NONCE_BYTES, LOOM_NONCE_BYTES,
                            LOOM_BIND_BYTES};
    loom_hmac_sha256(key, keylen, parts, lens, 5, out);
}

void loom_session_keys(const void *key, size_t keylen, const uint8_t nonce_c[LOOM_NONCE_BYTES],
                       const uint8_t nonce_a[LOOM_NONCE_BYTES],
                       const uint8_t bind[LOOM_BIND_BYTES], uint8_t c2a[32], uint8_t a2c[32])
{
    uint8_t salt[2 * LOOM_NONCE_BYTES], info[16 + LOOM_BIND_BYTES], okm[64];
    memcpy(salt, nonce_c, LOOM_NONCE_BYTES);
    memcpy(salt + LOOM_NONCE_BYTES, nonce_a, LOOM_NONCE_BYTES);
    memcpy(info, "loom session v2\0", 16);
    memcpy(info + 16, bind, LOOM_BIND_BYTES);
    loom_hkdf_sha256(salt, sizeof(salt), key, keylen, info, sizeof(info), okm, sizeof(okm));
    memcpy(c2a, okm, 32);
    memcpy(a2c, okm + 32, 32);
}

int loom_seal_init(loom_seal_t *s, loom_aead_alg_t alg, const uint8_t key[LOOM_AEAD_KEY_BYTES],
                   int sending)
{
    if (loom_aead_init(&s->hdr, alg, key, sending) != 0)
        return -1;
    if (loom_aead_init(&s->pay, alg, key, sending) != 0) {
        loom_aead_fini(&s->hdr);
        return -1;
    }
    return 0;
}

void loom_seal_fini(loom_seal_t *s)
{
    loom_aead_fini(&s->pay);
    loom_aead_fini(&s->hdr);
}

/* The nonce of frame seq's header ('H') or payload ('P'). */
static void frame_nonce(char what, uint64_t seq, uint8_t nonce[LOOM_AEAD_NONCE_BYTES])
{
    loom_put32(nonce, (uint32_t)(uint8_t)what);
    loom_put64(nonce + 4, seq);
}

int loom_frame_seal_header(loom_seal_t *s, uint64_t seq, const uint8_t hdr[LOOM_FRAME_BYTES],
                           uint8_t tag[LOOM_MAC_BYTES])
{
    uint8_t nonce[LOOM_AEAD_NONCE_BYTES];
    frame_nonce('H', seq, nonce);
    if (loom_aead_start(&s->hdr, nonce) != 0 || loom_aead_aad(&s->hdr, hdr, LOOM_FRAME_BYTES) != 0)
        return -1;
    return loom_aead_seal_tag(&s->hdr, tag);
}

int loom_frame_open_header(loom_seal_t *s, uint64_t seq, const uint8_t hdr[LOOM_FRAME_BYTES],
                           const uint8_t tag[LOOM_MAC_BYTES])
{
    uint8_t nonce[LOOM_AEAD_NONCE_BYTES];
    frame_nonce('H', seq, nonce);
    if (loom_aead_start(&s->hdr, nonce) != 0 || loom_aead_aad(&s->hdr, hdr, LOOM_FRAME_BYTES) != 0)
        return -1;
    return loom_aead_open_tag(&s->hdr, tag);
}

int loom_frame_payload_start(loom_seal_t *s, uint64_t seq)
{
    uint8_t nonce[LOOM_AEAD_NONCE_BYTES];
    frame_nonce('P', seq, nonce);
    return loom_aead_start(&s->pay, nonce);
}

int loom_frame_small(unsigned kind, uint64_t len)
{
    return kind == LOOM_FRAME_DATA && len > 0 && len <= LOOM_FRAME_SMALL_MAX;
}

int loom_frame_small_hdr(const uint8_t hdr[LOOM_FRAME_BYTES])
{
    return loom_frame_small(hdr[4], loom_get64(hdr + 24));
}

/* Header and payload as associated data (full), or the header as associated
 * data and the payload encrypted (encrypt): one message either way. */
static int small_feed(loom_seal_t *s, uint64_t seq, const uint8_t hdr[LOOM_FRAME_BYTES],
                      const uint8_t *pay, uint8_t *out, size_t len, int encrypt)
{
    uint8_t nonce[LOOM_AEAD_NONCE_BYTES];
    frame_nonce('F', seq, nonce);
    if (loom_aead_start(&s->hdr, nonce) != 0 || loom_aead_aad(&s->hdr, hdr, LOOM_FRAME_BYTES) != 0)
        return -1;
    return encrypt ? loom_aead_crypt(&s->hdr, pay, out, len) : loom_aead_aad(&s->hdr, pay, len);
}

int loom_frame_seal_small(loom_seal_t *s, uint64_t seq, const uint8_t hdr[LOOM_FRAME_BYTES],
                          const uint8_t *pay, uint8_t *out, size_t len, int encrypt,
                          uint8_t tag[LOOM_MAC_BYTES])
{
    if (small_feed(s, seq, hdr, pay, out, len, encrypt) != 0)
        return -1;
    return loom_aead_seal_tag(&s->hdr, tag);
}

int loom_frame_open_small(loom_seal_t *s, uint64_t seq, const uint8_t hdr[LOOM_FRAME_BYTES],
                          uint8_t *pay, size_t len, int encrypt, const uint8_t tag[LOOM_MAC_BYTES])
{
    if (small_feed(s, seq, hdr, pay, pay, len, encrypt) != 0)
        return -1;
    return loom_aead_open_tag(&s->hdr, tag);
}

void loom_chal_encode(const uint8_t nonce_a[LOOM_NONCE_BYTES], const uint8_t proof[32],
                      uint8_t out[LOOM_CHAL_BYTES])
{
    memcpy(out, LOOM_CHAL_MAGIC, 8);
    memcpy(out + 8, nonce_a, LOOM_NONCE_BYTES);
    memcpy(out + 8 + LOOM_NONCE_BYTES, proof, 32);
}

int loom_chal_decode(const uint8_t in[LOOM_CHAL_BYTES], uint8_t nonce_a[LOOM_NONCE_BYTES],
                     uint8_t proof[32])
{
    if (memcmp(in, LOOM_CHAL_MAGIC, 8) != 0)
        return -1;
    memcpy(nonce_a, in + 8, LOOM_NONCE_BYTES);
    memcpy(proof, in + 8 + LOOM_NONCE_BYTES, 32);
    return 0;
}

void loom_proof_encode(const uint8_t proof[32], uint8_t out[LOOM_PROOF_BYTES])
{
    memcpy(out, LOOM_PROOF_MAGIC, 8);
    memcpy(out + 8, proof, 32);
}

int loom_proof_decode(const uint8_t in[LOOM_PROOF_BYTES], uint8_t proof[32])
{
    if (memcmp(in, LOOM_PROOF_MAGIC, 8) != 0)
        return -1;
    memcpy(proof, in + 8, 32);
    return 0;
}

void loom_gave_up_encode(const loom_tp_fault_t *fault, loom_frame_t *f)
{
    *f = (loom_frame_t){.kind = LOOM_FRAME_GAVE_UP};
    f->match.tag = (uint64_t)(uint32_t)(fault->culprit + 1) |
                   (uint64_t)(uint32_t)(fault->reporter + 1) << 32;
    f->match.desc = (uint32_t)fault->why;
    f->match.total = fault->waited_ms;
}

void loom_gave_up_decode(const loom_frame_t *f, int peer, int size, loom_tp_fault_t *fault)
{
    uint64_t culprit = f->match.tag & 0xffffffffu, reporter = f->match.tag >> 32;
    /* Only a rank of this communicator can be named; anything else says nothing. */
    fault->culprit = culprit >= 1 && culprit <= (uint64_t)size ? (int)culprit - 1 : -1;
    fault->reporter = reporter >= 1 && reporter <= (uint64_t)size ? (int)reporter - 1 : peer;
    fault->why = f->match.desc > 0 && f->match.desc <= (uint32_t)LOOM_ERR_INTERNAL
                     ? (loom_status_t)f->match.desc : LOOM_ERR_PEER_LOST;
    fault->waited_ms = f->match.total > UINT32_MAX ? UINT32_MAX : (uint32_t)f->match.total;
}
