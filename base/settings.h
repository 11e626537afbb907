/* settings.h - every setting Loom reads, declared once in a table whose rows
 * both document a variable (loom-info prints them) and say how to parse it
 * into which field of which struct, so the help cannot drift from the parser;
 * read once per communicator. And the bootstrap: who am I and where is the
 * store, from whichever launcher started us. */
#ifndef LOOM_SETTINGS_H
#define LOOM_SETTINGS_H

#include <stddef.h>
#include "error.h"

/* Looks a variable up; getenv in the library, a table in the tests. */
typedef const char *(*loom_getenv_fn)(const char *name, void *arg);
const char *loom_getenv_process(const char *name, void *arg);

/* Which struct a row's field lives in, i.e. who loads it and when. */
typedef enum loom_setting_group {
    LOOM_SG_COMM,          /* loom_settings_t, once per communicator */
    LOOM_SG_STORE_SERVER,  /* loom_store_limits_t, when a tcp:// store server starts */
    LOOM_SG_STORE_FILE,    /* loom_store_env_t, when a file:// store opens */
    LOOM_SG_STORE_REDIS,   /* loom_store_env_t, when a redis:// store opens */
    LOOM_SG_LOG,           /* listed only: the logger (base/log.c) reads them itself,
                              as it stands below this table */
    LOOM_SG_BOOTSTRAP,     /* listed only: loom_bootstrap_from_env reads it with the
                              launchers' fallbacks, loomrun sets it for its children */
    LOOM_SG_PYTHON,        /* listed only: read by the Python package (python/loom) */
} loom_setting_group_t;

typedef enum loom_setting_type {
    LOOM_SETTING_NONE,     /* no field: read elsewhere (see the group) */
    LOOM_SETTING_INT,      /* whole decimal in [min, max] into an int or 8-byte integer field */
    LOOM_SETTING_SECONDS,  /* positive number of seconds, at most 1e7, into a double */
    LOOM_SETTING_STRING,   /* copied into a char array; longer than it is an error */
    LOOM_SETTING_STRREF,   /* const char * to the looked-up value (NULL when unset) */
    LOOM_SETTING_CHOICE,   /* one of choices (any case), its index into an int */
    LOOM_SETTING_CUSTOM,   /* the row's parse callback, called set or unset */
} loom_setting_type_t;

enum {
    LOOM_SETTING_SECRET = 1,   /* loom-info and logs say only whether it is set */
};

struct loom_setting;
/* value: the variable, else the default, else NULL; base: the group's struct. */
typedef loom_status_t (*loom_setting_parse_fn)(const struct loom_setting *row, const char *value,
                                               void *base, loom_getenv_fn get, void *arg,
                                               loom_err_t *err);

typedef struct loom_setting {
    const char *name;
    const char *default_value;   /* NULL: unset */
    const char *help;
    loom_setting_group_t group;
    loom_setting_type_t type;
    unsigned flags;              /* LOOM_SETTING_SECRET */
    size_t offset, size;         /* the field in the group's struct */
    long min, max;               /* INT */
    long unset;                  /* INT: stored when unset and without default */
    const char *const *choices;  /* CHOICE: NULL-terminated */
    loom_setting_parse_fn parse; /* CUSTOM */
} loom_setting_t;
extern const loom_setting_t loom_settings_table[];
extern const size_t loom_num_settings;

/* The row named name, or NULL. */
const loom_setting_t *loom_setting_find(const char *name);

/* Parse every row of group into the struct at base (which the caller zeroes
 * or presets), in table order; the first malformed value is an
 * LOOM_ERR_INVALID_ARG naming the variable. An empty variable counts as unset. */
loom_status_t loom_settings_load_group(loom_setting_group_t group, void *base,
                                       loom_getenv_fn get, void *arg, loom_err_t *err);

/* The most TCP streams per pair of ranks (LOOM_SOCKETS_PER_PEER); the
 * hello's stream field carries up to this many (transports/wire.h). */
#define LOOM_MAX_STREAMS 16

