/* staging.c - collectives on device buffers, through host staging buffers.
 *
 * Each collective runs in passes that move at most chunk_bytes through the
 * host: copy a slice of the device buffers down, run the same collective (or,
 * for reductions, an alltoallv and an allgatherv) on host buffers with the
 * host algorithms, copy the result up.
 *
 * Passes overlap (run_passes): pass k has its own set of host buffers (k mod
 * LOOM_STAGING_SETS), and while the host collective of pass k runs, the
 * device copies pass k - 1's result up and pass k + 1's slice down, so the
 * copy time (PCIe or C2C) hides under the network time instead of adding to
 * it. Copies down go on one device queue, copies up and kernels on another,
 * so both directions of the bus work at once. A host collective starts only
 * after a wait on the marker behind the copies that fill its buffers; the
 * copies that refill a set wait on the device for the stage that last
 * emptied it, so no set is overwritten while the device still reads it, and
 * the host, which waits for the refill before touching the set, never writes
 * one the device is still reading.
 * A reduction has two host collectives per pass with device work between
 * them; the second runs one step behind the first (pass k's alltoallv, then
 * pass k - 1's allgatherv), so the device reduces pass k while the host runs
 * pass k - 1's allgatherv; the reduction of a pass waits for the previous
 * pass's reduced block to leave the scratch.
 *
 * Reductions happen on the device, once per element, in rank order:
 * the pass is cut into size blocks; an alltoallv brings the other ranks'
 * copies of block r to rank r, which copies them up and reduces them with its
 * own copy, read where it is in the device buffer, with the kernels
 * ((x0 op x1) op x2 ...), divides for LOOM_AVG, and copies the block down; an
 * allgatherv then hands every block to every rank, which copies up the blocks
 * other than its own (reduced straight into the result where it can be). The
 * traffic is that of a ring reduce-scatter plus allgather; since one rank
 * computes each element, every rank ends with the same bits.
 *
 * Pass sizes depend only on the arguments, size and chunk_bytes, which every
 * rank shares, and the order of the host collectives does not depend on
 * overlap, so all ranks run the same sequence of host collectives. The
 * exception is alltoallv, whose counts differ per rank: the number of passes
 * is agreed with a small allreduce first.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_int.h"

static size_t min_sz(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* How much of a block of count elements a pass starting at off covers. */
static size_t clamp_len(size_t count, size_t off, size_t k)
{
    return count > off ? min_sz(count - off, k) : 0;
}

/* Elements per 16 bytes: blocks in dev_scratch start at multiples of it, so the
 * kernels take their vector path. */
static size_t vec_elems(size_t es)
{
    return es < 16 ? 16 / es : 1;
}

static size_t round_up(size_t x, size_t to)
{
    return (x + to - 1) / to * to;
}

/* Copies to the host go on LOOM_DEV_DOWN, all others on LOOM_DEV_UP. */
static loom_status_t copy(const loom_staging_t *s, int q, void *dst, const void *src,
                          size_t bytes)
{
    if (bytes == 0)
        return LOOM_SUCCESS;
    return s->dev->copy2d(s->dev_arg, q, dst, bytes, src, bytes, bytes, 1, s->err);
}

static loom_status_t copy2d(const loom_staging_t *s, int q, void *dst, size_t dpitch,
                            const void *src, size_t spitch, size_t width, size_t height)
{
    if (width == 0 || height == 0)
        return LOOM_SUCCESS;
    return s->dev->copy2d(s->dev_arg, q, dst, dpitch, src, spitch, width, height, s->err);
}

static loom_status_t host(const loom_staging_t *s, const loom_coll_args_t *a)
{
    return s->run_host(s->host_arg, a);
}

/* ---- passes ---------------------------------------------------------------- */

typedef struct staged staged_t;
typedef loom_status_t (*device_fn)(const staged_t *c, size_t pass, int stage,
                                   const loom_staging_set_t *set);
typedef loom_status_t (*host_fn)(const staged_t *c, size_t pass, int step,
                                 const loom_staging_set_t *set);

/* A collective as passes: device stage 0 fills a set's buffers, host step h
 * runs the h-th host collective of the pass, device stage h + 1 follows it. */
