/* cuda_double.c - a CUDA runtime and driver that fail where a GPU would, for
 * the tests of Loom's GPU path on machines without one (README.md here).
 *
 * Device memory is a memfd mapped twice: the address handed out is a PROT_NONE
 * mapping, so any host access through it faults as it would on hardware (or
 * reads garbage, which is worse), and the double's copies, memsets and kernels
 * work through a second, writable mapping of the same pages. Each stream has a
 * worker thread that runs its operations in order; events, stream waits, host
 * functions and the legacy default stream's implicit ordering are kept, so a
 * missing dependency shows as a wrong or racy result rather than passing by
 * luck. CUDA state does not survive fork, and a faulting kernel leaves every
 * later call failing, as on hardware.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cuda_double.h"

/* ---- process state ------------------------------------------------------------ */

/* One lock for everything: the double is about ordering, not speed, and the
 * copies themselves run outside it. Each stream has a condition of its own
 * (work queued on it, work finished), so a step wakes only who waits on it. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static pid_t owner;                      /* the process that started "CUDA" */
static cudaError_t sticky = cudaSuccess; /* a kernel faulted: the context is lost */
static __thread int current_device;
static __thread cudaError_t last_error;
static __thread int in_host_fn;          /* host functions may not call CUDA */
static cuda_double_counts_t counts;

/* Lazy mode (cuda_double_set_lazy): queued work waits until the host waits.
 * Every op has a number in the order it was queued; a worker runs only ops
 * up to released, which each host-side wait or query raises to the last one
 * queued. */
static int lazy;
static unsigned long long issued, released;

static int device_count(void)
{
    const char *s = getenv("LOOM_CUDA_DOUBLE_DEVICES");
    return s && *s ? atoi(s) : 1;
}

/* The status of a call: remembered for cudaGetLastError. */
static cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

/* What every call checks first. */
static cudaError_t enter(void)
{
    if (in_host_fn)
        return cudaErrorNotPermitted;
    pid_t me = getpid();
    pthread_mutex_lock(&lock);
    if (!owner) {
        owner = me;
        /* Lazy from the start, for a program that cannot call cuda_double_set_lazy. */
        const char *l = getenv("LOOM_CUDA_DOUBLE_LAZY");
        lazy = l && atoi(l) > 0;
    }
    int forked = owner != me;
    cudaError_t e = forked ? cudaErrorInitializationError : sticky;
    pthread_mutex_unlock(&lock);
    if (forked)
        fprintf(stderr, "cuda double: CUDA used in a child of the process that started it "
                        "(a CUDA context does not survive fork)\n");
    return e;
}

#define ENTER()                              \
    do {                                     \
        cudaError_t enter_ = enter();        \
        if (enter_ != cudaSuccess)           \
            return ret(enter_);              \
    } while (0)

/* ---- memory ---------------------------------------------------------------- */

typedef struct region {
    struct region *next;
    char *addr;    /* what the program sees: PROT_NONE for device memory */
    char *shadow;  /* the double's writable view (device memory only) */
    size_t len, mapped;
    int device, pinned, fd;
    int opened;           /* mapped from another process by cudaIpcOpenMemHandle */
    unsigned long long nonce;   /* in the memfd's name: a handle names this one */
    unsigned long long buffer_id;   /* CU_POINTER_ATTRIBUTE_BUFFER_ID: new per allocation */
} region_t;

static region_t *regions;
static unsigned long long buffer_ids;

/* The region holding [p, p + len), or NULL; *partial: p is in a region that
 * ends before p + len. Under lock. */
static region_t *region_of(const void *p, size_t len, int *partial)
{
    const char *c = p;
    if (partial)
        *partial = 0;
    for (region_t *r = regions; r; r = r->next)
        if (c >= r->addr && c < r->addr + (r->len ? r->len : 1)) {
            if ((size_t)(c - r->addr) + len > r->len) {
                if (partial)
                    *partial = 1;
                return NULL;
            }
            return r;
        }
    return NULL;
}

void *cuda_double_reach(const void *p, size_t len)
{
    pthread_mutex_lock(&lock);
    region_t *r = region_of(p, len, NULL);
    void *out = !r ? NULL : r->pinned ? (void *)p : r->shadow + ((const char *)p - r->addr);
    pthread_mutex_unlock(&lock);
    return out;
}

