/* check_reduce.c - unit tests of the CPU reductions (base/reduce.c).
 *
 * Every kernel is compared element by element with a scalar reference written
 * here, independently of reduce_ops.h (float16 and bfloat16 results are rounded by
 * the library's conversions, which are checked on their own), and this for every
 * vector instruction set the CPU supports, not only the one dispatch picks. The
 * half and bfloat16
 * conversions are checked exhaustively where 2^16 patterns allow, against exact
 * values computed in double, and against the CPU's F16C instructions when present.
 */
#include <check.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_suites.h"
#include "base/reduce.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define CHECK_REDUCE_X86 1

/* F16C usable: the CPU has it and the OS saves ymm registers (which "avx" checks). */
static int cpu_has_f16c(void)
{
    unsigned eax, ebx, ecx, edx;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
           (ecx & bit_F16C) != 0;
}
#endif

/* ck_assert_msg reports to the runner even when it passes, which dominates loops over
 * 2^16 patterns (above all under valgrind); check first, report only failures. */
#define REQUIRE(cond, ...)                                                              \
    do {                                                                                \
        if (!(cond))                                                                    \
            ck_abort_msg(__VA_ARGS__);                                                  \
    } while (0)

/* Every instruction set reduce.c may have; a loop test runs once per entry. */
static const char *const all_isas[] = { "generic", "avx2", "avx512" };
#define NUM_ISAS (sizeof all_isas / sizeof all_isas[0])

static const char *const dtype_names[LOOM_NUM_DTYPES] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64",
    "float16", "bfloat16", "float32", "float64", "int16", "uint16",
};
static const char *const op_names[LOOM_NUM_OPS] = { "sum", "prod", "min", "max", "avg",
                                                    "band", "bor", "bxor" };

static const size_t lengths[] = { 0, 1, 7, 33, 1000 + 3, 4096 + 17 };
#define NUM_LENGTHS (sizeof lengths / sizeof lengths[0])

/* Elements on each side of a buffer that a kernel must leave alone. */
#define GUARD 24
#define GUARD_BYTE 0xa5

static size_t elem_size(loom_dtype_t dt)
{
    static const size_t sizes[LOOM_NUM_DTYPES] = { 1, 1, 4, 4, 8, 8, 2, 2, 4, 8, 2, 2 };
    return sizes[dt];
}

static int is_float_type(loom_dtype_t dt)
{
    return dt == LOOM_FLOAT16 || dt == LOOM_BFLOAT16 || dt == LOOM_FLOAT32 ||
           dt == LOOM_FLOAT64;
}

static int is_bitwise(int op)
{
    return op == LOOM_BAND || op == LOOM_BOR || op == LOOM_BXOR;
}

/* Select the instruction set of this loop iteration; 0 when the CPU lacks it, and
 * the test then passes vacuously. */
static int use_isa(int index)
{
    return loom_reduce_use_isa(all_isas[index]) == LOOM_SUCCESS;
}

static void restore_isa(void)
{
    loom_reduce_use_isa(NULL);
}

/* ---- deterministic random data ---------------------------------------------- */

static uint64_t rng_state;

static void rng_seed(uint64_t seed)
{
    rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
}

