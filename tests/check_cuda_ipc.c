/* check_cuda_ipc - collectives on GPU buffers GPU to GPU inside a node (cuda/ipc.c)
 * without a GPU: 2 and 4 forked ranks of one node over the CUDA double, whose
 * IPC handles map another process's device memory (tests/cuda-double/).
 *
 * Every collective the IPC path takes (allreduce, reduce, broadcast, allgather,
 * reduce_scatter, gather, scatter, allgatherv, alltoall, alltoallv) runs on GPU
 * buffers for several element types (float16 and bfloat16 among them), counts
 * (0, 1, odd, large), ops, roots (gather and scatter: 0 and the last rank), in
 * place and out of place, and must give the bytes the same call gives on host
 * buffers. The inputs of reductions are small integers, exact in every type,
 * so the host algorithms' order of reduction does not matter; those of the
 * data movement collectives are bytes that differ from piece to piece, so a
 * piece taken from the wrong place shows. allgatherv and alltoallv have
 * uneven counts with zeros among them, laid out in reverse rank order with
 * gaps the call must leave alone. A float32 allreduce of inexact values must
 * give, on every rank, exactly the sum in rank order. The double's counters
 * prove the path: over IPC no byte crosses between host and device during a
 * call (alltoall(v) in place: staged, so some must), and each peer allocation
 * is opened once, only by the ranks that read it (and closed when the last
 * communicator holding it goes); with LOOM_CUDA_IPC=0, or ranks on two nodes
 * (LOOM_MP_NODES), the same matrix is staged through host memory. The IPC
 * runs are repeated in the double's lazy mode, where device work runs only
 * when the host waits for it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-double/cuda_double.h"
#include "loom.h"
#include "mp_cuda_util.h"
#include "mp_util.h"

typedef enum { MODE_IPC, MODE_IPC_LAZY, MODE_STAGED, MODE_TWO_NODES } mode_t_;

/* ---- device buffers ------------------------------------------------------- */

/* The send buffer starts this far into its allocation, so offsets travel too. */
#define SEND_OFF 256

typedef struct {
    char *sbase, *r;     /* device */
    char *hs, *hr, *ref; /* host: inputs, results, the host collective's results */
    char *up;            /* pinned: the inputs to upload, send then recv */
    size_t bytes;
} bufs_t;

typedef struct {
    int coll;
    int in_place, root;
    loom_op_t op;
    size_t dti, count;
} case_t;

/* ---- the v-collectives' layouts -------------------------------------------- */

#define MAXP 4

/* Elements rank from sends rank to (allgatherv: to 0) for count n: uneven,
 * a third of them 0; symmetric for alltoallv in place, where what a rank
 * sends to j is what it receives from j. */
static size_t vcount(const case_t *k, int from, int to)
{
    const int sym = k->coll == ALLTOALLV && k->in_place, s = sym ? from + to : from + 2 * to;
    if (k->count == 0 || s % 3 == 1)
        return 0;
    return k->count + (size_t)((sym ? s * 3 : from * 7 + to * 3) % 5);
}

/* Pieces of cnt laid out in reverse rank order, gap elements before each;
 * returns the extent. */
static size_t reverse_layout(const size_t *cnt, size_t *disp, int P, size_t gap)
{
    size_t at = 0;
    for (int j = P - 1; j >= 0; j--) {
        at += gap;
        disp[j] = at;
        at += cnt[j];
    }
    return at;
}

typedef struct {
    size_t sc[MAXP], sd[MAXP], rc[MAXP], rd[MAXP]; /* send and receive counts, displs */
    size_t in_n, out_n; /* elements of the input and of the output (their extents) */
} layout_t;

/* Whether this rank calls k in place (gather and scatter: the root only). */
static int my_in_place(loom_comm_t c, const case_t *k)
{
    return k->in_place &&
           ((k->coll != GATHER && k->coll != SCATTER) || loom_comm_rank(c) == k->root);
}

