/* check_cuda.c - host-side tests of the GPU code (built with CUDA, no GPU needed).
 *
 *  - ops: the element code the GPU kernels run (base/reduce_ops.h, the functions
 *    kernels.cu instantiates for every dtype x op) against an independent
 *    reference: float16 and bfloat16 results against the correctly rounded
 *    exact result (computing in float first is innocuous: 24 >= 2p + 2 bits),
 *    NaN propagation, +-inf, signed zeros; every type against the CPU kernels,
 *    which check_reduce.c verifies on their own.
 *  - without a driver (this machine, CI) every buffer is host memory.
 * The staging code and the core's GPU dispatch run over the CUDA double
 * (tests/check_cuda_staging.c, tests/cuda-double/).
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_suites.h"
#include "loom_cuda.h"
#include "cuda/cuda_int.h"
#include "base/reduce.h"
#include "base/types.h"
#include "base/reduce_ops.h"

#define REQUIRE(cond, ...)                                                              \
    do {                                                                                \
        if (!(cond))                                                                    \
            ck_abort_msg(__VA_ARGS__);                                                  \
    } while (0)


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
                        "%s %s: %#06x op %#06x gave %#06x, want %#06x (%g)", loom_dtype_name(dt),
                        loom_op_name(op), a[i], b[i], out[i], half_round(dt, want), want);
                if ((op == LOOM_MIN || op == LOOM_MAX) && !isnan(want))
                    REQUIRE(signbit(half_value(dt, out[i])) == signbit(want),
                            "%s %s: sign of zero", loom_dtype_name(dt), loom_op_name(op));
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
                    "float32 %s: %g op %g gave %g, want %g", loom_op_name(op), x, y, out[i], want);
            double dx = da[i], dy = db[i];
            double dwant = op == LOOM_SUM || op == LOOM_AVG ? dx + dy
                           : op == LOOM_PROD               ? dx * dy
                                                           : ref_minmax(dx, dy, op == LOOM_MAX);
            REQUIRE(isnan(dwant) ? isnan(dout[i])
                                 : dout[i] == dwant && signbit(dout[i]) == signbit(dwant),
                    "float64 %s: %g op %g gave %g, want %g", loom_op_name(op), dx, dy, dout[i], dwant);
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
                            "%s %s (%s) element %zu differs from the CPU kernel", loom_dtype_name(dt),
                            loom_op_name(op), isas[k], i);
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
    tcase_add_test(ops, test_without_driver_all_host);
    suite_add_tcase(s, ops);
    return s;
}