static uint64_t rng_next(void)
{
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static float random_moderate_float(void)
{
    /* Within a few powers of two of 1, so sums and products stay meaningful. */
    return ((float)(int32_t)(rng_next() >> 32) / 2147483648.0f) * 8.0f;
}

static uint16_t bits_of_float_upper(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

/* Random bit patterns hit every NaN, infinity, subnormal and signed zero sooner or
 * later; moderate values make sums and products that are not just overflow. */
static void fill_random(loom_dtype_t dt, void *buf, size_t count)
{
    unsigned char *p = buf;
    size_t size = elem_size(dt);
    for (size_t i = 0; i < count; i++, p += size) {
        uint64_t bits = rng_next();
        int moderate = (bits & 3) != 0;
        switch (dt) {
        case LOOM_FLOAT16:
            if (moderate) {
                uint16_t h = loom_float_to_half(random_moderate_float());
                memcpy(p, &h, size);
                continue;
            }
            break;
        case LOOM_BFLOAT16:
            if (moderate) {
                uint16_t b = bits_of_float_upper(random_moderate_float());
                memcpy(p, &b, size);
                continue;
            }
            break;
        case LOOM_FLOAT32:
            if (moderate) {
                float f = random_moderate_float();
                memcpy(p, &f, size);
                continue;
            }
            break;
        case LOOM_FLOAT64:
            if (moderate) {
                double d = (double)random_moderate_float() * (1.0 + 1.0 / 3.0);
                memcpy(p, &d, size);
                continue;
            }
            break;
        default:
            break;
        }
        memcpy(p, &bits, size);
    }
}

/* ---- independent scalar reference ---------------------------------------------- */

/* IEEE 754-2019 minimum/maximum: NaN if either is NaN, -0 < +0. */
static double ref_min(double a, double b)
{
    if (isnan(a))
        return a;
    if (isnan(b))
        return b;
    if (a == 0 && b == 0)
        return (signbit(a) || signbit(b)) ? -0.0 : 0.0;
    return a < b ? a : b;
}

static double ref_max(double a, double b)
{
    if (isnan(a))
        return a;
    if (isnan(b))
        return b;
    if (a == 0 && b == 0)
        return (signbit(a) && signbit(b)) ? -0.0 : 0.0;
    return a > b ? a : b;
}

static float ref_float_op(loom_op_t op, float a, float b)
{
    switch (op) {
    case LOOM_PROD: return a * b;
    case LOOM_MIN: return (float)ref_min(a, b);
    case LOOM_MAX: return (float)ref_max(a, b);
    default: return a + b;
    }
}

static double ref_double_op(loom_op_t op, double a, double b)
{
    switch (op) {
    case LOOM_PROD: return a * b;
    case LOOM_MIN: return ref_min(a, b);
    case LOOM_MAX: return ref_max(a, b);
    default: return a + b;
    }
}

/* Integers: compute in uint64_t (wraps by definition) and keep the low bits; MIN and
 * MAX compare as the signed or unsigned type. */
static uint64_t ref_int_op(loom_op_t op, uint64_t a, uint64_t b, int64_t sa, int64_t sb,
                           int is_signed)
{
    switch (op) {
    case LOOM_PROD: return a * b;
    case LOOM_MIN:
        if (is_signed)
            return sb < sa ? b : a;
        return b < a ? b : a;
    case LOOM_MAX:
        if (is_signed)
            return sa < sb ? b : a;
        return a < b ? b : a;
    case LOOM_BAND: return a & b;
    case LOOM_BOR: return a | b;
    case LOOM_BXOR: return a ^ b;
    default: return a + b;
    }
}

/* out = a (op) b for one element of dt. */
static void ref_op(loom_dtype_t dt, loom_op_t op, void *out, const void *a, const void *b)
{
    switch (dt) {
    case LOOM_FLOAT16: case LOOM_BFLOAT16: {
        uint16_t x, y, r;
        memcpy(&x, a, 2);
        memcpy(&y, b, 2);
        if (dt == LOOM_FLOAT16)
            r = loom_float_to_half(ref_float_op(op, loom_half_to_float(x), loom_half_to_float(y)));
        else
            r = loom_float_to_bf16(ref_float_op(op, loom_bf16_to_float(x), loom_bf16_to_float(y)));
        memcpy(out, &r, 2);
        return;
    }
    case LOOM_FLOAT32: {
        float x, y, r;
        memcpy(&x, a, 4);
        memcpy(&y, b, 4);
        r = ref_float_op(op, x, y);
        memcpy(out, &r, 4);
        return;
    }
    case LOOM_FLOAT64: {
        double x, y, r;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        r = ref_double_op(op, x, y);
        memcpy(out, &r, 8);
        return;
    }
    default: {
        size_t size = elem_size(dt);
        int is_signed = dt == LOOM_INT8 || dt == LOOM_INT16 || dt == LOOM_INT32 ||
                        dt == LOOM_INT64;
        uint64_t x = 0, y = 0;
        memcpy(&x, a, size); /* little-endian: the low bytes */
        memcpy(&y, b, size);
        int shift = 64 - 8 * (int)size;
        /* Sign-extend through an arithmetic right shift (gcc defines it). */
        int64_t sx = (int64_t)(x << shift) >> shift;
        int64_t sy = (int64_t)(y << shift) >> shift;
        uint64_t r = ref_int_op(op, x, y, sx, sy, is_signed);
        memcpy(out, &r, size);
        return;
    }
    }
}

/* elem = elem / nranks for one element: C division, truncating toward zero. */
#define REF_AVG_CASE(dtype, T, divided)                                                 \
    case dtype: {                                                                       \
        T v;                                                                            \
        memcpy(&v, elem, sizeof v);                                                     \
        v = (divided);                                                                  \
        memcpy(elem, &v, sizeof v);                                                     \
        return;                                                                         \
    }

static void ref_avg(loom_dtype_t dt, void *elem, int nranks)
{
    switch (dt) {
    REF_AVG_CASE(LOOM_INT8, int8_t, (int8_t)(v / nranks))
    REF_AVG_CASE(LOOM_UINT8, uint8_t, (uint8_t)(v / nranks))
    REF_AVG_CASE(LOOM_INT16, int16_t, (int16_t)(v / nranks))
    REF_AVG_CASE(LOOM_UINT16, uint16_t, (uint16_t)(v / nranks))
    REF_AVG_CASE(LOOM_INT32, int32_t, v / nranks)
    REF_AVG_CASE(LOOM_UINT32, uint32_t, v / (uint32_t)nranks)
    REF_AVG_CASE(LOOM_INT64, int64_t, v / nranks)
    REF_AVG_CASE(LOOM_UINT64, uint64_t, v / (uint64_t)nranks)
    REF_AVG_CASE(LOOM_FLOAT16, uint16_t,
                 loom_float_to_half(loom_half_to_float(v) / (float)nranks))
    REF_AVG_CASE(LOOM_BFLOAT16, uint16_t,
                 loom_float_to_bf16(loom_bf16_to_float(v) / (float)nranks))
    REF_AVG_CASE(LOOM_FLOAT32, float, v / (float)nranks)
    REF_AVG_CASE(LOOM_FLOAT64, double, v / nranks)
    }
}

static int elem_is_nan(loom_dtype_t dt, const void *elem)
{
    switch (dt) {
    case LOOM_FLOAT16: { uint16_t h; memcpy(&h, elem, 2); return (h & 0x7fff) > 0x7c00; }
    case LOOM_BFLOAT16: { uint16_t b; memcpy(&b, elem, 2); return (b & 0x7fff) > 0x7f80; }
    case LOOM_FLOAT32: { float f; memcpy(&f, elem, 4); return isnan(f); }
    case LOOM_FLOAT64: { double d; memcpy(&d, elem, 8); return isnan(d); }
    default: return 0;
    }
}

/* Bit-exact, except that any NaN matches any NaN: payloads are not specified. */
static int elem_equal(loom_dtype_t dt, const void *x, const void *y)
{
    if (is_float_type(dt) && elem_is_nan(dt, x))
        return elem_is_nan(dt, y);
    return memcmp(x, y, elem_size(dt)) == 0;
}

static void format_elem(loom_dtype_t dt, const void *elem, char *text, size_t len)
{
    uint64_t bits = 0;
    memcpy(&bits, elem, elem_size(dt));
    snprintf(text, len, "0x%0*" PRIx64, (int)elem_size(dt) * 2, bits);
}

/* ---- guarded buffers ------------------------------------------------------------- */

/* count elements starting offset elements into an allocation with GUARD elements of
 * GUARD_BYTE on each side. The allocation is malloc-aligned, so offset 1 gives a
 * pointer that is element-aligned but not vector-aligned. */
typedef struct {
    unsigned char *base;
    unsigned char *data;
    size_t bytes_before, bytes_data, bytes_total;
} guarded_t;

static guarded_t guarded_new(loom_dtype_t dt, size_t count, size_t offset)
{
    size_t size = elem_size(dt);
    guarded_t g;
    g.bytes_before = (GUARD + offset) * size;
    g.bytes_data = count * size;
    g.bytes_total = g.bytes_before + g.bytes_data + GUARD * size;
    g.base = malloc(g.bytes_total);
    ck_assert_ptr_nonnull(g.base);
    memset(g.base, GUARD_BYTE, g.bytes_total);
    g.data = g.base + g.bytes_before;
    return g;
}

static int guarded_intact(const guarded_t *g)
{
    for (size_t i = 0; i < g->bytes_before; i++)
        if (g->base[i] != GUARD_BYTE)
            return 0;
    for (size_t i = g->bytes_before + g->bytes_data; i < g->bytes_total; i++)
        if (g->base[i] != GUARD_BYTE)
            return 0;
    return 1;
}

static void guarded_free(guarded_t *g)
{
    free(g->base);
    g->base = g->data = NULL;
}

/* ---- kernels against the reference ------------------------------------------------- */

/* How the buffers of one call relate. */
typedef enum {
    CALL_LOCAL,          /* loom_reduce_local(x, y): x op= y */
    CALL_LOCAL_SELF,     /* loom_reduce_local(x, x): x op= x */
    CALL_LOCAL3,         /* out, a, b all distinct */
    CALL_LOCAL3_OUT_A,   /* out == a */
    CALL_LOCAL3_OUT_B,   /* out == b */
    CALL_LOCAL3_ALL,     /* out == a == b */
    NUM_CALLS
} call_kind_t;

static const char *const call_names[NUM_CALLS] = {
    "local(x, y)", "local(x, x)", "local3(out, a, b)", "local3(a, a, b)", "local3(b, a, b)",
    "local3(x, x, x)",
};

/* Runs one call on random data and compares every element with the reference.
 * offset_a/offset_b shift the two inputs by whole elements, so that their vector
 * alignment differs from each other's and from the output's. */
static void check_one_call(const char *isa, loom_dtype_t dt, loom_op_t op, size_t count,
                           call_kind_t kind, size_t offset_a, size_t offset_b)
{
    size_t size = elem_size(dt);
    guarded_t a = guarded_new(dt, count, offset_a);
    guarded_t b = guarded_new(dt, count, offset_b);
    guarded_t out = guarded_new(dt, count, 0);
    /* +1: malloc(0) may return NULL. */
    unsigned char *expect = malloc(count * size + 1);
    unsigned char *input_a = malloc(count * size + 1);
    unsigned char *input_b = malloc(count * size + 1);
    ck_assert(expect != NULL && input_a != NULL && input_b != NULL);

    fill_random(dt, a.data, count);
    fill_random(dt, b.data, count);
    int self = kind == CALL_LOCAL_SELF || kind == CALL_LOCAL3_ALL;
    /* Kept for the failure message: aliased calls overwrite their inputs. */
    memcpy(input_a, a.data, count * size);
    memcpy(input_b, self ? a.data : b.data, count * size);
    for (size_t i = 0; i < count; i++)
        ref_op(dt, op, expect + i * size, input_a + i * size, input_b + i * size);

    unsigned char *result;
    switch (kind) {
    case CALL_LOCAL:
        loom_reduce_local(a.data, b.data, count, dt, op);
        result = a.data;
        break;
    case CALL_LOCAL_SELF:
        loom_reduce_local(a.data, a.data, count, dt, op);
        result = a.data;
        break;
    case CALL_LOCAL3:
        loom_reduce_local3(out.data, a.data, b.data, count, dt, op);
        result = out.data;
        break;
    case CALL_LOCAL3_OUT_A:
        loom_reduce_local3(a.data, a.data, b.data, count, dt, op);
        result = a.data;
        break;
    case CALL_LOCAL3_OUT_B:
        loom_reduce_local3(b.data, a.data, b.data, count, dt, op);
        result = b.data;
        break;
    default:
        loom_reduce_local3(a.data, a.data, a.data, count, dt, op);
        result = a.data;
        break;
    }

    for (size_t i = 0; i < count; i++) {
        if (!elem_equal(dt, result + i * size, expect + i * size)) {
            char got[24], want[24], in_a[24], in_b[24];
            format_elem(dt, result + i * size, got, sizeof got);
            format_elem(dt, expect + i * size, want, sizeof want);
            format_elem(dt, input_a + i * size, in_a, sizeof in_a);
            format_elem(dt, input_b + i * size, in_b, sizeof in_b);
            ck_abort_msg("%s %s %s %s count %zu offsets %zu/%zu: element %zu is %s, want %s "
                         "(inputs %s, %s)",
                         isa, dtype_names[dt], op_names[op], call_names[kind], count, offset_a,
                         offset_b, i, got, want, in_a, in_b);
        }
    }
    ck_assert_msg(guarded_intact(&a) && guarded_intact(&b) && guarded_intact(&out),
                  "%s %s %s %s count %zu: wrote outside the buffer", isa, dtype_names[dt],
                  op_names[op], call_names[kind], count);

    free(expect);
    free(input_a);
    free(input_b);
    guarded_free(&a);
    guarded_free(&b);
    guarded_free(&out);
}

static void check_calls(int isa_index, const call_kind_t *kinds, size_t num_kinds)
{
    if (!use_isa(isa_index))
        return;
    const char *isa = all_isas[isa_index];
    ck_assert_str_eq(loom_reduce_isa(), isa);
    rng_seed((uint64_t)isa_index + 1);
    for (int dt = 0; dt < LOOM_NUM_DTYPES; dt++)
        for (int op = 0; op < LOOM_NUM_OPS; op++)
            for (size_t l = 0; l < NUM_LENGTHS && !(is_bitwise(op) && is_float_type(dt)); l++)
                for (size_t k = 0; k < num_kinds; k++)
                    for (size_t offsets = 0; offsets < 4; offsets++)
                        check_one_call(isa, (loom_dtype_t)dt, (loom_op_t)op, lengths[l],
                                       kinds[k], offsets & 1, offsets >> 1);
}

START_TEST(test_kernels_match_reference)
{
    static const call_kind_t kinds[] = { CALL_LOCAL, CALL_LOCAL3 };
    check_calls(_i, kinds, sizeof kinds / sizeof kinds[0]);
}
END_TEST

START_TEST(test_kernels_aliased)
{
    static const call_kind_t kinds[] = { CALL_LOCAL_SELF, CALL_LOCAL3_OUT_A, CALL_LOCAL3_OUT_B,
                                         CALL_LOCAL3_ALL };
    check_calls(_i, kinds, sizeof kinds / sizeof kinds[0]);
}
END_TEST

START_TEST(test_zero_count_touches_nothing)
{
    if (!use_isa(_i))
        return;
    for (int dt = 0; dt < LOOM_NUM_DTYPES; dt++) {
        for (int op = 0; op < LOOM_NUM_OPS; op++) {
            loom_reduce_local(NULL, NULL, 0, (loom_dtype_t)dt, (loom_op_t)op);
            loom_reduce_local3(NULL, NULL, NULL, 0, (loom_dtype_t)dt, (loom_op_t)op);
        }
        loom_reduce_avg_finalize(NULL, 0, (loom_dtype_t)dt, 3);
    }
}
END_TEST

/* The public calls refuse a bitwise op on floats; should one reach the kernels
 * anyway (a bug in Loom), it must leave memory alone rather than crash. */
START_TEST(test_bitwise_on_floats_does_nothing)
{
    if (!use_isa(_i))
        return;
    double a[4] = {1.5, -2, 3, 4}, b[4] = {8, 8, 8, 8}, out[4] = {7, 7, 7, 7};
    for (int op = LOOM_BAND; op <= LOOM_BXOR; op++) {
        loom_reduce_local3(out, a, b, 4, LOOM_FLOAT64, (loom_op_t)op);
        loom_reduce_local(a, b, 4, LOOM_FLOAT64, (loom_op_t)op);
    }
    ck_assert(out[0] == 7 && out[3] == 7 && a[0] == 1.5 && a[1] == -2);
}
END_TEST

START_TEST(test_isa_name)
{
    const char *isa = loom_reduce_isa();
    int known = 0;
    for (size_t i = 0; i < NUM_ISAS; i++)
        known |= strcmp(isa, all_isas[i]) == 0;
    ck_assert_msg(known, "unknown isa \"%s\"", isa);
#ifdef CHECK_REDUCE_X86
    int avx2 = cpu_has_f16c() && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        ck_assert_str_eq(isa, "avx512");
    else if (avx2)
        ck_assert_str_eq(isa, "avx2");
    else
        ck_assert_str_eq(isa, "generic");
#endif
    ck_assert_int_eq(loom_reduce_use_isa("generic"), LOOM_SUCCESS);
    ck_assert_str_eq(loom_reduce_isa(), "generic");
    ck_assert_int_eq(loom_reduce_use_isa("no-such-isa"), LOOM_ERR_UNSUPPORTED);
    ck_assert_int_eq(loom_reduce_use_isa(NULL), LOOM_SUCCESS);
    ck_assert_str_eq(loom_reduce_isa(), isa);
}
END_TEST

/* ---- integers: wrapping ------------------------------------------------------------ */

START_TEST(test_signed_overflow_wraps)
{
    if (!use_isa(_i))
        return;
    /* 33 elements so the vector loops, not only the remainder, see the values. */
    enum { N = 33 };
    int32_t a32[N], b32[N];
    for (int i = 0; i < N; i++) {
        a32[i] = INT32_MAX;
        b32[i] = 1;
    }
    loom_reduce_local(a32, b32, N, LOOM_INT32, LOOM_SUM);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(a32[i], INT32_MIN);
    for (int i = 0; i < N; i++) {
        a32[i] = INT32_MIN;
        b32[i] = -1;
    }
    loom_reduce_local(a32, b32, N, LOOM_INT32, LOOM_PROD);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(a32[i], INT32_MIN);
    for (int i = 0; i < N; i++) {
        a32[i] = INT32_MIN;
        b32[i] = -1;
    }
    loom_reduce_local(a32, b32, N, LOOM_INT32, LOOM_SUM);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(a32[i], INT32_MAX);

    int8_t a8[N], b8[N];
    for (int i = 0; i < N; i++) {
        a8[i] = INT8_MAX;
        b8[i] = 1;
    }
    loom_reduce_local(a8, b8, N, LOOM_INT8, LOOM_AVG);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(a8[i], INT8_MIN);
    for (int i = 0; i < N; i++) {
        a8[i] = INT8_MIN;
        b8[i] = -1;
    }
    loom_reduce_local(a8, b8, N, LOOM_INT8, LOOM_PROD);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(a8[i], INT8_MIN);
    for (int i = 0; i < N; i++) {
        a8[i] = 16;
        b8[i] = 16;
    }
    loom_reduce_local(a8, b8, N, LOOM_INT8, LOOM_PROD);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(a8[i], 0);

    int64_t a64[N], b64[N];
    for (int i = 0; i < N; i++) {
        a64[i] = INT64_MAX;
        b64[i] = 1;
    }
    loom_reduce_local(a64, b64, N, LOOM_INT64, LOOM_SUM);
    for (int i = 0; i < N; i++)
        ck_assert(a64[i] == INT64_MIN);
    for (int i = 0; i < N; i++) {
        a64[i] = INT64_MAX;
        b64[i] = 2;
    }
    loom_reduce_local(a64, b64, N, LOOM_INT64, LOOM_PROD);
    for (int i = 0; i < N; i++)
        ck_assert(a64[i] == -2);

    uint8_t u8a[N], u8b[N];
    for (int i = 0; i < N; i++) {
        u8a[i] = 255;
        u8b[i] = 1;
    }
    loom_reduce_local(u8a, u8b, N, LOOM_UINT8, LOOM_SUM);
    for (int i = 0; i < N; i++)
        ck_assert_uint_eq(u8a[i], 0);
    uint32_t u32a[N], u32b[N];
    for (int i = 0; i < N; i++) {
        u32a[i] = 0x10000u;
        u32b[i] = 0x10001u;
    }
    loom_reduce_local(u32a, u32b, N, LOOM_UINT32, LOOM_PROD);
    for (int i = 0; i < N; i++)
        ck_assert_uint_eq(u32a[i], 0x10000u);
    uint64_t u64a[N], u64b[N];
    for (int i = 0; i < N; i++) {
        u64a[i] = UINT64_MAX;
        u64b[i] = UINT64_MAX;
    }
    loom_reduce_local(u64a, u64b, N, LOOM_UINT64, LOOM_PROD);
    for (int i = 0; i < N; i++)
        ck_assert(u64a[i] == 1);
}
END_TEST

START_TEST(test_integer_min_max_signedness)
{
    if (!use_isa(_i))
        return;
    enum { N = 40 };
    int8_t s8a[N], s8b[N];
    uint8_t u8a[N], u8b[N];
    int64_t s64a[N], s64b[N];
    uint64_t u64a[N], u64b[N];
    for (int i = 0; i < N; i++) {
        s8a[i] = -1;
        s8b[i] = 1;
        u8a[i] = 0xff;
        u8b[i] = 1;
        s64a[i] = -1;
        s64b[i] = INT64_MAX;
        u64a[i] = UINT64_MAX;
        u64b[i] = 1;
    }
    loom_reduce_local(s8a, s8b, N, LOOM_INT8, LOOM_MIN);
    loom_reduce_local(u8a, u8b, N, LOOM_UINT8, LOOM_MIN);
    loom_reduce_local(s64a, s64b, N, LOOM_INT64, LOOM_MAX);
    loom_reduce_local(u64a, u64b, N, LOOM_UINT64, LOOM_MAX);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(s8a[i], -1);
        ck_assert_uint_eq(u8a[i], 1);
        ck_assert(s64a[i] == INT64_MAX);
        ck_assert(u64a[i] == UINT64_MAX);
    }
}
END_TEST

/* ---- floats: NaN, infinities, signed zeros --------------------------------------------- */

/* One pair of inputs and the expected result of an op, as doubles; every value is
 * exact in all four float types. */
typedef struct {
    loom_op_t op;
    double a, b, want;
} special_case_t;

static void store_float(loom_dtype_t dt, void *elem, double v)
{
    switch (dt) {
    case LOOM_FLOAT16: { uint16_t h = loom_float_to_half((float)v); memcpy(elem, &h, 2); break; }
    case LOOM_BFLOAT16: { uint16_t b = loom_float_to_bf16((float)v); memcpy(elem, &b, 2); break; }
    case LOOM_FLOAT32: { float f = (float)v; memcpy(elem, &f, 4); break; }
    default: memcpy(elem, &v, 8); break;
    }
}

static double load_float(loom_dtype_t dt, const void *elem)
{
    switch (dt) {
    case LOOM_FLOAT16: { uint16_t h; memcpy(&h, elem, 2); return loom_half_to_float(h); }
    case LOOM_BFLOAT16: { uint16_t b; memcpy(&b, elem, 2); return loom_bf16_to_float(b); }
    case LOOM_FLOAT32: { float f; memcpy(&f, elem, 4); return f; }
    default: { double d; memcpy(&d, elem, 8); return d; }
    }
}

START_TEST(test_float_specials)
{
    if (!use_isa(_i))
        return;
    const double inf = INFINITY, nan = NAN;
    const special_case_t cases[] = {
        { LOOM_SUM, nan, 1, nan },   { LOOM_SUM, 1, nan, nan },    { LOOM_SUM, inf, -inf, nan },
        { LOOM_SUM, inf, 1, inf },   { LOOM_SUM, -inf, 1, -inf },  { LOOM_SUM, inf, inf, inf },
        { LOOM_SUM, -0.0, -0.0, -0.0 }, { LOOM_SUM, -0.0, 0.0, 0.0 },
        { LOOM_AVG, nan, 2, nan },   { LOOM_AVG, -inf, 2, -inf },
        { LOOM_PROD, nan, 0, nan },  { LOOM_PROD, inf, 0, nan },   { LOOM_PROD, -inf, 2, -inf },
        { LOOM_PROD, -1, 0, -0.0 },
        { LOOM_MIN, nan, 1, nan },   { LOOM_MIN, 1, nan, nan },    { LOOM_MIN, nan, -inf, nan },
        { LOOM_MIN, -inf, nan, nan }, { LOOM_MIN, nan, nan, nan },
        { LOOM_MIN, -inf, 1, -inf }, { LOOM_MIN, inf, 1, 1 },      { LOOM_MIN, 2, -3, -3 },
        { LOOM_MIN, 0.0, -0.0, -0.0 }, { LOOM_MIN, -0.0, 0.0, -0.0 }, { LOOM_MIN, 0.0, 0.0, 0.0 },
        { LOOM_MAX, nan, 1, nan },   { LOOM_MAX, 1, nan, nan },    { LOOM_MAX, nan, inf, nan },
        { LOOM_MAX, inf, nan, nan }, { LOOM_MAX, nan, nan, nan },
        { LOOM_MAX, inf, 1, inf },   { LOOM_MAX, -inf, 1, 1 },     { LOOM_MAX, 2, -3, 2 },
        { LOOM_MAX, 0.0, -0.0, 0.0 }, { LOOM_MAX, -0.0, 0.0, 0.0 }, { LOOM_MAX, -0.0, -0.0, -0.0 },
    };
    const size_t num_cases = sizeof cases / sizeof cases[0];
    static const loom_dtype_t float_types[] = { LOOM_FLOAT16, LOOM_BFLOAT16, LOOM_FLOAT32,
                                                LOOM_FLOAT64 };

    /* Each case is repeated along a vector-length array so that both the vector body
     * and the remainder see it, at every position within a vector. */
    enum { N = 67 };
    for (size_t t = 0; t < 4; t++) {
        loom_dtype_t dt = float_types[t];
        size_t size = elem_size(dt);
        unsigned char a[N * 8], b[N * 8];
        for (size_t c = 0; c < num_cases; c++) {
            for (size_t i = 0; i < N; i++) {
                store_float(dt, a + i * size, cases[c].a);
                store_float(dt, b + i * size, cases[c].b);
            }
            loom_reduce_local(a, b, N, dt, cases[c].op);
            for (size_t i = 0; i < N; i++) {
                double got = load_float(dt, a + i * size);
                int ok = isnan(cases[c].want)
                             ? isnan(got)
                             : got == cases[c].want && !signbit(got) == !signbit(cases[c].want);
                REQUIRE(ok, "%s %s %s(%g, %g) at %zu = %g, want %g", all_isas[_i],
                        dtype_names[dt], op_names[cases[c].op], cases[c].a, cases[c].b,
                        i, got, cases[c].want);
            }
        }
    }
}
END_TEST

START_TEST(test_half_rounding_in_kernels)
{
    if (!use_isa(_i))
        return;
    enum { N = 35 };
    uint16_t a[N], b[N];
    /* 1 + 2^-11 is halfway between the halves 1 and 1 + 2^-10: ties to even, 1. */
    for (int i = 0; i < N; i++) {
        a[i] = 0x3c00;  /* 1.0 */
        b[i] = 0x1000;  /* 2^-11 */
    }
    loom_reduce_local(a, b, N, LOOM_FLOAT16, LOOM_SUM);
    for (int i = 0; i < N; i++)
        ck_assert_uint_eq(a[i], 0x3c00);
    /* 1 + 2^-10 + 2^-11 is halfway between odd 0x3c01 and even 0x3c02. */
    for (int i = 0; i < N; i++) {
        a[i] = 0x3c01;
        b[i] = 0x1000;
    }
    loom_reduce_local(a, b, N, LOOM_FLOAT16, LOOM_SUM);
    for (int i = 0; i < N; i++)
        ck_assert_uint_eq(a[i], 0x3c02);
    /* 65504 + 16 = 65520 ties to even, which is infinity; 65504 * 2 overflows. */
    for (int i = 0; i < N; i++) {
        a[i] = 0x7bff;
        b[i] = 0x4c00;  /* 16 */
    }
    loom_reduce_local(a, b, N, LOOM_FLOAT16, LOOM_SUM);
    for (int i = 0; i < N; i++)
        ck_assert_uint_eq(a[i], 0x7c00);
    /* Smallest subnormal halved: 2^-25 ties to even, +0. */
    for (int i = 0; i < N; i++) {
        a[i] = 0x0001;
        b[i] = 0x3800;  /* 0.5 */
    }
    loom_reduce_local(a, b, N, LOOM_FLOAT16, LOOM_PROD);
    for (int i = 0; i < N; i++)
        ck_assert_uint_eq(a[i], 0x0000);
    /* bfloat16: 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even, 1. */
    for (int i = 0; i < N; i++) {
        a[i] = 0x3f80;
        b[i] = 0x3b80;  /* 2^-8 */
    }
    loom_reduce_local(a, b, N, LOOM_BFLOAT16, LOOM_SUM);
    for (int i = 0; i < N; i++)
        ck_assert_uint_eq(a[i], 0x3f80);
    for (int i = 0; i < N; i++) {
        a[i] = 0x3f81;
        b[i] = 0x3b80;
    }
    loom_reduce_local(a, b, N, LOOM_BFLOAT16, LOOM_SUM);
    for (int i = 0; i < N; i++)
        ck_assert_uint_eq(a[i], 0x3f82);
}
END_TEST

/* ---- AVG finalize ------------------------------------------------------------------ */

START_TEST(test_avg_finalize_integers_truncate)
{
    if (!use_isa(_i))
        return;
    int32_t i32[] = { -7, 7, -1, 1, -6, 0, INT32_MIN, INT32_MAX, -5, 5, 2, -2, 3, -3, 100, -100 };
    const int32_t i32_by2[] = { -3, 3, 0, 0, -3, 0, INT32_MIN / 2, INT32_MAX / 2,
                                -2, 2, 1, -1, 1, -1, 50, -50 };
    loom_reduce_avg_finalize(i32, 16, LOOM_INT32, 2);
    for (int i = 0; i < 16; i++)
        ck_assert_int_eq(i32[i], i32_by2[i]);

    int8_t i8[] = { -128, 127, -7, 7, -1, 1, -3, 3, -128, 127, -7, 7, -1, 1, -3, 3, -100 };
    const int8_t i8_by3[] = { -42, 42, -2, 2, 0, 0, -1, 1, -42, 42, -2, 2, 0, 0, -1, 1, -33 };
    loom_reduce_avg_finalize(i8, 17, LOOM_INT8, 3);
    for (int i = 0; i < 17; i++)
        ck_assert_int_eq(i8[i], i8_by3[i]);

    /* More ranks than int8 can count. */
    int8_t few[] = { -128, 127, -1 };
    loom_reduce_avg_finalize(few, 3, LOOM_INT8, 200);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(few[i], 0);
    uint8_t u8[] = { 255, 199, 200, 201 };
    loom_reduce_avg_finalize(u8, 4, LOOM_UINT8, 200);
    ck_assert_uint_eq(u8[0], 1);
    ck_assert_uint_eq(u8[1], 0);
    ck_assert_uint_eq(u8[2], 1);
    ck_assert_uint_eq(u8[3], 1);

    int64_t i64[] = { INT64_MIN, INT64_MAX, -9, 9 };
    loom_reduce_avg_finalize(i64, 4, LOOM_INT64, 4);
    ck_assert(i64[0] == INT64_MIN / 4);
    ck_assert(i64[1] == INT64_MAX / 4);
    ck_assert(i64[2] == -2);
    ck_assert(i64[3] == 2);
    uint64_t u64[] = { UINT64_MAX, 5 };
    loom_reduce_avg_finalize(u64, 2, LOOM_UINT64, 3);
    ck_assert(u64[0] == UINT64_MAX / 3);
    ck_assert(u64[1] == 1);
    uint32_t u32[] = { UINT32_MAX, 7 };
    loom_reduce_avg_finalize(u32, 2, LOOM_UINT32, 7);
    ck_assert_uint_eq(u32[0], UINT32_MAX / 7);
    ck_assert_uint_eq(u32[1], 1);
}
END_TEST

START_TEST(test_avg_finalize_floats)
{
    if (!use_isa(_i))
        return;
    enum { N = 37 };
    float f32[N];
    double f64[N];
    uint16_t f16[N], bf16[N];
    for (int i = 0; i < N; i++) {
        f32[i] = 1.0f;
        f64[i] = 1.0;
        f16[i] = 0x3c00;
        bf16[i] = 0x3f80;
    }
    loom_reduce_avg_finalize(f32, N, LOOM_FLOAT32, 3);
    loom_reduce_avg_finalize(f64, N, LOOM_FLOAT64, 3);
    loom_reduce_avg_finalize(f16, N, LOOM_FLOAT16, 3);
    loom_reduce_avg_finalize(bf16, N, LOOM_BFLOAT16, 3);
    for (int i = 0; i < N; i++) {
        ck_assert(f32[i] == 1.0f / 3.0f);
        ck_assert(f64[i] == 1.0 / 3.0);
        ck_assert_uint_eq(f16[i], 0x3555);  /* 0.333251953125 */
        ck_assert_uint_eq(bf16[i], 0x3eab); /* 0.333984375 */
    }
    /* Specials, and a half subnormal divided into a tie: 3 * 2^-24 / 2 rounds to even. */
    float sf[] = { NAN, INFINITY, -INFINITY, -0.0f, 6.0f };
    loom_reduce_avg_finalize(sf, 5, LOOM_FLOAT32, 2);
    ck_assert(isnan(sf[0]));
    ck_assert(sf[1] == INFINITY && sf[2] == -INFINITY);
    ck_assert(sf[3] == 0 && signbit(sf[3]));
    ck_assert(sf[4] == 3.0f);
    uint16_t sh[] = { 0x7e00, 0x7c00, 0x0003, 0x8003, 0x0001 };
    loom_reduce_avg_finalize(sh, 5, LOOM_FLOAT16, 2);
    ck_assert((sh[0] & 0x7fff) > 0x7c00);
    ck_assert_uint_eq(sh[1], 0x7c00);
    ck_assert_uint_eq(sh[2], 0x0002);
    ck_assert_uint_eq(sh[3], 0x8002);
    ck_assert_uint_eq(sh[4], 0x0000);

    /* nranks == 1 leaves everything, NaN payloads included, as it is. */
    uint16_t one[] = { 0x7c01, 0x1234 };
    loom_reduce_avg_finalize(one, 2, LOOM_FLOAT16, 1);
    ck_assert_uint_eq(one[0], 0x7c01);
    ck_assert_uint_eq(one[1], 0x1234);
}
END_TEST

START_TEST(test_avg_finalize_matches_reference)
{
    if (!use_isa(_i))
        return;
    static const int rank_counts[] = { 1, 2, 3, 7, 8, 200 };
    rng_seed(1000 + (uint64_t)_i);
    for (int dt = 0; dt < LOOM_NUM_DTYPES; dt++) {
        size_t size = elem_size((loom_dtype_t)dt);
        for (size_t l = 0; l < NUM_LENGTHS; l++) {
            for (size_t r = 0; r < sizeof rank_counts / sizeof rank_counts[0]; r++) {
                size_t count = lengths[l];
                guarded_t buf = guarded_new((loom_dtype_t)dt, count, r & 1);
                unsigned char *expect = malloc(count * size + 1);
                ck_assert_ptr_nonnull(expect);
                fill_random((loom_dtype_t)dt, buf.data, count);
                memcpy(expect, buf.data, count * size);
                for (size_t i = 0; i < count; i++)
                    ref_avg((loom_dtype_t)dt, expect + i * size, rank_counts[r]);
                loom_reduce_avg_finalize(buf.data, count, (loom_dtype_t)dt, rank_counts[r]);
                for (size_t i = 0; i < count; i++) {
                    if (elem_equal((loom_dtype_t)dt, buf.data + i * size, expect + i * size))
                        continue;
                    char got[24], want[24];
                    format_elem((loom_dtype_t)dt, buf.data + i * size, got, sizeof got);
                    format_elem((loom_dtype_t)dt, expect + i * size, want, sizeof want);
                    ck_abort_msg("%s %s avg /%d count %zu: element %zu is %s, want %s",
                                 all_isas[_i], dtype_names[dt], rank_counts[r], count, i, got,
                                 want);
                }
                ck_assert_msg(guarded_intact(&buf), "%s %s avg count %zu wrote outside",
                              all_isas[_i], dtype_names[dt], count);
                free(expect);
                guarded_free(&buf);
            }
        }
    }
}
END_TEST

/* ---- half and bfloat16 conversions ---------------------------------------------------- */

/* Exact value of a finite half, from its definition. */
static double half_value(uint16_t h)
{
    int exponent = (h >> 10) & 0x1f;
    int mantissa = h & 0x3ff;
    double magnitude = exponent == 0 ? ldexp(mantissa, -24) : ldexp(1024 + mantissa, exponent - 25);
    return (h & 0x8000) ? -magnitude : magnitude;
}

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

START_TEST(test_half_to_float_exhaustive)
{
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = loom_half_to_float((uint16_t)h);
        int exponent = (h >> 10) & 0x1f;
        if (exponent == 0x1f && (h & 0x3ff) != 0) {
            REQUIRE(isnan(f), "half 0x%04x should be NaN", h);
            /* Quiet, sign and top payload bits kept, as F16C does. */
            uint32_t want = ((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13);
            REQUIRE(float_bits(f) == want, "half NaN 0x%04x -> 0x%08x, want 0x%08x", h,
                    float_bits(f), want);
        } else if (exponent == 0x1f) {
            REQUIRE(isinf(f) && !signbit(f) == !(h & 0x8000), "half 0x%04x -> %g", h, f);
        } else {
            double want = half_value((uint16_t)h);
            REQUIRE(f == want && !signbit(f) == !(h & 0x8000),
                    "half 0x%04x -> %.17g, want %.17g", h, f, want);
        }
    }
}
END_TEST

START_TEST(test_half_round_trip_exhaustive)
{
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = loom_half_to_float((uint16_t)h);
        uint16_t back = loom_float_to_half(f);
        if ((h & 0x7fff) > 0x7c00) {
            REQUIRE((back & 0x7fff) > 0x7c00, "NaN 0x%04x came back as 0x%04x", h, back);
            REQUIRE((back & 0x8000) == (h & 0x8000), "NaN 0x%04x lost its sign", h);
        } else {
            REQUIRE(back == h, "half 0x%04x -> %g -> 0x%04x", h, f, back);
        }
    }
}
END_TEST

