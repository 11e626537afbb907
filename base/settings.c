#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <stdatomic.h>
#include <sys/stat.h>

#include "log.h"
#include "settings.h"

/* A row's field: its offset and size in the group's struct. */
#define FIELD(type, f) .offset = offsetof(type, f), .size = sizeof(((type *)0)->f)
#define COMM(f) .group = LOOM_SG_COMM, FIELD(loom_settings_t, f)
#define SERVER(f) .group = LOOM_SG_STORE_SERVER, FIELD(loom_store_limits_t, f)
#define FILE_STORE(f) .group = LOOM_SG_STORE_FILE, FIELD(loom_store_env_t, f)
#define REDIS(f) .group = LOOM_SG_STORE_REDIS, FIELD(loom_store_env_t, f)
#define LISTED(g) .group = (g), .type = LOOM_SETTING_NONE
#define INT(lo, hi) .type = LOOM_SETTING_INT, .min = (lo), .max = (hi)
#define SECONDS .type = LOOM_SETTING_SECONDS
#define STRING .type = LOOM_SETTING_STRING
#define STRREF .type = LOOM_SETTING_STRREF
#define CHOICE(list) .type = LOOM_SETTING_CHOICE, .choices = (list)
#define CUSTOM(fn) .type = LOOM_SETTING_CUSTOM, .parse = (fn)

static loom_status_t parse_job_id(const loom_setting_t *, const char *, void *, loom_getenv_fn,
                                  void *, loom_err_t *);
static loom_status_t parse_auth_key(const loom_setting_t *, const char *, void *, loom_getenv_fn,
                                    void *, loom_err_t *);
static loom_status_t parse_auth_key_file(const loom_setting_t *, const char *, void *,
                                         loom_getenv_fn, void *, loom_err_t *);
static loom_status_t parse_transport(const loom_setting_t *, const char *, void *, loom_getenv_fn,
                                     void *, loom_err_t *);
static loom_status_t parse_spin_us(const loom_setting_t *, const char *, void *, loom_getenv_fn,
                                   void *, loom_err_t *);
static const char *const auth_mac_choices[] = {"full", "headers", "encrypt", NULL};
static const char *const auth_cipher_choices[] = {"auto", "aes-256-gcm", "chacha20-poly1305", NULL};

/* Every LOOM_* variable Loom reads, in the order loom-info prints them; each
 * group is loaded in this order too (LOOM_AUTH_KEY before its _FILE). */
