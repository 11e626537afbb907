/*
 * algorithms.h - what every algorithm is written against: a context with the
 * communicator's rank and size, tagged point-to-point operations (p2p), local
 * reductions (base/reduce.h) and a scratch buffer. Algorithms never see a
 * transport type or the public communicator.
 */
#ifndef LOOM_ALGORITHMS_H
#define LOOM_ALGORITHMS_H

#include <stddef.h>
#include <stdint.h>
#include "loom.h"
#include "base/coll_kind.h"
#include "base/error.h"
#include "transports/transport.h"

struct loom_timeline;

/* The algorithm's view of a communicator. */
typedef struct loom_ctx {
    int rank, size;
    const loom_transport_ops_t *tp_ops;
    loom_tp_t *tp;
    uint64_t seq;            /* collective sequence number, set by the core per call */
    uint32_t desc;           /* descriptor of the running call, checked by receivers */
    uint64_t total;
    double timeout_s;        /* a wait fails after this long without progress */
    int spin_us;             /* busy-poll this long before sleeping in the transport */
    struct loom_spin *spin;  /* the communicator's spin policy (base/spin.h); NULL: spin_us */
    int spin_yield;          /* yield the core between polls (ranks outnumber cores) */
    loom_err_t *err;
    /* The transport's first failure as it was described: a call that still
     * succeeded beside it (its messages all in) leaves the next call to fail,
     * when the transport only repeats the status. */
    char tp_failure[LOOM_ERRMSG_MAX];
    /* Where a wait that timed out records whom it blames (the communicator's,
     * shared by the contexts derived from this one), or NULL. */
    loom_tp_fault_t *fault;
    void *scratch;           /* grown by loom_ctx_scratch, freed with the context */
    size_t scratch_size;
    size_t segment_bytes;    /* pipelining unit for ring algorithms (LOOM_SEGMENT_BYTES) */
    struct loom_timeline *timeline;   /* LOOM_TIMELINE, or NULL */
    int timeline_tid;        /* the row of this communicator in the trace */
    /* A view on a subset of the transport's ranks, so an algorithm can run
     * another one on part of the job (hierarchical algorithms): rank and size
     * are the view's, p2p peers are view indices and rank_map[i] is the
     * transport's rank of index i (NULL: the identity). step_base is added to
     * every step, so the phases of one collective never share a tag. */
    const int *rank_map;
    uint32_t step_base;
    /* Topology: node_of[r] in [0, node_count) is the node of the transport's
     * rank r (NULL: unknown, everything is treated as flat); ranks_per_node is
     * how many of this context's ranks each node it spans holds when that
     * number is the same on every such node, 0 otherwise. */
    const int *node_of;
    int node_count;
    int ranks_per_node;
    /* The buffers of the p2p calls are GPU memory (GPUDirect RDMA, cuda/gdr.c
     * through the core): requests are posted with on_device set. */
    int device_mem;
} loom_ctx_t;

/* Set the topology of a context whose ranks are the transport's (no rank_map):
 * node_of (kept, not copied) and node_count, and ranks_per_node derived from them. */
void loom_ctx_set_topology(loom_ctx_t *ctx, const int *node_of, int node_count);

/* ---- p2p (algorithms/p2p.c): tagged messages inside the running collective. -----
 * step distinguishes messages of one collective; messages between a pair with
 * equal step are matched in posting order. peer must differ from ctx->rank. */
/* A wait on peer waited_on (a transport rank, -1: none in particular) ran
 * out of LOOM_TIMEOUT: returns the rank to blame (-1: none), records it in
 * ctx->fault and writes a clause for the message into why. */
int loom_p2p_blame(loom_ctx_t *ctx, int waited_on, char *why, size_t len);
loom_status_t loom_p2p_isend(loom_ctx_t *ctx, int peer, uint32_t step, const void *buf,
                             size_t bytes, loom_tp_req_t *req);
loom_status_t loom_p2p_irecv(loom_ctx_t *ctx, int peer, uint32_t step, void *buf, size_t bytes,
                             loom_tp_req_t *req);
/* Whether req is done, without progressing (for algorithms that poll their
 * windows); shows the request in LOOM_TIMELINE once it is. */
