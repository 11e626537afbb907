/* check_cuda.c - host-side tests of the GPU code (built with CUDA, no GPU needed).
 *
 *  - ops: the element code the GPU kernels run (base/reduce_ops.h, the functions
 *    kernels.cu instantiates for every dtype x op) against an independent
 *    reference: float16 and bfloat16 results against the correctly rounded
 *    exact result (computing in float first is innocuous: 24 >= 2p + 2 bits),
 *    NaN propagation, +-inf, signed zeros; every type against the CPU kernels,
 *    which check_reduce.c verifies on their own.
 *  - staging: every collective on "device" buffers through cuda/staging.c, with
 *    1-4 ranks as threads (tests/thread_harness), host memory standing in for
 *    device memory and a device double that refuses to reduce or copy outside
 *    it, with staging buffers small enough to force many passes.
 *  - core hooks: a one-rank communicator with the test backend: GPU buffers are
 *    staged, host/GPU mixes are LOOM_ERR_INVALID_ARG, non-blocking p2p on GPU
 *    buffers is LOOM_ERR_UNSUPPORTED.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_suites.h"
#include "loom_cuda.h"
#include "cuda/cuda_int.h"
#include "base/reduce.h"
#include "base/reduce_ops.h"
#include "thread_harness.h"
#include "check_cuda_fake.h"

#define REQUIRE(cond, ...)                                                              \
    do {                                                                                \
        if (!(cond))                                                                    \
            ck_abort_msg(__VA_ARGS__);                                                  \
    } while (0)

static const char *const dtype_names[LOOM_NUM_DTYPES] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64",
    "float16", "bfloat16", "float32", "float64", "int16", "uint16",
};
static const char *const op_names[LOOM_NUM_OPS] = {"sum", "prod", "min", "max", "avg",
                                                   "band", "bor", "bxor"};

/* ---- the element code of the kernels -------------------------------------- */

typedef void (*elem_fn)(void *out, const void *a, const void *b, size_t n);
typedef void (*avg_fn)(void *buf, size_t n, int nranks);

/* What kernels.cu instantiates: LOOM_AVG reduces with the sum functor. */
#define ELEM_FN(opname, T, sfx)                                                         \
    static void elem_##opname##_##sfx(void *o, const void *a, const void *b, size_t n)  \
    {                                                                                   \
        T *out = o;                                                                     \
        const T *x = a, *y = b;                                                         \
        for (size_t i = 0; i < n; i++)                                                  \
            out[i] = loom_op_##opname##_##sfx(x[i], y[i]);                              \
    }
#define ELEM_FNS(T, sfx)                                                                \
    ELEM_FN(sum, T, sfx)                                                                \
    ELEM_FN(prod, T, sfx)                                                               \
    ELEM_FN(min, T, sfx)                                                                \
    ELEM_FN(max, T, sfx)                                                                \
    static void elem_avg_##sfx(void *b, size_t n, int nranks)                           \
    {                                                                                   \
        T *buf = b;                                                                     \
        for (size_t i = 0; i < n; i++)                                                  \
            buf[i] = loom_op_avg_##sfx(buf[i], nranks);                                 \
    }
#define INT_ELEM_FNS(T, sfx)                                                            \
    ELEM_FNS(T, sfx)                                                                    \
    ELEM_FN(band, T, sfx)                                                               \
    ELEM_FN(bor, T, sfx)                                                                \
    ELEM_FN(bxor, T, sfx)
INT_ELEM_FNS(int8_t, i8)
INT_ELEM_FNS(uint8_t, u8)
INT_ELEM_FNS(int16_t, i16)
INT_ELEM_FNS(uint16_t, u16)
INT_ELEM_FNS(int32_t, i32)
INT_ELEM_FNS(uint32_t, u32)
INT_ELEM_FNS(int64_t, i64)
INT_ELEM_FNS(uint64_t, u64)
ELEM_FNS(uint16_t, f16)
ELEM_FNS(uint16_t, bf16)
ELEM_FNS(float, f32)
ELEM_FNS(double, f64)

