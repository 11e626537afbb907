/* ipc.c - collectives on GPU buffers GPU to GPU, when every rank of the
 * communicator is on one node: each rank maps the others' buffers through CUDA
 * IPC handles and reads (or writes) them with device copies and Loom's
 * reduction kernels, instead of staging everything through host memory and
 * the shm transport (two bus crossings each way).
 *
 * Each call:
 *  1. waits for its own device work (the user's, before the call), so its
 *     inputs are final and its outputs free;
 *  2. swaps, in one small host allgather, an IPC handle and offset for each
 *     buffer a peer needs; the allgather is also the barrier after step 1;
 *  3. opens the peers' allocations the process has not opened yet (a process
 *     may open a handle only once, so they are the process's, keyed by handle;
 *     each communicator holds at most PEERS_KEPT beyond one call's needs, and
 *     the last to let one go closes it) and agrees with the others (a host
 *     allreduce) that every rank could: if one could not, all stage;
 *  4. runs its part on its stream, waits for it, and meets the others at a host
 *     barrier, so that no rank returns (and lets its caller overwrite or free a
 *     buffer) while a peer still reads or writes it.
 *
 * Reductions: the count is cut into size blocks (of a multiple of 16 bytes, the
 * kernels' vector width); rank r reduces block r of every rank's input, in rank
 * order ((x0 op x1) op x2 ...), as staging.c and the CPU path do, so every rank
 * gets the same bits; then writes it where it goes: allreduce, into every rank's
 * output; reduce, into the root's. Only rank r reads block r of any input, so
 * writing a block in place cannot race another rank; only the chain itself can
 * overwrite its own input before reading it (in place, when the output is the
 * input of rank 2 or later): then it reduces through dev_scratch a chunk at a
 * time and copies each result out after its inputs were read. reduce_scatter
 * in place writes its result over block 0, which rank 0 reads: it reduces into
 * its own block first and moves it after a barrier.
 *
 * Across nodes, allreduce, reduce_scatter and reduce run hierarchically
 * (run_hier, run_hier_reduce_scatter, run_hier_reduce): this file's
 * mechanisms on the ranks of one node, gdr.c's ring between nodes; allgather
 * and broadcast too, with gdr.c's one step between nodes (run_hier_allgather,
 * run_hier_broadcast).
 *
 * The data movement collectives pull: each rank copies from the peers' send
 * buffers (broadcast: the root's) the pieces that go into its own output
 * (run_copies; gather: the root only), so only send buffers are shared, the
 * root's alone for scatter. alltoallv's pieces sit at the senders'
 * displacements, which the receivers do not know: its handle swap carries
 * each rank's byte offset of the piece for every peer too.
 *
 * Not covered (staged as before): alltoall(v) in place on any rank (each rank
 * would overwrite blocks of its buffer while peers still read them; the
 * ranks learn it in the handle swap, so all stage together), any collective
 * but allreduce, reduce_scatter, allgather, reduce and broadcast across
 * nodes, and a buffer cudaIpcGetMemHandle refuses (memory from a
 * stream-ordered pool, say).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_state.h"

/* An allocation of a peer, opened in this process. The driver maps a handle
 * once per process, so the opened allocations are the process's, shared by
 * its communicators: users counts those that hold one. */
typedef struct opened {
    struct opened *next;
    cudaIpcMemHandle_t handle;
    char *base;
    int users;
} opened_t;

static pthread_mutex_t opened_lock = PTHREAD_MUTEX_INITIALIZER;
static opened_t *opened;

/* What a communicator holds of them. */
struct loom_cuda_peer {
    opened_t *o;
    unsigned long last_use; /* st->calls when last used */
};

/* Held no longer, not yet let go: closing a handle waits for the device, as
 * cudaFree does, which a stream-ordered call must not (its own stream may be
 * held until it finishes), so only a plain call or destroy lets them go. */
struct loom_cuda_retired {
    struct loom_cuda_retired *next;
    opened_t *o;
};

/* Allocations held per communicator beyond the two per peer one call needs:
 * a program that allocates fresh buffers for each call would otherwise keep
 * every one it ever used mapped. */
#define PEERS_KEPT 64

static void drop(opened_t *o)
{
    pthread_mutex_lock(&opened_lock);
    int last = --o->users == 0;
    if (last) {
        opened_t **pp = &opened;
        while (*pp != o)
            pp = &(*pp)->next;
        *pp = o->next;
    }
    pthread_mutex_unlock(&opened_lock);
    if (last) {
        cudaIpcCloseMemHandle(o->base);
        free(o);
    }
}

enum { SEND, RECV };

