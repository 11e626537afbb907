/* tcp_int.h - what the tcp:// store's client (store/tcp_client.c), server
 * (store/tcp_server.c) and wire encoding (store/proto.c) share: big-endian
 * field access. The protocol itself is described in store/proto.h. */
#ifndef LOOM_STORE_TCP_INT_H
#define LOOM_STORE_TCP_INT_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

static inline void put32(uint8_t *p, uint32_t v)
{
    v = htobe32(v);
    memcpy(p, &v, 4);
}

static inline void put64(uint8_t *p, uint64_t v)
{
    v = htobe64(v);
    memcpy(p, &v, 8);
}

static inline uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return be32toh(v);
}

static inline uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return be64toh(v);
}

#endif