const loom_setting_t loom_settings_table[] = {
    {"LOOM_RANK", NULL, "rank of this process (else RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK)",
     LISTED(LOOM_SG_BOOTSTRAP)},
    {"LOOM_SIZE", NULL, "number of ranks (else WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE, PMI_SIZE)",
     LISTED(LOOM_SG_BOOTSTRAP)},
    {"LOOM_LOCAL_RANK", NULL, "rank within the node, as the launcher numbers it",
     LISTED(LOOM_SG_BOOTSTRAP)},
    {"LOOM_LOCAL_SIZE", NULL, "ranks on this node, as the launcher counts them (else LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS): all of them tells Loom the job runs on one node",
     LISTED(LOOM_SG_BOOTSTRAP)},
    {"LOOM_STORE", NULL, "rendezvous store: tcp://host:port, file:///dir or redis://host:port/prefix (else MASTER_ADDR:MASTER_PORT)",
     LISTED(LOOM_SG_BOOTSTRAP)},
    {"LOOM_JOB_ID", NULL, "names the job in the store and the handshake (else TORCHELASTIC_RUN_ID, SLURM_JOB_ID)",
     COMM(job_id), CUSTOM(parse_job_id)},
    {"LOOM_TIMEOUT", "300", "seconds a call may wait without progress before LOOM_ERR_TIMEOUT",
     COMM(timeout_s), SECONDS},
    {"LOOM_AUTH_KEY", NULL, "shared secret: connections between ranks and to the tcp:// store must prove it, TCP frames and published store values carry tags under it; never printed",
     COMM(auth_key), CUSTOM(parse_auth_key), .flags = LOOM_SETTING_SECRET},
    {"LOOM_AUTH_KEY_FILE", NULL, "file holding that secret (a trailing newline is dropped); LOOM_AUTH_KEY wins when both are set",
     COMM(auth_key), CUSTOM(parse_auth_key_file)},
    {"LOOM_AUTH_MAC", "full", "with a key, what TCP frames' tags cover: full (headers and payload), encrypt (full, and payloads encrypted) or headers (cheaper, payload bytes unprotected); the same on every rank",
     COMM(auth_mac), CHOICE(auth_mac_choices)},
    {"LOOM_AUTH_CIPHER", "auto", "with a key, the AEAD that seals TCP frames: aes-256-gcm, chacha20-poly1305, or auto (AES-GCM where the CPU has AES instructions, else ChaCha20-Poly1305; loom-info names the choice); the same on every rank",
     COMM(auth_cipher), CHOICE(auth_cipher_choices)},
    {"LOOM_EARLY_MAX_BYTES", "1073741824", "TCP: most bytes of messages from one peer held before their receive is posted",
     COMM(early_max_bytes), INT(0, LONG_MAX)},
    {"LOOM_STORE_MAX_BYTES", "268435456", "tcp:// store server (rank 0, loomrun, loom-store): bytes of keys, values and requests it holds at once; a SET beyond is refused",
     SERVER(max_bytes), INT(4096, LONG_MAX)},
    {"LOOM_STORE_MAX_CLIENTS", "8192", "tcp:// store server: connections at once (the oldest without a finished hello, else the longest idle, makes room)",
     SERVER(max_clients), INT(1, 1L << 24)},
    {"LOOM_STORE_MAX_CLIENTS_PER_HOST", "2048", "tcp:// store server: connections at once from one source address",
     SERVER(max_clients_per_host), INT(1, 1L << 24)},
    {"LOOM_STORE_HELLO_TIMEOUT", "5", "tcp:// store server: seconds a new connection has to finish its hello",
     SERVER(hello_timeout_s), SECONDS},
    {"LOOM_STORE_IDLE_TIMEOUT", "120", "tcp:// store server: seconds a client with no WAIT parked may stay silent (clients reconnect on their own)",
     SERVER(idle_timeout_s), SECONDS},
    {"LOOM_FILE_STORE_GROUP", "0", "1: a file:// store directory shared by a group: creates 0770/0660 and accepts the group's files (else 0700/0600, only this user's)",
     FILE_STORE(file_group), INT(0, 1)},
    {"LOOM_REDIS_USER", NULL, "redis:// store: the ACL user to authenticate as (with LOOM_REDIS_PASSWORD; else the default user)",
     REDIS(redis_user), STRREF},
    {"LOOM_REDIS_PASSWORD", NULL, "redis:// store: password sent with AUTH before any command (the URI never carries it); never printed",
     REDIS(redis_password), STRREF, .flags = LOOM_SETTING_SECRET},
    {"LOOM_TRANSPORT", "auto", "network transport between nodes: auto (ibverbs when a device is up, else tcp), tcp or ibverbs",
     COMM(transport), CUSTOM(parse_transport)},
    {"LOOM_SHM", "1", "1: ranks on one node talk through shared memory; 0: through the network transport",
     COMM(shm), INT(0, 1)},
    {"LOOM_SHM_CMA", "1", "1: shared memory copies large messages straight from the sender (cross-memory attach) where the kernel allows; 0: always through the rings",
     COMM(shm_cma), INT(0, 1)},
    {"LOOM_SOCKET_IFNAME", NULL, "network interface for TCP (else the one that reaches the store)",
     COMM(ifname), STRING},
    {"LOOM_SOCKETS_PER_PEER", "1", "TCP connections per pair of ranks (1-16, the same on every rank): messages of LOOM_STRIPE_MIN_BYTES and more are split across them, for networks that cap each flow below the link rate; 1 on loopback and uncapped links, where one flow already fills the link",
     COMM(sockets_per_peer), INT(1, LOOM_MAX_STREAMS)},
    {"LOOM_STRIPE_MIN_BYTES", "262144", "TCP with LOOM_SOCKETS_PER_PEER > 1: messages at least this big are striped across the streams, smaller ones stay on the first; the default is LOOM_SEGMENT_BYTES's, the unit ring algorithms send in",
     COMM(stripe_min_bytes), INT(1, LONG_MAX)},
    {"LOOM_SOCKET_BUFSIZE", "4194304", "SO_SNDBUF/SO_RCVBUF in bytes; 0 keeps kernel autotuning",
     COMM(socket_bufsize), INT(0, 1L << 30)},
    {"LOOM_SPIN_US", "auto", "microseconds a waiting call busy-polls before sleeping in the kernel (epoll, futex); auto: about twice what recent waits took (50 to 200), never on one CPU, and on crowded CPUs (more local ranks or runnable tasks than CPUs) unless waits show sleeping to be clearly (2x) faster; 0 never spins",
     COMM(spin_us), CUSTOM(parse_spin_us)},
    {"LOOM_SPIN_YIELD", "1", "1: yield the core between polls, so ranks sharing cores (or a busy machine) do not starve each other",
     COMM(spin_yield), INT(0, 1)},
    {"LOOM_SEGMENT_BYTES", "262144", "pipelining unit of ring algorithms",
     COMM(segment_bytes), INT(64, 1L << 30)},
    {"LOOM_ALGO", NULL, "force algorithms, e.g. allreduce=ring,allgather=bruck; per byte range (the vector; allgather: the gathered total): allreduce=recdbl@-64K,allreduce=ring@1M- (K/M/G; LO inclusive, HI exclusive); the first item that covers a call decides, =auto leaves it to Loom",
     COMM(algo), STRING},
    {"LOOM_HOST_ID", NULL, "host identity for topology (else hostname + boot id)",
     COMM(host_id), STRING},
    {"LOOM_ELASTIC", "0", "1: loom_init joins an elastic job through membership rounds in the store (loomrun --elastic sets it)",
     COMM(elastic), INT(0, 1)},
    {"LOOM_ELASTIC_ID", NULL, "stable id of this process in an elastic job (loomrun sets it; else the store numbers it)",
     COMM(elastic_id), INT(0, 1L << 40), .unset = -1},
    {"LOOM_ELASTIC_TIMEOUT", NULL, "seconds an elastic membership round waits for missing members (else LOOM_TIMEOUT)",
     COMM(elastic_timeout_s), SECONDS},
    {"LOOM_ELASTIC_MIN_NP", "1", "fewest ranks an elastic epoch may have",
     COMM(elastic_min_np), INT(1, 1L << 20)},
    {"LOOM_TIMELINE", NULL, "write a Chrome trace of every operation per rank to this file (%r: rank)",
     COMM(timeline), STRING},
    {"LOOM_IB_HCA", NULL, "RDMA ports for ibverbs, NCCL syntax: mlx5_0:1,mlx5_1 (prefixes), ^mlx5_2 excludes, =name exact (else every active port)",
     COMM(ib_hca), STRING},
    {"LOOM_IB_GID_INDEX", NULL, "RoCE GID index (else the RoCE v2 GID carrying the interface's address)",
     COMM(ib_gid_index), INT(0, 255), .unset = -1},
    {"LOOM_NET_GDR", NULL, "GPUDirect RDMA for GPU buffers over ibverbs: 1 forces (a GPU call fails where it cannot), 0 stages through host memory (unset: direct where GPU and HCA share a PCIe switch, as NCCL; else, or when sysfs cannot tell, staged)",
     COMM(net_gdr), INT(0, 1), .unset = -1},
    {"LOOM_CUDA_CHUNK_BYTES", "4194304", "GPU buffers: bytes per pass through the pinned host staging buffers, the same on every rank (builds with CUDA)",
     COMM(cuda_chunk_bytes), INT(1, 1L << 32)},
    {"LOOM_CUDA_OVERLAP", "1", "GPU buffers: 1 overlaps the staging copies of the passes before and after with the host collective of each pass (three sets of pinned buffers); 0 runs one pass at a time (builds with CUDA)",
     COMM(cuda_overlap), INT(0, 1)},
    {"LOOM_CUDA_IPC", "1", "GPU buffers: 1 runs every collective but barrier GPU to GPU through CUDA IPC handles when every rank is on one node (alltoall and alltoallv in place excepted), and allreduce, broadcast, reduce, allgather and reduce_scatter through IPC inside each node and GPUDirect RDMA between when several nodes hold the same number of ranks; 0 stages them through host memory; the same on every rank (builds with CUDA)",
     COMM(cuda_ipc), INT(0, 1)},
    {"LOOM_IB_REG_CACHE", "0", "bytes of idle pinned registrations of user memory ibverbs keeps for reuse; safe only if no buffer is freed or remapped while cached (else stale pages: wrong data); 0 registers per message (see loom_comm_register_buffer)",
     COMM(ib_reg_cache), INT(0, LONG_MAX)},
    {"LOOM_IB_ODP", "1", "1: register user memory on demand (IBV_ACCESS_ON_DEMAND, cached safely) where the HCA supports it; 0: never",
     COMM(ib_odp), INT(0, 1)},
    {"LOOM_IB_TIMEOUT", "20", "ibverbs local ACK timeout exponent: 4.096 us << N per try (20: 4.3 s)",
     COMM(ib_timeout), INT(1, 31)},
    {"LOOM_IB_RETRY_CNT", "7", "ibverbs transport retries before a send fails with retry exceeded (0-7)",
     COMM(ib_retry_cnt), INT(0, 7)},
    {"LOOM_IB_RNR_RETRY", "7", "ibverbs receiver-not-ready retries (0-7; 7: forever)",
     COMM(ib_rnr_retry), INT(0, 7)},
    {"LOOM_IB_TC", "0", "traffic class of ibverbs packets (RoCE: DSCP << 2, e.g. 106 for a lossless class)",
     COMM(ib_tc), INT(0, 255)},
    {"LOOM_IB_SL", "0", "InfiniBand service level (RoCE: priority) of ibverbs queue pairs",
     COMM(ib_sl), INT(0, 15)},
    {"LOOM_DEBUG", NULL, "WARN|INFO|TRACE log level (stderr)",
     LISTED(LOOM_SG_LOG)},
    {"LOOM_DEBUG_SUBSYS", NULL, "comma list of subsystems to log: init,tcp,store,coll",
     LISTED(LOOM_SG_LOG)},
    {"LOOM_DEBUG_FILE", NULL, "log to this file instead of stderr (%h host, %p pid)",
     LISTED(LOOM_SG_LOG)},
    {"LOOM_FUSION_THRESHOLD", "67108864", "Python (loom.torch, loom.tensorflow, ...): bytes of tensors fused into one collective (K/M/G suffixes; horovodrun --fusion-threshold-mb)",
     LISTED(LOOM_SG_PYTHON)},
    {"LOOM_CYCLE_TIME", "1.0", "Python: milliseconds the background engine waits to gather tensors into one round (horovodrun --cycle-time-ms)",
     LISTED(LOOM_SG_PYTHON)},
    {"LOOM_CACHE_CAPACITY", "1024", "Python: tensors the engine remembers so repeated ones skip announcing (0 turns the cache off; horovodrun --cache-capacity)",
     LISTED(LOOM_SG_PYTHON)},
    {"LOOM_STALL_TIMEOUT", "2.0", "Python: seconds every rank may wait with nothing moving before the engine fails the tensors some ranks never submitted (at least 10 cycles)",
     LISTED(LOOM_SG_PYTHON)},
};
const size_t loom_num_settings = sizeof(loom_settings_table) / sizeof(loom_settings_table[0]);

