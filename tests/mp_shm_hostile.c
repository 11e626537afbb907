/* mp_shm_hostile.c - a peer that writes forged records into a real shared-memory
 * segment must fail the receiving rank with LOOM_ERR_TRANSPORT within a
 * second: never an overflow, a hang or a SIGBUS.
 *
 * The parent is rank 0 (the victim); a forked child is rank 1, a real
 * transport instance that maps the victim's segment like any peer and then,
 * instead of sending properly, writes into its ring by hand. The transport's
 * private header tells the forger the record and ring layout. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "transports/shm/shm_int.h"

#define shm_create loom_shm_transport.create
#define shm_connect loom_shm_transport.connect
#define shm_destroy loom_shm_transport.destroy

typedef enum {
    START_TOO_LONG_UNEXPECTED,   /* START, len > msglen, no receive posted */
    START_TOO_LONG_POSTED,       /* the same into a posted 64-byte buffer */
    PAD_PAST_HEAD,               /* a PAD whose skip passes what was published */
    HEAD_TOO_FAR,                /* head - tail larger than the ring */
    RECORD_PAST_END,             /* a record that does not fit before the ring's end */
    CONT_UNOPENED,               /* a CONT with nothing begun */
    NOT_A_MEMFD,                 /* the address names a short regular file */
    UNSEALED_MEMFD,              /* the address names a memfd its owner may shrink */
    NCASES
} hostile_case_t;

