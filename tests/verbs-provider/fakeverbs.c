/*
 * fakeverbs: a test double of libibverbs.so.1 for Loom's tests (see README.md).
 *
 * Processes meet in a registry in POSIX shared memory: QPs (with their receive queues, which
 * senders consume), MRs and one doorbell per process. A thread per context executes the work
 * requests of its QPs after the post returned and moves the data with process_vm_writev into
 * the target's registered memory; it completes the target's receive in the registry and rings
 * the target's doorbell, and the target's thread moves that completion into its CQ.
 *
 * Locks: a context's mutex, then the registry's (robust, process-shared) mutex, never the other
 * way round. No lock is held while data is copied; the MRs written into count their writers
 * meanwhile, and ibv_dereg_mr waits for them (an HCA's dereg returns after its DMA), so the
 * owner never frees memory that a late write then lands in.
 */
#include <infiniband/verbs.h>

#include <endian.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* verbs.h wraps these two in macros; the library exports the functions themselves. */
#undef ibv_query_port
#undef ibv_reg_mr

#define FV_MAX_PROCS 128
#define FV_MAX_QPS 256  /* QPN = generation << 8 | slot */
#define FV_MAX_MRS 4096 /* key = generation << 12 | slot */
#define FV_MAX_WR 1024
#define FV_MAX_SGE 4
#define FV_MAX_INLINE 256
#define FV_MAX_CQE 65536
#define FV_MAX_DEVS 8
#define FV_MAX_PORTS 4
#define FV_MAX_GIDS 2
#define FV_MAGIC 0x66616b6576657203ull /* bump when the registry layout changes */
#define FV_ROCE_V2_GID_INDEX 1

/* ---- the registry (shared memory) -------------------------------------------------------- */

struct fv_proc {
    int32_t pid;         /* 0: free */
    uint32_t doorbell;   /* a futex: bumped whenever this process's threads have work */
    uint64_t alive_addr; /* a byte that process_vm_readv probes to tell a live process */
};

/* A posted receive. The target posts it; a sender consumes it and marks it done. */
struct fv_rwqe {
    uint64_t wr_id;
    struct ibv_sge sg[FV_MAX_SGE];
    uint32_t num_sge;
    uint32_t done;
    int32_t taker; /* pid of the sender that consumed it */
    uint32_t status, opcode, byte_len, imm, wc_flags, src_qp;
};

struct fv_rqp {
    uint32_t qpn; /* 0: free */
    int32_t pid;
    uint32_t proc;
    uint32_t state; /* mirrors the owner's state; a responder error sets ERR here */
    uint32_t pd_id, access;
    uint16_t lid;
    uint8_t link_layer, ngid;
    union ibv_gid gid[FV_MAX_GIDS];
    uint32_t rq_max;
    uint32_t posted, consumed, reaped; /* reaped: moved into the owner's CQ */
    struct fv_rwqe rq[FV_MAX_WR];
};

struct fv_rmr {
    uint32_t key; /* 0: free */
    int32_t pid;
    uint32_t pd_id, access;
    uint64_t iova, addr, len;
    /* Pinned pages: the page frames behind [addr, addr + len) at registration, an array of
     * uint64_t in the owner's memory (0: not modelled, see mr_pin). */
    uint64_t pfn_addr;
    /* Senders copying into this MR now (outside the registry lock). ibv_dereg_mr waits for
     * them, as an HCA finishes its DMA before dereg returns: else the owner could free and
     * reuse the memory under a late write. writer_pid: the last one, to tell a dead one. */
    uint32_t writers;
    int32_t writer_pid;
    uint32_t dmabuf; /* registered by ibv_reg_dmabuf_mr: device memory */
};

struct fv_registry {
    uint64_t magic;
    uint32_t ready; /* 0 fresh, 1 being initialised, 2 ready */
    uint32_t gen;
    pthread_mutex_t lock;
    struct fv_proc procs[FV_MAX_PROCS];
    struct fv_rmr mrs[FV_MAX_MRS];
    struct fv_rqp qps[FV_MAX_QPS];
};

/* ---- process-local objects ------------------------------------------------------------- */

struct fv_port {
    uint16_t lid;
    int ngid;
    union ibv_gid gid[FV_MAX_GIDS];
};

struct fv_dev {
    struct ibv_device ibv;
    uint64_t guid; /* host order */
    int nports;
    struct fv_port port[FV_MAX_PORTS];
};

struct fv_qp;

struct fv_ctx {
    struct ibv_context ibv; /* first: ibv_context pointers are fv_ctx pointers */
    struct fv_dev *dev;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* busy changed */
    pthread_t thread;
    int thread_started, stop, qperr_done;
    struct fv_qp *qps;
    struct fv_qp *busy; /* the QP whose WR is being copied without the lock */
};

struct fv_pd {
    struct ibv_pd ibv;
    uint32_t id;
    int refs;
};

struct fv_mr {
    struct ibv_mr ibv;
    int slot;
    uint64_t *pfns; /* what the registry's pfn_addr points to */
    void *dmabuf_map; /* ibv_reg_dmabuf_mr: the double's mapping of the dma-buf */
    size_t dmabuf_len;
};

struct fv_cqe {
    struct ibv_wc wc;
    /* As on an HCA, queue slots free when the CQE is polled: the SQ's up to idx for a send
     * completion (so unsignalled WRs hold theirs until a later signalled one is polled),
     * the RQ's for a receive. */
    struct fv_qp *qp;
    uint32_t idx;
    int send;
};

struct fv_cq {
    struct ibv_cq ibv;
    int cap, head, count, broken, nqp;
    struct fv_cqe *ring;
};

struct fv_swqe {
    uint64_t wr_id;
    enum ibv_wr_opcode opcode;
    unsigned int flags;
    uint32_t imm;
    uint64_t raddr;
    uint32_t rkey;
    int num_sge, inject_rae;
    struct ibv_sge sg[FV_MAX_SGE];
    uint32_t inline_len;
    uint8_t inl[FV_MAX_INLINE];
};

enum { FV_PEND_NONE, FV_PEND_RNR, FV_PEND_UNREACHABLE };

struct fv_qp {
    struct ibv_qp ibv;
    struct fv_ctx *ctx;
    struct fv_pd *pd;
    struct fv_cq *scq, *rcq;
    int slot, sig_all;
    struct ibv_qp_attr attr;
    struct ibv_qp_cap cap;
    uint32_t sq_tail, sq_head, sq_freed; /* posted, executed, freed by a polled CQE */
    uint32_t rq_freed;                   /* receives freed by a polled CQE */
    struct fv_swqe *sq;
    int pend; /* why the head WR waits */
    uint64_t pend_deadline;
    struct fv_qp *next;
};

/* ---- process-wide state ---------------------------------------------------------------- */

static pthread_once_t fv_once = PTHREAD_ONCE_INIT;
static struct fv_dev fv_devs[FV_MAX_DEVS];
static int fv_ndevs, fv_roce, fv_config_error;
static int fv_fault_rae, fv_fault_qperr; /* N of rae@N / qperr@N, 0 when off */
static uint64_t fv_rnr_ns, fv_retry_ns;  /* fv_retry_ns 0: from the QP's timeout and retry_cnt */

static pthread_mutex_t fv_reg_mutex = PTHREAD_MUTEX_INITIALIZER;
static struct fv_registry *reg;
static uint32_t my_proc;
static volatile uint8_t fv_alive = 1;

static unsigned long fv_posted, fv_writes; /* WRs and RDMA WRITEs posted (atomics) */
static int fv_qperr_fired;
static int fv_stale_warned;
/* FAKEVERBS_STATS=1: at each ibv_close_device, stderr gets what this process registered by dma-buf and the
 * bytes its WRs moved from or into device memory (proof that GPU buffers went straight to
 * the "HCA" and not through host copies). */
static long fv_dmabuf_regs;
static long long fv_dmabuf_bytes_out, fv_dmabuf_bytes_in;

static void fv_stats(void)
{
    const char *on = getenv("FAKEVERBS_STATS");
    if (on && strcmp(on, "1") == 0)
        fprintf(stderr, "fakeverbs: pid %d: dmabuf registrations %ld, device bytes sent %lld, "
                "device bytes written %lld\n", (int)getpid(), fv_dmabuf_regs,
                fv_dmabuf_bytes_out, fv_dmabuf_bytes_in);
}
static uint8_t fv_stale_bytes[4096]; /* what "the old pages" hold, as far as the peer sees */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* An environment variable in milliseconds, as nanoseconds. */
static uint64_t env_ms(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !*v)
        return dflt * 1000000ull;
    unsigned long long ms = strtoull(v, &end, 10);
    if (*end) {
        fprintf(stderr, "fakeverbs: %s=%s is not a number of milliseconds\n", name, v);
        fv_config_error = 1;
        return dflt;
    }
    return ms * 1000000ull;
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static void add_device(const char *name, int nports)
{
    struct fv_dev *d = &fv_devs[fv_ndevs];
    int di = fv_ndevs++;

    d->ibv.node_type = IBV_NODE_CA;
    d->ibv.transport_type = IBV_TRANSPORT_IB;
    snprintf(d->ibv.name, sizeof(d->ibv.name), "%s", name);
    snprintf(d->ibv.dev_name, sizeof(d->ibv.dev_name), "uverbs%d", di);
    snprintf(d->ibv.dev_path, sizeof(d->ibv.dev_path), "/sys/class/infiniband_verbs/uverbs%d", di);
    /* The real layout; nothing is there, so sysfs readers fall back as on a bare node. */
    snprintf(d->ibv.ibdev_path, sizeof(d->ibv.ibdev_path), "/sys/class/infiniband/%s", name);
    d->guid = (fnv1a(name) & ~0xffull) | 0x02; /* locally administered, room for port ids */
    d->nports = nports;
    for (int p = 1; p <= nports; p++) {
        struct fv_port *pt = &d->port[p - 1];
        uint64_t ifid = htobe64(d->guid + (uint64_t)p);
        pt->gid[0].raw[0] = 0xfe;
        pt->gid[0].raw[1] = 0x80;
        memcpy(&pt->gid[0].raw[8], &ifid, 8);
        pt->ngid = 1;
        pt->lid = fv_roce ? 0 : (uint16_t)(16 * (di + 1) + p);
        if (fv_roce) {
            static const uint8_t v4mapped[16] = {0, 0, 0,    0,    0,   0, 0, 0,
                                                 0, 0, 0xff, 0xff, 127, 0, 0, 1};
            memcpy(pt->gid[FV_ROCE_V2_GID_INDEX].raw, v4mapped, 16);
            pt->ngid = 2;
        }
    }
}