int loom_p2p_test(loom_ctx_t *ctx, loom_tp_req_t *req);
/* Wait for one / all requests; on failure the message is already in ctx->err. */
loom_status_t loom_p2p_wait(loom_ctx_t *ctx, loom_tp_req_t *req);
loom_status_t loom_p2p_waitall(loom_ctx_t *ctx, loom_tp_req_t *reqs, int n);
/* Wait until one of the requests reqs points to (NULL entries skipped) is
 * done. A sender whose message goes by rendezvous (shared memory, RDMA) is
 * done only when its receiver has posted the receive: an algorithm that
 * keeps sends and receives in flight must wait for either, or two ranks can
 * each wait for a receive the other will post only after its own wait. */
loom_status_t loom_p2p_wait_any(loom_ctx_t *ctx, loom_tp_req_t *const *reqs, int n);
/* Send to dst and receive from src at once (either may be skipped with -1). */
loom_status_t loom_p2p_sendrecv(loom_ctx_t *ctx, int dst, const void *sbuf, size_t sbytes,
                                int src, void *rbuf, size_t rbytes, uint32_t step);
/* One-sided reads inside a node: whether peer's memory can be read directly,
 * and a copy of bytes at address addr of peer into buf. */
int loom_p2p_can_read(const loom_ctx_t *ctx, int peer);
loom_status_t loom_p2p_read(loom_ctx_t *ctx, int peer, void *buf, uint64_t addr, size_t bytes);
/* The staging window of peer (ourselves included) mapped in our memory, or
 * NULL when the transport gives none; *len_p: its size. */
void *loom_p2p_window(const loom_ctx_t *ctx, int peer, size_t *len_p);
/* For algorithms that wait for a change in a peer's window instead of a
 * message (algorithms/window.c), what a wait for a message gets from
 * progress. progress: our keepalive, the transport's failures and abort.
 * watch: peer's fate (gave up, destroyed its communicator, process gone);
 * a peer may leave once it has made the change, so a wait looks for the
 * change again after progress and before it watches. timeout: the
 * LOOM_TIMEOUT failure of a wait on peer, blame included. */
loom_status_t loom_p2p_window_progress(loom_ctx_t *ctx);
loom_status_t loom_p2p_window_watch(loom_ctx_t *ctx, int peer);
loom_status_t loom_p2p_window_timeout(loom_ctx_t *ctx, int peer);
/* out = a (op) b through base/reduce.h, shown as a "reduce" span in LOOM_TIMELINE. */
void loom_ctx_reduce(loom_ctx_t *ctx, void *out, const void *a, const void *b, size_t count,
                     loom_dtype_t dt, loom_op_t op);
/* A scratch buffer of at least bytes, reused across calls; NULL when out of memory
 * (the message is set). Valid until the next call of loom_ctx_scratch. */
void *loom_ctx_scratch(loom_ctx_t *ctx, size_t bytes);

/* ---- Two-level views (algorithms/hierarchy.c). ------------------------------
 * For a context spanning M >= 2 nodes of L >= 2 of its ranks each: local holds
 * the transport ranks of our node (we are index l), cross the transport ranks
 * of index l on every node (we are index me_cross), grid[m * L + i] the view
 * index of the i-th rank of the m-th node. Phases run on views made from the
 * context; a view that grew the scratch buffer hands it back with adopt. */
#define LOOM_HIER_STACK_INTS 256
#define LOOM_HIER_PHASE_STEPS (UINT32_C(1) << 20)   /* steps of one phase stay below */
typedef struct loom_hier {
    int L, M, l, me_cross;
    int *local, *cross, *grid;
    int stack[LOOM_HIER_STACK_INTS];
    int *heap;
} loom_hier_t;
/* 1: the views are ready (free them with loom_hier_free); 0: the context is
 * not uniform over several nodes (run a flat algorithm); -1: out of memory. */
int loom_hier_init(const loom_ctx_t *ctx, loom_hier_t *h);
/* The node (index in cross) and local index of rank, a rank of the grid
 * (a collective's root); 0 and 0 for a rank not in it. */
void loom_hier_place(const loom_hier_t *h, int rank, int *node_p, int *local_p);
void loom_hier_free(loom_hier_t *h);
loom_ctx_t loom_hier_local_view(const loom_ctx_t *ctx, const loom_hier_t *h, uint32_t phase);
loom_ctx_t loom_hier_cross_view(const loom_ctx_t *ctx, const loom_hier_t *h, uint32_t phase);
void loom_hier_adopt_scratch(loom_ctx_t *ctx, const loom_ctx_t *view);

/* ---- The algorithm table. ------------------------------------------------ */
typedef loom_status_t (*loom_algo_fn)(loom_ctx_t *ctx, const loom_coll_args_t *a);

