/* crypto.c - see crypto.h: thin wrappers over OpenSSL 3's EVP interfaces
 * (EVP_MD, EVP_MAC, EVP_KDF, EVP_CIPHER); no cryptographic code of ours. */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include "crypto.h"

/* EVP takes int lengths: longer inputs go in pieces of this size. */
#define PIECE ((size_t)1 << 30)

/* libcrypto failed (out of memory): an output nobody can predict, so that it
 * matches nothing the peer computes (crypto.h). */
static void fail_closed(uint8_t *out, size_t len)
{
    if (RAND_bytes(out, (int)len) != 1)
        abort();   /* neither a result nor a safe stand-in for one */
}

void loom_sha256_init(loom_sha256_t *s)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(c);
        c = NULL;
    }
    s->ctx = c;
}

void loom_sha256_update(loom_sha256_t *s, const void *data, size_t len)
{
    const uint8_t *p = data;
    while (s->ctx && len > 0) {
        size_t n = len < PIECE ? len : PIECE;
        if (EVP_DigestUpdate(s->ctx, p, n) != 1) {
            EVP_MD_CTX_free(s->ctx);
            s->ctx = NULL;
        }
        p += n;
        len -= n;
    }
}

void loom_sha256_final(loom_sha256_t *s, uint8_t out[LOOM_SHA256_BYTES])
{
    if (!s->ctx || EVP_DigestFinal_ex(s->ctx, out, NULL) != 1)
        fail_closed(out, LOOM_SHA256_BYTES);
    EVP_MD_CTX_free(s->ctx);
    s->ctx = NULL;
}

/* HMAC's EVP_MAC, fetched once per process. */
static EVP_MAC *hmac_alg;
static pthread_once_t hmac_once = PTHREAD_ONCE_INIT;

static void hmac_fetch(void)
{
    hmac_alg = EVP_MAC_fetch(NULL, OSSL_MAC_NAME_HMAC, NULL);
}

static EVP_MAC_CTX *hmac_new(const void *key, size_t keylen)
{
    pthread_once(&hmac_once, hmac_fetch);
    if (!hmac_alg)
        return NULL;
    EVP_MAC_CTX *c = EVP_MAC_CTX_new(hmac_alg);
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_end()};
    /* An empty key is legal HMAC; EVP wants a non-NULL pointer for it. */
    static const uint8_t none[1];
    if (c && EVP_MAC_init(c, keylen ? key : none, keylen, params) != 1) {
        EVP_MAC_CTX_free(c);
        c = NULL;
    }
    return c;
}

static int hmac_feed(EVP_MAC_CTX *c, const void *data, size_t len)
{
    const uint8_t *p = data;
    while (len > 0) {
        size_t n = len < PIECE ? len : PIECE;
        if (EVP_MAC_update(c, p, n) != 1)
            return -1;
        p += n;
        len -= n;
    }
    return 0;
}

static void hmac_end(EVP_MAC_CTX *c, int ok, uint8_t out[LOOM_SHA256_BYTES])
{
    size_t n = 0;
    if (!c || !ok || EVP_MAC_final(c, out, &n, LOOM_SHA256_BYTES) != 1 || n != LOOM_SHA256_BYTES)
        fail_closed(out, LOOM_SHA256_BYTES);
    EVP_MAC_CTX_free(c);
}

void loom_hmac_sha256(const void *key, size_t keylen, const void *const *parts,
                      const size_t *lens, int nparts, uint8_t out[LOOM_SHA256_BYTES])
{
    EVP_MAC_CTX *c = hmac_new(key, keylen);
    int ok = c != NULL;
    for (int i = 0; ok && i < nparts; i++)
        ok = hmac_feed(c, parts[i], lens[i]) == 0;
    hmac_end(c, ok, out);
}

void loom_hmac_key_init(loom_hmac_key_t *k, const void *key, size_t keylen)
{
    k->ctx = hmac_new(key, keylen);
}

void loom_hmac_key_fini(loom_hmac_key_t *k)
{
    EVP_MAC_CTX_free(k->ctx);
    k->ctx = NULL;
}

void loom_hmac_start(loom_hmac_t *h, const loom_hmac_key_t *k)
{
    h->ctx = k->ctx ? EVP_MAC_CTX_dup(k->ctx) : NULL;
}

void loom_hmac_update(loom_hmac_t *h, const void *data, size_t len)
{
    if (h->ctx && hmac_feed(h->ctx, data, len) != 0) {
        EVP_MAC_CTX_free(h->ctx);
        h->ctx = NULL;
    }
}

void loom_hmac_final(loom_hmac_t *h, uint8_t out[LOOM_SHA256_BYTES])
{
    hmac_end(h->ctx, 1, out);
    h->ctx = NULL;
}

void loom_hkdf_sha256(const void *salt, size_t saltlen, const void *ikm, size_t ikmlen,
                      const void *info, size_t infolen, uint8_t *out, size_t outlen)
{
    static const uint8_t none[1];
    EVP_KDF *kdf = EVP_KDF_fetch(NULL, OSSL_KDF_NAME_HKDF, NULL);
    EVP_KDF_CTX *c = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)(ikmlen ? ikm : none),
                                          ikmlen),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, (void *)(saltlen ? salt : none),
                                          saltlen),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)(infolen ? info : none),
                                          infolen),
        OSSL_PARAM_construct_end()};
    if (!c || EVP_KDF_derive(c, out, outlen, params) != 1)
        fail_closed(out, outlen);
    EVP_KDF_CTX_free(c);
    EVP_KDF_free(kdf);
}