static void fv_init(void)
{
    memset(fv_stale_bytes, 0xdb, sizeof(fv_stale_bytes));
    const char *ll = getenv("FAKEVERBS_LINK_LAYER");
    const char *spec = getenv("FAKEVERBS_DEVICES");
    const char *fault = getenv("FAKEVERBS_FAULT");

    if (ll && *ll && strcmp(ll, "ethernet") && strcmp(ll, "infiniband")) {
        fprintf(stderr, "fakeverbs: FAKEVERBS_LINK_LAYER=%s: want ethernet or infiniband\n", ll);
        fv_config_error = 1;
    }
    fv_roce = ll && !strcmp(ll, "ethernet");
    if (!spec)
        spec = "loomfake0:1";
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", spec);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':'), *end = NULL;
        long n = colon ? strtol(colon + 1, &end, 10) : 0;
        if (!colon || colon == tok || *end || n < 1 || n > FV_MAX_PORTS ||
            colon - tok >= IBV_SYSFS_NAME_MAX || fv_ndevs == FV_MAX_DEVS) {
            fprintf(stderr,
                    "fakeverbs: FAKEVERBS_DEVICES entry '%s': want name:ports (1-%d ports, %d "
                    "devices)\n",
                    tok, FV_MAX_PORTS, FV_MAX_DEVS);
            fv_config_error = 1;
            continue;
        }
        *colon = '\0';
        add_device(tok, (int)n);
    }
    if (fault && *fault) {
        int n = 0;
        char kind[8], extra;
        if (sscanf(fault, "%7[a-z]@%d%c", kind, &n, &extra) == 2 && n > 0 && !strcmp(kind, "rae"))
            fv_fault_rae = n;
        else if (sscanf(fault, "%7[a-z]@%d%c", kind, &n, &extra) == 2 && n > 0 &&
                 !strcmp(kind, "qperr"))
            fv_fault_qperr = n;
        else {
            fprintf(stderr, "fakeverbs: FAKEVERBS_FAULT=%s: want rae@N or qperr@N\n", fault);
            fv_config_error = 1;
        }
    }
    fv_rnr_ns = env_ms("FAKEVERBS_RNR_MS", 2000);
    fv_retry_ns = env_ms("FAKEVERBS_RETRY_MS", 0);
}

/* ---- registry access --------------------------------------------------------------------- */

static void reg_lock(void)
{
    /* A process killed inside the lock leaves it EOWNERDEAD; its half-done update touched
     * only its own records, which are reclaimed as those of a dead process. */
    if (pthread_mutex_lock(&reg->lock) == EOWNERDEAD)
        pthread_mutex_consistent(&reg->lock);
}

static void reg_unlock(void)
{
    pthread_mutex_unlock(&reg->lock);
}

static int pid_gone(int32_t pid)
{
    return pid <= 0 || (kill(pid, 0) < 0 && errno == ESRCH);
}

/* 0 when the process of proc slot p runs, else the errno (ESRCH: gone or a zombie). */
static int probe_proc(uint32_t p)
{
    uint8_t byte;
    struct iovec l = {&byte, 1}, r = {(void *)(uintptr_t)reg->procs[p].alive_addr, 1};
    if (reg->procs[p].pid == getpid())
        return 0;
    return process_vm_readv(reg->procs[p].pid, &l, 1, &r, 1, 0) == 1 ? 0 : errno;
}