static size_t page_round(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

static cudaError_t device_alloc(void **out, size_t size, void *at)
{
    if (!out)
        return cudaErrorInvalidValue;
    if (size == 0) {
        *out = NULL;
        return cudaSuccess;
    }
    region_t *r = calloc(1, sizeof(*r));
    if (!r)
        return cudaErrorMemoryAllocation;
    r->len = size;
    r->mapped = page_round(size);
    r->device = current_device;
    /* The nonce goes into the memfd's name, so a process opening an IPC handle
     * through /proc/<pid>/fd/<fd> can tell the allocation from a later one
     * that reused the descriptor number. */
    static unsigned long long serial;
    pthread_mutex_lock(&lock);
    r->nonce = ((unsigned long long)getpid() << 32) ^ ++serial ^
               ((unsigned long long)(uintptr_t)r << 7);
    pthread_mutex_unlock(&lock);
    char name[64];
    snprintf(name, sizeof(name), "loom-cuda-double-%016llx", r->nonce);
    r->fd = memfd_create(name, MFD_CLOEXEC);
    if (r->fd < 0 || ftruncate(r->fd, (off_t)r->mapped) != 0)
        goto fail_fd;
    r->addr = mmap(at, r->mapped, PROT_NONE, MAP_SHARED | (at ? MAP_FIXED_NOREPLACE : 0), r->fd, 0);
    if (r->addr == MAP_FAILED)
        goto fail_fd;
    if (at && r->addr != at)   /* a kernel older than MAP_FIXED_NOREPLACE took it as a hint */
        goto fail_addr;
    r->shadow = mmap(NULL, r->mapped, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    if (r->shadow == MAP_FAILED)
        goto fail_addr;
    /* Fresh device memory is not zeroed on hardware: make that visible. */
    memset(r->shadow, 0xd7, r->mapped);
    pthread_mutex_lock(&lock);
    r->buffer_id = ++buffer_ids;
    counts.allocs++;
    r->next = regions;
    regions = r;
    pthread_mutex_unlock(&lock);
    *out = r->addr;
    return cudaSuccess;
fail_addr:
    munmap(r->addr, r->mapped);
fail_fd:
    if (r->fd >= 0)
        close(r->fd);
    free(r);
    return cudaErrorMemoryAllocation;
}

static cudaError_t host_alloc(void **out, size_t size)
{
    if (!out)
        return cudaErrorInvalidValue;
    region_t *r = calloc(1, sizeof(*r));
    if (!r)
        return cudaErrorMemoryAllocation;
    r->len = size;
    r->mapped = page_round(size ? size : 1);
    r->pinned = 1;
    r->fd = -1;
    r->device = -1;
    r->addr = mmap(NULL, r->mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r->addr == MAP_FAILED) {
        free(r);
        return cudaErrorMemoryAllocation;
    }
    pthread_mutex_lock(&lock);
    r->next = regions;
    regions = r;
    pthread_mutex_unlock(&lock);
    *out = r->addr;
    return cudaSuccess;
}

static void wait_device_idle(int device);

static cudaError_t region_free(void *p, int pinned)
{
    if (!p)
        return cudaSuccess;
    /* cudaFree and cudaFreeHost wait for the device, as on hardware. */
    wait_device_idle(pinned ? -1 : current_device);
    pthread_mutex_lock(&lock);
    region_t **pp = &regions;
    while (*pp && ((*pp)->addr != p || (*pp)->pinned != pinned || (*pp)->opened))
        pp = &(*pp)->next;
    region_t *r = *pp;
    if (r)
        *pp = r->next;
    pthread_mutex_unlock(&lock);
    if (!r)
        return cudaErrorInvalidValue;
    if (!pinned) {
        pthread_mutex_lock(&lock);
        counts.frees++;
        pthread_mutex_unlock(&lock);
    }
    munmap(r->addr, r->mapped);
    if (r->shadow)
        munmap(r->shadow, r->mapped);
    if (r->fd >= 0)
        close(r->fd);
    free(r);
    return cudaSuccess;
}

/* ---- streams and events ----------------------------------------------------- */

typedef enum { OP_COPY, OP_MEMSET, OP_FN, OP_WAIT, OP_RECORD } op_kind_t;

struct CUevent_st {
    struct CUstream_st *stream;        /* of the latest record; NULL: never recorded */
    unsigned long long ticket;         /* that record's place in stream */
    unsigned int flags;
    int refs;                          /* the program's, and one per pending record */
    struct timespec at;
};

typedef struct op {
    struct op *next;
    op_kind_t kind;
    unsigned long long ticket;
    unsigned long long issued;         /* its place among all ops (lazy mode) */
    union {
        struct { char *dst; const char *src; size_t dpitch, spitch, width, height; int bus; } copy;
        struct { char *dst; int value; size_t bytes; } set;
        struct { void (*fn)(void *); void *arg; int kernel; } fn;
        struct { struct CUstream_st *stream; unsigned long long ticket; } wait;
        struct { struct CUevent_st *event; } record;
    } u;
} op_t;

struct CUstream_st {
    struct CUstream_st *next_all;
    int device, nonblocking, legacy, destroyed;
    op_t *head, *tail;
    unsigned long long queued, done;   /* tickets: queued ones, the last one finished */
    pthread_cond_t moved;              /* queued or done changed */
    pthread_t worker;
};

/* Every stream ever made: a destroyed stream drains, and what waits on it may
 * still read its counters, so none is freed. */
static struct CUstream_st *streams;

static void *stream_worker(void *arg);

/* Under lock. */
static cudaError_t stream_new(int device, int nonblocking, int legacy, struct CUstream_st **out)
{
    struct CUstream_st *s = calloc(1, sizeof(*s));
    if (!s)
        return cudaErrorMemoryAllocation;
    s->device = device;
    s->nonblocking = nonblocking;
    s->legacy = legacy;
    pthread_cond_init(&s->moved, NULL);
    if (pthread_create(&s->worker, NULL, stream_worker, s) != 0) {
        pthread_cond_destroy(&s->moved);
        free(s);
        return cudaErrorMemoryAllocation;
    }
    pthread_detach(s->worker);
    s->next_all = streams;
    streams = s;
    *out = s;
    return cudaSuccess;
}

/* The stream a handle names, for the calling thread's device. Under lock. */
static cudaError_t stream_of(cudaStream_t handle, struct CUstream_st **out)
{
    if (handle == NULL || handle == cudaStreamLegacy || handle == cudaStreamPerThread) {
        for (struct CUstream_st *s = streams; s; s = s->next_all)
            if (s->legacy && s->device == current_device) {
                *out = s;
                return cudaSuccess;
            }
        return stream_new(current_device, 0, 1, out);
    }
    for (struct CUstream_st *s = streams; s; s = s->next_all)
        if (s == handle && !s->destroyed) {
            *out = s;
            return cudaSuccess;
        }
    return cudaErrorInvalidResourceHandle;
}

static void push(struct CUstream_st *s, op_t *op)
{
    op->ticket = ++s->queued;
    op->issued = ++issued;
    op->next = NULL;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
}

static int push_wait(struct CUstream_st *s, struct CUstream_st *on, unsigned long long ticket)
{
    op_t *w = calloc(1, sizeof(*w));
    if (!w)
        return -1;
    w->kind = OP_WAIT;
    w->u.wait.stream = on;
    w->u.wait.ticket = ticket;
    push(s, w);
    return 0;
}

/* Queue op on s after what the legacy default stream orders it behind: the
 * legacy stream waits for every blocking stream of its device, and a blocking
 * stream for the legacy one. Under lock; returns the op's ticket, 0 when out
 * of memory (op freed). */
static unsigned long long enqueue(struct CUstream_st *s, op_t *op)
{
    int bad = 0;
    for (struct CUstream_st *t = streams; t; t = t->next_all) {
        if (t == s || t->device != s->device || t->nonblocking || t->done == t->queued)
            continue;
        if ((s->legacy && !t->legacy) || (!s->legacy && !s->nonblocking && t->legacy))
            bad |= push_wait(s, t, t->queued);
    }
    if (bad) {
        free(op);
        return 0;
    }
    push(s, op);
    pthread_cond_broadcast(&s->moved);
    return op->ticket;
}

/* LOOM_CUDA_DOUBLE_GBPS: bytes per nanosecond a copy between host and device
 * memory moves at most (0, the default: as fast as memmove), so a benchmark
 * sees copies that take time in proportion to their size, as over PCIe. */
static double bus_gbps(void)
{
    static double gbps = -1;
    if (gbps < 0) {
        const char *v = getenv("LOOM_CUDA_DOUBLE_GBPS");
        gbps = v && *v ? atof(v) : 0;
    }
    return gbps;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Sleep out what is left of the time bytes take over the bus since start. */
static void bus_time(double start, size_t bytes)
{
    double left = start + (double)bytes / (bus_gbps() * 1e9) - now_s();
    if (left <= 0)
        return;
    struct timespec t = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
    while (nanosleep(&t, &t) != 0)
        ;
}

static void run_op(op_t *op)
{
    switch (op->kind) {
    case OP_COPY: {
        double start = op->u.copy.bus && bus_gbps() > 0 ? now_s() : 0;
        for (size_t r = 0; r < op->u.copy.height; r++)
            memmove(op->u.copy.dst + r * op->u.copy.dpitch, op->u.copy.src + r * op->u.copy.spitch,
                    op->u.copy.width);
        if (start > 0)
            bus_time(start, op->u.copy.width * op->u.copy.height);
        break;
    }
    case OP_MEMSET:
        memset(op->u.set.dst, op->u.set.value, op->u.set.bytes);
        break;
    case OP_FN:
        in_host_fn = !op->u.fn.kernel;
        op->u.fn.fn(op->u.fn.arg);
        in_host_fn = 0;
        break;
    default:
        break;
    }
}

static void event_unref(struct CUevent_st *ev)
{
    if (--ev->refs == 0)
        free(ev);
}

/* Lazy mode holds op until the host waits for something. Under lock. */
static int held(const op_t *op)
{
    return lazy && op->issued > released;
}

/* The host waits or asks: everything queued so far may run. Under lock. */
static void release(void)
{
    if (released == issued)
        return;
    released = issued;
    for (struct CUstream_st *s = streams; s; s = s->next_all)
        pthread_cond_broadcast(&s->moved);
}

void cuda_double_set_lazy(int on)
{
    pthread_mutex_lock(&lock);
    release();
    lazy = on;
    pthread_mutex_unlock(&lock);
}

static void *stream_worker(void *arg)
{
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&lock);
    for (;;) {
        /* A destroyed stream drains: nobody may be left to release its work. */
        while (s->head ? held(s->head) && !s->destroyed : !s->destroyed)
            pthread_cond_wait(&s->moved, &lock);
        op_t *op = s->head;
        if (!op)
            break;
        if (op->kind == OP_WAIT) {
            while (op->u.wait.stream->done < op->u.wait.ticket)
                pthread_cond_wait(&op->u.wait.stream->moved, &lock);
        } else if (op->kind == OP_RECORD) {
            struct CUevent_st *ev = op->u.record.event;
            if (ev->stream == s && ev->ticket == op->ticket)
                clock_gettime(CLOCK_MONOTONIC, &ev->at);
            event_unref(ev);
        } else if (sticky == cudaSuccess) {
            /* After a fault nothing runs: the context is gone. */
            pthread_mutex_unlock(&lock);
            run_op(op);
            pthread_mutex_lock(&lock);
        }
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        s->done = op->ticket;
        if (op->kind == OP_FN)
            free(op->u.fn.arg);
        free(op);
        pthread_cond_broadcast(&s->moved);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* The host waits until s has finished ticket. Under lock. */
static void wait_ticket(struct CUstream_st *s, unsigned long long ticket)
{
    if (s->done < ticket)
        release();
    while (s->done < ticket)
        pthread_cond_wait(&s->moved, &lock);
}

/* device < 0: every device. */
static void wait_device_idle(int device)
{
    pthread_mutex_lock(&lock);
    for (struct CUstream_st *s = streams; s; s = s->next_all)
        if (device < 0 || s->device == device)
            wait_ticket(s, s->queued);
    pthread_mutex_unlock(&lock);
}

/* Queue op on the stream handle names; blocking: wait for it too. */
static cudaError_t submit(cudaStream_t handle, op_t *op, int blocking)
{
    pthread_mutex_lock(&lock);
    struct CUstream_st *s;
    cudaError_t e = stream_of(handle, &s);
    unsigned long long ticket = 0;
    if (e != cudaSuccess)
        free(op);
    else if ((ticket = enqueue(s, op)) == 0)
        e = cudaErrorMemoryAllocation;
    else if (blocking)
        wait_ticket(s, ticket);
    if (e == cudaSuccess && blocking && sticky != cudaSuccess)
        e = sticky;
    pthread_mutex_unlock(&lock);
    return e;
}

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags)
{
    ENTER();
    if (!out || (flags & ~(unsigned)cudaStreamNonBlocking))
        return ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&lock);
    struct CUstream_st *s = NULL;
    cudaError_t e = stream_new(current_device, (flags & cudaStreamNonBlocking) != 0, 0, &s);
    pthread_mutex_unlock(&lock);
    if (e == cudaSuccess)
        *out = s;
    return ret(e);
}

cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t *out)
{
    return cudaStreamCreateWithFlags(out, cudaStreamDefault);
}

/* One priority: the double's workers are all alike. */
cudaError_t CUDARTAPI cudaStreamCreateWithPriority(cudaStream_t *out, unsigned int flags, int priority)
{
    (void)priority;
    return cudaStreamCreateWithFlags(out, flags);
}

cudaError_t CUDARTAPI cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    ENTER();
    if (least)
        *least = 0;
    if (greatest)
        *greatest = 0;
    return cudaSuccess;
}

