/* fuzz_shm_ring.c - the shared-memory ring consumer (shm_drain() in
 * transports/shm/shm_recv.c): the input is what a peer wrote into our ring,
 * head included, with or without a receive posted. Whatever the bytes, drain
 * must either consume them or fail the instance, within the ring's bounds. */
#include <stdlib.h>
#include <string.h>

#include "transports/shm/shm_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    loom_err_t err = {0};
    loom_tp_params_t p = {.rank = 0, .size = 2, .err = &err};
    char addr[128];
    loom_tp_t *tp;
    if (loom_shm_transport.create(&p, addr, sizeof(addr), &tp) != LOOM_SUCCESS)
        return 0;
    /* The peer is ourselves: its segment is ours, so wake-ups stay inside. */
    shm_peer_t *peer = &tp->peers[1];
    peer->local = 1;
    peer->seg = tp->seg;
    peer->seg_bytes = tp->seg_bytes;
    peer->pid = getpid();
    ring_t *ring = &tp->seg->rings[1];

    uint8_t flags = data[0];
    uint16_t start;
    memcpy(&start, data + 1, sizeof(start));
    uint64_t tail = (uint64_t)(start % (RING_BYTES / 8)) * 8 + ((flags & 1) ? 3 * RING_BYTES : 0);
    data += 3;
    size -= 3;
    size_t n = size < RING_BYTES ? size : RING_BYTES;
    for (size_t i = 0; i < n; i++)
        ring->data[(tail + i) % RING_BYTES] = data[i];
    atomic_store(&ring->tail, tail);
    /* Head as published: mostly what was written, sometimes a lie. */
    uint64_t head = tail + n;
    if (flags & 2)
        head = tail + ((uint64_t)flags << 12);
    if (flags & 4)
        head = tail - 8;
    atomic_store(&ring->head, head);

    uint8_t rbuf[256];
    loom_tp_req_t reqs[2] = {
        {.peer = 1, .buf = rbuf, .len = (flags >> 3) & 1 ? 64 : 256, .match = {.tag = 7}},
        {.peer = 1, .buf = rbuf, .len = 0, .match = {.tag = 8}},
    };
    if (flags & 8)
        shm_irecv(tp, &reqs[0]);
    if (flags & 16)
        shm_irecv(tp, &reqs[1]);
    for (int round = 0; round < 4 && !tp->failed; round++) {
        int moved = 0;
        shm_drain(tp, peer, &moved);
        uint64_t t = atomic_load(&ring->tail);
        if (!tp->failed && t != atomic_load(&ring->head))
            abort();   /* drain stopped short without failing */
    }
    /* Take early messages as a receiver would, then tear down. */
    if (!tp->failed) {
        uint8_t big[CHUNK_BYTES];
        loom_tp_req_t r = {.peer = 1, .buf = big, .len = 64, .match = {.tag = 9}};
        shm_irecv(tp, &r);
    }
    peer->local = 0;   /* its segment is ours: unmapped once, below */
    loom_unexp_free_all(&peer->uq);
    free(peer->fins);
    loom_shm_transport.destroy(tp, 0);
    return 0;
}