/* Checks that h = float_to_half(f) is the nearest half to f, ties to even, from the
 * exact half values; 65536 stands for infinity's place in the rounding. */
static void check_nearest_half(float f)
{
    uint16_t h = loom_float_to_half(f);
    if (isnan(f)) {
        REQUIRE((h & 0x7fff) > 0x7c00, "NaN 0x%08x -> 0x%04x", float_bits(f), h);
        return;
    }
    REQUIRE(!(h & 0x8000) == !signbit(f), "sign lost: %a -> 0x%04x", f, h);
    double magnitude = fabs((double)f);
    uint16_t hm = h & 0x7fff;
    if (magnitude >= 65520.0) {
        REQUIRE(hm == 0x7c00, "%a should overflow to infinity, got 0x%04x", f, h);
        return;
    }
    REQUIRE(hm < 0x7c00, "%a -> 0x%04x overflowed", f, h);
    double here = fabs(magnitude - half_value(hm));
    double below = hm > 0 ? fabs(magnitude - half_value((uint16_t)(hm - 1))) : INFINITY;
    double above = hm < 0x7bff ? fabs(magnitude - half_value((uint16_t)(hm + 1)))
                               : fabs(magnitude - 65536.0);
    REQUIRE(here <= below && here <= above, "%a -> 0x%04x is not the nearest half", f, h);
    if (here == below || here == above)
        REQUIRE((hm & 1) == 0, "%a is a tie and 0x%04x is odd", f, h);
}

