/* mp_cuda_gdr - collectives on GPU buffers over the ibverbs transport with
 * GPUDirect RDMA (cuda/gdr.c), without a GPU or an HCA: forked ranks over the
 * libibverbs double (tests/verbs-provider), whose ibv_reg_dmabuf_mr maps the
 * dma-bufs the CUDA double (tests/cuda-double) exports, so the double's
 * "HCA" moves device memory while Loom's own view of it stays PROT_NONE.
 * Run by tests/test_ibverbs.sh, which sets the environment (the double's
 * libibverbs first on LD_LIBRARY_PATH, LOOM_TRANSPORT=ibverbs, LOOM_SHM=0,
 * LOOM_CUDA_IPC=0) and LOOM_NET_GDR.
 *
 * Usage: mp_cuda_gdr direct|staged|refused|hier|hier-lazy|hier-staged NRANKS
 *  direct:  every collective, blocking send/recv and isend/irecv, element types (float16 and bfloat16 among them),
 *           counts (0, 1, odd, large), in place and not, gives the bytes the same
 *           call gives on host buffers, and no byte crosses between host and
 *           device during a call (the double's copy counters), dma-bufs exported;
 *  staged:  the same results, staged through host memory, no dma-buf
 *           (isend/irecv of GPU buffers refused: staging needs a blocking call);
 *           and GPU memory registered once per allocation, not per call: the
 *           dma-bufs exported over the whole matrix are at most the
 *           allocations the calls used; a buffer freed and allocated again at
 *           the same address is registered anew (a registration kept from
 *           before would move the bytes to the freed pages: wrong results),
 *           and once only; once the matrix ran, allreduce, reduce and
 *           reduce_scatter allocate nothing and register nothing (the double's
 *           allocation and dma-buf counters);
 *  refused: LOOM_NET_GDR=1 where nothing can register GPU memory (the GPU
 *           exports no dma-buf, no nvidia-peermem): a GPU call fails saying why;
 *  hier:    ranks on emulated nodes (LOOM_MP_NODES, CUDA IPC inside each,
 *           GPUDirect RDMA between): allreduce, reduce_scatter, allgather,
 *           reduce and broadcast (rooted at rank 0, the first rank of the
 *           second node and the last rank) on every type, counts smaller
 *           than the number of ranks and not divisible by it, every op on
 *           the largest (the reducing ones), in place and not, gives the
 *           host's bytes with no copy between host and device during a
 *           call, peers' buffers opened by IPC and dma-bufs exported; inputs
 *           that round (fractions in float32, float16, bfloat16) give every
 *           rank the same bits, and reduce's root those of allreduce;
 *  hier-lazy: hier in the CUDA double's lazy mode (queued device work runs
 *           only when the host waits): a step that reads what an earlier
 *           step's kernels or copies write without waiting gets stale bytes;
 *  hier-staged: the same calls on the same nodes, staged through host
 *           memory (LOOM_CUDA_IPC=0 or LOOM_NET_GDR=0), right and with
 *           copies, no IPC handle opened.
 * The inputs are small integers, exact in every type, so the order of reduction
 * (the ring's here, rank order when staged) does not matter.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>

#include "cuda-double/cuda_double.h"
#include "loom.h"
#include "mp_cuda_util.h"
#include "mp_util.h"

typedef enum { MODE_DIRECT, MODE_STAGED, MODE_REFUSED, MODE_HIER, MODE_HIER_STAGED } mode_t_;

typedef struct {
    int coll, in_place, root;
    loom_op_t op;
    size_t dti, count;
    /* the v forms: what rank a sends rank b is count + (a + b) % 3 elements */
    size_t vc[8], vd[8], sc[8], sd[8], vtotal, stotal;
} case_t;

static void v_counts(case_t *k, int P, int me)
{
    k->vtotal = k->stotal = 0;
    for (int r = 0; r < P; r++) {
        k->vc[r] = k->coll == ALLGATHERV ? k->count + (size_t)r % 3
                                         : k->count + (size_t)(r + me) % 3; /* from r to me */
        k->vd[r] = k->vtotal;
        k->vtotal += k->vc[r];
        k->sc[r] = k->count + (size_t)(r + me) % 3; /* from me to r */
        k->sd[r] = k->stotal;
        k->stotal += k->sc[r];
    }
}