const char *loom_getenv_process(const char *name, void *arg)
{
    (void)arg;
    return getenv(name);
}

const loom_setting_t *loom_setting_find(const char *name)
{
    for (size_t i = 0; i < loom_num_settings; i++)
        if (strcmp(loom_settings_table[i].name, name) == 0)
            return &loom_settings_table[i];
    return NULL;
}

int loom_parse_long(const char *s, long min, long max, long *out)
{
    if (s == NULL || *s == '\0')
        return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    while (*end == ' ' || *end == '\t')
        end++;
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int loom_spin_parse(const char *text, int *us_p)
{
    long v;
    if (text && strcasecmp(text, "auto") == 0) {
        *us_p = -1;
        return 0;
    }
    if (loom_parse_long(text, 0, 10000000, &v) != 0)
        return -1;
    *us_p = (int)v;
    return 0;
}

static loom_status_t copy_setting(char *dst, size_t dstlen, const char *name, const char *v,
                                  loom_err_t *err)
{
    if (v == NULL) {
        dst[0] = '\0';
        return LOOM_SUCCESS;
    }
    if (strlen(v) >= dstlen)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "%s is too long (at most %zu characters)",
                            name, dstlen - 1);
    strcpy(dst, v);
    return LOOM_SUCCESS;
}