static void layout(loom_comm_t c, const case_t *k, layout_t *L)
{
    const int P = loom_comm_size(c), me = loom_comm_rank(c), root = me == k->root;
    const size_t n = k->count, nP = n * (size_t)P;
    memset(L, 0, sizeof(*L));
    switch (k->coll) {
    case REDUCE_SCATTER: L->in_n = nP, L->out_n = n; break;
    case ALLGATHER: L->in_n = n, L->out_n = nP; break;
    case GATHER: L->in_n = n, L->out_n = root ? nP : 0; break;
    case SCATTER: /* in place at the root: the output is the input, untouched */
        L->in_n = root ? nP : 0, L->out_n = my_in_place(c, k) ? nP : n;
        break;
    case ALLTOALL: L->in_n = L->out_n = nP; break;
    case ALLGATHERV:
        for (int j = 0; j < P; j++)
            L->rc[j] = vcount(k, j, 0);
        L->out_n = reverse_layout(L->rc, L->rd, P, 1);
        L->in_n = L->rc[me];
        break;
    case ALLTOALLV:
        for (int j = 0; j < P; j++)
            L->sc[j] = vcount(k, me, j), L->rc[j] = vcount(k, j, me);
        L->in_n = reverse_layout(L->sc, L->sd, P, 2);
        L->out_n = reverse_layout(L->rc, L->rd, P, 1);
        if (k->in_place) /* what it sends is where it receives */
            L->in_n = L->out_n;
        break;
    default: L->in_n = L->out_n = n; break;
    }
}

/* One collective on send/recv (host or device, same layout); LOOM_IN_PLACE in place. */
static loom_status_t run(loom_comm_t c, const case_t *k, const void *s, void *r)
{
    loom_dtype_t dt = dtypes[k->dti].dt;
    const int ip = my_in_place(c, k);
    const void *in = ip ? LOOM_IN_PLACE : s;
    layout_t L;
    layout(c, k, &L);
    switch (k->coll) {
    case ALLREDUCE: return loom_allreduce(in, r, k->count, dt, k->op, c);
    case REDUCE: return loom_reduce(in, r, k->count, dt, k->op, k->root, c);
    case BROADCAST: return loom_broadcast(r, k->count, dt, k->root, c);
    case ALLGATHER: return loom_allgather(in, r, k->count, dt, c);
    case GATHER: return loom_gather(in, r, k->count, dt, k->root, c);
    case SCATTER:
        return loom_scatter(ip ? r : s, ip ? (void *)LOOM_IN_PLACE : r, k->count, dt, k->root, c);
    case ALLGATHERV: return loom_allgatherv(in, L.rc[loom_comm_rank(c)], r, L.rc, L.rd, dt, c);
    case ALLTOALL: return loom_alltoall(in, r, k->count, dt, c);
    case ALLTOALLV: return loom_alltoallv(in, L.sc, L.sd, r, L.rc, L.rd, dt, c);
    default: return loom_reduce_scatter(in, r, k->count, dt, k->op, c);
    }
}

/* Byte i of rank me's input to a data movement collective: different from
 * piece to piece and rank to rank, so a piece from the wrong place shows. */
static unsigned char moved_byte(size_t i, int me)
{
    uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)(me + 1) * 40503u;
    return (unsigned char)(h >> 13);
}

/* Fill the input where the call reads it: sendbuf out of place, else recvbuf
 * (where this rank's piece goes). Returns the bytes of the output to compare. */
static size_t fill(loom_comm_t c, const case_t *k, char *s, char *r)
{
    const int me = loom_comm_rank(c);
    const size_t es = dtypes[k->dti].es, n = k->count;
    const loom_dtype_t dt = dtypes[k->dti].dt;
    layout_t L;
    layout(c, k, &L);
    char *to = my_in_place(c, k) ? r : s;
    if (my_in_place(c, k) && (k->coll == ALLGATHER || k->coll == GATHER))
        to = r + (size_t)me * n * es;
    if (my_in_place(c, k) && k->coll == ALLGATHERV)
        to = r + L.rd[me] * es;
    if (k->coll == BROADCAST)
        to = r;
    memset(r, 0x6b, (L.out_n > L.in_n ? L.out_n : L.in_n) * es);
    if (k->coll == BROADCAST && me != k->root)
        return L.out_n * es;
    if (k->coll == ALLREDUCE || k->coll == REDUCE || k->coll == REDUCE_SCATTER)
        for (size_t i = 0; i < L.in_n; i++)
            put(to, i, dt, me);
    else /* data movement: any bytes */
        for (size_t i = 0; i < L.in_n * es; i++)
            to[i] = (char)moved_byte(i, me);
    return L.out_n * es;
}

/* alltoall(v) in place: staged by every rank (the IPC path does not cover it). */
static int staged_case(const case_t *k)
{
    return k->in_place && (k->coll == ALLTOALL || k->coll == ALLTOALLV);
}

