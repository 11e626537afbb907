/*
 * direct.c - allreduce, broadcast and allgather inside one node, working on
 * the peers' buffers in place through one-sided reads (cross-memory attach)
 * instead of messages: every byte is copied once, straight from the buffer
 * that holds it, so the collectives run at memory bandwidth rather than at
 * the rate of a message ring.
 *
 * Ranks first swap the addresses of their buffers (a few small messages),
 * then read what they need from each other, and end with a fence of empty
 * messages, so that nobody returns (and reuses a buffer) while a peer may
 * still read it.
 *
 * allreduce: rank i reduces slice i of the vector, reading slice i of every
 * peer's input piece by piece into a cache-sized buffer and reducing it into
 * its own output slice (a reduce-scatter); after a fence every rank copies
 * the other slices from their owners' outputs (an allgather).
 */
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "algorithms.h"
#include "reduce.h"

#define MAX_DIRECT_RANKS 64
/* The piece of a peer's slice read before it is reduced: stays in L2. */
#define PIECE_BYTES (256 * 1024)

enum { STEP_ADDRS = 0, STEP_MIDDLE = 1, STEP_END = 2 };

int loom_direct_can_run(const loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    (void)a;
    if (ctx->size > MAX_DIRECT_RANKS)
        return 0;
    for (int p = 0; p < ctx->size; p++)
        if (p != ctx->rank && !loom_p2p_can_read(ctx, p))
            return 0;
    return 1;
}

/* Everyone's two buffer addresses: mine[0..1] -> all[2p], all[2p+1]. */
static loom_status_t swap_addrs(loom_ctx_t *ctx, const void *send, const void *recv,
                                uint64_t *all)
{
    loom_tp_req_t reqs[2 * MAX_DIRECT_RANKS];
    const int n = ctx->size, me = ctx->rank;
    int nreq = 0;
    all[2 * me] = (uint64_t)(uintptr_t)send;
    all[2 * me + 1] = (uint64_t)(uintptr_t)recv;
    for (int p = 0; p < n; p++) {
        if (p == me)
            continue;
        loom_status_t st = loom_p2p_irecv(ctx, p, STEP_ADDRS, &all[2 * p], 2 * sizeof(uint64_t),
                                          &reqs[nreq++]);
        if (st == LOOM_SUCCESS)
            st = loom_p2p_isend(ctx, p, STEP_ADDRS, &all[2 * me], 2 * sizeof(uint64_t),
                                &reqs[nreq++]);
        if (st != LOOM_SUCCESS)
            return st;
    }
    return loom_p2p_waitall(ctx, reqs, nreq);
}

/* Everybody has reached this point (an empty message to and from each peer). */
static loom_status_t fence(loom_ctx_t *ctx, uint32_t step)
{
    loom_tp_req_t reqs[2 * MAX_DIRECT_RANKS];
    char none[1];
    int nreq = 0;
    for (int p = 0; p < ctx->size; p++) {
        if (p == ctx->rank)
            continue;
        loom_status_t st = loom_p2p_irecv(ctx, p, step, none, 0, &reqs[nreq++]);
        if (st == LOOM_SUCCESS)
            st = loom_p2p_isend(ctx, p, step, none, 0, &reqs[nreq++]);
        if (st != LOOM_SUCCESS)
            return st;
    }
    return loom_p2p_waitall(ctx, reqs, nreq);
}

/* An allreduce with nothing to exchange: one rank, or no elements. */
static loom_status_t alone(const loom_coll_args_t *a, int n)
{
    if (a->count && a->sendbuf != a->recvbuf)
        memcpy(a->recvbuf, a->sendbuf, a->count * a->esize);
    if (a->op == LOOM_AVG && a->count)
        loom_reduce_avg_finalize(a->recvbuf, a->count, a->dtype, n);
    return LOOM_SUCCESS;
}

/* Slice b of count elements split n ways (the first count % n get one more). */
static size_t slice(size_t count, int n, int b, size_t *first_p)
{
    size_t base = count / (size_t)n, extra = count % (size_t)n;
    *first_p = (size_t)b * base + ((size_t)b < extra ? (size_t)b : extra);
    return base + ((size_t)b < extra);
}