/* Floating-point rows have no bitwise ops (NULL): the calls refuse them. */
#define ROW(sfx) {elem_sum_##sfx, elem_prod_##sfx, elem_min_##sfx, elem_max_##sfx, elem_sum_##sfx}
#define INT_ROW(sfx)                                                                    \
    {elem_sum_##sfx, elem_prod_##sfx, elem_min_##sfx, elem_max_##sfx, elem_sum_##sfx,   \
     elem_band_##sfx, elem_bor_##sfx, elem_bxor_##sfx}
static const elem_fn elem_table[LOOM_NUM_DTYPES][LOOM_NUM_OPS] = {
    INT_ROW(i8), INT_ROW(u8), INT_ROW(i32), INT_ROW(u32), INT_ROW(i64), INT_ROW(u64), ROW(f16),
    ROW(bf16), ROW(f32), ROW(f64), INT_ROW(i16), INT_ROW(u16),
};
static const avg_fn avg_table[LOOM_NUM_DTYPES] = {
    elem_avg_i8, elem_avg_u8, elem_avg_i32, elem_avg_u32, elem_avg_i64, elem_avg_u64,
    elem_avg_f16, elem_avg_bf16, elem_avg_f32, elem_avg_f64, elem_avg_i16, elem_avg_u16,
};

static size_t esize(loom_dtype_t dt)
{
    return loom_dtype_size(dt);
}

/* Interesting values of each type, as bit patterns, plus pseudo-random ones. */
static const uint64_t specials_int[] = {0, 1, 2, 3, 0x7f, 0x80, 0xff, 0x7fffffff, 0x80000000u,
                                        0xffffffffu, 0x7fffffffffffffffull,
                                        0x8000000000000000ull, 0xffffffffffffffffull, 12345};
static const uint16_t specials_f16[] = {0x0000, 0x8000, 0x3c00, 0xbc00, 0x7c00, 0xfc00, 0x7e00,
                                        0xfe00, 0x7c01, 0x7bff, 0xfbff, 0x0001, 0x8001, 0x03ff,
                                        0x0400, 0x3c01, 0x1400, 0x5640};
static const uint16_t specials_bf16[] = {0x0000, 0x8000, 0x3f80, 0xbf80, 0x7f80, 0xff80, 0x7fc0,
                                         0xffc0, 0x7f81, 0x7f7f, 0xff7f, 0x0001, 0x8001, 0x007f,
                                         0x0080, 0x3f81, 0x3b80, 0x4b00};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t next_random(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static double specials_double(int i)
{
    const double v[] = {0.0, -0.0, 1.0, -1.0, INFINITY, -INFINITY, NAN, -NAN, 3.5, -2.25,
                        1e-310, 1e300, 0.1, 65504.0, 1e-8};
    return v[i % (int)(sizeof v / sizeof v[0])];
}

/* Element i of a test vector of dt (patterns: every special against every other). */
static void fill(loom_dtype_t dt, void *buf, size_t n, int which)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = next_random();
        size_t pick = which == 0 ? i : i / 24;
        switch (dt) {
        case LOOM_FLOAT16:
            ((uint16_t *)buf)[i] = pick % 3 == 2 ? (uint16_t)r : specials_f16[pick % 18];
            break;
        case LOOM_BFLOAT16:
            ((uint16_t *)buf)[i] = pick % 3 == 2 ? (uint16_t)r : specials_bf16[pick % 18];
            break;
        case LOOM_FLOAT32:
            ((float *)buf)[i] = pick % 3 == 2 ? (float)((int64_t)(r % 2000) - 1000) / 7.0f
                                              : (float)specials_double((int)pick);
            break;
        case LOOM_FLOAT64:
            ((double *)buf)[i] = pick % 3 == 2 ? (double)((int64_t)(r % 2000) - 1000) / 7.0
                                               : specials_double((int)pick);
            break;
        default: {
            uint64_t v = pick % 3 == 2 ? r : specials_int[pick % 14];
            memcpy((char *)buf + i * esize(dt), &v, esize(dt)); /* low bytes: little endian */
            break;
        }
        }
    }
}

/* Correctly rounded binary16 / bfloat16 (nearest, ties to even) of x, from its
 * value alone: bits is the format's significand width including the hidden bit,
 * emin the smallest normal exponent, emax the largest. */
static uint16_t ref_round(double x, int bits, int emin, int emax, int ebits)
{
    uint16_t sign = signbit(x) ? (uint16_t)(1u << (bits - 1 + ebits)) : 0;
    int mbits = bits - 1;
    if (isnan(x))
        return (uint16_t)(sign | (((1u << ebits) - 1) << mbits) | (1u << (mbits - 1)));
    double ax = fabs(x);
    int e;
    if (ax < ldexp(1.0, emin)) {
        double q = nearbyint(ldexp(ax, -(emin - mbits))); /* units of the smallest subnormal */
        return (uint16_t)(sign | (uint16_t)q);             /* 2^mbits: the smallest normal */
    }
    frexp(ax, &e);
    e -= 1; /* ax in [2^e, 2^(e+1)) */
    double q = nearbyint(ldexp(ax, mbits - e));
    if (q >= ldexp(1.0, bits)) {
        q /= 2;
        e++;
    }
    if (e > emax || isinf(ax))
        return (uint16_t)(sign | (((1u << ebits) - 1) << mbits));
    return (uint16_t)(sign | (uint16_t)((e - emin + 1) << mbits) | ((uint16_t)q & ((1u << mbits) - 1)));
}

static double half_value(loom_dtype_t dt, uint16_t h)
{
    return dt == LOOM_FLOAT16 ? (double)loom_half_to_float(h) : (double)loom_bf16_to_float(h);
}

static uint16_t half_round(loom_dtype_t dt, double x)
{
    return dt == LOOM_FLOAT16 ? ref_round(x, 11, -14, 15, 5) : ref_round(x, 8, -126, 127, 8);
}

/* min/max as IEEE 754-2019 minimum/maximum: NaN wins, -0 < +0. */
static double ref_minmax(double a, double b, int want_max)
{
    if (isnan(a))
        return a;
    if (isnan(b))
        return b;
    if (a == b)
        return want_max ? (signbit(a) ? b : a) : (signbit(a) ? a : b);
    return (a < b) == want_max ? b : a;
}