static void one_case(loom_comm_t c, const case_t *k, bufs_t *b, mode_t_ mode,
                     cuda_double_counts_t *moved)
{
    const int me = loom_comm_rank(c);
    /* Host reference. */
    size_t out_bytes = fill(c, k, b->hs, b->ref);
    loom_status_t st = run(c, k, b->hs, b->ref);
    if (st != LOOM_SUCCESS) {
        mp_bad(c, "%s host: %s", coll_names[k->coll], loom_comm_last_error(c));
        return;
    }
    /* The same on the device. */
    fill(c, k, b->up, b->up + b->bytes);
    /* Uploads left queued on the default stream: the call must wait for them
     * (the lazy double runs them only when someone waits). */
    if (!cuda_ok(c,
                 cudaMemcpyAsync(b->sbase + SEND_OFF, b->up, b->bytes, cudaMemcpyHostToDevice, 0),
                 "upload") ||
        !cuda_ok(c, cudaMemcpyAsync(b->r, b->up + b->bytes, b->bytes, cudaMemcpyHostToDevice, 0),
                 "upload"))
        return;
    cuda_double_counts_t before, after;
    cuda_double_counts(&before);
    st = run(c, k, b->sbase + SEND_OFF, b->r);
    cuda_double_counts(&after);
    if (st != LOOM_SUCCESS) {
        mp_bad(c, "%s GPU: %s", coll_names[k->coll], loom_comm_last_error(c));
        return;
    }
    const int ipc = mode == MODE_IPC || mode == MODE_IPC_LAZY;
    if (!staged_case(k))
        counts_since(moved, &before, &after);
    if (ipc && !staged_case(k) && (after.h2d != before.h2d || after.d2h != before.d2h))
        mp_bad(c, "%s %s count %zu: %ld copies to and %ld from the host over IPC",
               coll_names[k->coll], dtypes[k->dti].name, k->count, after.h2d - before.h2d,
               after.d2h - before.d2h);
    if (ipc && staged_case(k) && k->count > 0 && after.h2d == before.h2d)
        mp_bad(c, "%s in place %s count %zu: not staged", coll_names[k->coll], dtypes[k->dti].name,
               k->count);
    if (!cuda_ok(c, cudaMemcpy(b->hr, b->r, b->bytes, cudaMemcpyDeviceToHost), "download"))
        return;
    if ((k->coll == REDUCE || k->coll == GATHER) && me != k->root)
        return;
    same_bytes(c, coll_names[k->coll], k->dti, k->op, k->root, k->count, k->in_place, b->hr, b->ref,
               out_bytes);
}

/* A float32 sum of inexact values: every rank must get ((x0 + x1) + x2) + ... */
static void rank_order(loom_comm_t c, bufs_t *b)
{
    const int P = loom_comm_size(c), me = loom_comm_rank(c);
    const size_t n = 3001;
    float *hs = (float *)b->hs, *hr = (float *)b->hr;
    for (int in_place = 0; in_place < 2; in_place++) {
        for (size_t i = 0; i < n; i++)
            (in_place ? hr : hs)[i] = 1.0f / (float)(3 + me * 7 + (int)(i % 13));
        if (!cuda_ok(c, cudaMemcpy(b->sbase + SEND_OFF, hs, n * 4, cudaMemcpyHostToDevice),
                     "upload") ||
            !cuda_ok(c, cudaMemcpy(b->r, hr, n * 4, cudaMemcpyHostToDevice), "upload"))
            return;
        if (loom_allreduce(in_place ? LOOM_IN_PLACE : b->sbase + SEND_OFF, b->r, n, LOOM_FLOAT32,
                           LOOM_SUM, c) != LOOM_SUCCESS) {
            mp_bad(c, "allreduce: %s", loom_comm_last_error(c));
            return;
        }
        if (!cuda_ok(c, cudaMemcpy(hr, b->r, n * 4, cudaMemcpyDeviceToHost), "download"))
            return;
        for (size_t i = 0; i < n; i++) {
            float want = 1.0f / (float)(3 + (int)(i % 13));
            for (int r = 1; r < P; r++)
                want = want + 1.0f / (float)(3 + r * 7 + (int)(i % 13));
            if (memcmp(&want, &hr[i], 4) != 0) {
                mp_bad(c, "rank-order float32 sum %s: element %zu is %.9g, want %.9g",
                       in_place ? "in place" : "out of place", i, hr[i], want);
                break;
            }
        }
    }
}