static void ring(uint32_t p)
{
    __atomic_add_fetch(&reg->procs[p].doorbell, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &reg->procs[p].doorbell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Attach this process to the registry (created by whoever comes first); 0 or -1 with errno. */
static int reg_attach(void)
{
    char name[NAME_MAX];
    const char *env = getenv("FAKEVERBS_REGISTRY");
    int rc = -1;

    pthread_mutex_lock(&fv_reg_mutex);
    if (reg) {
        pthread_mutex_unlock(&fv_reg_mutex);
        return 0;
    }
    if (env && *env)
        snprintf(name, sizeof(name), "%s%s", env[0] == '/' ? "" : "/", env);
    else
        snprintf(name, sizeof(name), "/loomfake-%u", (unsigned)getuid());
    int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
    if (fd < 0)
        goto out;
    struct stat st;
    /* Growing a fresh segment by several processes at once is harmless: same size, zeros. */
    if (fstat(fd, &st) < 0 ||
        (st.st_size < (off_t)sizeof(*reg) && ftruncate(fd, sizeof(*reg)) < 0)) {
        close(fd);
        goto out;
    }
    struct fv_registry *r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (r == MAP_FAILED)
        goto out;
    uint32_t fresh = 0;
    if (__atomic_compare_exchange_n(&r->ready, &fresh, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        pthread_mutex_init(&r->lock, &a);
        pthread_mutexattr_destroy(&a);
        r->magic = FV_MAGIC;
        r->gen = 1;
        __atomic_store_n(&r->ready, 2, __ATOMIC_SEQ_CST);
    }
    for (int i = 0; i < 5000 && __atomic_load_n(&r->ready, __ATOMIC_SEQ_CST) != 2; i++)
        usleep(1000);
    if (__atomic_load_n(&r->ready, __ATOMIC_SEQ_CST) != 2 || r->magic != FV_MAGIC) {
        fprintf(stderr, "fakeverbs: registry %s is not one of this build's (remove it)\n", name);
        munmap(r, sizeof(*r));
        errno = EPROTO;
        goto out;
    }
    reg = r;
    reg_lock();
    int slot = -1;
    for (int i = 0; i < FV_MAX_PROCS && slot < 0; i++)
        if (pid_gone(reg->procs[i].pid))
            slot = i;
    if (slot >= 0) {
        reg->procs[slot].pid = getpid();
        reg->procs[slot].alive_addr = (uintptr_t)&fv_alive;
        my_proc = (uint32_t)slot;
    }
    reg_unlock();
    if (slot < 0) {
        munmap(reg, sizeof(*reg));
        reg = NULL;
        errno = ENOSPC;
        goto out;
    }
    rc = 0;
out:
    pthread_mutex_unlock(&fv_reg_mutex);
    return rc;
}

static uint32_t next_gen(void)
{
    return reg->gen++;
}

/* The MR of key when it belongs to pid and pd and covers [va, va+len) with the access bits. */
static struct fv_rmr *mr_check(uint32_t key, int32_t pid, uint32_t pd_id, uint64_t va, uint64_t len,
                               uint32_t access)
{
    struct fv_rmr *m = &reg->mrs[key & (FV_MAX_MRS - 1)];
    if (m->key != key || m->pid != pid || m->pd_id != pd_id || (m->access & access) != access)
        return NULL;
    if (va < m->iova || len > m->len || va - m->iova > m->len - len)
        return NULL;
    return m;
}

static void *mr_translate(const struct fv_rmr *m, uint64_t va)
{
    return (void *)(uintptr_t)(m->addr + (va - m->iova));
}

/* ---- pinned pages ------------------------------------------------------------------------
 * An HCA pins the page frames behind an MR when it is registered and moves data to and from
 * those frames until it is deregistered, whatever the process maps at those addresses since
 * (munmap + mmap, as glibc's free and malloc do for large blocks; mremap; MADV_DONTNEED).
 * The double records the frames (/proc/<pid>/pagemap) at registration and compares them at
 * every access: a WR over frames that changed behaves as on an HCA, the bytes go to the old
 * frames (a write: the process never sees them) or come from them (a read: the peer gets
 * fv_stale_bytes, the double having no copy of the old contents). Frame numbers need
 * CAP_SYS_ADMIN (else pagemap shows 0): without it nothing is modelled. Pages are not
 * really pinned, so a frame the kernel moves (compaction, a huge page collapsed by
 * khugepaged under THP "always") would look stale too; and with fork() the parent's
 * copy-on-write moves it as on an HCA without ibv_fork_init. */

#define FV_PFN_MASK ((UINT64_C(1) << 55) - 1)
#define FV_PAGE_PRESENT (UINT64_C(1) << 63)

static uint64_t page_size(void)
{
    long pg = sysconf(_SC_PAGESIZE);
    return pg > 0 ? (uint64_t)pg : 4096;
}

/* The frames of pid's pages first .. first + n - 1 into out; 0, or -1 when unreadable. */
static int read_frames(int32_t pid, uint64_t first, size_t n, uint64_t *out)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t want = n * sizeof(uint64_t);
    ssize_t got = pread(fd, out, want, (off_t)(first * sizeof(uint64_t)));
    close(fd);
    if (got != (ssize_t)want)
        return -1;
    for (size_t i = 0; i < n; i++)
        out[i] = (out[i] & FV_PAGE_PRESENT) ? out[i] & FV_PFN_MASK : 0;
    return 0;
}

/* Fault the pages of [addr, addr + len) in (writable where the MR may be written, as a pin
 * with FOLL_WRITE does) and record their frames; NULL when the frames cannot be known. */
static uint64_t *mr_pin(void *addr, size_t len, unsigned int access)
{
    uint64_t pg = page_size();
    uint64_t first = (uintptr_t)addr / pg, last = ((uintptr_t)addr + len - 1) / pg;
    size_t n = (size_t)(last - first + 1);
    void *start = (void *)(uintptr_t)(first * pg);
#ifdef MADV_POPULATE_WRITE
    int adv = (access & IBV_ACCESS_LOCAL_WRITE) ? MADV_POPULATE_WRITE : MADV_POPULATE_READ;
    if (madvise(start, n * pg, adv) != 0)
        return NULL; /* an old kernel: nothing is modelled */
#else
    (void)access;
    (void)start;
    return NULL;
#endif
    uint64_t *pfns = malloc(n * sizeof(uint64_t));
    if (!pfns || read_frames(getpid(), first, n, pfns) != 0) {
        free(pfns);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        if (!pfns[i]) { /* no CAP_SYS_ADMIN, or a page that is not there */
            free(pfns);
            return NULL;
        }
    return pfns;
}

/* Whether the frames behind [va, va + len) of m are not those pinned. Registry locked. */
static int mr_stale(const struct fv_rmr *m, uint64_t va, uint64_t len)
{
    if (!m->pfn_addr || !len)
        return 0;
    uint64_t pg = page_size();
    uint64_t a = m->addr + (va - m->iova);
    uint64_t base = m->addr / pg, first = a / pg, last = (a + len - 1) / pg;
    uint64_t cur[64], pin[64];
    for (uint64_t p = first; p <= last; p += 64) {
        size_t n = (size_t)(last - p + 1 < 64 ? last - p + 1 : 64);
        struct iovec l = {pin, n * sizeof(uint64_t)};
        struct iovec r = {(void *)(uintptr_t)(m->pfn_addr + (p - base) * sizeof(uint64_t)),
                          n * sizeof(uint64_t)};
        if (read_frames(m->pid, p, n, cur) != 0 ||
            process_vm_readv(m->pid, &l, 1, &r, 1, 0) != (ssize_t)l.iov_len)
            return 0; /* cannot tell (the process is going away): as before */
        for (size_t i = 0; i < n; i++)
            if (cur[i] != pin[i]) {
                if (!__atomic_exchange_n(&fv_stale_warned, 1, __ATOMIC_RELAXED))
                    fprintf(stderr, "fakeverbs: MR %#x of pid %d: the pages at %#llx changed "
                            "since ibv_reg_mr (unmapped and mapped again?): the data moves "
                            "to or from the pinned pages, which the process no longer sees\n",
                            m->key, (int)m->pid, (unsigned long long)((p + i) * pg));
                return 1;
            }
    }
    return 0;
}

/* ---- CQs and completions ----------------------------------------------------------------- */

static void qp_set_err(struct fv_qp *qp);

/* Called with the context locked. */
static void cq_push(struct fv_cq *cq, const struct ibv_wc *wc, struct fv_qp *qp, uint32_t idx,
                    int send)
{
    if (cq->broken)
        return;
    if (cq->count == cq->cap) {
        /* Overrun: as on an HCA the CQ is unusable and the QPs that feed it go to error. */
        cq->broken = 1;
        for (struct fv_qp *q = ((struct fv_ctx *)cq->ibv.context)->qps; q; q = q->next)
            if (q->scq == cq || q->rcq == cq)
                qp_set_err(q);
        return;
    }
    struct fv_cqe *e = &cq->ring[(cq->head + cq->count++) % cq->cap];
    e->wc = *wc;
    e->qp = qp;
    e->idx = idx;
    e->send = send;
}

/* Drop the CQEs of a QP that is destroyed or reset, as a driver cleans its CQ. */
static void cq_clean(struct fv_cq *cq, struct fv_qp *qp)
{
    int kept = 0;
    for (int i = 0; i < cq->count; i++) {
        struct fv_cqe e = cq->ring[(cq->head + i) % cq->cap];
        if (e.wc.qp_num != qp->ibv.qp_num)
            cq->ring[(cq->head + kept++) % cq->cap] = e;
    }
    cq->count = kept;
}

static int fv_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
    struct fv_cq *cq = (struct fv_cq *)ibcq;
    struct fv_ctx *c = (struct fv_ctx *)ibcq->context;
    int got = 0;

    pthread_mutex_lock(&c->lock);
    if (cq->broken) {
        pthread_mutex_unlock(&c->lock);
        errno = EOVERFLOW;
        return -1;
    }
    while (got < n && cq->count > 0) {
        struct fv_cqe *e = &cq->ring[cq->head];
        wc[got++] = e->wc;
        if (e->send)
            e->qp->sq_freed = e->idx + 1;
        else
            e->qp->rq_freed = e->idx + 1;
        cq->head = (cq->head + 1) % cq->cap;
        cq->count--;
    }
    pthread_mutex_unlock(&c->lock);
    return got;
}

/* No completion channel can exist (ibv_create_comp_channel is not provided), so there is
 * nobody to notify: arming is accepted and never fires. */
static int fv_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    return 0;
}

/* ---- QP state ---------------------------------------------------------------------------- */

/* Called with the context locked. The provider thread flushes what is outstanding. */
static void qp_set_err(struct fv_qp *qp)
{
    qp->ibv.state = IBV_QPS_ERR;
    qp->attr.qp_state = IBV_QPS_ERR;
    reg_lock();
    reg->qps[qp->slot].state = IBV_QPS_ERR;
    reg_unlock();
    ring(my_proc);
}

static void send_cqe(struct fv_qp *qp, const struct fv_swqe *w, uint32_t idx, enum ibv_wc_status st,
                     uint32_t vendor_err)
{
    struct ibv_wc wc = {0};
    wc.wr_id = w->wr_id;
    wc.status = st;
    wc.opcode = (w->opcode == IBV_WR_RDMA_WRITE || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
                    ? IBV_WC_RDMA_WRITE
                    : IBV_WC_SEND;
    wc.vendor_err = vendor_err;
    wc.qp_num = qp->ibv.qp_num;
    cq_push(qp->scq, &wc, qp, idx, 1);
}

/* Move finished receives of qp into its CQ; in ERR first flush what no sender holds.
 * Called with the context locked; returns whether anything happened. */
static int qp_reap(struct fv_qp *qp)
{
    struct ibv_wc wcs[64];
    uint32_t idx[64];
    int n = 0, adopt_err = 0;

    reg_lock();
    struct fv_rqp *r = &reg->qps[qp->slot];
    if (r->state == IBV_QPS_ERR && qp->ibv.state != IBV_QPS_ERR)
        adopt_err = 1; /* a responder error set by a sender */
    if (r->state == IBV_QPS_ERR) {
        for (uint32_t i = r->reaped; i != r->posted; i++) {
            struct fv_rwqe *e = &r->rq[i % r->rq_max];
            int unclaimed = i - r->reaped >= r->consumed - r->reaped;
            if (!e->done && (unclaimed || pid_gone(e->taker))) {
                e->status = IBV_WC_WR_FLUSH_ERR;
                e->opcode = IBV_WC_RECV;
                e->byte_len = 0;
                e->wc_flags = 0;
                e->done = 1;
            }
        }
        r->consumed = r->posted;
    }
    while (n < 64 && r->reaped != r->consumed && r->rq[r->reaped % r->rq_max].done) {
        struct fv_rwqe *e = &r->rq[r->reaped % r->rq_max];
        struct ibv_wc *wc = &wcs[n++];
        memset(wc, 0, sizeof(*wc));
        wc->wr_id = e->wr_id;
        wc->status = e->status;
        wc->opcode = e->opcode;
        wc->byte_len = e->byte_len;
        wc->imm_data = e->imm;
        wc->wc_flags = e->wc_flags;
        wc->qp_num = qp->ibv.qp_num;
        wc->src_qp = e->src_qp;
        idx[n - 1] = r->reaped++;
    }
    reg_unlock();
    if (adopt_err) {
        qp->ibv.state = IBV_QPS_ERR;
        qp->attr.qp_state = IBV_QPS_ERR;
    }
    for (int i = 0; i < n; i++)
        cq_push(qp->rcq, &wcs[i], qp, idx[i], 0);
    return n > 0 || adopt_err;
}

/* ---- executing a send WR ----------------------------------------------------------------- */

enum { FV_DONE, FV_WAIT };

struct fv_result {
    enum ibv_wc_status status;
    uint32_t vendor_err;
};

static uint64_t retry_window_ns(const struct fv_qp *qp)
{
    if (fv_retry_ns)
        return fv_retry_ns;
    /* What the QP's transport timer gives: 4.096 us << timeout, retry_cnt + 1 times
     * (timeout 0 means forever on an HCA); bounded so tests stay short. */
    uint64_t ns =
        qp->attr.timeout ? (4096ull << qp->attr.timeout) * (qp->attr.retry_cnt + 1u) : UINT64_MAX;
    if (ns < 100000000ull)
        ns = 100000000ull;
    if (ns > 2000000000ull)
        ns = 2000000000ull;
    return ns;
}

/* Keep the head WR waiting until its deadline, then fail it with status. */
static int wait_or_fail(struct fv_qp *qp, int kind, uint64_t window, enum ibv_wc_status status,
                        struct fv_result *res)
{
    uint64_t now = now_ns();
    if (qp->pend != kind) {
        qp->pend = kind;
        qp->pend_deadline = now + window;
    }
    if (now < qp->pend_deadline)
        return FV_WAIT;
    res->status = status;
    return FV_DONE;
}

/* The registry record of qp's connected peer, when the AV really leads there. */
static struct fv_rqp *resolve_peer(struct fv_qp *qp)
{
    uint32_t dqpn = qp->attr.dest_qp_num;
    struct fv_rqp *t = &reg->qps[dqpn & (FV_MAX_QPS - 1)];
    const struct ibv_ah_attr *ah = &qp->attr.ah_attr;

    if (dqpn == 0 || t->qpn != dqpn || pid_gone(t->pid))
        return NULL;
    if (t->link_layer == IBV_LINK_LAYER_INFINIBAND && ah->dlid != t->lid)
        return NULL;
    if (ah->is_global) {
        int found = 0;
        for (int i = 0; i < t->ngid; i++)
            found |= !memcmp(&t->gid[i], &ah->grh.dgid, sizeof(union ibv_gid));
        if (!found)
            return NULL;
    }
    return t;
}

/* Run the head WR of qp. Called with the context locked; unlocks it around the copy. */
static int exec_wr(struct fv_ctx *c, struct fv_qp *qp, struct fv_swqe *w, struct fv_result *res)
{
    const int is_write = w->opcode == IBV_WR_RDMA_WRITE || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    const int needs_recv = w->opcode != IBV_WR_RDMA_WRITE;
    struct iovec liov[FV_MAX_SGE], riov[FV_MAX_SGE];
    int nl = 0, nr = 0, lstale = 0, rstale = 0, nw = 0;
    struct fv_rmr *wmr[FV_MAX_SGE + 1]; /* the MRs written into, held across the copy */
    uint64_t len = 0;
    int32_t tpid;
    uint32_t tproc, dqpn = qp->attr.dest_qp_num, ridx = 0;
    struct fv_rwqe *e = NULL;

    res->status = IBV_WC_SUCCESS;
    res->vendor_err = 0;
    reg_lock();
    /* The local gather list first: a bad lkey never reaches the wire. */
    if (w->flags & IBV_SEND_INLINE) {
        liov[nl++] = (struct iovec){w->inl, w->inline_len};
        len = w->inline_len;
    } else {
        for (int i = 0; i < w->num_sge; i++) {
            const struct ibv_sge *s = &w->sg[i];
            struct fv_rmr *m = mr_check(s->lkey, getpid(), qp->pd->id, s->addr, s->length, 0);
            if (!m) {
                reg_unlock();
                res->status = IBV_WC_LOC_PROT_ERR;
                return FV_DONE;
            }
            lstale |= mr_stale(m, s->addr, s->length);
            if (m->dmabuf)
                __atomic_add_fetch(&fv_dmabuf_bytes_out, (long long)s->length, __ATOMIC_RELAXED);
            if (s->length)
                liov[nl++] = (struct iovec){mr_translate(m, s->addr), s->length};
            len += s->length;
        }
    }
    struct fv_rqp *t = resolve_peer(qp);
    int probe = t ? probe_proc(t->proc) : ESRCH;
    if (!t || probe == ESRCH || (t->state != IBV_QPS_RTR && t->state != IBV_QPS_RTS)) {
        /* Nobody answers (gone, not connected yet, in error, or the AV leads elsewhere):
         * the requester retries until its transport timer gives up. */
        reg_unlock();
        return wait_or_fail(qp, FV_PEND_UNREACHABLE, retry_window_ns(qp), IBV_WC_RETRY_EXC_ERR,
                            res);
    }
    if (probe) {
        reg_unlock();
        res->status = IBV_WC_GENERAL_ERR; /* e.g. EPERM: process_vm_writev is not allowed here */
        res->vendor_err = (uint32_t)probe;
        return FV_DONE;
    }
    if (needs_recv && t->consumed == t->posted) {
        reg_unlock();
        return wait_or_fail(qp, FV_PEND_RNR, qp->attr.rnr_retry ? fv_rnr_ns : 0,
                            IBV_WC_RNR_RETRY_EXC_ERR, res);
    }
    qp->pend = FV_PEND_NONE;
    tpid = t->pid;
    tproc = t->proc;
    if (is_write) {
        struct fv_rmr *m = NULL;
        /* A zero-length WRITE checks no rkey or address (IB spec C9-88), only the QP. */
        int ok = !w->inject_rae && (t->access & IBV_ACCESS_REMOTE_WRITE);
        if (ok && len)
            ok = (m = mr_check(w->rkey, t->pid, t->pd_id, w->raddr, len,
                               IBV_ACCESS_REMOTE_WRITE)) != NULL;
        if (!ok) {
            /* The responder NAKs, and a remote access violation puts its QP in error too. */
            t->state = IBV_QPS_ERR;
            ring(tproc);
            reg_unlock();
            res->status = IBV_WC_REM_ACCESS_ERR;
            return FV_DONE;
        }
        if (len) {
            rstale |= mr_stale(m, w->raddr, len);
            riov[nr++] = (struct iovec){mr_translate(m, w->raddr), len};
            wmr[nw++] = m;
            if (m->dmabuf)
                __atomic_add_fetch(&fv_dmabuf_bytes_in, (long long)len, __ATOMIC_RELAXED);
        }
    }
    if (needs_recv) {
        ridx = t->consumed++;
        e = &t->rq[ridx % t->rq_max];
        e->taker = getpid();
        uint64_t room = 0;
        int bad = 0;
        if (w->opcode != IBV_WR_RDMA_WRITE_WITH_IMM) {
            for (uint32_t i = 0; i < e->num_sge; i++) {
                const struct ibv_sge *s = &e->sg[i];
                struct fv_rmr *m =
                    mr_check(s->lkey, t->pid, t->pd_id, s->addr, s->length, IBV_ACCESS_LOCAL_WRITE);
                if (!m) {
                    bad = 1;
                    break;
                }
                rstale |= mr_stale(m, s->addr, s->length);
                if (s->length) {
                    riov[nr++] = (struct iovec){mr_translate(m, s->addr), s->length};
                    wmr[nw++] = m;
                }
                room += s->length;
            }
        }
        if (bad || (w->opcode != IBV_WR_RDMA_WRITE_WITH_IMM && len > room)) {
            e->status = bad ? IBV_WC_LOC_PROT_ERR : IBV_WC_LOC_LEN_ERR;
            e->opcode = IBV_WC_RECV;
            e->byte_len = 0;
            e->wc_flags = 0;
            e->done = 1;
            t->state = IBV_QPS_ERR;
            ring(tproc);
            reg_unlock();
            res->status = bad ? IBV_WC_REM_OP_ERR : IBV_WC_REM_INV_REQ_ERR;
            return FV_DONE;
        }
    }
    for (int i = 0; i < nw; i++) {
        wmr[i]->writers++;
        wmr[i]->writer_pid = getpid();
    }
    reg_unlock();

    /* The copy, from the sender's memory as it is now (not as it was at post time). */
    c->busy = qp;
    pthread_mutex_unlock(&c->lock);
    int err = 0;
    size_t li = 0, loff = 0, ri = 0, roff = 0;
    /* Into pinned pages the target no longer maps: nothing it can see changes. */
    while (len && !rstale && li < (size_t)nl && ri < (size_t)nr) {
        struct iovec l = {(char *)liov[li].iov_base + loff, liov[li].iov_len - loff};
        struct iovec r = {(char *)riov[ri].iov_base + roff, riov[ri].iov_len - roff};
        size_t n = l.iov_len < r.iov_len ? l.iov_len : r.iov_len;
        if (lstale) {
            l.iov_base = fv_stale_bytes;
            if (n > sizeof(fv_stale_bytes))
                n = sizeof(fv_stale_bytes);
        }
        l.iov_len = r.iov_len = n;
        ssize_t got = process_vm_writev(tpid, &l, 1, &r, 1, 0);
        if (got <= 0) {
            err = got < 0 ? errno : EFAULT;
            break;
        }
        loff += (size_t)got;
        roff += (size_t)got;
        if (loff == liov[li].iov_len)
            li++, loff = 0;
        if (roff == riov[ri].iov_len)
            ri++, roff = 0;
    }
    if (nw) {
        reg_lock();
        for (int i = 0; i < nw; i++)
            if (wmr[i]->writers)
                wmr[i]->writers--;
        reg_unlock();
    }
    pthread_mutex_lock(&c->lock);
    c->busy = NULL;
    pthread_cond_broadcast(&c->cond);

    if (err == ESRCH) {
        /* Died under us: the consumed receive can never complete. */
        return wait_or_fail(qp, FV_PEND_UNREACHABLE, retry_window_ns(qp), IBV_WC_RETRY_EXC_ERR,
                            res);
    }
    if (err) {
        /* The target range vanished (unmapped under a live MR): what an HCA reports as a
         * protection fault at the responder. */
        res->status = IBV_WC_REM_ACCESS_ERR;
        res->vendor_err = (uint32_t)err;
    }
    if (e) {
        reg_lock();
        if (reg->qps[dqpn & (FV_MAX_QPS - 1)].qpn == dqpn && e->taker == getpid() && !e->done) {
            e->status = err ? IBV_WC_LOC_PROT_ERR : IBV_WC_SUCCESS;
            e->opcode =
                w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
            e->byte_len = (uint32_t)len;
            e->imm = w->imm;
            e->wc_flags = (w->opcode == IBV_WR_SEND) ? 0 : IBV_WC_WITH_IMM;
            e->src_qp = qp->ibv.qp_num;
            __atomic_store_n(&e->done, 1, __ATOMIC_RELEASE);
            if (err)
                t->state = IBV_QPS_ERR;
            ring(tproc);
        }
        reg_unlock();
    }
    return FV_DONE;
}

/* Advance qp: flush when in error, reap receives, run send WRs. Returns whether it worked;
 * lowers *wake_ns to the next deadline a waiting WR has. */
static int qp_progress(struct fv_ctx *c, struct fv_qp *qp, uint64_t *wake_ns)
{
    int worked = 0;

    if (qp->ibv.state == IBV_QPS_RESET)
        return 0;
    worked |= qp_reap(qp);
    if (qp->ibv.state == IBV_QPS_ERR) {
        for (; qp->sq_head != qp->sq_tail; qp->sq_head++, worked = 1)
            send_cqe(qp, &qp->sq[qp->sq_head % qp->cap.max_send_wr], qp->sq_head,
                     IBV_WC_WR_FLUSH_ERR, 0);
        qp->pend = FV_PEND_NONE;
        return worked;
    }
    for (int budget = 16; budget > 0 && qp->ibv.state == IBV_QPS_RTS && qp->sq_head != qp->sq_tail;
         budget--) {
        uint32_t idx = qp->sq_head;
        struct fv_swqe *w = &qp->sq[idx % qp->cap.max_send_wr];
        struct fv_result res;
        if (exec_wr(c, qp, w, &res) == FV_WAIT) {
            if (qp->pend_deadline < *wake_ns)
                *wake_ns = qp->pend_deadline;
            break;
        }
        worked = 1;
        qp->pend = FV_PEND_NONE;
        if (qp->ibv.state == IBV_QPS_RESET || qp->sq_head != idx)
            break; /* reset while we copied: the WR is gone */
        qp->sq_head++;
        if (res.status != IBV_WC_SUCCESS || (w->flags & IBV_SEND_SIGNALED) || qp->sig_all)
            send_cqe(qp, w, idx, res.status, res.vendor_err);
        if (res.status != IBV_WC_SUCCESS) {
            qp_set_err(qp);
            break;
        }
    }
    return worked;
}

static void *ctx_thread(void *arg)
{
    struct fv_ctx *c = arg;
    uint32_t *bell = &reg->procs[my_proc].doorbell;

    pthread_mutex_lock(&c->lock);
    while (!c->stop) {
        uint32_t seen = __atomic_load_n(bell, __ATOMIC_SEQ_CST);
        uint64_t now = now_ns(), wake = now + 100000000ull;
        int worked = 0;
        if (__atomic_load_n(&fv_qperr_fired, __ATOMIC_SEQ_CST) && !c->qperr_done) {
            c->qperr_done = 1;
            for (struct fv_qp *q = c->qps; q; q = q->next)
                if (q->ibv.state != IBV_QPS_RESET)
                    qp_set_err(q);
        }
        for (struct fv_qp *q = c->qps; q; q = q->next)
            worked |= qp_progress(c, q, &wake);
        if (worked || c->stop)
            continue;
        /* Waiting WRs are retried every millisecond: a receive posted by the peer rings
         * only the peer's own doorbell. */
        for (struct fv_qp *q = c->qps; q; q = q->next)
            if (q->pend && now + 1000000ull < wake)
                wake = now + 1000000ull;
        uint64_t ns = wake > now ? wake - now : 0;
        struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
        pthread_mutex_unlock(&c->lock);
        syscall(SYS_futex, bell, FUTEX_WAIT, seen, &ts, NULL, 0);
        pthread_mutex_lock(&c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* The registry and the context's thread come with the first PD, so listing devices and
 * querying ports leaves nothing in /dev/shm. Called with the context locked. */
static int ctx_start(struct fv_ctx *c)
{
    if (c->thread_started)
        return 0;
    if (reg_attach() < 0)
        return errno;
    int rc = pthread_create(&c->thread, NULL, ctx_thread, c);
    if (rc)
        return rc;
    c->thread_started = 1;
    return 0;
}

/* ---- posting ------------------------------------------------------------------------------ */

/* Count a posted WR against FAKEVERBS_FAULT=qperr@N; true when this is the N-th. */
static int count_posted(void)
{
    unsigned long n = __atomic_add_fetch(&fv_posted, 1, __ATOMIC_SEQ_CST);
    return fv_fault_qperr && n == (unsigned long)fv_fault_qperr;
}

static void fire_qperr(struct fv_ctx *c)
{
    __atomic_store_n(&fv_qperr_fired, 1, __ATOMIC_SEQ_CST);
    c->qperr_done = 1;
    for (struct fv_qp *q = c->qps; q; q = q->next)
        if (q->ibv.state != IBV_QPS_RESET)
            qp_set_err(q);
    ring(my_proc); /* the other contexts' threads follow */
}

static int fv_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
    struct fv_qp *qp = (struct fv_qp *)ibqp;
    struct fv_ctx *c = qp->ctx;
    int rc = 0, fire = 0;

    pthread_mutex_lock(&c->lock);
    for (; wr; wr = wr->next) {
        enum ibv_wr_opcode op = wr->opcode;
        if ((qp->ibv.state != IBV_QPS_RTS && qp->ibv.state != IBV_QPS_ERR) ||
            (op != IBV_WR_SEND && op != IBV_WR_SEND_WITH_IMM && op != IBV_WR_RDMA_WRITE &&
             op != IBV_WR_RDMA_WRITE_WITH_IMM) ||
            wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_send_sge) {
            rc = EINVAL;
            break;
        }
        if (qp->sq_tail - qp->sq_freed >= qp->cap.max_send_wr) {
            rc = ENOMEM;
            break;
        }
        struct fv_swqe *w = &qp->sq[qp->sq_tail % qp->cap.max_send_wr];
        uint64_t len = 0;
        for (int i = 0; i < wr->num_sge; i++)
            len += wr->sg_list[i].length;
        if ((wr->send_flags & IBV_SEND_INLINE) && len > qp->cap.max_inline_data) {
            rc = EINVAL;
            break;
        }
        w->wr_id = wr->wr_id;
        w->opcode = op;
        w->flags = wr->send_flags;
        w->imm = wr->imm_data;
        w->raddr = wr->wr.rdma.remote_addr;
        w->rkey = wr->wr.rdma.rkey;
        w->num_sge = wr->num_sge;
        memcpy(w->sg, wr->sg_list, sizeof(struct ibv_sge) * (size_t)wr->num_sge);
        w->inline_len = 0;
        if (wr->send_flags & IBV_SEND_INLINE) {
            /* Inline data is taken now: the caller may reuse the buffer at once. */
            for (int i = 0; i < wr->num_sge; i++) {
                memcpy(w->inl + w->inline_len, (void *)(uintptr_t)wr->sg_list[i].addr,
                       wr->sg_list[i].length);
                w->inline_len += wr->sg_list[i].length;
            }
        }
        w->inject_rae = 0;
        if (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM) {
            unsigned long n = __atomic_add_fetch(&fv_writes, 1, __ATOMIC_SEQ_CST);
            w->inject_rae = fv_fault_rae && n == (unsigned long)fv_fault_rae;
        }
        qp->sq_tail++;
        fire |= count_posted();
    }
    if (rc)
        *bad_wr = wr;
    if (fire)
        fire_qperr(c);
    ring(my_proc);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

static int fv_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
    struct fv_qp *qp = (struct fv_qp *)ibqp;
    struct fv_ctx *c = qp->ctx;
    int rc = 0, fire = 0;

    pthread_mutex_lock(&c->lock);
    reg_lock();
    struct fv_rqp *r = &reg->qps[qp->slot];
    for (; wr; wr = wr->next) {
        if (qp->ibv.state == IBV_QPS_RESET || wr->num_sge < 0 ||
            (uint32_t)wr->num_sge > qp->cap.max_recv_sge) {
            rc = EINVAL;
            break;
        }
        if (r->posted - qp->rq_freed >= qp->cap.max_recv_wr) {
            rc = ENOMEM;
            break;
        }
        struct fv_rwqe *e = &r->rq[r->posted % r->rq_max];
        memset(e, 0, sizeof(*e));
        e->wr_id = wr->wr_id;
        e->num_sge = (uint32_t)wr->num_sge;
        memcpy(e->sg, wr->sg_list, sizeof(struct ibv_sge) * (size_t)wr->num_sge);
        r->posted++;
        fire |= count_posted();
    }
    reg_unlock();
    if (rc)
        *bad_wr = wr;
    if (fire)
        fire_qperr(c);
    ring(my_proc);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/* ---- devices and contexts ----------------------------------------------------------------- */

struct ibv_device **ibv_get_device_list(int *num_devices)
{
    pthread_once(&fv_once, fv_init);
    struct ibv_device **list = calloc((size_t)fv_ndevs + 1, sizeof(*list));
    if (!list) {
        errno = ENOMEM;
        return NULL;
    }
    for (int i = 0; i < fv_ndevs; i++)
        list[i] = &fv_devs[i].ibv;
    if (num_devices)
        *num_devices = fv_ndevs;
    return list;
}

void ibv_free_device_list(struct ibv_device **list)
{
    free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
    return device->name;
}

__be64 ibv_get_device_guid(struct ibv_device *device)
{
    return htobe64(((struct fv_dev *)device)->guid);
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    pthread_once(&fv_once, fv_init);
    if (fv_config_error) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_ctx *c = calloc(1, sizeof(*c));
    if (!c) {
        errno = ENOMEM;
        return NULL;
    }
    c->dev = (struct fv_dev *)device;
    c->ibv.device = device;
    c->ibv.cmd_fd = -1;
    c->ibv.async_fd = -1;
    c->ibv.num_comp_vectors = 1;
    /* abi_compat stays NULL: not an extended context, so every verbs_get_ctx_op() inline
     * sees no op and answers ENOSYS/EOPNOTSUPP. */
    pthread_mutex_init(&c->ibv.mutex, NULL);
    c->ibv.ops.poll_cq = fv_poll_cq;
    c->ibv.ops.req_notify_cq = fv_req_notify_cq;
    c->ibv.ops.post_send = fv_post_send;
    c->ibv.ops.post_recv = fv_post_recv;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    return &c->ibv;
}

int ibv_close_device(struct ibv_context *context)
{
    struct fv_ctx *c = (struct fv_ctx *)context;

    fv_stats(); /* ranks often leave by _exit: no destructor runs */

    pthread_mutex_lock(&c->lock);
    c->stop = 1;
    int started = c->thread_started;
    if (started)
        ring(my_proc);
    pthread_mutex_unlock(&c->lock);
    if (started)
        pthread_join(c->thread, NULL);
    /* As the kernel does when the device fd closes: QPs left over vanish for their peers. */
    if (reg) {
        reg_lock();
        for (struct fv_qp *q = c->qps; q; q = q->next)
            reg->qps[q->slot].qpn = 0;
        reg_unlock();
    }
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->ibv.mutex);
    free(c);
    return 0;
}

int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *a)
{
    struct fv_dev *d = ((struct fv_ctx *)context)->dev;

    memset(a, 0, sizeof(*a));
    snprintf(a->fw_ver, sizeof(a->fw_ver), "fakeverbs-1");
    a->node_guid = htobe64(d->guid);
    a->sys_image_guid = htobe64(d->guid);
    a->max_mr_size = UINT64_MAX;
    a->page_size_cap = 0xfffff000;
    a->max_qp = FV_MAX_QPS;
    a->max_qp_wr = FV_MAX_WR;
    a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
    a->max_sge = FV_MAX_SGE;
    a->max_cq = FV_MAX_QPS;
    a->max_cqe = FV_MAX_CQE;
    a->max_mr = FV_MAX_MRS;
    a->max_pd = FV_MAX_QPS;
    a->max_qp_rd_atom = 16;
    a->max_qp_init_rd_atom = 16;
    a->max_res_rd_atom = 16 * FV_MAX_QPS;
    a->atomic_cap = IBV_ATOMIC_NONE;
    a->max_pkeys = 1;
    a->local_ca_ack_delay = 16;
    a->phys_port_cnt = (uint8_t)d->nports;
    return 0;
}

/* The real signature: what verbs.h's ___ibv_query_port() calls for a non-extended context,
 * after zeroing the whole struct ibv_port_attr. */
int ibv_query_port(struct ibv_context *context, uint8_t port_num,
                   struct _compat_ibv_port_attr *compat)
{
    struct fv_dev *d = ((struct fv_ctx *)context)->dev;
    struct ibv_port_attr *a = (struct ibv_port_attr *)compat;

    if (port_num < 1 || port_num > d->nports)
        return EINVAL;
    const struct fv_port *p = &d->port[port_num - 1];
    memset(a, 0, sizeof(*a));
    a->state = IBV_PORT_ACTIVE;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = IBV_MTU_4096;
    a->gid_tbl_len = p->ngid;
    a->max_msg_sz = 1u << 31;
    a->pkey_tbl_len = 1;
    a->lid = p->lid;
    a->sm_lid = fv_roce ? 0 : 1;
    a->max_vl_num = 1;
    a->subnet_timeout = 18;
    a->active_width = 2;  /* 4X */
    a->active_speed = 32; /* EDR */
    a->phys_state = 5;    /* LinkUp */
    a->link_layer = fv_roce ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
    return 0;
}

int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
    struct fv_dev *d = ((struct fv_ctx *)context)->dev;

    if (port_num < 1 || port_num > d->nports || index < 0 || index >= d->port[port_num - 1].ngid) {
        errno = EINVAL;
        return -1;
    }
    *gid = d->port[port_num - 1].gid[index];
    return 0;
}

int ibv_fork_init(void)
{
    /* Nothing is pinned: process_vm_writev breaks copy-on-write as any write would. */
    return 0;
}

/* ---- PDs and MRs -------------------------------------------------------------------------- */

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
    struct fv_ctx *c = (struct fv_ctx *)context;
    struct fv_pd *pd = calloc(1, sizeof(*pd));
    int rc;

    if (!pd) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&c->lock);
    rc = ctx_start(c);
    pthread_mutex_unlock(&c->lock);
    if (rc) {
        free(pd);
        errno = rc;
        return NULL;
    }
    reg_lock();
    pd->id = next_gen();
    reg_unlock();
    pd->ibv.context = context;
    pd->ibv.handle = pd->id;
    return &pd->ibv;
}

