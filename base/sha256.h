/* sha256.h - SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the
 * LOOM_AUTH_KEY handshake: small, dependency-free, constant-time compare. */
#ifndef LOOM_SHA256_H
#define LOOM_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define LOOM_SHA256_BYTES 32

typedef struct loom_sha256 {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t block[64];
    size_t fill;
} loom_sha256_t;

void loom_sha256_init(loom_sha256_t *s);
void loom_sha256_update(loom_sha256_t *s, const void *data, size_t len);
void loom_sha256_final(loom_sha256_t *s, uint8_t out[LOOM_SHA256_BYTES]);

/* out = HMAC-SHA256(key, the concatenation of nparts parts). */
void loom_hmac_sha256(const void *key, size_t keylen, const void *const *parts,
                      const size_t *lens, int nparts, uint8_t out[LOOM_SHA256_BYTES]);
/* HMAC-SHA256 with the key's padded blocks hashed once: a context is keyed
 * once per connection and then started per message, so a MAC over a short
 * frame header costs two compressions instead of four. */
typedef struct loom_hmac_key {
    loom_sha256_t inner, outer;   /* states after the ipad and opad blocks */
} loom_hmac_key_t;
typedef struct loom_hmac {
    loom_sha256_t s;
    const loom_hmac_key_t *key;
} loom_hmac_t;
void loom_hmac_key_init(loom_hmac_key_t *k, const void *key, size_t keylen);
void loom_hmac_start(loom_hmac_t *h, const loom_hmac_key_t *k);
void loom_hmac_update(loom_hmac_t *h, const void *data, size_t len);
void loom_hmac_final(loom_hmac_t *h, uint8_t out[LOOM_SHA256_BYTES]);

/* HKDF-SHA256 (RFC 5869): out (at most 255 * 32 bytes) from the input key,
 * a salt and an info string. */
void loom_hkdf_sha256(const void *salt, size_t saltlen, const void *ikm, size_t ikmlen,
                      const void *info, size_t infolen, uint8_t *out, size_t outlen);

/* Tests: 1 forces the portable compression (else SHA-NI where the CPU has it). */
void loom_sha256_use_generic(int on);

/* 1 when a and b hold the same n bytes, in time that does not depend on where they differ. */
int loom_equal_ct(const void *a, const void *b, size_t n);

#endif
