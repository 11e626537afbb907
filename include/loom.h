/*
 * loom.h - the public C API of Loom, a collective-communication library for
 * data-parallel deep learning.
 *
 * Conventions (see docs/design.md):
 *  - argument order follows MPI/NCCL: buffers, count, dtype, op, (root), comm;
 *  - counts are elements, not bytes; a count of 0 is legal;
 *  - every call returns a loom_status_t and, on failure, leaves a readable
 *    message in loom_comm_last_error();
 *  - the caller owns every buffer and handle; outputs are set only on success.
 */
#ifndef LOOM_H
#define LOOM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(LOOM_BUILDING) && defined(__GNUC__)
#define LOOM_API __attribute__((visibility("default")))
#else
#define LOOM_API
#endif

#define LOOM_VERSION_MAJOR 0
#define LOOM_VERSION_MINOR 1
#define LOOM_VERSION_PATCH 0

/** Opaque communicator handle. */
typedef struct loom_comm *loom_comm_t;
/** Opaque handle of a non-blocking operation; completed by loom_wait/loom_test. */
typedef struct loom_request *loom_request_t;

/** Status codes. LOOM_SUCCESS is 0; everything else is a failure. */
typedef enum {
    LOOM_SUCCESS = 0,
    LOOM_ERR_INVALID_ARG,  /**< a bad argument: NULL buffer, unknown dtype, rank out of range */
    LOOM_ERR_NO_MEMORY,
    LOOM_ERR_TIMEOUT,      /**< nothing moved for LOOM_TIMEOUT seconds */
    LOOM_ERR_PEER_LOST,    /**< a peer closed its connection or died */
    LOOM_ERR_TRANSPORT,    /**< a socket or device error */
    LOOM_ERR_MISMATCH,     /**< ranks disagree on the collective, count, dtype or op */
    LOOM_ERR_UNSUPPORTED,
    LOOM_ERR_AUTH,         /**< handshake refused (job, version, key) or a MAC mismatch */
    LOOM_ERR_ABORTED,      /**< loom_comm_abort was called */
    LOOM_ERR_INTERNAL
} loom_status_t;

/** Element types. LOOM_FLOAT16 is IEEE binary16; LOOM_BFLOAT16 is bfloat16.
 *  The 16-bit integers came later: they are last, so the values of the others
 *  (which travel on the wire) stay. */
typedef enum {
    LOOM_INT8, LOOM_UINT8, LOOM_INT32, LOOM_UINT32, LOOM_INT64, LOOM_UINT64,
    LOOM_FLOAT16, LOOM_BFLOAT16, LOOM_FLOAT32, LOOM_FLOAT64, LOOM_INT16, LOOM_UINT16
} loom_dtype_t;
#define LOOM_NUM_DTYPES 12

/** Reduction operators. LOOM_AVG sums, then divides by the rank count
 *  (integer types truncate toward zero, as C division does). LOOM_BAND, LOOM_BOR
 *  and LOOM_BXOR (bitwise and, or, exclusive or, as Gloo and MPI_BAND offer)
 *  take integer dtypes only: a floating-point dtype gets LOOM_ERR_INVALID_ARG. */
typedef enum {
    LOOM_SUM, LOOM_PROD, LOOM_MIN, LOOM_MAX, LOOM_AVG, LOOM_BAND, LOOM_BOR, LOOM_BXOR
} loom_op_t;
#define LOOM_NUM_OPS 8

/** Pass as sendbuf (or make sendbuf == recvbuf) to reduce in place. */
#define LOOM_IN_PLACE ((const void *)1)

/** Color for loom_comm_split meaning "not a member of any new communicator". */
#define LOOM_UNDEFINED (-1)

/** Name of a status code ("invalid argument", ...). Never NULL. */
LOOM_API const char *loom_strerror(loom_status_t s);
/** Detailed text of the last failure on this communicator ("" if none). With a
 *  NULL communicator, the last failure of loom_init/loom_comm_create on this thread. */
LOOM_API const char *loom_comm_last_error(loom_comm_t c);
/** Library version, "major.minor.patch". */
LOOM_API const char *loom_version(void);
/** Size in bytes of one element of dt, or 0 for an unknown type. */
LOOM_API size_t loom_dtype_size(loom_dtype_t dt);

