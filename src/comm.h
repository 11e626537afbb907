/* comm.h - the communicator: identity and topology, the store it rendezvoused
 * through, its transport instance, the algorithm context, the last error, and
 * the queue of non-blocking operations with the worker that runs them. */
#ifndef LOOM_COMM_H
#define LOOM_COMM_H

#include <pthread.h>
#include <stdatomic.h>

#include "algorithms/algorithms.h"
#include "base/settings.h"
#include "base/spin.h"
#include "base/error.h"
#include "store/store.h"
#include "transports/transport.h"

/* A store handle shared by a communicator and the ones split from it. */
typedef struct loom_store_ref {
    loom_store_t *store;
    _Atomic int refs;
} loom_store_ref_t;

typedef enum { LOOM_OP_COLL, LOOM_OP_SEND, LOOM_OP_RECV } loom_op_kind_t;

/* A layer built on communicators that keeps state on some of them (elastic.c:
 * the epoch and its watcher). Set by that layer, called by comm.c, so the
 * core does not depend on what is built on it: a split child inherits the
 * state, and destroy detaches it before anything else (its threads may still
 * use the transport). */
typedef struct loom_comm_layer {
    loom_status_t (*inherit)(loom_comm_t parent, loom_comm_t child, loom_err_t *err);
    void (*detach)(loom_comm_t c);
} loom_comm_layer_t;

/* One queued operation: a non-blocking call, or a blocking one that had to
 * queue behind non-blocking ones to keep the order every rank agreed on. */
struct loom_request {
    loom_comm_t comm;
    loom_op_kind_t kind;
    loom_coll_args_t args;        /* LOOM_OP_COLL */
    loom_tp_req_t tp_req;         /* LOOM_OP_SEND / LOOM_OP_RECV */
    int posted;                   /* p2p: handed to the transport */
    int any_source;               /* a receive from any rank: tp_req.peer is chosen
                                   * once the transport has a message for the tag */
    int *source_out;              /* where the chosen rank goes (may be NULL) */
    int done;                     /* under comm->qlock */
    loom_status_t status;
    char msg[LOOM_ERRMSG_MAX];    /* the failure, kept with the request */
    int blocking;                 /* owned by a blocking caller: not freed by wait */
    struct loom_request *next;
};

struct loom_comm {
    int rank, size;
    int local_rank, local_size, node_rank, node_count;
    int *node_of;                 /* [rank]: node index, as rendezvous numbers them */
    loom_settings_t cfg;
    loom_algo_rule_t algo_rules[LOOM_ALGO_MAX_RULES];   /* LOOM_ALGO, parsed */
    size_t n_algo_rules;
    loom_store_ref_t *store;      /* NULL for a single-rank communicator */
    char prefix[256];             /* its keys in the store */
    uint64_t job_hash, comm_hash;
    uint64_t nsplits;
    const loom_transport_ops_t *tp_ops;
    loom_tp_t *tp;
    loom_ctx_t ctx;
    loom_spin_t spin;             /* how its waits spin (ctx.spin points here) */

    loom_err_t work_err;          /* written by the operation that is running */
    pthread_mutex_t err_lock;
    char last_error[LOOM_ERRMSG_MAX];
    loom_status_t broken;         /* sticky: a failed collective leaves the comm unusable */
    char broken_msg[LOOM_ERRMSG_MAX];   /* why, as first reported */
    loom_tp_fault_t fault;        /* whom a timed-out wait blames (ctx.fault points here) */

    /* Non-blocking operations, run in submission order by the worker. */
    pthread_mutex_t qlock;
    pthread_cond_t qcond;         /* the worker waits for work */
    pthread_cond_t done_cond;     /* waiters wait for completions */
    struct loom_request *qhead, *qtail;
    struct loom_request *active;  /* posted p2p requests not yet complete */
    int busy;                     /* the worker is running an operation */
    int worker_started, stopping;
    pthread_t worker;
    _Atomic int aborted;
    int any_next;                 /* the rank a receive from any rank probes first */
    const loom_comm_layer_t *layer;   /* NULL, or the layer holding state on it */
    struct loom_elastic *elastic; /* epoch and watcher of an elastic communicator (elastic.c) */
};

/* Copy c->work_err into the last error (after an operation failed). */
void loom_comm_publish_error(loom_comm_t c, loom_status_t st);

/* Run one operation now on the calling thread (the caller guarantees no other
 * thread runs one on c). Collectives run to completion; p2p operations are
 * posted and, when wait is set, completed. */
loom_status_t loom_comm_execute(loom_comm_t c, struct loom_request *op, int wait);
/* Stop the worker after it finished everything queued (destroy). */
void loom_comm_stop_worker(loom_comm_t c);

/* Every LOOM_* setting a communicator reads, LOOM_ALGO's rows included: the
 * settings table keeps LOOM_ALGO as text (it stands below the algorithms),
 * so a typo in a byte range is refused here, failing loom_init and
 * loom_comm_create with LOOM_ERR_INVALID_ARG naming the variable. */
loom_status_t loom_comm_settings_load(loom_settings_t *cfg, loom_getenv_fn get, void *arg,
                                      loom_err_t *err);

/* A world communicator: rank of size, rendezvous through the store at
 * store_uri (init.c, loom_comm_create). */
loom_status_t loom_comm_create_world(const loom_settings_t *cfg, int rank, int size,
                                     const char *store_uri, loom_comm_t *out);

/* Form a communicator on an open store under prefix (elastic.c forms each
 * epoch this way); takes its own reference on store. */
loom_status_t loom_comm_form(const loom_settings_t *cfg, int rank, int size,
                             loom_store_ref_t *store, const char *prefix, loom_comm_t *out,
                             loom_err_t *err);
void loom_store_ref_release(loom_store_ref_t *ref);
/* elastic.c: the world communicator of an elastic job (LOOM_ELASTIC=1; init.c). */
loom_status_t loom_elastic_init(const loom_settings_t *cfg, const loom_bootstrap_t *b,
                                loom_comm_t *out, loom_err_t *err);

#endif
