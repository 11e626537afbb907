/*
 * shm.c - the shared-memory transport between ranks of one node.
 *
 * Every rank owns one anonymous segment (memfd: it has no name, so nothing
 * can be left behind in /dev/shm, whatever way the process ends). The segment
 * holds one single-producer ring per peer: peer p writes its messages to us
 * into ring[p] of our segment, having mapped it through /proc/<pid>/fd/<fd>.
 *
 * Small messages travel inside the ring (two copies, no system call). Large
 * ones travel by cross-memory attach: the sender puts a descriptor of its
 * buffer in the ring, the receiver copies straight from the sender's memory
 * into its posted buffer with one process_vm_readv and answers with a FIN that
 * completes the send. Where the kernel or a container forbids that (checked
 * per peer at connect), large messages are streamed through the ring instead.
 *
 * An idle receiver sleeps on a futex in its own segment; writers wake it only
 * when it says it sleeps. A peer that dies is noticed by its pid vanishing.
 *
 * Any process of the same user can open any segment by its /proc path, and an
 * address record says which path: a record replayed from another job of that
 * user (same LOOM_JOB_ID, same LOOM_AUTH_KEY, so it verifies) names that job's
 * segment. Unlike TCP there is no handshake, so each segment carries one: at
 * connect its owner writes a binding into the header, a MAC with LOOM_AUTH_KEY
 * (a plain SHA-256 without one) over the job, the communicator, its rank and
 * every local rank's address as it read them from the store, then sets
 * `bound`. A peer maps the segment, waits (bounded) for `bound`, computes the
 * binding from its own view of the addresses and writes nothing into any
 * segment (attached, doorbells, records, BYE) nor reads the owner's memory by
 * CMA before all of them matched. Another job's rank bound other addresses
 * (its own peers' pids and descriptors), so its segment is refused and that
 * job never sees us; a mistake in our store fails only our job.
 *
 * This file sets the transport up and tears it down; shm_send.c writes to the
 * peers' rings, shm_recv.c matches and drains ours; shm_int.h has the layout.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/settings.h"
#include "base/crypto.h"
#include "shm_int.h"

/* ---- setup ---------------------------------------------------------------- */

static loom_status_t shm_create(const loom_tp_params_t *p, char *addr, size_t addrlen,
                                loom_tp_t **tp_p)
{
    loom_tp_t *tp = calloc(1, sizeof(*tp));
    if (!tp)
        return loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
    tp->rank = p->rank;
    tp->size = p->size;
    tp->err = p->err;
    tp->memfd = -1;
    tp->fault = LOOM_TP_FAULT_NONE;
    tp->probe = SEGMENT_MAGIC ^ (uint64_t)getpid();
    tp->use_cma = p->settings ? p->settings->shm_cma : 1;
    tp->job_hash = p->job_hash;
    tp->comm_hash = p->comm_hash;
    if (p->settings) {
        snprintf(tp->job_id, sizeof(tp->job_id), "%s", p->settings->job_id);
        if (p->settings->auth_keylen <= sizeof(tp->key)) {
            memcpy(tp->key, p->settings->auth_key, p->settings->auth_keylen);
            tp->keylen = p->settings->auth_keylen;
        }
    }
    tp->peers = calloc((size_t)p->size, sizeof(shm_peer_t));
    tp->seg_bytes = sizeof(segment_t) + (size_t)p->size * sizeof(ring_t) + WINDOW_BYTES;
    if (!tp->peers) {
        free(tp);
        return loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
    }
    for (int r = 0; r < p->size; r++)
        tp->peers[r].rank = r;
    /* Pages of rings no local peer uses are never touched, so a large job
     * costs address space, not memory. */
    tp->memfd = memfd_create("loom-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (tp->memfd < 0 || ftruncate(tp->memfd, (off_t)tp->seg_bytes) != 0 ||
        fcntl(tp->memfd, F_ADD_SEALS, SEGMENT_SEALS) != 0) {
        loom_status_t st = loom_err_set(p->err, LOOM_ERR_TRANSPORT,
                                        "shared memory: cannot create a %zu-byte segment: %s "
                                        "(LOOM_SHM=0 turns shared memory off)",
                                        tp->seg_bytes, strerror(errno));
        if (tp->memfd >= 0)
            close(tp->memfd);
        free(tp->peers);
        free(tp);
        return st;
    }
    tp->seg = mmap(NULL, tp->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, tp->memfd, 0);
    if (tp->seg == MAP_FAILED) {
        loom_status_t st = loom_err_set(p->err, LOOM_ERR_TRANSPORT,
                                        "shared memory: cannot map the segment: %s",
                                        strerror(errno));
        close(tp->memfd);
        free(tp->peers);
        free(tp);
        return st;
    }
    tp->seg->magic = SEGMENT_MAGIC;
    tp->seg->size = (uint64_t)p->size;
    snprintf(tp->addr, sizeof(tp->addr), "shm:%d:%d:%zu:%llx", (int)getpid(), tp->memfd,
             tp->seg_bytes, (unsigned long long)(uintptr_t)&tp->probe);
    snprintf(addr, addrlen, "%s", tp->addr);
    *tp_p = tp;
    return LOOM_SUCCESS;
}