struct staged {
    const loom_staging_t *s;
    const loom_coll_args_t *a;
    size_t passes, per_pass;
    int steps;                        /* host collectives per pass: 1 or 2 */
    int root;                         /* reductions: -1 allreduce, else reduce's root */
    size_t *arr;                      /* counts and displacements of a host step */
    device_fn device;
    host_fn host;
};

static const loom_staging_set_t *set_of(const staged_t *c, size_t pass)
{
    return &c->s->sets[pass % LOOM_STAGING_SETS];
}

/* Stages 0-2, and 3: inside stage 1 of a reduction, after its kernels. */
static int mark_slot(size_t pass, int stage)
{
    return (int)(pass % LOOM_STAGING_SETS) * 4 + stage;
}

/* The queue a stage ends on: the last one copies up, the others down. */
static int stage_queue(const staged_t *c, int st)
{
    return st == c->steps ? LOOM_DEV_UP : LOOM_DEV_DOWN;
}

/* Queue a device stage and the marker behind it; without overlap, wait for
 * it. The copies down into a set wait on the device for the last stage of
 * the pass that used the set before, which ran on the other queue and may
 * still read its buffers (the host waits for the copies down before it
 * writes the set, so that covers the host too). */
static loom_status_t stage(const staged_t *c, size_t pass, int st)
{
    const loom_staging_t *s = c->s;
    const int q = stage_queue(c, st);
    loom_status_t r = LOOM_SUCCESS;
    if (st == 0 && pass >= LOOM_STAGING_SETS)
        r = s->dev->order(s->dev_arg, q, mark_slot(pass - LOOM_STAGING_SETS, c->steps), s->err);
    if (r == LOOM_SUCCESS)
        r = c->device(c, pass, st, set_of(c, pass));
    if (r == LOOM_SUCCESS)
        r = s->dev->mark(s->dev_arg, q, mark_slot(pass, st), s->err);
    if (r == LOOM_SUCCESS && !s->overlap)
        r = s->dev->wait(s->dev_arg, mark_slot(pass, st), s->err);
    return r;
}

/* Round t runs host step h of pass t - h, each after a wait for the device
 * stage before it and followed by queuing the stage after it, then queues
 * the copies down of the pass two ahead (one ahead without overlap), whose
 * set was last used by pass t - 1: its host steps are done, and its last
 * device stage is queued ahead of the refill. */
static loom_status_t run_passes(staged_t *c, size_t count, size_t per_pass, device_fn dev,
                                host_fn on_host)
{
    const loom_staging_t *s = c->s;
    c->per_pass = per_pass;
    c->passes = (count + per_pass - 1) / per_pass;
    c->device = dev;
    c->host = on_host;
    const size_t n = c->passes, ahead = s->overlap ? 2 : 1;
    loom_status_t r = LOOM_SUCCESS;
    for (size_t k = 0; k < n && k < ahead && r == LOOM_SUCCESS; k++)
        r = stage(c, k, 0);
    for (size_t t = 0; t + 1 < n + (size_t)c->steps && r == LOOM_SUCCESS; t++) {
        for (int h = 0; h < c->steps && r == LOOM_SUCCESS; h++) {
            if (t < (size_t)h || t - (size_t)h >= n)
                continue;
            const size_t k = t - (size_t)h;
            if ((r = s->dev->wait(s->dev_arg, mark_slot(k, h), s->err)) == LOOM_SUCCESS &&
                (r = c->host(c, k, h, set_of(c, k))) == LOOM_SUCCESS)
                r = stage(c, k, h + 1);
        }
        if (r == LOOM_SUCCESS && t + ahead < n)
            r = stage(c, t + ahead, 0);
    }
    if (r == LOOM_SUCCESS)
        r = s->dev->sync(s->dev_arg, s->err);
    return r;
}

/* ---- reductions ------------------------------------------------------------ */

/* The size copies of one block, blocks apart in dev_scratch, reduced into out
 * (device memory, may be the scratch itself). own: this rank's copy where it
 * already is on the device (its place in the scratch is not read), or NULL. */