START_TEST(test_float_to_half_ties_to_even)
{
    /* The midpoint between each pair of adjacent halves, and the floats either side of
     * it, for every pair (including the gap between subnormals and 0x7bff..65536). */
    for (uint32_t hm = 0; hm < 0x7c00; hm++) {
        double upper = hm < 0x7bff ? half_value((uint16_t)(hm + 1)) : 65536.0;
        float tie = (float)((half_value((uint16_t)hm) + upper) / 2);
        REQUIRE(tie == (half_value((uint16_t)hm) + upper) / 2, "tie above 0x%04x inexact", hm);
        uint16_t even = (hm & 1) ? (uint16_t)(hm + 1) : (uint16_t)hm;
        REQUIRE(loom_float_to_half(tie) == even, "tie above 0x%04x -> 0x%04x, want 0x%04x",
                hm, loom_float_to_half(tie), even);
        REQUIRE(loom_float_to_half(-tie) == (even | 0x8000), "negative tie above 0x%04x",
                hm);
        REQUIRE(loom_float_to_half(nextafterf(tie, 0)) == hm, "below tie above 0x%04x", hm);
        REQUIRE(loom_float_to_half(nextafterf(tie, INFINITY)) == hm + 1,
                "above tie above 0x%04x", hm);
        check_nearest_half(tie);
        check_nearest_half(nextafterf(tie, 0));
        check_nearest_half(nextafterf(tie, INFINITY));
    }
}
END_TEST