/* Hashes (with a key: MACs) the binding's parts, each length-prefixed so
 * that no two views give the same bytes. */
typedef struct binder {
    loom_sha256_t sha;
    loom_hmac_t mac;
    int keyed;
} binder_t;

static void bind_part(binder_t *b, const void *data, size_t len)
{
    uint64_t n = len;
    if (b->keyed) {
        loom_hmac_update(&b->mac, &n, sizeof(n));
        loom_hmac_update(&b->mac, data, len);
    } else {
        loom_sha256_update(&b->sha, &n, sizeof(n));
        loom_sha256_update(&b->sha, data, len);
    }
}

/* The binding rank owner writes into its segment, given view[r]: rank r's
 * shared-memory address (NULL: not a local peer). Each side computes it from
 * its own view; they agree only when both read the same records. */
static void binding_of(const loom_tp_t *tp, const char *const *view, int owner,
                       uint8_t out[BINDING_BYTES])
{
    static const char domain[] = "loom shm binding v1";
    binder_t b = {.keyed = tp->keylen > 0};
    loom_hmac_key_t k;
    if (b.keyed) {
        loom_hmac_key_init(&k, tp->key, tp->keylen);
        loom_hmac_start(&b.mac, &k);
        loom_hmac_key_fini(&k);
    } else {
        loom_sha256_init(&b.sha);
    }
    uint64_t ids[4] = {tp->job_hash, tp->comm_hash, (uint64_t)tp->size, (uint64_t)owner};
    bind_part(&b, domain, sizeof(domain));
    bind_part(&b, tp->job_id, strlen(tp->job_id));
    bind_part(&b, ids, sizeof(ids));
    for (int r = 0; r < tp->size; r++) {
        uint8_t present = view[r] != NULL;
        bind_part(&b, &present, 1);
        bind_part(&b, view[r] ? view[r] : "", view[r] ? strlen(view[r]) : 0);
    }
    if (b.keyed)
        loom_hmac_final(&b.mac, out);
    else
        loom_sha256_final(&b.sha, out);
}

/* Can we read the peer's memory? Read its probe word and compare. */
static int cma_works(pid_t pid, uint64_t probe_addr, uint64_t want)
{
    uint64_t got = 0;
    struct iovec l = {&got, sizeof(got)}, r = {(void *)(uintptr_t)probe_addr, sizeof(got)};
    return process_vm_readv(pid, &l, 1, &r, 1, 0) == (ssize_t)sizeof(got) && got == want;
}

/* Map rank r's segment and check that it is bound to our view, reading it
 * only: on success peer->seg is set (peer->local not yet). */