/** Explicit configuration; start from LOOM_CONFIG_INIT so new fields get defaults. */
typedef struct loom_config {
    size_t      struct_size;   /**< sizeof(loom_config_t) of the caller: lets the struct grow */
    int         rank, size;
    const char *store;         /**< rendezvous URI, as LOOM_STORE; NULL: LOOM_STORE */
    double      timeout_s;     /**< 0: LOOM_TIMEOUT or the default (300 s) */
} loom_config_t;
#define LOOM_CONFIG_INIT { sizeof(loom_config_t), -1, -1, NULL, 0.0 }

/** Create the world communicator from the environment (LOOM_*, torchrun, Slurm,
 *  Open MPI, PMI; see loom-info and docs/design.md). */
LOOM_API loom_status_t loom_init(loom_comm_t *comm);
/** Create a communicator from an explicit configuration. */
LOOM_API loom_status_t loom_comm_create(const loom_config_t *cfg, loom_comm_t *comm);
/* ---- A key-value store of the caller's. ------------------------------------
 * For frameworks that already hold a rendezvous store (torch.distributed's
 * TCPStore/FileStore/PrefixStore, a PMIx server, a job scheduler's database):
 * Loom rendezvouses through these callbacks instead of opening LOOM_STORE, as
 * Gloo does through its Store interface and UCC through its out-of-band calls.
 * Every callback returns LOOM_SUCCESS or a failure status and, on failure,
 * may write a NUL-terminated message of at most msglen bytes into msg, which
 * Loom passes on in loom_comm_last_error. Loom calls them from the thread that
 * creates (or splits) a communicator, one call at a time per store; they must
 * not call back into Loom. Keys are NUL-terminated strings; values are bytes.
 * Each communicator created on a store writes its keys under the same names,
 * so give each one a key space of its own (torch's PrefixStore does that). */
typedef struct loom_store_callbacks {
    size_t struct_size;   /**< sizeof(loom_store_callbacks_t) of the caller */
    void  *ctx;           /**< passed as the first argument of every callback */
    /** Store val (len bytes) under key, replacing any earlier value. Required. */
    loom_status_t (*set)(void *ctx, const char *key, const void *val, size_t len,
                         char *msg, size_t msglen);
    /** Wait until key exists, at most timeout_s seconds (0: look once, do not
     *  wait), then return a copy of its value in *val_p, allocated with malloc
     *  (Loom frees it), and its length in *len_p. A key still absent:
     *  LOOM_ERR_TIMEOUT. Required. */
    loom_status_t (*get)(void *ctx, const char *key, double timeout_s, void **val_p,
                         size_t *len_p, char *msg, size_t msglen);
    /** Atomically add delta to the decimal integer at key (absent counts as 0),
     *  store the result as decimal text and return it in *value_p. Required. */
    loom_status_t (*add)(void *ctx, const char *key, int64_t delta, int64_t *value_p,
                         char *msg, size_t msglen);
    /** Delete key; *existed_p tells whether it was there. NULL: Loom never
     *  deletes (the keys stay until the store goes). */
    loom_status_t (*del)(void *ctx, const char *key, int *existed_p, char *msg, size_t msglen);
    /** Like get without the value, for a store that can wait more cheaply than
     *  it can read. NULL: Loom uses get. */
    loom_status_t (*wait)(void *ctx, const char *key, double timeout_s, char *msg, size_t msglen);
    /** Called once, when the last communicator that uses the store (the one
     *  created and those split from it) is destroyed, or when the creation
     *  fails. NULL: nothing to release. */
    void (*release)(void *ctx);
} loom_store_callbacks_t;

/** Create a communicator of cfg->size ranks (cfg->rank is this one's) that
 *  rendezvouses through the caller's store (cfg->store is ignored). The
 *  callbacks are copied; ctx must stay valid until release is called (always
 *  called, on success or failure, when it is not NULL). */
LOOM_API loom_status_t loom_comm_create_with_store(const loom_config_t *cfg,
                                                   const loom_store_callbacks_t *store,
                                                   loom_comm_t *comm);

/** Collective over c: ranks with the same color form a new communicator ordered by
 *  (key, rank in c). color LOOM_UNDEFINED yields *out == NULL. */
LOOM_API loom_status_t loom_comm_split(loom_comm_t c, int color, int key, loom_comm_t *out);
/** Release c. Pending non-blocking operations are completed (or fail) first;
 *  their requests must still be finished with loom_wait/loom_test before this
 *  call, since they refer to c. */
LOOM_API loom_status_t loom_comm_destroy(loom_comm_t c);
/** Fail every pending and later operation on c with LOOM_ERR_ABORTED. Thread-safe:
 *  meant to be called from another thread than the one blocked in a collective. */
LOOM_API loom_status_t loom_comm_abort(loom_comm_t c);

