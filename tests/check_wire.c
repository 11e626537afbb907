/* Unit tests of the handshake and frame-header parser: what a lying, confused
 * or foreign peer sends must be refused before a byte lands anywhere. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "check_suites.h"
#include "base/crypto.h"
#include "transports/wire.h"

START_TEST(test_hello_roundtrip)
{
    loom_hello_t h = {LOOM_WIRE_VERSION, 3, 8, 0, 0x1111, 0x2222}, got;
    uint8_t buf[LOOM_HELLO_BYTES];
    loom_hello_encode(&h, buf);
    ck_assert_int_eq(loom_hello_decode(buf, 0x1111, 0x2222, 1, 8, &got), LOOM_ACK_OK);
    ck_assert_uint_eq(got.rank, 3);
    ck_assert_uint_eq(got.size, 8);
}
END_TEST

START_TEST(test_hello_refusals)
{
    loom_hello_t h = {LOOM_WIRE_VERSION, 3, 8, 0, 0x1111, 0x2222}, got;
    uint8_t buf[LOOM_HELLO_BYTES];
    loom_hello_encode(&h, buf);
    ck_assert_int_eq(loom_hello_decode(buf, 0x9999, 0x2222, 1, 8, &got), LOOM_ACK_OTHER_JOB);
    ck_assert_int_eq(loom_hello_decode(buf, 0x1111, 0x9999, 1, 8, &got), LOOM_ACK_OTHER_JOB);
    ck_assert_int_eq(loom_hello_decode(buf, 0x1111, 0x2222, 1, 4, &got), LOOM_ACK_BAD_SIZE);
    ck_assert_int_eq(loom_hello_decode(buf, 0x1111, 0x2222, 3, 8, &got), LOOM_ACK_BAD_RANK);
    h.rank = 8;
    loom_hello_encode(&h, buf);
    ck_assert_int_eq(loom_hello_decode(buf, 0x1111, 0x2222, 1, 8, &got), LOOM_ACK_BAD_RANK);
    h.rank = 3;
    h.version = LOOM_WIRE_VERSION + 1;
    loom_hello_encode(&h, buf);
    ck_assert_int_eq(loom_hello_decode(buf, 0x1111, 0x2222, 1, 8, &got), LOOM_ACK_BAD_VERSION);
    memcpy(buf, "GET / HTTP/1.1\r\n", 16);
    ck_assert_int_eq(loom_hello_decode(buf, 0x1111, 0x2222, 1, 8, &got), LOOM_ACK_BAD_MAGIC);
}
END_TEST

START_TEST(test_ack)
{
    uint8_t buf[LOOM_ACK_BYTES];
    loom_ack_code_t code;
    uint32_t rank;
    loom_ack_encode(LOOM_ACK_DUPLICATE, 5, buf);
    ck_assert_int_eq(loom_ack_decode(buf, &code, &rank), 0);
    ck_assert_int_eq(code, LOOM_ACK_DUPLICATE);
    ck_assert_uint_eq(rank, 5);
    ck_assert_str_eq(loom_ack_reason(LOOM_ACK_OTHER_JOB), "belongs to another job or communicator");
    buf[8] = 200;  /* unknown reason code */
    ck_assert_int_eq(loom_ack_decode(buf, &code, &rank), -1);
    memset(buf, 'x', sizeof(buf));
    ck_assert_int_eq(loom_ack_decode(buf, &code, &rank), -1);
}
END_TEST

static loom_frame_t sample_frame(void)
{
    loom_frame_t f = {.kind = LOOM_FRAME_DATA, .len = 4096};
    f.match.tag = (UINT64_C(1) << 63) | 77;
    f.match.desc = loom_desc_make(LOOM_COLL_ALLREDUCE, LOOM_FLOAT32, LOOM_SUM);
    f.match.total = 1024;
    return f;
}

START_TEST(test_frame_roundtrip)
{
    loom_frame_t f = sample_frame(), g;
    uint8_t buf[LOOM_FRAME_BYTES];
    loom_err_t err = {0};
    loom_frame_encode(&f, buf);
    ck_assert_int_eq(loom_frame_decode(buf, 1, &g, &err), LOOM_SUCCESS);
    ck_assert_uint_eq(g.len, 4096);
    ck_assert(g.match.tag == f.match.tag);
    ck_assert_uint_eq(g.match.desc, f.match.desc);
    ck_assert(g.match.total == 1024);
}
END_TEST

