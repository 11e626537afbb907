/* wire.h - what travels on a connection: the handshake that opens it and the
 * header in front of every frame. Little-endian, fixed size, versioned. Parsing
 * lives here (not in a transport) so it is unit-tested on its own. */
#ifndef LOOM_WIRE_H
#define LOOM_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include "base/error.h"
#include "base/settings.h"
#include "base/crypto.h"
#include "transport.h"

/* 2: proofs bind both endpoints' published addresses, and with a key every
 * frame carries MACs under a per-connection session key.
 * 3: several TCP streams per peer (the hello names its stream and the count),
 * large messages striped across them (STRIPED and SLICE frames).
 * 4: GAVE_UP names the rank to blame, and a peer that gave up fails every
 * rank it reaches, whatever they wait on; KEEPALIVE frames while waiting.
 * 5: frames are sealed by an AEAD (AES-256-GCM or ChaCha20-Poly1305) instead
 * of HMAC-SHA256, and LOOM_AUTH_MAC=encrypt encrypts payloads; the hello
 * names the mode and the cipher.
 * 6: a small DATA frame whose payload is sealed (LOOM_AUTH_MAC=full or
 * encrypt) is one AEAD message, header, payload and one tag, instead of two
 * (loom_frame_small): a small call paid libcrypto's per-message set-up twice
 * on each side. */
#define LOOM_WIRE_VERSION 6

/* ---- handshake ------------------------------------------------------------ */
#define LOOM_HELLO_MAGIC "LOOMHELO"
#define LOOM_ACK_MAGIC   "LOOMACK!"
#define LOOM_HELLO_BYTES 40
#define LOOM_ACK_BYTES   16

typedef struct loom_hello {
    uint32_t version;
    uint32_t rank;        /* the connecting rank */
    uint32_t size;        /* communicator size it believes in */
    uint32_t stream;      /* which of the pair's sockets this is */
    uint64_t job_hash;
    uint64_t comm_hash;
} loom_hello_t;

/* Why an acceptor refused a hello (sent back in the ack). */
typedef enum {
    LOOM_ACK_OK = 0, LOOM_ACK_BAD_MAGIC, LOOM_ACK_BAD_VERSION, LOOM_ACK_OTHER_JOB,
    LOOM_ACK_BAD_RANK, LOOM_ACK_BAD_SIZE, LOOM_ACK_DUPLICATE, LOOM_ACK_AUTH,
    LOOM_ACK_MAC_MODE, LOOM_ACK_STREAMS, LOOM_ACK_CIPHER
} loom_ack_code_t;

/* The hello's stream field: the connection's stream index in the low byte,
 * the number of streams the connector opens per peer in the next; the high
 * bits are the LOOM_AUTH_KEY flags below. Stream 0 carries every frame that
 * matching and ordering depend on; the others only slices of large messages. */
#define LOOM_HELLO_STREAM_INDEX(s) ((s) & 0xffu)
#define LOOM_HELLO_STREAM_COUNT(s) (((s) >> 8) & 0xffu)
#define LOOM_HELLO_STREAMS(index, count) ((uint32_t)(index) | ((uint32_t)(count) << 8))

/* ---- LOOM_AUTH_KEY: mutual proof of a shared secret ------------------------
 * With a key, the hello's stream field carries LOOM_HELLO_AUTH and is followed
 * by the connector's nonce; the acceptor answers with a challenge (its nonce
 * and its proof), the connector with its proof, the acceptor with the ack.
 * A proof is HMAC-SHA256(key, role || hello || connector nonce || acceptor
 * nonce || binding), role 'A' or 'C': fresh nonces on both sides make every
 * proof good for one connection only, and neither side reveals anything
 * about the key. The binding (loom_auth_bind) names both endpoints as the
 * store published them, so a proof relayed through a process that rewrote
 * an address in the store does not match what the other end computes.
 * Both ends then derive the connection's session keys (loom_session_keys),
 * one per direction, and seal every frame with them (LOOM_MAC_BYTES tags). */
#define LOOM_HELLO_AUTH  0x80000000u
#define LOOM_HELLO_MAC_HEADERS 0x40000000u   /* LOOM_AUTH_MAC=headers */
#define LOOM_HELLO_MAC_ENCRYPT 0x20000000u   /* LOOM_AUTH_MAC=encrypt */
#define LOOM_HELLO_CHACHA      0x10000000u   /* ChaCha20-Poly1305, else AES-256-GCM */
#define LOOM_NONCE_BYTES 16
#define LOOM_CHAL_MAGIC  "LOOMCHAL"
#define LOOM_CHAL_BYTES  (8 + LOOM_NONCE_BYTES + 32)
#define LOOM_PROOF_MAGIC "LOOMPROF"
#define LOOM_PROOF_BYTES (8 + 32)
#define LOOM_BIND_BYTES  32
/* A frame's tags are the AEAD's (128 bits). */
#define LOOM_MAC_BYTES   LOOM_AEAD_TAG_BYTES