static int half_matches(loom_dtype_t dt, uint16_t got, double want)
{
    if (isnan(want))
        return isnan(half_value(dt, got));
    return got == half_round(dt, want);
}

START_TEST(test_half_ops_match_reference)
{
    const size_t n = 18 * 24 * 3;
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2), *out = malloc(n * 2);
    for (loom_dtype_t dt = LOOM_FLOAT16; dt <= LOOM_BFLOAT16; dt++) {
        fill(dt, a, n, 0);
        fill(dt, b, n, 1);
        for (int op = 0; op < LOOM_NUM_OPS && elem_table[dt][op]; op++) {
            elem_table[dt][op](out, a, b, n);
            if (op == LOOM_AVG)
                avg_table[dt](out, n, 3);
            for (size_t i = 0; i < n; i++) {
                double x = half_value(dt, a[i]), y = half_value(dt, b[i]);
                double want = op == LOOM_SUM   ? x + y
                              : op == LOOM_PROD ? x * y
                              : op == LOOM_MIN  ? ref_minmax(x, y, 0)
                              : op == LOOM_MAX  ? ref_minmax(x, y, 1)
                                                : (double)half_value(dt, half_round(dt, x + y)) / 3.0;
                REQUIRE(half_matches(dt, out[i], want),
                        "%s %s: %#06x op %#06x gave %#06x, want %#06x (%g)", dtype_names[dt],
                        op_names[op], a[i], b[i], out[i], half_round(dt, want), want);
                if ((op == LOOM_MIN || op == LOOM_MAX) && !isnan(want))
                    REQUIRE(signbit(half_value(dt, out[i])) == signbit(want),
                            "%s %s: sign of zero", dtype_names[dt], op_names[op]);
            }
        }
    }
    free(a);
    free(b);
    free(out);
}
END_TEST

START_TEST(test_float_ops_specials)
{
    const size_t n = 15 * 24 * 3;
    float *a = malloc(n * 4), *b = malloc(n * 4), *out = malloc(n * 4);
    double *da = malloc(n * 8), *db = malloc(n * 8), *dout = malloc(n * 8);
    fill(LOOM_FLOAT32, a, n, 0);
    fill(LOOM_FLOAT32, b, n, 1);
    fill(LOOM_FLOAT64, da, n, 0);
    fill(LOOM_FLOAT64, db, n, 1);
    for (int op = 0; op < LOOM_NUM_OPS && elem_table[LOOM_FLOAT32][op]; op++) {
        elem_table[LOOM_FLOAT32][op](out, a, b, n);
        elem_table[LOOM_FLOAT64][op](dout, da, db, n);
        for (size_t i = 0; i < n; i++) {
            float x = a[i], y = b[i];
            float want = op == LOOM_SUM || op == LOOM_AVG ? x + y
                         : op == LOOM_PROD               ? x * y
                                          : (float)ref_minmax(x, y, op == LOOM_MAX);
            REQUIRE(isnan(want) ? isnan(out[i]) : out[i] == want && signbit(out[i]) == signbit(want),
                    "float32 %s: %g op %g gave %g, want %g", op_names[op], x, y, out[i], want);
            double dx = da[i], dy = db[i];
            double dwant = op == LOOM_SUM || op == LOOM_AVG ? dx + dy
                           : op == LOOM_PROD               ? dx * dy
                                                           : ref_minmax(dx, dy, op == LOOM_MAX);
            REQUIRE(isnan(dwant) ? isnan(dout[i])
                                 : dout[i] == dwant && signbit(dout[i]) == signbit(dwant),
                    "float64 %s: %g op %g gave %g, want %g", op_names[op], dx, dy, dout[i], dwant);
        }
    }
    free(a);
    free(b);
    free(out);
    free(da);
    free(db);
    free(dout);
}
END_TEST

/* A NaN made by arithmetic: its payload is the hardware's choice (x86 keeps an
 * operand's, GPUs return the canonical NaN), so only NaN-ness is compared. */
static int arith_nan(loom_dtype_t dt, loom_op_t op, const void *p)
{
    if (op == LOOM_MIN || op == LOOM_MAX)
        return 0; /* these return an operand: same bits everywhere */
    uint16_t h;
    float f;
    double d;
    switch (dt) {
    case LOOM_FLOAT16: memcpy(&h, p, 2); return isnan(loom_half_to_float(h));
    case LOOM_BFLOAT16: memcpy(&h, p, 2); return isnan(loom_bf16_to_float(h));
    case LOOM_FLOAT32: memcpy(&f, p, 4); return isnan(f);
    case LOOM_FLOAT64: memcpy(&d, p, 8); return isnan(d);
    default: return 0;
    }
}

/* Every dtype x op: the kernels' element code gives the CPU kernels' bits, for
 * every vector code this CPU has (NaN payloads of sums and products aside). */