START_TEST(test_frame_garbage)
{
    loom_frame_t f = sample_frame(), g;
    uint8_t buf[LOOM_FRAME_BYTES];
    loom_err_t err = {0};
    loom_frame_encode(&f, buf);
    buf[0] ^= 0xff;
    ck_assert_int_eq(loom_frame_decode(buf, 2, &g, &err), LOOM_ERR_TRANSPORT);
    ck_assert_ptr_nonnull(strstr(err.msg, "rank 2"));

    loom_frame_encode(&f, buf);
    buf[4] = 9;   /* unknown kind */
    memset(&err, 0, sizeof(err));
    ck_assert_int_eq(loom_frame_decode(buf, 2, &g, &err), LOOM_ERR_TRANSPORT);

    loom_frame_encode(&f, buf);
    buf[6] = 1;   /* reserved byte */
    memset(&err, 0, sizeof(err));
    ck_assert_int_eq(loom_frame_decode(buf, 2, &g, &err), LOOM_ERR_TRANSPORT);

    f.len = LOOM_FRAME_MAX_LEN + 1;   /* absurd length: refused before any allocation */
    loom_frame_encode(&f, buf);
    memset(&err, 0, sizeof(err));
    ck_assert_int_eq(loom_frame_decode(buf, 2, &g, &err), LOOM_ERR_TRANSPORT);

    loom_frame_t bye = {.kind = LOOM_FRAME_BYE, .len = 5};
    loom_frame_encode(&bye, buf);
    memset(&err, 0, sizeof(err));
    ck_assert_int_eq(loom_frame_decode(buf, 2, &g, &err), LOOM_ERR_TRANSPORT);

    loom_frame_t gave_up = {.kind = LOOM_FRAME_GAVE_UP, .len = 1};   /* no payload either */
    loom_frame_encode(&gave_up, buf);
    memset(&err, 0, sizeof(err));
    ck_assert_int_eq(loom_frame_decode(buf, 2, &g, &err), LOOM_ERR_TRANSPORT);
    gave_up.len = 0;
    loom_frame_encode(&gave_up, buf);
    ck_assert_int_eq(loom_frame_decode(buf, 2, &g, &err), LOOM_SUCCESS);
    ck_assert_int_eq(g.kind, LOOM_FRAME_GAVE_UP);
}
END_TEST

/* GAVE_UP carries the fault (culprit, reporter, status, wait) through a real
 * encode/decode; a rank out of range names no one (the sender reports);
 * KEEPALIVE has no payload. */
START_TEST(test_gave_up_fault)
{
    uint8_t buf[LOOM_FRAME_BYTES];
    loom_err_t err;
    loom_frame_t f, g;
    loom_tp_fault_t in = {.culprit = 2, .reporter = 0, .why = LOOM_ERR_TIMEOUT,
                          .waited_ms = 10000}, out;
    loom_gave_up_encode(&in, &f);
    loom_frame_encode(&f, buf);
    memset(&err, 0, sizeof(err));
    ck_assert_int_eq(loom_frame_decode(buf, 3, &g, &err), LOOM_SUCCESS);
    ck_assert_int_eq(g.kind, LOOM_FRAME_GAVE_UP);
    loom_gave_up_decode(&g, 3, 4, &out);
    ck_assert_int_eq(out.culprit, 2);
    ck_assert_int_eq(out.reporter, 0);
    ck_assert_int_eq(out.why, LOOM_ERR_TIMEOUT);
    ck_assert_uint_eq(out.waited_ms, 10000);

    /* No culprit known (a mismatch): -1 travels as "none". */
    in = (loom_tp_fault_t){.culprit = -1, .reporter = 1, .why = LOOM_ERR_MISMATCH};
    loom_gave_up_encode(&in, &f);
    loom_gave_up_decode(&f, 1, 4, &out);
    ck_assert_int_eq(out.culprit, -1);
    ck_assert_int_eq(out.reporter, 1);
    ck_assert_int_eq(out.why, LOOM_ERR_MISMATCH);

    /* A frame from an older sender (all zero) or naming ranks past the
     * communicator: no culprit, the sender is the reporter, PEER_LOST. */
    f = (loom_frame_t){.kind = LOOM_FRAME_GAVE_UP};
    f.match.tag = (UINT64_C(77) << 32) | 9;
    f.match.desc = 9999;
    loom_gave_up_decode(&f, 3, 4, &out);
    ck_assert_int_eq(out.culprit, -1);
    ck_assert_int_eq(out.reporter, 3);
    ck_assert_int_eq(out.why, LOOM_ERR_PEER_LOST);

    loom_frame_t ka = {.kind = LOOM_FRAME_KEEPALIVE};
    loom_frame_encode(&ka, buf);
    ck_assert_int_eq(loom_frame_decode(buf, 1, &g, &err), LOOM_SUCCESS);
    ck_assert_int_eq(g.kind, LOOM_FRAME_KEEPALIVE);
    ka.len = 8;
    loom_frame_encode(&ka, buf);
    ck_assert_int_eq(loom_frame_decode(buf, 1, &g, &err), LOOM_ERR_TRANSPORT);
    ck_assert_ptr_nonnull(strstr(err.msg, "keepalive"));
}
END_TEST

