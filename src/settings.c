#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <stdatomic.h>
#include <sys/stat.h>

#include "log.h"
#include "settings.h"
#include "store_proto.h"
#include "spin.h"
#include "wire.h"

const loom_setting_doc_t loom_setting_docs[] = {
    {"LOOM_RANK", NULL, "rank of this process (else RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK)"},
    {"LOOM_SIZE", NULL, "number of ranks (else WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE, PMI_SIZE)"},
    {"LOOM_LOCAL_RANK", NULL, "rank within the node, as the launcher numbers it"},
    {"LOOM_STORE", NULL, "rendezvous store: tcp://host:port, file:///dir or redis://host:port/prefix (else MASTER_ADDR:MASTER_PORT)"},
    {"LOOM_JOB_ID", NULL, "names the job in the store and the handshake (else TORCHELASTIC_RUN_ID, SLURM_JOB_ID)"},
    {"LOOM_TIMEOUT", "300", "seconds a call may wait without progress before LOOM_ERR_TIMEOUT"},
    {"LOOM_AUTH_KEY", NULL, "shared secret: connections between ranks and to the tcp:// store must prove it, TCP frames and published store values carry MACs under it; never printed"},
    {"LOOM_AUTH_KEY_FILE", NULL, "file holding that secret (a trailing newline is dropped); LOOM_AUTH_KEY wins when both are set"},
    {"LOOM_AUTH_MAC", "full", "with a key, what TCP frames' MACs cover: full (headers and payload) or headers (cheaper, payload bytes unprotected); the same on every rank"},
    {"LOOM_EARLY_MAX_BYTES", "1073741824", "TCP: most bytes of messages from one peer held before their receive is posted"},
    {"LOOM_STORE_MAX_BYTES", "268435456", "tcp:// store server (rank 0, loomrun, loom-store): bytes of keys, values and requests it holds at once; a SET beyond is refused"},
    {"LOOM_STORE_MAX_CLIENTS", "8192", "tcp:// store server: connections at once (the oldest without a finished hello, else the longest idle, makes room)"},
    {"LOOM_STORE_MAX_CLIENTS_PER_HOST", "2048", "tcp:// store server: connections at once from one source address"},
    {"LOOM_STORE_HELLO_TIMEOUT", "5", "tcp:// store server: seconds a new connection has to finish its hello"},
    {"LOOM_STORE_IDLE_TIMEOUT", "120", "tcp:// store server: seconds a client with no WAIT parked may stay silent (clients reconnect on their own)"},
    {"LOOM_FILE_STORE_GROUP", "0", "1: a file:// store directory shared by a group: creates 0770/0660 and accepts the group's files (else 0700/0600, only this user's)"},
    {"LOOM_TRANSPORT", "auto", "network transport between nodes: auto (ibverbs when a device is up, else tcp), tcp or ibverbs"},
    {"LOOM_SHM", "1", "1: ranks on one node talk through shared memory; 0: through the network transport"},
    {"LOOM_SHM_CMA", "1", "1: shared memory copies large messages straight from the sender (cross-memory attach) where the kernel allows; 0: always through the rings"},
    {"LOOM_SOCKET_IFNAME", NULL, "network interface for TCP (else the one that reaches the store)"},
    {"LOOM_SOCKETS_PER_PEER", "1", "TCP connections per pair of ranks (1-16, the same on every rank): messages of LOOM_STRIPE_MIN_BYTES and more are split across them, for networks that cap each flow below the link rate; 1 on loopback and uncapped links, where one flow already fills the link"},
    {"LOOM_STRIPE_MIN_BYTES", "262144", "TCP with LOOM_SOCKETS_PER_PEER > 1: messages at least this big are striped across the streams, smaller ones stay on the first; the default is LOOM_SEGMENT_BYTES's, the unit ring algorithms send in"},
    {"LOOM_SOCKET_BUFSIZE", "4194304", "SO_SNDBUF/SO_RCVBUF in bytes; 0 keeps kernel autotuning"},
    {"LOOM_SPIN_US", "auto", "microseconds a waiting call busy-polls before sleeping in the kernel (epoll, futex); auto: about twice what recent waits took (50 to 200), never on one CPU, and on crowded CPUs (more local ranks or runnable tasks than CPUs) unless waits show sleeping to be clearly (2x) faster; 0 never spins"},
    {"LOOM_SPIN_YIELD", "1", "1: yield the core between polls, so ranks sharing cores (or a busy machine) do not starve each other"},
    {"LOOM_SEGMENT_BYTES", "262144", "pipelining unit of ring algorithms"},
    {"LOOM_ALGO", NULL, "force algorithms, e.g. allreduce=ring,allgather=bruck"},
    {"LOOM_HOST_ID", NULL, "host identity for topology (else hostname + boot id)"},
    {"LOOM_ELASTIC", NULL, "1: loom_init joins an elastic job through membership rounds in the store (loomrun --elastic sets it)"},
    {"LOOM_ELASTIC_ID", NULL, "stable id of this process in an elastic job (loomrun sets it; else the store numbers it)"},
    {"LOOM_ELASTIC_TIMEOUT", NULL, "seconds an elastic membership round waits for missing members (else LOOM_TIMEOUT)"},
    {"LOOM_ELASTIC_MIN_NP", "1", "fewest ranks an elastic epoch may have"},
    {"LOOM_TIMELINE", NULL, "write a Chrome trace of every operation per rank to this file (%r: rank)"},
    {"LOOM_IB_HCA", NULL, "RDMA ports for ibverbs, NCCL syntax: mlx5_0:1,mlx5_1 (prefixes), ^mlx5_2 excludes, =name exact (else every active port)"},
    {"LOOM_IB_GID_INDEX", NULL, "RoCE GID index (else the RoCE v2 GID carrying the interface's address)"},
    {"LOOM_NET_GDR", NULL, "GPUDirect RDMA for GPU buffers: 1 forces, 0 stages through host memory (else when GPU and HCA are close)"},
    {"LOOM_CUDA_CHUNK_BYTES", "4194304", "GPU buffers: bytes per pass through the pinned host staging buffers, the same on every rank (builds with CUDA)"},
    {"LOOM_IB_REG_CACHE", "0", "bytes of idle pinned registrations of user memory ibverbs keeps for reuse; safe only if no buffer is freed or remapped while cached (else stale pages: wrong data); 0 registers per message (see loom_comm_register_buffer)"},
    {"LOOM_IB_ODP", "1", "1: register user memory on demand (IBV_ACCESS_ON_DEMAND, cached safely) where the HCA supports it; 0: never"},
    {"LOOM_IB_TIMEOUT", "20", "ibverbs local ACK timeout exponent: 4.096 us << N per try (20: 4.3 s)"},
    {"LOOM_IB_RETRY_CNT", "7", "ibverbs transport retries before a send fails with retry exceeded (0-7)"},
    {"LOOM_IB_RNR_RETRY", "7", "ibverbs receiver-not-ready retries (0-7; 7: forever)"},
    {"LOOM_IB_TC", "0", "traffic class of ibverbs packets (RoCE: DSCP << 2, e.g. 106 for a lossless class)"},
    {"LOOM_IB_SL", "0", "InfiniBand service level (RoCE: priority) of ibverbs queue pairs"},
    {"LOOM_DEBUG", NULL, "WARN|INFO|TRACE log level (stderr)"},
    {"LOOM_DEBUG_SUBSYS", NULL, "comma list of subsystems to log: init,tcp,store,coll"},
    {"LOOM_DEBUG_FILE", NULL, "log to this file instead of stderr (%h host, %p pid)"},
};
const size_t loom_num_setting_docs = sizeof(loom_setting_docs) / sizeof(loom_setting_docs[0]);