static loom_status_t run(loom_comm_t c, const case_t *k, const void *s, void *r)
{
    loom_dtype_t dt = dtypes[k->dti].dt;
    const void *in = k->in_place ? LOOM_IN_PLACE : s;
    const int me = loom_comm_rank(c);
    switch (k->coll) {
    case ALLREDUCE: return loom_allreduce(in, r, k->count, dt, k->op, c);
    case REDUCE: return loom_reduce(in, r, k->count, dt, k->op, k->root, c);
    case BROADCAST: return loom_broadcast(r, k->count, dt, k->root, c);
    case ALLGATHER: return loom_allgather(in, r, k->count, dt, c);
    case ALLGATHERV: return loom_allgatherv(s, k->vc[me], r, k->vc, k->vd, dt, c);
    case REDUCE_SCATTER: return loom_reduce_scatter(in, r, k->count, dt, k->op, c);
    case ALLTOALL: return loom_alltoall(s, r, k->count, dt, c);
    case ALLTOALLV: return loom_alltoallv(s, k->sc, k->sd, r, k->vc, k->vd, dt, c);
    case GATHER: return loom_gather(s, r, k->count, dt, k->root, c);
    default: return loom_scatter(s, r, k->count, dt, k->root, c);
    }
}

/* Fill the input where the call reads it; the output's bytes this rank checks. */
static size_t fill(loom_comm_t c, const case_t *k, char *s, char *r, size_t cap)
{
    const int P = loom_comm_size(c), me = loom_comm_rank(c);
    const size_t es = dtypes[k->dti].es, n = k->count;
    const loom_dtype_t dt = dtypes[k->dti].dt;
    size_t in_n = n, out_n = n;
    switch (k->coll) {
    case ALLGATHER: out_n = n * (size_t)P; break;
    case ALLGATHERV:
        in_n = k->vc[me];
        out_n = k->vtotal;
        break;
    case REDUCE_SCATTER: in_n = n * (size_t)P; break;
    case ALLTOALL: in_n = out_n = n * (size_t)P; break;
    case ALLTOALLV:
        in_n = k->stotal;
        out_n = k->vtotal;
        break;
    case GATHER: out_n = me == k->root ? n * (size_t)P : 0; break;
    case SCATTER: in_n = me == k->root ? n * (size_t)P : 0; break;
    case REDUCE: out_n = me == k->root ? n : 0; break;
    default: break;
    }
    char *to = k->in_place ? r : s;
    if (k->in_place && k->coll == ALLGATHER)
        to = r + (size_t)me * n * es;
    if (k->coll == BROADCAST)
        to = r;
    memset(r, 0x6b, cap);
    memset(s, 0x5c, cap);
    if (k->coll != BROADCAST || me == k->root)
        for (size_t i = 0; i < in_n; i++)
            put(to, i, dt, me * 3 + (int)(i % 5));
    return out_n * es;
}

typedef struct {
    char *s, *r;         /* device */
    char *hs, *hr, *ref; /* host */
    size_t bytes;
} bufs_t;

static void one_case(loom_comm_t c, case_t *k, bufs_t *b, mode_t_ mode, cuda_double_counts_t *moved)
{
    v_counts(k, loom_comm_size(c), loom_comm_rank(c));
    size_t out_bytes = fill(c, k, b->hs, b->ref, b->bytes);
    if (run(c, k, b->hs, b->ref) != LOOM_SUCCESS) {
        mp_bad(c, "%s host: %s", coll_names[k->coll], loom_comm_last_error(c));
        return;
    }
    fill(c, k, b->hs, b->hr, b->bytes);
    if (!cuda_ok(c, cudaMemcpy(b->s, b->hs, b->bytes, cudaMemcpyHostToDevice), "upload") ||
        !cuda_ok(c, cudaMemcpy(b->r, b->hr, b->bytes, cudaMemcpyHostToDevice), "upload"))
        return;
    cuda_double_counts_t before, after;
    cuda_double_counts(&before);
    loom_status_t st = run(c, k, b->s, b->r);
    cuda_double_counts(&after);
    if (st != LOOM_SUCCESS) {
        mp_bad(c, "%s GPU: %s", coll_names[k->coll], loom_comm_last_error(c));
        return;
    }
    counts_since(moved, &before, &after);
    if ((mode == MODE_DIRECT || mode == MODE_HIER) &&
        (after.h2d != before.h2d || after.d2h != before.d2h))
        mp_bad(c, "%s %s count %zu: %ld copies to and %ld from the host with GPUDirect RDMA",
               coll_names[k->coll], dtypes[k->dti].name, k->count, after.h2d - before.h2d,
               after.d2h - before.d2h);
    if (!cuda_ok(c, cudaMemcpy(b->hr, b->r, b->bytes, cudaMemcpyDeviceToHost), "download"))
        return;
    same_bytes(c, coll_names[k->coll], k->dti, k->op, k->root, k->count, k->in_place, b->hr, b->ref,
               out_bytes);
}

