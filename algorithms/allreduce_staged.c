/*
 * allreduce_staged.c - allreduce inside one node through the node-wide staging
 * windows the transport shares (every rank maps every peer's).
 *
 * The vector goes through the windows in chunks of half a window, so that two
 * chunks alternate:
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
 *
 * Limits: up to MAX_DIRECT_RANKS ranks, all on one node, every peer's window
 * mapped with a staging area (direct.h) of at least 128 bytes (loom_staged_can_run).
 * Memory: none of its own; the windows belong to the transport.
 */
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "algorithms.h"
#include "blocks.h"
#include "direct.h"
#include "base/reduce.h"

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
        size_t wlen = 0, len = 0;
        char *win = loom_p2p_window(ctx, p, &wlen);
        if (win == NULL || (loom_window_staging(win, wlen, &len), len < 2 * 64))
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
        return loom_direct_alone(a, n);
    char *win[MAX_DIRECT_RANKS];
    size_t wlen = 0;
    for (int p = 0; p < n; p++) {
        size_t whole = 0;
        char *all = loom_p2p_window(ctx, p, &whole);
        win[p] = loom_window_staging(all, whole, &wlen);
    }
    const size_t half = wlen / 2, chunk = half / es ? half / es : 1;
    uint32_t step = STEP_ADDRS;
    loom_status_t st = LOOM_SUCCESS;
    for (size_t off = 0, k = 0; off < a->count && st == LOOM_SUCCESS; off += chunk, k++) {
        const size_t m = a->count - off < chunk ? a->count - off : chunk;
        const size_t base = (k & 1) * half;
        size_t first = loom_block_offset(m, n, me), mine = loom_block_count(m, n, me);
        /* Peers read every slice but ours from our window; ours we read from in. */
        memcpy(win[me] + base, in + off * es, first * es);
        memcpy(win[me] + base + (first + mine) * es, in + (off + first + mine) * es,
               (m - first - mine) * es);
        if ((st = loom_direct_fence(ctx, step++)) != LOOM_SUCCESS)
            break;
        char *acc = win[me] + base + first * es;
        for (int j = 1; j < n && mine; j++) {
            int p = (me + j) % n;
            loom_ctx_reduce(ctx, acc, j == 1 ? in + (off + first) * es : acc,
                            win[p] + base + first * es, mine, a->dtype, a->op);
        }
        if (a->op == LOOM_AVG && mine)
            loom_reduce_avg_finalize(acc, mine, a->dtype, n);
        if ((st = loom_direct_fence(ctx, step++)) != LOOM_SUCCESS)
            break;
        for (int j = 0; j < n; j++) {
            int p = (me + j) % n;
            size_t pfirst = loom_block_offset(m, n, p), pcount = loom_block_count(m, n, p);
            if (pcount)
                copy_out(out + (off + pfirst) * es, win[p] + base + pfirst * es, pcount * es);
        }
    }
    return st == LOOM_SUCCESS ? loom_direct_fence(ctx, step) : st;
}
