/* staging.c - collectives on device buffers, through host staging buffers.
 *
 * Each collective runs in passes that move at most chunk_bytes through the
 * host: copy a slice of the device buffers down, run the same collective (or,
 * for reductions, an alltoallv and an allgatherv) on host buffers with the
 * host algorithms, copy the result up. Every pass ends with a sync, so the
 * staging buffers are free again for the next one. Passes are not overlapped
 * with each other: simple and easy to check, at the cost of the copy time
 * (PCIe or C2C) adding to the network time instead of hiding under it.
 *
 * Reductions happen on the device, once per element, in rank order:
 * the pass is cut into size blocks; an alltoallv brings every rank's copy of
 * block r to rank r, which copies them up and reduces them with the kernels
 * ((x0 op x1) op x2 ...), divides for LOOM_AVG, and copies the block down; an
 * allgatherv then hands every block to every rank. The traffic is that of a
 * ring reduce-scatter plus allgather; since one rank computes each element,
 * every rank ends with the same bits.
 *
 * Pass sizes depend only on the arguments, size and chunk_bytes, which every
 * rank shares, so all ranks run the same sequence of host collectives. The
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

static loom_status_t copy(const loom_staging_t *s, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return LOOM_SUCCESS;
    return s->dev->copy2d(s->dev_arg, dst, bytes, src, bytes, bytes, 1, s->err);
}

static loom_status_t copy2d(const loom_staging_t *s, void *dst, size_t dpitch, const void *src,
                            size_t spitch, size_t width, size_t height)
{
    if (width == 0 || height == 0)
        return LOOM_SUCCESS;
    return s->dev->copy2d(s->dev_arg, dst, dpitch, src, spitch, width, height, s->err);
}

static loom_status_t sync_dev(const loom_staging_t *s)
{
    return s->dev->sync(s->dev_arg, s->err);
}

static loom_status_t host(const loom_staging_t *s, const loom_coll_args_t *a)
{
    return s->run_host(s->host_arg, a);
}

/* The size copies of one block, blocks apart in dev_scratch, reduced into out
 * (device memory, may be the scratch itself). */
static loom_status_t reduce_blocks(const loom_staging_t *s, void *out, size_t len, size_t pitch,
                                   loom_dtype_t dt, loom_op_t op)
{
    loom_status_t st;
    if (len == 0)
        return LOOM_SUCCESS;
    if (s->size == 1) /* callers with one rank reduce in place: nothing to combine */
        return LOOM_SUCCESS;
    for (int r = 1; r < s->size; r++) {
        const void *acc = r == 1 ? (const void *)s->dev_scratch : out;
        const char *next = s->dev_scratch + (size_t)r * pitch;
        if ((st = s->dev->reduce3(s->dev_arg, out, acc, next, len, dt, op, s->err)) != LOOM_SUCCESS)
            return st;
    }
    if (op == LOOM_AVG)
        return s->dev->avg(s->dev_arg, out, len, dt, s->size, s->err);
    return LOOM_SUCCESS;
}

/* allreduce (root < 0) or reduce (result at root only). */
static loom_status_t run_allreduce(const loom_staging_t *s, const loom_coll_args_t *a, int root)
{
    const size_t es = a->esize, P = (size_t)s->size, V = vec_elems(es);
    /* chunk_bytes >= 16 * size, so a rank's share of a pass holds at least V. */
    const size_t per_pass = s->chunk_bytes / es / P / V * V * P;
    size_t *scounts = calloc(4 * P, sizeof(size_t));
    if (!scounts)
        return loom_err_set(s->err, LOOM_ERR_NO_MEMORY, "out of memory");
    size_t *sdispls = scounts + P, *rcounts = scounts + 2 * P, *rdispls = scounts + 3 * P;
    loom_status_t st = LOOM_SUCCESS;
    for (size_t off = 0; off < a->count && st == LOOM_SUCCESS; off += per_pass) {
        const size_t m = min_sz(a->count - off, per_pass);
        const size_t b = round_up((m + P - 1) / P, V);
        const size_t mine = clamp_len(m, (size_t)s->rank * b, b);
        for (size_t i = 0; i < P; i++) {
            scounts[i] = clamp_len(m, i * b, b);
            sdispls[i] = i * b;
            rcounts[i] = mine;
            rdispls[i] = i * b;
        }
        if ((st = copy(s, s->host_send, (const char *)a->sendbuf + off * es, m * es)) != LOOM_SUCCESS ||
            (st = sync_dev(s)) != LOOM_SUCCESS)
            break;
        loom_coll_args_t x = {.coll = LOOM_COLL_ALLTOALLV, .sendbuf = s->host_send,
                              .recvbuf = s->host_recv, .esize = es, .dtype = a->dtype,
                              .counts = rcounts, .displs = rdispls, .scounts = scounts,
                              .sdispls = sdispls};
        if ((st = host(s, &x)) != LOOM_SUCCESS)
            break;
        if ((st = copy2d(s, s->dev_scratch, b * es, s->host_recv, b * es, mine * es, P)) != LOOM_SUCCESS ||
            (st = reduce_blocks(s, s->dev_scratch, mine, b * es, a->dtype, a->op)) != LOOM_SUCCESS ||
            (st = copy(s, s->host_send, s->dev_scratch, mine * es)) != LOOM_SUCCESS ||
            (st = sync_dev(s)) != LOOM_SUCCESS)
            break;
        loom_coll_args_t g = {.coll = LOOM_COLL_ALLGATHERV, .sendbuf = s->host_send,
                              .recvbuf = s->host_recv, .count = mine, .esize = es,
                              .dtype = a->dtype, .counts = scounts, .displs = sdispls};
        if ((st = host(s, &g)) != LOOM_SUCCESS)
            break;
        if (root < 0 || root == s->rank) {
            if ((st = copy(s, (char *)a->recvbuf + off * es, s->host_recv, m * es)) != LOOM_SUCCESS ||
                (st = sync_dev(s)) != LOOM_SUCCESS)
                break;
        }
    }
    free(scounts);
    return st;
}