/* SHA-256 over the job, the communicator and both endpoints: the connector's
 * rank and published identity (an address, or a QP record), the acceptor's. */
void loom_auth_bind(uint64_t job_hash, uint64_t comm_hash, int size, int connector,
                    const void *cident, size_t cidentlen, int acceptor, const void *aident,
                    size_t aidentlen, uint8_t out[LOOM_BIND_BYTES]);
void loom_auth_proof(const void *key, size_t keylen, char role,
                     const uint8_t hello[LOOM_HELLO_BYTES],
                     const uint8_t nonce_c[LOOM_NONCE_BYTES],
                     const uint8_t nonce_a[LOOM_NONCE_BYTES],
                     const uint8_t bind[LOOM_BIND_BYTES], uint8_t out[32]);
/* HKDF-SHA256 from the shared key (salt: both nonces, info: the binding):
 * c2a seals what the connector sends, a2c what the acceptor sends. */
void loom_session_keys(const void *key, size_t keylen, const uint8_t nonce_c[LOOM_NONCE_BYTES],
                       const uint8_t nonce_a[LOOM_NONCE_BYTES],
                       const uint8_t bind[LOOM_BIND_BYTES], uint8_t c2a[32], uint8_t a2c[32]);
void loom_chal_encode(const uint8_t nonce_a[LOOM_NONCE_BYTES], const uint8_t proof[32],
                      uint8_t out[LOOM_CHAL_BYTES]);
/* Returns 0 when in is a well-formed challenge (fills nonce_a, proof), -1 otherwise. */
int loom_chal_decode(const uint8_t in[LOOM_CHAL_BYTES], uint8_t nonce_a[LOOM_NONCE_BYTES],
                     uint8_t proof[32]);
void loom_proof_encode(const uint8_t proof[32], uint8_t out[LOOM_PROOF_BYTES]);
int loom_proof_decode(const uint8_t in[LOOM_PROOF_BYTES], uint8_t proof[32]);

void loom_hello_encode(const loom_hello_t *h, uint8_t out[LOOM_HELLO_BYTES]);
/* Decode and check a hello against what this acceptor expects. Returns
 * LOOM_ACK_OK and fills h, or the reason to refuse. */
loom_ack_code_t loom_hello_decode(const uint8_t in[LOOM_HELLO_BYTES], uint64_t job_hash,
                                  uint64_t comm_hash, int my_rank, int size, loom_hello_t *h);
void loom_ack_encode(loom_ack_code_t code, uint32_t rank, uint8_t out[LOOM_ACK_BYTES]);
/* Returns 0 when in is a well-formed ack (fills code and rank), -1 otherwise. */
int loom_ack_decode(const uint8_t in[LOOM_ACK_BYTES], loom_ack_code_t *code, uint32_t *rank);
const char *loom_ack_reason(loom_ack_code_t code);

/* ---- frames --------------------------------------------------------------- */
#define LOOM_FRAME_MAGIC 0x4d464c4cu   /* "LLFM" */
#define LOOM_FRAME_BYTES 40
/* No honest frame is larger: a header announcing more is a protocol error,
 * caught before anything is allocated for it. */
#define LOOM_FRAME_MAX_LEN (UINT64_C(1) << 40)

/* BYE: the sender destroyed its communicator on purpose; GAVE_UP: its
 * communicator failed (a mismatch it found, an abort, a lost peer, a
 * timeout), so no collective with it can complete: its header carries the
 * fault (loom_gave_up_encode), which the receiver passes on. KEEPALIVE: the
 * sender waits and is alive (sent at most every LOOM_TP_KEEPALIVE_S while it
 * waits). None carries a payload. */
/* STRIPED: a DATA frame whose payload is split across the pair's streams:
 * the header (len: the whole message) and slice 0 travel on stream 0, where
 * they are matched and ordered as any frame; SLICE: the header of slice k on
 * stream k (len: that slice), repeating the message's tag, descriptor and
 * total so that a stream out of step is caught. Every stream takes its slices
 * in the order stream 0 announced their messages. */
typedef enum {
    LOOM_FRAME_DATA = 1, LOOM_FRAME_BYE = 2, LOOM_FRAME_GAVE_UP = 3, LOOM_FRAME_STRIPED = 4,
    LOOM_FRAME_SLICE = 5, LOOM_FRAME_KEEPALIVE = 6
} loom_frame_kind_t;

typedef struct loom_frame {
    uint8_t kind;
    loom_tp_match_t match;
    uint64_t len;
} loom_frame_t;

void loom_frame_encode(const loom_frame_t *f, uint8_t out[LOOM_FRAME_BYTES]);
/* A GAVE_UP frame's fields carry the fault: the tag the culprit and the
 * reporter (each + 1, 0: none), desc the status the reporter saw, total the
 * milliseconds it waited. decode fills what a frame from rank peer says
 * (a reporter out of range: peer itself). */