/* LOOM_AUTH_MAC's values (the order of its choices). */
enum { LOOM_AUTH_MAC_FULL = 0, LOOM_AUTH_MAC_HEADERS = 1, LOOM_AUTH_MAC_ENCRYPT = 2 };

typedef struct loom_settings {
    double timeout_s;
    char transport[16];        /* "auto", "tcp" or "ibverbs" (lower case) */
    int shm;                   /* shared memory between ranks of a node */
    int shm_cma;               /* large shm messages by cross-memory attach */
    char auth_key[1024];       /* LOOM_AUTH_KEY(_FILE); auth_keylen 0: none */
    size_t auth_keylen;
    int auth_mac;              /* LOOM_AUTH_MAC: LOOM_AUTH_MAC_FULL, _HEADERS or _ENCRYPT */
    int auth_cipher;           /* LOOM_AUTH_CIPHER: 0 auto, 1 AES-256-GCM, 2 ChaCha20-Poly1305 */
    size_t early_max_bytes;    /* LOOM_EARLY_MAX_BYTES: early messages held per TCP peer */
    int sockets_per_peer;      /* LOOM_SOCKETS_PER_PEER: TCP streams per pair of ranks */
    size_t stripe_min_bytes;   /* LOOM_STRIPE_MIN_BYTES: smallest message striped over them */
    char ifname[64];           /* "" when unset */
    int socket_bufsize;        /* bytes; 0 = kernel autotuning */
    int spin_us;               /* LOOM_SPIN_US; -1: auto (base/spin.h) */
    int spin_yield;            /* give the core away between polls */
    size_t segment_bytes;
    char algo[512];            /* "allreduce=ring,broadcast=binomial@1M-" (algorithms.h) */
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
    size_t cuda_chunk_bytes;   /* LOOM_CUDA_CHUNK_BYTES: bytes per staging pass */
    int cuda_overlap;          /* LOOM_CUDA_OVERLAP: staging copies overlap host collectives */
    int cuda_ipc;              /* LOOM_CUDA_IPC: GPU to GPU inside a node through IPC handles */
    int elastic;               /* LOOM_ELASTIC=1: loom_init joins an elastic job */
    long long elastic_id;      /* LOOM_ELASTIC_ID, -1 when unset: the store numbers us */
    double elastic_timeout_s;  /* LOOM_ELASTIC_TIMEOUT, 0 when unset: timeout_s */
    int elastic_min_np;        /* LOOM_ELASTIC_MIN_NP */
    int single_node;           /* the launcher says every rank runs on this node */
} loom_settings_t;

/* What the server lets its clients take (LOOM_STORE_* settings,
 * LOOM_SG_STORE_SERVER). */
typedef struct loom_store_limits {
    uint64_t max_bytes;          /* keys, values and request buffers held at once */
    long max_clients;            /* connections at once */
    long max_clients_per_host;   /* connections at once from one source address */
    double hello_timeout_s;      /* a new connection must finish its hello within this */
    double idle_timeout_s;       /* a client with nothing parked, silent this long, is closed */
} loom_store_limits_t;

/* The limits the LOOM_STORE_* variables set (defaults where unset). */
loom_status_t loom_store_limits_from_env(loom_store_limits_t *lim, loom_err_t *err);

/* What opening a file:// (LOOM_SG_STORE_FILE) or redis:// store
 * (LOOM_SG_STORE_REDIS) reads. */
typedef struct loom_store_env {
    int file_group;            /* LOOM_FILE_STORE_GROUP */
    const char *redis_user;    /* LOOM_REDIS_USER, NULL when unset */
    const char *redis_password; /* LOOM_REDIS_PASSWORD, NULL when unset */
} loom_store_env_t;

/* Fill s from the variables, validating each; a malformed value is an
 * LOOM_ERR_INVALID_ARG naming the variable. */
loom_status_t loom_settings_load(loom_settings_t *s, loom_getenv_fn get, void *arg,
                                 loom_err_t *err);

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

/* LOOM_SPIN_US: "auto" (-1, base/spin.h) or microseconds in [0, 1e7];
 * 0 and *us_p, or -1. */
int loom_spin_parse(const char *text, int *us_p);

#endif