static loom_status_t run_reduce_scatter(const loom_staging_t *s, const loom_coll_args_t *a)
{
    const size_t es = a->esize, P = (size_t)s->size, n = a->count, V = vec_elems(es);
    const size_t per_pass = s->chunk_bytes / es / P / V * V;
    loom_status_t st = LOOM_SUCCESS;
    for (size_t off = 0; off < n; off += per_pass) {
        const size_t k = min_sz(n - off, per_pass), kp = round_up(k, V);
        char *out = (char *)a->recvbuf + off * es;
        if ((st = copy2d(s, s->host_send, k * es, (const char *)a->sendbuf + off * es, n * es,
                         k * es, P)) != LOOM_SUCCESS ||
            (st = sync_dev(s)) != LOOM_SUCCESS)
            return st;
        loom_coll_args_t x = {.coll = LOOM_COLL_ALLTOALL, .sendbuf = s->host_send,
                              .recvbuf = s->host_recv, .count = k, .esize = es,
                              .dtype = a->dtype};
        if ((st = host(s, &x)) != LOOM_SUCCESS)
            return st;
        if (P == 1)
            st = copy(s, out, s->host_recv, k * es);
        else if ((st = copy2d(s, s->dev_scratch, kp * es, s->host_recv, k * es, k * es, P)) ==
                 LOOM_SUCCESS)
            st = reduce_blocks(s, out, k, kp * es, a->dtype, a->op);
        if (st != LOOM_SUCCESS || (st = sync_dev(s)) != LOOM_SUCCESS)
            return st;
    }
    return LOOM_SUCCESS;
}

static loom_status_t run_broadcast(const loom_staging_t *s, const loom_coll_args_t *a)
{
    const size_t es = a->esize, per_pass = s->chunk_bytes / es;
    const int at_root = s->rank == a->root;
    loom_status_t st = LOOM_SUCCESS;
    for (size_t off = 0; off < a->count; off += per_pass) {
        const size_t k = min_sz(a->count - off, per_pass);
        char *dbuf = (char *)a->recvbuf + off * es;
        if (at_root && ((st = copy(s, s->host_send, dbuf, k * es)) != LOOM_SUCCESS ||
                        (st = sync_dev(s)) != LOOM_SUCCESS))
            return st;
        loom_coll_args_t x = {.coll = LOOM_COLL_BROADCAST, .sendbuf = s->host_send,
                              .recvbuf = s->host_send, .count = k, .esize = es,
                              .dtype = a->dtype, .root = a->root};
        if ((st = host(s, &x)) != LOOM_SUCCESS)
            return st;
        if (!at_root && ((st = copy(s, dbuf, s->host_send, k * es)) != LOOM_SUCCESS ||
                         (st = sync_dev(s)) != LOOM_SUCCESS))
            return st;
    }
    return LOOM_SUCCESS;
}

/* allgather, gather, scatter and alltoall: blocks of count elements per rank,
 * each pass covering the same slice [off, off + k) of every block. */