loom_status_t loom_allreduce_direct(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, me = ctx->rank;
    const size_t es = a->esize;
    const char *in = a->sendbuf;
    char *out = a->recvbuf;
    if (n == 1 || a->count == 0)
        return alone(a, n);
    uint64_t addrs[2 * MAX_DIRECT_RANKS];
    loom_status_t st = swap_addrs(ctx, in, out, addrs);
    if (st != LOOM_SUCCESS)
        return st;

    size_t first, mine = slice(a->count, n, me, &first);
    size_t piece = PIECE_BYTES / es ? PIECE_BYTES / es : 1;
    char *tmp = loom_ctx_scratch(ctx, piece * es);
    if (!tmp)
        return LOOM_ERR_NO_MEMORY;
    for (size_t done = 0; done < mine; done += piece) {
        size_t k = mine - done < piece ? mine - done : piece;
        size_t off = (first + done) * es;
        for (int j = 1; j < n; j++) {
            /* Start at a different peer on every rank so no buffer is read by all at once. */
            int p = (me + j) % n;
            if ((st = loom_p2p_read(ctx, p, tmp, addrs[2 * p] + off, k * es)) != LOOM_SUCCESS)
                return st;
            loom_ctx_reduce(ctx, out + off, j == 1 ? in + off : out + off, tmp, k, a->dtype, a->op);
        }
        if (a->op == LOOM_AVG)
            loom_reduce_avg_finalize(out + off, k, a->dtype, n);
    }
    if ((st = fence(ctx, STEP_MIDDLE)) != LOOM_SUCCESS)
        return st;
    for (int j = 1; j < n; j++) {
        int p = (me + j) % n;
        size_t pfirst, pcount = slice(a->count, n, p, &pfirst);
        if (pcount &&
            (st = loom_p2p_read(ctx, p, out + pfirst * es, addrs[2 * p + 1] + pfirst * es,
                                pcount * es)) != LOOM_SUCCESS)
            return st;
    }
    return fence(ctx, STEP_END);
}

loom_status_t loom_broadcast_direct(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, me = ctx->rank;
    const size_t bytes = a->count * a->esize;
    if (n == 1 || bytes == 0)
        return LOOM_SUCCESS;
    loom_tp_req_t reqs[MAX_DIRECT_RANKS];
    uint64_t root_addr = (uint64_t)(uintptr_t)a->recvbuf;
    loom_status_t st;
    if (me == a->root) {
        int nreq = 0;
        for (int p = 0; p < n; p++)
            if (p != me && (st = loom_p2p_isend(ctx, p, STEP_ADDRS, &root_addr, sizeof(root_addr),
                                                &reqs[nreq++])) != LOOM_SUCCESS)
                return st;
        if ((st = loom_p2p_waitall(ctx, reqs, nreq)) != LOOM_SUCCESS)
            return st;
        /* The buffer must stay as it is until every rank has its copy. */
        char none[1];
        nreq = 0;
        for (int p = 0; p < n; p++)
            if (p != me && (st = loom_p2p_irecv(ctx, p, STEP_END, none, 0, &reqs[nreq++])) !=
                               LOOM_SUCCESS)
                return st;
        return loom_p2p_waitall(ctx, reqs, nreq);
    }
    if ((st = loom_p2p_irecv(ctx, a->root, STEP_ADDRS, &root_addr, sizeof(root_addr), &reqs[0])) !=
            LOOM_SUCCESS ||
        (st = loom_p2p_wait(ctx, &reqs[0])) != LOOM_SUCCESS ||
        (st = loom_p2p_read(ctx, a->root, a->recvbuf, root_addr, bytes)) != LOOM_SUCCESS)
        return st;
    char none[1];
    if ((st = loom_p2p_isend(ctx, a->root, STEP_END, none, 0, &reqs[0])) != LOOM_SUCCESS)
        return st;
    return loom_p2p_wait(ctx, &reqs[0]);
}

loom_status_t loom_allgather_direct(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, me = ctx->rank;
    const size_t block = a->count * a->esize;
    char *out = a->recvbuf;
    if (block == 0)
        return LOOM_SUCCESS;
    if (a->sendbuf != out + (size_t)me * block)
        memcpy(out + (size_t)me * block, a->sendbuf, block);
    if (n == 1)
        return LOOM_SUCCESS;
    uint64_t addrs[2 * MAX_DIRECT_RANKS];
    loom_status_t st = swap_addrs(ctx, a->sendbuf, out, addrs);
    if (st != LOOM_SUCCESS)
        return st;
    for (int j = 1; j < n; j++) {
        int p = (me + j) % n;
        if ((st = loom_p2p_read(ctx, p, out + (size_t)p * block, addrs[2 * p], block)) !=
            LOOM_SUCCESS)
            return st;
    }
    return fence(ctx, STEP_END);
}

