/* sha256.c - see sha256.h. Follows FIPS 180-4 section 6.2 directly; on x86-64
 * CPUs with the SHA extensions the compression runs on them (several times
 * faster: it bounds what LOOM_AUTH_MAC=full costs on large messages). */
#include <stdatomic.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define LOOM_SHA_NI 1
#endif

#include "sha256.h"

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t ror(uint32_t x, int n)
{
    return (x >> n) | (x << (32 - n));
}

static void compress_generic(uint32_t h[8], const uint8_t block[64])
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)block[4 * t] << 24 | (uint32_t)block[4 * t + 1] << 16 |
               (uint32_t)block[4 * t + 2] << 8 | block[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = ror(w[t - 15], 7) ^ ror(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = ror(w[t - 2], 17) ^ ror(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

#ifdef LOOM_SHA_NI
/* The same compression with SHA-NI: the state lives as ABEF and CDGH
 * vectors, four rounds per step, the message schedule by sha256msg1/2. */
__attribute__((target("sha,sse4.1,ssse3"))) static void compress_ni(uint32_t h[8],
                                                                    const uint8_t block[64])
{
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    __m128i t = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[0]), 0xB1);
    __m128i s1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[4]), 0x1B);
    __m128i s0 = _mm_alignr_epi8(t, s1, 8);
    s1 = _mm_blend_epi16(s1, t, 0xF0);
    __m128i save0 = s0, save1 = s1, w[4];
    for (int i = 0; i < 4; i++)
        w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(block + 16 * i)), bswap);
    for (int g = 0; g < 16; g++) {
        if (g >= 4) {
            __m128i x = _mm_sha256msg1_epu32(w[g & 3], w[(g + 1) & 3]);
            x = _mm_add_epi32(x, _mm_alignr_epi8(w[(g + 3) & 3], w[(g + 2) & 3], 4));
            w[g & 3] = _mm_sha256msg2_epu32(x, w[(g + 3) & 3]);
        }
        __m128i m = _mm_add_epi32(w[g & 3], _mm_loadu_si128((const __m128i *)&K[4 * g]));
        s1 = _mm_sha256rnds2_epu32(s1, s0, m);
        s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(m, 0x0E));
    }
    s0 = _mm_add_epi32(s0, save0);
    s1 = _mm_add_epi32(s1, save1);
    t = _mm_shuffle_epi32(s0, 0x1B);
    s1 = _mm_shuffle_epi32(s1, 0xB1);
    s0 = _mm_blend_epi16(t, s1, 0xF0);
    s1 = _mm_alignr_epi8(s1, t, 8);
    _mm_storeu_si128((__m128i *)&h[0], s0);
    _mm_storeu_si128((__m128i *)&h[4], s1);
}
#endif

/* 0: not chosen yet, 1: generic, 2: SHA-NI. */
static _Atomic int impl;

void loom_sha256_use_generic(int on)
{
    atomic_store(&impl, on ? 1 : 0);
}

static void compress(uint32_t h[8], const uint8_t block[64])
{
    int which = atomic_load_explicit(&impl, memory_order_relaxed);
    if (which == 0) {
        which = 1;
#ifdef LOOM_SHA_NI
        /* CPUID itself: clang knows no "sha" for __builtin_cpu_supports. */
        unsigned a, b, c, d;
        if (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_SSSE3) && (c & bit_SSE4_1) &&
            __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_SHA))
            which = 2;
#endif
        atomic_store(&impl, which);
    }
#ifdef LOOM_SHA_NI
    if (which == 2) {
        compress_ni(h, block);
        return;
    }
#endif
    compress_generic(h, block);
}

void loom_sha256_init(loom_sha256_t *s)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof(iv));
    s->bytes = 0;
    s->fill = 0;
}

void loom_sha256_update(loom_sha256_t *s, const void *data, size_t len)
{
    const uint8_t *p = data;
    s->bytes += len;
    while (len > 0) {
        if (s->fill == 0 && len >= 64) {
            compress(s->h, p);   /* whole blocks straight from the input */
            p += 64;
            len -= 64;
            continue;
        }
        size_t take = 64 - s->fill < len ? 64 - s->fill : len;
        memcpy(s->block + s->fill, p, take);
        s->fill += take;
        p += take;
        len -= take;
        if (s->fill == 64) {
            compress(s->h, s->block);
            s->fill = 0;
        }
    }
}