static loom_status_t reduce_blocks(const loom_staging_t *s, void *out, const void *own,
                                   size_t len, size_t pitch, loom_dtype_t dt, loom_op_t op)
{
    loom_status_t st;
    if (len == 0)
        return LOOM_SUCCESS;
    if (s->size == 1) /* one rank: callers put its block in place */
        return LOOM_SUCCESS;
    for (int r = 1; r < s->size; r++) {
        const void *first = own && s->rank == 0 ? own : (const void *)s->dev_scratch;
        const void *acc = r == 1 ? first : out;
        const void *next = own && s->rank == r ? own : s->dev_scratch + (size_t)r * pitch;
        if ((st = s->dev->reduce3(s->dev_arg, out, acc, next, len, dt, op, s->err)) != LOOM_SUCCESS)
            return st;
    }
    if (op == LOOM_AVG)
        return s->dev->avg(s->dev_arg, out, len, dt, s->size, s->err);
    return LOOM_SUCCESS;
}

/* allreduce and reduce: a pass covers m elements, cut into size blocks of b
 * (a multiple of the vector width); this rank reduces the mine of block rank. */
typedef struct {
    size_t off, m, b, mine;
} ar_pass_t;

static ar_pass_t ar_pass(const staged_t *c, size_t pass)
{
    const size_t P = (size_t)c->s->size, V = vec_elems(c->a->esize);
    ar_pass_t p;
    p.off = pass * c->per_pass;
    p.m = min_sz(c->a->count - p.off, c->per_pass);
    p.b = round_up((p.m + P - 1) / P, V);
    p.mine = clamp_len(p.m, (size_t)c->s->rank * p.b, p.b);
    return p;
}

static loom_status_t ar_device(const staged_t *c, size_t pass, int st,
                               const loom_staging_set_t *set)
{
    const loom_staging_t *s = c->s;
    const loom_coll_args_t *a = c->a;
    const size_t es = a->esize, P = (size_t)s->size;
    const ar_pass_t p = ar_pass(c, pass);
    loom_status_t r;
    /* This rank's own block stays on the device: it is neither copied down
     * nor sent to itself, and the reduction reads it where it is. */
    const size_t me = (size_t)s->rank, before = min_sz(p.m, me * p.b),
                 after = min_sz(p.m, (me + 1) * p.b);
    const char *own = p.mine ? (const char *)a->sendbuf + (p.off + me * p.b) * es : NULL;
    /* Where a rank that keeps the result reduces its block: into the result
     * itself, so it need not come back up after the allgatherv. Not in place
     * past rank 1, where the first steps would overwrite the own copy before
     * the reduction reaches it. */
    const int direct = p.mine && (c->root < 0 || c->root == s->rank) &&
                       (a->sendbuf != a->recvbuf || me <= 1);
    char *res = direct ? (char *)a->recvbuf + (p.off + me * p.b) * es : s->dev_scratch;
    switch (st) {
    case 0:
        if ((r = copy(s, LOOM_DEV_DOWN, set->send, (const char *)a->sendbuf + p.off * es,
                      before * es)) != LOOM_SUCCESS)
            return r;
        return copy(s, LOOM_DEV_DOWN, set->send + after * es,
                    (const char *)a->sendbuf + (p.off + after) * es, (p.m - after) * es);
    case 1:
        /* The scratch is free once the previous pass's block was copied down. */
        if ((pass > 0 &&
             (r = s->dev->order(s->dev_arg, LOOM_DEV_UP, mark_slot(pass - 1, 1), s->err)) !=
                 LOOM_SUCCESS) ||
            (r = copy2d(s, LOOM_DEV_UP, s->dev_scratch, p.b * es, set->recv, p.b * es,
                        p.mine * es, me)) != LOOM_SUCCESS ||
            (r = copy2d(s, LOOM_DEV_UP, s->dev_scratch + (me + 1) * p.b * es, p.b * es,
                        set->recv + (me + 1) * p.b * es, p.b * es, p.mine * es, P - me - 1)) !=
                LOOM_SUCCESS)
            return r;
        if (P == 1)
            r = res == own ? LOOM_SUCCESS : copy(s, LOOM_DEV_UP, res, own, p.mine * es);
        else
            r = reduce_blocks(s, res, own, p.mine, p.b * es, a->dtype, a->op);
        if (r != LOOM_SUCCESS ||
            (r = s->dev->mark(s->dev_arg, LOOM_DEV_UP, mark_slot(pass, 3), s->err)) !=
                LOOM_SUCCESS ||
            (r = s->dev->order(s->dev_arg, LOOM_DEV_DOWN, mark_slot(pass, 3), s->err)) !=
                LOOM_SUCCESS)
            return r;
        return copy(s, LOOM_DEV_DOWN, set->send, res, p.mine * es);
    default:
        if (c->root >= 0 && c->root != s->rank)
            return LOOM_SUCCESS;
        if (!direct)
            return copy(s, LOOM_DEV_UP, (char *)a->recvbuf + p.off * es, set->recv, p.m * es);
        if ((r = copy(s, LOOM_DEV_UP, (char *)a->recvbuf + p.off * es, set->recv, before * es)) !=
            LOOM_SUCCESS)
            return r;
        return copy(s, LOOM_DEV_UP, (char *)a->recvbuf + (p.off + after) * es,
                    set->recv + after * es, (p.m - after) * es);
    }
}