/** Opaque handle of a buffer registered with loom_comm_register_buffer. */
typedef struct loom_buffer_reg *loom_buffer_reg_t;
/** Register [buf, buf + len) with c's network transport for as long as the
 *  handle lives, as ncclCommRegister does: messages that lie inside it move
 *  without registering memory per call (InfiniBand/RoCE: pinned once). The
 *  caller promises that the range stays mapped, with the same pages, until
 *  loom_comm_deregister_buffer: freeing or remapping it before that makes the
 *  HCA read and write the old pages (wrong results). Meant for long-lived
 *  buffers such as a framework's allocator pool. Unregistered memory is always
 *  safe to use (see docs/ibverbs.md). A transport that needs no
 *  registration (TCP, shared memory) returns a handle that does nothing. Not
 *  collective; thread-safe against calls running on c. */
LOOM_API loom_status_t loom_comm_register_buffer(loom_comm_t c, void *buf, size_t len,
                                                 loom_buffer_reg_t *reg);
/** Release a registration of c (before loom_comm_destroy of c). NULL: nothing. */
LOOM_API loom_status_t loom_comm_deregister_buffer(loom_comm_t c, loom_buffer_reg_t reg);

/* ---- Elastic jobs. ---------------------------------------------------------
 * With LOOM_ELASTIC=1 (loomrun --elastic sets it) loom_init forms the world
 * communicator through a membership round in the store instead of a fixed
 * rank count, and it belongs to epoch 0. A process started later with
 * LOOM_ELASTIC=1 joins the same way: its loom_init returns once the members
 * rebuild (loom_comm_join_pending tells them someone waits), bounded by
 * LOOM_ELASTIC_TIMEOUT (default LOOM_TIMEOUT). The store must be served
 * outside the ranks (loomrun, loom-store, redis): rank 0 does not serve it.
 * LOOM_ELASTIC_ID names the process for the launcher (else the store numbers
 * it); LOOM_ELASTIC_MIN_NP is the fewest ranks an epoch may have (default 1).
 * A typical loop: on any failure, roll back to the last commit, call
 * loom_comm_rebuild, destroy the old communicator, broadcast the committed
 * state from rank 0 (a survivor), carry on. */

/** Give up on c for every rank: every pending and later call on c fails with
 *  LOOM_ERR_PEER_LOST, here at once and, when c is elastic, on every other
 *  rank within a fraction of a second (the epoch is marked revoked in the
 *  store, which a watcher thread of each rank reads). An elastic communicator
 *  also revokes itself when one of its calls fails. Communicators split from
 *  an elastic one share its epoch: revoking either revokes both (they cannot
 *  be rebuilt themselves: split the rebuilt one again). Thread-safe. */
LOOM_API loom_status_t loom_comm_revoke(loom_comm_t c);
/** Form the next epoch of the elastic communicator old (revoking old first):
 *  the members of old that call it and any processes waiting to join agree on
 *  the membership through the store, and *out gets the new communicator.
 *  Members keep their relative order and come first (so rank 0 of the new
 *  epoch is a member of the old one whenever any is left); newcomers follow.
 *  The round waits for every member of old that the launcher has not reported
 *  dead; one that does not come within LOOM_ELASTIC_TIMEOUT is left out when
 *  at least LOOM_ELASTIC_MIN_NP ranks are there, else the call fails with
 *  LOOM_ERR_TIMEOUT naming who was waited for. A member that dies during the
 *  rebuild sends the others on to the following round. A process left out of
 *  an epoch is stale: its rebuild fails with LOOM_ERR_ABORTED ("stale rank"),
 *  and its connections are refused by the new epoch's handshake. old stays
 *  valid (revoked) until loom_comm_destroy. */
LOOM_API loom_status_t loom_comm_rebuild(loom_comm_t old, loom_comm_t *out);
/** The epoch of c: 0 for the first elastic communicator (and any that is not
 *  elastic), one more for each loom_comm_rebuild round that formed. */
LOOM_API uint64_t loom_comm_epoch(loom_comm_t c);
/** Collective over c: *pending is the number of processes waiting to join
 *  the next epoch, the same on every rank; call it at a commit point and
 *  rebuild when it is > 0. 0 for a communicator that is not elastic. */
LOOM_API loom_status_t loom_comm_join_pending(loom_comm_t c, int *pending);
/** Not collective: the number of processes waiting to join the next epoch,
 *  or on their way (started by the launcher: loomrun --elastic says how many),
 *  as this rank reads the store now (ranks may read different numbers; decide
 *  with loom_comm_join_pending). A rank may poll it while it waits for new
 *  hosts. Thread-safe against calls running on c. 0 when c is not elastic. */