int ibv_dealloc_pd(struct ibv_pd *ibpd)
{
    struct fv_pd *pd = (struct fv_pd *)ibpd;
    struct fv_ctx *c = (struct fv_ctx *)ibpd->context;

    pthread_mutex_lock(&c->lock);
    int refs = pd->refs;
    pthread_mutex_unlock(&c->lock);
    if (refs)
        return EBUSY;
    free(pd);
    return 0;
}

/* The access bits of a registration without the hints; 0 and errno EINVAL when bad. */
static int mr_access_ok(unsigned int *access)
{
    const unsigned int known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                               IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                               IBV_ACCESS_MW_BIND;
    *access &= ~(unsigned int)IBV_ACCESS_OPTIONAL_RANGE; /* hints such as relaxed ordering */
    if ((*access & ~known) || ((*access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
                               !(*access & IBV_ACCESS_LOCAL_WRITE))) {
        errno = EINVAL;
        return 0;
    }
    return 1;
}

/* Enters mr (pfns set, or NULL) in the registry as [iova, iova + length) at addr of this
 * process; mr is freed on failure. */
static struct ibv_mr *mr_enter(struct ibv_pd *ibpd, struct fv_mr *mr, void *addr, size_t length,
                               uint64_t iova, unsigned int access)
{
    struct fv_pd *pd = (struct fv_pd *)ibpd;
    struct fv_ctx *c = (struct fv_ctx *)ibpd->context;
    reg_lock();
    int slot = -1;
    for (int i = 1; i < FV_MAX_MRS && slot < 0; i++)
        if ((!reg->mrs[i].key || pid_gone(reg->mrs[i].pid)) &&
            (!reg->mrs[i].writers || pid_gone(reg->mrs[i].writer_pid)))
            slot = i;
    if (slot >= 0) {
        struct fv_rmr *m = &reg->mrs[slot];
        m->key = ((next_gen() & 0xfffff) << 12) | (uint32_t)slot;
        m->pid = getpid();
        m->pd_id = pd->id;
        m->access = access;
        m->iova = iova;
        m->addr = (uintptr_t)addr;
        m->len = length;
        m->pfn_addr = (uintptr_t)mr->pfns;
        m->writers = 0;
        m->writer_pid = 0;
        m->dmabuf = mr->dmabuf_map != NULL;
        mr->ibv.lkey = mr->ibv.rkey = m->key;
    }
    reg_unlock();
    if (slot < 0) {
        free(mr->pfns);
        free(mr);
        errno = ENOMEM;
        return NULL;
    }
    mr->slot = slot;
    mr->ibv.context = ibpd->context;
    mr->ibv.pd = ibpd;
    mr->ibv.addr = addr;
    mr->ibv.length = length;
    mr->ibv.handle = (uint32_t)slot;
    pthread_mutex_lock(&c->lock);
    pd->refs++;
    pthread_mutex_unlock(&c->lock);
    return &mr->ibv;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *ibpd, void *addr, size_t length, uint64_t iova,
                                unsigned int access)
{
    uint8_t probe[2];
    if (!addr || !length || !mr_access_ok(&access))
        return errno = EINVAL, NULL;
    /* An HCA pins the pages: memory that is not mapped fails to register. */
    struct iovec l = {probe, 2};
    struct iovec r[2] = {{addr, 1}, {(char *)addr + length - 1, 1}};
    if (process_vm_readv(getpid(), &l, 1, r, 2, 0) != 2) {
        errno = EFAULT;
        return NULL;
    }
    struct fv_mr *mr = calloc(1, sizeof(*mr));
    if (!mr) {
        errno = ENOMEM;
        return NULL;
    }
    mr->pfns = mr_pin(addr, length, access);
    return mr_enter(ibpd, mr, addr, length, iova, access);
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

/* Device memory as an HCA reaches it: through the pages of a dma-buf (here the CUDA
 * double's memfd, tests/cuda-double), which the double maps for itself, so its worker
 * moves data to and from them while the process's own view of that memory (the device
 * pointer, iova) stays inaccessible. FAKEVERBS_DMABUF=0: EOPNOTSUPP, as rdma-core or a
 * kernel without dma-buf support answers. */
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova,
                                 int fd, int access)
{
    const char *off = getenv("FAKEVERBS_DMABUF");
    if (off && strcmp(off, "0") == 0)
        return errno = EOPNOTSUPP, NULL;
    unsigned int acc = (unsigned int)access;
    if (!length || fd < 0 || !mr_access_ok(&acc))
        return errno = EINVAL, NULL;
    /* The CUDA double's dma-buf is a descriptor of the allocation's memfd: where the
     * dma-buf begins in it, it says (a process without it: at 0). */
    long long (*begins)(int) =
        (long long (*)(int))(uintptr_t)dlsym(RTLD_DEFAULT, "cuda_double_dmabuf_offset");
    long long base = begins ? begins(fd) : 0;
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return errno = EBADF, NULL;
    if (base < 0)
        return errno = EINVAL, NULL; /* not a dma-buf */
    offset += (uint64_t)base;
    if (offset > (uint64_t)sb.st_size || length > (uint64_t)sb.st_size - offset)
        return errno = EINVAL, NULL; /* past the end of the dma-buf */
    uint64_t pg = page_size(), start = offset / pg * pg;
    size_t lead = (size_t)(offset - start), maplen = (size_t)((lead + length + pg - 1) / pg * pg);
    void *map = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
    if (map == MAP_FAILED)
        return NULL;
    struct fv_mr *mr = calloc(1, sizeof(*mr));
    if (!mr) {
        munmap(map, maplen);
        return errno = ENOMEM, NULL;
    }
    mr->dmabuf_map = map;
    mr->dmabuf_len = maplen;
    __atomic_add_fetch(&fv_dmabuf_regs, 1, __ATOMIC_RELAXED);
    struct ibv_mr *out = mr_enter(pd, mr, (char *)map + lead, length, iova, acc);
    if (!out)
        munmap(map, maplen);
    return out;
}

int ibv_dereg_mr(struct ibv_mr *ibmr)
{
    struct fv_mr *mr = (struct fv_mr *)ibmr;
    struct fv_pd *pd = (struct fv_pd *)ibmr->pd;
    struct fv_ctx *c = (struct fv_ctx *)ibmr->context;

    struct fv_rmr *m = &reg->mrs[mr->slot];
    reg_lock();
    m->key = 0; /* no new access from here on */
    /* Writes in flight finish first (bounded: a writer may have died in its copy). */
    for (uint64_t deadline = now_ns() + UINT64_C(10000000000);
         m->writers && !pid_gone(m->writer_pid) && now_ns() < deadline;) {
        reg_unlock();
        usleep(20);
        reg_lock();
    }
    memset(m, 0, sizeof(*m));
    reg_unlock();
    pthread_mutex_lock(&c->lock);
    pd->refs--;
    pthread_mutex_unlock(&c->lock);
    free(mr->pfns);
    if (mr->dmabuf_map)
        munmap(mr->dmabuf_map, mr->dmabuf_len);
    free(mr);
    return 0;
}

/* ---- CQs ---------------------------------------------------------------------------------- */

struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                             struct ibv_comp_channel *channel, int comp_vector)
{
    if (cqe < 1 || cqe > FV_MAX_CQE || channel || comp_vector < 0 ||
        comp_vector >= context->num_comp_vectors) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_cq *cq = calloc(1, sizeof(*cq));
    if (cq)
        cq->ring = calloc((size_t)cqe, sizeof(*cq->ring));
    if (!cq || !cq->ring) {
        free(cq);
        errno = ENOMEM;
        return NULL;
    }
    cq->cap = cqe;
    cq->ibv.context = context;
    cq->ibv.cq_context = cq_context;
    cq->ibv.cqe = cqe;
    pthread_mutex_init(&cq->ibv.mutex, NULL);
    pthread_cond_init(&cq->ibv.cond, NULL);
    return &cq->ibv;
}