/* Slices of a striped message: every byte in exactly one, in stream order,
 * page-sized where the message allows, the last taking the rest. */
START_TEST(test_stripe_slices)
{
    static const uint64_t lens[] = {0, 1, 3, 4095, 4096, 16383, 16384, 65537, 1048576,
                                    (1u << 20) + 12345, UINT64_C(1) << 40};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        for (int s = 1; s <= LOOM_MAX_STREAMS; s++) {
            uint64_t next = 0;
            for (int k = 0; k < s; k++) {
                uint64_t beg, n;
                loom_stripe_slice(lens[i], s, k, &beg, &n);
                ck_assert_uint_eq(beg, next);
                next = beg + n;
                if (k + 1 < s && lens[i] / (uint64_t)s >= 4096) {
                    ck_assert_uint_eq(n % 4096, 0);
                    ck_assert_uint_ge(n, 4096);
                }
                if (k + 1 < s) {
                    /* no slice but the last is bigger than an equal share */
                    ck_assert_uint_le(n, lens[i] / (uint64_t)s);
                }
            }
            ck_assert_uint_eq(next, lens[i]);
        }
    }
    /* 1 MiB over 4 streams: four 256 KiB slices. */
    uint64_t beg, n;
    loom_stripe_slice(1u << 20, 4, 3, &beg, &n);
    ck_assert_uint_eq(beg, 3u << 18);
    ck_assert_uint_eq(n, 1u << 18);
    /* The remainder goes to the last slice, never beyond the message. */
    loom_stripe_slice((1u << 20) + 5000, 4, 3, &beg, &n);
    ck_assert_uint_eq(beg, 3u << 18);
    ck_assert_uint_eq(n, (1u << 18) + 5000);
}
END_TEST

/* The frames of striping decode with their payload; farewells still carry none. */
START_TEST(test_frame_striped_kinds)
{
    loom_frame_t f = sample_frame(), g;
    uint8_t buf[LOOM_FRAME_BYTES];
    loom_err_t err = {0};
    f.kind = LOOM_FRAME_STRIPED;
    f.len = 5u << 20;
    loom_frame_encode(&f, buf);
    ck_assert_int_eq(loom_frame_decode(buf, 1, &g, &err), LOOM_SUCCESS);
    ck_assert_int_eq(g.kind, LOOM_FRAME_STRIPED);
    ck_assert_uint_eq(g.len, 5u << 20);
    f.kind = LOOM_FRAME_SLICE;
    loom_frame_encode(&f, buf);
    ck_assert_int_eq(loom_frame_decode(buf, 1, &g, &err), LOOM_SUCCESS);
    ck_assert_int_eq(g.kind, LOOM_FRAME_SLICE);
    f.len = LOOM_FRAME_MAX_LEN + 1;   /* a slice is bounded as any frame */
    loom_frame_encode(&f, buf);
    ck_assert_int_eq(loom_frame_decode(buf, 1, &g, &err), LOOM_ERR_TRANSPORT);
    buf[4] = LOOM_FRAME_SLICE + 1;
    ck_assert_int_eq(loom_frame_decode(buf, 1, &g, &err), LOOM_ERR_TRANSPORT);
    buf[4] = 0;
    ck_assert_int_eq(loom_frame_decode(buf, 1, &g, &err), LOOM_ERR_TRANSPORT);
}
END_TEST

/* The hello names its stream and the connector's count; an acceptor with
 * another count refuses with a reason that names the setting. */
START_TEST(test_hello_streams)
{
    loom_hello_t h = {LOOM_WIRE_VERSION, 3, 8, LOOM_HELLO_AUTH | LOOM_HELLO_STREAMS(2, 4), 1, 2},
                 got;
    uint8_t buf[LOOM_HELLO_BYTES];
    loom_hello_encode(&h, buf);
    ck_assert_int_eq(loom_hello_decode(buf, 1, 2, 1, 8, &got), LOOM_ACK_OK);
    ck_assert_uint_eq(LOOM_HELLO_STREAM_INDEX(got.stream), 2);
    ck_assert_uint_eq(LOOM_HELLO_STREAM_COUNT(got.stream), 4);
    ck_assert(got.stream & LOOM_HELLO_AUTH);
    ck_assert_uint_eq(LOOM_HELLO_STREAM_COUNT(LOOM_HELLO_STREAMS(0, LOOM_MAX_STREAMS)),
                      LOOM_MAX_STREAMS);
    uint8_t ack[LOOM_ACK_BYTES];
    loom_ack_code_t code;
    uint32_t rank;
    loom_ack_encode(LOOM_ACK_STREAMS, 1, ack);
    ck_assert_int_eq(loom_ack_decode(ack, &code, &rank), 0);
    ck_assert_int_eq(code, LOOM_ACK_STREAMS);
    ck_assert_ptr_nonnull(strstr(loom_ack_reason(code), "LOOM_SOCKETS_PER_PEER"));
}
END_TEST

