/*
 * check_algorithms.c - every algorithm of the table, run by 1..8 threads over
 * the in-memory transport (thread_harness.h), against a serial reference.
 *
 * Inputs are small integers chosen so that every result is exact in every
 * dtype (|partial sums| <= 128 fits bfloat16; products are powers of two
 * <= 256, which uint8 wraps to 0 like the reference does), so results are
 * compared bit for bit; only float AVG (a division) is compared with a
 * tolerance. Each Check test loops over rank counts, counts, in place / out of
 * place, dtypes and ops inside a few harness runs, and reports the first
 * failure with its coordinates plus the number of failures.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_suites.h"
#include "thread_harness.h"
#include "src/accel.h"

#define MAX_RANKS 8
#define BIG_COUNT 100003

static const loom_dtype_t dtypes[] = { LOOM_INT32, LOOM_FLOAT32, LOOM_FLOAT64, LOOM_BFLOAT16,
                                       LOOM_UINT8 };
#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))
static const size_t counts[] = { 0, 1, 7, 1031 };
#define NCOUNTS (sizeof(counts) / sizeof(counts[0]))
static const loom_op_t all_ops[] = { LOOM_SUM, LOOM_PROD, LOOM_MIN, LOOM_MAX, LOOM_AVG,
                                     LOOM_BAND, LOOM_BOR, LOOM_BXOR };
static const loom_op_t some_ops[] = { LOOM_SUM, LOOM_MAX, LOOM_AVG };

static const char *const dtype_names[LOOM_NUM_DTYPES] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32",
    "float64", "int16", "uint16"
};
static const char *const op_names[LOOM_NUM_OPS] = { "sum", "prod", "min", "max", "avg",
                                                    "band", "bor", "bxor" };

/* ---- element access ---------------------------------------------------- */

static size_t esize_of(loom_dtype_t dt)
{
    switch (dt) {
    case LOOM_UINT8: return 1;
    case LOOM_BFLOAT16: return 2;
    case LOOM_INT32: case LOOM_FLOAT32: return 4;
    case LOOM_FLOAT64: return 8;
    default: return 0;
    }
}

static int is_float(loom_dtype_t dt)
{
    return dt == LOOM_FLOAT32 || dt == LOOM_FLOAT64 || dt == LOOM_BFLOAT16;
}

/* Integer dtypes only: a float dtype is refused (tested in check_collectives). */
static int is_bitwise(loom_op_t op)
{
    return op == LOOM_BAND || op == LOOM_BOR || op == LOOM_BXOR;
}

/* Our own bfloat16 conversions, round to nearest even, so the tests do not
 * trust the code under test. */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Store v as element i; integer types wrap like the library's arithmetic. */
static void enc(void *buf, size_t i, loom_dtype_t dt, double v)
{
    char *p = (char *)buf + i * esize_of(dt);
    switch (dt) {
    case LOOM_UINT8: { uint8_t x = (uint8_t)(int64_t)v; memcpy(p, &x, 1); break; }
    case LOOM_INT32: { int32_t x = (int32_t)(uint32_t)(int64_t)v; memcpy(p, &x, 4); break; }
    case LOOM_FLOAT32: { float x = (float)v; memcpy(p, &x, 4); break; }
    case LOOM_FLOAT64: memcpy(p, &v, 8); break;
    case LOOM_BFLOAT16: { uint16_t x = to_bf16((float)v); memcpy(p, &x, 2); break; }
    default: break;
    }
}

static double dec(const void *buf, size_t i, loom_dtype_t dt)
{
    const char *p = (const char *)buf + i * esize_of(dt);
    switch (dt) {
    case LOOM_UINT8: { uint8_t x; memcpy(&x, p, 1); return x; }
    case LOOM_INT32: { int32_t x; memcpy(&x, p, 4); return x; }
    case LOOM_FLOAT32: { float x; memcpy(&x, p, 4); return x; }
    case LOOM_FLOAT64: { double x; memcpy(&x, p, 8); return x; }
    case LOOM_BFLOAT16: { uint16_t x; memcpy(&x, p, 2); return from_bf16(x); }
    default: return 0;
    }
}

/* Element j of rank's input for a test of op (salt varies it between calls). */
static double in_val(loom_op_t op, loom_dtype_t dt, int rank, size_t j, unsigned salt)
{
    unsigned h = (unsigned)rank * 7u + (unsigned)j * 13u + salt;
    if (op == LOOM_PROD)
        return (double)(1 + h % 2);
    if (dt == LOOM_UINT8)
        return (double)(h % 32);
    return (double)(h % 33) - 16.0;
}

/* The reduction of element j over n ranks, as the library must compute it. */
static double ref_val(loom_op_t op, loom_dtype_t dt, int n, size_t j, unsigned salt)
{
    double acc = in_val(op, dt, 0, j, salt);
    for (int r = 1; r < n; r++) {
        double x = in_val(op, dt, r, j, salt);
        switch (op) {
        case LOOM_PROD: acc *= x; break;
        case LOOM_MIN: acc = x < acc ? x : acc; break;
        case LOOM_MAX: acc = x > acc ? x : acc; break;
        /* Integer dtypes only; their values are small integers, so exact in a double. */
        case LOOM_BAND: acc = (double)((int64_t)acc & (int64_t)x); break;
        case LOOM_BOR: acc = (double)((int64_t)acc | (int64_t)x); break;
        case LOOM_BXOR: acc = (double)((int64_t)acc ^ (int64_t)x); break;
        default: acc += x; break;
        }
    }
    if (op == LOOM_AVG)
        acc = is_float(dt) ? acc / n : (double)((int64_t)acc / n);
    return acc;
}

/* Does element i of buf hold v? Bit-exact, except float AVG (a division). */
static int elem_ok(const void *buf, size_t i, loom_dtype_t dt, loom_op_t op, double v)
{
    size_t es = esize_of(dt);
    if (op == LOOM_AVG && is_float(dt)) {
        double tol = dt == LOOM_BFLOAT16 ? 1.0 / 128 : dt == LOOM_FLOAT32 ? 1e-6 : 1e-14;
        return fabs(dec(buf, i, dt) - v) <= tol * (fabs(v) > 1 ? fabs(v) : 1);
    }
    unsigned char want[8];
    enc(want, 0, dt, v);
    return memcmp((const char *)buf + i * es, want, es) == 0;
}

/* ---- one harness run ---------------------------------------------------- */

typedef struct run {
    const loom_algo_t *algo;
    int n;
    int big;                     /* also run BIG_COUNT on this rank count */
    pthread_barrier_t barrier;   /* for tests that compare ranks' buffers */
    void *shared[MAX_RANKS];
    int stop;                    /* set by rank 0 between the barriers */
    atomic_int arrived;          /* barrier test */
    pthread_mutex_t lock;
    int failures;
    char first[600];
} run_t;