/* Peer allocations a rank of a new communicator opens for one call of a
 * data movement collective: those it reads from, no more. */
static long want_opens(loom_comm_t c, const case_t *k)
{
    const int P = loom_comm_size(c), me = loom_comm_rank(c);
    layout_t L;
    layout(c, k, &L);
    long n = 0;
    for (int j = 0; j < P; j++)
        if (j != me)
            switch (k->coll) {
            case GATHER: n += me == k->root; break;
            case SCATTER: n += j == k->root; break;
            case ALLGATHERV:
            case ALLTOALLV: n += L.rc[j] > 0; break;
            default: n++; break; /* alltoall */
            }
    return n;
}

/* Each data movement collective once on a communicator of its own: each rank
 * opens the peers' allocations it reads from (and, the communicator
 * destroyed, closes them). */
static void opened_by_readers(loom_comm_t c, bufs_t *b, mode_t_ mode)
{
    static const int colls[] = {GATHER, SCATTER, ALLGATHERV, ALLTOALL, ALLTOALLV};
    const int P = loom_comm_size(c), me = loom_comm_rank(c);
    for (size_t xi = 0; xi < sizeof(colls) / sizeof(colls[0]); xi++)
        for (int ri = 0; ri < 2; ri++) {
            const int x = colls[xi];
            case_t k = {.coll = x, .op = LOOM_SUM, .dti = 0, .count = 1001, .root = ri ? P - 1 : 0};
            if (ri && x != GATHER && x != SCATTER)
                continue;
            cuda_double_counts_t k0, k1;
            cuda_double_counts(&k0);
            loom_comm_t sub = NULL;
            if (loom_comm_split(c, 0, me, &sub) != LOOM_SUCCESS) {
                mp_bad(c, "split: %s", loom_comm_last_error(c));
                return;
            }
            one_case(sub, &k, b, mode, &(cuda_double_counts_t){0});
            const long want = want_opens(sub, &k);
            loom_comm_destroy(sub);
            cuda_double_counts(&k1);
            if (k1.ipc_opens - k0.ipc_opens != want || k1.ipc_closes - k0.ipc_closes != want)
                mp_bad(c,
                       "%s root %d on a communicator of its own: %ld peer allocations "
                       "opened (want %ld), %ld closed",
                       coll_names[x], k.root, k1.ipc_opens - k0.ipc_opens, want,
                       k1.ipc_closes - k0.ipc_closes);
        }
}

/* alltoallv where rank 0 neither sends nor receives (its GPU buffers given,
 * all its counts 0: it must take its peers' path, not the host's), then with
 * nothing to move anywhere: the right bytes among the others, no host copy
 * over IPC, and no rank left waiting. */
static void alltoallv_null(loom_comm_t c, bufs_t *b, mode_t_ mode)
{
    const int P = loom_comm_size(c), me = loom_comm_rank(c);
    size_t cnt[MAXP], disp[MAXP], zero[MAXP] = {0};
    for (int j = 0; j < P; j++)
        cnt[j] = me == 0 || j == 0 ? 0 : 5, disp[j] = (size_t)j * 5;
    const size_t bytes = (size_t)P * 5 * 4;
    for (size_t i = 0; i < bytes; i++)
        b->hs[i] = (char)moved_byte(i, me);
    memset(b->ref, 0x6b, bytes);
    memset(b->hr, 0x6b, bytes);
    char *ds = b->sbase + SEND_OFF, *dr = b->r;
    if (loom_alltoallv(b->hs, cnt, disp, b->ref, cnt, disp, LOOM_FLOAT32, c) != LOOM_SUCCESS) {
        mp_bad(c, "alltoallv, rank 0 moving nothing, on host: %s", loom_comm_last_error(c));
        return;
    }
    if (!cuda_ok(c, cudaMemcpy(ds, b->hs, bytes, cudaMemcpyHostToDevice), "upload") ||
        !cuda_ok(c, cudaMemcpy(dr, b->hr, bytes, cudaMemcpyHostToDevice), "upload"))
        return;
    cuda_double_counts_t before, after;
    cuda_double_counts(&before);
    loom_status_t st = loom_alltoallv(ds, cnt, disp, dr, cnt, disp, LOOM_FLOAT32, c);
    if (st == LOOM_SUCCESS)
        st = loom_alltoallv(ds, zero, zero, dr, zero, zero, LOOM_FLOAT32, c);
    cuda_double_counts(&after);
    if (st != LOOM_SUCCESS) {
        mp_bad(c, "alltoallv, rank 0 moving nothing, on GPU: %s", loom_comm_last_error(c));
        return;
    }
    if ((mode == MODE_IPC || mode == MODE_IPC_LAZY) &&
        (after.h2d != before.h2d || after.d2h != before.d2h))
        mp_bad(c, "alltoallv, rank 0 moving nothing: %ld copies to and %ld from the host over IPC",
               after.h2d - before.h2d, after.d2h - before.d2h);
    if (cuda_ok(c, cudaMemcpy(b->hr, dr, bytes, cudaMemcpyDeviceToHost), "download"))
        same_bytes(c, "alltoallv, rank 0 moving nothing,", 0, LOOM_SUM, 0, 5, 0, b->hr, b->ref,
                   bytes);
}