/* What a rank tells the others: for its send and receive buffers, whether a
 * peer needs it, its allocation's handle and its offset in it. alltoallv's
 * record is followed by comm_size uint64_t: the byte offset in its send
 * buffer of the piece for each rank (rec_bytes). */
typedef struct {
    cudaIpcMemHandle_t handle[2];
    uint64_t off[2];
    int32_t has[2];
    int32_t ok;       /* 0: a buffer could not be shared */
    int32_t in_place; /* alltoall(v) in place: every rank stages */
} ipc_rec_t;

typedef struct {
    loom_cuda_state_t *st;
    const loom_coll_args_t *a;
    loom_accel_host_coll_fn run_host;
    void *host_arg;
    loom_err_t *err;
    /* The ranks that map each other's buffers: the communicator, or (the
     * hierarchical path) the ranks of our node, group[i] the communicator
     * rank of index i; rank and size are indices in it. The host collectives
     * (handles, agreement, barriers) span the whole communicator either way. */
    int rank, size;
    const int *group;     /* NULL: the identity */
    const loom_hier_t *h; /* the hierarchical path's views; NULL: one node */
    int comm_size;
    char **send, **recv; /* [size]: every group rank's buffers as this process sees them */
    size_t *sfrom;       /* alltoallv: [size], where in group rank k's send buffer our
                            piece starts (bytes); NULL for the others */
} ipc_t;

/* One node only (st->ipc): across nodes device.c sends allreduce,
 * reduce_scatter, allgather, reduce and broadcast to loom_cuda_ipc_hier_run
 * and stages the rest. alltoall(v) in place is covered here but staged by
 * every rank after the handle swap (share). */
int loom_cuda_ipc_covers(const loom_cuda_state_t *st, const loom_coll_args_t *a)
{
    if (!st->ipc)
        return 0;
    switch (a->coll) {
    case LOOM_COLL_ALLREDUCE:
    case LOOM_COLL_BROADCAST:
    case LOOM_COLL_REDUCE:
    case LOOM_COLL_ALLGATHER:
    case LOOM_COLL_REDUCE_SCATTER:
    case LOOM_COLL_GATHER:
    case LOOM_COLL_SCATTER:
    case LOOM_COLL_ALLGATHERV:
    case LOOM_COLL_ALLTOALL:
    case LOOM_COLL_ALLTOALLV: return 1;
    default: return 0;
    }
}

static void let_go(loom_cuda_state_t *st)
{
    while (st->retired) {
        struct loom_cuda_retired *r = st->retired;
        st->retired = r->next;
        drop(r->o);
        free(r);
    }
}

void loom_cuda_ipc_release(loom_cuda_state_t *st)
{
    let_go(st);
    for (int i = 0; i < st->npeers; i++)
        drop(st->peers[i].o);
    free(st->peers);
    st->peers = NULL;
    st->npeers = 0;
}

/* Which of its buffers a rank's peers read or write (in the hierarchical
 * path: those of its node). */
static void needed(const ipc_t *x, int need[2])
{
    const loom_coll_args_t *a = x->a;
    const int me = x->group ? x->group[x->rank] : x->rank; /* communicator rank */
    need[SEND] = need[RECV] = 0;
    if (x->h && a->coll == LOOM_COLL_ALLGATHER) {
        need[RECV] = 1; /* what it gathered from the other nodes */
        return;
    }
    if (x->h && a->coll == LOOM_COLL_BROADCAST) {
        /* The node's copy of the root's data: the root's own on its node, what
         * the rank of the root's local index received on the others. */
        int mr, lr;
        loom_hier_place(x->h, a->root, &mr, &lr);
        need[RECV] = x->rank == lr;
        return;
    }
    switch (a->coll) {
    case LOOM_COLL_ALLREDUCE: need[SEND] = need[RECV] = 1; break;
    case LOOM_COLL_REDUCE: need[SEND] = 1, need[RECV] = me == a->root; break;
    case LOOM_COLL_BROADCAST: need[RECV] = me == a->root; break;
    /* The rest pull from send buffers (run_copies). */
    case LOOM_COLL_GATHER: need[SEND] = me != a->root; break;
    case LOOM_COLL_SCATTER: need[SEND] = me == a->root; break;
    case LOOM_COLL_ALLGATHERV: need[SEND] = a->count > 0; break; /* may be NULL then */
    case LOOM_COLL_ALLTOALLV:
        for (int k = 0; k < x->size; k++)
            need[SEND] |= k != me && a->scounts[k] > 0;
        break;
    default: need[SEND] = 1; break; /* allgather, reduce_scatter, alltoall */
    }
}

