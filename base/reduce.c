/* reduce.c - element-wise CPU reductions, the inner loop of every reducing
 * collective.
 *
 * The arithmetic lives in reduce_ops.h. Here it is compiled into one kernel per
 * dtype x op, several times over: for AVX-512, for AVX2 and for the baseline
 * instruction set, with the compiler's auto-vectoriser doing the work (float16 alone
 * uses intrinsics, for the F16C conversions). The best set the CPU supports is
 * picked on first use, so one binary runs everywhere and still streams at memory
 * bandwidth on recent machines.
 */
#include <stdatomic.h>
#include <string.h>

#include "reduce.h"
#include "reduce_ops.h"

#if defined(__x86_64__) || defined(__i386__)
#define LOOM_REDUCE_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

/* out[i] = a[i] (op) b[i]; out may equal a or b. */
typedef void (*loom_kernel_fn)(void *out, const void *a, const void *b, size_t count);
/* buf[i] = buf[i] / nranks. */
typedef void (*loom_avg_fn)(void *buf, size_t count, int nranks);

/* Index of an op in a kernel table: AVG reduces as SUM. The bitwise ops exist
 * for integer types only; floating-point rows leave them NULL. */
enum {
    LOOM_KOP_SUM, LOOM_KOP_PROD, LOOM_KOP_MIN, LOOM_KOP_MAX,
    LOOM_KOP_BAND, LOOM_KOP_BOR, LOOM_KOP_BXOR, LOOM_KOP_COUNT
};

typedef struct loom_reduce_impl {
    const char *name;
    loom_kernel_fn kernel[LOOM_NUM_DTYPES][LOOM_KOP_COUNT];
    loom_avg_fn avg[LOOM_NUM_DTYPES];
} loom_reduce_impl_t;

/* ---- kernel templates ---------------------------------------------------------
 * No restrict: out may be the very same array as a or b, which restrict would make
 * undefined. Reading and writing the same index carries no dependence from one
 * iteration to the next, though, and LOOM_IVDEP says so, so the loops vectorise
 * without a run-time overlap test (clang's would send out == a to scalar code). */

#if defined(__clang__)
#define LOOM_IVDEP _Pragma("clang loop vectorize(assume_safety)")
/* assume_safety also demands vectorisation, and clang warns where it cannot (the
 * branchy generic float16 code); scalar code is fine there. */
#pragma clang diagnostic ignored "-Wpass-failed"
#elif defined(__GNUC__)
#define LOOM_IVDEP _Pragma("GCC ivdep")
#else
#define LOOM_IVDEP
#endif

#define LOOM_BINARY_KERNEL(isa, T, type, op)                                            \
    static void isa##_##op##_##type(void *out_, const void *a_, const void *b_, size_t n) \
    {                                                                                   \
        T *out = out_;                                                                  \
        const T *a = a_;                                                                \
        const T *b = b_;                                                                \
        LOOM_IVDEP                                                                      \
        for (size_t i = 0; i < n; i++)                                                  \
            out[i] = loom_op_##op##_##type(a[i], b[i]);                                 \
    }

#define LOOM_AVG_KERNEL(isa, T, type)                                                   \
    static void isa##_avg_##type(void *buf_, size_t n, int nranks)                      \
    {                                                                                   \
        T *buf = buf_;                                                                  \
        for (size_t i = 0; i < n; i++)                                                  \
            buf[i] = loom_op_avg_##type(buf[i], nranks);                                \
    }

#define LOOM_TYPE_KERNELS(isa, T, type)                                                 \
    LOOM_BINARY_KERNEL(isa, T, type, sum)                                               \
    LOOM_BINARY_KERNEL(isa, T, type, prod)                                              \
    LOOM_BINARY_KERNEL(isa, T, type, min)                                               \
    LOOM_BINARY_KERNEL(isa, T, type, max)                                               \
    LOOM_AVG_KERNEL(isa, T, type)

#define LOOM_INT_TYPE_KERNELS(isa, T, type)                                             \
    LOOM_TYPE_KERNELS(isa, T, type)                                                     \
    LOOM_BINARY_KERNEL(isa, T, type, band)                                              \
    LOOM_BINARY_KERNEL(isa, T, type, bor)                                               \
    LOOM_BINARY_KERNEL(isa, T, type, bxor)