/* For the questions about a stream that have one answer in the double:
 * whether handle names a stream and there is somewhere to put the answer. */
static cudaError_t stream_question(cudaStream_t handle, const void *answer)
{
    if (!answer)
        return ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&lock);
    struct CUstream_st *s;
    cudaError_t e = stream_of(handle, &s);
    pthread_mutex_unlock(&lock);
    return ret(e);
}

cudaError_t CUDARTAPI cudaStreamGetPriority(cudaStream_t handle, int *priority)
{
    ENTER();
    cudaError_t e = stream_question(handle, priority);
    if (e == cudaSuccess)
        *priority = 0;
    return e;
}

/* Nothing is ever captured: the double has no graphs. */
cudaError_t CUDARTAPI cudaStreamIsCapturing(cudaStream_t handle, enum cudaStreamCaptureStatus *status)
{
    ENTER();
    cudaError_t e = stream_question(handle, status);
    if (e == cudaSuccess)
        *status = cudaStreamCaptureStatusNone;
    return e;
}

cudaError_t CUDARTAPI cudaStreamGetCaptureInfo(cudaStream_t handle,
                                               enum cudaStreamCaptureStatus *status,
                                               unsigned long long *id, cudaGraph_t *graph,
                                               const cudaGraphNode_t **deps,
                                               const cudaGraphEdgeData **edges, size_t *ndeps)
{
    cudaError_t e = cudaStreamIsCapturing(handle, status);
    if (e != cudaSuccess)
        return e;
    if (id)
        *id = 0;
    if (graph)
        *graph = NULL;
    if (deps)
        *deps = NULL;
    if (edges)
        *edges = NULL;
    if (ndeps)
        *ndeps = 0;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t handle)
{
    ENTER();
    if (handle == NULL || handle == cudaStreamLegacy || handle == cudaStreamPerThread)
        return ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&lock);
    struct CUstream_st *s;
    cudaError_t e = stream_of(handle, &s);
    if (e == cudaSuccess) {
        /* Queued work still runs, as on hardware; the worker exits after it. */
        s->destroyed = 1;
        pthread_cond_broadcast(&s->moved);
    }
    pthread_mutex_unlock(&lock);
    return ret(e);
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t handle)
{
    ENTER();
    pthread_mutex_lock(&lock);
    struct CUstream_st *s;
    cudaError_t e = stream_of(handle, &s);
    if (e == cudaSuccess) {
        wait_ticket(s, s->queued);
        e = sticky;
    }
    pthread_mutex_unlock(&lock);
    return ret(e);
}