/* The size of a rank's record in the handle swap. */
static size_t rec_bytes(const ipc_t *x)
{
    return sizeof(ipc_rec_t) +
           (x->a->coll == LOOM_COLL_ALLTOALLV ? (size_t)x->comm_size * sizeof(uint64_t) : 0);
}

static loom_status_t host_coll(const ipc_t *x, const loom_coll_args_t *h)
{
    return x->run_host(x->host_arg, h);
}

static loom_status_t barrier(const ipc_t *x)
{
    loom_coll_args_t b = {.coll = LOOM_COLL_BARRIER, .esize = 1, .dtype = LOOM_UINT8};
    return host_coll(x, &b);
}

/* The handle and offset of device pointer p, or 0 when the driver will not
 * share it. */
static int export_buf(const void *p, cudaIpcMemHandle_t *h, uint64_t *off)
{
    char *base = loom_cuda_alloc_base(p);
    if (!base || cudaIpcGetMemHandle(h, base) != cudaSuccess) {
        cudaGetLastError(); /* not an error of the collective: it stages */
        return 0;
    }
    *off = (uint64_t)((const char *)p - base);
    return 1;
}

/* The peer allocation behind h, opened now if this process has not yet; NULL
 * on failure (the driver's error is left for the caller to clear). */
static char *open_peer(loom_cuda_state_t *st, const cudaIpcMemHandle_t *h)
{
    for (int i = 0; i < st->npeers; i++)
        if (memcmp(&st->peers[i].o->handle, h, sizeof(*h)) == 0) {
            st->peers[i].last_use = st->calls;
            return st->peers[i].o->base;
        }
    const int cap = PEERS_KEPT + 2 * loom_comm_size(st->comm);
    if (!st->peers && !(st->peers = calloc((size_t)cap, sizeof(*st->peers))))
        return NULL;
    if (st->npeers == cap) {
        /* Retire the one unused longest (this call uses at most 2 * size). */
        int old = -1;
        for (int i = 0; i < st->npeers; i++)
            if (st->peers[i].last_use != st->calls &&
                (old < 0 || st->peers[i].last_use < st->peers[old].last_use))
                old = i;
        struct loom_cuda_retired *r = old < 0 ? NULL : malloc(sizeof(*r));
        if (!r)
            return NULL;
        r->o = st->peers[old].o;
        r->next = st->retired;
        st->retired = r;
        st->peers[old] = st->peers[--st->npeers];
    }
    pthread_mutex_lock(&opened_lock);
    opened_t *o = opened;
    while (o && memcmp(&o->handle, h, sizeof(*h)) != 0)
        o = o->next;
    void *base = NULL;
    if (!o && (o = calloc(1, sizeof(*o))) != NULL) {
        if (cudaIpcOpenMemHandle(&base, *h, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess) {
            o->handle = *h;
            o->base = base;
            o->next = opened;
            opened = o;
        } else {
            free(o);
            o = NULL;
        }
    }
    if (o)
        o->users++;
    pthread_mutex_unlock(&opened_lock);
    if (!o)
        return NULL;
    st->peers[st->npeers++] = (struct loom_cuda_peer){.o = o, .last_use = st->calls};
    return o->base;
}

/* The piece this rank pulls from group rank k's send buffer: its byte
 * length (0: none), where it starts there (*src) and where it goes in our
 * output (*dst). In place, our own piece is where it goes already (the core
 * made sendbuf point there), so copy() skips it. */
static size_t piece(const ipc_t *x, int k, size_t *dst, size_t *src)
{
    const loom_coll_args_t *a = x->a;
    const size_t es = a->esize, bytes = a->count * es;
    *dst = (size_t)k * bytes;
    *src = 0;
    switch (a->coll) {
    case LOOM_COLL_GATHER: return x->rank == a->root ? bytes : 0;
    case LOOM_COLL_SCATTER:
        *dst = 0;
        *src = (size_t)x->rank * bytes;
        return k == a->root ? bytes : 0;
    case LOOM_COLL_ALLGATHERV: *dst = a->displs[k] * es; return a->counts[k] * es;
    case LOOM_COLL_ALLTOALL: *src = (size_t)x->rank * bytes; return bytes;
    case LOOM_COLL_ALLTOALLV:
        *dst = a->displs[k] * es;
        *src = x->sfrom[k];
        return a->counts[k] * es;
    default: return bytes; /* allgather */
    }
}

/* Whether this rank reads group rank r's send buffer, if shared: it maps only
 * those (a gather's other ranks, say, map nothing). */
static int reads_send(const ipc_t *x, int r)
{
    size_t dst, src;
    switch (x->a->coll) {
    case LOOM_COLL_GATHER:
    case LOOM_COLL_SCATTER:
    case LOOM_COLL_ALLGATHERV:
    case LOOM_COLL_ALLTOALL:
    case LOOM_COLL_ALLTOALLV: return piece(x, r, &dst, &src) > 0;
    default: return 1;
    }
}

/* Group rank r's record among all, the swapped records of rb bytes each. */
static const ipc_rec_t *rec_of(const ipc_t *x, const char *all, size_t rb, int r)
{
    return (const ipc_rec_t *)(all + (size_t)(x->group ? x->group[r] : r) * rb);
}

/* Steps 1-3 of the file comment: every rank's buffers in x->send / x->recv
 * (alltoallv: the offsets of our pieces in x->sfrom); *agreed 0 when some
 * rank could not share or open one, or called alltoall(v) in place (then all
 * stage). */
static loom_status_t share(ipc_t *x, int *agreed)
{
    loom_cuda_state_t *st = x->st;
    const loom_coll_args_t *a = x->a;
    loom_status_t status = loom_cuda_dev_ops.sync(st, x->err);
    if (status != LOOM_SUCCESS)
        return status;
    const size_t rb = rec_bytes(x);
    char *all = calloc((size_t)x->comm_size + 1, rb);
    if (!all)
        return loom_err_set(x->err, LOOM_ERR_NO_MEMORY, "out of memory");
    ipc_rec_t *mine = (ipc_rec_t *)(all + (size_t)x->comm_size * rb); /* the last one */
    const void *bufs[2] = {a->sendbuf, a->recvbuf};
    int need[2];
    needed(x, need);
    mine->ok = 1;
    mine->in_place = loom_cuda_alltoall_in_place(a) && a->sendbuf;
    for (int b = SEND; b <= RECV; b++)
        if (need[b]) {
            mine->has[b] = 1;
            mine->ok &= export_buf(bufs[b], &mine->handle[b], &mine->off[b]);
        }
    if (x->sfrom) {
        uint64_t *tail = (uint64_t *)(mine + 1);
        for (int k = 0; k < x->comm_size; k++)
            tail[k] = a->sdispls[k] * a->esize;
    }
    loom_coll_args_t g = {.coll = LOOM_COLL_ALLGATHER,
                          .sendbuf = mine,
                          .recvbuf = all,
                          .count = rb,
                          .esize = 1,
                          .dtype = LOOM_UINT8};
    if ((status = host_coll(x, &g)) != LOOM_SUCCESS)
        goto out;
    int32_t ok = 1;
    for (int r = 0; r < x->size; r++)
        ok &= rec_of(x, all, rb, r)->ok && !rec_of(x, all, rb, r)->in_place;
    for (int r = 0; r < x->size && ok && x->sfrom; r++)
        x->sfrom[r] = ((const uint64_t *)(rec_of(x, all, rb, r) + 1))[x->rank];
    for (int r = 0; r < x->size && ok; r++)
        for (int b = SEND; b <= RECV && ok; b++) {
            char **to = b == SEND ? x->send : x->recv;
            const ipc_rec_t *rec = rec_of(x, all, rb, r);
            if (r == x->rank)
                to[r] = (char *)bufs[b];
            else if (rec->has[b] && (b == RECV || reads_send(x, r))) {
                char *base = open_peer(st, &rec->handle[b]);
                if (!base) {
                    cudaGetLastError();
                    ok = 0;
                }
                to[r] = base ? base + rec->off[b] : NULL;
            }
        }
    /* Agree: the least of every rank's ok. */
    int32_t any = ok;
    if ((status = loom_cuda_agree_min(x->run_host, x->host_arg, &any)) == LOOM_SUCCESS)
        *agreed = any;
out:
    free(all);
    return status;
}

static loom_status_t copy(const ipc_t *x, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0 || dst == src)
        return LOOM_SUCCESS;
    return loom_cuda_dev_ops.copy2d(x->st, LOOM_DEV_UP, dst, bytes, src, bytes, bytes, 1, x->err);
}