/* Integer fields are int or 8 bytes wide (long, size_t, uint64_t, long long);
 * values are in [min, max], so the 8-byte pattern is right for all of them. */
static void store_int(void *field, size_t size, long v)
{
    if (size == sizeof(int)) {
        int i = (int)v;
        memcpy(field, &i, sizeof(i));
    } else {
        int64_t l = v;
        memcpy(field, &l, sizeof(l));
    }
}

static loom_status_t parse_choice(const loom_setting_t *r, const char *v, void *field,
                                  loom_err_t *err)
{
    char list[128] = "";
    size_t used = 0;
    for (int i = 0; r->choices[i]; i++) {
        if (v && strcasecmp(v, r->choices[i]) == 0) {
            memcpy(field, &i, sizeof(i));
            return LOOM_SUCCESS;
        }
        int n = snprintf(list + used, sizeof(list) - used, "%s%s", i ? ", " : "", r->choices[i]);
        if (n > 0 && (size_t)n < sizeof(list) - used)
            used += (size_t)n;
    }
    return loom_err_set(err, LOOM_ERR_INVALID_ARG, "%s=\"%s\" is none of %s", r->name,
                        v ? v : "", list);
}

static loom_status_t parse_row(const loom_setting_t *r, const char *v, void *base,
                               loom_getenv_fn get, void *arg, loom_err_t *err)
{
    char *field = (char *)base + r->offset;
    switch (r->type) {
    case LOOM_SETTING_NONE:
        return LOOM_SUCCESS;
    case LOOM_SETTING_INT: {
        long n = r->unset;
        if (v && loom_parse_long(v, r->min, r->max, &n) != 0)
            return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                                "%s=\"%s\" is not an integer in [%ld, %ld]", r->name, v, r->min,
                                r->max);
        store_int(field, r->size, n);
        return LOOM_SUCCESS;
    }
    case LOOM_SETTING_SECONDS: {
        /* Unset without a default: 0, which the reader takes as "inherit". */
        double d = 0;
        if (v) {
            char *end;
            errno = 0;
            d = strtod(v, &end);
            if (errno != 0 || end == v || *end != '\0' || !(d > 0) || d > 1e7)
                return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                                    "%s=\"%s\" is not a positive number of seconds", r->name, v);
        }
        memcpy(field, &d, sizeof(d));
        return LOOM_SUCCESS;
    }
    case LOOM_SETTING_STRING:
        return copy_setting(field, r->size, r->name, v, err);
    case LOOM_SETTING_STRREF:
        memcpy(field, &v, sizeof(v));
        return LOOM_SUCCESS;
    case LOOM_SETTING_CHOICE:
        return parse_choice(r, v, field, err);
    case LOOM_SETTING_CUSTOM:
        return r->parse(r, v, base, get, arg, err);
    }
    return loom_err_set(err, LOOM_ERR_INTERNAL, "%s: unknown setting type %d", r->name,
                        (int)r->type);
}