cudaError_t CUDARTAPI cudaStreamQuery(cudaStream_t handle)
{
    ENTER();
    pthread_mutex_lock(&lock);
    struct CUstream_st *s;
    cudaError_t e = stream_of(handle, &s);
    if (e == cudaSuccess && s->done < s->queued) {
        release();   /* a host polling a lazy stream would wait forever */
        e = cudaErrorNotReady;
    }
    pthread_mutex_unlock(&lock);
    return e == cudaErrorNotReady ? e : ret(e);
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void)
{
    ENTER();
    wait_device_idle(current_device);
    return ret(sticky);
}

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags)
{
    ENTER();
    if (!out)
        return ret(cudaErrorInvalidValue);
    struct CUevent_st *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return ret(cudaErrorMemoryAllocation);
    ev->flags = flags;
    ev->refs = 1;
    *out = ev;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t *out)
{
    return cudaEventCreateWithFlags(out, cudaEventDefault);
}

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t ev)
{
    ENTER();
    if (!ev)
        return ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&lock);
    event_unref(ev);   /* a pending record keeps it until it runs */
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t ev, cudaStream_t handle)
{
    ENTER();
    if (!ev)
        return ret(cudaErrorInvalidResourceHandle);
    op_t *op = calloc(1, sizeof(*op));
    if (!op)
        return ret(cudaErrorMemoryAllocation);
    op->kind = OP_RECORD;
    op->u.record.event = ev;
    pthread_mutex_lock(&lock);
    struct CUstream_st *s;
    cudaError_t e = stream_of(handle, &s);
    unsigned long long ticket = 0;
    if (e != cudaSuccess)
        free(op);
    else if ((ticket = enqueue(s, op)) == 0)
        e = cudaErrorMemoryAllocation;
    else {
        ev->stream = s;
        ev->ticket = ticket;
        ev->refs++;
    }
    pthread_mutex_unlock(&lock);
    return ret(e);
}

/* cudaEventRecordExternal belongs to graph capture, which the double has not. */
cudaError_t CUDARTAPI cudaEventRecordWithFlags(cudaEvent_t ev, cudaStream_t handle, unsigned int flags)
{
    return flags == 0 ? cudaEventRecord(ev, handle) : ret(cudaErrorNotSupported);
}