typedef struct loom_algo {
    loom_coll_t coll;
    const char *name;        /* as LOOM_ALGO spells it: allreduce=ring */
    loom_algo_fn run;
    /* NULL: runs everywhere; otherwise whether it can run these arguments */
    int (*can_run)(const loom_ctx_t *ctx, const loom_coll_args_t *a);
} loom_algo_t;

extern const loom_algo_t loom_algorithms[];
extern const size_t loom_num_algorithms;

/* Where a selection row applies. */
typedef enum {
    LOOM_TOPO_ANY,
    LOOM_TOPO_MULTI_NODE,   /* several nodes with the same number (> 1) of ranks each */
} loom_topo_t;

/* One row of algorithm selection, Loom's own (algorithms.c) or LOOM_ALGO's:
 * for calls of coll on at least min_ranks ranks, in topology, moving bytes in
 * [min_bytes, max_bytes) (max_bytes SIZE_MAX: no upper bound), run name.
 * Bytes are loom_algo_bytes'. The first row that holds decides. */
typedef struct loom_algo_rule {
    loom_coll_t coll;
    int min_ranks;
    loom_topo_t topology;
    size_t min_bytes, max_bytes;
    char name[32];          /* LOOM_ALGO only: "auto" leaves the call to Loom's rows */
} loom_algo_rule_t;

#define LOOM_ALGO_MAX_RULES 32

/* The size a selection row measures: the vector (count * esize); for
 * allgather the gathered total (size * count * esize). Saturates. */
size_t loom_algo_bytes(const loom_ctx_t *ctx, const loom_coll_args_t *a);

/* Parse LOOM_ALGO: comma-separated coll=name[@LO-HI], LO and HI byte counts
 * with an optional K, M or G (powers of 1024), either one left out for no
 * bound (allreduce=recdbl@-64K,allreduce=ring@1M-). As before ranges existed,
 * items without '=' or naming no collective are ignored, and names are
 * checked only when a call needs them. Fills at most max rows; 0, or -1 with
 * why filled in. */
int loom_algo_rules_parse(const char *text, loom_algo_rule_t *rules, size_t max, size_t *n_p,
                          char *why, size_t whylen);

/* The first of rules (LOOM_ALGO's) that holds for a, or NULL: Loom chooses. */
const loom_algo_rule_t *loom_algo_rule_match(const loom_algo_rule_t *rules, size_t n,
                                             const loom_ctx_t *ctx, const loom_coll_args_t *a);

/* The algorithm to run a: forced is the name LOOM_ALGO gives for this call
 * (NULL or "auto": Loom's own rows choose by size, ranks and topology). NULL
 * when the forced name is unknown for this collective or cannot run these
 * arguments (the caller reports it). */
const loom_algo_t *loom_algo_select(const loom_ctx_t *ctx, const loom_coll_args_t *a,
                                    const char *forced);
/* The algorithm called name for coll, or NULL. */
const loom_algo_t *loom_algo_find(loom_coll_t coll, const char *name);

/* Every algorithm (one file each). */
loom_status_t loom_allreduce_ring(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_allreduce_rabenseifner(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_allreduce_recdbl(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_allreduce_hierarchical(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_broadcast_binomial(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_broadcast_hierarchical(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_broadcast_scatter_allgather(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_allgather_hierarchical(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_reduce_binomial(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_allgather_ring(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_allgather_bruck(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_allgatherv_ring(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_reduce_scatter_ring(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_alltoall_pairwise(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_alltoallv_pairwise(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_gather_linear(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_scatter_linear(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_barrier_dissemination(loom_ctx_t *ctx, const loom_coll_args_t *a);
/* Inside one node, on the peers' buffers in place (algorithms/direct.c). */
int loom_direct_can_run(const loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_allreduce_direct(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_broadcast_direct(loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_allgather_direct(loom_ctx_t *ctx, const loom_coll_args_t *a);
/* Inside one node, through the transport's staging windows (algorithms/allreduce_staged.c). */
int loom_staged_can_run(const loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_allreduce_staged(loom_ctx_t *ctx, const loom_coll_args_t *a);
/* Small vectors inside one node, through slots in the staging windows and a
 * fence of their counters: no message (algorithms/allreduce_slots.c). */
int loom_slots_can_run(const loom_ctx_t *ctx, const loom_coll_args_t *a);
loom_status_t loom_allreduce_slots(loom_ctx_t *ctx, const loom_coll_args_t *a);

#endif