int ibv_destroy_cq(struct ibv_cq *ibcq)
{
    struct fv_cq *cq = (struct fv_cq *)ibcq;
    struct fv_ctx *c = (struct fv_ctx *)ibcq->context;

    pthread_mutex_lock(&c->lock);
    int busy = cq->nqp;
    pthread_mutex_unlock(&c->lock);
    if (busy)
        return EBUSY;
    pthread_mutex_destroy(&cq->ibv.mutex);
    pthread_cond_destroy(&cq->ibv.cond);
    free(cq->ring);
    free(cq);
    return 0;
}

/* ---- QPs ---------------------------------------------------------------------------------- */

struct ibv_qp *ibv_create_qp(struct ibv_pd *ibpd, struct ibv_qp_init_attr *ia)
{
    struct fv_pd *pd = (struct fv_pd *)ibpd;
    struct fv_ctx *c = (struct fv_ctx *)ibpd->context;
    struct ibv_qp_cap *cap = &ia->cap;

    if (ia->qp_type != IBV_QPT_RC) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    if (!ia->send_cq || !ia->recv_cq || ia->send_cq->context != ibpd->context ||
        ia->recv_cq->context != ibpd->context || ia->srq || cap->max_send_wr > FV_MAX_WR ||
        cap->max_recv_wr > FV_MAX_WR || cap->max_send_sge > FV_MAX_SGE ||
        cap->max_recv_sge > FV_MAX_SGE || cap->max_inline_data > FV_MAX_INLINE) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_qp *qp = calloc(1, sizeof(*qp));
    if (qp)
        qp->sq = calloc(cap->max_send_wr ? cap->max_send_wr : 1, sizeof(*qp->sq));
    if (!qp || !qp->sq) {
        if (qp)
            free(qp);
        errno = ENOMEM;
        return NULL;
    }
    /* The caller gets exactly what it asked for, so a too-small request shows. */
    qp->cap = *cap;
    pthread_mutex_lock(&c->lock);
    reg_lock();
    int slot = -1;
    for (int i = 0; i < FV_MAX_QPS && slot < 0; i++)
        if (!reg->qps[i].qpn || pid_gone(reg->qps[i].pid))
            slot = i;
    if (slot >= 0) {
        struct fv_rqp *r = &reg->qps[slot];
        uint32_t gen = next_gen() & 0xffff;
        r->qpn = ((gen ? gen : 1) << 8) | (uint32_t)slot;
        r->pid = getpid();
        r->proc = my_proc;
        r->state = IBV_QPS_RESET;
        r->pd_id = pd->id;
        r->access = 0;
        r->rq_max = cap->max_recv_wr ? cap->max_recv_wr : 1;
        r->posted = r->consumed = r->reaped = 0;
        qp->ibv.qp_num = r->qpn;
    }
    reg_unlock();
    if (slot < 0) {
        pthread_mutex_unlock(&c->lock);
        free(qp->sq);
        free(qp);
        errno = ENOMEM;
        return NULL;
    }
    qp->slot = slot;
    qp->ctx = c;
    qp->pd = pd;
    qp->scq = (struct fv_cq *)ia->send_cq;
    qp->rcq = (struct fv_cq *)ia->recv_cq;
    qp->sig_all = ia->sq_sig_all;
    qp->attr.qp_state = IBV_QPS_RESET;
    qp->attr.cap = qp->cap;
    qp->ibv.context = ibpd->context;
    qp->ibv.qp_context = ia->qp_context;
    qp->ibv.pd = ibpd;
    qp->ibv.send_cq = ia->send_cq;
    qp->ibv.recv_cq = ia->recv_cq;
    qp->ibv.handle = (uint32_t)slot;
    qp->ibv.state = IBV_QPS_RESET;
    qp->ibv.qp_type = IBV_QPT_RC;
    pthread_mutex_init(&qp->ibv.mutex, NULL);
    pthread_cond_init(&qp->ibv.cond, NULL);
    qp->scq->nqp++;
    qp->rcq->nqp++;
    pd->refs++;
    qp->next = c->qps;
    c->qps = qp;
    pthread_mutex_unlock(&c->lock);
    return &qp->ibv;
}