START_TEST(test_ops_match_cpu_kernels)
{
    static const char *const isas[] = {"generic", "avx2", "avx512"};
    const size_t n = 18 * 24 * 3 + 5;
    char *a = malloc(n * 8), *b = malloc(n * 8), *gpu = malloc(n * 8), *cpu = malloc(n * 8);
    for (size_t k = 0; k < 3; k++) {
        if (loom_reduce_use_isa(isas[k]) != LOOM_SUCCESS)
            continue;
        for (int dt = 0; dt < LOOM_NUM_DTYPES; dt++) {
            fill(dt, a, n, 0);
            fill(dt, b, n, 1);
            for (int op = 0; op < LOOM_NUM_OPS && elem_table[dt][op]; op++) {
                elem_table[dt][op](gpu, a, b, n);
                loom_reduce_local3(cpu, a, b, n, dt, op);
                if (op == LOOM_AVG) {
                    avg_table[dt](gpu, n, 3);
                    loom_reduce_avg_finalize(cpu, n, dt, 3);
                }
                size_t es = esize(dt);
                for (size_t i = 0; i < n; i++)
                    REQUIRE(memcmp(gpu + i * es, cpu + i * es, es) == 0 ||
                                (arith_nan(dt, op, gpu + i * es) && arith_nan(dt, op, cpu + i * es)),
                            "%s %s (%s) element %zu differs from the CPU kernel", dtype_names[dt],
                            op_names[op], isas[k], i);
            }
        }
    }
    loom_reduce_use_isa(NULL);
    free(a);
    free(b);
    free(gpu);
    free(cpu);
}
END_TEST

/* ---- staging, rank by rank ------------------------------------------------- */

typedef struct {
    loom_coll_t coll;
    loom_dtype_t dt;
    loom_op_t op;
    size_t count;
    int in_place;
    size_t chunk;
    int nranks;
    _Atomic int failed;
    char msg[512];
} stage_case_t;

static double value_of(int rank, size_t i)
{
    return (double)((int)((rank * 7 + i * 3) % 11) - 5);
}

static void put(loom_dtype_t dt, void *buf, size_t i, double v)
{
    switch (dt) {
    case LOOM_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case LOOM_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)fmod(v + 256.0 * 1024, 256.0); break;
    case LOOM_FLOAT16: ((uint16_t *)buf)[i] = loom_float_to_half((float)v); break;
    case LOOM_FLOAT32: ((float *)buf)[i] = (float)v; break;
    default: ((double *)buf)[i] = v; break;
    }
}

/* Element i of every rank's contribution reduced, as the dtype holds it. */
static double reduced(const stage_case_t *t, size_t i)
{
    double acc = 0;
    for (int r = 0; r < t->nranks; r++) {
        double v = value_of(r, i);
        if (t->dt == LOOM_UINT8)
            v = fmod(v + 256.0, 256.0);
        if (r == 0)
            acc = v;
        else if (t->op == LOOM_SUM || t->op == LOOM_AVG)
            acc += v;
        else if (t->op == LOOM_PROD)
            acc *= v;
        else if (t->op == LOOM_MIN)
            acc = v < acc ? v : acc;
        else
            acc = v > acc ? v : acc;
    }
    if (t->op == LOOM_AVG)
        acc = t->dt == LOOM_INT32 ? trunc(acc / t->nranks) : (double)((float)acc / (float)t->nranks);
    if (t->dt == LOOM_UINT8)
        acc = fmod(acc, 256.0);
    return acc;
}

static void stage_fail(stage_case_t *t, loom_ctx_t *ctx, const char *fmt, size_t i, double got, double want)
{
    if (atomic_exchange(&t->failed, 1) == 0)
        snprintf(t->msg, sizeof(t->msg), "%s %s %s count %zu chunk %zu ranks %d%s rank %d: %s %zu: got %g, want %g",
                 loom_coll_name(t->coll), dtype_names[t->dt], op_names[t->op], t->count, t->chunk,
                 t->nranks, t->in_place ? " in place" : "", ctx->rank, fmt, i, got, want);
    ctx->tp_ops->abort(ctx->tp, LOOM_ERR_ABORTED);
}

static double get(loom_dtype_t dt, const void *buf, size_t i)
{
    switch (dt) {
    case LOOM_INT32: return ((const int32_t *)buf)[i];
    case LOOM_UINT8: return ((const uint8_t *)buf)[i];
    case LOOM_FLOAT16: return loom_half_to_float(((const uint16_t *)buf)[i]);
    case LOOM_FLOAT32: return ((const float *)buf)[i];
    default: return ((const double *)buf)[i];
    }
}

/* v as an element of dt reads back. */
static double stored(loom_dtype_t dt, double v)
{
    char tmp[8];
    put(dt, tmp, 0, v);
    return get(dt, tmp, 0);
}

static loom_status_t harness_host(void *arg, const loom_coll_args_t *a)
{
    loom_ctx_t *ctx = arg;
    if (a->sendbuf && a->coll != LOOM_COLL_BARRIER && is_dev(a->sendbuf))
        return loom_err_set(ctx->err, LOOM_ERR_INTERNAL, "a host collective on device memory");
    const loom_algo_t *algo = loom_algo_select(ctx, a, NULL);
    if (!algo)
        return loom_err_set(ctx->err, LOOM_ERR_INTERNAL, "no algorithm");
    uint64_t total = a->count;
    if (a->coll == LOOM_COLL_ALLGATHERV) {
        total = 0;
        for (int i = 0; i < ctx->size; i++)
            total += a->counts[i];
    } else if (a->coll == LOOM_COLL_ALLTOALLV) {
        total = 0;
    }
    ctx->seq++;
    ctx->desc = (uint32_t)a->coll | (uint32_t)a->dtype << 8 | (uint32_t)a->op << 16;
    ctx->total = total;
    return algo->run(ctx, a);
}