/* The reduction chain over every rank's n elements at element off of in[],
 * into out, then copied to each of also[0..nalso) (out and also point where
 * element off goes). through_scratch: out is an input the chain would
 * overwrite before reading it, so each chunk is reduced in dev_scratch and
 * copied out once read. avg: LOOM_AVG divides here (0: a later step does). */
static loom_status_t reduce_block(const ipc_t *x, char *const *in, size_t off, size_t n, char *out,
                                  char *const *also, int nalso, int through_scratch, int avg)
{
    const loom_coll_args_t *a = x->a;
    const size_t es = a->esize;
    const size_t step = through_scratch ? x->st->chunk_bytes / es : n;
    loom_status_t st = LOOM_SUCCESS;
    for (size_t done = 0; done < n && st == LOOM_SUCCESS; done += step) {
        const size_t len = n - done < step ? n - done : step, at = (off + done) * es;
        char *acc = through_scratch ? x->st->dev_scratch : out + done * es;
        for (int r = 1; r < x->size && st == LOOM_SUCCESS; r++)
            st = loom_cuda_dev_ops.reduce3(x->st, acc, r == 1 ? in[0] + at : acc, in[r] + at, len,
                                           a->dtype, a->op, x->err);
        if (st == LOOM_SUCCESS && a->op == LOOM_AVG && avg)
            st = loom_cuda_dev_ops.avg(x->st, acc, len, a->dtype, x->size, x->err);
        if (st == LOOM_SUCCESS && through_scratch)
            st = copy(x, out + done * es, acc, len * es);
        for (int k = 0; k < nalso && st == LOOM_SUCCESS; k++)
            st = copy(x, also[k] + done * es, acc, len * es);
    }
    return st;
}