START_TEST(test_frame_check)
{
    loom_frame_t f = sample_frame();
    loom_tp_req_t posted = {.peer = 3, .len = 4096, .match = f.match};
    loom_err_t err = {0};
    ck_assert_int_eq(loom_frame_check(&f, &posted, 0, &err), LOOM_SUCCESS);

    posted.len = 4092;   /* the sender would overflow this buffer */
    ck_assert_int_eq(loom_frame_check(&f, &posted, 0, &err), LOOM_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(err.msg, "4096"));

    memset(&err, 0, sizeof(err));
    posted.len = 4096;
    posted.match.total = 1000;
    ck_assert_int_eq(loom_frame_check(&f, &posted, 0, &err), LOOM_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(err.msg, "count"));

    memset(&err, 0, sizeof(err));
    posted.match.total = 1024;
    posted.match.desc = loom_desc_make(LOOM_COLL_ALLREDUCE, LOOM_INT32, LOOM_SUM);
    ck_assert_int_eq(loom_frame_check(&f, &posted, 0, &err), LOOM_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(err.msg, "allreduce float32 sum"));
    ck_assert_ptr_nonnull(strstr(err.msg, "allreduce int32 sum"));

    /* Calls that do not reduce name no op (their op byte is 0, "sum"). */
    char buf[64];
    ck_assert_str_eq(loom_desc_str(loom_desc_make(0xff, LOOM_INT32, 0), buf, sizeof(buf)),
                     "send/recv int32");
    ck_assert_str_eq(loom_desc_str(loom_desc_make(LOOM_COLL_BROADCAST, LOOM_UINT8, 0), buf,
                                   sizeof(buf)), "broadcast uint8");
    ck_assert_str_eq(loom_desc_str(loom_desc_make(LOOM_COLL_REDUCE_SCATTER, LOOM_INT64, LOOM_BXOR),
                                   buf, sizeof(buf)), "reduce_scatter int64 bxor");
}
END_TEST

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