/* Fresh buffers for every call, more than a communicator keeps open: the
 * allocations it let go are closed (at the next plain call), not piled up. */
static void fresh_buffers(loom_comm_t c, mode_t_ mode)
{
    const int P = loom_comm_size(c);
    const long calls = 60;
    cuda_double_counts_t k0, k1;
    cuda_double_counts(&k0);
    for (long i = 0; i < calls && !mp_bad_count; i++) {
        float *s = NULL, *r = NULL;
        if (!cuda_ok(c, cudaMalloc((void **)&s, 4096), "cudaMalloc") ||
            !cuda_ok(c, cudaMalloc((void **)&r, 4096), "cudaMalloc"))
            return;
        cuda_ok(c, cudaMemset(s, 0, 4096), "cudaMemset");
        if (loom_allreduce(s, r, 1024, LOOM_FLOAT32, LOOM_SUM, c) != LOOM_SUCCESS)
            mp_bad(c, "allreduce on fresh buffers: %s", loom_comm_last_error(c));
        cudaFree(s);
        cudaFree(r);
    }
    cuda_double_counts(&k1);
    long opens = k1.ipc_opens - k0.ipc_opens, closes = k1.ipc_closes - k0.ipc_closes;
    if (opens != calls * 2 * (P - 1) || closes == 0 || opens - closes > 64 + 4 * P)
        mp_bad(c, "%s: fresh buffers for %ld calls: %ld peer allocations opened, %ld closed",
               mode == MODE_IPC_LAZY ? "lazy" : "eager", calls, opens, closes);
}