void loom_gave_up_encode(const loom_tp_fault_t *fault, loom_frame_t *f);
void loom_gave_up_decode(const loom_frame_t *f, int peer, int size, loom_tp_fault_t *fault);
/* One direction of a sealed connection: the AEAD under that direction's
 * session key, one context for headers and one for payloads (a payload may
 * still be sealing while the next header is). Frame seq's header is sealed
 * with the nonce ('H', seq), its payload with ('P', seq): the header is the
 * associated data of its own tag; the payload is associated data
 * (LOOM_AUTH_MAC=full) or encrypted (encrypt), fed in pieces as it travels
 * (loom_aead_aad or loom_aead_crypt on pay), and its tag follows it. A
 * sequence number is never used twice: a sender stops before it wraps. */
typedef struct loom_seal {
    loom_aead_t hdr, pay;
} loom_seal_t;
/* sending 1: seals (the sender's side), 0: opens. 0, or -1 (libcrypto failed). */
int loom_seal_init(loom_seal_t *s, loom_aead_alg_t alg, const uint8_t key[LOOM_AEAD_KEY_BYTES],
                   int sending);
void loom_seal_fini(loom_seal_t *s);
/* The header's tag (seal), or whether tag is right (open: 0, else -1). */
int loom_frame_seal_header(loom_seal_t *s, uint64_t seq, const uint8_t hdr[LOOM_FRAME_BYTES],
                           uint8_t tag[LOOM_MAC_BYTES]);
int loom_frame_open_header(loom_seal_t *s, uint64_t seq, const uint8_t hdr[LOOM_FRAME_BYTES],
                           const uint8_t tag[LOOM_MAC_BYTES]);
/* Start frame seq's payload on s->pay. */
int loom_frame_payload_start(loom_seal_t *s, uint64_t seq);

/* Small frames: a DATA frame of 1 to LOOM_FRAME_SMALL_MAX payload bytes whose
 * payload is sealed travels as header, payload (encrypted or not) and one tag
 * over both, under the nonce ('F', seq) that no other message of the frame
 * uses. Its header cannot be checked on its own, so the receiver reads the
 * kind and length from the unchecked header only to find where the frame
 * ends, takes the whole frame (it fits the staging buffer) and acts on the
 * header once the tag matched: a header changed on the way is never acted on,
 * whether it still looks small or not (then its 16 bytes after the header
 * are no header tag). Small enough that a frame stays below the sizes the
 * TCP transport reads into place or holds in the socket. */
#define LOOM_FRAME_SMALL_MAX (16 * 1024)
/* 1 when a frame of this kind and payload length is sealed as a small frame. */
int loom_frame_small(unsigned kind, uint64_t len);
/* The same test on an encoded header that has not been checked yet. */
int loom_frame_small_hdr(const uint8_t hdr[LOOM_FRAME_BYTES]);
/* Seal: the tag over hdr and the len bytes at pay; with encrypt, pay is
 * encrypted into out (which may be pay), else out is not touched. Open: the
 * same on the received bytes, decrypting pay in place with encrypt; 0 only
 * when the tag matches. Both use s->hdr, so they fit between frames of s. */
int loom_frame_seal_small(loom_seal_t *s, uint64_t seq, const uint8_t hdr[LOOM_FRAME_BYTES],
                          const uint8_t *pay, uint8_t *out, size_t len, int encrypt,
                          uint8_t tag[LOOM_MAC_BYTES]);
int loom_frame_open_small(loom_seal_t *s, uint64_t seq, const uint8_t hdr[LOOM_FRAME_BYTES],
                          uint8_t *pay, size_t len, int encrypt, const uint8_t tag[LOOM_MAC_BYTES]);
/* Parse a header from peer; on garbage return LOOM_ERR_TRANSPORT with a message. */
loom_status_t loom_frame_decode(const uint8_t in[LOOM_FRAME_BYTES], int peer, loom_frame_t *f,
                                loom_err_t *err);
/* Check an arrived frame against the receive it matched (same tag). Length,
 * collective descriptor and total count must agree, else LOOM_ERR_MISMATCH
 * with a message that names both sides. */
loom_status_t loom_frame_check(const loom_frame_t *f, const loom_tp_req_t *posted, int my_rank,
                               loom_err_t *err);

/* Where slice k of a len-byte message striped over nstreams streams lies:
 * equal slices of whole 4 KiB pages (when the message is that big), the last
 * one taking the rest; every byte in exactly one slice, in stream order. */
void loom_stripe_slice(uint64_t len, int nstreams, int k, uint64_t *beg_p, uint64_t *len_p);

/* Descriptor of a call: collective (or 0xff for user p2p), dtype, op. */
uint32_t loom_desc_make(int coll, int dtype, int op);
/* "allreduce float32 sum" for messages; buf must hold 64 bytes. */
const char *loom_desc_str(uint32_t desc, char *buf, size_t len);

#endif