const char *loom_getenv_process(const char *name, void *arg)
{
    (void)arg;
    return getenv(name);
}

static const char *setting_default(const char *name)
{
    for (size_t i = 0; i < loom_num_setting_docs; i++)
        if (strcmp(loom_setting_docs[i].name, name) == 0)
            return loom_setting_docs[i].default_value;
    return NULL;
}

/* The variable's value, or its documented default when unset or empty. */
static const char *lookup(loom_getenv_fn get, void *arg, const char *name)
{
    const char *v = get(name, arg);
    return (v && *v) ? v : setting_default(name);
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

static loom_status_t int_setting(loom_getenv_fn get, void *arg, const char *name, long min,
                                 long max, long *out, loom_err_t *err)
{
    const char *v = lookup(get, arg, name);
    if (loom_parse_long(v, min, max, out) != 0)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "%s=\"%s\" is not an integer in [%ld, %ld]", name, v, min, max);
    return LOOM_SUCCESS;
}

static loom_status_t seconds_setting(loom_getenv_fn get, void *arg, const char *name,
                                     double *out, loom_err_t *err)
{
    const char *v = lookup(get, arg, name);
    char *end;
    errno = 0;
    double d = v ? strtod(v, &end) : 0;
    if (v == NULL || errno != 0 || end == v || *end != '\0' || !(d > 0) || d > 1e7)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "%s=\"%s\" is not a positive number of seconds", name, v ? v : "");
    *out = d;
    return LOOM_SUCCESS;
}