static loom_status_t map_and_check(loom_tp_t *tp, int r, const char *addr,
                                   const char *const *view, double deadline, double timeout_s)
{
    shm_peer_t *peer = &tp->peers[r];
    int pid, fd;
    size_t bytes;
    unsigned long long probe;
    if (sscanf(addr, "shm:%d:%d:%zu:%llx", &pid, &fd, &bytes, &probe) != 4 ||
        bytes != tp->seg_bytes)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d published a bad shared-memory "
                       "address \"%s\"", r, addr);
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
    int pfd = open(path, O_RDWR | O_CLOEXEC);
    if (pfd < 0)
        return tp_fail(tp, LOOM_ERR_TRANSPORT,
                       "shared memory: cannot open rank %d's segment %s: %s (are the ranks "
                       "in one container, under one user? LOOM_SHM=0 turns shared memory "
                       "off)", r, path, strerror(errno));
    /* Only a sealed memfd of the announced size: mapping anything shorter
     * (or a file its owner may still shrink) would let a touch beyond its
     * end kill us with SIGBUS. */
    struct stat sb;
    int seals = fcntl(pfd, F_GET_SEALS);
    if (fstat(pfd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != bytes ||
        seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
        close(pfd);
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "shared memory: rank %d's segment %s is not "
                       "a sealed memfd of %zu bytes", r, path, bytes);
    }
    /* Writable because we will produce into it, but nothing is written before
     * the binding matched. */
    segment_t *seg = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
    close(pfd);
    if (seg == MAP_FAILED)
        return tp_fail(tp, LOOM_ERR_TRANSPORT, "shared memory: cannot map rank %d's "
                       "segment: %s", r, strerror(errno));
    loom_status_t st = LOOM_SUCCESS;
    if (seg->magic != SEGMENT_MAGIC || seg->size != (uint64_t)tp->size) {
        st = tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d's shared-memory segment is not one of "
                     "this communicator (another Loom version, or another job's)", r);
        goto err_unmap;
    }
    /* Its owner binds it when it reaches connect; a segment of a job that
     * never does is refused after LOOM_TIMEOUT like a rank that never came. */
    while (atomic_load_explicit(&seg->bound, memory_order_acquire) != SEG_BOUND) {
        if (loom_now_s() > deadline) {
            st = tp_fail(tp, LOOM_ERR_TIMEOUT, "rank %d timed out after %.1f s waiting for "
                         "rank %d to bind its shared memory", tp->rank, timeout_s, r);
            goto err_unmap;
        }
        if (kill(pid, 0) != 0 && errno == ESRCH) {
            st = tp_fail(tp, LOOM_ERR_PEER_LOST, "rank %d died while connecting", r);
            goto err_unmap;
        }
        usleep(200);
    }
    uint8_t want[BINDING_BYTES], got[BINDING_BYTES];
    binding_of(tp, view, r, want);
    memcpy(got, seg->binding, sizeof(got));
    if (!loom_equal_ct(want, got, sizeof(want))) {
        if (tp->keylen)
            st = tp_fail(tp, LOOM_ERR_AUTH, "shared memory: rank %d's segment (pid %d) is "
                         "bound to another job or communicator: its LOOM_AUTH_KEY binding does "
                         "not match the addresses rank %d read from the store (a record of "
                         "another job with the same key and LOOM_JOB_ID replayed into this "
                         "job's store?); nothing was written to it", r, pid, tp->rank);
        else
            st = tp_fail(tp, LOOM_ERR_TRANSPORT, "shared memory: rank %d's segment (pid %d) "
                         "belongs to another job or communicator: its binding does not match "
                         "the addresses rank %d read from the store (a stale or copied record, "
                         "or two jobs sharing a LOOM_JOB_ID and store?); nothing was written "
                         "to it", r, pid, tp->rank);
        goto err_unmap;
    }
    peer->seg = seg;
    peer->seg_bytes = bytes;
    peer->pid = pid;
    return LOOM_SUCCESS;

err_unmap:
    munmap(seg, bytes);
    return st;
}