START_TEST(test_float_to_half_specials)
{
    ck_assert_uint_eq(loom_float_to_half(0.0f), 0x0000);
    ck_assert_uint_eq(loom_float_to_half(-0.0f), 0x8000);
    ck_assert_uint_eq(loom_float_to_half(1.0f), 0x3c00);
    ck_assert_uint_eq(loom_float_to_half(-2.0f), 0xc000);
    ck_assert_uint_eq(loom_float_to_half(65504.0f), 0x7bff);
    ck_assert_uint_eq(loom_float_to_half(65519.99f), 0x7bff);
    ck_assert_uint_eq(loom_float_to_half(65520.0f), 0x7c00);
    ck_assert_uint_eq(loom_float_to_half(1e10f), 0x7c00);
    ck_assert_uint_eq(loom_float_to_half(-1e10f), 0xfc00);
    ck_assert_uint_eq(loom_float_to_half(FLT_MAX), 0x7c00);
    ck_assert_uint_eq(loom_float_to_half(INFINITY), 0x7c00);
    ck_assert_uint_eq(loom_float_to_half(-INFINITY), 0xfc00);
    /* Subnormal halves: 2^-24 is the smallest, 2^-14 - 2^-24 the largest. */
    ck_assert_uint_eq(loom_float_to_half(ldexpf(1, -24)), 0x0001);
    ck_assert_uint_eq(loom_float_to_half(-ldexpf(1, -24)), 0x8001);
    ck_assert_uint_eq(loom_float_to_half(ldexpf(1, -14) - ldexpf(1, -24)), 0x03ff);
    ck_assert_uint_eq(loom_float_to_half(ldexpf(1, -14)), 0x0400);
    /* 2^-25 ties between 0 and the smallest subnormal: even is 0; above it rounds up. */
    ck_assert_uint_eq(loom_float_to_half(ldexpf(1, -25)), 0x0000);
    ck_assert_uint_eq(loom_float_to_half(nextafterf(ldexpf(1, -25), 1)), 0x0001);
    ck_assert_uint_eq(loom_float_to_half(ldexpf(3, -25)), 0x0002);
    ck_assert_uint_eq(loom_float_to_half(ldexpf(1, -26)), 0x0000);
    ck_assert_uint_eq(loom_float_to_half(-ldexpf(1, -26)), 0x8000);
    /* Float subnormals are far below half's range. */
    ck_assert_uint_eq(loom_float_to_half(float_from_bits(0x00000001)), 0x0000);
    ck_assert_uint_eq(loom_float_to_half(float_from_bits(0x807fffff)), 0x8000);
    ck_assert_uint_eq(loom_float_to_half(FLT_MIN), 0x0000);
    /* NaN stays NaN whatever its payload, quiet or signalling, with its sign. */
    static const uint32_t nans[] = { 0x7fc00000, 0x7f800001, 0x7f802000, 0x7fffffff,
                                     0xffc00000, 0xff800001 };
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = loom_float_to_half(float_from_bits(nans[i]));
        ck_assert_msg((h & 0x7fff) > 0x7c00, "NaN 0x%08x -> 0x%04x", nans[i], h);
        ck_assert_uint_eq(h & 0x8000, (nans[i] >> 16) & 0x8000);
    }
}
END_TEST