/* Wait for this rank's part, then for everybody's. */
static loom_status_t finish(const ipc_t *x)
{
    loom_status_t st = loom_cuda_dev_ops.sync(x->st, x->err);
    return st == LOOM_SUCCESS ? barrier(x) : st;
}

/* Block r of the count, the one group rank r reduces: *off_p and *n_p elements
 * (n 0 past the end: a count smaller than the group leaves some ranks none). */
static void block_of(const ipc_t *x, int r, size_t *off_p, size_t *n_p)
{
    const loom_coll_args_t *a = x->a;
    const size_t es = a->esize, V = es < 16 ? 16 / es : 1, P = (size_t)x->size;
    size_t b = (a->count + P - 1) / P;
    b = (b + V - 1) / V * V;
    const size_t off = b * (size_t)r;
    *off_p = off;
    *n_p = a->count > off ? (a->count - off < b ? a->count - off : b) : 0;
}

/* allreduce (root < 0) and reduce: rank r reduces block r. */
static loom_status_t run_reduce(const ipc_t *x, int root)
{
    const loom_coll_args_t *a = x->a;
    const size_t es = a->esize, P = (size_t)x->size;
    size_t off, n;
    block_of(x, x->rank, &off, &n);
    const int owner = root < 0 ? x->rank : root; /* whose output the chain writes */
    char *out = x->recv[owner] + off * es;
    /* In place, the output is the owner's input, read at step max(owner, 1). */
    const int hazard = x->recv[owner] == x->send[owner] && owner >= 2;
    char **also = NULL;
    int nalso = 0;
    if (root < 0) {
        also = malloc(P * sizeof(char *));
        if (!also)
            return loom_err_set(x->err, LOOM_ERR_NO_MEMORY, "out of memory");
        for (int k = 0; k < x->size; k++)
            if (k != x->rank)
                also[nalso++] = x->recv[k] + off * es;
    }
    loom_status_t st =
        n ? reduce_block(x, x->send, off, n, out, also, nalso, hazard, 1) : LOOM_SUCCESS;
    free(also);
    return st == LOOM_SUCCESS ? finish(x) : st;
}

/* reduce_scatter: rank r reduces block r of every input into its output. */
static loom_status_t run_reduce_scatter(const ipc_t *x)
{
    const loom_coll_args_t *a = x->a;
    const int r = x->rank;
    const size_t es = a->esize, n = a->count, off = n * (size_t)r;
    char *const out = x->recv[r];
    if (out != x->send[r]) {
        loom_status_t st = reduce_block(x, x->send, off, n, out, NULL, 0, 0, 1);
        return st == LOOM_SUCCESS ? finish(x) : st;
    }
    /* In place: block r first (only this rank reads it), block 0's place once
     * rank 0 has read it. */
    loom_status_t st = reduce_block(x, x->send, off, n, out + off * es, NULL, 0, r >= 2, 1);
    if (st == LOOM_SUCCESS)
        st = finish(x);
    if (st == LOOM_SUCCESS && r > 0) {
        st = copy(x, out, out + off * es, n * es);
        if (st == LOOM_SUCCESS)
            st = loom_cuda_dev_ops.sync(x->st, x->err);
    }
    return st;
}

static loom_status_t run_copies(const ipc_t *x)
{
    const loom_coll_args_t *a = x->a;
    loom_status_t st = LOOM_SUCCESS;
    if (a->coll == LOOM_COLL_BROADCAST) {
        if (x->rank != a->root)
            st = copy(x, x->recv[x->rank], x->recv[a->root], a->count * a->esize);
    } else {
        for (int k = 0; k < x->size && st == LOOM_SUCCESS; k++) {
            size_t dst, src, n = piece(x, k, &dst, &src);
            if (n)
                st = copy(x, x->recv[x->rank] + dst, x->send[k] + src, n);
        }
    }
    return st == LOOM_SUCCESS ? finish(x) : st;
}

