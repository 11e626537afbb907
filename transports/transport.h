/*
 * transport.h - the one interface every transport implements.
 *
 * A transport instance (loom_tp_t) belongs to one communicator. It publishes an
 * address (swapped through the store by the core), connects to every peer, and
 * moves tagged messages: isend/irecv post requests, progress moves bytes and
 * completes them. A transport never knows which collective it serves; it only
 * checks that what arrives is what the receiver posted (tag, length, and the
 * descriptor of the collective).
 */
#ifndef LOOM_TRANSPORT_H
#define LOOM_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "loom.h"
#include "base/error.h"

typedef struct loom_tp loom_tp_t;

/* What a receiver matches and validates besides the length. */
typedef struct loom_tp_match {
    uint64_t tag;    /* collective: (1<<63) | seq<<24 | step; user p2p: the user tag */
    uint32_t desc;   /* collective id, dtype and op packed; must equal the sender's */
    uint64_t total;  /* element count of the whole call; must equal the sender's */
} loom_tp_match_t;

/* A posted send or receive. The poster fills the first block; the transport
 * owns the rest until done is set. Requests are caller-allocated (usually on
 * the algorithm's stack) and must stay put until done. */
typedef struct loom_tp_req {
    int peer;
    void *buf;            /* const for sends */
    size_t len;           /* bytes */
    loom_tp_match_t match;
    double posted_us;     /* when posted, for LOOM_TIMELINE's send/recv spans (0: untraced) */
    int is_send;
    int on_device;        /* buf is GPU memory: posted only where device_memory said 1 */
    /* transport-owned */
    volatile int done;
    loom_status_t status;
    size_t off;           /* bytes moved so far */
    struct loom_tp_req *next;
    uintptr_t tp_private[2];
} loom_tp_req_t;

/* Why an instance gave up, as its ranks tell each other (the GAVE_UP frame,
 * the shared-memory segment), so that every survivor names the rank that
 * stopped answering instead of the rank that passed the news on. */
typedef struct loom_tp_fault {
    int culprit;          /* the rank that stopped answering or was lost; -1: none known
                           * (a mismatch, an abort: the reporter is the one to look at) */
    int reporter;         /* the rank that gave up first; -1: not set */
    loom_status_t why;    /* what the reporter saw: LOOM_ERR_TIMEOUT, _PEER_LOST, ... */
    uint32_t waited_ms;   /* a timeout: how long the reporter waited (LOOM_TIMEOUT) */
} loom_tp_fault_t;

#define LOOM_TP_FAULT_NONE ((loom_tp_fault_t){.culprit = -1, .reporter = -1})

/* While its owner waits in progress, a transport tells every peer it is alive
 * at least this often (a counter in the shared segment; a keepalive frame
 * once nothing has moved for a quarter of LOOM_TIMEOUT, so that a healthy
 * job sends none): a rank that times out can then tell a peer that is itself
 * stuck waiting from one that stopped answering. */
#define LOOM_TP_KEEPALIVE_S 0.25

/* GPU memory for transports that move it themselves (GPUDirect RDMA), from the
 * accelerator (src/accel.h); NULL entries: none. */
typedef struct loom_tp_devmem {
    /* Whether the GPU holding device pointer p exports dma-bufs. */
    int (*dmabuf_supported)(const void *p);
    /* A dma-buf fd (the caller closes it) covering [p, p + len) of GPU memory and
     * the offset of p in it; 0, or -1 with errno. */
    int (*dmabuf_export)(const void *p, size_t len, int *fd_p, uint64_t *offset_p);
    /* Copy len bytes of host memory src into GPU memory dst and wait: a small
     * message a peer sent from host memory, for a receive into GPU memory
     * (send/recv between a staged and a direct rank); 0, or -1. */
    int (*copy_in)(void *dst, const void *src, size_t len);
    /* The allocation holding GPU pointer p: its start, size and an identity
     * that no later allocation shares, even at the same address (the driver's
     * buffer id), so a registration of it can be kept while it lives; 0, or
     * -1 when unknown. */
    int (*alloc_range)(const void *p, uintptr_t *base_p, size_t *size_p, uint64_t *id_p);
    /* The PCI bus id of the calling thread's GPU ("0000:03:00.0"), for the
     * GPU-HCA distance; 0, or -1. */
    int (*pci_bus_id)(char *buf, size_t len);
} loom_tp_devmem_t;

typedef struct loom_tp_params {
    int rank, size;
    uint64_t job_hash;       /* checked in the handshake: a stranger's job is refused */
    uint64_t comm_hash;      /* which communicator of the job this instance serves */
    const char *ifname;      /* LOOM_SOCKET_IFNAME, NULL: choose */
    const char *bind_host;   /* numeric host to listen on (from the store connection), or NULL */
    int sockbuf;             /* SO_SNDBUF/SO_RCVBUF, 0: kernel autotuning */
    const struct loom_settings *settings;   /* every LOOM_* setting (base/settings.h) */
    const char *host_id;     /* this rank's host identity (LOOM_HOST_ID or hostname+boot id) */
    const loom_tp_devmem_t *devmem;   /* GPU memory hooks, or NULL (no accelerator) */
    loom_err_t *err;         /* where failures are described (the communicator's) */
} loom_tp_params_t;