/* bfloat16 is the upper half of a float. Read as one little-endian uint32_t, a pair
 * of elements x gives the first as the float x << 16 and the second as
 * x & 0xffff0000, and two results merge back the same way: no widening or narrowing
 * shuffles, which makes the vector loop about 1.5 times faster than element by
 * element. memcpy, because bfloat16 arrays are only 2-byte aligned. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__

#define LOOM_BF16_BINARY_KERNEL(isa, op)                                                \
    static void isa##_##op##_bf16(void *out_, const void *a_, const void *b_, size_t n) \
    {                                                                                   \
        unsigned char *out = out_;                                                      \
        const unsigned char *a = a_;                                                    \
        const unsigned char *b = b_;                                                    \
        LOOM_IVDEP                                                                      \
        for (size_t pair = 0; pair < n / 2; pair++) {                                   \
            uint32_t x, y;                                                              \
            memcpy(&x, a + 4 * pair, 4);                                                \
            memcpy(&y, b + 4 * pair, 4);                                                \
            float first = loom_op_##op##_f32(loom_f32_from_bits(x << 16),               \
                                             loom_f32_from_bits(y << 16));              \
            float second = loom_op_##op##_f32(loom_f32_from_bits(x & 0xffff0000u),      \
                                              loom_f32_from_bits(y & 0xffff0000u));     \
            uint32_t merged = (loom_f32_to_bf16_high(first) >> 16) |                    \
                              (loom_f32_to_bf16_high(second) & 0xffff0000u);            \
            memcpy(out + 4 * pair, &merged, 4);                                         \
        }                                                                               \
        if (n % 2) {                                                                    \
            uint16_t x, y, result;                                                      \
            memcpy(&x, a + 2 * (n - 1), 2);                                             \
            memcpy(&y, b + 2 * (n - 1), 2);                                             \
            result = loom_op_##op##_bf16(x, y);                                         \
            memcpy(out + 2 * (n - 1), &result, 2);                                      \
        }                                                                               \
    }

#define LOOM_BF16_KERNELS(isa)                                                          \
    LOOM_BF16_BINARY_KERNEL(isa, sum)                                                   \
    LOOM_BF16_BINARY_KERNEL(isa, prod)                                                  \
    LOOM_BF16_BINARY_KERNEL(isa, min)                                                   \
    LOOM_BF16_BINARY_KERNEL(isa, max)                                                   \
    LOOM_AVG_KERNEL(isa, uint16_t, bf16)

#else
#define LOOM_BF16_KERNELS(isa) LOOM_TYPE_KERNELS(isa, uint16_t, bf16)
#endif

/* Every type but float16, whose software conversion is all branches: vector sets
 * with F16C convert it in hardware instead. */
#define LOOM_PORTABLE_KERNELS(isa)                                                      \
    LOOM_INT_TYPE_KERNELS(isa, int8_t, i8)                                                  \
    LOOM_INT_TYPE_KERNELS(isa, uint8_t, u8)                                                 \
    LOOM_INT_TYPE_KERNELS(isa, int16_t, i16)                                                \
    LOOM_INT_TYPE_KERNELS(isa, uint16_t, u16)                                               \
    LOOM_INT_TYPE_KERNELS(isa, int32_t, i32)                                                \
    LOOM_INT_TYPE_KERNELS(isa, uint32_t, u32)                                               \
    LOOM_INT_TYPE_KERNELS(isa, int64_t, i64)                                                \
    LOOM_INT_TYPE_KERNELS(isa, uint64_t, u64)                                               \
    LOOM_BF16_KERNELS(isa)                                                              \
    LOOM_TYPE_KERNELS(isa, float, f32)                                                  \
    LOOM_TYPE_KERNELS(isa, double, f64)