int loom_equal_ct(const void *a, const void *b, size_t n)
{
    return CRYPTO_memcmp(a, b, n) == 0;
}

/* ---- AEAD ----------------------------------------------------------------- */

int loom_aead_init(loom_aead_t *a, loom_aead_alg_t alg, const uint8_t key[LOOM_AEAD_KEY_BYTES],
                   int seal)
{
    const EVP_CIPHER *cipher =
        alg == LOOM_AEAD_CHACHA20_POLY1305 ? EVP_chacha20_poly1305() : EVP_aes_256_gcm();
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    a->ctx = NULL;
    a->seal = seal;
    if (!c)
        return -1;
    /* The key now (its schedule is computed once); the nonce per message. */
    if (EVP_CipherInit_ex(c, cipher, NULL, key, NULL, seal) != 1 ||
        EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_IVLEN, LOOM_AEAD_NONCE_BYTES, NULL) != 1) {
        EVP_CIPHER_CTX_free(c);
        return -1;
    }
    a->ctx = c;
    return 0;
}

void loom_aead_fini(loom_aead_t *a)
{
    EVP_CIPHER_CTX_free(a->ctx);
    a->ctx = NULL;
}

int loom_aead_start(loom_aead_t *a, const uint8_t nonce[LOOM_AEAD_NONCE_BYTES])
{
    if (!a->ctx || EVP_CipherInit_ex(a->ctx, NULL, NULL, NULL, nonce, a->seal) != 1)
        return -1;
    return 0;
}

int loom_aead_aad(loom_aead_t *a, const void *data, size_t len)
{
    const uint8_t *p = data;
    while (len > 0) {
        size_t n = len < PIECE ? len : PIECE;
        int outl;
        if (!a->ctx || EVP_CipherUpdate(a->ctx, NULL, &outl, p, (int)n) != 1)
            return -1;
        p += n;
        len -= n;
    }
    return 0;
}

int loom_aead_crypt(loom_aead_t *a, const void *in, void *out, size_t len)
{
    const uint8_t *p = in;
    uint8_t *q = out;
    while (len > 0) {
        size_t n = len < PIECE ? len : PIECE;
        int outl;
        if (!a->ctx || EVP_CipherUpdate(a->ctx, q, &outl, p, (int)n) != 1 || outl != (int)n)
            return -1;
        p += n;
        q += n;
        len -= n;
    }
    return 0;
}

/* The tag goes through the provider's parameters directly: EVP_CIPHER_CTX_ctrl
 * builds the same parameter on every call, a measurable part of a small
 * frame's cost. */
int loom_aead_seal_tag(loom_aead_t *a, uint8_t tag[LOOM_AEAD_TAG_BYTES])
{
    uint8_t none[16];
    int outl;
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_octet_string(OSSL_CIPHER_PARAM_AEAD_TAG, tag, LOOM_AEAD_TAG_BYTES),
        OSSL_PARAM_construct_end()};
    if (!a->ctx || !a->seal || EVP_CipherFinal_ex(a->ctx, none, &outl) != 1 ||
        EVP_CIPHER_CTX_get_params(a->ctx, params) != 1) {
        fail_closed(tag, LOOM_AEAD_TAG_BYTES);
        return -1;
    }
    return 0;
}

int loom_aead_open_tag(loom_aead_t *a, const uint8_t tag[LOOM_AEAD_TAG_BYTES])
{
    uint8_t none[16];
    int outl;
    OSSL_PARAM params[] = {OSSL_PARAM_construct_octet_string(OSSL_CIPHER_PARAM_AEAD_TAG,
                                                             (void *)tag, LOOM_AEAD_TAG_BYTES),
                           OSSL_PARAM_construct_end()};
    if (!a->ctx || a->seal || EVP_CIPHER_CTX_set_params(a->ctx, params) != 1)
        return -1;
    return EVP_CipherFinal_ex(a->ctx, none, &outl) == 1 ? 0 : -1;
}

loom_aead_alg_t loom_aead_default(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul"))
        return LOOM_AEAD_AES_256_GCM;
    return LOOM_AEAD_CHACHA20_POLY1305;
#elif defined(__aarch64__) && defined(HWCAP_AES) && defined(HWCAP_PMULL)
    unsigned long hw = getauxval(AT_HWCAP);
    return (hw & HWCAP_AES) && (hw & HWCAP_PMULL) ? LOOM_AEAD_AES_256_GCM
                                                  : LOOM_AEAD_CHACHA20_POLY1305;
#else
    return LOOM_AEAD_CHACHA20_POLY1305;
#endif
}

const char *loom_aead_name(loom_aead_alg_t alg)
{
    return alg == LOOM_AEAD_CHACHA20_POLY1305 ? "chacha20-poly1305" : "aes-256-gcm";
}

const char *loom_crypto_version(void)
{
    return OpenSSL_version(OPENSSL_VERSION);
}
