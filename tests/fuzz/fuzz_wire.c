/* fuzz_wire.c - the wire decoders (transports/wire.c): handshake hello, ack,
 * challenge, proof and frame header, each decoded from the input and, when
 * accepted, encoded again and compared: what a decoder accepts must survive a
 * round trip. */
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
    switch (which % 5) {
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