loom_status_t loom_settings_load_group(loom_setting_group_t group, void *base,
                                       loom_getenv_fn get, void *arg, loom_err_t *err)
{
    for (size_t i = 0; i < loom_num_settings; i++) {
        const loom_setting_t *r = &loom_settings_table[i];
        if (r->group != group)
            continue;
        const char *v = get(r->name, arg);
        if (v == NULL || *v == '\0')
            v = r->default_value;
        loom_status_t st = parse_row(r, v, base, get, arg, err);
        if (st != LOOM_SUCCESS)
            return st;
    }
    return LOOM_SUCCESS;
}

loom_status_t loom_store_limits_from_env(loom_store_limits_t *lim, loom_err_t *err)
{
    memset(lim, 0, sizeof(*lim));
    return loom_settings_load_group(LOOM_SG_STORE_SERVER, lim, loom_getenv_process, NULL, err);
}

static loom_status_t parse_transport(const loom_setting_t *r, const char *v, void *base,
                                     loom_getenv_fn get, void *arg, loom_err_t *err)
{
    (void)get;
    (void)arg;
    loom_settings_t *s = base;
    if (!v || (strcasecmp(v, "auto") != 0 && strcasecmp(v, "tcp") != 0 &&
               strcasecmp(v, "ibverbs") != 0))
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "%s=\"%s\" is none of auto, tcp, ibverbs", r->name, v ? v : "");
    snprintf(s->transport, sizeof(s->transport), "%s", v);
    for (char *t = s->transport; *t; t++)
        *t = (char)(*t >= 'A' && *t <= 'Z' ? *t - 'A' + 'a' : *t);
    return LOOM_SUCCESS;
}