/* Counts of the vector collectives: some blocks empty, some longer than others. */
static size_t vcount(const stage_case_t *t, int from, int to)
{
    return (size_t)((from * 3 + to * 5) % 4) * t->count / 2;
}

static void stage_rank(loom_ctx_t *ctx, void *arg)
{
    stage_case_t *t = arg;
    const int P = ctx->size, me = ctx->rank;
    const loom_dtype_t dt = t->dt;
    const size_t es = esize(dt), n = t->count;
    const int root = (P - 1) / 2;
    size_t send_elems = n, recv_elems = n;
    size_t counts[4], displs[4], scounts[4], sdispls[4];
    size_t stotal = 0, rtotal = 0;
    for (int i = 0; i < P; i++) {
        scounts[i] = t->coll == LOOM_COLL_ALLTOALLV ? vcount(t, me, i) : 0;
        counts[i] = t->coll == LOOM_COLL_ALLTOALLV ? vcount(t, i, me) : vcount(t, i, 0);
        sdispls[i] = stotal;
        displs[i] = rtotal + 3; /* gaps between blocks stay untouched */
        stotal += scounts[i];
        rtotal += counts[i] + 3;
    }
    switch (t->coll) {
    case LOOM_COLL_REDUCE_SCATTER:
    case LOOM_COLL_ALLTOALL:
    case LOOM_COLL_SCATTER: send_elems = n * P; break;
    case LOOM_COLL_ALLTOALLV: send_elems = stotal; break;
    case LOOM_COLL_ALLGATHERV: send_elems = counts[me]; break;
    default: break;
    }
    switch (t->coll) {
    case LOOM_COLL_ALLGATHER:
    case LOOM_COLL_ALLTOALL:
    case LOOM_COLL_GATHER: recv_elems = n * P; break;
    case LOOM_COLL_REDUCE_SCATTER: recv_elems = t->in_place ? n * P : n; break;
    case LOOM_COLL_ALLGATHERV:
    case LOOM_COLL_ALLTOALLV: recv_elems = rtotal + 3; break;
    default: break;
    }
    char *send = calloc(send_elems + 1, es), *recv = calloc(recv_elems + 1, es);
    char *host_send = malloc(t->chunk), *host_recv = malloc(t->chunk), *scratch = malloc(t->chunk);
    region_add(send, (send_elems + 1) * es);
    region_add(recv, (recv_elems + 1) * es);
    region_add_as(scratch, t->chunk, 1);
    /* Inputs: element i of block b from this rank is value_of(me, b * n + i), so
     * each destination can tell what it got. */
    for (size_t i = 0; i < send_elems; i++)
        put(dt, send, i, value_of(me, i));
    for (size_t i = 0; i < recv_elems; i++)
        put(dt, recv, i, -99);
    char *in_place_src = NULL;
    loom_coll_args_t a = {.coll = t->coll, .sendbuf = send, .recvbuf = recv, .count = n,
                          .esize = es, .dtype = dt, .op = t->op, .root = root};
    if (t->coll == LOOM_COLL_ALLGATHERV || t->coll == LOOM_COLL_ALLTOALLV) {
        a.counts = counts;
        a.displs = displs;
        a.count = counts[me];
    }
    if (t->coll == LOOM_COLL_ALLTOALLV) {
        a.scounts = scounts;
        a.sdispls = sdispls;
    }
    if (t->in_place) {
        /* The core's normal form of an in-place call (algorithms.h). */
        if (t->coll == LOOM_COLL_ALLGATHER) {
            for (size_t i = 0; i < n; i++)
                put(dt, recv, me * n + i, value_of(me, i));
            in_place_src = recv + (size_t)me * n * es;
        } else {
            memcpy(recv, send, send_elems * es);
            in_place_src = recv;
        }
        a.sendbuf = in_place_src;
    }
    if (t->coll == LOOM_COLL_BROADCAST) {
        a.sendbuf = a.recvbuf = recv;
        if (me == root)
            memcpy(recv, send, n * es);
    }
    if ((t->coll == LOOM_COLL_GATHER || t->coll == LOOM_COLL_REDUCE) && me != root && !t->in_place)
        a.recvbuf = NULL;
    if (t->coll == LOOM_COLL_SCATTER && me != root)
        a.sendbuf = NULL;

    loom_staging_t s = {.rank = me, .size = P, .err = ctx->err, .run_host = harness_host,
                        .host_arg = ctx, .dev = &fake_ops, .dev_arg = NULL,
                        .host_send = host_send, .host_recv = host_recv, .dev_scratch = scratch,
                        .chunk_bytes = t->chunk};
    loom_status_t st = loom_staging_run(&s, &a);
    if (st != LOOM_SUCCESS) {
        if (atomic_exchange(&t->failed, 1) == 0)
            snprintf(t->msg, sizeof(t->msg), "%s %s ranks %d chunk %zu rank %d: status %d: %.300s",
                     loom_coll_name(t->coll), dtype_names[dt], P, t->chunk, me, (int)st,
                     ctx->err->msg);
        ctx->tp_ops->abort(ctx->tp, LOOM_ERR_ABORTED);
        goto out;
    }
#define EXPECT(what, idx, got_, want_)                                                  \
    do {                                                                                \
        double got = (got_), want = (want_);                                            \
        if (got != want) {                                                              \
            stage_fail(t, ctx, what, (idx), got, want);                                       \
            goto out;                                                                   \
        }                                                                               \
    } while (0)
    switch (t->coll) {
    case LOOM_COLL_ALLREDUCE:
    case LOOM_COLL_REDUCE:
        if (t->coll == LOOM_COLL_REDUCE && me != root)
            break;
        for (size_t i = 0; i < n; i++)
            EXPECT("element", i, get(dt, recv, i), reduced(t, i));
        break;
    case LOOM_COLL_REDUCE_SCATTER:
        for (size_t i = 0; i < n; i++)
            EXPECT("element", i, get(dt, recv, i), reduced(t, me * n + i));
        break;
    case LOOM_COLL_BROADCAST:
        for (size_t i = 0; i < n; i++)
            EXPECT("element", i, get(dt, recv, i), stored(dt, value_of(root, i)));
        break;
    case LOOM_COLL_ALLGATHER:
    case LOOM_COLL_GATHER:
        if (t->coll == LOOM_COLL_GATHER && me != root)
            break;
        for (int r = 0; r < P; r++)
            for (size_t i = 0; i < n; i++)
                EXPECT("element", r * n + i, get(dt, recv, r * n + i), stored(dt, value_of(r, i)));
        break;
    case LOOM_COLL_SCATTER:
        for (size_t i = 0; i < n; i++)
            EXPECT("element", i, get(dt, recv, i), stored(dt, value_of(root, me * n + i)));
        break;
    case LOOM_COLL_ALLTOALL:
        for (int r = 0; r < P; r++)
            for (size_t i = 0; i < n; i++)
                EXPECT("element", r * n + i, get(dt, recv, r * n + i),
                       stored(dt, value_of(r, me * n + i)));
        break;
    case LOOM_COLL_ALLGATHERV:
    case LOOM_COLL_ALLTOALLV:
        for (int r = 0; r < P; r++) {
            /* Rank r's block for me started at its sdispls[me]. */
            size_t from = 0;
            if (t->coll == LOOM_COLL_ALLTOALLV)
                for (int j = 0; j < me; j++)
                    from += vcount(t, r, j);
            for (size_t i = 0; i < counts[r]; i++)
                EXPECT("element", displs[r] + i, get(dt, recv, displs[r] + i),
                       stored(dt, value_of(r, from + i)));
            for (size_t g = displs[r] - 3; g < displs[r]; g++)
                EXPECT("gap element", g, get(dt, recv, g), stored(dt, -99));
        }
        break;
    default: break;
    }
#undef EXPECT
out:
    region_remove(send);
    region_remove(recv);
    region_remove(scratch);
    free(send);
    free(recv);
    free(host_send);
    free(host_recv);
    free(scratch);
}