/* Steps 1-2 of the hierarchical allreduce and reduce: block [off, off + n)
 * of the node's inputs reduced into dst in local rank order, then with the
 * same block of every other node by gdr.c's ring over x->h->cross, ending on
 * every node (root_node -1: allreduce) or on root_node (reduce), where
 * LOOM_AVG divides by the communicator's size, once. */
static loom_status_t reduce_across_nodes(const ipc_t *x, char *dst, size_t off, size_t n,
                                         int hazard, int root_node)
{
    const loom_hier_t *h = x->h;
    const loom_coll_args_t *a = x->a;
    loom_status_t st = n ? reduce_block(x, x->send, off, n, dst, NULL, 0, hazard, 0)
                         : LOOM_SUCCESS;
    if (st == LOOM_SUCCESS)
        st = loom_cuda_dev_ops.sync(x->st, x->err);
    loom_coll_args_t ring = *a;
    ring.sendbuf = ring.recvbuf = dst;
    ring.count = n;
    if (root_node >= 0)
        ring.root = root_node;
    ring.op = a->op == LOOM_AVG ? LOOM_SUM : a->op;
    if (st == LOOM_SUCCESS)
        st = loom_cuda_gdr_run_group(x->st, &ring, h->cross, h->M, h->me_cross, x->err);
    const int result_here = root_node < 0 || h->me_cross == root_node;
    if (st == LOOM_SUCCESS && n && result_here && a->op == LOOM_AVG)
        st = loom_cuda_dev_ops.avg(x->st, dst, n, a->dtype, x->comm_size, x->err);
    return st;
}

/* The hierarchical allreduce, IPC inside our node (x's group, local index
 * l = x->rank of L = x->size) around a ring between nodes:
 *  1. local rank l reduces block l of the node's inputs, in local rank order,
 *     into its own output (LOOM_AVG not divided yet);
 *  2. it allreduces that block by GPUDirect RDMA with local rank l of every
 *     other node (gdr.c's ring over h->cross), then divides for LOOM_AVG by
 *     the communicator's size, once;
 *  3. after a barrier (every block final, every input read), it copies the
 *     node's other blocks from their owners' outputs into its own.
 * Each element is reduced on one node by one rank, then in the ring by one
 * rank, and only copied after: every rank gets the same bits (the ring's
 * order between nodes, as gdr.c). Only local rank l reads block l of any
 * input and writes block l of its own output in steps 1-2, so in place is
 * safe but for the chain overwriting its own input (l >= 2: through
 * dev_scratch, as run_reduce); step 3 writes the other blocks of its output,
 * which in place are inputs the node's other ranks read in step 1: after the
 * barrier. */
static loom_status_t run_hier(const ipc_t *x)
{
    const loom_coll_args_t *a = x->a;
    const size_t es = a->esize;
    size_t off, n;
    block_of(x, x->rank, &off, &n);
    char *const mine = x->recv[x->rank] + off * es;
    const int hazard = x->recv[x->rank] == x->send[x->rank] && x->rank >= 2;
    loom_status_t st = reduce_across_nodes(x, mine, off, n, hazard, -1);
    if (st == LOOM_SUCCESS)
        st = finish(x);
    for (int k = 0; k < x->size && st == LOOM_SUCCESS; k++) {
        block_of(x, k, &off, &n);
        if (k != x->rank)
            st = copy(x, x->recv[x->rank] + off * es, x->recv[k] + off * es, n * es);
    }
    return st == LOOM_SUCCESS ? finish(x) : st;
}

/* The hierarchical reduce_scatter (count n per rank), local index l:
 *  1. for each node m, local rank l reduces over IPC, in local rank order,
 *     the block of every input of its node that goes to rank (node m, local
 *     l), into block m of the communicator's GPUDirect accumulator;
 *  2. those M blocks go round gdr.c's ring reduce_scatter with local rank l
 *     of the other nodes: block m of the accumulator ends as our result
 *     (LOOM_AVG divided once, by the communicator's size);
 *  3. after a barrier (the node's inputs all read: in place, our output is
 *     one of them) it is copied into our output.
 * Nothing of the node's outputs is shared: each rank writes only its own. */