/* "auto" or a number of microseconds (base/spin.h). */
static loom_status_t parse_spin_us(const loom_setting_t *r, const char *v, void *base,
                                   loom_getenv_fn get, void *arg, loom_err_t *err)
{
    (void)get;
    (void)arg;
    loom_settings_t *s = base;
    if (loom_spin_parse(v, &s->spin_us) != 0)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "%s=\"%s\" is neither auto nor an integer in [0, 10000000]", r->name,
                            v ? v : "");
    return LOOM_SUCCESS;
}

/* The job id keeps jobs sharing a store (or a stale file:// directory) apart:
 * LOOM_JOB_ID, else the launcher's, else "default". */
static loom_status_t parse_job_id(const loom_setting_t *r, const char *v, void *base,
                                  loom_getenv_fn get, void *arg, loom_err_t *err)
{
    loom_settings_t *s = base;
    static const char *const fallbacks[] = {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"};
    for (size_t i = 0; i < sizeof(fallbacks) / sizeof(fallbacks[0]) && !v; i++) {
        v = get(fallbacks[i], arg);
        if (v && !*v)
            v = NULL;
    }
    return copy_setting(s->job_id, sizeof(s->job_id), r->name, v ? v : "default", err);
}

static loom_status_t parse_auth_key(const loom_setting_t *r, const char *v, void *base,
                                    loom_getenv_fn get, void *arg, loom_err_t *err)
{
    (void)get;
    (void)arg;
    loom_settings_t *s = base;
    if (!v)
        return LOOM_SUCCESS;
    if (strlen(v) >= sizeof(s->auth_key))
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "%s is too long (at most %zu bytes)",
                            r->name, sizeof(s->auth_key) - 1);
    s->auth_keylen = strlen(v);
    memcpy(s->auth_key, v, s->auth_keylen);
    return LOOM_SUCCESS;
}