/* The RC rows of the kernel's qp_state_table (ib_modify_qp_is_ok): required and optional
 * attribute bits for each transition; a transition not listed is invalid. */
static int mask_ok(enum ibv_qp_state cur, enum ibv_qp_state next, int mask)
{
    int req = 0, opt = 0;

    if (cur == IBV_QPS_RESET && next == IBV_QPS_ERR)
        return 0;
    if (next == IBV_QPS_RESET || next == IBV_QPS_ERR)
        req = opt = 0;
    else if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT)
        req = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    else if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT)
        opt = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    else if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
        req = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        opt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
    } else if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
        req = IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
              IBV_QP_MAX_QP_RD_ATOMIC;
        opt = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
              IBV_QP_PATH_MIG_STATE;
    } else if (cur == IBV_QPS_RTS && next == IBV_QPS_RTS)
        opt = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
              IBV_QP_MIN_RNR_TIMER;
    else
        return 0;
    return (mask & req) == req && !(mask & ~(req | opt | IBV_QP_STATE));
}

/* The values of the attributes in mask; 0 or EINVAL. */
static int attr_ok(const struct fv_qp *qp, const struct ibv_qp_attr *a, int mask)
{
    const struct fv_dev *d = qp->ctx->dev;
    const unsigned int access_known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

    if ((mask & IBV_QP_PORT) && (a->port_num < 1 || a->port_num > d->nports))
        return EINVAL;
    if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0)
        return EINVAL;
    if ((mask & IBV_QP_ACCESS_FLAGS) && (a->qp_access_flags & ~access_known))
        return EINVAL;
    if ((mask & IBV_QP_PATH_MTU) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096))
        return EINVAL;
    if ((mask & IBV_QP_DEST_QPN) && (a->dest_qp_num == 0 || a->dest_qp_num > 0xffffff))
        return EINVAL;
    if ((mask & (IBV_QP_MAX_DEST_RD_ATOMIC)) && a->max_dest_rd_atomic > 16)
        return EINVAL;
    if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > 16)
        return EINVAL;
    if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31)
        return EINVAL;
    if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7)
        return EINVAL;
    if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7)
        return EINVAL;
    if ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31)
        return EINVAL;
    if (mask & IBV_QP_AV) {
        /* RoCE has no LIDs: the kernel refuses an address vector without a GRH. */
        if (fv_roce && !a->ah_attr.is_global)
            return EINVAL;
        if (!fv_roce && !a->ah_attr.dlid)
            return EINVAL;
        if (a->ah_attr.is_global) {
            int port = (mask & IBV_QP_PORT) ? a->port_num : qp->attr.port_num;
            if (port < 1 || port > d->nports || a->ah_attr.grh.sgid_index >= d->port[port - 1].ngid)
                return EINVAL;
        }
    }
    return 0;
}