static int rank_main(loom_comm_t c, void *arg)
{
    const mode_t_ mode = *(const mode_t_ *)arg;
    const int P = loom_comm_size(c), me = loom_comm_rank(c);
    const int ipc = mode == MODE_IPC || mode == MODE_IPC_LAZY;
    if (mode == MODE_IPC_LAZY)
        cuda_double_set_lazy(1);
    static const size_t counts[] = {0, 1, 7, 1001, 40009};
    /* the v-collectives' pieces are up to 4 longer, with gaps of 2 */
    const size_t most = (40009 + 8) * (size_t)P * 8 + 64;
    bufs_t b = {.bytes = most};
    b.hs = malloc(most);
    b.hr = malloc(most);
    b.ref = malloc(most);
    if (!b.hs || !b.hr || !b.ref ||
        !cuda_ok(c, cudaMalloc((void **)&b.sbase, most + SEND_OFF), "cudaMalloc") ||
        !cuda_ok(c, cudaMalloc((void **)&b.r, most), "cudaMalloc") ||
        !cuda_ok(c, cudaHostAlloc((void **)&b.up, 2 * most, cudaHostAllocDefault), "cudaHostAlloc"))
        return 1;

    /* A communicator of its own first: it opens the peers' buffers, and closes
     * them all when destroyed (nothing else holds them yet). */
    cuda_double_counts_t k0, k1;
    cuda_double_counts(&k0);
    loom_comm_t sub = NULL;
    if (loom_comm_split(c, 0, me, &sub) != LOOM_SUCCESS) {
        mp_bad(c, "split: %s", loom_comm_last_error(c));
        return 1;
    }
    case_t first = {.coll = ALLREDUCE, .op = LOOM_SUM, .dti = 0, .count = 1001};
    one_case(sub, &first, &b, mode, &(cuda_double_counts_t){0});
    loom_comm_destroy(sub);
    cuda_double_counts(&k1);
    if (ipc && (k1.ipc_opens - k0.ipc_opens != 2 * (P - 1) || k1.ipc_closes != k1.ipc_opens))
        mp_bad(c, "a communicator of its own opened %ld peer allocations (want %d) and closed %ld",
               k1.ipc_opens - k0.ipc_opens, 2 * (P - 1), k1.ipc_closes - k0.ipc_closes);

    if (ipc)
        opened_by_readers(c, &b, mode);
    cuda_double_counts(&k1);

    cuda_double_counts_t moved = {0};
    for (int x = 0; x < NCOLLS; x++)
        for (size_t d = 0; d < NDTYPES; d++)
            for (size_t ni = 0; ni < sizeof(counts) / sizeof(counts[0]); ni++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    int reduces = x == ALLREDUCE || x == REDUCE || x == REDUCE_SCATTER;
                    int rooted = x == GATHER || x == SCATTER;
                    if (x == BROADCAST && in_place)
                        continue; /* broadcast has one buffer */
                    for (int o = 0; o < matrix_nops(reduces, d, ni == 4); o++)
                        for (int ri = 0; ri < 1 + rooted; ri++) {
                            case_t k = {.coll = x,
                                        .in_place = in_place,
                                        .op = matrix_ops[o],
                                        .dti = d,
                                        .count = matrix_count(matrix_ops[o], counts[ni]),
                                        /* roots: the last rank (it reduces through the
                                         * scratch in place when P > 2) and rank 1; gather
                                         * and scatter: rank 0 and the last */
                                        .root = rooted     ? (ri ? P - 1 : 0)
                                                : (ni % 2) ? P - 1
                                                           : 1};
                            one_case(c, &k, &b, mode, &moved);
                        }
                }
    rank_order(c, &b);
    alltoallv_null(c, &b, mode);
    cuda_double_counts_t end;
    cuda_double_counts(&end);
    if (ipc)
        fresh_buffers(c, mode);
    if (ipc) {
        /* The matrix reused the same two buffers per rank: opened once each. */
        if (end.ipc_opens - k1.ipc_opens != 2 * (P - 1))
            mp_bad(c, "%ld peer allocations opened for the matrix, want %d",
                   end.ipc_opens - k1.ipc_opens, 2 * (P - 1));
        if (moved.d2d == 0 || moved.kernels == 0)
            mp_bad(c, "no device copies or kernels over IPC");
    } else {
        if (end.ipc_opens != 0)
            mp_bad(c, "%ld IPC handles opened on the staged path", end.ipc_opens);
        if (moved.h2d == 0 || moved.d2h == 0)
            mp_bad(c, "nothing staged through host memory with %s",
                   mode == MODE_STAGED ? "LOOM_CUDA_IPC=0" : "ranks on two nodes");
    }
    cudaFree(b.sbase);
    cudaFree(b.r);
    cudaFreeHost(b.up);
    free(b.hs);
    free(b.hr);
    free(b.ref);
    return mp_bad_count ? 1 : 0;
}

int main(void)
{
    static const struct {
        mode_t_ mode;
        const char *name;
    } modes[] = {{MODE_IPC, "GPU to GPU through IPC"},
                 {MODE_IPC_LAZY, "GPU to GPU through IPC, lazy double"},
                 {MODE_STAGED, "staged (LOOM_CUDA_IPC=0)"},
                 {MODE_TWO_NODES, "staged (two nodes)"}};
    /* Small staging passes and scratch chunks: many of them per call. */
    setenv("LOOM_CUDA_CHUNK_BYTES", "65536", 1);
    for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++)
        for (int n = 2; n <= 4; n += 2) {
            if (modes[m].mode == MODE_TWO_NODES && n != 4)
                continue;
            if (modes[m].mode == MODE_STAGED)
                setenv("LOOM_CUDA_IPC", "0", 1);
            else
                unsetenv("LOOM_CUDA_IPC");
            if (modes[m].mode == MODE_TWO_NODES)
                setenv("LOOM_MP_NODES", "2", 1);
            else
                unsetenv("LOOM_MP_NODES");
            char name[128];
            snprintf(name, sizeof(name), "collective matrix on GPU buffers, %d ranks, %s", n,
                     modes[m].name);
            mode_t_ mode = modes[m].mode;
            mp_result(name, mp_run(n, rank_main, &mode, 600) == 0);
        }
    return mp_summary();
}
