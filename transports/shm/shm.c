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

#include "clock.h"
#include "log.h"
#include "settings.h"
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
    snprintf(addr, addrlen, "shm:%d:%d:%zu:%llx", (int)getpid(), tp->memfd, tp->seg_bytes,
             (unsigned long long)(uintptr_t)&tp->probe);
    *tp_p = tp;
    return LOOM_SUCCESS;
}

/* Can we read the peer's memory? Read its probe word and compare. */
static int cma_works(pid_t pid, uint64_t probe_addr, uint64_t want)
{
    uint64_t got = 0;
    struct iovec l = {&got, sizeof(got)}, r = {(void *)(uintptr_t)probe_addr, sizeof(got)};
    return process_vm_readv(pid, &l, 1, &r, 1, 0) == (ssize_t)sizeof(got) && got == want;
}

static loom_status_t shm_connect(loom_tp_t *tp, char *const *addrs, double timeout_s)
{
    for (int r = 0; r < tp->size; r++) {
        shm_peer_t *peer = &tp->peers[r];
        if (r == tp->rank || addrs[r] == NULL)
            continue;
        int pid, fd;
        size_t bytes;
        unsigned long long probe;
        if (sscanf(addrs[r], "shm:%d:%d:%zu:%llx", &pid, &fd, &bytes, &probe) != 4 ||
            bytes != tp->seg_bytes)
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d published a bad shared-memory "
                           "address \"%s\"", r, addrs[r]);
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
        void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
        close(pfd);
        if (m == MAP_FAILED)
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "shared memory: cannot map rank %d's "
                           "segment: %s", r, strerror(errno));
        peer->seg = m;
        peer->seg_bytes = bytes;
        peer->pid = pid;
        peer->local = 1;
        if (peer->seg->magic != SEGMENT_MAGIC || peer->seg->size != (uint64_t)tp->size)
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "rank %d's shared-memory segment is not "
                           "one of this communicator", r);
        ring_t *mine = &tp->seg->rings[r];
        atomic_store(&mine->consumer_cma,
                     tp->use_cma && cma_works(pid, probe, SEGMENT_MAGIC ^ (uint64_t)pid) ? 1u : 0u);
        atomic_store(&peer->seg->rings[tp->rank].attached, 1u);
    }
    /* Each peer must have checked whether it can read us before we choose how
     * to send it large messages. */
    double deadline = loom_now_s() + timeout_s;
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
    futex_wake(&tp->seg->doorbell);
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
            futex_wake(&tp->peers[r].seg->doorbell);
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
    if (tp->fault.reporter < 0)
        return 0;
    *fault_p = tp->fault;
    return 1;
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
    free(tp->peers);
    free(tp);
}

const loom_transport_ops_t loom_shm_transport = {
    .size = sizeof(loom_transport_ops_t),
    .name = "shm",
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
};