static const char *const case_names[NCASES] = {
    "START len > msglen, nothing posted", "START len > msglen into a posted receive",
    "PAD past head", "head - tail beyond the ring", "record past the ring's end",
    "CONT of nothing", "a regular file as segment", "an unsealed memfd as segment",
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The forger: rank 1. Writes its address to wr, waits for "go" on rd, forges,
 * answers "done", then lingers until the victim closes rd. */
static void forger(hostile_case_t kase, const char *addr0, int rd, int wr)
{
    loom_err_t err = {0};
    loom_tp_params_t p = {.rank = 1, .size = 2, .err = &err};
    char addr1[128];
    loom_tp_t *tp;
    if (shm_create(&p, addr1, sizeof(addr1), &tp) != LOOM_SUCCESS)
        _exit(2);
    if (kase == NOT_A_MEMFD || kase == UNSEALED_MEMFD) {
        int fd;
        if (kase == NOT_A_MEMFD) {
            char path[] = "/tmp/loom-shm-hostile-XXXXXX";
            fd = mkstemp(path);
            unlink(path);
            if (fd < 0 || ftruncate(fd, 4096) != 0)
                _exit(2);
        } else {
            fd = memfd_create("not-sealed", 0);
            if (fd < 0 || ftruncate(fd, (off_t)tp->seg_bytes) != 0)
                _exit(2);
        }
        snprintf(addr1, sizeof(addr1), "shm:%d:%d:%zu:0", (int)getpid(), fd, tp->seg_bytes);
        if (write(wr, addr1, sizeof(addr1)) != (ssize_t)sizeof(addr1))
            _exit(2);
        char c;
        while (read(rd, &c, 1) > 0)
            ;
        _exit(0);
    }
    if (write(wr, addr1, sizeof(addr1)) != (ssize_t)sizeof(addr1))
        _exit(2);
    char *addrs[2] = {(char *)addr0, addr1};
    if (shm_connect(tp, addrs, 30) != LOOM_SUCCESS)
        _exit(3);
    char c;
    if (read(rd, &c, 1) != 1)
        _exit(4);
    shm_peer_t *victim = &tp->peers[0];
    ring_t *ring = &victim->seg->rings[1];
    uint64_t head = atomic_load(&ring->head);
    rec_t *rec = (rec_t *)(ring->data + head % RING_BYTES);
    memset(rec, 0, sizeof(*rec));
    rec->tag = 7;
    switch (kase) {
    case START_TOO_LONG_UNEXPECTED:
    case START_TOO_LONG_POSTED:
        rec->kind = REC_START;
        rec->msglen = 64;
        rec->len = CHUNK_BYTES;
        memset(rec + 1, 0xAB, CHUNK_BYTES);
        atomic_store(&ring->head, head + rec_space(CHUNK_BYTES));
        break;
    case PAD_PAST_HEAD:
        rec->kind = REC_PAD;
        atomic_store(&ring->head, head + 64);
        break;
    case HEAD_TOO_FAR:
        rec->kind = REC_EAGER;
        atomic_store(&ring->head, head + 3 * (uint64_t)RING_BYTES);
        break;
    case RECORD_PAST_END: {
        /* Move both ends near the ring's end, as though much had passed. */
        uint64_t at = RING_BYTES - 128;
        atomic_store(&ring->tail, at);
        rec = (rec_t *)(ring->data + at);
        memset(rec, 0, sizeof(*rec));
        rec->kind = REC_EAGER;
        rec->tag = 7;
        rec->len = rec->msglen = 200;
        atomic_store(&ring->head, at + rec_space(200));
        break;
    }
    case CONT_UNOPENED:
        rec->kind = REC_CONT;
        rec->len = 16;
        atomic_store(&ring->head, head + rec_space(16));
        break;
    default:
        _exit(5);
    }
    ring_doorbell(victim->seg);
    if (write(wr, "d", 1) != 1)
        _exit(6);
    while (read(rd, &c, 1) > 0)
        ;
    _exit(0);
}

static int run_case(hostile_case_t kase)
{
    loom_err_t err = {0};
    loom_tp_params_t p = {.rank = 0, .size = 2, .err = &err};
    char addr0[128], addr1[128];
    loom_tp_t *tp;
    if (shm_create(&p, addr0, sizeof(addr0), &tp) != LOOM_SUCCESS) {
        fprintf(stderr, "shm_create: %s\n", err.msg);
        return 77;
    }
    int to_child[2], to_parent[2];
    if (pipe(to_child) != 0 || pipe(to_parent) != 0)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        close(to_child[1]);
        close(to_parent[0]);
        forger(kase, addr0, to_child[0], to_parent[1]);
    }
    close(to_child[0]);
    close(to_parent[1]);
    int ok = 0;
    if (read(to_parent[0], addr1, sizeof(addr1)) != (ssize_t)sizeof(addr1)) {
        fprintf(stderr, "%s: the forger did not start\n", case_names[kase]);
        goto out;
    }
    char *addrs[2] = {addr0, addr1};
    loom_status_t st = shm_connect(tp, addrs, 30);
    if (kase == NOT_A_MEMFD || kase == UNSEALED_MEMFD) {
        ok = st == LOOM_ERR_TRANSPORT;
        printf("%s: connect -> %s: %s\n", case_names[kase], loom_strerror(st), err.msg);
        goto out;
    }
    if (st != LOOM_SUCCESS) {
        fprintf(stderr, "%s: connect failed: %s\n", case_names[kase], err.msg);
        goto out;
    }
    uint8_t buf[64];
    loom_tp_req_t req = {.peer = 1, .buf = buf, .len = sizeof(buf), .match = {.tag = 7}};
    if (kase == START_TOO_LONG_POSTED && shm_irecv(tp, &req) != LOOM_SUCCESS)
        goto out;
    if (write(to_child[1], "g", 1) != 1)
        goto out;
    /* The clock starts when the forger says the record is in place. */
    double written = -1, deadline = now_s() + 30;
    fcntl(to_parent[0], F_SETFL, O_NONBLOCK);
    do {
        int moved;
        st = shm_progress(tp, 10, &moved);
        char c;
        if (written < 0 && read(to_parent[0], &c, 1) == 1)
            written = now_s();
    } while (st == LOOM_SUCCESS && now_s() < deadline);
    double took = written < 0 ? 0 : now_s() - written;
    printf("%s: %s after %.3f s: %s\n", case_names[kase], loom_strerror(st), took, err.msg);
    ok = st == LOOM_ERR_TRANSPORT && took < 1.0;
out:
    shm_destroy(tp, 1);
    close(to_child[1]);
    int status;
    waitpid(pid, &status, 0);
    close(to_parent[0]);
    if (!ok)
        fprintf(stderr, "FAIL: %s\n", case_names[kase]);
    return ok ? 0 : 1;
}

int main(void)
{
    /* Before the fix some of these looped forever inside drain(). */
    alarm(120);
    int failures = 0;
    for (int k = 0; k < NCASES; k++) {
        int rc = run_case((hostile_case_t)k);
        if (rc == 77)
            return 77;
        failures += rc != 0;
    }
    return failures ? 1 : 0;
}