static void run_stage_case(loom_coll_t coll, loom_dtype_t dt, loom_op_t op, size_t count,
                           int in_place, size_t chunk, int nranks)
{
    stage_case_t t = {.coll = coll, .dt = dt, .op = op, .count = count, .in_place = in_place,
                      .chunk = chunk, .nranks = nranks};
    int left = loom_harness_run(nranks, stage_rank, &t);
    REQUIRE(!t.failed, "%s", t.msg);
    REQUIRE(left == 0, "%s %s ranks %d: %d messages left over", loom_coll_name(coll),
            dtype_names[dt], nranks, left);
}

static const size_t chunks[] = {64, 200, 4096};

START_TEST(test_staging_reductions)
{
    int nranks = _i + 1;
    static const struct { loom_dtype_t dt; loom_op_t op; } cases[] = {
        {LOOM_INT32, LOOM_SUM}, {LOOM_INT32, LOOM_PROD}, {LOOM_INT32, LOOM_MIN},
        {LOOM_INT32, LOOM_MAX}, {LOOM_INT32, LOOM_AVG}, {LOOM_UINT8, LOOM_PROD},
        {LOOM_FLOAT16, LOOM_SUM}, {LOOM_FLOAT32, LOOM_AVG}, {LOOM_FLOAT64, LOOM_MIN},
    };
    const loom_coll_t colls[] = {LOOM_COLL_ALLREDUCE, LOOM_COLL_REDUCE, LOOM_COLL_REDUCE_SCATTER};
    for (size_t c = 0; c < 3; c++)
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
            for (size_t ch = 0; ch < 3; ch++)
                for (int in_place = 0; in_place < 2; in_place++)
                    run_stage_case(colls[c], cases[k].dt, cases[k].op, 37, in_place,
                                   chunks[ch] < 16u * (size_t)nranks ? 16u * (size_t)nranks : chunks[ch],
                                   nranks);
}
END_TEST