/* Step 0: the alltoallv that brings block r of every rank to rank r; step 1:
 * the allgatherv of the reduced blocks. */
static loom_status_t ar_host(const staged_t *c, size_t pass, int step,
                             const loom_staging_set_t *set)
{
    const size_t P = (size_t)c->s->size;
    const ar_pass_t p = ar_pass(c, pass);
    size_t *scounts = c->arr, *sdispls = c->arr + P, *rcounts = c->arr + 2 * P,
           *rdispls = c->arr + 3 * P;
    for (size_t i = 0; i < P; i++) {
        scounts[i] = clamp_len(p.m, i * p.b, p.b);
        sdispls[i] = i * p.b;
        rcounts[i] = p.mine;
        rdispls[i] = i * p.b;
    }
    /* The alltoallv leaves out what a rank would send itself (ar_device). */
    if (step == 0)
        scounts[c->s->rank] = rcounts[c->s->rank] = 0;
    loom_coll_args_t x = {.sendbuf = set->send, .recvbuf = set->recv, .esize = c->a->esize,
                          .dtype = c->a->dtype, .displs = step ? sdispls : rdispls};
    if (step == 0) {
        x.coll = LOOM_COLL_ALLTOALLV;
        x.counts = rcounts;
        x.scounts = scounts;
        x.sdispls = sdispls;
    } else {
        x.coll = LOOM_COLL_ALLGATHERV;
        x.count = p.mine;
        x.counts = scounts;
    }
    return host(c->s, &x);
}

/* allreduce (root < 0) or reduce (result at root only). */
static loom_status_t run_allreduce(staged_t *c, int root)
{
    const size_t es = c->a->esize, P = (size_t)c->s->size, V = vec_elems(es);
    c->steps = 2;
    c->root = root;
    /* chunk_bytes >= 16 * size, so a rank's share of a pass holds at least V. */
    return run_passes(c, c->a->count, c->s->chunk_bytes / es / P / V * V * P, ar_device, ar_host);
}

static loom_status_t rs_device(const staged_t *c, size_t pass, int st,
                               const loom_staging_set_t *set)
{
    const loom_staging_t *s = c->s;
    const loom_coll_args_t *a = c->a;
    const size_t es = a->esize, P = (size_t)s->size, n = a->count;
    const size_t off = pass * c->per_pass, k = min_sz(n - off, c->per_pass);
    const size_t kp = round_up(k, vec_elems(es));
    char *out = (char *)a->recvbuf + off * es;
    loom_status_t r;
    if (st == 0)
        return copy2d(s, LOOM_DEV_DOWN, set->send, k * es, (const char *)a->sendbuf + off * es,
                      n * es, k * es, P);
    if (P == 1)
        return copy(s, LOOM_DEV_UP, out, set->recv, k * es);
    if ((r = copy2d(s, LOOM_DEV_UP, s->dev_scratch, kp * es, set->recv, k * es, k * es, P)) !=
        LOOM_SUCCESS)
        return r;
    return reduce_blocks(s, out, NULL, k, kp * es, a->dtype, a->op);
}

/* ---- data movement ---------------------------------------------------------- */

/* The root copies its slice down before, the others copy theirs up after a
 * broadcast done in place in the set's send buffer. */
static loom_status_t bc_device(const staged_t *c, size_t pass, int st,
                               const loom_staging_set_t *set)
{
    const loom_coll_args_t *a = c->a;
    const size_t es = a->esize, off = pass * c->per_pass, k = min_sz(a->count - off, c->per_pass);
    char *dbuf = (char *)a->recvbuf + off * es;
    if ((c->s->rank == a->root) != (st == 0))
        return LOOM_SUCCESS;
    return st == 0 ? copy(c->s, LOOM_DEV_DOWN, set->send, dbuf, k * es)
                   : copy(c->s, LOOM_DEV_UP, dbuf, set->send, k * es);
}