#define LOOM_TYPE_ENTRY(isa, type)                                                      \
    { isa##_sum_##type, isa##_prod_##type, isa##_min_##type, isa##_max_##type }
#define LOOM_INT_TYPE_ENTRY(isa, type)                                                  \
    { isa##_sum_##type, isa##_prod_##type, isa##_min_##type, isa##_max_##type,          \
      isa##_band_##type, isa##_bor_##type, isa##_bxor_##type }

#define LOOM_IMPL(isa)                                                                  \
    static const loom_reduce_impl_t isa##_impl = {                                      \
        .name = #isa,                                                                   \
        .kernel = {                                                                     \
            [LOOM_INT8] = LOOM_INT_TYPE_ENTRY(isa, i8),                                 \
            [LOOM_UINT8] = LOOM_INT_TYPE_ENTRY(isa, u8),                                \
            [LOOM_INT32] = LOOM_INT_TYPE_ENTRY(isa, i32),                               \
            [LOOM_UINT32] = LOOM_INT_TYPE_ENTRY(isa, u32),                              \
            [LOOM_INT64] = LOOM_INT_TYPE_ENTRY(isa, i64),                               \
            [LOOM_UINT64] = LOOM_INT_TYPE_ENTRY(isa, u64),                              \
            [LOOM_FLOAT16] = LOOM_TYPE_ENTRY(isa, f16),                                 \
            [LOOM_BFLOAT16] = LOOM_TYPE_ENTRY(isa, bf16),                               \
            [LOOM_FLOAT32] = LOOM_TYPE_ENTRY(isa, f32),                                 \
            [LOOM_FLOAT64] = LOOM_TYPE_ENTRY(isa, f64),                                 \
            [LOOM_INT16] = LOOM_INT_TYPE_ENTRY(isa, i16),                               \
            [LOOM_UINT16] = LOOM_INT_TYPE_ENTRY(isa, u16),                              \
        },                                                                              \
        .avg = {                                                                        \
            [LOOM_INT8] = isa##_avg_i8,       [LOOM_UINT8] = isa##_avg_u8,              \
            [LOOM_INT32] = isa##_avg_i32,     [LOOM_UINT32] = isa##_avg_u32,            \
            [LOOM_INT64] = isa##_avg_i64,     [LOOM_UINT64] = isa##_avg_u64,            \
            [LOOM_FLOAT16] = isa##_avg_f16,   [LOOM_BFLOAT16] = isa##_avg_bf16,         \
            [LOOM_FLOAT32] = isa##_avg_f32,   [LOOM_FLOAT64] = isa##_avg_f64,           \
            [LOOM_INT16] = isa##_avg_i16,     [LOOM_UINT16] = isa##_avg_u16,            \
        },                                                                              \
    };

/* ---- generic: the baseline instruction set ------------------------------------ */

LOOM_PORTABLE_KERNELS(generic)
LOOM_TYPE_KERNELS(generic, uint16_t, f16)
LOOM_IMPL(generic)

#ifdef LOOM_REDUCE_X86

/* ---- float16 through F16C -------------------------------------------------------
 * Each vector set supplies isa##_f16_load(p, len) and isa##_f16_store(p, v, len),
 * which widen and narrow (round to nearest even) up to one vector of halves;
 * len < a full vector touches only len elements, so the remainder of an array goes
 * through the same instructions as the rest and gets the same NaN payloads.
 *
 * SUM, PROD and AVG stay in registers: vector add, multiply and divide are the very
 * IEEE operations the float32 element code performs. MIN and MAX, with their NaN and
 * signed-zero rules, widen a block into float arrays on the stack (they stay in L1),
 * run the float32 element code on it, and narrow back, so that their semantics
 * cannot drift from float32's. Both read an element before writing it, so out may
 * alias a or b. */

#define LOOM_F16_BLOCK 256

#define LOOM_F16_VECTOR_KERNEL(isa, op, vector_op)                                      \
    static void isa##_##op##_f16(void *out_, const void *a_, const void *b_, size_t n)  \
    {                                                                                   \
        uint16_t *out = out_;                                                           \
        const uint16_t *a = a_;                                                         \
        const uint16_t *b = b_;                                                         \
        for (size_t i = 0; i < n; i += isa##_F16_WIDTH) {                               \
            size_t len = n - i < isa##_F16_WIDTH ? n - i : isa##_F16_WIDTH;             \
            isa##_f16_store(out + i, vector_op(isa##_f16_load(a + i, len),              \
                                               isa##_f16_load(b + i, len)), len);       \
        }                                                                               \
    }

#define LOOM_F16_BLOCK_KERNEL(isa, op)                                                  \
    static void isa##_##op##_f16(void *out_, const void *a_, const void *b_, size_t n)  \
    {                                                                                   \
        uint16_t *out = out_;                                                           \
        const uint16_t *a = a_;                                                         \
        const uint16_t *b = b_;                                                         \
        float wide_a[LOOM_F16_BLOCK], wide_b[LOOM_F16_BLOCK];                           \
        for (size_t start = 0; start < n; start += LOOM_F16_BLOCK) {                    \
            size_t block = n - start < LOOM_F16_BLOCK ? n - start : LOOM_F16_BLOCK;     \
            for (size_t i = 0; i < block; i += isa##_F16_WIDTH) {                       \
                size_t len = block - i < isa##_F16_WIDTH ? block - i : isa##_F16_WIDTH; \
                isa##_store_ps(wide_a + i, isa##_f16_load(a + start + i, len));         \
                isa##_store_ps(wide_b + i, isa##_f16_load(b + start + i, len));         \
            }                                                                           \
            for (size_t i = 0; i < block; i++)                                          \
                wide_a[i] = loom_op_##op##_f32(wide_a[i], wide_b[i]);                   \
            for (size_t i = 0; i < block; i += isa##_F16_WIDTH) {                       \
                size_t len = block - i < isa##_F16_WIDTH ? block - i : isa##_F16_WIDTH; \
                isa##_f16_store(out + start + i, isa##_load_ps(wide_a + i), len);       \
            }                                                                           \
        }                                                                               \
    }

/* Divides in float, then rounds once to half: the same as loom_op_avg_f16. */
#define LOOM_F16_KERNELS(isa)                                                           \
    LOOM_F16_VECTOR_KERNEL(isa, sum, isa##_add_ps)                                      \
    LOOM_F16_VECTOR_KERNEL(isa, prod, isa##_mul_ps)                                     \
    LOOM_F16_BLOCK_KERNEL(isa, min)                                                     \
    LOOM_F16_BLOCK_KERNEL(isa, max)                                                     \
    static void isa##_avg_f16(void *buf_, size_t n, int nranks)                         \
    {                                                                                   \
        uint16_t *buf = buf_;                                                           \
        for (size_t i = 0; i < n; i += isa##_F16_WIDTH) {                               \
            size_t len = n - i < isa##_F16_WIDTH ? n - i : isa##_F16_WIDTH;             \
            isa##_f16_store(buf + i, isa##_div_ps(isa##_f16_load(buf + i, len),         \
                                                  isa##_set1_ps((float)nranks)), len);  \
        }                                                                               \
    }

/* ---- AVX2 + F16C + FMA (Haswell and later) -------------------------------------- */

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c,fma")
#endif

#define avx2_F16_WIDTH 8
#define avx2_add_ps _mm256_add_ps
#define avx2_mul_ps _mm256_mul_ps
#define avx2_div_ps _mm256_div_ps
#define avx2_set1_ps _mm256_set1_ps
#define avx2_load_ps _mm256_loadu_ps
#define avx2_store_ps _mm256_storeu_ps

/* AVX2 has no 16-bit masked loads and stores: a partial vector goes through a
 * zero-padded copy. */
static inline __m256 avx2_f16_load(const uint16_t *src, size_t len)
{
    if (len == avx2_F16_WIDTH)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)src));
    uint16_t padded[avx2_F16_WIDTH] = {0};
    memcpy(padded, src, len * sizeof *src);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)padded));
}