void loom_sha256_final(loom_sha256_t *s, uint8_t out[LOOM_SHA256_BYTES])
{
    uint64_t bits = s->bytes * 8;
    uint8_t pad = 0x80, zero = 0, len[8];
    loom_sha256_update(s, &pad, 1);
    while (s->fill != 56)
        loom_sha256_update(s, &zero, 1);
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(bits >> (56 - 8 * i));
    loom_sha256_update(s, len, 8);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++)
            out[4 * i + j] = (uint8_t)(s->h[i] >> (24 - 8 * j));
}

void loom_hmac_sha256(const void *key, size_t keylen, const void *const *parts,
                      const size_t *lens, int nparts, uint8_t out[LOOM_SHA256_BYTES])
{
    uint8_t k[64] = {0}, pad[64], inner[LOOM_SHA256_BYTES];
    loom_sha256_t s;
    if (keylen > 64) {
        loom_sha256_init(&s);
        loom_sha256_update(&s, key, keylen);
        loom_sha256_final(&s, k);
    } else if (keylen > 0) {
        memcpy(k, key, keylen);
    }
    for (int i = 0; i < 64; i++)
        pad[i] = k[i] ^ 0x36;
    loom_sha256_init(&s);
    loom_sha256_update(&s, pad, 64);
    for (int i = 0; i < nparts; i++)
        loom_sha256_update(&s, parts[i], lens[i]);
    loom_sha256_final(&s, inner);
    for (int i = 0; i < 64; i++)
        pad[i] = k[i] ^ 0x5c;
    loom_sha256_init(&s);
    loom_sha256_update(&s, pad, 64);
    loom_sha256_update(&s, inner, sizeof(inner));
    loom_sha256_final(&s, out);
}

void loom_hmac_key_init(loom_hmac_key_t *k, const void *key, size_t keylen)
{
    uint8_t kb[64] = {0}, pad[64];
    if (keylen > 64) {
        loom_sha256_t s;
        loom_sha256_init(&s);
        loom_sha256_update(&s, key, keylen);
        loom_sha256_final(&s, kb);
    } else if (keylen > 0) {
        memcpy(kb, key, keylen);
    }
    for (int i = 0; i < 64; i++)
        pad[i] = kb[i] ^ 0x36;
    loom_sha256_init(&k->inner);
    loom_sha256_update(&k->inner, pad, 64);
    for (int i = 0; i < 64; i++)
        pad[i] = kb[i] ^ 0x5c;
    loom_sha256_init(&k->outer);
    loom_sha256_update(&k->outer, pad, 64);
}

void loom_hmac_start(loom_hmac_t *h, const loom_hmac_key_t *k)
{
    h->s = k->inner;
    h->key = k;
}

void loom_hmac_update(loom_hmac_t *h, const void *data, size_t len)
{
    loom_sha256_update(&h->s, data, len);
}

void loom_hmac_final(loom_hmac_t *h, uint8_t out[LOOM_SHA256_BYTES])
{
    uint8_t inner[LOOM_SHA256_BYTES];
    loom_sha256_final(&h->s, inner);
    h->s = h->key->outer;
    loom_sha256_update(&h->s, inner, sizeof(inner));
    loom_sha256_final(&h->s, out);
}

void loom_hkdf_sha256(const void *salt, size_t saltlen, const void *ikm, size_t ikmlen,
                      const void *info, size_t infolen, uint8_t *out, size_t outlen)
{
    uint8_t prk[LOOM_SHA256_BYTES], t[LOOM_SHA256_BYTES];
    const void *ex[1] = {ikm};
    const size_t exl[1] = {ikmlen};
    loom_hmac_sha256(salt, saltlen, ex, exl, 1, prk);
    size_t tlen = 0;
    for (uint8_t i = 1; outlen > 0; i++) {
        const void *parts[3] = {t, info, &i};
        const size_t lens[3] = {tlen, infolen, 1};
        loom_hmac_sha256(prk, sizeof(prk), parts, lens, 3, t);
        tlen = sizeof(t);
        size_t n = outlen < tlen ? outlen : tlen;
        memcpy(out, t, n);
        out += n;
        outlen -= n;
    }
}

int loom_equal_ct(const void *a, const void *b, size_t n)
{
    const volatile uint8_t *x = a, *y = b;
    uint8_t diff = 0;
    for (size_t i = 0; i < n; i++)
        diff |= (uint8_t)(x[i] ^ y[i]);
    return diff == 0;
}
