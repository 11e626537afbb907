/* crypto.h - the cryptography of LOOM_AUTH_KEY, over OpenSSL's libcrypto:
 * SHA-256, HMAC-SHA256, HKDF-SHA256 and the AEAD that seals TCP frames
 * (AES-256-GCM, or ChaCha20-Poly1305 where the CPU has no AES instructions).
 * Loom has no cryptographic code of its own; this is the one place that
 * talks to libcrypto, so the layers above never include OpenSSL's headers.
 *
 * The hash and MAC functions cannot fail in a way the caller must handle:
 * should libcrypto fail (out of memory), they fill their output with random
 * bytes, so that no tag or key made from it ever matches the peer's: the
 * connection or the record fails closed, with LOOM_ERR_AUTH. */
#ifndef LOOM_CRYPTO_H
#define LOOM_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#define LOOM_SHA256_BYTES 32

/* A running SHA-256: init, any number of updates, final (which frees it). */
typedef struct loom_sha256 {
    void *ctx;   /* EVP_MD_CTX */
} loom_sha256_t;

void loom_sha256_init(loom_sha256_t *s);
void loom_sha256_update(loom_sha256_t *s, const void *data, size_t len);
void loom_sha256_final(loom_sha256_t *s, uint8_t out[LOOM_SHA256_BYTES]);

/* out = HMAC-SHA256(key, the concatenation of nparts parts). */
void loom_hmac_sha256(const void *key, size_t keylen, const void *const *parts,
                      const size_t *lens, int nparts, uint8_t out[LOOM_SHA256_BYTES]);
/* HMAC-SHA256 keyed once (key_init) and started per message (start, updates,
 * final, which frees the message's context); key_fini frees the key. */
typedef struct loom_hmac_key {
    void *ctx;   /* EVP_MAC_CTX, keyed */
} loom_hmac_key_t;
typedef struct loom_hmac {
    void *ctx;   /* EVP_MAC_CTX, a copy of the key's */
} loom_hmac_t;
void loom_hmac_key_init(loom_hmac_key_t *k, const void *key, size_t keylen);
void loom_hmac_key_fini(loom_hmac_key_t *k);
void loom_hmac_start(loom_hmac_t *h, const loom_hmac_key_t *k);
void loom_hmac_update(loom_hmac_t *h, const void *data, size_t len);
void loom_hmac_final(loom_hmac_t *h, uint8_t out[LOOM_SHA256_BYTES]);

/* HKDF-SHA256 (RFC 5869): out (at most 255 * 32 bytes) from the input key,
 * a salt and an info string. */
void loom_hkdf_sha256(const void *salt, size_t saltlen, const void *ikm, size_t ikmlen,
                      const void *info, size_t infolen, uint8_t *out, size_t outlen);

/* 1 when a and b hold the same n bytes, in time that does not depend on where they differ. */
int loom_equal_ct(const void *a, const void *b, size_t n);

/* ---- AEAD ------------------------------------------------------------------
 * One direction of one connection holds a loom_aead_t per kind of message
 * (sealing or opening), keyed once; each message starts it with a nonce that
 * is never used twice under the key, gives it associated data (authenticated,
 * not encrypted) and then data to encrypt or decrypt, in pieces, and ends
 * with the tag: seal_tag makes it, open_tag checks it. Functions return 0, or
 * -1 when libcrypto failed (or, open_tag, the tag does not match). */
typedef enum { LOOM_AEAD_AES_256_GCM = 0, LOOM_AEAD_CHACHA20_POLY1305 = 1 } loom_aead_alg_t;
#define LOOM_AEAD_KEY_BYTES 32
#define LOOM_AEAD_NONCE_BYTES 12
#define LOOM_AEAD_TAG_BYTES 16

typedef struct loom_aead {
    void *ctx;   /* EVP_CIPHER_CTX */
    int seal;    /* 1: encrypts and makes tags, 0: decrypts and checks them */
} loom_aead_t;

int loom_aead_init(loom_aead_t *a, loom_aead_alg_t alg, const uint8_t key[LOOM_AEAD_KEY_BYTES],
                   int seal);
void loom_aead_fini(loom_aead_t *a);
int loom_aead_start(loom_aead_t *a, const uint8_t nonce[LOOM_AEAD_NONCE_BYTES]);
int loom_aead_aad(loom_aead_t *a, const void *data, size_t len);
/* in and out may be the same buffer. */
int loom_aead_crypt(loom_aead_t *a, const void *in, void *out, size_t len);
int loom_aead_seal_tag(loom_aead_t *a, uint8_t tag[LOOM_AEAD_TAG_BYTES]);
int loom_aead_open_tag(loom_aead_t *a, const uint8_t tag[LOOM_AEAD_TAG_BYTES]);

/* The cipher a rank uses when none is asked for: AES-256-GCM where the CPU
 * has AES and carry-less multiply instructions, else ChaCha20-Poly1305. */
loom_aead_alg_t loom_aead_default(void);
/* "aes-256-gcm" or "chacha20-poly1305". */
const char *loom_aead_name(loom_aead_alg_t alg);
/* "OpenSSL 3.0.x ..." as libcrypto reports itself. */
const char *loom_crypto_version(void);

#endif
