/*
 * thread_harness.h - run N ranks as threads of one process over an in-memory
 * transport, for unit tests of the algorithms (the gloo way: no sockets, no
 * processes, results checked in memory).
 *
 * The transport is a test double: one "world" shared by the ranks holds, per
 * (sender, receiver), a FIFO of unexpected messages and a list of posted
 * receives, all under one mutex with one condition variable. isend copies the
 * message at once (into a matching posted receive, or into the queue), so a
 * send is complete when isend returns; irecv takes the oldest queued message
 * with the same tag from that peer. A tag match whose length, descriptor or
 * total differs completes the receive with LOOM_ERR_MISMATCH. Only the owning
 * rank's thread sets a request's done flag (in isend, irecv or progress), so
 * the waiting thread sees the bytes through the mutex.
 *
 * In rendezvous mode (LOOM_HARNESS_RENDEZVOUS) nothing is buffered: a send
 * stays pending until its receive is posted, and the bytes are read from the
 * sender's buffer then, as a zero-copy RDMA transport would. That catches an
 * algorithm that rewrites a buffer whose send has not completed, or that
 * relies on the transport buffering to avoid a deadlock.
 *
 * destroy forgets the instance's requests and fails every peer that still
 * waits for it (a receive posted from it, a later irecv with nothing queued
 * from it, an isend to it) with LOOM_ERR_PEER_LOST, as a real transport's
 * goodbye does; a rendezvous send already paired with a receive is not
 * withdrawn.
 *
 * Limits: no create/connect, no registration; a request must stay valid until
 * it completes, so a rank that returns with a receive or (rendezvous) a send
 * still pending leaves a dangling pointer in the world (reported as stray).
 */
#ifndef LOOM_THREAD_HARNESS_H
#define LOOM_THREAD_HARNESS_H

#include "algorithms/algorithms.h"

/* The in-memory transport. create and connect are NULL: loom_harness_run builds
 * and connects the instances itself. */
extern const loom_transport_ops_t loom_harness_transport;

#define LOOM_HARNESS_MAX_RANKS 64

/*
 * Run fn(ctx, arg) in nranks threads, one per rank, each with its own context:
 * tp_ops = &loom_harness_transport, timeout_s 10, spin_us 0, segment_bytes 4096
 * (small, so the pipelined algorithms cut even small tests into segments), seq,
 * desc and total 0 (a test sets them per collective, as the core does), and its
 * own loom_err_t. fn reports failures through arg; to stop the other ranks
 * early it can call ctx->tp_ops->abort(ctx->tp, status): as with a real
 * transport, that rank fails with status and every other with
 * LOOM_ERR_PEER_LOST (the rank gave up).
 *
 * Returns 0 when every thread ran and the world ended clean, -1 when the run
 * could not be set up, or the number of messages sent but never received plus
 * receives posted but never matched (an algorithm that leaves either is wrong).
 */
int loom_harness_run(int nranks, void (*fn)(loom_ctx_t *ctx, void *arg), void *arg);

/* The same with flags: LOOM_HARNESS_RENDEZVOUS (see above). */
#define LOOM_HARNESS_RENDEZVOUS 1
int loom_harness_run_ex(int nranks, int flags, void (*fn)(loom_ctx_t *ctx, void *arg),
                        void *arg);

/* The same on emulated nodes: ranks [k*per_node, (k+1)*per_node) are node k
 * (the last node holds fewer when per_node does not divide nranks), set in
 * every context with loom_ctx_set_topology. per_node 0: no topology. */
int loom_harness_run_nodes(int nranks, int flags, int per_node,
                           void (*fn)(loom_ctx_t *ctx, void *arg), void *arg);

#endif