START_TEST(test_staging_data_movement)
{
    int nranks = _i + 1;
    const loom_coll_t colls[] = {LOOM_COLL_BROADCAST, LOOM_COLL_ALLGATHER, LOOM_COLL_GATHER,
                                 LOOM_COLL_SCATTER, LOOM_COLL_ALLTOALL, LOOM_COLL_ALLGATHERV,
                                 LOOM_COLL_ALLTOALLV, LOOM_COLL_BARRIER};
    for (size_t c = 0; c < sizeof colls / sizeof colls[0]; c++)
        for (size_t ch = 0; ch < 3; ch++)
            for (int dt = 0; dt < 2; dt++) {
                loom_dtype_t type = dt ? LOOM_FLOAT32 : LOOM_UINT8;
                int can_in_place = colls[c] == LOOM_COLL_ALLGATHER || colls[c] == LOOM_COLL_ALLTOALL;
                size_t chunk = chunks[ch] < 16u * (size_t)nranks ? 16u * (size_t)nranks : chunks[ch];
                run_stage_case(colls[c], type, LOOM_SUM, 29, 0, chunk, nranks);
                if (can_in_place)
                    run_stage_case(colls[c], type, LOOM_SUM, 29, 1, chunk, nranks);
            }
}
END_TEST

/* ---- the core's hooks, on a one-rank communicator --------------------------- */

static loom_comm_t one_rank_comm(void)
{
    loom_config_t cfg = LOOM_CONFIG_INIT;
    cfg.rank = 0;
    cfg.size = 1;
    loom_comm_t c = NULL;
    loom_status_t st = loom_comm_create(&cfg, &c);
    REQUIRE(st == LOOM_SUCCESS, "loom_comm_create: %s: %s", loom_strerror(st),
            loom_comm_last_error(NULL));
    return c;
}

START_TEST(test_core_dispatch)
{
    loom_cuda_test_backend(fake_on_device, &fake_ops, NULL, fake_scratch_alloc, fake_scratch_free);
    loom_comm_t c = one_rank_comm();
    const size_t n = 1000;
    float *dsend = malloc(n * 4), *drecv = malloc(n * 4), *host = malloc(n * 4);
    region_add(dsend, n * 4);
    region_add(drecv, n * 4);
    for (size_t i = 0; i < n; i++) {
        dsend[i] = (float)i;
        drecv[i] = -1;
    }
    long copies = fake_copies;
    loom_status_t st = loom_allreduce(dsend, drecv, n, LOOM_FLOAT32, LOOM_SUM, c);
    ck_assert_msg(st == LOOM_SUCCESS, "allreduce: %s: %s", loom_strerror(st), loom_comm_last_error(c));
    ck_assert_msg(fake_copies > copies, "GPU buffers were not staged");
    for (size_t i = 0; i < n; i++)
        REQUIRE(drecv[i] == (float)i, "allreduce element %zu: %g", i, drecv[i]);

    /* Non-blocking: executed by the communicator's worker. */
    loom_request_t req;
    ck_assert_int_eq(loom_iallgather(dsend, drecv, n, LOOM_FLOAT32, c, &req), LOOM_SUCCESS);
    ck_assert_int_eq(loom_wait(req), LOOM_SUCCESS);

    ck_assert_int_eq(loom_allreduce(dsend, host, n, LOOM_FLOAT32, LOOM_SUM, c),
                     LOOM_ERR_INVALID_ARG);
    ck_assert_msg(strstr(loom_comm_last_error(c), "recvbuf is host memory") &&
                      strstr(loom_comm_last_error(c), "GPU"),
                  "unclear message: %s", loom_comm_last_error(c));
    ck_assert_int_eq(loom_broadcast(drecv, n, LOOM_FLOAT32, 0, c), LOOM_SUCCESS);
    ck_assert_int_eq(loom_alltoall(host, drecv, n, LOOM_FLOAT32, c), LOOM_ERR_INVALID_ARG);
    ck_assert_int_eq(loom_isend(dsend, n, LOOM_FLOAT32, 0, 1, c, &req), LOOM_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(loom_comm_last_error(c), "GPU buffers"), "%s", loom_comm_last_error(c));
    /* An argument error does not break the communicator. */
    ck_assert_int_eq(loom_allreduce(host, host, n, LOOM_FLOAT32, LOOM_SUM, c), LOOM_SUCCESS);

    ck_assert_int_eq(loom_comm_destroy(c), LOOM_SUCCESS);
    loom_cuda_test_backend(NULL, NULL, NULL, NULL, NULL);
    region_remove(dsend);
    region_remove(drecv);
    free(dsend);
    free(drecv);
    free(host);
}
END_TEST

/* Stream-ordered calls check their arguments before touching CUDA, so these
 * hold with or without a GPU. */