static sigjmp_buf faulted;

static void on_segv(int sig)
{
    (void)sig;
    siglongjmp(faulted, 1);
}

static int host_read_faults(const void *p)
{
    struct sigaction sa = {.sa_handler = on_segv}, old;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old);
    int hit = 0;
    if (sigsetjmp(faulted, 1) == 0) {
        volatile char touch = *(const volatile char *)p;
        (void)touch;
    } else {
        hit = 1;
    }
    sigaction(SIGSEGV, &old, NULL);
    return hit;
}

/* Blocking send/recv of GPU buffers, rank 0 to rank 1, small (below the eager
 * size) and large; then from rank 0's host memory into rank 1's GPU memory (a
 * small message from host memory is copied in: one copy up, by design). */
static void send_recv(loom_comm_t c, bufs_t *b, mode_t_ mode, cuda_double_counts_t *moved)
{
    const int me = loom_comm_rank(c);
    static const size_t sizes[] = {1, 100, 70001};
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]) && me < 2; si++) {
        const size_t n = sizes[si];
        for (int from_host = 0; from_host < 2; from_host++) {
            int32_t *h = (int32_t *)b->hs;
            for (size_t i = 0; i < n; i++)
                h[i] = me ? -1 : (int32_t)(i * 7 + n);
            if (!cuda_ok(c, cudaMemcpy(b->s, h, n * 4, cudaMemcpyHostToDevice), "upload"))
                return;
            cuda_double_counts_t before, after;
            cuda_double_counts(&before);
            loom_status_t st =
                me == 0 ? loom_send(from_host ? (void *)h : (void *)b->s, n, LOOM_INT32, 1, 5, c)
                        : loom_recv(b->s, n, LOOM_INT32, 0, 5, c);
            cuda_double_counts(&after);
            if (st != LOOM_SUCCESS) {
                mp_bad(c, "send/recv %zu: %s", n, loom_comm_last_error(c));
                return;
            }
            long up = after.h2d - before.h2d, down = after.d2h - before.d2h;
            moved->h2d += up;
            moved->d2h += down;
            if (mode == MODE_DIRECT && (down || up > (from_host && n * 4 <= 8192)))
                mp_bad(c, "send/recv %zu%s with GPUDirect RDMA: %ld copies up, %ld down", n,
                       from_host ? " from host memory" : "", up, down);
            if (me == 1) {
                if (!cuda_ok(c, cudaMemcpy(h, b->s, n * 4, cudaMemcpyDeviceToHost), "download"))
                    return;
                for (size_t i = 0; i < n; i++)
                    if (h[i] != (int32_t)(i * 7 + n)) {
                        mp_bad(c, "send/recv %zu%s: element %zu is %d", n,
                               from_host ? " from host memory" : "", i, h[i]);
                        break;
                    }
            }
        }
    }
}

/* The registration cache of GPU memory (direct mode): b->r freed and
 * allocated again at the same address, with a new buffer id; the next calls
 * must be right (the HCA writes into the new allocation, not the freed one)
 * and export one dma-buf for it, the call after that none. */
static void realloc_same_address(loom_comm_t c, bufs_t *b)
{
    cuda_double_counts_t before, after, moved = {0};
    char *old = b->r;
    cuda_double_counts(&before);
    if (!cuda_ok(c, cudaFree(b->r), "cudaFree") ||
        !cuda_ok(c, cuda_double_malloc_at((void **)&b->r, b->bytes, old), "cudaMalloc again"))
        return;
    cuda_double_counts(&after);
    if (b->r != old || after.frees != before.frees + 1) {
        mp_bad(c, "the double did not free and allocate again at %p", (void *)old);
        return;
    }
    long exports[2], allocs[2];
    for (int round = 0; round < 2; round++) {
        cuda_double_counts_t m0 = moved;
        for (int x = ALLREDUCE; x <= REDUCE; x++) {
            case_t k = {.coll = x, .dti = 0, .op = LOOM_SUM, .count = 20011, .root = 0};
            one_case(c, &k, b, MODE_DIRECT, &moved);
        }
        exports[round] = moved.dmabuf_exports - m0.dmabuf_exports;
        allocs[round] = moved.allocs - m0.allocs;
    }
    /* Every rank's allreduce writes into its r; what the calls allocate
     * themselves is registered too. */
    if (exports[0] < 1 || exports[1] > allocs[1])
        mp_bad(c, "GPU registration cache: %ld dma-bufs exported after a free and allocation "
               "at the same address (want at least 1), %ld in the calls after (want %ld: "
               "one per allocation they made)", exports[0], exports[1], allocs[1]);
}