static void report(run_t *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void report(run_t *run, const char *fmt, ...)
{
    pthread_mutex_lock(&run->lock);
    if (run->failures++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(run->first, sizeof(run->first), fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&run->lock);
}

/* Coordinates of the current case, for failure messages. */
typedef struct where {
    char s[200];
} where_t;

static where_t where(const run_t *run, const loom_ctx_t *ctx, size_t count, loom_dtype_t dt,
                     loom_op_t op, int inplace, int root)
{
    where_t w;
    snprintf(w.s, sizeof(w.s), "%s/%s n=%d rank=%d count=%zu %s %s %s root=%d",
             loom_coll_name(run->algo->coll), run->algo->name, run->n, ctx->rank, count,
             dtype_names[dt], op_names[op], inplace ? "in-place" : "out-of-place", root);
    return w;
}

/* Run one collective as the core would: fresh sequence number, descriptor and
 * total (equal on every rank) on every rank. A failure stops the world so no
 * rank waits 10 s. */
static int run_coll(loom_ctx_t *ctx, run_t *run, loom_coll_args_t *a, uint64_t total,
                    const where_t *w)
{
    ctx->seq++;
    ctx->desc = (uint32_t)a->coll | (uint32_t)a->dtype << 8 | (uint32_t)a->op << 16;
    ctx->total = total;
    loom_status_t st = run->algo->run(ctx, a);
    if (st != LOOM_SUCCESS) {
        report(run, "%s: returned %d (%s)", w->s, (int)st, ctx->err->msg);
        ctx->tp_ops->abort(ctx->tp, LOOM_ERR_ABORTED);
        return -1;
    }
    return 0;
}

static void *xmalloc(size_t bytes)
{
    /* Never 0 bytes, so every buffer is a distinct valid pointer. */
    void *p = malloc(bytes + 16);
    ck_assert_ptr_nonnull(p);
    memset(p, 0xa5, bytes + 16);
    return p;
}

/* Is buf (bytes long) still all poison (0xa5)? */
static int untouched(const void *buf, size_t bytes)
{
    const unsigned char *p = buf;
    for (size_t i = 0; i < bytes; i++)
        if (p[i] != 0xa5)
            return 0;
    return 1;
}

static size_t ncounts_for(const run_t *run)
{
    return NCOUNTS + (run->big ? 1 : 0);
}

static size_t count_at(size_t k)
{
    return k < NCOUNTS ? counts[k] : BIG_COUNT;
}

/* Big counts only for a few dtypes, to keep the suite fast. */
static int skip_big(size_t count, loom_dtype_t dt, loom_op_t op)
{
    return count == BIG_COUNT &&
           !((dt == LOOM_INT32 || dt == LOOM_FLOAT64) && (op == LOOM_SUM || op == LOOM_AVG));
}

/* Roots tried: first, middle, last rank (deduplicated). */
static int roots_of(int n, int roots[3])
{
    int k = 0;
    roots[k++] = 0;
    if (n / 2 != 0)
        roots[k++] = n / 2;
    if (n - 1 != 0 && n - 1 != n / 2)
        roots[k++] = n - 1;
    return k;
}

/* ---- bodies, one per collective (run by every rank) ---------------------- */

static void body_allreduce(loom_ctx_t *ctx, void *arg)
{
    run_t *run = arg;
    const int n = ctx->size, rank = ctx->rank;
    unsigned salt = 0;

    for (size_t ci = 0; ci < ncounts_for(run); ci++)
    for (int inplace = 0; inplace < 2; inplace++)
    for (size_t di = 0; di < NDTYPES; di++)
    for (size_t oi = 0; oi < sizeof(all_ops) / sizeof(all_ops[0]); oi++) {
        const size_t count = count_at(ci);
        const loom_dtype_t dt = dtypes[di];
        const loom_op_t op = all_ops[oi];
        const size_t es = esize_of(dt);
        if (skip_big(count, dt, op) || (is_bitwise(op) && is_float(dt)))
            continue;
        salt++;
        where_t w = where(run, ctx, count, dt, op, inplace, -1);
        char *in = xmalloc(count * es), *out = inplace ? in : xmalloc(count * es);
        for (size_t j = 0; j < count; j++)
            enc(in, j, dt, in_val(op, dt, rank, j, salt));
        loom_coll_args_t a = { .coll = LOOM_COLL_ALLREDUCE, .sendbuf = in, .recvbuf = out,
                               .count = count, .esize = es, .dtype = dt, .op = op };
        int ok = run_coll(ctx, run, &a, count, &w) == 0;
        for (size_t j = 0; ok && j < count; j++) {
            if (!elem_ok(out, j, dt, op, ref_val(op, dt, n, j, salt))) {
                report(run, "%s: element %zu is %g, expected %g", w.s, j, dec(out, j, dt),
                     ref_val(op, dt, n, j, salt));
                break;
            }
            if (!inplace && !elem_ok(in, j, dt, LOOM_SUM, in_val(op, dt, rank, j, salt))) {
                report(run, "%s: input element %zu changed", w.s, j);
                break;
            }
        }
        if (!inplace)
            free(out);
        free(in);
        if (!ok)
            return;
    }
}

/*
 * Allreduce with inputs whose sums round (fractions of mixed magnitude), where
 * a different reduction order gives different bits: every rank must still end
 * with the same bits, close to the exact sum.
 */
static void body_allreduce_identical(loom_ctx_t *ctx, void *arg)
{
    run_t *run = arg;
    const int n = ctx->size, rank = ctx->rank;
    static const loom_dtype_t fdt[] = { LOOM_FLOAT32, LOOM_FLOAT64, LOOM_BFLOAT16 };
    static const loom_op_t fops[] = { LOOM_SUM, LOOM_AVG };

    for (size_t ci = 1; ci < ncounts_for(run); ci++)
    for (size_t di = 0; di < 3; di++)
    for (size_t oi = 0; oi < 2; oi++) {
        const size_t count = count_at(ci);
        const loom_dtype_t dt = fdt[di];
        const loom_op_t op = fops[oi];
        const size_t es = esize_of(dt);
        where_t w = where(run, ctx, count, dt, op, 0, -1);
        char *in = xmalloc(count * es), *out = xmalloc(count * es);
        for (size_t j = 0; j < count; j++) {
            unsigned h = ((unsigned)rank * 2654435761u) ^ ((unsigned)j * 40503u);
            double scale = (h & 1) ? 1000.0 : 0.001;
            enc(in, j, dt, ((double)(h % 100000) / 997.0 - 50.0) * scale);
        }
        loom_coll_args_t a = { .coll = LOOM_COLL_ALLREDUCE, .sendbuf = in, .recvbuf = out,
                               .count = count, .esize = es, .dtype = dt, .op = op };
        int ok = run_coll(ctx, run, &a, count, &w) == 0;
        /* Everyone reaches both barriers, failed or not, or the others hang. */
        run->shared[rank] = ok ? out : NULL;
        pthread_barrier_wait(&run->barrier);
        if (rank == 0) {
            for (int r = 1; r < n; r++) {
                if (run->shared[0] && run->shared[r] &&
                    memcmp(run->shared[0], run->shared[r], count * es) != 0) {
                    report(run, "%s: ranks 0 and %d hold different bits", w.s, r);
                    break;
                }
            }
            /* Sanity against the exact sum: bounded by eps * n * sum |x|. */
            double eps = dt == LOOM_BFLOAT16 ? 1.0 / 128 : dt == LOOM_FLOAT32 ? 1e-6 : 1e-14;
            for (size_t j = 0; ok && j < count; j++) {
                double sum = 0, mag = 0;
                for (int r = 0; r < n; r++) {
                    unsigned h = ((unsigned)r * 2654435761u) ^ ((unsigned)j * 40503u);
                    double scale = (h & 1) ? 1000.0 : 0.001;
                    double x = ((double)(h % 100000) / 997.0 - 50.0) * scale;
                    char tmp[8];
                    enc(tmp, 0, dt, x);
                    x = dec(tmp, 0, dt);
                    sum += x;
                    mag += fabs(x);
                }
                if (op == LOOM_AVG) {
                    sum /= n;
                    mag /= n;
                }
                if (fabs(dec(out, j, dt) - sum) > eps * (n + 1) * (mag + 1e-30)) {
                    report(run, "%s: element %zu is %g, exact %g", w.s, j, dec(out, j, dt), sum);
                    break;
                }
            }
            run->stop = run->failures > 0;
        }
        pthread_barrier_wait(&run->barrier);
        free(out);
        free(in);
        /* Decided by one rank, so all leave together and none waits at a barrier alone. */
        if (run->stop)
            return;
    }
}

static void body_broadcast(loom_ctx_t *ctx, void *arg)
{
    run_t *run = arg;
    const int n = ctx->size, rank = ctx->rank;
    int roots[3], nroots = roots_of(n, roots);
    unsigned salt = 0;

    for (size_t ci = 0; ci < ncounts_for(run); ci++)
    for (int ri = 0; ri < nroots; ri++)
    for (size_t di = 0; di < NDTYPES; di++) {
        const size_t count = count_at(ci);
        const loom_dtype_t dt = dtypes[di];
        const size_t es = esize_of(dt);
        const int root = roots[ri];
        if (skip_big(count, dt, LOOM_SUM))
            continue;
        salt++;
        where_t w = where(run, ctx, count, dt, LOOM_SUM, 1, root);
        char *buf = xmalloc(count * es);
        if (rank == root)
            for (size_t j = 0; j < count; j++)
                enc(buf, j, dt, in_val(LOOM_SUM, dt, root, j, salt));
        loom_coll_args_t a = { .coll = LOOM_COLL_BROADCAST, .sendbuf = buf, .recvbuf = buf,
                               .count = count, .esize = es, .dtype = dt, .root = root };
        int ok = run_coll(ctx, run, &a, count, &w) == 0;
        for (size_t j = 0; ok && j < count; j++) {
            if (!elem_ok(buf, j, dt, LOOM_SUM, in_val(LOOM_SUM, dt, root, j, salt))) {
                report(run, "%s: element %zu is %g", w.s, j, dec(buf, j, dt));
                break;
            }
        }
        free(buf);
        if (!ok)
            return;
    }
}

static void body_reduce(loom_ctx_t *ctx, void *arg)
{
    run_t *run = arg;
    const int n = ctx->size, rank = ctx->rank;
    int roots[3], nroots = roots_of(n, roots);
    unsigned salt = 0;

    for (size_t ci = 0; ci < ncounts_for(run); ci++)
    for (int ri = 0; ri < nroots; ri++)
    for (int inplace = 0; inplace < 2; inplace++)
    for (size_t di = 0; di < NDTYPES; di++)
    for (size_t oi = 0; oi < sizeof(some_ops) / sizeof(some_ops[0]); oi++) {
        const size_t count = count_at(ci);
        const loom_dtype_t dt = dtypes[di];
        const loom_op_t op = some_ops[oi];
        const size_t es = esize_of(dt);
        const int root = roots[ri];
        if (skip_big(count, dt, op))
            continue;
        salt++;
        where_t w = where(run, ctx, count, dt, op, inplace, root);
        char *in = xmalloc(count * es);
        /* Non-roots: a poisoned recvbuf out of place (it must stay so), NULL in place. */
        char *out = rank == root ? (inplace ? in : xmalloc(count * es))
                                 : (inplace ? NULL : xmalloc(count * es));
        for (size_t j = 0; j < count; j++)
            enc(in, j, dt, in_val(op, dt, rank, j, salt));
        loom_coll_args_t a = { .coll = LOOM_COLL_REDUCE, .sendbuf = in, .recvbuf = out,
                               .count = count, .esize = es, .dtype = dt, .op = op,
                               .root = root };
        int ok = run_coll(ctx, run, &a, count, &w) == 0;
        if (ok && rank == root) {
            for (size_t j = 0; j < count; j++) {
                if (!elem_ok(out, j, dt, op, ref_val(op, dt, n, j, salt))) {
                    report(run, "%s: element %zu is %g, expected %g", w.s, j, dec(out, j, dt),
                         ref_val(op, dt, n, j, salt));
                    break;
                }
            }
        }
        if (ok && rank != root && out != NULL && !untouched(out, count * es))
            report(run, "%s: recvbuf of a non-root was written", w.s);
        for (size_t j = 0; ok && (rank != root || !inplace) && j < count; j++) {
            if (!elem_ok(in, j, dt, LOOM_SUM, in_val(op, dt, rank, j, salt))) {
                report(run, "%s: input element %zu changed", w.s, j);
                break;
            }
        }
        if (out != in)
            free(out);
        free(in);
        if (!ok)
            return;
    }
}

static void body_allgather(loom_ctx_t *ctx, void *arg)
{
    run_t *run = arg;
    const int n = ctx->size, rank = ctx->rank;
    unsigned salt = 0;

    for (size_t ci = 0; ci < ncounts_for(run); ci++)
    for (int inplace = 0; inplace < 2; inplace++)
    for (size_t di = 0; di < NDTYPES; di++) {
        const size_t count = count_at(ci);
        const loom_dtype_t dt = dtypes[di];
        const size_t es = esize_of(dt);
        if (skip_big(count, dt, LOOM_SUM))
            continue;
        salt++;
        where_t w = where(run, ctx, count, dt, LOOM_SUM, inplace, -1);
        char *out = xmalloc((size_t)n * count * es);
        char *in = inplace ? out + (size_t)rank * count * es : xmalloc(count * es);
        for (size_t j = 0; j < count; j++)
            enc(in, j, dt, in_val(LOOM_SUM, dt, rank, j, salt));
        loom_coll_args_t a = { .coll = LOOM_COLL_ALLGATHER, .sendbuf = in, .recvbuf = out,
                               .count = count, .esize = es, .dtype = dt };
        int ok = run_coll(ctx, run, &a, count, &w) == 0;
        for (int r = 0; ok && r < n; r++) {
            for (size_t j = 0; j < count; j++) {
                if (!elem_ok(out, (size_t)r * count + j, dt, LOOM_SUM,
                             in_val(LOOM_SUM, dt, r, j, salt))) {
                    report(run, "%s: element %zu of block %d is wrong", w.s, j, r);
                    r = n;
                    break;
                }
            }
        }
        for (size_t j = 0; ok && !inplace && j < count; j++) {
            if (!elem_ok(in, j, dt, LOOM_SUM, in_val(LOOM_SUM, dt, rank, j, salt))) {
                report(run, "%s: input element %zu changed", w.s, j);
                break;
            }
        }
        if (!inplace)
            free(in);
        free(out);
        if (!ok)
            return;
    }
}

/* allgatherv layout: uneven blocks (some empty) with one-element gaps between them. */
static void v_layout(size_t count, int n, size_t *cnt, size_t *displs, size_t *total)
{
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        cnt[i] = (count + 3 * (size_t)i) % (count + 1);
        displs[i] = off;
        off += cnt[i] + 1;
    }
    *total = off;
}

static void body_allgatherv(loom_ctx_t *ctx, void *arg)
{
    run_t *run = arg;
    const int n = ctx->size, rank = ctx->rank;
    unsigned salt = 0;

    for (size_t ci = 0; ci < ncounts_for(run); ci++)
    for (int inplace = 0; inplace < 2; inplace++)
    for (size_t di = 0; di < NDTYPES; di++) {
        const size_t count = count_at(ci);
        const loom_dtype_t dt = dtypes[di];
        const size_t es = esize_of(dt);
        size_t cnt[MAX_RANKS], displs[MAX_RANKS], total;
        if (skip_big(count, dt, LOOM_SUM))
            continue;
        salt++;
        v_layout(count, n, cnt, displs, &total);
        where_t w = where(run, ctx, count, dt, LOOM_SUM, inplace, -1);
        char *out = xmalloc(total * es);
        char *in = inplace ? out + displs[rank] * es : xmalloc(cnt[rank] * es);
        for (size_t j = 0; j < cnt[rank]; j++)
            enc(in, j, dt, in_val(LOOM_SUM, dt, rank, j, salt));
        loom_coll_args_t a = { .coll = LOOM_COLL_ALLGATHERV, .sendbuf = in, .recvbuf = out,
                               .count = cnt[rank], .esize = es, .dtype = dt, .counts = cnt,
                               .displs = displs };
        int ok = run_coll(ctx, run, &a, total, &w) == 0;
        for (int r = 0; ok && r < n; r++) {
            for (size_t j = 0; j < cnt[r]; j++) {
                if (!elem_ok(out, displs[r] + j, dt, LOOM_SUM, in_val(LOOM_SUM, dt, r, j, salt))) {
                    report(run, "%s: element %zu of block %d is wrong", w.s, j, r);
                    r = n;
                    break;
                }
            }
            if (r < n && !untouched(out + (displs[r] + cnt[r]) * es, es)) {
                report(run, "%s: the gap after block %d was written", w.s, r);
                break;
            }
        }
        if (!inplace)
            free(in);
        free(out);
        if (!ok)
            return;
    }
}

static void body_reduce_scatter(loom_ctx_t *ctx, void *arg)
{
    run_t *run = arg;
    const int n = ctx->size, rank = ctx->rank;
    unsigned salt = 0;

    for (size_t ci = 0; ci < ncounts_for(run); ci++)
    for (int inplace = 0; inplace < 2; inplace++)
    for (size_t di = 0; di < NDTYPES; di++)
    for (size_t oi = 0; oi < sizeof(some_ops) / sizeof(some_ops[0]); oi++) {
        const size_t count = count_at(ci), all = (size_t)n * count;
        const loom_dtype_t dt = dtypes[di];
        const loom_op_t op = some_ops[oi];
        const size_t es = esize_of(dt);
        if (skip_big(count, dt, op))
            continue;
        salt++;
        where_t w = where(run, ctx, count, dt, op, inplace, -1);
        char *in = xmalloc(all * es), *out = inplace ? in : xmalloc(count * es);
        for (size_t j = 0; j < all; j++)
            enc(in, j, dt, in_val(op, dt, rank, j, salt));
        loom_coll_args_t a = { .coll = LOOM_COLL_REDUCE_SCATTER, .sendbuf = in, .recvbuf = out,
                               .count = count, .esize = es, .dtype = dt, .op = op };
        int ok = run_coll(ctx, run, &a, count, &w) == 0;
        for (size_t j = 0; ok && j < count; j++) {
            double want = ref_val(op, dt, n, (size_t)rank * count + j, salt);
            if (!elem_ok(out, j, dt, op, want)) {
                report(run, "%s: element %zu is %g, expected %g", w.s, j, dec(out, j, dt), want);
                break;
            }
        }
        for (size_t j = 0; ok && !inplace && j < all; j++) {
            if (!elem_ok(in, j, dt, LOOM_SUM, in_val(op, dt, rank, j, salt))) {
                report(run, "%s: input element %zu changed", w.s, j);
                break;
            }
        }
        if (!inplace)
            free(out);
        free(in);
        if (!ok)
            return;
    }
}

/* What src sends dst as element j of its block: unique per (src, dst, j). */
static double a2a_val(loom_dtype_t dt, int src, int dst, size_t j, unsigned salt)
{
    return in_val(LOOM_SUM, dt, src, j * 3 + (size_t)dst * 5, salt + (unsigned)dst);
}

static void body_alltoall(loom_ctx_t *ctx, void *arg)
{
    run_t *run = arg;
    const int n = ctx->size, rank = ctx->rank;
    unsigned salt = 0;

    for (size_t ci = 0; ci < ncounts_for(run); ci++)
    for (int inplace = 0; inplace < 2; inplace++)
    for (size_t di = 0; di < NDTYPES; di++) {
        const size_t count = count_at(ci), all = (size_t)n * count;
        const loom_dtype_t dt = dtypes[di];
        const size_t es = esize_of(dt);
        if (skip_big(count, dt, LOOM_SUM))
            continue;
        salt++;
        where_t w = where(run, ctx, count, dt, LOOM_SUM, inplace, -1);
        char *in = xmalloc(all * es), *out = inplace ? in : xmalloc(all * es);
        for (int d = 0; d < n; d++)
            for (size_t j = 0; j < count; j++)
                enc(in, (size_t)d * count + j, dt, a2a_val(dt, rank, d, j, salt));
        loom_coll_args_t a = { .coll = LOOM_COLL_ALLTOALL, .sendbuf = in, .recvbuf = out,
                               .count = count, .esize = es, .dtype = dt };
        int ok = run_coll(ctx, run, &a, count, &w) == 0;
        for (int s = 0; ok && s < n; s++) {
            for (size_t j = 0; j < count; j++) {
                if (!elem_ok(out, (size_t)s * count + j, dt, LOOM_SUM,
                             a2a_val(dt, s, rank, j, salt))) {
                    report(run, "%s: element %zu of block %d is wrong", w.s, j, s);
                    s = n;
                    break;
                }
                if (!inplace && !elem_ok(in, (size_t)s * count + j, dt, LOOM_SUM,
                                         a2a_val(dt, rank, s, j, salt))) {
                    report(run, "%s: input element %zu of block %d changed", w.s, j, s);
                    s = n;
                    break;
                }
            }
        }
        if (!inplace)
            free(out);
        free(in);
        if (!ok)
            return;
    }
}

/* Elements src sends dst in alltoallv: uneven, some empty; symmetric in place
 * (a rank sends each peer what it receives from it, as MPI_IN_PLACE requires). */
static size_t v_count(size_t count, int src, int dst, int symmetric)
{
    size_t k = symmetric ? (size_t)(src + dst) : (size_t)(2 * src + dst);
    return (count + k) % (count + 1);
}

static void body_alltoallv(loom_ctx_t *ctx, void *arg)
{
    run_t *run = arg;
    const int n = ctx->size, rank = ctx->rank;
    unsigned salt = 0;

    for (size_t ci = 0; ci < ncounts_for(run); ci++)
    for (int inplace = 0; inplace < 2; inplace++)
    for (size_t di = 0; di < NDTYPES; di++) {
        const size_t count = count_at(ci);
        const loom_dtype_t dt = dtypes[di];
        const size_t es = esize_of(dt);
        size_t sc[MAX_RANKS], sd[MAX_RANKS], rc[MAX_RANKS], rd[MAX_RANKS], stot = 0, rtot = 0;
        if (skip_big(count, dt, LOOM_SUM))
            continue;
        salt++;
        /* Send blocks packed in rank order, receive blocks in reverse order,
         * each followed by a one-element gap that must stay untouched. */
        for (int i = 0; i < n; i++) {
            sc[i] = v_count(count, rank, i, inplace);
            sd[i] = stot;
            stot += sc[i] + 1;
        }
        for (int i = n - 1; i >= 0; i--) {
            rc[i] = v_count(count, i, rank, inplace);
            rd[i] = rtot;
            rtot += rc[i] + 1;
        }
        where_t w = where(run, ctx, count, dt, LOOM_SUM, inplace, -1);
        char *out = xmalloc(rtot * es), *in = inplace ? out : xmalloc(stot * es);
        const size_t *wc = inplace ? rc : sc, *wd = inplace ? rd : sd;
        for (int d = 0; d < n; d++)
            for (size_t j = 0; j < wc[d]; j++)
                enc(in, wd[d] + j, dt, a2a_val(dt, rank, d, j, salt));
        loom_coll_args_t a = { .coll = LOOM_COLL_ALLTOALLV, .sendbuf = in, .recvbuf = out,
                               .count = 0, .esize = es, .dtype = dt, .counts = rc,
                               .displs = rd, .scounts = inplace ? rc : sc,
                               .sdispls = inplace ? rd : sd };
        int ok = run_coll(ctx, run, &a, count, &w) == 0;
        for (int s = 0; ok && s < n; s++) {
            for (size_t j = 0; j < rc[s]; j++) {
                if (!elem_ok(out, rd[s] + j, dt, LOOM_SUM, a2a_val(dt, s, rank, j, salt))) {
                    report(run, "%s: element %zu of block %d is wrong", w.s, j, s);
                    s = n;
                    break;
                }
            }
            if (s < n && !untouched(out + (rd[s] + rc[s]) * es, es)) {
                report(run, "%s: the gap after block %d was written", w.s, s);
                break;
            }
        }
        for (int d = 0; ok && !inplace && d < n; d++) {
            for (size_t j = 0; j < sc[d]; j++) {
                if (!elem_ok(in, sd[d] + j, dt, LOOM_SUM, a2a_val(dt, rank, d, j, salt))) {
                    report(run, "%s: input element %zu of block %d changed", w.s, j, d);
                    d = n;
                    break;
                }
            }
        }
        if (!inplace)
            free(in);
        free(out);
        if (!ok)
            return;
    }
}

static void body_gather(loom_ctx_t *ctx, void *arg)
{
    run_t *run = arg;
    const int n = ctx->size, rank = ctx->rank;
    int roots[3], nroots = roots_of(n, roots);
    unsigned salt = 0;

    for (size_t ci = 0; ci < ncounts_for(run); ci++)
    for (int ri = 0; ri < nroots; ri++)
    for (int inplace = 0; inplace < 2; inplace++)
    for (size_t di = 0; di < NDTYPES; di++) {
        const size_t count = count_at(ci);
        const loom_dtype_t dt = dtypes[di];
        const size_t es = esize_of(dt);
        const int root = roots[ri];
        if (skip_big(count, dt, LOOM_SUM))
            continue;
        salt++;
        where_t w = where(run, ctx, count, dt, LOOM_SUM, inplace, root);
        /* Non-roots: a poisoned recvbuf out of place (must stay so), NULL in place. */
        char *out = rank == root ? xmalloc((size_t)n * count * es)
                                 : (inplace ? NULL : xmalloc(count * es));
        char *in = rank == root && inplace ? out + (size_t)root * count * es : xmalloc(count * es);
        for (size_t j = 0; j < count; j++)
            enc(in, j, dt, in_val(LOOM_SUM, dt, rank, j, salt));
        loom_coll_args_t a = { .coll = LOOM_COLL_GATHER, .sendbuf = in, .recvbuf = out,
                               .count = count, .esize = es, .dtype = dt, .root = root };
        int ok = run_coll(ctx, run, &a, count, &w) == 0;
        for (int r = 0; ok && rank == root && r < n; r++) {
            for (size_t j = 0; j < count; j++) {
                if (!elem_ok(out, (size_t)r * count + j, dt, LOOM_SUM,
                             in_val(LOOM_SUM, dt, r, j, salt))) {
                    report(run, "%s: element %zu of block %d is wrong", w.s, j, r);
                    r = n;
                    break;
                }
            }
        }
        if (ok && rank != root && out != NULL && !untouched(out, count * es))
            report(run, "%s: recvbuf of a non-root was written", w.s);
        for (size_t j = 0; ok && j < count; j++) {
            if (!elem_ok(in, j, dt, LOOM_SUM, in_val(LOOM_SUM, dt, rank, j, salt))) {
                report(run, "%s: input element %zu changed", w.s, j);
                break;
            }
        }
        if (!(rank == root && inplace))
            free(in);
        free(out);
        if (!ok)
            return;
    }
}

static void body_scatter(loom_ctx_t *ctx, void *arg)
{
    run_t *run = arg;
    const int n = ctx->size, rank = ctx->rank;
    int roots[3], nroots = roots_of(n, roots);
    unsigned salt = 0;

    for (size_t ci = 0; ci < ncounts_for(run); ci++)
    for (int ri = 0; ri < nroots; ri++)
    for (int inplace = 0; inplace < 2; inplace++)
    for (size_t di = 0; di < NDTYPES; di++) {
        const size_t count = count_at(ci), all = (size_t)n * count;
        const loom_dtype_t dt = dtypes[di];
        const size_t es = esize_of(dt);
        const int root = roots[ri];
        if (skip_big(count, dt, LOOM_SUM))
            continue;
        salt++;
        where_t w = where(run, ctx, count, dt, LOOM_SUM, inplace, root);
        /* Non-roots: NULL sendbuf in place, poison otherwise (never read). */
        char *in = rank == root ? xmalloc(all * es) : (inplace ? NULL : xmalloc(all * es));
        char *out = rank == root && inplace ? in + (size_t)root * count * es : xmalloc(count * es);
        if (rank == root)
            for (size_t j = 0; j < all; j++)
                enc(in, j, dt, in_val(LOOM_SUM, dt, root, j, salt));
        loom_coll_args_t a = { .coll = LOOM_COLL_SCATTER, .sendbuf = in, .recvbuf = out,
                               .count = count, .esize = es, .dtype = dt, .root = root };
        int ok = run_coll(ctx, run, &a, count, &w) == 0;
        for (size_t j = 0; ok && j < count; j++) {
            if (!elem_ok(out, j, dt, LOOM_SUM,
                         in_val(LOOM_SUM, dt, root, (size_t)rank * count + j, salt))) {
                report(run, "%s: element %zu is wrong", w.s, j);
                break;
            }
        }
        for (size_t j = 0; ok && rank == root && j < all; j++) {
            if (!elem_ok(in, j, dt, LOOM_SUM, in_val(LOOM_SUM, dt, root, j, salt))) {
                report(run, "%s: input element %zu changed", w.s, j);
                break;
            }
        }
        if (!(rank == root && inplace))
            free(out);
        free(in);
        if (!ok)
            return;
    }
}

/* Nobody may leave round k before everyone arrived at it; the rank arriving
 * last is made late on purpose, so a barrier that does not wait is caught. */
static void body_barrier(loom_ctx_t *ctx, void *arg)
{
    run_t *run = arg;
    const int n = ctx->size, rank = ctx->rank;

    for (int k = 0; k < 20; k++) {
        if (rank == k % n)
            usleep(300);
        atomic_fetch_add(&run->arrived, 1);
        where_t w = where(run, ctx, 0, LOOM_UINT8, LOOM_SUM, 0, -1);
        loom_coll_args_t a = { .coll = LOOM_COLL_BARRIER, .esize = 1, .dtype = LOOM_UINT8 };
        if (run_coll(ctx, run, &a, 0, &w) != 0)
            return;
        int seen = atomic_load(&run->arrived);
        if (seen < n * (k + 1)) {
            report(run, "%s: left round %d when only %d of %d arrivals happened", w.s, k, seen,
                 n * (k + 1));
            return;
        }
    }
}

typedef void (*body_fn)(loom_ctx_t *ctx, void *arg);

static body_fn body_of(loom_coll_t coll)
{
    switch (coll) {
    case LOOM_COLL_ALLREDUCE: return body_allreduce;
    case LOOM_COLL_BROADCAST: return body_broadcast;
    case LOOM_COLL_REDUCE: return body_reduce;
    case LOOM_COLL_ALLGATHER: return body_allgather;
    case LOOM_COLL_ALLGATHERV: return body_allgatherv;
    case LOOM_COLL_REDUCE_SCATTER: return body_reduce_scatter;
    case LOOM_COLL_ALLTOALL: return body_alltoall;
    case LOOM_COLL_ALLTOALLV: return body_alltoallv;
    case LOOM_COLL_GATHER: return body_gather;
    case LOOM_COLL_SCATTER: return body_scatter;
    case LOOM_COLL_BARRIER: return body_barrier;
    default: return NULL;
    }
}

/* Run body once on n ranks (nodes of per_node consecutive ranks; 0: no
 * topology) and check it left no failure and no stray message. */
static void run_one(const loom_algo_t *algo, body_fn body, int n, int flags, int per_node,
                    int big)
{
    const char *mname = flags & LOOM_HARNESS_RENDEZVOUS ? "rendezvous" : "eager";
    run_t run;
    memset(&run, 0, sizeof(run));
    run.algo = algo;
    run.n = n;
    run.big = big;
    pthread_mutex_init(&run.lock, NULL);
    pthread_barrier_init(&run.barrier, NULL, (unsigned)n);
    int left = loom_harness_run_nodes(n, flags, per_node, body, &run);
    pthread_barrier_destroy(&run.barrier);
    pthread_mutex_destroy(&run.lock);
    ck_assert_msg(run.failures == 0, "%s/%s on %d ranks, %d per node (%s): %d failures, first: %s",
                  loom_coll_name(algo->coll), algo->name, n, per_node, mname, run.failures,
                  run.first);
    ck_assert_msg(left == 0,
                  "%s/%s on %d ranks, %d per node (%s): harness returned %d (stray messages)",
                  loom_coll_name(algo->coll), algo->name, n, per_node, mname, left);
}

/* Run body on 1..MAX_RANKS ranks, over a buffering (eager) transport and over
 * one where sends complete only when matched (rendezvous); the big count on 3
 * (odd, not a power of two: uneven blocks, fold) and MAX_RANKS ranks. */
static void sweep(const loom_algo_t *algo, body_fn body)
{
    ck_assert_ptr_nonnull(body);
    for (int mode = 0; mode < 2; mode++)
    for (int n = 1; n <= MAX_RANKS; n++)
        run_one(algo, body, n, mode ? LOOM_HARNESS_RENDEZVOUS : 0, 0,
                n == 3 || n == MAX_RANKS);
}

/* One test per table entry (a loop test over the table). */
START_TEST(test_algorithm)
{
    const loom_algo_t *algo = &loom_algorithms[_i];
    sweep(algo, body_of(algo->coll));
}
END_TEST

START_TEST(test_allreduce_identical)
{
    for (size_t i = 0; i < loom_num_algorithms; i++)
        if (loom_algorithms[i].coll == LOOM_COLL_ALLREDUCE)
            sweep(&loom_algorithms[i], body_allreduce_identical);
}
END_TEST

/* The hierarchical allreduce on emulated nodes, in both transport modes:
 * 2x2, 3x2, 2x3 and 4x2 take the hierarchical path (2x3 with the big count:
 * three uneven blocks), the others fall back to the ring. */
START_TEST(test_hierarchical)
{
    static const struct { int n, per_node, big; } layouts[] = {
        { 4, 2, 0 }, { 6, 2, 0 }, { 6, 3, 1 }, { 8, 2, 0 },
        { 5, 2, 0 }, { 7, 3, 0 },     /* uneven nodes */
        { 3, 3, 0 }, { 4, 1, 0 }, { 1, 1, 0 },   /* one node; one rank per node */
    };
    const loom_algo_t *algo = loom_algo_find(LOOM_COLL_ALLREDUCE, "hierarchical");
    ck_assert_ptr_nonnull(algo);
    for (int mode = 0; mode < 2; mode++)
    for (size_t i = 0; i < sizeof(layouts) / sizeof(layouts[0]); i++) {
        int flags = mode ? LOOM_HARNESS_RENDEZVOUS : 0;
        run_one(algo, body_allreduce, layouts[i].n, flags, layouts[i].per_node,
                layouts[i].big);
        run_one(algo, body_allreduce_identical, layouts[i].n, flags, layouts[i].per_node,
                layouts[i].big);
    }
}
END_TEST

/* ---- the table and the selection ---------------------------------------- */

START_TEST(test_table)
{
    static const char *const names[LOOM_COLL_COUNT] = {
        "allreduce", "broadcast", "reduce", "allgather", "allgatherv", "reduce_scatter",
        "alltoall", "alltoallv", "gather", "scatter", "barrier"
    };
    int per_coll[LOOM_COLL_COUNT] = { 0 };

    for (int c = 0; c < LOOM_COLL_COUNT; c++)
        ck_assert_str_eq(loom_coll_name((loom_coll_t)c), names[c]);
    ck_assert_ptr_nonnull(loom_coll_name(LOOM_COLL_COUNT));
    ck_assert_uint_ge(loom_num_algorithms, 14);
    for (size_t i = 0; i < loom_num_algorithms; i++) {
        const loom_algo_t *al = &loom_algorithms[i];
        ck_assert_int_lt(al->coll, LOOM_COLL_COUNT);
        ck_assert_ptr_nonnull(al->run);
        ck_assert_ptr_eq(loom_algo_find(al->coll, al->name), al);
        per_coll[al->coll]++;
    }
    for (int c = 0; c < LOOM_COLL_COUNT; c++)
        ck_assert_msg(per_coll[c] > 0, "no algorithm for %s", names[c]);
    ck_assert_ptr_null(loom_algo_find(LOOM_COLL_ALLREDUCE, "tree"));
    ck_assert_ptr_null(loom_algo_find(LOOM_COLL_BROADCAST, "ring"));
    ck_assert_ptr_null(loom_algo_find(LOOM_COLL_ALLREDUCE, NULL));
}
END_TEST

/* For the selection only: a transport whose every peer is readable. */
static int always_readable(loom_tp_t *tp, int peer)
{
    (void)tp;
    (void)peer;
    return 1;
}

static loom_status_t never_read(loom_tp_t *tp, int peer, void *buf, uint64_t addr, size_t len)
{
    (void)tp, (void)peer, (void)buf, (void)addr, (void)len;
    return LOOM_ERR_INTERNAL;
}

static const loom_transport_ops_t readable_transport = {
    .size = sizeof(loom_transport_ops_t),
    .name = "readable",
    .peer_readable = always_readable,
    .peer_read = never_read,
};

static void *some_window(loom_tp_t *tp, int peer, size_t *len_p)
{
    static char window[4096];
    (void)tp, (void)peer;
    *len_p = sizeof(window);
    return window;
}

static const loom_transport_ops_t windowed_transport = {
    .size = sizeof(loom_transport_ops_t),
    .name = "windowed",
    .peer_readable = always_readable,
    .peer_read = never_read,
    .window = some_window,
};

START_TEST(test_select)
{
    static const int sizes[] = { 1, 2, 3, 8, 64, 1000 };
    static const size_t cnts[] = { 0, 1, 1000, 1u << 20, (size_t)1 << 28, SIZE_MAX / 2 };
    loom_ctx_t ctx;
    memset(&ctx, 0, sizeof(ctx));

    for (int c = 0; c < LOOM_COLL_COUNT; c++)
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++)
    for (size_t ci = 0; ci < sizeof(cnts) / sizeof(cnts[0]); ci++) {
        ctx.size = sizes[si];
        loom_coll_args_t a = { .coll = (loom_coll_t)c, .count = cnts[ci], .esize = 4,
                               .dtype = LOOM_FLOAT32, .op = LOOM_SUM };
        const loom_algo_t *al = loom_algo_select(&ctx, &a, NULL);
        ck_assert_msg(al != NULL, "nothing selected for %s size %d count %zu",
                      loom_coll_name(a.coll), ctx.size, a.count);
        ck_assert_int_eq(al->coll, c);
        ck_assert(al->can_run == NULL || al->can_run(&ctx, &a));
        ck_assert_ptr_eq(loom_algo_select(&ctx, &a, "auto"), al);
        ck_assert_ptr_null(loom_algo_select(&ctx, &a, "no-such-algorithm"));
    }

    /* Every forced name that exists for the collective is honoured. */
    ctx.size = 5;
    for (size_t i = 0; i < loom_num_algorithms; i++) {
        const loom_algo_t *al = &loom_algorithms[i];
        loom_coll_args_t a = { .coll = al->coll, .count = 7, .esize = 4 };
        if (al->can_run == NULL || al->can_run(&ctx, &a))
            ck_assert_ptr_eq(loom_algo_select(&ctx, &a, al->name), al);
        else   /* e.g. direct, without a transport that reads peers */
            ck_assert_ptr_null(loom_algo_select(&ctx, &a, al->name));
    }
    loom_coll_args_t b = { .coll = LOOM_COLL_BROADCAST, .count = 7, .esize = 4 };
    ck_assert_ptr_null(loom_algo_select(&ctx, &b, "ring"));

    /* The documented crossovers. */
    ctx.size = 8;
    loom_coll_args_t r = { .coll = LOOM_COLL_ALLREDUCE, .count = 256, .esize = 4 };
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "recdbl");
    r.count = 64 << 10;
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "rabenseifner");
    r.count = 64 << 20;
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "ring");
    loom_coll_args_t g = { .coll = LOOM_COLL_ALLGATHER, .count = 16, .esize = 4 };
    ck_assert_str_eq(loom_algo_select(&ctx, &g, NULL)->name, "bruck");
    g.count = 1 << 20;
    ck_assert_str_eq(loom_algo_select(&ctx, &g, NULL)->name, "ring");

    /* hierarchical: several nodes with the same number > 1 of ranks, from 256 KiB. */
    static const int four_by_two[8] = { 0, 0, 1, 1, 2, 2, 3, 3 };
    static const int uneven[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    static const int one_node[8] = { 0 };
    static const int one_each[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    loom_ctx_set_topology(&ctx, four_by_two, 4);
    ck_assert_int_eq(ctx.ranks_per_node, 2);
    r.count = 64 << 10;
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "hierarchical");
    r.count = 64 << 20;
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "hierarchical");
    ck_assert_str_eq(loom_algo_select(&ctx, &r, "ring")->name, "ring");
    r.count = (64 << 10) - 1;
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "rabenseifner");
    g.count = 1 << 20;
    ck_assert_str_eq(loom_algo_select(&ctx, &g, NULL)->name, "hierarchical");
    g.count = 1024;   /* 32 KiB gathered: below the hierarchical threshold */
    ck_assert_str_eq(loom_algo_select(&ctx, &g, NULL)->name, "bruck");
    loom_coll_args_t bc = { .coll = LOOM_COLL_BROADCAST, .count = 1 << 20, .esize = 4 };
    ck_assert_str_eq(loom_algo_select(&ctx, &bc, NULL)->name, "hierarchical");
    bc.count = 1024;
    ck_assert_str_eq(loom_algo_select(&ctx, &bc, NULL)->name, "binomial");
    r.count = 64 << 20;
    loom_ctx_set_topology(&ctx, uneven, 3);
    ck_assert_int_eq(ctx.ranks_per_node, 0);
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "ring");
    loom_ctx_set_topology(&ctx, one_node, 1);
    ck_assert_int_eq(ctx.ranks_per_node, 8);
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "ring");
    loom_ctx_set_topology(&ctx, one_each, 8);
    ck_assert_int_eq(ctx.ranks_per_node, 1);
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "ring");

    /* direct: one node whose transport reads peers' memory, from its thresholds up;
     * never across nodes (the hierarchical algorithms use it inside each node). */
    ctx.tp_ops = &readable_transport;
    ctx.tp = NULL;
    loom_ctx_set_topology(&ctx, one_node, 1);
    r.count = 64 << 10;   /* 256 KiB */
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "direct");
    r.count = 16 << 10;   /* 64 KiB: a few messages are cheaper */
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "rabenseifner");
    r.count = 1024;
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "recdbl");
    /* with staging windows: staged from 3 ranks, direct on 2 */
    ctx.tp_ops = &windowed_transport;
    r.count = 64 << 10;
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "staged");
    ctx.size = 2;
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "direct");
    ctx.size = 8;
    bc.count = 8 << 10;   /* 32 KiB */
    ck_assert_str_eq(loom_algo_select(&ctx, &bc, NULL)->name, "direct");
    g.count = 2048;       /* 64 KiB gathered */
    ck_assert_str_eq(loom_algo_select(&ctx, &g, NULL)->name, "direct");
    /* below 1 KiB the windows' slots, on any number of ranks; from 1 KiB messages */
    r.count = 255;
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "slots");
    ctx.size = 2;
    r.count = 1;
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "slots");
    r.count = 256;
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "recdbl");
    ctx.size = 1;   /* alone: nothing to exchange, the first algorithm does */
    r.count = 1;
    ck_assert_str_ne(loom_algo_select(&ctx, &r, NULL)->name, "slots");
    ctx.size = 8;
    /* without windows, never */
    ctx.tp_ops = &readable_transport;
    r.count = 1;
    ck_assert_str_eq(loom_algo_select(&ctx, &r, NULL)->name, "recdbl");
}
END_TEST