/* allgather, gather, scatter and alltoall: blocks of count elements per rank,
 * each pass covering the same slice [off, off + k) of every block. Which side
 * of the host collective has size blocks (else a single block), and whether
 * this rank sends and receives at all: */
static int blocked_sends(const staged_t *c)
{
    return c->a->coll != LOOM_COLL_SCATTER || c->s->rank == c->a->root;
}

static int blocked_receives(const staged_t *c)
{
    return c->a->coll != LOOM_COLL_GATHER || c->s->rank == c->a->root;
}

static loom_status_t blocked_device(const staged_t *c, size_t pass, int st,
                                    const loom_staging_set_t *set)
{
    const loom_coll_args_t *a = c->a;
    const size_t es = a->esize, P = (size_t)c->s->size, n = a->count;
    const size_t off = pass * c->per_pass, k = min_sz(n - off, c->per_pass);
    if (st == 0) {
        int send_blocks = a->coll == LOOM_COLL_ALLTOALL || a->coll == LOOM_COLL_SCATTER;
        if (!blocked_sends(c))
            return LOOM_SUCCESS;
        return copy2d(c->s, LOOM_DEV_DOWN, set->send, k * es,
                      (const char *)a->sendbuf + off * es, n * es, k * es, send_blocks ? P : 1);
    }
    if (!blocked_receives(c))
        return LOOM_SUCCESS;
    return copy2d(c->s, LOOM_DEV_UP, (char *)a->recvbuf + off * es, n * es, set->recv, k * es,
                  k * es, a->coll != LOOM_COLL_SCATTER ? P : 1);
}


/* The host collective of a pass of reduce_scatter (an alltoall), broadcast
 * (in place in the send buffer) and the blocked collectives. */
static loom_status_t slice_host(const staged_t *c, size_t pass, int step,
                                const loom_staging_set_t *set)
{
    (void)step;
    const loom_coll_args_t *a = c->a;
    const size_t off = pass * c->per_pass;
    loom_coll_args_t x = {.coll = a->coll, .sendbuf = set->send, .recvbuf = set->recv,
                          .count = min_sz(a->count - off, c->per_pass), .esize = a->esize,
                          .dtype = a->dtype, .root = a->root};
    switch (a->coll) {
    case LOOM_COLL_REDUCE_SCATTER: x.coll = LOOM_COLL_ALLTOALL; break;
    case LOOM_COLL_BROADCAST: x.recvbuf = set->send; break;
    default:
        if (!blocked_sends(c))
            x.sendbuf = NULL;
        if (!blocked_receives(c))
            x.recvbuf = NULL;
        break;
    }
    return host(c->s, &x);
}

/* allgatherv and alltoallv: block i of each side is counts[i] elements at
 * displs[i]; a pass covers [off, off + k) of every block, and lays block i out
 * at i * k in the staging buffers. */
static loom_status_t vector_device(const staged_t *c, size_t pass, int st,
                                   const loom_staging_set_t *set)
{
    const loom_coll_args_t *a = c->a;
    const size_t es = a->esize, P = (size_t)c->s->size, k = c->per_pass, off = pass * k;
    loom_status_t r = LOOM_SUCCESS;
    if (st == 1) {
        for (size_t i = 0; i < P && r == LOOM_SUCCESS; i++)
            r = copy(c->s, LOOM_DEV_UP, (char *)a->recvbuf + (a->displs[i] + off) * es,
                     set->recv + i * k * es, clamp_len(a->counts[i], off, k) * es);
    } else if (a->coll == LOOM_COLL_ALLTOALLV) {
        for (size_t i = 0; i < P && r == LOOM_SUCCESS; i++)
            r = copy(c->s, LOOM_DEV_DOWN, set->send + i * k * es,
                     (const char *)a->sendbuf + (a->sdispls[i] + off) * es,
                     clamp_len(a->scounts[i], off, k) * es);
    } else {
        r = copy(c->s, LOOM_DEV_DOWN, set->send, (const char *)a->sendbuf + off * es,
                 clamp_len(a->count, off, k) * es);
    }
    return r;
}