static inline void avx2_f16_store(uint16_t *dst, __m256 v, size_t len)
{
    __m128i halves = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    if (len == avx2_F16_WIDTH) {
        _mm_storeu_si128((__m128i *)dst, halves);
        return;
    }
    uint16_t narrow[avx2_F16_WIDTH];
    _mm_storeu_si128((__m128i *)narrow, halves);
    memcpy(dst, narrow, len * sizeof *dst);
}

LOOM_PORTABLE_KERNELS(avx2)
LOOM_F16_KERNELS(avx2)
LOOM_IMPL(avx2)

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* ---- AVX-512 (Skylake-SP and later) ----------------------------------------------
 * 512-bit vectors explicitly: gcc's default tuning would stay at 256 bits, which
 * halves the throughput on data already in L1/L2 (a ring allreduce's chunks). DQ
 * gives 64-bit multiplies and conversions, BW and VL the masked 16-bit accesses. */

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,f16c,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,f16c,fma,prefer-vector-width=512")
#endif

#define avx512_F16_WIDTH 16
#define avx512_add_ps _mm512_add_ps
#define avx512_mul_ps _mm512_mul_ps
#define avx512_div_ps _mm512_div_ps
#define avx512_set1_ps _mm512_set1_ps
#define avx512_load_ps _mm512_loadu_ps
#define avx512_store_ps _mm512_storeu_ps

/* Masked, so a partial vector reads and writes only its own elements. */
static inline __m512 avx512_f16_load(const uint16_t *src, size_t len)
{
    __mmask16 valid = (__mmask16)((1u << len) - 1u);
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(valid, src));
}