START_TEST(test_float_to_half_sweep)
{
    /* A spread of bit patterns over all floats, each checked from first principles. */
    for (uint64_t u = 0; u <= 0xffffffffu; u += 40009)
        check_nearest_half(float_from_bits((uint32_t)u));
}
END_TEST

#ifdef CHECK_REDUCE_X86
__attribute__((target("f16c"))) static float hardware_half_to_float(uint16_t h)
{
    return _cvtsh_ss(h);
}

__attribute__((target("f16c"))) static uint16_t hardware_float_to_half(float f)
{
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
#endif

/* The software conversions must agree bit for bit with F16C, NaN payloads included,
 * or the scalar and vector kernels would disagree. */
START_TEST(test_half_matches_f16c)
{
#ifdef CHECK_REDUCE_X86
    if (!cpu_has_f16c())
        return;
    for (uint32_t h = 0; h <= 0xffff; h++) {
        uint32_t soft = float_bits(loom_half_to_float((uint16_t)h));
        uint32_t hard = float_bits(hardware_half_to_float((uint16_t)h));
        REQUIRE(soft == hard, "half 0x%04x: 0x%08x, F16C 0x%08x", h, soft, hard);
    }
    for (uint64_t u = 0; u <= 0xffffffffu; u += 4099) {
        float f = float_from_bits((uint32_t)u);
        uint16_t soft = loom_float_to_half(f), hard = hardware_float_to_half(f);
        REQUIRE(soft == hard, "float 0x%08x: 0x%04x, F16C 0x%04x", (uint32_t)u, soft, hard);
    }
#endif
}
END_TEST

START_TEST(test_bf16_round_trip_exhaustive)
{
    for (uint32_t b = 0; b <= 0xffff; b++) {
        float f = loom_bf16_to_float((uint16_t)b);
        REQUIRE(float_bits(f) == b << 16, "bf16 0x%04x widened inexactly", b);
        uint16_t back = loom_float_to_bf16(f);
        if ((b & 0x7fff) > 0x7f80) {
            REQUIRE(isnan(f) && (back & 0x7fff) > 0x7f80, "NaN 0x%04x -> 0x%04x", b, back);
            REQUIRE((back & 0x8000) == (b & 0x8000), "NaN 0x%04x lost its sign", b);
        } else {
            REQUIRE(back == b, "bf16 0x%04x -> 0x%04x", b, back);
        }
    }
}
END_TEST

START_TEST(test_float_to_bf16_ties_to_even)
{
    /* Every finite bf16 and its successor: the float halfway between them (0x8000 in
     * the dropped bits), and the floats either side of it. */
    for (uint32_t b = 0; b < 0x7f80; b++) {
        uint32_t tie = (b << 16) | 0x8000u;
        uint16_t even = (b & 1) ? (uint16_t)(b + 1) : (uint16_t)b;
        REQUIRE(loom_float_to_bf16(float_from_bits(tie)) == even,
                "tie 0x%08x -> 0x%04x, want 0x%04x", tie,
                loom_float_to_bf16(float_from_bits(tie)), even);
        REQUIRE(loom_float_to_bf16(float_from_bits(tie | 0x80000000u)) == (even | 0x8000u),
                "negative tie 0x%08x", tie);
        REQUIRE(loom_float_to_bf16(float_from_bits(tie - 1)) == b, "below tie 0x%08x", tie);
        REQUIRE(loom_float_to_bf16(float_from_bits(tie + 1)) == b + 1, "above tie 0x%08x", tie);
    }
    ck_assert_uint_eq(loom_float_to_bf16(1.0f), 0x3f80);
    ck_assert_uint_eq(loom_float_to_bf16(-0.0f), 0x8000);
    /* Overflow: FLT_MAX is past the midpoint between the largest bf16 and 2^128. */
    ck_assert_uint_eq(loom_float_to_bf16(FLT_MAX), 0x7f80);
    ck_assert_uint_eq(loom_float_to_bf16(-FLT_MAX), 0xff80);
    ck_assert_uint_eq(loom_float_to_bf16(float_from_bits(0x7f7f7fff)), 0x7f7f);
    ck_assert_uint_eq(loom_float_to_bf16(INFINITY), 0x7f80);
    /* Subnormals keep bf16's (float's) exponent, so they round like the rest. */
    ck_assert_uint_eq(loom_float_to_bf16(float_from_bits(0x00010000)), 0x0001);
    ck_assert_uint_eq(loom_float_to_bf16(float_from_bits(0x00008000)), 0x0000);
    ck_assert_uint_eq(loom_float_to_bf16(float_from_bits(0x00018000)), 0x0002);
    ck_assert_uint_eq(loom_float_to_bf16(float_from_bits(0x00008001)), 0x0001);
    ck_assert_uint_eq(loom_float_to_bf16(float_from_bits(0x807fffff)), 0x8080);
    /* NaNs whose payload lies entirely in the dropped bits must not become infinity. */
    static const uint32_t nans[] = { 0x7f800001, 0x7f80ffff, 0xff800001, 0x7fc00000, 0x7fffffff };
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t b = loom_float_to_bf16(float_from_bits(nans[i]));
        ck_assert_msg((b & 0x7fff) > 0x7f80, "NaN 0x%08x -> 0x%04x", nans[i], b);
        ck_assert_uint_eq(b & 0x8000, (nans[i] >> 16) & 0x8000);
    }
}
END_TEST