static loom_status_t run_blocked(const loom_staging_t *s, const loom_coll_args_t *a)
{
    const size_t es = a->esize, P = (size_t)s->size, n = a->count;
    const size_t per_pass = s->chunk_bytes / es / P;
    const int at_root = s->rank == a->root;
    /* Which side of the host collective has size blocks (1: a single block). */
    int send_blocks = a->coll == LOOM_COLL_ALLTOALL || a->coll == LOOM_COLL_SCATTER;
    int recv_blocks = a->coll != LOOM_COLL_SCATTER;
    int sends = a->coll != LOOM_COLL_SCATTER || at_root;
    int receives = a->coll != LOOM_COLL_GATHER || at_root;
    loom_status_t st = LOOM_SUCCESS;
    for (size_t off = 0; off < n; off += per_pass) {
        const size_t k = min_sz(n - off, per_pass);
        if (sends && ((st = copy2d(s, s->host_send, k * es, (const char *)a->sendbuf + off * es,
                                   n * es, k * es, send_blocks ? P : 1)) != LOOM_SUCCESS ||
                      (st = sync_dev(s)) != LOOM_SUCCESS))
            return st;
        loom_coll_args_t x = {.coll = a->coll, .sendbuf = sends ? s->host_send : NULL,
                              .recvbuf = receives ? s->host_recv : NULL, .count = k,
                              .esize = es, .dtype = a->dtype, .root = a->root};
        if ((st = host(s, &x)) != LOOM_SUCCESS)
            return st;
        if (receives && ((st = copy2d(s, (char *)a->recvbuf + off * es, n * es, s->host_recv,
                                      k * es, k * es, recv_blocks ? P : 1)) != LOOM_SUCCESS ||
                         (st = sync_dev(s)) != LOOM_SUCCESS))
            return st;
    }
    return LOOM_SUCCESS;
}

/* allgatherv and alltoallv: block i of each side is counts[i] elements at
 * displs[i]; a pass covers [off, off + k) of every block, and lays block i out
 * at i * k in the staging buffers. */
static loom_status_t run_vector(const loom_staging_t *s, const loom_coll_args_t *a)
{
    const size_t es = a->esize, P = (size_t)s->size;
    const size_t k = s->chunk_bytes / es / P;
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
        if ((st = host(s, &m)) != LOOM_SUCCESS)
            return st;
    }
    size_t *arr = calloc(5 * P, sizeof(size_t));
    if (!arr)
        return loom_err_set(s->err, LOOM_ERR_NO_MEMORY, "out of memory");
    size_t *rc = arr, *sc = arr + P, *disp = arr + 2 * P;
    st = LOOM_SUCCESS;
    for (size_t i = 0; i < P; i++)
        disp[i] = i * k;
    for (size_t off = 0; off < longest && st == LOOM_SUCCESS; off += k) {
        for (size_t i = 0; i < P; i++) {
            rc[i] = clamp_len(a->counts[i], off, k);
            sc[i] = is_a2a ? clamp_len(a->scounts[i], off, k) : 0;
        }
        size_t my_count = clamp_len(a->count, off, k);
        if (is_a2a) {
            for (size_t i = 0; i < P && st == LOOM_SUCCESS; i++)
                st = copy(s, s->host_send + i * k * es,
                          (const char *)a->sendbuf + (a->sdispls[i] + off) * es, sc[i] * es);
        } else {
            st = copy(s, s->host_send, (const char *)a->sendbuf + off * es, my_count * es);
        }
        if (st != LOOM_SUCCESS || (st = sync_dev(s)) != LOOM_SUCCESS)
            break;
        loom_coll_args_t x = {.coll = a->coll, .sendbuf = s->host_send, .recvbuf = s->host_recv,
                              .count = my_count, .esize = es, .dtype = a->dtype,
                              .counts = rc, .displs = disp,
                              .scounts = is_a2a ? sc : NULL, .sdispls = is_a2a ? disp : NULL};
        if ((st = host(s, &x)) != LOOM_SUCCESS)
            break;
        for (size_t i = 0; i < P && st == LOOM_SUCCESS; i++)
            st = copy(s, (char *)a->recvbuf + (a->displs[i] + off) * es,
                      s->host_recv + i * k * es, rc[i] * es);
        if (st == LOOM_SUCCESS)
            st = sync_dev(s);
    }
    free(arr);
    return st;
}

loom_status_t loom_staging_run(const loom_staging_t *s, const loom_coll_args_t *a)
{
    if (a->esize == 0 || s->chunk_bytes / a->esize / (size_t)s->size == 0)
        return loom_err_set(s->err, LOOM_ERR_INTERNAL,
                            "GPU staging buffers of %zu bytes are too small for %d ranks",
                            s->chunk_bytes, s->size);
    switch (a->coll) {
    case LOOM_COLL_ALLREDUCE: return run_allreduce(s, a, -1);
    case LOOM_COLL_REDUCE: return run_allreduce(s, a, a->root);
    case LOOM_COLL_REDUCE_SCATTER: return run_reduce_scatter(s, a);
    case LOOM_COLL_BROADCAST: return run_broadcast(s, a);
    case LOOM_COLL_ALLGATHER:
    case LOOM_COLL_GATHER:
    case LOOM_COLL_SCATTER:
    case LOOM_COLL_ALLTOALL: return run_blocked(s, a);
    case LOOM_COLL_ALLGATHERV:
    case LOOM_COLL_ALLTOALLV: return run_vector(s, a);
    case LOOM_COLL_BARRIER: return host(s, a);
    case LOOM_COLL_COUNT: break;
    }
    return loom_err_set(s->err, LOOM_ERR_INTERNAL, "GPU staging: unknown collective %d",
                        (int)a->coll);
}