/*
 * staged allreduce: the vector goes through the node-wide staging windows the
 * transport shares (every rank maps every peer's), in chunks of half a window
 * so that two chunks alternate:
 *  1. each rank copies its chunk into its window (but for its own slice,
 *     which only it reads, straight from its input);          fence
 *  2. rank i reduces slice i of the chunk from all windows into slice i of
 *     its own window (read in place: no per-peer copy at all);  fence
 *  3. every rank copies all the reduced slices from their owners' windows.
 * Every byte is copied twice (in, out) with plain memcpy, which on a small
 * node beats one copy by cross-memory attach (a system call and page pinning
 * per piece). A chunk reuses the window of the chunk before last only after
 * the fence of step 1 of the one between, by which time every rank has
 * copied out of it; a last fence keeps windows steady until everybody is done.
 */
/* memcpy with non-temporal stores where the CPU has them: the result is not
 * read again during the collective, and a normal store would first read
 * every destination line from memory (half of the copy's memory traffic). */
static void copy_out(char *dst, const char *src, size_t len)
{
#if defined(__x86_64__)
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (len < 256 + head) {
        memcpy(dst, src, len);
        return;
    }
    memcpy(dst, src, head);
    dst += head;
    src += head;
    len -= head;
    size_t body = len & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    memcpy(dst + body, src + body, len - body);
    _mm_sfence();   /* streamed stores are ordered before whatever we do next */
#else
    memcpy(dst, src, len);
#endif
}

int loom_staged_can_run(const loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    (void)a;
    if (ctx->size > MAX_DIRECT_RANKS)
        return 0;
    for (int p = 0; p < ctx->size; p++) {
        size_t len = 0;
        if (loom_p2p_window(ctx, p, &len) == NULL || len < 2 * 64)
            return 0;
    }
    return 1;
}

loom_status_t loom_allreduce_staged(loom_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->size, me = ctx->rank;
    const size_t es = a->esize;
    const char *in = a->sendbuf;
    char *out = a->recvbuf;
    if (n == 1 || a->count == 0)
        return alone(a, n);
    char *win[MAX_DIRECT_RANKS];
    size_t wlen = 0;
    for (int p = 0; p < n; p++)
        win[p] = loom_p2p_window(ctx, p, &wlen);
    const size_t half = wlen / 2, chunk = half / es ? half / es : 1;
    uint32_t step = STEP_ADDRS;
    loom_status_t st = LOOM_SUCCESS;
    for (size_t off = 0, k = 0; off < a->count && st == LOOM_SUCCESS; off += chunk, k++) {
        const size_t m = a->count - off < chunk ? a->count - off : chunk;
        const size_t base = (k & 1) * half;
        size_t first, mine = slice(m, n, me, &first);
        /* Peers read every slice but ours from our window; ours we read from in. */
        memcpy(win[me] + base, in + off * es, first * es);
        memcpy(win[me] + base + (first + mine) * es, in + (off + first + mine) * es,
               (m - first - mine) * es);
        if ((st = fence(ctx, step++)) != LOOM_SUCCESS)
            break;
        char *acc = win[me] + base + first * es;
        for (int j = 1; j < n && mine; j++) {
            int p = (me + j) % n;
            loom_ctx_reduce(ctx, acc, j == 1 ? in + (off + first) * es : acc,
                            win[p] + base + first * es, mine, a->dtype, a->op);
        }
        if (a->op == LOOM_AVG && mine)
            loom_reduce_avg_finalize(acc, mine, a->dtype, n);
        if ((st = fence(ctx, step++)) != LOOM_SUCCESS)
            break;
        for (int j = 0; j < n; j++) {
            int p = (me + j) % n;
            size_t pfirst, pcount = slice(m, n, p, &pfirst);
            if (pcount)
                copy_out(out + (off + pfirst) * es, win[p] + base + pfirst * es, pcount * es);
        }
    }
    return st == LOOM_SUCCESS ? fence(ctx, step) : st;
}