static void teardown_isa(void)
{
    restore_isa();
}

Suite *loom_reduce_suite(void)
{
    Suite *s = suite_create("reduce");

    TCase *kernels = tcase_create("kernels");
    tcase_add_checked_fixture(kernels, NULL, teardown_isa);
    /* Every dtype x op x length x alignment x ISA; slow under valgrind. */
    tcase_set_timeout(kernels, 600);
    tcase_add_test(kernels, test_isa_name);
    tcase_add_loop_test(kernels, test_kernels_match_reference, 0, NUM_ISAS);
    tcase_add_loop_test(kernels, test_kernels_aliased, 0, NUM_ISAS);
    tcase_add_loop_test(kernels, test_zero_count_touches_nothing, 0, NUM_ISAS);
    tcase_add_loop_test(kernels, test_bitwise_on_floats_does_nothing, 0, NUM_ISAS);
    tcase_add_loop_test(kernels, test_signed_overflow_wraps, 0, NUM_ISAS);
    tcase_add_loop_test(kernels, test_integer_min_max_signedness, 0, NUM_ISAS);
    tcase_add_loop_test(kernels, test_float_specials, 0, NUM_ISAS);
    tcase_add_loop_test(kernels, test_half_rounding_in_kernels, 0, NUM_ISAS);
    suite_add_tcase(s, kernels);

    TCase *avg = tcase_create("avg");
    tcase_add_checked_fixture(avg, NULL, teardown_isa);
    tcase_set_timeout(avg, 600);
    tcase_add_loop_test(avg, test_avg_finalize_integers_truncate, 0, NUM_ISAS);
    tcase_add_loop_test(avg, test_avg_finalize_floats, 0, NUM_ISAS);
    tcase_add_loop_test(avg, test_avg_finalize_matches_reference, 0, NUM_ISAS);
    suite_add_tcase(s, avg);

    TCase *conversions = tcase_create("conversions");
    tcase_set_timeout(conversions, 600);
    tcase_add_test(conversions, test_half_to_float_exhaustive);
    tcase_add_test(conversions, test_half_round_trip_exhaustive);
    tcase_add_test(conversions, test_float_to_half_ties_to_even);
    tcase_add_test(conversions, test_float_to_half_specials);
    tcase_add_test(conversions, test_float_to_half_sweep);
    tcase_add_test(conversions, test_half_matches_f16c);
    tcase_add_test(conversions, test_bf16_round_trip_exhaustive);
    tcase_add_test(conversions, test_float_to_bf16_ties_to_even);
    suite_add_tcase(s, conversions);

    return s;
}