static void qp_reset_queues(struct fv_qp *qp)
{
    qp->sq_head = qp->sq_tail = qp->sq_freed = qp->rq_freed = 0;
    qp->pend = FV_PEND_NONE;
    cq_clean(qp->scq, qp);
    if (qp->rcq != qp->scq)
        cq_clean(qp->rcq, qp);
}

int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask)
{
    struct fv_qp *qp = (struct fv_qp *)ibqp;
    struct fv_ctx *c = qp->ctx;
    int rc = 0;

    pthread_mutex_lock(&c->lock);
    /* A responder error that a peer put in the registry comes first, even when this
     * process's thread has not taken it up yet. */
    reg_lock();
    if (reg->qps[qp->slot].state == IBV_QPS_ERR && qp->ibv.state != IBV_QPS_RESET)
        qp->ibv.state = qp->attr.qp_state = IBV_QPS_ERR;
    reg_unlock();
    enum ibv_qp_state cur = qp->ibv.state;
    enum ibv_qp_state next = (mask & IBV_QP_STATE) ? a->qp_state : cur;
    if (((mask & IBV_QP_CUR_STATE) && a->cur_qp_state != cur) || !mask_ok(cur, next, mask) ||
        attr_ok(qp, a, mask)) {
        rc = EINVAL;
        goto out;
    }
    while (c->busy == qp)
        pthread_cond_wait(&c->cond, &c->lock);
    struct ibv_qp_attr *s = &qp->attr;
    if (mask & IBV_QP_PKEY_INDEX)
        s->pkey_index = a->pkey_index;
    if (mask & IBV_QP_PORT)
        s->port_num = a->port_num;
    if (mask & IBV_QP_ACCESS_FLAGS)
        s->qp_access_flags = a->qp_access_flags;
    if (mask & IBV_QP_AV)
        s->ah_attr = a->ah_attr;
    if (mask & IBV_QP_ALT_PATH)
        s->alt_ah_attr = a->alt_ah_attr;
    if (mask & IBV_QP_PATH_MTU)
        s->path_mtu = a->path_mtu;
    if (mask & IBV_QP_DEST_QPN)
        s->dest_qp_num = a->dest_qp_num;
    if (mask & IBV_QP_RQ_PSN)
        s->rq_psn = a->rq_psn;
    if (mask & IBV_QP_SQ_PSN)
        s->sq_psn = a->sq_psn;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
        s->max_dest_rd_atomic = a->max_dest_rd_atomic;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
        s->max_rd_atomic = a->max_rd_atomic;
    if (mask & IBV_QP_MIN_RNR_TIMER)
        s->min_rnr_timer = a->min_rnr_timer;
    if (mask & IBV_QP_TIMEOUT)
        s->timeout = a->timeout;
    if (mask & IBV_QP_RETRY_CNT)
        s->retry_cnt = a->retry_cnt;
    if (mask & IBV_QP_RNR_RETRY)
        s->rnr_retry = a->rnr_retry;
    if (mask & IBV_QP_PATH_MIG_STATE)
        s->path_mig_state = a->path_mig_state;
    s->qp_state = next;
    qp->ibv.state = next;
    if (next == IBV_QPS_RESET)
        qp_reset_queues(qp);

    reg_lock();
    struct fv_rqp *r = &reg->qps[qp->slot];
    if (r->state == IBV_QPS_ERR && next != IBV_QPS_RESET)
        qp->ibv.state = s->qp_state = IBV_QPS_ERR; /* failed just after this transition */
    else
        r->state = next;
    r->access = s->qp_access_flags;
    if (next == IBV_QPS_RESET)
        r->posted = r->consumed = r->reaped = 0;
    if (mask & IBV_QP_PORT) {
        const struct fv_port *p = &c->dev->port[s->port_num - 1];
        r->lid = p->lid;
        r->link_layer = fv_roce ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
        r->ngid = (uint8_t)p->ngid;
        memcpy(r->gid, p->gid, sizeof(r->gid));
    }
    reg_unlock();
    ring(my_proc);
out:
    pthread_mutex_unlock(&c->lock);
    if (rc)
        errno = rc;
    return rc;
}