typedef struct loom_transport_ops {
    size_t size;             /* sizeof(loom_transport_ops_t) of the implementation */
    const char *name;        /* as LOOM_TRANSPORT names it */
    const char *medium;      /* what it runs over, for messages: "TCP", "shared memory" */
    /* Nonzero: serves the ranks of its own host only, made beside the network
     * transport unless LOOM_SHM=0; its address travels in the node-local
     * field of a rank's record. Zero: a network transport, of which
     * LOOM_TRANSPORT picks one (transports/transports.c). */
    int node_local;
    /* Open whatever accepts peers and describe it in addr (printable, NUL-terminated). */
    loom_status_t (*create)(const loom_tp_params_t *p, char *addr, size_t addrlen,
                            loom_tp_t **tp_p);
    /* Connect to every other rank, given all ranks' addresses (addrs[rank] is ours).
     * addrs[r] == NULL: another transport serves rank r (shared memory inside a
     * node); never connect to it, nothing will be posted for it. All connections
     * are set up in parallel and bounded by timeout_s. */
    loom_status_t (*connect)(loom_tp_t *tp, char *const *addrs, double timeout_s);
    loom_status_t (*isend)(loom_tp_t *tp, loom_tp_req_t *req);
    loom_status_t (*irecv)(loom_tp_t *tp, loom_tp_req_t *req);
    /* Move bytes. Waits at most timeout_ms (0: never blocks, <0: blocks) for
     * something to happen. *moved_p tells whether any byte moved or request
     * completed. Returns the failure state of the instance: once a peer is lost
     * every pending and later request fails with that status. */
    loom_status_t (*progress)(loom_tp_t *tp, int timeout_ms, int *moved_p);
    /* Optional (may be NULL): pin/register memory for zero-copy transports, for
     * as long as the handle lives (loom_comm_register_buffer); thread-safe
     * against isend/irecv/progress. A failure returns a status with errno set
     * and leaves tp's error alone (a running operation owns it). */
    loom_status_t (*mem_register)(loom_tp_t *tp, void *buf, size_t len, void **handle_p);
    void (*mem_deregister)(loom_tp_t *tp, void *handle);
    /* Thread-safe: fail everything with why and wake a blocked progress call. */
    void (*abort)(loom_tp_t *tp, loom_status_t why);
    /* Tell peers we leave on purpose, flush, close. Never blocks past timeout_s. */
    void (*destroy)(loom_tp_t *tp, double timeout_s);
    /* Optional (may be NULL): one-sided reads of a peer's memory, for
     * algorithms that work on their peers' buffers in place (cross-memory
     * attach inside a node). peer_readable says whether peer_read reaches that
     * peer; peer_read copies len bytes at the peer's address addr into buf. */
    int (*peer_readable)(loom_tp_t *tp, int peer);
    loom_status_t (*peer_read)(loom_tp_t *tp, int peer, void *buf, uint64_t addr, size_t len);
    /* Optional (may be NULL): a memory window of peer (ourselves included)
     * mapped in our address space, that node-local algorithms stage data in;
     * NULL when that peer has none. *len_p: its size. */
    void *(*window)(loom_tp_t *tp, int peer, size_t *len_p);
    /* Optional (may be NULL: no receive from any source): whether a message
     * of peer (ourselves included) with this tag has arrived, or begun to,
     * that no receive took yet; an irecv posted for it now takes it first.
     * Called as irecv is, by the thread that runs the communicator. */
    int (*probe)(loom_tp_t *tp, int peer, uint64_t tag);
    /* Optional (may be NULL: abort without a fault): abort, and tell every
     * peer it can reach who is to blame. The fault the instance recorded
     * first (a peer it lost, one a peer told it of) wins over this one. */
    void (*give_up)(loom_tp_t *tp, loom_status_t why, const loom_tp_fault_t *fault);
    /* Optional (may be NULL: none): the fault the instance recorded itself
     * (a peer it lost, or what a peer that gave up told it): 1 and *fault_p,
     * else 0. Called as progress is. */
    int (*fault)(loom_tp_t *tp, loom_tp_fault_t *fault_p);
    /* Optional (may be NULL: unknown): seconds since anything (a byte, a
     * keepalive) last came from peer; < 0 when unknown. Called as progress is. */
    double (*silent_s)(loom_tp_t *tp, int peer);
    /* Optional (may be NULL: every peer that published an address for it):
     * whether this instance can serve peer, given the address peer published
     * for this transport (NULL: none) and whether peer runs on our host.
     * Called after create, before connect; the core routes each peer to the
     * first transport of the list that reaches it. */
    int (*reaches)(loom_tp_t *tp, int peer, const char *peer_addr, int same_host);
    /* Optional (may be NULL): what loom-info shows of this transport on this
     * machine, as "#   " lines (devices found, what it is built with). */
    void (*describe)(FILE *out);
    /* Optional (may be NULL: never): whether isend/irecv to peer may carry GPU
     * memory (on_device requests: GPUDirect RDMA). 1 yes, 0 no (GPU buffers are
     * staged through host memory), -1 LOOM_NET_GDR=1 insists but it cannot;
     * why gets one line. Called as isend is. */
    int (*device_memory)(loom_tp_t *tp, int peer, char *why, size_t whylen);
    /* Optional (may be NULL: only LOOM_TIMEOUT tells): for algorithms that
     * wait for a change in peer's window rather than for a message, where
     * progress looks for no trouble with that peer: fail the instance, as
     * progress would for a receive, when peer gave up or its process is gone.
     * Returns the failure state. Called as progress is. */
    loom_status_t (*watch)(loom_tp_t *tp, int peer);
} loom_transport_ops_t;

/* The transports themselves are reached through the list (transports.h). */

#endif