static int event_done(struct CUevent_st *ev)
{
    return !ev->stream || ev->stream->done >= ev->ticket;
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t ev)
{
    ENTER();
    if (!ev)
        return ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&lock);
    int done = event_done(ev);
    if (!done)
        release();
    pthread_mutex_unlock(&lock);
    return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t ev)
{
    ENTER();
    if (!ev)
        return ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&lock);
    if (ev->stream)
        wait_ticket(ev->stream, ev->ticket);
    cudaError_t e = sticky;
    pthread_mutex_unlock(&lock);
    return ret(e);
}

cudaError_t CUDARTAPI cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    ENTER();
    if (!ms || !start || !end)
        return ret(cudaErrorInvalidValue);
    if ((start->flags | end->flags) & cudaEventDisableTiming)
        return ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&lock);
    int ready = start->stream && end->stream && event_done(start) && event_done(end);
    pthread_mutex_unlock(&lock);
    if (!ready)
        return ret(start->stream && end->stream ? cudaErrorNotReady : cudaErrorInvalidResourceHandle);
    *ms = (float)((double)(end->at.tv_sec - start->at.tv_sec) * 1e3 +
                  (double)(end->at.tv_nsec - start->at.tv_nsec) / 1e6);
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t handle, cudaEvent_t ev, unsigned int flags)
{
    ENTER();
    if (!ev || flags != 0)
        return ret(!ev ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
    pthread_mutex_lock(&lock);
    struct CUstream_st *s;
    cudaError_t e = stream_of(handle, &s);
    /* The record that is latest now, as CUDA does: later records do not count. */
    if (e == cudaSuccess && ev->stream && !event_done(ev)) {
        op_t *w = calloc(1, sizeof(*w));
        if (!w)
            e = cudaErrorMemoryAllocation;
        else {
            w->kind = OP_WAIT;
            w->u.wait.stream = ev->stream;
            w->u.wait.ticket = ev->ticket;
            if (!enqueue(s, w))
                e = cudaErrorMemoryAllocation;
        }
    }
    pthread_mutex_unlock(&lock);
    return ret(e);
}

static cudaError_t launch(cudaStream_t stream, void (*fn)(void *), const void *arg,
                          size_t arg_bytes, int kernel)
{
    ENTER();
    if (!fn)
        return ret(cudaErrorInvalidValue);
    op_t *op = calloc(1, sizeof(*op));
    void *copy = arg_bytes ? malloc(arg_bytes) : NULL;
    if (!op || (arg_bytes && !copy)) {
        free(op);
        free(copy);
        return ret(cudaErrorMemoryAllocation);
    }
    if (arg_bytes)
        memcpy(copy, arg, arg_bytes);
    op->kind = OP_FN;
    op->u.fn.fn = fn;
    op->u.fn.arg = copy;
    op->u.fn.kernel = kernel;
    if (kernel) {
        pthread_mutex_lock(&lock);
        counts.kernels++;
        pthread_mutex_unlock(&lock);
    }
    return ret(submit(stream, op, 0));
}

cudaError_t cuda_double_launch(cudaStream_t stream, void (*fn)(void *), const void *arg,
                               size_t arg_bytes)
{
    return launch(stream, fn, arg, arg_bytes, 1);
}

/* A host function gets its own pointer back: it is not copied. */
typedef struct { cudaHostFn_t fn; void *user; } host_fn_t;

static void run_host_fn(void *arg)
{
    host_fn_t *h = arg;
    h->fn(h->user);
}

cudaError_t CUDARTAPI cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *user)
{
    host_fn_t h = {fn, user};
    return launch(stream, run_host_fn, &h, sizeof(h), 0);
}

void cuda_double_fault(cudaError_t e, const char *why)
{
    pthread_mutex_lock(&lock);
    if (sticky == cudaSuccess) {
        sticky = e;
        fprintf(stderr, "cuda double: %s (%s): every later CUDA call fails\n", why,
                cudaGetErrorName(e));
    }
    pthread_mutex_unlock(&lock);
}

void cuda_double_counts(cuda_double_counts_t *out)
{
    pthread_mutex_lock(&lock);
    *out = counts;
    pthread_mutex_unlock(&lock);
}

/* ---- copies and memsets ------------------------------------------------------- */

typedef struct {
    char *at;      /* where the double reads or writes */
    int device;    /* device memory; else host */
    int pageable;  /* host memory CUDA did not allocate: copies are synchronous */
} side_t;

/* Under lock. */
static cudaError_t side_of(const void *p, size_t extent, side_t *out)
{
    int partial;
    region_t *r = region_of(p, extent, &partial);
    if (partial)
        return cudaErrorInvalidValue;
    out->device = r && !r->pinned;
    out->pageable = !r;
    out->at = out->device ? r->shadow + ((const char *)p - r->addr) : (char *)p;
    return cudaSuccess;
}

static cudaError_t copy(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t height, enum cudaMemcpyKind kind, cudaStream_t stream, int blocking)
{
    ENTER();
    if (height == 0 || width == 0)
        return cudaSuccess;
    if (!dst || !src || (height > 1 && (dpitch < width || spitch < width)))
        return ret(cudaErrorInvalidValue);
    side_t d, s;
    pthread_mutex_lock(&lock);
    cudaError_t e = side_of(dst, (height - 1) * dpitch + width, &d);
    if (e == cudaSuccess)
        e = side_of(src, (height - 1) * spitch + width, &s);
    if (e == cudaSuccess) {
        /* An explicit direction must name the memories it copies between. */
        int want_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
        int want_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
        if (kind != cudaMemcpyDefault && (s.device != want_src || d.device != want_dst))
            e = cudaErrorInvalidValue;
    }
    if (e == cudaSuccess) {
        long long bytes = (long long)(width * height);
        if (s.device && d.device)
            counts.d2d++, counts.d2d_bytes += bytes;
        else if (d.device)
            counts.h2d++, counts.h2d_bytes += bytes;
        else if (s.device)
            counts.d2h++, counts.d2h_bytes += bytes;
        else
            counts.h2h++;
    }
    pthread_mutex_unlock(&lock);
    if (e != cudaSuccess)
        return ret(e);
    op_t *op = calloc(1, sizeof(*op));
    if (!op)
        return ret(cudaErrorMemoryAllocation);
    op->kind = OP_COPY;
    op->u.copy.dst = d.at;
    op->u.copy.src = s.at;
    op->u.copy.dpitch = height > 1 ? dpitch : width;
    op->u.copy.spitch = height > 1 ? spitch : width;
    op->u.copy.width = width;
    op->u.copy.height = height;
    op->u.copy.bus = s.device != d.device;
    /* Pageable memory is copied before the call returns, as CUDA stages it. */
    return ret(submit(stream, op, blocking || d.pageable || s.pageable));
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void *dst, const void *src, size_t n,
                                      enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return copy(dst, n, src, n, n, 1, kind, stream, 0);
}

