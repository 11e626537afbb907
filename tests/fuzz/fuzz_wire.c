/* fuzz_wire.c - the wire decoders (transports/wire.c): handshake hello, ack,
 * challenge, proof and frame header, each decoded from the input and, when
 * accepted, encoded again and compared: what a decoder accepts must survive a
 * round trip; and sealed frames (wire.h: loom_seal_t): a header and tag from
 * the input must not open (a forgery), one sealed here must, and a payload
 * from the input must come back whole through encrypt and open, in pieces. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transports/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t buf[64] = {0}, out[64];
    if (size < 1)
        return 0;
    uint8_t which = data[0];
    memcpy(buf, data + 1, size - 1 < sizeof(buf) ? size - 1 : sizeof(buf));
    loom_err_t err = {0};
    switch (which % 6) {
    case 0: {
        loom_hello_t h;
        int my_rank = which >> 3, sz = 1 + (which >> 3);
        if (loom_hello_decode(buf, 0x1234, 0x5678, my_rank, sz, &h) == LOOM_ACK_OK) {
            loom_hello_encode(&h, out);
            loom_hello_t h2;
            if (loom_hello_decode(out, 0x1234, 0x5678, my_rank, sz, &h2) != LOOM_ACK_OK ||
                memcmp(&h, &h2, sizeof(h)) != 0)
                abort();
        }
        break;
    }
    case 1: {
        loom_ack_code_t code;
        uint32_t rank;
        if (loom_ack_decode(buf, &code, &rank) == 0) {
            (void)loom_ack_reason(code);
            loom_ack_encode(code, rank, out);
            if (memcmp(out, buf, LOOM_ACK_BYTES) != 0)
                abort();
        }
        break;
    }
    case 2: {
        uint8_t nonce[LOOM_NONCE_BYTES], proof[32];
        if (loom_chal_decode(buf, nonce, proof) == 0) {
            loom_chal_encode(nonce, proof, out);
            if (memcmp(out, buf, LOOM_CHAL_BYTES) != 0)
                abort();
        }
        if (loom_proof_decode(buf, proof) == 0) {
            loom_proof_encode(proof, out);
            if (memcmp(out, buf, LOOM_PROOF_BYTES) != 0)
                abort();
        }
        break;
    }
    case 3: {
        loom_frame_t f;
        if (loom_frame_decode(buf, 1, &f, &err) == LOOM_SUCCESS) {
            if (f.len > LOOM_FRAME_MAX_LEN)
                abort();
            char d[64];
            (void)loom_desc_str(f.match.desc, d, sizeof(d));
            uint8_t rb[16];
            loom_tp_req_t posted = {.peer = 1, .buf = rb, .len = sizeof(rb),
                                    .match = f.match};
            (void)loom_frame_check(&f, &posted, 0, &err);
        }
        break;
    }
    case 4: {
        static const uint8_t key[LOOM_AEAD_KEY_BYTES] = "fuzz session key, 32 bytes long";
        loom_aead_alg_t alg = (which >> 3) & 1 ? LOOM_AEAD_CHACHA20_POLY1305 : LOOM_AEAD_AES_256_GCM;
        loom_seal_t tx, rx;
        if (loom_seal_init(&tx, alg, key, 1) != 0)
            abort();
        if (loom_seal_init(&rx, alg, key, 0) != 0)
            abort();
        uint64_t seq = which >> 4;
        uint8_t tag[LOOM_MAC_BYTES];
        if (loom_frame_open_header(&rx, seq, buf, buf + LOOM_FRAME_BYTES) == 0)
            abort();   /* a forged tag passed */
        if (loom_frame_seal_header(&tx, seq, buf, tag) != 0 ||
            loom_frame_open_header(&rx, seq, buf, tag) != 0 ||
            loom_frame_open_header(&rx, seq + 1, buf, tag) == 0)
            abort();
        size_t n = size - 1, cut = n / 3;
        uint8_t *pay = malloc(n + 1);
        if (!pay)
            abort();
        memcpy(pay, data + 1, n);
        if (loom_frame_payload_start(&tx, seq) != 0 || loom_aead_crypt(&tx.pay, pay, pay, cut) != 0 ||
            loom_aead_crypt(&tx.pay, pay + cut, pay + cut, n - cut) != 0 ||
            loom_aead_seal_tag(&tx.pay, tag) != 0)
            abort();
        if (loom_frame_payload_start(&rx, seq) != 0 ||
            loom_aead_crypt(&rx.pay, pay, pay, n - cut) != 0 ||
            loom_aead_crypt(&rx.pay, pay + n - cut, pay + n - cut, cut) != 0 ||
            loom_aead_open_tag(&rx.pay, tag) != 0 || memcmp(pay, data + 1, n) != 0)
            abort();
        /* A small frame: buf as its header, the payload in one piece. */
        size_t k = n < LOOM_FRAME_SMALL_MAX ? n : LOOM_FRAME_SMALL_MAX;
        int enc = (which >> 2) & 1;
        if (loom_frame_open_small(&rx, seq, buf, pay, k, enc, buf + LOOM_FRAME_BYTES) == 0)
            abort();   /* a forged tag passed */
        memcpy(pay, data + 1, k);
        if (loom_frame_seal_small(&tx, seq, buf, pay, pay, k, enc, tag) != 0 ||
            loom_frame_open_small(&rx, seq, buf, pay, k, enc, tag) != 0 ||
            memcmp(pay, data + 1, k) != 0)
            abort();
        free(pay);
        loom_seal_fini(&tx);
        loom_seal_fini(&rx);
        break;
    }
    default: {
        char d[64];
        uint32_t desc;
        memcpy(&desc, buf, sizeof(desc));
        (void)loom_desc_str(desc, d, sizeof(d));
        if (strlen(d) >= sizeof(d))
            abort();
        break;
    }
    }
    return 0;
}