START_TEST(test_stream_argument_errors)
{
    loom_comm_t c = one_rank_comm();
    float x[4] = {0};
    cudaStream_t s = 0;
    ck_assert_int_eq(loom_allreduce_stream(x, x, 4, LOOM_FLOAT32, LOOM_SUM, NULL, s),
                     LOOM_ERR_INVALID_ARG);
    ck_assert_msg(strstr(loom_comm_last_error(NULL), "allreduce_stream"), "%s",
                  loom_comm_last_error(NULL));
    ck_assert_int_eq(loom_allreduce_stream(x, x, 4, (loom_dtype_t)42, LOOM_SUM, c, s),
                     LOOM_ERR_INVALID_ARG);
    ck_assert_msg(strstr(loom_comm_last_error(c), "unknown dtype"), "%s", loom_comm_last_error(c));
    ck_assert_int_eq(loom_reduce_stream(x, x, 4, LOOM_FLOAT32, (loom_op_t)9, 0, c, s),
                     LOOM_ERR_INVALID_ARG);
    ck_assert_int_eq(loom_broadcast_stream(x, 4, LOOM_FLOAT32, 1, c, s), LOOM_ERR_INVALID_ARG);
    ck_assert_msg(strstr(loom_comm_last_error(c), "root 1"), "%s", loom_comm_last_error(c));
    ck_assert_int_eq(loom_send_stream(x, 4, LOOM_FLOAT32, -1, 0, c, s), LOOM_ERR_INVALID_ARG);
    ck_assert_msg(strstr(loom_comm_last_error(c), "peer -1"), "%s", loom_comm_last_error(c));
    ck_assert_int_eq(loom_allgatherv_stream(x, 1, x, NULL, NULL, LOOM_FLOAT32, c, s),
                     LOOM_ERR_INVALID_ARG);
    ck_assert_int_eq(loom_comm_set_device(NULL, 0), LOOM_ERR_INVALID_ARG);
    ck_assert_int_eq(loom_comm_stream_status(c), LOOM_SUCCESS);
    ck_assert_int_eq(loom_comm_destroy(c), LOOM_SUCCESS);
}
END_TEST

/* A CUDA build's core calls the CUDA table, which classifies through the
 * same code as loom_cuda_*_on_device (here with the double). */
START_TEST(test_accel_table_is_cuda)
{
    ck_assert_ptr_eq(loom_accel, &loom_accel_cuda);
    ck_assert_str_eq(loom_accel->name, "cuda");
    char text[256] = "";
    loom_accel->describe(text, sizeof(text));
    ck_assert_msg(strncmp(text, "CUDA", 4) == 0, "%s", text);
    loom_cuda_test_backend(fake_on_device, &fake_ops, NULL, fake_scratch_alloc, fake_scratch_free);
    float *d = malloc(64), h[16];
    region_add(d, 64);
    int device = -1, on_device = -1;
    ck_assert_int_eq(loom_accel->ptr_memory(d, &device), 1);
    ck_assert_int_eq(loom_accel->ptr_memory(h, &device), 0);
    loom_coll_args_t a = {.coll = LOOM_COLL_ALLREDUCE, .sendbuf = d, .recvbuf = d, .count = 16,
                          .esize = 4, .dtype = LOOM_FLOAT32};
    loom_err_t err;
    loom_err_clear(&err);
    ck_assert_int_eq(loom_accel->coll_memory(&a, 2, 0, &on_device, &device, &err), LOOM_SUCCESS);
    ck_assert_int_eq(on_device, 1);
    a.recvbuf = h;
    ck_assert_int_eq(loom_accel->coll_memory(&a, 2, 0, &on_device, &device, &err),
                     LOOM_ERR_INVALID_ARG);
    loom_cuda_test_backend(NULL, NULL, NULL, NULL, NULL);
    region_remove(d);
    free(d);
}
END_TEST

/* Without a driver (this machine, CI) every buffer is host memory. */
START_TEST(test_without_driver_all_host)
{
    int device = -7;
    char buf[16] = "host";
    ck_assert_int_eq(loom_cuda_ptr_on_device(buf, &device), 0);
    ck_assert_int_eq(loom_cuda_ptr_on_device(NULL, &device), 0);
    ck_assert_int_eq(device, -7);
}
END_TEST

Suite *loom_cuda_suite(void)
{
    Suite *s = suite_create("cuda");
    TCase *ops = tcase_create("ops");
    tcase_set_timeout(ops, 120);
    tcase_add_test(ops, test_half_ops_match_reference);
    tcase_add_test(ops, test_float_ops_specials);
    tcase_add_test(ops, test_ops_match_cpu_kernels);
    suite_add_tcase(s, ops);
    TCase *staging = tcase_create("staging");
    tcase_set_timeout(staging, 300);
    tcase_add_loop_test(staging, test_staging_reductions, 0, 4);
    tcase_add_loop_test(staging, test_staging_data_movement, 0, 4);
    suite_add_tcase(s, staging);
    TCase *core = tcase_create("core");
    tcase_set_timeout(core, 120);
    tcase_add_test(core, test_core_dispatch);
    tcase_add_test(core, test_accel_table_is_cuda);
    tcase_add_test(core, test_without_driver_all_host);
    tcase_add_test(core, test_stream_argument_errors);
    suite_add_tcase(s, core);
    return s;
}
