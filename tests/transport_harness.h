/*
 * transport_harness.h - every transport's endpoints in one process, for the
 * transport conformance suite (check_transport.c): each rank is a thread that
 * creates its endpoint through the ops table, swaps addresses with the others
 * in memory (what the store does in a job), connects, runs the test's
 * function, and destroys the endpoint.
 *
 * Kinds: the thread harness's in-memory transport (thread_harness.h), tcp
 * over 127.0.0.1, shm, a mux of shm and tcp (ranks 0 and 1 on one emulated
 * node, rank 2 on another: rank 0 reaches rank 1 over shm, rank 2 over tcp,
 * itself over shm), and ibverbs over the libibverbs test double
 * (tests/verbs-provider), loaded by absolute path before the transport
 * dlopens libibverbs.so.1, so no LD_LIBRARY_PATH is needed.
 *
 * Test functions run on the rank threads, so they report failures through
 * tph_fail (never ck_assert, which may not leave a thread).
 */
#ifndef LOOM_TRANSPORT_HARNESS_H
#define LOOM_TRANSPORT_HARNESS_H

#include <stddef.h>
#include "transports/transport.h"

typedef enum {
    TPH_HARNESS,
    TPH_TCP,
    TPH_SHM,
    TPH_MUX,
    TPH_IBVERBS,
    TPH_KINDS
} tph_kind_t;

typedef struct tph_run tph_run_t;

typedef struct tph_rank {
    int rank, size;
    const loom_transport_ops_t *ops;
    loom_tp_t *tp;
    loom_err_t *err;        /* the endpoint's error (what loom_comm_last_error shows) */
    int destroyed;          /* set by tph_destroy: the runner leaves the endpoint alone */
    tph_run_t *run;
} tph_rank_t;

const char *tph_name(tph_kind_t kind);
/* How many ranks a run of kind has (3 for the mux, else 2). */
int tph_size(tph_kind_t kind);
/* 1 when kind can run here; else 0 with the reason in why. */
int tph_available(tph_kind_t kind, char *why, size_t whylen);

/*
 * Run fn on every rank of kind, each a thread with a connected endpoint;
 * the endpoint is destroyed after fn returns unless fn did (tph_destroy).
 * Returns 0 when every rank's setup and fn succeeded; otherwise non-zero
 * with the first failure, naming its rank, in msg.
 */
int tph_run(tph_kind_t kind, int (*fn)(tph_rank_t *r, void *arg), void *arg, char *msg,
            size_t msglen);

/* Record a failure of rank r (the first one of the run is kept); returns -1. */
int tph_fail(tph_rank_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Post a send or a receive; the request is reset first. Every send carries
 * the same descriptor and total, which these receives expect. */
loom_status_t tph_isend(tph_rank_t *r, loom_tp_req_t *req, int peer, const void *buf, size_t len,
                        uint64_t tag);
loom_status_t tph_irecv(tph_rank_t *r, loom_tp_req_t *req, int peer, void *buf, size_t len,
                        uint64_t tag);
/* A receive that expects another descriptor or total than the sends'. */
loom_status_t tph_irecv_match(tph_rank_t *r, loom_tp_req_t *req, int peer, void *buf, size_t len,
                              const loom_tp_match_t *match);
/* Drive progress until every one of the n requests is done or the endpoint
 * fails, at most limit_s. Returns LOOM_SUCCESS when all completed well, the
 * status of the endpoint or of the first failed request, or LOOM_ERR_TIMEOUT. */
loom_status_t tph_wait(tph_rank_t *r, loom_tp_req_t *const *reqs, int n, double limit_s);
/* End a case: wait (bounded) for the other ranks, then destroy r's endpoint,
 * while the requests and buffers of the case are still valid (a transport
 * may touch pending ones until destroy returns). 0, or -1 when a rank left. */
int tph_end(tph_rank_t *r);
/* Destroy r's endpoint now (bounded by timeout_s). */
void tph_destroy(tph_rank_t *r, double timeout_s);
/* Wait until all ranks of the run got here (bounded; 0 on success). */
int tph_barrier(tph_rank_t *r);

double tph_now(void);

#endif