LOOM_API loom_status_t loom_comm_join_waiting(loom_comm_t c, int *waiting);

/** This process's rank in c, and the number of ranks. Not collective; any thread. */
LOOM_API int loom_comm_rank(loom_comm_t c);
LOOM_API int loom_comm_size(loom_comm_t c);
/** Rank among the ranks of c on this node, and how many those are ("node": the
 *  same host identity, LOOM_HOST_ID or hostname and boot id). */
LOOM_API int loom_comm_local_rank(loom_comm_t c);
LOOM_API int loom_comm_local_size(loom_comm_t c);
/** Index of this node among the nodes c spans, and how many nodes it spans. */
LOOM_API int loom_comm_node_rank(loom_comm_t c);
LOOM_API int loom_comm_node_count(loom_comm_t c);

/* ---- Collectives (blocking). ----------------------------------------------
 * Every call here is collective over c: every rank calls it, in the same order
 * as its other collectives, with the same count, dtype, op and root (a rank
 * that disagrees makes every rank fail with LOOM_ERR_MISMATCH instead of
 * reading garbage). The calls on one communicator come from one thread at a
 * time, as in MPI and NCCL (loom_comm_abort and loom_comm_revoke excepted);
 * different communicators may be used from different threads at once. A call
 * that fails leaves c unusable (destroy it; elastic jobs rebuild it). */

/** recvbuf gets the element-wise op of every rank's count elements of sendbuf.
 *  In place: sendbuf == LOOM_IN_PLACE (or recvbuf), input in recvbuf. */
LOOM_API loom_status_t loom_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                                      loom_dtype_t dt, loom_op_t op, loom_comm_t c);
/** buf of root is copied into buf of every other rank. */
LOOM_API loom_status_t loom_broadcast(void *buf, size_t count, loom_dtype_t dt, int root,
                                      loom_comm_t c);
/** recvbuf is significant at root only. */
LOOM_API loom_status_t loom_reduce(const void *sendbuf, void *recvbuf, size_t count,
                                   loom_dtype_t dt, loom_op_t op, int root, loom_comm_t c);
/** recvbuf holds size*sendcount elements, rank r's block at r*sendcount.
 *  In place: sendbuf == LOOM_IN_PLACE and the block is already at its place. */
LOOM_API loom_status_t loom_allgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                      loom_dtype_t dt, loom_comm_t c);
/** Rank r contributes sendcount elements (recvcounts[r] on every rank), placed
 *  at displs[r] of recvbuf. In place as loom_allgather, at displs[rank]. */
LOOM_API loom_status_t loom_allgatherv(const void *sendbuf, size_t sendcount, void *recvbuf,
                                       const size_t *recvcounts, const size_t *displs,
                                       loom_dtype_t dt, loom_comm_t c);
/** sendbuf holds size*recvcount elements; rank r gets the reduction of block r.
 *  In place: sendbuf == LOOM_IN_PLACE, input in recvbuf (size*recvcount elements),
 *  result in its first recvcount elements. */
LOOM_API loom_status_t loom_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                           loom_dtype_t dt, loom_op_t op, loom_comm_t c);
/** count elements go from every rank to every rank. */
LOOM_API loom_status_t loom_alltoall(const void *sendbuf, void *recvbuf, size_t count,
                                     loom_dtype_t dt, loom_comm_t c);
/** Rank r sends sendcounts[j] elements at sdispls[j] to rank j and receives
 *  recvcounts[j] elements from rank j at rdispls[j]; j's sendcounts[r] must
 *  equal r's recvcounts[j]. In place: sendbuf == LOOM_IN_PLACE; sendcounts
 *  and sdispls are then ignored and recvcounts, rdispls serve both sides, as
 *  with MPI_IN_PLACE. */
LOOM_API loom_status_t loom_alltoallv(const void *sendbuf, const size_t *sendcounts,
                                      const size_t *sdispls, void *recvbuf,
                                      const size_t *recvcounts, const size_t *rdispls,
                                      loom_dtype_t dt, loom_comm_t c);
/** recvbuf significant at root only (size*sendcount elements). */
LOOM_API loom_status_t loom_gather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                   loom_dtype_t dt, int root, loom_comm_t c);
/** sendbuf significant at root only (size*recvcount elements). */
LOOM_API loom_status_t loom_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                    loom_dtype_t dt, int root, loom_comm_t c);
/** Returns once every rank of c has called it. */
LOOM_API loom_status_t loom_barrier(loom_comm_t c);
/** Tagged point-to-point; tag must be >= 0. Messages between a pair with the same
 *  tag arrive in order. The received count must equal the sent one. */