loom_status_t loom_store_limits_from_env(loom_store_limits_t *lim, loom_err_t *err)
{
    loom_getenv_fn get = loom_getenv_process;
    loom_status_t st;
    long v;
    memset(lim, 0, sizeof(*lim));
    if ((st = int_setting(get, NULL, "LOOM_STORE_MAX_BYTES", 4096, LONG_MAX, &v, err)) !=
        LOOM_SUCCESS)
        return st;
    lim->max_bytes = (uint64_t)v;
    if ((st = int_setting(get, NULL, "LOOM_STORE_MAX_CLIENTS", 1, 1L << 24,
                          &lim->max_clients, err)) != LOOM_SUCCESS ||
        (st = int_setting(get, NULL, "LOOM_STORE_MAX_CLIENTS_PER_HOST", 1, 1L << 24,
                          &lim->max_clients_per_host, err)) != LOOM_SUCCESS ||
        (st = seconds_setting(get, NULL, "LOOM_STORE_HELLO_TIMEOUT", &lim->hello_timeout_s,
                              err)) != LOOM_SUCCESS ||
        (st = seconds_setting(get, NULL, "LOOM_STORE_IDLE_TIMEOUT", &lim->idle_timeout_s,
                              err)) != LOOM_SUCCESS)
        return st;
    return LOOM_SUCCESS;
}