/* The contents of LOOM_AUTH_KEY_FILE, unless LOOM_AUTH_KEY (its row comes
 * first) gave a key already. */
static loom_status_t parse_auth_key_file(const loom_setting_t *r, const char *path, void *base,
                                         loom_getenv_fn get, void *arg, loom_err_t *err)
{
    (void)r;
    (void)get;
    (void)arg;
    loom_settings_t *s = base;
    if (s->auth_keylen > 0 || !path)
        return LOOM_SUCCESS;
    FILE *f = fopen(path, "rb");
    if (!f)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "LOOM_AUTH_KEY_FILE=%s: %s", path,
                            strerror(errno));
    /* Like ssh with a private key, but only a warning: shared-group setups
     * exist. Shown whatever LOOM_DEBUG says, once per process. */
    static _Atomic int warned;
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && (sb.st_mode & (S_IRWXG | S_IRWXO)) != 0 &&
        atomic_exchange(&warned, 1) == 0) {
        (void)loom_log_level();   /* opens the log */
        loom_log_write(LOOM_LOG_WARN, "init", "LOOM_AUTH_KEY_FILE=%s can be read or written by "
                       "%s (mode %03o): anyone who reads the key can join or tamper with the "
                       "job; chmod 600 it", path,
                       (sb.st_mode & S_IRWXO) ? "other users" : "its group",
                       (unsigned)(sb.st_mode & 0777));
    }
    size_t n = fread(s->auth_key, 1, sizeof(s->auth_key), f);
    int bad = ferror(f) || n == sizeof(s->auth_key);
    fclose(f);
    if (bad)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "LOOM_AUTH_KEY_FILE=%s: unreadable or "
                            "longer than %zu bytes", path, sizeof(s->auth_key) - 1);
    if (n > 0 && s->auth_key[n - 1] == '\n')
        n--;
    if (n == 0)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "LOOM_AUTH_KEY_FILE=%s is empty", path);
    s->auth_keylen = n;
    return LOOM_SUCCESS;
}

/* Whether the launcher says every rank of the job runs on this node: its
 * local size equals the world size (loomrun, torchrun, Open MPI, MPICH), or
 * Slurm gave the job one node. The first launcher whose pair is set decides. */
static int launcher_single_node(loom_getenv_fn get, void *arg)
{
    static const char *const pairs[][2] = {
        {"LOOM_LOCAL_SIZE", "LOOM_SIZE"}, {"LOCAL_WORLD_SIZE", "WORLD_SIZE"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE"}, {"MPI_LOCALNRANKS", "PMI_SIZE"},
    };
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
        long local, world;
        if (loom_parse_long(get(pairs[i][0], arg), 1, INT_MAX, &local) == 0 &&
            loom_parse_long(get(pairs[i][1], arg), 1, INT_MAX, &world) == 0)
            return local == world;
    }
    long nodes;
    return loom_parse_long(get("SLURM_JOB_NUM_NODES", arg), 1, INT_MAX, &nodes) == 0 &&
           nodes == 1;
}

loom_status_t loom_settings_load(loom_settings_t *s, loom_getenv_fn get, void *arg,
                                 loom_err_t *err)
{
    memset(s, 0, sizeof(*s));
    loom_status_t st = loom_settings_load_group(LOOM_SG_COMM, s, get, arg, err);
    if (st != LOOM_SUCCESS)
        return st;
    s->single_node = launcher_single_node(get, arg);
    return LOOM_SUCCESS;
}