/* Steady state (direct mode): once the matrix ran the largest calls, the
 * reducing collectives allocate nothing (the accumulator is the
 * communicator's) and export no dma-buf (every buffer is registered). */
static void steady_state(loom_comm_t c, bufs_t *b)
{
    cuda_double_counts_t moved = {0};
    for (int x = ALLREDUCE; x < NCOLLS; x++) {
        case_t k = {.coll = x, .dti = 0, .op = LOOM_SUM, .count = 20011, .root = 1};
        if (x == ALLREDUCE || x == REDUCE || x == REDUCE_SCATTER)
            one_case(c, &k, b, MODE_DIRECT, &moved);
    }
    if (moved.allocs || moved.frees || moved.dmabuf_exports)
        mp_bad(c, "steady state: allreduce, reduce and reduce_scatter of 20011 elements made %ld "
               "cudaMalloc, %ld cudaFree, %ld dma-bufs (want none)", moved.allocs, moved.frees,
               moved.dmabuf_exports);
}

/* Non-blocking send/recv of GPU buffers: ranks 0 and 1 each post a receive
 * from and a send to the other at once (a blocking pair would deadlock on
 * large messages), small and large, then wait. Direct: the bytes arrive, no
 * copy between host and device. Staged: refused, saying what to use. */
static void isend_irecv(loom_comm_t c, bufs_t *b, mode_t_ mode)
{
    const int me = loom_comm_rank(c), other = 1 - me;
    static const size_t sizes[] = {1, 100, 70001};
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]) && me < 2; si++) {
        const size_t n = sizes[si];
        int32_t *h = (int32_t *)b->hs;
        for (size_t i = 0; i < n; i++)
            h[i] = (int32_t)(i * 5 + n + (size_t)me * 1000);
        if (!cuda_ok(c, cudaMemcpy(b->s, h, n * 4, cudaMemcpyHostToDevice), "upload") ||
            !cuda_ok(c, cudaMemset(b->r, 0x6b, n * 4), "memset"))
            return;
        cuda_double_counts_t before, after;
        cuda_double_counts(&before);
        loom_request_t rq = NULL, sq = NULL;
        loom_status_t st = loom_irecv(b->r, n, LOOM_INT32, other, 9, c, &rq);
        if (st == LOOM_SUCCESS)
            st = loom_isend(b->s, n, LOOM_INT32, other, 9, c, &sq);
        if (mode != MODE_DIRECT) {
            if (st == LOOM_SUCCESS || !strstr(loom_comm_last_error(c), "GPU buffers without "
                                                                      "GPUDirect RDMA"))
                mp_bad(c, "irecv/isend of GPU buffers, staged: %s (%s), want a refusal",
                       loom_strerror(st), loom_comm_last_error(c));
            if (rq)
                loom_wait(rq);
            return;
        }
        if (st != LOOM_SUCCESS) {
            mp_bad(c, "irecv/isend %zu: %s", n, loom_comm_last_error(c));
            return;
        }
        loom_status_t sr = loom_wait(rq), ss = loom_wait(sq);
        cuda_double_counts(&after);
        if (sr != LOOM_SUCCESS || ss != LOOM_SUCCESS) {
            mp_bad(c, "irecv/isend %zu: wait: %s", n, loom_comm_last_error(c));
            return;
        }
        if (after.h2d != before.h2d || after.d2h != before.d2h)
            mp_bad(c, "irecv/isend %zu with GPUDirect RDMA: %ld copies up, %ld down", n,
                   after.h2d - before.h2d, after.d2h - before.d2h);
        if (!cuda_ok(c, cudaMemcpy(h, b->r, n * 4, cudaMemcpyDeviceToHost), "download"))
            return;
        for (size_t i = 0; i < n; i++)
            if (h[i] != (int32_t)(i * 5 + n + (size_t)other * 1000)) {
                mp_bad(c, "irecv %zu from rank %d: element %zu is %d", n, other, i, h[i]);
                break;
            }
    }
}