static loom_status_t run_hier_reduce_scatter(const ipc_t *x)
{
    const loom_hier_t *h = x->h;
    const loom_coll_args_t *a = x->a;
    const size_t es = a->esize, n = a->count;
    char *acc = loom_cuda_gdr_accumulator(x->st, (size_t)h->M * n * es, x->err);
    if (!acc)
        return LOOM_ERR_NO_MEMORY;
    loom_status_t st = LOOM_SUCCESS;
    for (int m = 0; m < h->M && st == LOOM_SUCCESS; m++)
        st = reduce_block(x, x->send, (size_t)h->cross[m] * n, n, acc + (size_t)m * n * es, NULL, 0,
                          0, 0);
    if (st == LOOM_SUCCESS)
        st = loom_cuda_dev_ops.sync(x->st, x->err);
    loom_coll_args_t ring = *a;
    ring.op = a->op == LOOM_AVG ? LOOM_SUM : a->op;
    if (st == LOOM_SUCCESS)
        st = loom_cuda_gdr_reduce_scatter_group(x->st, &ring, h->cross, h->M, h->me_cross, x->err);
    char *const mine = acc + (size_t)h->me_cross * n * es;
    if (st == LOOM_SUCCESS && a->op == LOOM_AVG)
        st = loom_cuda_dev_ops.avg(x->st, mine, n, a->dtype, x->comm_size, x->err);
    if (st == LOOM_SUCCESS)
        st = finish(x);
    if (st == LOOM_SUCCESS)
        st = copy(x, x->recv[x->rank], mine, n * es);
    return st == LOOM_SUCCESS ? loom_cuda_dev_ops.sync(x->st, x->err) : st;
}

/* The hierarchical allgather, local index l: local rank l of every node
 * swaps its piece with the others by GPUDirect RDMA (gdr.c's one step over
 * h->cross), each piece landing where its rank's goes; after a barrier it
 * copies over IPC, from each other local rank k's output, the pieces k
 * gathered (those of local rank k of every node); a last barrier keeps its
 * output in place while the node's other ranks read it. */
static loom_status_t run_hier_allgather(const ipc_t *x)
{
    const loom_hier_t *h = x->h;
    const loom_coll_args_t *a = x->a;
    const size_t es = a->esize, n = a->count;
    loom_status_t st = loom_cuda_gdr_run_group(x->st, a, h->cross, h->M, h->me_cross, x->err);
    if (st == LOOM_SUCCESS)
        st = finish(x);
    for (int k = 0; k < x->size && st == LOOM_SUCCESS; k++)
        for (int m = 0; m < h->M && st == LOOM_SUCCESS && k != x->rank; m++) {
            const size_t at = (size_t)h->grid[m * h->L + k] * n * es;
            st = copy(x, x->recv[x->rank] + at, x->recv[k] + at, n * es);
        }
    return st == LOOM_SUCCESS ? finish(x) : st;
}

/* The hierarchical reduce, local index l, the root at node mr: the steps of
 * run_hier, so the root gets the bits a hierarchical allreduce gives, but
 * into the communicator's GPUDirect accumulator instead of outputs only the
 * root has:
 *  1. local rank l reduces block l of the node's inputs, in local rank
 *     order, into the accumulator;
 *  2. gdr.c's ring reduces it with local rank l of every other node (the same
 *     ring reduce-scatter as the allreduce's, its blocks then sent to node mr
 *     only); there LOOM_AVG divides by the communicator's size, once;
 *  3. after a barrier (every input of the node read: in place, the root's
 *     output is one of them), each rank of node mr copies its block into the
 *     root's output over IPC; a last barrier keeps the root from returning
 *     before they have. */
static loom_status_t run_hier_reduce(const ipc_t *x)
{
    const loom_hier_t *h = x->h;
    const loom_coll_args_t *a = x->a;
    const size_t es = a->esize;
    int mr, lr;
    loom_hier_place(h, a->root, &mr, &lr);
    size_t off, n;
    block_of(x, x->rank, &off, &n);
    char *acc = n ? loom_cuda_gdr_accumulator(x->st, n * es, x->err) : NULL;
    if (n && !acc)
        return LOOM_ERR_NO_MEMORY;
    /* The accumulator is the ring's input and output, as for reduce_scatter,
     * so gdr.c's copies in and out are nothing. */
    loom_status_t st = reduce_across_nodes(x, acc, off, n, 0, mr);
    if (st == LOOM_SUCCESS)
        st = finish(x);
    if (st == LOOM_SUCCESS && h->me_cross == mr)
        st = copy(x, x->recv[lr] + off * es, acc, n * es);
    return st == LOOM_SUCCESS ? finish(x) : st;
}