cudaError_t CUDARTAPI cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    return copy(dst, n, src, n, n, 1, kind, cudaStreamLegacy, 1);
}

cudaError_t CUDARTAPI cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                        size_t width, size_t height, enum cudaMemcpyKind kind,
                                        cudaStream_t stream)
{
    return copy(dst, dpitch, src, spitch, width, height, kind, stream, 0);
}

cudaError_t CUDARTAPI cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
                                   size_t width, size_t height, enum cudaMemcpyKind kind)
{
    return copy(dst, dpitch, src, spitch, width, height, kind, cudaStreamLegacy, 1);
}

static cudaError_t set(void *dst, int value, size_t n, cudaStream_t stream, int blocking)
{
    ENTER();
    if (n == 0)
        return cudaSuccess;
    side_t d;
    pthread_mutex_lock(&lock);
    cudaError_t e = side_of(dst, n, &d);
    pthread_mutex_unlock(&lock);
    if (e == cudaSuccess && !d.device)
        e = cudaErrorInvalidValue;
    if (e != cudaSuccess)
        return ret(e);
    op_t *op = calloc(1, sizeof(*op));
    if (!op)
        return ret(cudaErrorMemoryAllocation);
    op->kind = OP_MEMSET;
    op->u.set.dst = d.at;
    op->u.set.value = value;
    op->u.set.bytes = n;
    return ret(submit(stream, op, blocking));
}

cudaError_t CUDARTAPI cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t stream)
{
    return set(dst, value, n, stream, 0);
}

cudaError_t CUDARTAPI cudaMemset(void *dst, int value, size_t n)
{
    return set(dst, value, n, cudaStreamLegacy, 1);
}

/* ---- allocation ------------------------------------------------------------- */

cudaError_t CUDARTAPI cudaMalloc(void **out, size_t size)
{
    ENTER();
    return ret(device_alloc(out, size, NULL));
}

cudaError_t cuda_double_malloc_at(void **out, size_t size, void *at)
{
    ENTER();
    return ret(device_alloc(out, size, at));
}

cudaError_t CUDARTAPI cudaFree(void *p)
{
    ENTER();
    return ret(region_free(p, 0));
}

cudaError_t CUDARTAPI cudaHostAlloc(void **out, size_t size, unsigned int flags)
{
    ENTER();
    (void)flags;
    return ret(host_alloc(out, size));
}

cudaError_t CUDARTAPI cudaMallocHost(void **out, size_t size)
{
    ENTER();
    return ret(host_alloc(out, size));
}

cudaError_t CUDARTAPI cudaFreeHost(void *p)
{
    ENTER();
    return ret(region_free(p, 1));
}

/* ---- IPC handles ----------------------------------------------------------------- */

/* What a handle carries: enough for another process of the machine to find the
 * allocation's memfd (/proc/<pid>/fd/<fd>, as transports/shm does) and to tell
 * it from a later allocation behind the same descriptor number (the nonce in
 * the memfd's name). */
typedef struct {
    char magic[8];
    int32_t pid, fd, device, pad;
    unsigned long long nonce;
    uint64_t len, mapped;
} ipc_handle_t;

_Static_assert(sizeof(ipc_handle_t) <= sizeof(cudaIpcMemHandle_t), "IPC handle too big");

static const char ipc_magic[8] = "loomIPC";

/* Like the driver, for the base of an allocation only: a pointer inside one is
 * refused, so a caller that forgets the offset finds out here. */
cudaError_t CUDARTAPI cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *p)
{
    ENTER();
    if (!handle || !p)
        return ret(cudaErrorInvalidValue);
    ipc_handle_t h;
    memset(&h, 0, sizeof(h));
    pthread_mutex_lock(&lock);
    region_t *r = region_of(p, 1, NULL);
    int ok = r && !r->pinned && !r->opened && r->addr == (char *)p;
    if (ok) {
        memcpy(h.magic, ipc_magic, sizeof(h.magic));
        h.pid = (int32_t)getpid();
        h.fd = r->fd;
        h.device = r->device;
        h.nonce = r->nonce;
        h.len = r->len;
        h.mapped = r->mapped;
    }
    pthread_mutex_unlock(&lock);
    if (!ok)
        return ret(cudaErrorInvalidValue);
    memset(handle, 0, sizeof(*handle));
    memcpy(handle->reserved, &h, sizeof(h));
    return cudaSuccess;
}

/* Maps the owner's memfd as this process's device memory: a PROT_NONE mapping
 * the program sees and a writable shadow, as cudaMalloc does. Stricter than
 * the driver: a handle of this very process, or one this process already has
 * open, is refused, so a caller that reopens instead of keeping what it
 * opened fails here. */