/* The first rank of the second emulated node (LOOM_MP_NODES ranks a node). */
static int second_node(int P)
{
    const char *e = getenv("LOOM_MP_NODES");
    return e && atoi(e) > 0 && atoi(e) < P ? atoi(e) : P / 2;
}

/* Inputs that round: every rank must still get the same bits (one rank
 * computes each element, the others copy it). Each rank's result, downloaded,
 * is compared with rank 0's through a host allgather. */
static void same_bits_everywhere(loom_comm_t c, bufs_t *b)
{
    const int P = loom_comm_size(c), me = loom_comm_rank(c);
    const size_t n = 1001;
    for (size_t d = 0; d < 3; d++) { /* float32, float16, bfloat16 */
        const size_t es = dtypes[d].es;
        for (size_t i = 0; i < n; i++) {
            float f = 1.0f / (float)(3 + (i + (size_t)me * 7) % 11) + (float)me * 0.1f;
            uint32_t u = f32_bits(f);
            if (d == 0)
                memcpy(b->hs + i * 4, &u, 4);
            else if (d == 1) { /* float16, truncated: any bits will do */
                uint16_t h = (uint16_t)(0x3000u + (u >> 13 & 0x3ffu));
                memcpy(b->hs + i * 2, &h, 2);
            } else {
                uint16_t h = (uint16_t)(u >> 16);
                memcpy(b->hs + i * 2, &h, 2);
            }
        }
        if (!cuda_ok(c, cudaMemcpy(b->s, b->hs, n * es, cudaMemcpyHostToDevice), "upload"))
            return;
        if (loom_allreduce(b->s, b->r, n, dtypes[d].dt, LOOM_SUM, c) != LOOM_SUCCESS) {
            mp_bad(c, "allreduce of fractions: %s", loom_comm_last_error(c));
            return;
        }
        if (!cuda_ok(c, cudaMemcpy(b->hr, b->r, n * es, cudaMemcpyDeviceToHost), "download"))
            return;
        if (loom_allgather(b->hr, b->ref, n * es, LOOM_UINT8, c) != LOOM_SUCCESS) {
            mp_bad(c, "allgather of the results: %s", loom_comm_last_error(c));
            return;
        }
        for (int r = 1; r < P; r++)
            if (memcmp(b->ref, b->ref + (size_t)r * n * es, n * es) != 0) {
                mp_bad(c, "allreduce of fractions in %s: rank %d's bits differ from rank 0's",
                       dtypes[d].name, r);
                break;
            }
        /* reduce's root gets the allreduce's bits (hr still holds them). */
        const int roots[] = {0, second_node(P), P - 1};
        for (size_t ri = 0; ri < sizeof(roots) / sizeof(roots[0]); ri++) {
            if (loom_reduce(b->s, b->r, n, dtypes[d].dt, LOOM_SUM, roots[ri], c) != LOOM_SUCCESS) {
                mp_bad(c, "reduce of fractions: %s", loom_comm_last_error(c));
                return;
            }
            if (me != roots[ri])
                continue;
            if (!cuda_ok(c, cudaMemcpy(b->ref, b->r, n * es, cudaMemcpyDeviceToHost),
                         "download"))
                return;
            if (memcmp(b->ref, b->hr, n * es) != 0)
                mp_bad(c, "reduce of fractions in %s to root %d: bits differ from allreduce's",
                       dtypes[d].name, roots[ri]);
        }
    }
}

/* hier and hier-staged: the allreduce, reduce_scatter, allgather, reduce and
 * broadcast matrix on ranks of several nodes; the rooted ones from rank 0, the
 * first rank of the second node and the last rank (a local index other than
 * 0 on a node other than the first). */