static loom_status_t shm_connect(loom_tp_t *tp, char *const *addrs, double timeout_s)
{
    double deadline = loom_now_s() + timeout_s;
    loom_status_t st = LOOM_SUCCESS;
    /* Our own record as the store gave it back: another's means every peer
     * would be sent to a segment not ours. */
    if (addrs[tp->rank] && strcmp(addrs[tp->rank], tp->addr) != 0)
        return tp_fail(tp, tp->keylen ? LOOM_ERR_AUTH : LOOM_ERR_TRANSPORT,
                       "shared memory: rank %d's address in the store is \"%s\", not its own "
                       "\"%s\": another process's record (replayed from another job with the "
                       "same LOOM_JOB_ID?)", tp->rank, addrs[tp->rank], tp->addr);
    const char **view = calloc((size_t)tp->size, sizeof(char *));
    if (!view)
        return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
    for (int r = 0; r < tp->size; r++)
        view[r] = r == tp->rank ? tp->addr : addrs[r];
    binding_of(tp, view, tp->rank, tp->seg->binding);
    atomic_store_explicit(&tp->seg->bound, SEG_BOUND, memory_order_release);

    /* Every peer's segment checked before we write into any of them. */
    for (int r = 0; r < tp->size && st == LOOM_SUCCESS; r++)
        if (r != tp->rank && addrs[r] != NULL)
            st = map_and_check(tp, r, addrs[r], view, deadline, timeout_s);
    free(view);
    if (st != LOOM_SUCCESS) {
        for (int r = 0; r < tp->size; r++)
            if (tp->peers[r].seg) {
                munmap(tp->peers[r].seg, tp->peers[r].seg_bytes);
                tp->peers[r].seg = NULL;
            }
        return st;
    }
    for (int r = 0; r < tp->size; r++) {
        shm_peer_t *peer = &tp->peers[r];
        if (!peer->seg)
            continue;
        unsigned long long probe;
        if (sscanf(addrs[r], "shm:%*d:%*d:%*u:%llx", &probe) != 1)
            probe = 0;
        peer->local = 1;
        ring_t *mine = &tp->seg->rings[r];
        atomic_store(&mine->consumer_cma,
                     tp->use_cma && cma_works(peer->pid, probe,
                                              SEGMENT_MAGIC ^ (uint64_t)peer->pid) ? 1u : 0u);
        atomic_store(&peer->seg->rings[tp->rank].attached, 1u);
    }
    /* Each peer must have checked whether it can read us before we choose how
     * to send it large messages. */
    for (int r = 0; r < tp->size; r++) {
        shm_peer_t *peer = &tp->peers[r];
        if (!peer->local)
            continue;
        while (!atomic_load(&tp->seg->rings[r].attached)) {
            if (loom_now_s() > deadline)
                return tp_fail(tp, LOOM_ERR_TIMEOUT, "rank %d timed out after %.1f s waiting "
                               "for rank %d to map its shared memory", tp->rank, timeout_s, r);
            if (kill(peer->pid, 0) != 0 && errno == ESRCH)
                return tp_fail(tp, LOOM_ERR_PEER_LOST, "rank %d died while connecting", r);
            usleep(200);
        }
        peer->cma_to_peer = (int)atomic_load(&peer->seg->rings[tp->rank].consumer_cma);
        if (!peer->cma_to_peer)
            LOOM_INFO("shm", "rank %d: rank %d cannot read our memory (cross-memory attach "
                      "refused); large messages go through the ring", tp->rank, r);
    }
    tp->next_liveness = loom_now_s() + LIVENESS_CHECK_S;
    for (int r = 0; r < tp->size; r++)
        tp->peers[r].heard_at = loom_now_s();
    return LOOM_SUCCESS;
}

/* Called on every failure of the communicator (and by loom_comm_abort): we
 * will not answer our peers again, so tell them and wake them to look. */
static void shm_abort(loom_tp_t *tp, loom_status_t why)
{
    atomic_store(&tp->abort_why, (int)why);
    atomic_fetch_add(&tp->seg->doorbell, 1);
    loom_futex_wake(&tp->seg->doorbell);
    /* The fault first, so that a peer that sees the flag reads it whole
     * (a second abort rewrites the same values). */
    loom_tp_fault_t f = tp->fault;
    if (f.reporter < 0)
        f = (loom_tp_fault_t){.culprit = -1, .reporter = tp->rank, .why = why};
    if (atomic_load(&tp->seg->closed) == SEG_OPEN) {
        atomic_store(&tp->seg->fault_culprit, (uint32_t)(f.culprit + 1));
        atomic_store(&tp->seg->fault_reporter, (uint32_t)(f.reporter + 1));
        atomic_store(&tp->seg->fault_why, (uint32_t)f.why);
        atomic_store(&tp->seg->fault_waited_ms, f.waited_ms);
    }
    uint32_t open = SEG_OPEN;
    atomic_compare_exchange_strong(&tp->seg->closed, &open, (uint32_t)SEG_BROKEN);
    for (int r = 0; r < tp->size; r++)
        if (tp->peers[r].local) {
            atomic_fetch_add(&tp->peers[r].seg->doorbell, 1);
            loom_futex_wake(&tp->peers[r].seg->doorbell);
        }
}