cudaError_t CUDARTAPI cudaIpcOpenMemHandle(void **out, cudaIpcMemHandle_t handle,
                                           unsigned int flags)
{
    (void)flags;
    ENTER();
    if (!out)
        return ret(cudaErrorInvalidValue);
    ipc_handle_t h;
    memcpy(&h, handle.reserved, sizeof(h));
    if (memcmp(h.magic, ipc_magic, sizeof(h.magic)) != 0 || h.pid == (int32_t)getpid() ||
        h.mapped == 0)
        return ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&lock);
    int again = 0;
    for (region_t *q = regions; q; q = q->next)
        again |= q->opened && q->nonce == h.nonce;
    pthread_mutex_unlock(&lock);
    if (again)
        return ret(cudaErrorAlreadyMapped);
    char path[64], link[256], want[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
    snprintf(want, sizeof(want), "loom-cuda-double-%016llx", h.nonce);
    ssize_t n = readlink(path, link, sizeof(link) - 1);
    if (n <= 0)
        return ret(cudaErrorMapBufferObjectFailed);
    link[n] = '\0';
    if (!strstr(link, want))   /* freed, and the number reused */
        return ret(cudaErrorInvalidResourceHandle);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return ret(cudaErrorMapBufferObjectFailed);
    region_t *r = calloc(1, sizeof(*r));
    if (!r) {
        close(fd);
        return ret(cudaErrorMemoryAllocation);
    }
    r->len = (size_t)h.len;
    r->mapped = (size_t)h.mapped;
    r->device = current_device;
    r->opened = 1;
    r->nonce = h.nonce;
    r->fd = -1;   /* the mappings keep the memory; the descriptor is not needed */
    r->addr = mmap(NULL, r->mapped, PROT_NONE, MAP_SHARED, fd, 0);
    r->shadow = r->addr == MAP_FAILED ? MAP_FAILED
                                      : mmap(NULL, r->mapped, PROT_READ | PROT_WRITE,
                                             MAP_SHARED, fd, 0);
    close(fd);
    if (r->addr == MAP_FAILED || r->shadow == MAP_FAILED) {
        if (r->addr != MAP_FAILED)
            munmap(r->addr, r->mapped);
        free(r);
        return ret(cudaErrorMapBufferObjectFailed);
    }
    pthread_mutex_lock(&lock);
    r->next = regions;
    regions = r;
    counts.ipc_opens++;
    pthread_mutex_unlock(&lock);
    *out = r->addr;
    return cudaSuccess;
}

/* Waits for the device, as cudaFree does: queued work may still use the range. */
cudaError_t CUDARTAPI cudaIpcCloseMemHandle(void *p)
{
    ENTER();
    pthread_mutex_lock(&lock);
    region_t *r = regions;
    while (r && !(r->opened && r->addr == (char *)p))
        r = r->next;
    int device = r ? r->device : -1;
    pthread_mutex_unlock(&lock);
    if (!r)
        return ret(cudaErrorInvalidValue);
    wait_device_idle(device);
    pthread_mutex_lock(&lock);
    region_t **pp = &regions;
    while (*pp && *pp != r)
        pp = &(*pp)->next;
    if (*pp)
        *pp = r->next;
    counts.ipc_closes++;
    pthread_mutex_unlock(&lock);
    munmap(r->addr, r->mapped);
    munmap(r->shadow, r->mapped);
    free(r);
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    ENTER();
    if (!a)
        return ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&lock);
    region_t *r = region_of(p, 1, NULL);
    memset(a, 0, sizeof(*a));
    a->type = !r ? cudaMemoryTypeUnregistered : r->pinned ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
    a->device = r && !r->pinned ? r->device : r ? current_device : -2;
    /* Device memory has no host address; pinned memory is the same at both. */
    a->devicePointer = r ? (void *)p : NULL;
    a->hostPointer = r && r->pinned ? (void *)p : NULL;
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

/* ---- devices ----------------------------------------------------------------- */

cudaError_t CUDARTAPI cudaGetDeviceCount(int *n)
{
    ENTER();
    if (!n)
        return ret(cudaErrorInvalidValue);
    *n = device_count();
    return *n > 0 ? cudaSuccess : ret(cudaErrorNoDevice);
}

cudaError_t CUDARTAPI cudaSetDevice(int device)
{
    ENTER();
    if (device < 0 || device >= device_count())
        return ret(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDevice(int *device)
{
    ENTER();
    if (!device)
        return ret(cudaErrorInvalidValue);
    *device = current_device;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    ENTER();
    if (!p)
        return ret(cudaErrorInvalidValue);
    if (device < 0 || device >= device_count())
        return ret(cudaErrorInvalidDevice);
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "Loom CUDA double");
    p->major = 9;
    p->minor = 0;
    p->totalGlobalMem = (size_t)16 << 30;
    p->multiProcessorCount = 1;
    p->warpSize = 32;
    p->unifiedAddressing = 1;
    p->pciDeviceID = device;
    return cudaSuccess;
}

/* A made-up bus id: whatever sysfs says of it, the libibverbs double's HCA
 * has no PCI device there, so Loom finds the GPU-HCA distance unknown (and
 * stages by default), as on a machine without sysfs. */
cudaError_t CUDARTAPI cudaDeviceGetPCIBusId(char *id, int len, int device)
{
    ENTER();
    if (!id || len <= 0 || device < 0 || device >= device_count())
        return ret(cudaErrorInvalidValue);
    snprintf(id, (size_t)len, "0000:%02x:00.0", 0xe0 + device);
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    ENTER();
    if (!value)
        return ret(cudaErrorInvalidValue);
    if (device < 0 || device >= device_count())
        return ret(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMemoryClockRate: *value = 1000000; break;      /* kHz */
    case cudaDevAttrGlobalMemoryBusWidth: *value = 64; break;      /* bits */
    case cudaDevAttrUnifiedAddressing: *value = 1; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    default: *value = 0; break;
    }
    return cudaSuccess;
}

/* ---- errors ------------------------------------------------------------------ */

static const struct { cudaError_t e; const char *name, *text; } errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorMapBufferObjectFailed, "cudaErrorMapBufferObjectFailed",
     "mapping of buffer object failed"},
    {cudaErrorAlreadyMapped, "cudaErrorAlreadyMapped", "resource already mapped"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
};