int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *ia)
{
    struct fv_qp *qp = (struct fv_qp *)ibqp;

    pthread_mutex_lock(&qp->ctx->lock);
    *a = qp->attr;
    a->qp_state = a->cur_qp_state = qp->ibv.state;
    a->cap = qp->cap;
    memset(ia, 0, sizeof(*ia));
    ia->qp_context = ibqp->qp_context;
    ia->send_cq = ibqp->send_cq;
    ia->recv_cq = ibqp->recv_cq;
    ia->cap = qp->cap;
    ia->qp_type = IBV_QPT_RC;
    ia->sq_sig_all = qp->sig_all;
    pthread_mutex_unlock(&qp->ctx->lock);
    return 0;
}

int ibv_destroy_qp(struct ibv_qp *ibqp)
{
    struct fv_qp *qp = (struct fv_qp *)ibqp;
    struct fv_ctx *c = qp->ctx;

    pthread_mutex_lock(&c->lock);
    while (c->busy == qp)
        pthread_cond_wait(&c->cond, &c->lock);
    for (struct fv_qp **pp = &c->qps; *pp; pp = &(*pp)->next)
        if (*pp == qp) {
            *pp = qp->next;
            break;
        }
    qp_reset_queues(qp);
    qp->scq->nqp--;
    qp->rcq->nqp--;
    qp->pd->refs--;
    reg_lock();
    reg->qps[qp->slot].qpn = 0;
    reg->qps[qp->slot].state = IBV_QPS_RESET;
    reg_unlock();
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_destroy(&qp->ibv.mutex);
    pthread_cond_destroy(&qp->ibv.cond);
    free(qp->sq);
    free(qp);
    return 0;
}

/* ---- strings ------------------------------------------------------------------------------ */

const char *ibv_wc_status_str(enum ibv_wc_status status)
{
    static const char *const str[] = {
        [IBV_WC_SUCCESS] = "success",
        [IBV_WC_LOC_LEN_ERR] = "local length error",
        [IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
        [IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
        [IBV_WC_LOC_PROT_ERR] = "local protection error",
        [IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
        [IBV_WC_MW_BIND_ERR] = "memory management operation error",
        [IBV_WC_BAD_RESP_ERR] = "bad response error",
        [IBV_WC_LOC_ACCESS_ERR] = "local access error",
        [IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
        [IBV_WC_REM_ACCESS_ERR] = "remote access error",
        [IBV_WC_REM_OP_ERR] = "remote operation error",
        [IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
        [IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
        [IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
        [IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
        [IBV_WC_REM_ABORT_ERR] = "aborted error",
        [IBV_WC_INV_EECN_ERR] = "invalid EE context number",
        [IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
        [IBV_WC_FATAL_ERR] = "fatal error",
        [IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
        [IBV_WC_GENERAL_ERR] = "general error",
        [IBV_WC_TM_ERR] = "TM error",
        [IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
    };
    if ((unsigned)status < sizeof(str) / sizeof(str[0]) && str[status])
        return str[status];
    return "unknown";
}

const char *ibv_port_state_str(enum ibv_port_state state)
{
    static const char *const str[] = {"no state change (NOP)", "down", "init", "armed", "active",
                                      "active defer"};
    return (unsigned)state < sizeof(str) / sizeof(str[0]) ? str[state] : "invalid state";
}