/* The caller runs no progress now (it just failed): the fault is ours to set. */
static void shm_give_up(loom_tp_t *tp, loom_status_t why, const loom_tp_fault_t *fault)
{
    loom_tp_fault_keep(&tp->fault, fault);
    shm_abort(tp, why);
}

static int shm_fault(loom_tp_t *tp, loom_tp_fault_t *fault_p)
{
    return loom_tp_fault_get(&tp->fault, fault_p);
}

static double shm_silent_s(loom_tp_t *tp, int peer)
{
    if (peer < 0 || peer >= tp->size || peer == tp->rank || !tp->peers[peer].local)
        return -1;
    return loom_now_s() - tp->peers[peer].heard_at;
}

static void shm_destroy(loom_tp_t *tp, double timeout_s)
{
    if (!tp)
        return;
    /* Say goodbye so a peer still waiting for us fails at once. The ring may
     * be full of messages the peer never received; then it learns from our
     * closed flag or our pid. */
    double deadline = loom_now_s() + timeout_s;
    uint32_t open = SEG_OPEN;
    atomic_compare_exchange_strong(&tp->seg->closed, &open, (uint32_t)SEG_DESTROYED);
    for (int r = 0; r < tp->size; r++) {
        shm_peer_t *peer = &tp->peers[r];
        if (!peer->local)
            continue;
        if (!tp->failed) {
            ring_t *ring = &peer->seg->rings[tp->rank];
            rec_t *rec;
            while ((rec = ring_reserve(ring, 0)) == NULL && loom_now_s() < deadline &&
                   !(kill(peer->pid, 0) != 0 && errno == ESRCH)) {
                int moved = 0;
                shm_drain(tp, peer, &moved);
                usleep(100);
            }
            if (rec) {
                memset(rec, 0, sizeof(*rec));
                rec->kind = REC_BYE;
                ring_publish(peer, ring, 0);
            }
        }
        munmap(peer->seg, peer->seg_bytes);
        loom_unexp_free_all(&peer->uq);
        free(peer->fins);
    }
    loom_unexp_free_all(&tp->peers[tp->rank].uq);
    munmap(tp->seg, tp->seg_bytes);
    close(tp->memfd);
    explicit_bzero(tp->key, sizeof(tp->key));
    free(tp->peers);
    free(tp);
}

/* The ranks of our host that made a segment too (peer_addr: its name). */
static int shm_reaches(loom_tp_t *tp, int peer, const char *peer_addr, int same_host)
{
    return same_host && peer_addr != NULL;
}

static void shm_describe(FILE *out)
{
    fprintf(out, "#   the ranks of a node, through one segment in /dev/shm (LOOM_SHM=0: off)\n");
}

const loom_transport_ops_t loom_shm_transport = {
    .size = sizeof(loom_transport_ops_t),
    .name = "shm",
    .medium = "shared memory",
    .node_local = 1,
    .create = shm_create,
    .connect = shm_connect,
    .isend = shm_isend,
    .irecv = shm_irecv,
    .probe = shm_probe,
    .progress = shm_progress,
    .abort = shm_abort,
    .give_up = shm_give_up,
    .fault = shm_fault,
    .silent_s = shm_silent_s,
    .destroy = shm_destroy,
    .peer_readable = shm_peer_readable,
    .peer_read = shm_peer_read,
    .window = shm_window,
    .watch = shm_watch,
    .reaches = shm_reaches,
    .describe = shm_describe,
};