static void hier_matrix(loom_comm_t c, bufs_t *b, mode_t_ mode)
{
    const int P = loom_comm_size(c);
    static const size_t counts[] = {0, 1, 2, 3, 5, 7, 1001, 20011};
    const size_t ncounts = sizeof(counts) / sizeof(counts[0]);
    cuda_double_counts_t moved = {0};
    static const int colls[] = {ALLREDUCE, REDUCE_SCATTER, ALLGATHER, REDUCE, BROADCAST};
    const int roots[] = {0, second_node(P), P - 1};
    for (size_t x = 0; x < sizeof(colls) / sizeof(colls[0]); x++) {
        const int rooted = colls[x] == REDUCE || colls[x] == BROADCAST;
        const int reduces = colls[x] != ALLGATHER && colls[x] != BROADCAST;
        for (size_t ri = 0; ri < (rooted ? sizeof(roots) / sizeof(roots[0]) : 1); ri++)
            for (size_t d = 0; d < NDTYPES; d++)
                for (size_t ni = 0; ni < ncounts; ni++)
                    /* broadcast has one buffer: in place is all it does */
                    for (int in_place = 0; in_place < (colls[x] == BROADCAST ? 1 : 2); in_place++)
                        for (int o = 0; o < matrix_nops(reduces, d, ni == ncounts - 1); o++) {
                            case_t k = {.coll = colls[x], .in_place = in_place, .dti = d};
                            k.op = matrix_ops[o];
                            k.count = matrix_count(k.op, counts[ni]);
                            k.root = roots[ri];
                            one_case(c, &k, b, mode, &moved);
                        }
    }
    if (mode == MODE_HIER &&
        (moved.ipc_opens == 0 || moved.dmabuf_exports == 0 || moved.kernels == 0))
        mp_bad(c,
               "hierarchical: %ld IPC handles opened, %ld dma-bufs exported, %ld kernels run "
               "(want some of each)",
               moved.ipc_opens, moved.dmabuf_exports, moved.kernels);
    if (mode == MODE_HIER_STAGED && (moved.h2d == 0 || moved.d2h == 0 || moved.ipc_opens != 0))
        mp_bad(c, "staged: %ld copies up, %ld down, %ld IPC handles opened", moved.h2d, moved.d2h,
               moved.ipc_opens);
    same_bits_everywhere(c, b);
    printf(
        "rank %d/%d: during the GPU allreduces, reduce_scatters, allgathers, reduces and "
        "broadcasts: %ld copies host to device, %ld device to host, %ld kernels, %ld IPC handles "
        "opened, %ld dma-bufs exported\n",
        loom_comm_rank(c), P, moved.h2d, moved.d2h, moved.kernels, moved.ipc_opens,
        moved.dmabuf_exports);
    fflush(stdout);
}

static int lazy; /* hier-lazy */