/* The hierarchical broadcast from the root at node mr, local index lr: local
 * rank lr of every node gets the root's data by GPUDirect RDMA (gdr.c's one
 * step over h->cross, the root being its index mr; the other ranks' calls
 * move nothing and only keep the sequence numbers in step); after a barrier
 * the node's other ranks copy it over IPC from local rank lr's buffer; a last
 * barrier keeps that buffer in place while they read it. */
static loom_status_t run_hier_broadcast(const ipc_t *x)
{
    const loom_hier_t *h = x->h;
    const loom_coll_args_t *a = x->a;
    int mr, lr;
    loom_hier_place(h, a->root, &mr, &lr);
    loom_coll_args_t step = *a;
    step.root = mr;
    step.count = x->rank == lr ? a->count : 0;
    loom_status_t st = loom_cuda_gdr_run_group(x->st, &step, h->cross, h->M, h->me_cross, x->err);
    if (st == LOOM_SUCCESS)
        st = finish(x);
    if (st == LOOM_SUCCESS && x->rank != lr)
        st = copy(x, x->recv[x->rank], x->recv[lr], a->count * a->esize);
    return st == LOOM_SUCCESS ? finish(x) : st;
}

/* One call over IPC: the whole communicator (h NULL), or the hierarchical
 * path with h's local group. */
static loom_status_t ipc_call(loom_cuda_state_t *st, const loom_coll_args_t *a,
                              loom_accel_host_coll_fn run_host, void *host_arg, int may_wait,
                              const loom_hier_t *h, int *done, loom_err_t *err)
{
    *done = 0;
    if (may_wait)
        let_go(st);
    ipc_t x = {.st = st,
               .a = a,
               .run_host = run_host,
               .host_arg = host_arg,
               .err = err,
               .rank = h ? h->l : loom_comm_rank(st->comm),
               .size = h ? h->L : loom_comm_size(st->comm),
               .group = h ? h->local : NULL,
               .h = h,
               .comm_size = loom_comm_size(st->comm)};
    /* Nothing to move on any rank (a count every rank passes alike; not
     * alltoallv's, whose counts are each rank's own). */
    size_t total = a->count;
    for (int k = 0; a->coll == LOOM_COLL_ALLGATHERV && k < x.size; k++)
        total += a->counts[k];
    if (total == 0 && a->coll != LOOM_COLL_ALLTOALLV) {
        *done = 1;
        return LOOM_SUCCESS;
    }
    st->calls++;
    x.send = calloc(2 * (size_t)x.size, sizeof(char *));
    x.sfrom = a->coll == LOOM_COLL_ALLTOALLV ? calloc((size_t)x.size, sizeof(size_t)) : NULL;
    if (!x.send || (a->coll == LOOM_COLL_ALLTOALLV && !x.sfrom)) {
        free(x.sfrom);
        free(x.send);
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory");
    }
    x.recv = x.send + x.size;
    int agreed = 0;
    loom_status_t status = share(&x, &agreed);
    if (status == LOOM_SUCCESS && agreed && h) {
        switch (a->coll) {
        case LOOM_COLL_REDUCE_SCATTER: status = run_hier_reduce_scatter(&x); break;
        case LOOM_COLL_ALLGATHER: status = run_hier_allgather(&x); break;
        case LOOM_COLL_BROADCAST: status = run_hier_broadcast(&x); break;
        case LOOM_COLL_REDUCE: status = run_hier_reduce(&x); break;
        default: status = run_hier(&x); break;
        }
        *done = status == LOOM_SUCCESS;
    } else if (status == LOOM_SUCCESS && agreed) {
        switch (a->coll) {
        case LOOM_COLL_ALLREDUCE: status = run_reduce(&x, -1); break;
        case LOOM_COLL_REDUCE: status = run_reduce(&x, a->root); break;
        case LOOM_COLL_REDUCE_SCATTER: status = run_reduce_scatter(&x); break;
        default: status = run_copies(&x); break;
        }
        *done = status == LOOM_SUCCESS;
    }
    free(x.sfrom);
    free(x.send);
    return status;
}

loom_status_t loom_cuda_ipc_run(loom_cuda_state_t *st, const loom_coll_args_t *a,
                                loom_accel_host_coll_fn run_host, void *host_arg, int may_wait,
                                int *done, loom_err_t *err)
{
    return ipc_call(st, a, run_host, host_arg, may_wait, NULL, done, err);
}

loom_status_t loom_cuda_ipc_hier_run(loom_cuda_state_t *st, const loom_coll_args_t *a,
                                     loom_accel_host_coll_fn run_host, void *host_arg, int may_wait,
                                     int *done, loom_err_t *err)
{
    return ipc_call(st, a, run_host, host_arg, may_wait, &st->hier, done, err);
}