LOOM_API loom_status_t loom_send(const void *buf, size_t count, loom_dtype_t dt, int peer,
                                 int tag, loom_comm_t c);
/** Receive from peer the message sent with tag (not collective; peer must
 *  call loom_send with the same tag, count and dtype). */
LOOM_API loom_status_t loom_recv(void *buf, size_t count, loom_dtype_t dt, int peer, int tag,
                                 loom_comm_t c);
/** Receive the message sent with tag by whichever rank (this one included)
 *  sends first; *source is set to that rank. Messages of one sender still
 *  arrive in its order. A receive for that rank posted meanwhile with the same
 *  tag may take the message first (post wildcard and specific receives for one
 *  tag in the order the messages are meant for). Fails with LOOM_ERR_TIMEOUT
 *  after LOOM_TIMEOUT without any message or progress, LOOM_ERR_UNSUPPORTED
 *  for GPU buffers. */
LOOM_API loom_status_t loom_recv_any(void *buf, size_t count, loom_dtype_t dt, int tag,
                                     int *source, loom_comm_t c);

/* ---- Non-blocking twins. ---------------------------------------------------
 * They run in submission order on a per-communicator worker; buffers must stay
 * valid until loom_wait returns or loom_test reports done. Collectives must be
 * submitted in the same order on every rank, blocking and non-blocking alike. */

LOOM_API loom_status_t loom_iallreduce(const void *sendbuf, void *recvbuf, size_t count,
                                       loom_dtype_t dt, loom_op_t op, loom_comm_t c,
                                       loom_request_t *req);
LOOM_API loom_status_t loom_ibroadcast(void *buf, size_t count, loom_dtype_t dt, int root,
                                       loom_comm_t c, loom_request_t *req);
LOOM_API loom_status_t loom_ireduce(const void *sendbuf, void *recvbuf, size_t count,
                                    loom_dtype_t dt, loom_op_t op, int root, loom_comm_t c,
                                    loom_request_t *req);
LOOM_API loom_status_t loom_iallgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                       loom_dtype_t dt, loom_comm_t c, loom_request_t *req);
LOOM_API loom_status_t loom_iallgatherv(const void *sendbuf, size_t sendcount, void *recvbuf,
                                        const size_t *recvcounts, const size_t *displs,
                                        loom_dtype_t dt, loom_comm_t c, loom_request_t *req);
LOOM_API loom_status_t loom_ireduce_scatter(const void *sendbuf, void *recvbuf,
                                            size_t recvcount, loom_dtype_t dt, loom_op_t op,
                                            loom_comm_t c, loom_request_t *req);
LOOM_API loom_status_t loom_ialltoall(const void *sendbuf, void *recvbuf, size_t count,
                                      loom_dtype_t dt, loom_comm_t c, loom_request_t *req);
LOOM_API loom_status_t loom_ialltoallv(const void *sendbuf, const size_t *sendcounts,
                                       const size_t *sdispls, void *recvbuf,
                                       const size_t *recvcounts, const size_t *rdispls,
                                       loom_dtype_t dt, loom_comm_t c, loom_request_t *req);
LOOM_API loom_status_t loom_igather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                    loom_dtype_t dt, int root, loom_comm_t c,
                                    loom_request_t *req);
LOOM_API loom_status_t loom_iscatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                     loom_dtype_t dt, int root, loom_comm_t c,
                                     loom_request_t *req);
LOOM_API loom_status_t loom_ibarrier(loom_comm_t c, loom_request_t *req);
LOOM_API loom_status_t loom_isend(const void *buf, size_t count, loom_dtype_t dt, int peer,
                                  int tag, loom_comm_t c, loom_request_t *req);
LOOM_API loom_status_t loom_irecv(void *buf, size_t count, loom_dtype_t dt, int peer, int tag,
                                  loom_comm_t c, loom_request_t *req);
/** *source (which must stay valid as the buffer does) is set by the time the
 *  request completes. */
LOOM_API loom_status_t loom_irecv_any(void *buf, size_t count, loom_dtype_t dt, int tag,
                                      int *source, loom_comm_t c, loom_request_t *req);

/** Block until req completes; returns its status and releases it. */
LOOM_API loom_status_t loom_wait(loom_request_t req);
/** Set *done; when it is 1 the request is released and its status returned. */
LOOM_API loom_status_t loom_test(loom_request_t req, int *done);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_H */
