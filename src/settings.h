/* settings.h - every setting Loom reads, declared once in a table of (name,
 * default, help) that loom-info prints, read once per communicator; and the
 * bootstrap: who am I and where is the store, from whichever launcher started us. */
#ifndef LOOM_SETTINGS_H
#define LOOM_SETTINGS_H

#include <stddef.h>
#include "error.h"

/* Looks a variable up; getenv in the library, a table in the tests. */
typedef const char *(*loom_getenv_fn)(const char *name, void *arg);
const char *loom_getenv_process(const char *name, void *arg);

typedef struct loom_setting_doc {
    const char *name;
    const char *default_value;   /* NULL: unset */
    const char *help;
} loom_setting_doc_t;
extern const loom_setting_doc_t loom_setting_docs[];
extern const size_t loom_num_setting_docs;

typedef struct loom_settings {
    double timeout_s;
    char transport[16];        /* "auto", "tcp" or "ibverbs" (lower case) */
    int shm;                   /* shared memory between ranks of a node */
    int shm_cma;               /* large shm messages by cross-memory attach */
    char auth_key[1024];       /* LOOM_AUTH_KEY(_FILE); auth_keylen 0: none */
    size_t auth_keylen;
    int auth_mac_headers_only; /* LOOM_AUTH_MAC=headers: payload bytes go unsealed */
    size_t early_max_bytes;    /* LOOM_EARLY_MAX_BYTES: early messages held per TCP peer */
    int sockets_per_peer;      /* LOOM_SOCKETS_PER_PEER: TCP streams per pair of ranks */
    size_t stripe_min_bytes;   /* LOOM_STRIPE_MIN_BYTES: smallest message striped over them */
    char ifname[64];           /* "" when unset */
    int socket_bufsize;        /* bytes; 0 = kernel autotuning */
    int spin_us;               /* LOOM_SPIN_US; -1: auto (src/spin.h) */
    int spin_yield;            /* give the core away between polls */
    size_t segment_bytes;
    char algo[512];            /* "allreduce=ring,broadcast=binomial" */
    char host_id[256];         /* "" when unset: hostname + boot id */
    char job_id[128];
    char timeline[512];        /* LOOM_TIMELINE file pattern, "" when off */
    char ib_hca[256];          /* LOOM_IB_HCA, "" when unset: every active port */
    int ib_gid_index;          /* LOOM_IB_GID_INDEX, -1 when unset: chosen */
    int net_gdr;               /* LOOM_NET_GDR: -1 auto, 0 off, 1 forced */
    size_t ib_reg_cache;       /* LOOM_IB_REG_CACHE bytes of idle pinned user registrations */
    int ib_odp;                /* LOOM_IB_ODP: on-demand paging where the HCA has it */
    int ib_timeout, ib_retry_cnt, ib_rnr_retry;   /* QP attributes (LOOM_IB_TIMEOUT, ...) */
    int ib_tc, ib_sl;          /* LOOM_IB_TC (RoCE traffic class), LOOM_IB_SL (service level) */
    int single_node;           /* the launcher says every rank runs on this node */
} loom_settings_t;

/* Fill s from the variables, validating each; a malformed value is an
 * LOOM_ERR_INVALID_ARG naming the variable. */
loom_status_t loom_settings_load(loom_settings_t *s, loom_getenv_fn get, void *arg,
                                 loom_err_t *err);
/* The algorithm LOOM_ALGO forces for the named collective, copied into out;
 * returns 0 when none is forced. */
int loom_settings_forced_algo(const loom_settings_t *s, const char *coll, char *out,
                              size_t outlen);

/* Rank, size and store of this process, as the launcher described them. */
typedef struct loom_bootstrap {
    int rank, size;
    int local_rank;            /* -1 when the launcher did not say */
    char store[512];           /* "" when no store is needed (size 1) */
    const char *source;        /* "LOOM", "torchrun", "Slurm", "Open MPI", "PMI" */
} loom_bootstrap_t;

loom_status_t loom_bootstrap_from_env(loom_getenv_fn get, void *arg, loom_bootstrap_t *b,
                                      loom_err_t *err);

/* Parse a whole decimal integer in [min, max]; 0 on success, -1 otherwise. */
int loom_parse_long(const char *s, long min, long max, long *out);

#endif