const char *CUDARTAPI cudaGetErrorName(cudaError_t e)
{
    for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
        if (errors[i].e == e)
            return errors[i].name;
    return "cudaErrorUnknown";
}

const char *CUDARTAPI cudaGetErrorString(cudaError_t e)
{
    for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
        if (errors[i].e == e)
            return errors[i].text;
    return "unknown error";
}

int cuda_double_started(void)
{
    pthread_mutex_lock(&lock);
    int started = owner == getpid();
    pthread_mutex_unlock(&lock);
    return started;
}

cudaError_t cuda_double_fail(cudaError_t e)
{
    return ret(e);
}

cudaError_t CUDARTAPI cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e != cudaSuccess ? e : sticky;
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void)
{
    return last_error != cudaSuccess ? last_error : sticky;
}

/* ---- the driver calls Loom makes ------------------------------------------------ */

CUresult CUDAAPI cuInit(unsigned int flags)
{
    (void)flags;
    return enter() == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

/* Like the driver: no error for memory it does not know, only empty answers;
 * CUDA_ERROR_NOT_INITIALIZED before anything started CUDA. */
CUresult CUDAAPI cuPointerGetAttributes(unsigned int n, CUpointer_attribute *which, void **values,
                                        CUdeviceptr ptr)
{
    if (!which || !values)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int started = owner == getpid();
    region_t *r = region_of((const void *)(uintptr_t)ptr, 1, NULL);
    for (unsigned int i = 0; started && i < n; i++) {
        switch (which[i]) {
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            *(unsigned int *)values[i] = !r ? 0 : r->pinned ? CU_MEMORYTYPE_HOST
                                                            : CU_MEMORYTYPE_DEVICE;
            break;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
            *(unsigned int *)values[i] = 0;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            *(int *)values[i] = r ? (r->pinned ? current_device : r->device) : -2;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
            *(void **)values[i] = r ? r->addr : NULL;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
            *(size_t *)values[i] = r ? r->len : 0;
            break;
        case CU_POINTER_ATTRIBUTE_BUFFER_ID:
            /* As the driver: unique per allocation for the process's life. */
            *(unsigned long long *)values[i] = r && !r->pinned ? r->buffer_id : 0;
            break;
        default:
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return started ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult CUDAAPI cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr ptr)
{
    pthread_mutex_lock(&lock);
    region_t *r = region_of((const void *)(uintptr_t)ptr, 1, NULL);
    if (r && !r->pinned) {
        if (base)
            *base = (CUdeviceptr)(uintptr_t)r->addr;
        if (size)
            *size = r->len;
    }
    pthread_mutex_unlock(&lock);
    return r && !r->pinned ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* A dma-buf of device memory, for an RDMA device to reach it (GPUDirect RDMA):
 * here a new descriptor of the allocation's memfd, which the libibverbs double
 * (tests/verbs-provider) maps for itself in ibv_reg_dmabuf_mr. A dma-buf's
 * offset 0 is dptr, the memfd's is the allocation's start: the verbs double
 * asks cuda_double_dmabuf_offset for the difference. As the driver: dptr and
 * size page-aligned, inside one device allocation (its pages), the caller
 * closes the fd. Stricter: only memory this process allocated is exported.
 * LOOM_CUDA_DOUBLE_DMABUF=0: unsupported, as on a GPU or driver without it. */
#define DMABUF_FDS 1024
static long long dmabuf_start[DMABUF_FDS];   /* [fd]: offset in its memfd + 1; 0: none */

long long cuda_double_dmabuf_offset(int fd)
{
    pthread_mutex_lock(&lock);
    long long off = fd >= 0 && fd < DMABUF_FDS ? dmabuf_start[fd] - 1 : -1;
    pthread_mutex_unlock(&lock);
    return off;
}

static int dmabuf_off(void)
{
    const char *v = getenv("LOOM_CUDA_DOUBLE_DMABUF");
    return v && strcmp(v, "0") == 0;
}

CUresult CUDAAPI cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                               CUmemRangeHandleType type, unsigned long long flags)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    if (!handle || type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || flags || !size ||
        dptr % pg || size % pg)
        return CUDA_ERROR_INVALID_VALUE;
    if (dmabuf_off())
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    int started = owner == getpid();
    region_t *r = started ? region_of((const void *)(uintptr_t)dptr, 1, NULL) : NULL;
    CUresult res = CUDA_ERROR_INVALID_VALUE;
    if (!started)
        res = CUDA_ERROR_NOT_INITIALIZED;
    else if (r && !r->pinned && !r->opened &&
             size <= r->mapped - (size_t)((char *)(uintptr_t)dptr - r->addr)) {
        int fd = fcntl(r->fd, F_DUPFD_CLOEXEC, 0);
        if (fd >= DMABUF_FDS) {
            close(fd);
            fd = -1;
        }
        if (fd >= 0) {
            dmabuf_start[fd] = (char *)(uintptr_t)dptr - r->addr + 1;
            *(int *)handle = fd;
            counts.dmabuf_exports++;
            res = CUDA_SUCCESS;
        } else {
            res = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&lock);
    return res;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    if (!pi || dev < 0 || dev >= device_count())
        return CUDA_ERROR_INVALID_VALUE;
    if (attrib != CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
        return CUDA_ERROR_NOT_SUPPORTED;   /* not served */
    *pi = !dmabuf_off();
    return CUDA_SUCCESS;
}
