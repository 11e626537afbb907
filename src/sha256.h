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
/* 1 when a and b hold the same n bytes, in time that does not depend on where they differ. */
int loom_equal_ct(const void *a, const void *b, size_t n);

#endif