/* LOOM_ALGO's rows: the old coll=name items, byte ranges, auto, first match. */
START_TEST(test_algo_rules)
{
    loom_algo_rule_t rules[LOOM_ALGO_MAX_RULES];
    size_t n = 99;
    char why[256];
    ck_assert_int_eq(loom_algo_rules_parse("", rules, LOOM_ALGO_MAX_RULES, &n, why, sizeof(why)),
                     0);
    ck_assert_uint_eq(n, 0);
    /* The old syntax, with what it always ignored: no '=', an unknown collective. */
    ck_assert_int_eq(loom_algo_rules_parse("allreduce=ring,junk,frobnicate=x,allgather=bruck",
                                           rules, LOOM_ALGO_MAX_RULES, &n, why, sizeof(why)), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(rules[0].coll, LOOM_COLL_ALLREDUCE);
    ck_assert_str_eq(rules[0].name, "ring");
    ck_assert_uint_eq(rules[0].min_bytes, 0);
    ck_assert(rules[0].max_bytes == SIZE_MAX);
    ck_assert_int_eq(rules[1].coll, LOOM_COLL_ALLGATHER);

    ck_assert_int_eq(loom_algo_rules_parse("allreduce=ring@1M-,allreduce=recdbl@0-64K,"
                                           "allreduce=auto@64K-128k,allreduce=rabenseifner,"
                                           "allgather=ring@-1G", rules, LOOM_ALGO_MAX_RULES, &n,
                                           why, sizeof(why)), 0);
    ck_assert_uint_eq(n, 5);
    ck_assert_uint_eq(rules[0].min_bytes, 1u << 20);
    ck_assert(rules[0].max_bytes == SIZE_MAX);
    ck_assert_uint_eq(rules[1].max_bytes, 64u << 10);
    ck_assert_uint_eq(rules[2].max_bytes, 128u << 10);
    ck_assert_uint_eq(rules[4].max_bytes, (size_t)1 << 30);

    loom_ctx_t ctx;
    memset(&ctx, 0, sizeof(ctx));
    ctx.size = 4;
    loom_coll_args_t a = { .coll = LOOM_COLL_ALLREDUCE, .esize = 4 };
    static const struct { size_t bytes; const char *name; } want[] = {
        { 0, "recdbl" }, { (64 << 10) - 4, "recdbl" }, { 64 << 10, "auto" },
        { (128 << 10) - 4, "auto" }, { 128 << 10, "rabenseifner" },
        { (1 << 20) - 4, "rabenseifner" }, { 1 << 20, "ring" }, { (size_t)1 << 33, "ring" },
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        a.count = want[i].bytes / 4;
        const loom_algo_rule_t *r = loom_algo_rule_match(rules, n, &ctx, &a);
        ck_assert_ptr_nonnull(r);
        ck_assert_msg(strcmp(r->name, want[i].name) == 0, "%zu bytes: %s, not %s",
                      want[i].bytes, r->name, want[i].name);
    }
    /* allgather measures the gathered total; others have no row: Loom chooses. */
    loom_coll_args_t g = { .coll = LOOM_COLL_ALLGATHER, .esize = 4, .count = (1 << 28) };
    ck_assert_ptr_null(loom_algo_rule_match(rules, n, &ctx, &g));   /* 4 GiB gathered */
    g.count = 1 << 26;   /* 1 GiB gathered: HI is exclusive */
    ck_assert_ptr_null(loom_algo_rule_match(rules, n, &ctx, &g));
    g.count = (1 << 26) - 1;
    ck_assert_ptr_nonnull(loom_algo_rule_match(rules, n, &ctx, &g));
    loom_coll_args_t b = { .coll = LOOM_COLL_BROADCAST, .esize = 4, .count = 10 };
    ck_assert_ptr_null(loom_algo_rule_match(rules, n, &ctx, &b));

    static const char *const bad[] = {
        "allreduce=ring@", "allreduce=ring@-", "allreduce=ring@1M", "allreduce=ring@x-",
        "allreduce=ring@1T-", "allreduce=ring@64K-64K", "allreduce=ring@2M-1M", "allreduce=",
        "allreduce=@1M-", "allreduce=a_name_longer_than_thirty_one_chars",
        "allreduce=ring@99999999999999999999-",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        why[0] = '\0';
        ck_assert_msg(loom_algo_rules_parse(bad[i], rules, LOOM_ALGO_MAX_RULES, &n, why,
                                            sizeof(why)) == -1, "%s accepted", bad[i]);
        ck_assert_msg(why[0] != '\0', "%s: no reason", bad[i]);
    }
    char many[(LOOM_ALGO_MAX_RULES + 1) * sizeof("barrier=dissemination,")] = "";
    for (int i = 0; i < LOOM_ALGO_MAX_RULES + 1; i++)
        strcat(many, "barrier=dissemination,");
    ck_assert_int_eq(loom_algo_rules_parse(many, rules, LOOM_ALGO_MAX_RULES, &n, why,
                                           sizeof(why)), -1);
}
END_TEST

/* ---- the harness itself: it must be able to catch what it is for -------- */

typedef struct mm_arg {
    size_t len[2];
    loom_status_t st[2];
} mm_arg_t;

static void body_mismatch(loom_ctx_t *ctx, void *arg)
{
    mm_arg_t *m = arg;
    char buf[16] = { 0 };
    ctx->seq = 1;
    if (ctx->rank == 0)
        m->st[0] = loom_p2p_sendrecv(ctx, 1, buf, m->len[0], -1, NULL, 0, 3);
    else
        m->st[1] = loom_p2p_sendrecv(ctx, -1, NULL, 0, 0, buf, m->len[1], 3);
}

START_TEST(test_harness_mismatch)
{
    mm_arg_t m = { { 4, 8 }, { -1, -1 } };
    ck_assert_int_eq(loom_harness_run(2, body_mismatch, &m), 0);
    ck_assert_int_eq(m.st[0], LOOM_SUCCESS);
    ck_assert_int_eq(m.st[1], LOOM_ERR_MISMATCH);
    m = (mm_arg_t){ { 8, 8 }, { -1, -1 } };
    ck_assert_int_eq(loom_harness_run(2, body_mismatch, &m), 0);
    ck_assert_int_eq(m.st[1], LOOM_SUCCESS);
}
END_TEST

static void body_stray(loom_ctx_t *ctx, void *arg)
{
    char b = 0;
    loom_tp_req_t req;
    if (ctx->rank == 0)
        loom_p2p_isend(ctx, 1, 0, &b, 1, &req);
}

static void body_timeout(loom_ctx_t *ctx, void *arg)
{
    char b = 0;
    loom_status_t *st = arg;
    ctx->timeout_s = 0.2;
    if (ctx->rank == 1)
        st[1] = loom_p2p_sendrecv(ctx, -1, NULL, 0, 0, &b, 1, 0);
}

/* Both ranks send, wait, then receive: fine when the transport buffers,
 * a deadlock (timeout) when it does not. */
static void body_send_first(loom_ctx_t *ctx, void *arg)
{
    loom_status_t *st = arg;
    char out = 1, in = 0;
    loom_tp_req_t req;
    ctx->timeout_s = 0.2;
    st[ctx->rank] = loom_p2p_isend(ctx, 1 - ctx->rank, 0, &out, 1, &req);
    if (st[ctx->rank] == LOOM_SUCCESS)
        st[ctx->rank] = loom_p2p_wait(ctx, &req);
    if (st[ctx->rank] == LOOM_SUCCESS)
        st[ctx->rank] = loom_p2p_sendrecv(ctx, -1, NULL, 0, 1 - ctx->rank, &in, 1, 0);
}

START_TEST(test_harness_rendezvous)
{
    loom_status_t st[2] = { -1, -1 };
    ck_assert_int_eq(loom_harness_run_ex(2, 0, body_send_first, st), 0);
    ck_assert_int_eq(st[0], LOOM_SUCCESS);
    ck_assert_int_eq(st[1], LOOM_SUCCESS);
    ck_assert_int_gt(loom_harness_run_ex(2, LOOM_HARNESS_RENDEZVOUS, body_send_first, st), 0);
    ck_assert_int_eq(st[0], LOOM_ERR_TIMEOUT);
    ck_assert_int_eq(st[1], LOOM_ERR_TIMEOUT);
}
END_TEST

START_TEST(test_harness_stray_and_timeout)
{
    /* A message nobody receives is reported. */
    ck_assert_int_eq(loom_harness_run(2, body_stray, NULL), 1);
    /* A receive nobody matches times out (and is reported). */
    loom_status_t st[2] = { LOOM_SUCCESS, LOOM_SUCCESS };
    ck_assert_int_eq(loom_harness_run(2, body_timeout, st), 1);
    ck_assert_int_eq(st[1], LOOM_ERR_TIMEOUT);
}
END_TEST

/* The core calls every entry of its accelerator table without checking it; the
 * host-only table (present in every build) calls everything host memory and
 * refuses to stage. */
static loom_status_t host_coll(void *arg, const loom_coll_args_t *a)
{
    (void)arg, (void)a;
    ck_abort_msg("the null accelerator ran a host collective");
    return LOOM_ERR_INTERNAL;
}

static loom_status_t host_p2p(void *hbuf, void *arg)
{
    (void)hbuf, (void)arg;
    ck_abort_msg("the null accelerator ran a host send/recv");
    return LOOM_ERR_INTERNAL;
}

START_TEST(test_accel_tables)
{
    const loom_accel_ops_t *tables[2] = {loom_accel, &loom_accel_null};
    for (int i = 0; i < 2; i++) {
        const loom_accel_ops_t *t = tables[i];
        ck_assert_uint_eq(t->size, sizeof(loom_accel_ops_t));
        ck_assert_msg(t->name && t->coll_memory && t->ptr_memory && t->run_coll && t->run_p2p &&
                          t->comm_quiesce && t->comm_release && t->describe,
                      "accelerator table %d (%s) misses an entry", i, t->name);
        char text[256] = "";
        t->describe(text, sizeof(text));
        ck_assert_msg(text[0], "%s: describe wrote nothing", t->name);
    }
    const loom_accel_ops_t *n = &loom_accel_null;
    ck_assert_str_eq(n->name, "null");
    float buf[8] = {0};
    loom_coll_args_t a = {.coll = LOOM_COLL_ALLREDUCE, .sendbuf = buf, .recvbuf = buf + 4,
                          .count = 4, .esize = 4, .dtype = LOOM_FLOAT32};
    int on_device = -1, device = 7;
    loom_err_t err;
    loom_err_clear(&err);
    ck_assert_int_eq(n->coll_memory(&a, 2, 0, &on_device, &device, &err), LOOM_SUCCESS);
    ck_assert_int_eq(on_device, 0);
    ck_assert_int_eq(n->ptr_memory(buf, &device), 0);
    ck_assert_int_eq(n->run_coll(NULL, 0, &a, 0, host_coll, NULL, &err),
                     LOOM_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "accelerator"), "%s", err.msg);
    loom_err_clear(&err);
    ck_assert_int_eq(n->run_p2p(NULL, 0, 1, buf, 16, host_p2p, NULL, &err), LOOM_ERR_UNSUPPORTED);
    n->comm_quiesce(NULL);
    n->comm_release(NULL);
}
END_TEST

Suite *loom_algorithms_suite(void)
{
    Suite *s = suite_create("algorithms");
    TCase *tc = tcase_create("table");
    tcase_add_test(tc, test_table);
    tcase_add_test(tc, test_accel_tables);
    tcase_add_test(tc, test_select);
    tcase_add_test(tc, test_algo_rules);
    tcase_add_test(tc, test_harness_mismatch);
    tcase_add_test(tc, test_harness_stray_and_timeout);
    tcase_add_test(tc, test_harness_rendezvous);
    suite_add_tcase(s, tc);

    tc = tcase_create("run");
    /* Each test sweeps 1..8 ranks over hundreds of cases. */
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_algorithm, 0, (int)loom_num_algorithms);
    tcase_add_test(tc, test_allreduce_identical);
    tcase_add_test(tc, test_hierarchical);
    suite_add_tcase(s, tc);
    return s;
}