START_TEST(test_sha256_vectors)
{
    /* FIPS 180-4 examples, and a message that spans the padding boundary. */
    uint8_t d[32];
    char h[65];
    loom_sha256_t s;
    loom_sha256_init(&s);
    loom_sha256_update(&s, "abc", 3);
    loom_sha256_final(&s, d);
    hex(d, 32, h);
    ck_assert_str_eq(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    loom_sha256_init(&s);
    loom_sha256_update(&s, "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56);
    loom_sha256_final(&s, d);
    hex(d, 32, h);
    ck_assert_str_eq(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    loom_sha256_init(&s);
    loom_sha256_final(&s, d);
    hex(d, 32, h);
    ck_assert_str_eq(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    /* Many blocks fed unevenly: a million 'a's (FIPS 180-2, appendix B.3). */
    static uint8_t a[1000000];
    memset(a, 'a', sizeof(a));
    loom_sha256_init(&s);
    loom_sha256_update(&s, a, 7);
    loom_sha256_update(&s, a, 130);
    loom_sha256_update(&s, a, sizeof(a) - 137);
    loom_sha256_final(&s, d);
    hex(d, 32, h);
    ck_assert_str_eq(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}
END_TEST

static void unhex(const char *h, uint8_t *out)
{
    for (size_t i = 0; h[2 * i]; i++) {
        unsigned v;
        ck_assert_int_eq(sscanf(h + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
}

/* One AEAD known answer: encrypt p in two pieces (AAD in two pieces too),
 * compare with c and t, decrypt back, and refuse a changed byte. */
static void aead_kat(loom_aead_alg_t alg, const char *k, const char *iv, const char *a,
                     const char *p, const char *c, const char *t)
{
    uint8_t key[32], nonce[12], aad[64], pt[128], ct[128], want[128], tag[16], wtag[16];
    size_t alen = strlen(a) / 2, plen = strlen(p) / 2;
    unhex(k, key);
    unhex(iv, nonce);
    unhex(a, aad);
    unhex(p, pt);
    unhex(c, want);
    unhex(t, wtag);
    loom_aead_t e, d;
    ck_assert_int_eq(loom_aead_init(&e, alg, key, 1), 0);
    ck_assert_int_eq(loom_aead_init(&d, alg, key, 0), 0);
    for (int round = 0; round < 2; round++) {   /* a keyed context is reusable */
        ck_assert_int_eq(loom_aead_start(&e, nonce), 0);
        ck_assert_int_eq(loom_aead_aad(&e, aad, alen / 2), 0);
        ck_assert_int_eq(loom_aead_aad(&e, aad + alen / 2, alen - alen / 2), 0);
        ck_assert_int_eq(loom_aead_crypt(&e, pt, ct, plen / 3), 0);
        ck_assert_int_eq(loom_aead_crypt(&e, pt + plen / 3, ct + plen / 3, plen - plen / 3), 0);
        ck_assert_int_eq(loom_aead_seal_tag(&e, tag), 0);
        ck_assert(memcmp(ct, want, plen) == 0);
        ck_assert(memcmp(tag, wtag, 16) == 0);
        ck_assert_int_eq(loom_aead_start(&d, nonce), 0);
        ck_assert_int_eq(loom_aead_aad(&d, aad, alen), 0);
        ck_assert_int_eq(loom_aead_crypt(&d, ct, ct, plen), 0);
        ck_assert_int_eq(loom_aead_open_tag(&d, tag), 0);
        ck_assert(memcmp(ct, pt, plen) == 0);
    }
    memcpy(ct, want, plen);
    ct[0] ^= 1;
    ck_assert_int_eq(loom_aead_start(&d, nonce), 0);
    ck_assert_int_eq(loom_aead_aad(&d, aad, alen), 0);
    ck_assert_int_eq(loom_aead_crypt(&d, ct, ct, plen), 0);
    ck_assert_int_eq(loom_aead_open_tag(&d, tag), -1);
    loom_aead_fini(&e);
    loom_aead_fini(&d);
}

START_TEST(test_aead_vectors)
{
    /* AES-256-GCM: the GCM specification's test cases 14 and 16 (McGrew and Viega,
     * as NIST's GCM validation lists them). */
    aead_kat(LOOM_AEAD_AES_256_GCM, "0000000000000000000000000000000000000000000000000000000000000000",
             "000000000000000000000000", "", "00000000000000000000000000000000",
             "cea7403d4d606b6e074ec5d3baf39d18", "d0d1c8a799996bf0265b98b5d48ab919");
    aead_kat(LOOM_AEAD_AES_256_GCM, "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308",
             "cafebabefacedbaddecaf888", "feedfacedeadbeeffeedfacedeadbeefabaddad2",
             "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
             "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39",
             "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
             "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662",
             "76fc6ece0f4e1768cddf8853bb2d551b");
    /* ChaCha20-Poly1305: RFC 8439 section 2.8.2. */
    aead_kat(LOOM_AEAD_CHACHA20_POLY1305,
             "808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f",
             "070000004041424344454647", "50515253c0c1c2c3c4c5c6c7",
             "4c616469657320616e642047656e746c656d656e206f662074686520636c6173"
             "73206f66202739393a204966204920636f756c64206f6666657220796f75206f"
             "6e6c79206f6e652074697020666f7220746865206675747572652c2073756e73"
             "637265656e20776f756c642062652069742e",
             "d31a8d34648e60db7b86afbc53ef7ec2a4aded51296e08fea9e2b5a736ee62d6"
             "3dbea45e8ca9671282fafb69da92728b1a71de0a9e060b2905d6a5b67ecd3b36"
             "92ddbd7f2d778b8c9803aee328091b58fab324e4fad675945585808b4831d7bc"
             "3ff4def08e4b7a9de576d26586cec64b6116",
             "1ae10b594f09e26a7e902ecbd0600691");
    ck_assert_str_eq(loom_aead_name(LOOM_AEAD_AES_256_GCM), "aes-256-gcm");
    ck_assert_str_eq(loom_aead_name(LOOM_AEAD_CHACHA20_POLY1305), "chacha20-poly1305");
}
END_TEST

START_TEST(test_hmac_rfc4231)
{
    uint8_t key1[20], d[32];
    char h[65];
    memset(key1, 0x0b, sizeof(key1));
    const void *p1[1] = {"Hi There"};
    const size_t l1[1] = {8};
    loom_hmac_sha256(key1, sizeof(key1), p1, l1, 1, d);
    hex(d, 32, h);
    ck_assert_str_eq(h, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    /* Test case 2, the message given in two parts. */
    const void *p2[2] = {"what do ya want ", "for nothing?"};
    const size_t l2[2] = {16, 12};
    loom_hmac_sha256("Jefe", 4, p2, l2, 2, d);
    hex(d, 32, h);
    ck_assert_str_eq(h, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    /* Test case 6: a key longer than the block is hashed first. */
    uint8_t key6[131];
    memset(key6, 0xaa, sizeof(key6));
    const void *p6[1] = {"Test Using Larger Than Block-Size Key - Hash Key First"};
    const size_t l6[1] = {54};
    loom_hmac_sha256(key6, sizeof(key6), p6, l6, 1, d);
    hex(d, 32, h);
    ck_assert_str_eq(h, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    ck_assert(loom_equal_ct("abc", "abc", 3));
    ck_assert(!loom_equal_ct("abc", "abd", 3));
}
END_TEST

START_TEST(test_hmac_keyed_and_hkdf)
{
    /* The keyed context agrees with the one-shot HMAC (RFC 4231 case 2). */
    uint8_t d[32], okm[42];
    char h[2 * 42 + 1];
    loom_hmac_key_t k;
    loom_hmac_t m;
    loom_hmac_key_init(&k, "Jefe", 4);
    for (int round = 0; round < 2; round++) {   /* a key is reusable */
        loom_hmac_start(&m, &k);
        loom_hmac_update(&m, "what do ya want ", 16);
        loom_hmac_update(&m, "for nothing?", 12);
        loom_hmac_final(&m, d);
        hex(d, 32, h);
        ck_assert_str_eq(h, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }
    loom_hmac_key_fini(&k);
    /* RFC 5869 test case 1. */
    uint8_t ikm[22], salt[13], info[10];
    memset(ikm, 0x0b, sizeof(ikm));
    for (int i = 0; i < 13; i++)
        salt[i] = (uint8_t)i;
    for (int i = 0; i < 10; i++)
        info[i] = (uint8_t)(0xf0 + i);
    loom_hkdf_sha256(salt, sizeof(salt), ikm, sizeof(ikm), info, sizeof(info), okm, sizeof(okm));
    hex(okm, sizeof(okm), h);
    ck_assert_str_eq(h, "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
                        "34007208d5b887185865");
}
END_TEST

/* Small frames: one tag over header and payload, under a nonce no other
 * message of the frame uses; a change to either, a replay or a frame sealed
 * the other way fails, in both modes and with both ciphers. */
START_TEST(test_small_frames)
{
    ck_assert(loom_frame_small(LOOM_FRAME_DATA, 1));
    ck_assert(loom_frame_small(LOOM_FRAME_DATA, LOOM_FRAME_SMALL_MAX));
    ck_assert(!loom_frame_small(LOOM_FRAME_DATA, 0));
    ck_assert(!loom_frame_small(LOOM_FRAME_DATA, LOOM_FRAME_SMALL_MAX + 1));
    ck_assert(!loom_frame_small(LOOM_FRAME_STRIPED, 8));
    ck_assert(!loom_frame_small(LOOM_FRAME_KEEPALIVE, 0));
    uint8_t key[LOOM_AEAD_KEY_BYTES];
    memset(key, 0x5a, sizeof(key));
    for (int alg = 0; alg < 2; alg++) {
        for (int encrypt = 0; encrypt < 2; encrypt++) {
            loom_seal_t tx, rx;
            ck_assert_int_eq(loom_seal_init(&tx, (loom_aead_alg_t)alg, key, 1), 0);
            ck_assert_int_eq(loom_seal_init(&rx, (loom_aead_alg_t)alg, key, 0), 0);
            loom_frame_t f = {.kind = LOOM_FRAME_DATA, .match = {.tag = 9, .desc = 1, .total = 2},
                              .len = 24};
            uint8_t hdr[LOOM_FRAME_BYTES], pay[24], orig[24], wire[24], tag[LOOM_MAC_BYTES],
                t2[LOOM_MAC_BYTES];
            loom_frame_encode(&f, hdr);
            ck_assert(loom_frame_small_hdr(hdr));
            for (size_t i = 0; i < sizeof(pay); i++)
                pay[i] = orig[i] = (uint8_t)(i + 1);
            ck_assert_int_eq(loom_frame_seal_small(&tx, 3, hdr, pay, wire, sizeof(pay), encrypt, tag),
                             0);
            ck_assert(memcmp(pay, orig, sizeof(pay)) == 0);   /* the user's buffer is not touched */
            if (!encrypt)
                memcpy(wire, pay, sizeof(pay));
            ck_assert(encrypt == (memcmp(wire, orig, sizeof(wire)) != 0));
            uint8_t got[24];
            memcpy(got, wire, sizeof(got));
            ck_assert_int_eq(loom_frame_open_small(&rx, 3, hdr, got, sizeof(got), encrypt, tag), 0);
            ck_assert(memcmp(got, orig, sizeof(got)) == 0);
            memcpy(got, wire, sizeof(got));   /* replayed as the next frame */
            ck_assert_int_eq(loom_frame_open_small(&rx, 4, hdr, got, sizeof(got), encrypt, tag), -1);
            memcpy(got, wire, sizeof(got));   /* one payload bit changed */
            got[5] ^= 1;
            ck_assert_int_eq(loom_frame_open_small(&rx, 3, hdr, got, sizeof(got), encrypt, tag), -1);
            memcpy(got, wire, sizeof(got));   /* one header bit changed */
            hdr[16] ^= 1;
            ck_assert_int_eq(loom_frame_open_small(&rx, 3, hdr, got, sizeof(got), encrypt, tag), -1);
            hdr[16] ^= 1;
            /* Opened the other way (encrypted read as clear, or back) it fails. */
            ck_assert_int_eq(loom_frame_open_small(&rx, 3, hdr, got, sizeof(got), !encrypt, tag), -1);
            /* Its tag is neither a header tag nor a payload tag of the same frame. */
            ck_assert_int_eq(loom_frame_open_header(&rx, 3, hdr, tag), -1);
            ck_assert_int_eq(loom_frame_seal_header(&tx, 3, hdr, t2), 0);
            memcpy(got, wire, sizeof(got));
            ck_assert_int_eq(loom_frame_open_small(&rx, 3, hdr, got, sizeof(got), encrypt, t2), -1);
            loom_seal_fini(&tx);
            loom_seal_fini(&rx);
        }
    }
}
END_TEST

START_TEST(test_auth_messages)
{
    uint8_t hello[LOOM_HELLO_BYTES], nc[LOOM_NONCE_BYTES], na[LOOM_NONCE_BYTES];
    loom_hello_t h = {LOOM_WIRE_VERSION, 1, 2, LOOM_HELLO_AUTH, 7, 9}, back;
    loom_hello_encode(&h, hello);
    ck_assert_int_eq(loom_hello_decode(hello, 7, 9, 0, 2, &back), LOOM_ACK_OK);
    ck_assert(back.stream & LOOM_HELLO_AUTH);
    memset(nc, 1, sizeof(nc));
    memset(na, 2, sizeof(na));
    uint8_t a[32], c[32], a2[32], other[32], bind[LOOM_BIND_BYTES], bind2[LOOM_BIND_BYTES];
    loom_auth_bind(7, 9, 2, 1, "10.0.0.2:5", 10, 0, "10.0.0.1:7", 10, bind);
    loom_auth_proof("key", 3, 'A', hello, nc, na, bind, a);
    loom_auth_proof("key", 3, 'C', hello, nc, na, bind, c);
    loom_auth_proof("key", 3, 'A', hello, nc, na, bind, a2);
    loom_auth_proof("kez", 3, 'A', hello, nc, na, bind, other);
    ck_assert(memcmp(a, a2, 32) == 0);      /* deterministic */
    ck_assert(memcmp(a, c, 32) != 0);       /* a proof cannot be sent back as the other role's */
    ck_assert(memcmp(a, other, 32) != 0);   /* depends on the key */
    /* A relay that rewrote the acceptor's published address computes another binding. */
    loom_auth_bind(7, 9, 2, 1, "10.0.0.2:5", 10, 0, "10.0.0.9:7", 10, bind2);
    ck_assert(memcmp(bind, bind2, sizeof(bind)) != 0);
    loom_auth_proof("key", 3, 'A', hello, nc, na, bind2, a2);
    ck_assert(memcmp(a, a2, 32) != 0);
    /* Identities cannot be shifted from one side to the other. */
    loom_auth_bind(7, 9, 2, 1, "10.0.0.2:5", 9, 0, "10.0.0.1:7", 11, bind2);
    ck_assert(memcmp(bind, bind2, sizeof(bind)) != 0);
    uint8_t c2a[32], a2c[32], c2a2[32], a2c2[32];
    loom_session_keys("key", 3, nc, na, bind, c2a, a2c);
    loom_session_keys("key", 3, nc, na, bind, c2a2, a2c2);
    ck_assert(memcmp(c2a, c2a2, 32) == 0 && memcmp(a2c, a2c2, 32) == 0);
    ck_assert(memcmp(c2a, a2c, 32) != 0);   /* one key per direction */
    na[0] ^= 1;
    loom_auth_proof("key", 3, 'A', hello, nc, na, bind, a2);
    ck_assert(memcmp(a, a2, 32) != 0);      /* and on the nonces: no replay */
    loom_session_keys("key", 3, nc, na, bind, c2a2, a2c2);
    ck_assert(memcmp(c2a, c2a2, 32) != 0);  /* every connection its own keys */
    /* Frame tags depend on the sequence number: a frame cannot be replayed or moved. */
    for (int alg = 0; alg < 2; alg++) {
        loom_seal_t tx, rx;
        uint8_t hdr[LOOM_FRAME_BYTES] = {0}, t1[LOOM_MAC_BYTES], t2[LOOM_MAC_BYTES];
        ck_assert_int_eq(loom_seal_init(&tx, (loom_aead_alg_t)alg, c2a, 1), 0);
        ck_assert_int_eq(loom_seal_init(&rx, (loom_aead_alg_t)alg, c2a, 0), 0);
        ck_assert_int_eq(loom_frame_seal_header(&tx, 5, hdr, t1), 0);
        ck_assert_int_eq(loom_frame_seal_header(&tx, 6, hdr, t2), 0);
        ck_assert(memcmp(t1, t2, sizeof(t1)) != 0);
        ck_assert_int_eq(loom_frame_open_header(&rx, 5, hdr, t1), 0);
        ck_assert_int_eq(loom_frame_open_header(&rx, 6, hdr, t1), -1);   /* replayed */
        hdr[30] = 1;
        ck_assert_int_eq(loom_frame_open_header(&rx, 5, hdr, t1), -1);   /* altered */
        ck_assert_int_eq(loom_frame_seal_header(&tx, 5, hdr, t2), 0);
        ck_assert(memcmp(t1, t2, sizeof(t1)) != 0);
        /* A payload, sealed in pieces and opened in other pieces, in place. */
        uint8_t pay[1000], orig[1000], tag[LOOM_MAC_BYTES];
        for (size_t i = 0; i < sizeof(pay); i++)
            pay[i] = orig[i] = (uint8_t)(i * 7);
        ck_assert_int_eq(loom_frame_payload_start(&tx, 5), 0);
        ck_assert_int_eq(loom_aead_crypt(&tx.pay, pay, pay, 300), 0);
        ck_assert_int_eq(loom_aead_crypt(&tx.pay, pay + 300, pay + 300, 700), 0);
        ck_assert_int_eq(loom_aead_seal_tag(&tx.pay, tag), 0);
        ck_assert(memcmp(pay, orig, sizeof(pay)) != 0);
        ck_assert_int_eq(loom_frame_payload_start(&rx, 5), 0);
        ck_assert_int_eq(loom_aead_crypt(&rx.pay, pay, pay, 999), 0);
        ck_assert_int_eq(loom_aead_crypt(&rx.pay, pay + 999, pay + 999, 1), 0);
        ck_assert_int_eq(loom_aead_open_tag(&rx.pay, tag), 0);
        ck_assert(memcmp(pay, orig, sizeof(pay)) == 0);
        /* The header's nonce is not the payload's: a header tag is no payload tag. */
        ck_assert_int_eq(loom_frame_payload_start(&rx, 5), 0);
        ck_assert_int_eq(loom_aead_aad(&rx.pay, hdr, sizeof(hdr)), 0);
        ck_assert_int_eq(loom_aead_open_tag(&rx.pay, t2), -1);
        loom_seal_fini(&tx);
        loom_seal_fini(&rx);
    }

    uint8_t msg[LOOM_CHAL_BYTES], nonce[LOOM_NONCE_BYTES], proof[32];
    loom_chal_encode(na, a, msg);
    ck_assert_int_eq(loom_chal_decode(msg, nonce, proof), 0);
    ck_assert(memcmp(nonce, na, sizeof(na)) == 0 && memcmp(proof, a, 32) == 0);
    msg[0] = 'X';
    ck_assert_int_eq(loom_chal_decode(msg, nonce, proof), -1);
    uint8_t pm[LOOM_CHAL_BYTES] = {0};
    loom_proof_encode(c, pm);
    ck_assert_int_eq(loom_proof_decode(pm, proof), 0);
    ck_assert(memcmp(proof, c, 32) == 0);
    ck_assert_int_eq(loom_chal_decode(pm, nonce, proof), -1);   /* not a challenge */
    loom_ack_code_t code;
    uint32_t who;
    loom_ack_encode(LOOM_ACK_AUTH, 3, msg);
    ck_assert_int_eq(loom_ack_decode(msg, &code, &who), 0);
    ck_assert_int_eq(code, LOOM_ACK_AUTH);
    ck_assert_ptr_nonnull(strstr(loom_ack_reason(code), "LOOM_AUTH_KEY"));
}
END_TEST

Suite *loom_wire_suite(void)
{
    Suite *s = suite_create("wire");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, test_hello_roundtrip);
    tcase_add_test(tc, test_hello_refusals);
    tcase_add_test(tc, test_ack);
    tcase_add_test(tc, test_frame_roundtrip);
    tcase_add_test(tc, test_frame_garbage);
    tcase_add_test(tc, test_frame_check);
    tcase_add_test(tc, test_gave_up_fault);
    tcase_add_test(tc, test_stripe_slices);
    tcase_add_test(tc, test_frame_striped_kinds);
    tcase_add_test(tc, test_hello_streams);
    tcase_add_test(tc, test_sha256_vectors);
    tcase_add_test(tc, test_aead_vectors);
    tcase_add_test(tc, test_hmac_rfc4231);
    tcase_add_test(tc, test_hmac_keyed_and_hkdf);
    tcase_add_test(tc, test_auth_messages);
    tcase_add_test(tc, test_small_frames);
    suite_add_tcase(s, tc);
    return s;
}