static int rank_main(loom_comm_t c, void *arg)
{
    const mode_t_ mode = *(const mode_t_ *)arg;
    if (lazy)
        cuda_double_set_lazy(1);
    const int P = loom_comm_size(c);
    static const size_t counts[] = {0, 1, 7, 1001, 20011};
    const size_t most = (20011 + 3) * (size_t)P * 8 + 64;
    bufs_t b = {.bytes = most};
    b.hs = malloc(most);
    b.hr = malloc(most);
    b.ref = malloc(most);
    if (!b.hs || !b.hr || !b.ref || !cuda_ok(c, cudaMalloc((void **)&b.s, most), "cudaMalloc") ||
        !cuda_ok(c, cudaMalloc((void **)&b.r, most), "cudaMalloc"))
        return 1;
    if (mode == MODE_REFUSED) {
        loom_status_t st = loom_allreduce(b.s, b.r, 1001, LOOM_FLOAT32, LOOM_SUM, c);
        /* A rank may learn it from its peer, which found it first and gave up. */
        const char *why = loom_comm_last_error(c);
        if (st == LOOM_SUCCESS || (!strstr(why, "LOOM_NET_GDR=1") && !strstr(why, "gave up")))
            mp_bad(c, "LOOM_NET_GDR=1 without dma-buf: %s (%s)", loom_strerror(st),
                   loom_comm_last_error(c));
        return mp_bad_count ? 1 : 0;
    }
    /* The verbs double reaches device memory through its own mapping of the
     * dma-buf: the program's view of it still faults (caught here, once the
     * buffer was registered by the first call; no fork: the pages the HCA
     * pinned must stay the process's). */
    if (mode == MODE_DIRECT) {
        loom_status_t st = loom_allreduce(b.s, b.r, 1001, LOOM_FLOAT32, LOOM_SUM, c);
        if (st != LOOM_SUCCESS)
            mp_bad(c, "allreduce: %s", loom_comm_last_error(c));
        if (!host_read_faults(b.r))
            mp_bad(c, "a host read of device memory did not fault");
    }
    if (mode == MODE_HIER || mode == MODE_HIER_STAGED) {
        hier_matrix(c, &b, mode);
        goto out;
    }
    cuda_double_counts_t moved = {0};
    for (int x = 0; x < NCOLLS; x++)
        for (size_t d = 0; d < NDTYPES; d++)
            for (size_t ni = 0; ni < sizeof(counts) / sizeof(counts[0]); ni++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    int reduces = x == ALLREDUCE || x == REDUCE || x == REDUCE_SCATTER;
                    if (in_place && !reduces && x != ALLGATHER)
                        continue;
                    for (int o = 0; o < matrix_nops(reduces, d, ni == 4); o++) {
                        case_t k = {.coll = x, .in_place = in_place, .dti = d};
                        k.op = matrix_ops[o];
                        k.count = matrix_count(k.op, counts[ni]);
                        k.root = (ni % 2) ? P - 1 : 1;
                        one_case(c, &k, &b, mode, &moved);
                    }
                }
    cuda_double_counts_t p2p = {0};
    send_recv(c, &b, mode, &p2p);
    if (P > 1)
        isend_irecv(c, &b, mode);
    if (mode == MODE_DIRECT && (moved.dmabuf_exports == 0 || moved.kernels == 0))
        mp_bad(c, "GPUDirect: %ld dma-bufs exported, %ld kernels run", moved.dmabuf_exports,
               moved.kernels);
    /* Registered once per allocation: s, r, the communicator's scratch, and
     * whatever the calls allocated. */
    if (mode == MODE_DIRECT && moved.dmabuf_exports > 3 + moved.allocs)
        mp_bad(c, "GPUDirect: %ld dma-bufs exported for %ld allocations made during the calls "
               "(and 3 before): GPU memory registered per call, not per allocation",
               moved.dmabuf_exports, moved.allocs);
    if (mode == MODE_DIRECT) {
        steady_state(c, &b);
        realloc_same_address(c, &b);
    }
    if (mode == MODE_STAGED && (moved.h2d == 0 || moved.d2h == 0 || moved.dmabuf_exports != 0 ||
                                (loom_comm_rank(c) < 2 && p2p.h2d + p2p.d2h == 0)))
        mp_bad(c, "staged: %ld copies up, %ld down, %ld dma-bufs", moved.h2d, moved.d2h,
               moved.dmabuf_exports);
    printf("rank %d/%d: during the GPU collectives: %ld copies host to device, %ld device to "
           "host, %ld kernels, %ld dma-bufs exported, %ld cudaMalloc, %ld cudaFree; send/recv: "
           "%ld copies up, %ld down (with GPUDirect: only small messages sent from host memory "
           "go up)\n",
           loom_comm_rank(c), P, moved.h2d, moved.d2h, moved.kernels, moved.dmabuf_exports,
           moved.allocs, moved.frees, p2p.h2d, p2p.d2h);
    fflush(stdout);
out:
    cudaFree(b.s);
    cudaFree(b.r);
    free(b.hs);
    free(b.hr);
    free(b.ref);
    return mp_bad_count ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s direct|staged|refused|hier|hier-lazy|hier-staged NRANKS\n",
                argv[0]);
        return 2;
    }
    lazy = strcmp(argv[1], "hier-lazy") == 0;
    mode_t_ mode = strcmp(argv[1], "direct") == 0         ? MODE_DIRECT
                   : strcmp(argv[1], "staged") == 0       ? MODE_STAGED
                   : strcmp(argv[1], "hier") == 0 || lazy ? MODE_HIER
                   : strcmp(argv[1], "hier-staged") == 0  ? MODE_HIER_STAGED
                                                          : MODE_REFUSED;
    int n = atoi(argv[2]);
    if (n < 1 || n > 8) {
        fprintf(stderr, "NRANKS: 1 to 8\n");
        return 2;
    }
    /* Small slices: many ring steps per block. */
    setenv("LOOM_CUDA_CHUNK_BYTES", "16384", 1);
    char name[128];
    snprintf(name, sizeof(name), "collective matrix on GPU buffers over ibverbs, %d ranks, %s", n,
             argv[1]);
    mp_result(name, mp_run(n, rank_main, &mode, 600) == 0);
    return mp_summary();
}