static inline void avx512_f16_store(uint16_t *dst, __m512 v, size_t len)
{
    __mmask16 valid = (__mmask16)((1u << len) - 1u);
    _mm256_mask_storeu_epi16(dst, valid,
                             _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

LOOM_PORTABLE_KERNELS(avx512)
LOOM_F16_KERNELS(avx512)
LOOM_IMPL(avx512)

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif /* LOOM_REDUCE_X86 */

/* ---- dispatch ------------------------------------------------------------------ */

#ifdef LOOM_REDUCE_X86
/* From CPUID directly: clang's __builtin_cpu_supports does not know "f16c". */
static int loom_cpu_has_f16c(void)
{
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
#endif

static const loom_reduce_impl_t *loom_reduce_best_impl(void)
{
#ifdef LOOM_REDUCE_X86
    __builtin_cpu_init();
    /* __builtin_cpu_supports("avx2") also checks that the OS saves the ymm registers,
     * which F16C needs as well. */
    int has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                   loom_cpu_has_f16c();
    if (has_avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return &avx512_impl;
    if (has_avx2)
        return &avx2_impl;
#endif
    return &generic_impl;
}

/* The chosen table. Filled on first use rather than under pthread_once: the choice
 * is a pure function of the CPU, so threads racing to fill it store the same value,
 * and a reduction pays one load instead of a call. */
static _Atomic(const loom_reduce_impl_t *) loom_reduce_active;

static const loom_reduce_impl_t *loom_reduce_impl(void)
{
    const loom_reduce_impl_t *impl =
        atomic_load_explicit(&loom_reduce_active, memory_order_acquire);
    if (impl == NULL) {
        impl = loom_reduce_best_impl();
        atomic_store_explicit(&loom_reduce_active, impl, memory_order_release);
    }
    return impl;
}

const char *loom_reduce_isa(void)
{
    return loom_reduce_impl()->name;
}

loom_status_t loom_reduce_use_isa(const char *isa)
{
    const loom_reduce_impl_t *best = loom_reduce_best_impl();
    const loom_reduce_impl_t *chosen = NULL;

    if (isa == NULL || strcmp(isa, best->name) == 0)
        chosen = best;
    else if (strcmp(isa, "generic") == 0)
        chosen = &generic_impl;
#ifdef LOOM_REDUCE_X86
    else if (strcmp(isa, "avx2") == 0 && best == &avx512_impl)
        chosen = &avx2_impl;
#endif
    if (chosen == NULL)
        return LOOM_ERR_UNSUPPORTED;
    atomic_store_explicit(&loom_reduce_active, chosen, memory_order_release);
    return LOOM_SUCCESS;
}

static int loom_reduce_args_valid(loom_dtype_t dt, loom_op_t op)
{
    return (unsigned)dt < LOOM_NUM_DTYPES && (unsigned)op < LOOM_NUM_OPS;
}

void loom_reduce_local3(void *out, const void *a, const void *b, size_t count,
                        loom_dtype_t dt, loom_op_t op)
{
    /* The public entry points validate dtype and op; bad ones here would be a
     * bug in Loom itself, which must still not take the process down. */
    if (count == 0 || !loom_reduce_args_valid(dt, op))
        return;

    static const unsigned char kernel_op[LOOM_NUM_OPS] = {
        [LOOM_SUM] = LOOM_KOP_SUM, [LOOM_PROD] = LOOM_KOP_PROD, [LOOM_MIN] = LOOM_KOP_MIN,
        [LOOM_MAX] = LOOM_KOP_MAX, [LOOM_AVG] = LOOM_KOP_SUM, [LOOM_BAND] = LOOM_KOP_BAND,
        [LOOM_BOR] = LOOM_KOP_BOR, [LOOM_BXOR] = LOOM_KOP_BXOR,
    };
    loom_kernel_fn kernel = loom_reduce_impl()->kernel[dt][kernel_op[op]];
    if (kernel != NULL) /* NULL: a bitwise op on floats, refused by every caller */
        kernel(out, a, b, count);
}

void loom_reduce_local(void *inout, const void *in, size_t count, loom_dtype_t dt, loom_op_t op)
{
    loom_reduce_local3(inout, inout, in, count, dt, op);
}

void loom_reduce_avg_finalize(void *buf, size_t count, loom_dtype_t dt, int nranks)
{
    /* A communicator has at least one rank; anything else is a bug in Loom itself. */
    if (count == 0 || nranks <= 1 || (unsigned)dt >= LOOM_NUM_DTYPES)
        return;
    loom_reduce_impl()->avg[dt](buf, count, nranks);
}

float loom_half_to_float(uint16_t h)
{
    return loom_f16_to_f32(h);
}

uint16_t loom_float_to_half(float f)
{
    return loom_f32_to_f16(f);
}

float loom_bf16_to_float(uint16_t b)
{
    return loom_bf16_to_f32(b);
}

uint16_t loom_float_to_bf16(float f)
{
    return loom_f32_to_bf16(f);
}