static loom_status_t vector_host(const staged_t *c, size_t pass, int step,
                                 const loom_staging_set_t *set)
{
    (void)step;
    const loom_coll_args_t *a = c->a;
    const size_t P = (size_t)c->s->size, k = c->per_pass, off = pass * k;
    const int is_a2a = a->coll == LOOM_COLL_ALLTOALLV;
    size_t *rc = c->arr, *sc = c->arr + P, *disp = c->arr + 2 * P;
    for (size_t i = 0; i < P; i++) {
        rc[i] = clamp_len(a->counts[i], off, k);
        sc[i] = is_a2a ? clamp_len(a->scounts[i], off, k) : 0;
        disp[i] = i * k;
    }
    loom_coll_args_t x = {.coll = a->coll, .sendbuf = set->send, .recvbuf = set->recv,
                          .count = clamp_len(a->count, off, k), .esize = a->esize,
                          .dtype = a->dtype, .counts = rc, .displs = disp,
                          .scounts = is_a2a ? sc : NULL, .sdispls = is_a2a ? disp : NULL};
    return host(c->s, &x);
}

static loom_status_t run_vector(staged_t *c)
{
    const loom_coll_args_t *a = c->a;
    const size_t P = (size_t)c->s->size;
    const int is_a2a = a->coll == LOOM_COLL_ALLTOALLV;
    loom_status_t st;
    uint64_t longest = 0;
    for (size_t i = 0; i < P; i++) {
        if (a->counts[i] > longest)
            longest = a->counts[i];
        if (is_a2a && a->scounts[i] > longest)
            longest = a->scounts[i];
    }
    if (is_a2a) {
        uint64_t mine = longest;
        loom_coll_args_t m = {.coll = LOOM_COLL_ALLREDUCE, .sendbuf = &mine, .recvbuf = &longest,
                              .count = 1, .esize = sizeof(uint64_t), .dtype = LOOM_UINT64,
                              .op = LOOM_MAX};
        if ((st = host(c->s, &m)) != LOOM_SUCCESS)
            return st;
    }
    return run_passes(c, (size_t)longest, c->s->chunk_bytes / a->esize / P, vector_device,
                      vector_host);
}

loom_status_t loom_staging_run(const loom_staging_t *s, const loom_coll_args_t *a)
{
    if (a->esize == 0 || s->chunk_bytes / a->esize / (size_t)s->size == 0)
        return loom_err_set(s->err, LOOM_ERR_INTERNAL,
                            "GPU staging buffers of %zu bytes are too small for %d ranks",
                            s->chunk_bytes, s->size);
    if (a->coll == LOOM_COLL_BARRIER)
        return host(s, a);
    if ((unsigned)a->coll >= (unsigned)LOOM_COLL_COUNT)
        return loom_err_set(s->err, LOOM_ERR_INTERNAL, "GPU staging: unknown collective %d",
                            (int)a->coll);
    staged_t c = {.s = s, .a = a, .steps = 1, .root = -1,
                  .arr = calloc(4 * (size_t)s->size, sizeof(size_t))};
    if (!c.arr)
        return loom_err_set(s->err, LOOM_ERR_NO_MEMORY, "out of memory");
    /* Elements per pass: of each block where a pass takes a slice of size
     * blocks (reduce_scatter's rounded for the kernels' vector path). */
    const size_t es = a->esize, per_block = s->chunk_bytes / es / (size_t)s->size,
                 V = vec_elems(es);
    loom_status_t st;
    switch (a->coll) {
    case LOOM_COLL_ALLREDUCE: st = run_allreduce(&c, -1); break;
    case LOOM_COLL_REDUCE: st = run_allreduce(&c, a->root); break;
    case LOOM_COLL_REDUCE_SCATTER:
        st = run_passes(&c, a->count, per_block / V * V, rs_device, slice_host);
        break;
    case LOOM_COLL_BROADCAST:
        st = run_passes(&c, a->count, s->chunk_bytes / es, bc_device, slice_host);
        break;
    case LOOM_COLL_ALLGATHERV:
    case LOOM_COLL_ALLTOALLV: st = run_vector(&c); break;
    default:   /* allgather, gather, scatter, alltoall */
        st = run_passes(&c, a->count, per_block, blocked_device, slice_host);
        break;
    }
    free(c.arr);
    return st;
}