/* LOOM_AUTH_KEY, else the contents of LOOM_AUTH_KEY_FILE. */
static loom_status_t load_auth_key(loom_settings_t *s, loom_getenv_fn get, void *arg,
                                   loom_err_t *err)
{
    const char *key = lookup(get, arg, "LOOM_AUTH_KEY");
    if (key) {
        if (strlen(key) >= sizeof(s->auth_key))
            return loom_err_set(err, LOOM_ERR_INVALID_ARG, "LOOM_AUTH_KEY is too long (at most "
                                "%zu bytes)", sizeof(s->auth_key) - 1);
        s->auth_keylen = strlen(key);
        memcpy(s->auth_key, key, s->auth_keylen);
        return LOOM_SUCCESS;
    }
    const char *path = lookup(get, arg, "LOOM_AUTH_KEY_FILE");
    if (!path)
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
    loom_status_t st;
    const char *timeout = lookup(get, arg, "LOOM_TIMEOUT");
    char *end;
    errno = 0;
    s->timeout_s = strtod(timeout, &end);
    if (errno != 0 || *end != '\0' || end == timeout || !(s->timeout_s > 0) || s->timeout_s > 1e7)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "LOOM_TIMEOUT=\"%s\" is not a positive number of seconds", timeout);

    const char *transport = lookup(get, arg, "LOOM_TRANSPORT");
    if (strcasecmp(transport, "auto") != 0 && strcasecmp(transport, "tcp") != 0 &&
        strcasecmp(transport, "ibverbs") != 0)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "LOOM_TRANSPORT=\"%s\" is none of auto, tcp, ibverbs", transport);
    snprintf(s->transport, sizeof(s->transport), "%s", transport);
    for (char *t = s->transport; *t; t++)
        *t = (char)(*t >= 'A' && *t <= 'Z' ? *t - 'A' + 'a' : *t);

    if ((st = load_auth_key(s, get, arg, err)) != LOOM_SUCCESS)
        return st;
    const char *mac = lookup(get, arg, "LOOM_AUTH_MAC");
    if (strcasecmp(mac, "full") != 0 && strcasecmp(mac, "headers") != 0)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "LOOM_AUTH_MAC=\"%s\" is neither full nor headers", mac);
    s->auth_mac_headers_only = strcasecmp(mac, "headers") == 0;

    long v;
    if ((st = int_setting(get, arg, "LOOM_SHM", 0, 1, &v, err)) != LOOM_SUCCESS)
        return st;
    s->shm = (int)v;
    if ((st = int_setting(get, arg, "LOOM_SHM_CMA", 0, 1, &v, err)) != LOOM_SUCCESS)
        return st;
    s->shm_cma = (int)v;
    if ((st = int_setting(get, arg, "LOOM_SOCKET_BUFSIZE", 0, 1L << 30, &v, err)) != LOOM_SUCCESS)
        return st;
    s->socket_bufsize = (int)v;
    const char *spin = lookup(get, arg, "LOOM_SPIN_US");
    if (loom_spin_parse(spin, &s->spin_us) != 0)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "LOOM_SPIN_US=\"%s\" is neither auto nor an integer in [0, 10000000]",
                            spin);
    if ((st = int_setting(get, arg, "LOOM_SPIN_YIELD", 0, 1, &v, err)) != LOOM_SUCCESS)
        return st;
    s->spin_yield = (int)v;
    if ((st = int_setting(get, arg, "LOOM_SEGMENT_BYTES", 64, 1L << 30, &v, err)) != LOOM_SUCCESS)
        return st;
    s->segment_bytes = (size_t)v;
    if ((st = int_setting(get, arg, "LOOM_EARLY_MAX_BYTES", 0, LONG_MAX, &v, err)) != LOOM_SUCCESS)
        return st;
    s->early_max_bytes = (size_t)v;
    if ((st = int_setting(get, arg, "LOOM_SOCKETS_PER_PEER", 1, LOOM_MAX_STREAMS, &v, err)) !=
        LOOM_SUCCESS)
        return st;
    s->sockets_per_peer = (int)v;
    if ((st = int_setting(get, arg, "LOOM_STRIPE_MIN_BYTES", 1, LONG_MAX, &v, err)) !=
        LOOM_SUCCESS)
        return st;
    s->stripe_min_bytes = (size_t)v;

    if ((st = copy_setting(s->ifname, sizeof(s->ifname), "LOOM_SOCKET_IFNAME",
                           lookup(get, arg, "LOOM_SOCKET_IFNAME"), err)) != LOOM_SUCCESS ||
        (st = copy_setting(s->algo, sizeof(s->algo), "LOOM_ALGO", lookup(get, arg, "LOOM_ALGO"),
                           err)) != LOOM_SUCCESS ||
        (st = copy_setting(s->host_id, sizeof(s->host_id), "LOOM_HOST_ID",
                           lookup(get, arg, "LOOM_HOST_ID"), err)) != LOOM_SUCCESS ||
        (st = copy_setting(s->timeline, sizeof(s->timeline), "LOOM_TIMELINE",
                           lookup(get, arg, "LOOM_TIMELINE"), err)) != LOOM_SUCCESS)
        return st;

    if ((st = copy_setting(s->ib_hca, sizeof(s->ib_hca), "LOOM_IB_HCA",
                           lookup(get, arg, "LOOM_IB_HCA"), err)) != LOOM_SUCCESS)
        return st;
    s->ib_gid_index = -1;
    if (lookup(get, arg, "LOOM_IB_GID_INDEX")) {
        if ((st = int_setting(get, arg, "LOOM_IB_GID_INDEX", 0, 255, &v, err)) != LOOM_SUCCESS)
            return st;
        s->ib_gid_index = (int)v;
    }
    s->net_gdr = -1;
    if (lookup(get, arg, "LOOM_NET_GDR")) {
        if ((st = int_setting(get, arg, "LOOM_NET_GDR", 0, 1, &v, err)) != LOOM_SUCCESS)
            return st;
        s->net_gdr = (int)v;
    }
    if ((st = int_setting(get, arg, "LOOM_IB_REG_CACHE", 0, LONG_MAX, &v, err)) != LOOM_SUCCESS)
        return st;
    s->ib_reg_cache = (size_t)v;
    if ((st = int_setting(get, arg, "LOOM_IB_ODP", 0, 1, &v, err)) != LOOM_SUCCESS)
        return st;
    s->ib_odp = (int)v;
    if ((st = int_setting(get, arg, "LOOM_IB_TIMEOUT", 1, 31, &v, err)) != LOOM_SUCCESS)
        return st;
    s->ib_timeout = (int)v;
    if ((st = int_setting(get, arg, "LOOM_IB_RETRY_CNT", 0, 7, &v, err)) != LOOM_SUCCESS)
        return st;
    s->ib_retry_cnt = (int)v;
    if ((st = int_setting(get, arg, "LOOM_IB_RNR_RETRY", 0, 7, &v, err)) != LOOM_SUCCESS)
        return st;
    s->ib_rnr_retry = (int)v;
    if ((st = int_setting(get, arg, "LOOM_IB_TC", 0, 255, &v, err)) != LOOM_SUCCESS)
        return st;
    s->ib_tc = (int)v;
    if ((st = int_setting(get, arg, "LOOM_IB_SL", 0, 15, &v, err)) != LOOM_SUCCESS)
        return st;
    s->ib_sl = (int)v;

    s->single_node = launcher_single_node(get, arg);

    /* The job id keeps jobs sharing a store (or a stale file:// directory) apart. */
    static const char *const job_vars[] = {"LOOM_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"};
    const char *job = NULL;
    for (size_t i = 0; i < sizeof(job_vars) / sizeof(job_vars[0]) && !job; i++) {
        job = get(job_vars[i], arg);
        if (job && !*job)
            job = NULL;
    }
    return copy_setting(s->job_id, sizeof(s->job_id), "LOOM_JOB_ID", job ? job : "default", err);
}

int loom_settings_forced_algo(const loom_settings_t *s, const char *coll, char *out,
                              size_t outlen)
{
    size_t clen = strlen(coll);
    const char *p = s->algo;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t itemlen = comma ? (size_t)(comma - p) : strlen(p);
        if (itemlen > clen && strncmp(p, coll, clen) == 0 && p[clen] == '=') {
            size_t vlen = itemlen - clen - 1;
            if (vlen >= outlen)
                vlen = outlen - 1;
            memcpy(out, p + clen + 1, vlen);
            out[vlen] = '\0';
            return 1;
        }
        p += itemlen + (comma ? 1 : 0);
    }
    return 0;
}
