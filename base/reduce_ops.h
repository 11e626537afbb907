/* reduce_ops.h - the per-element arithmetic of every dtype x op, and the
 * binary16/bfloat16 conversions.
 *
 * Everything here is a small static inline function on scalars so that the CPU
 * kernels (reduce.c) and a later CUDA build share one definition of what each
 * reduction means. Hence: plain C11 that is also valid CUDA C++ (no compound
 * literals, no _Generic, no VLAs), bit casts through unions (defined in C11,
 * and accepted by gcc, clang and nvcc in C++), and no dependence on the
 * floating-point environment beyond round-to-nearest-even arithmetic, so that
 * flush-to-zero modes cannot change a conversion.
 */
#ifndef LOOM_REDUCE_OPS_H
#define LOOM_REDUCE_OPS_H

#include <stdint.h>

#ifdef __CUDACC__
#define LOOM_HOSTDEV __host__ __device__
#else
#define LOOM_HOSTDEV
#endif

/* ---- bit casts -------------------------------------------------------------- */

union loom_f32_bits { float f; uint32_t u; };
union loom_f64_bits { double f; uint64_t u; };

static inline LOOM_HOSTDEV uint32_t loom_f32_to_bits(float f)
{
    union loom_f32_bits v;
    v.f = f;
    return v.u;
}

static inline LOOM_HOSTDEV float loom_f32_from_bits(uint32_t u)
{
    union loom_f32_bits v;
    v.u = u;
    return v.f;
}

static inline LOOM_HOSTDEV uint64_t loom_f64_to_bits(double f)
{
    union loom_f64_bits v;
    v.f = f;
    return v.u;
}

static inline LOOM_HOSTDEV double loom_f64_from_bits(uint64_t u)
{
    union loom_f64_bits v;
    v.u = u;
    return v.f;
}

/* ---- binary16 and bfloat16 <-> float ------------------------------------------
 * Integer-only, so the result does not depend on DAZ/FTZ (CPU) or -ftz (CUDA).
 * NaNs come out quiet with the payload's top bits kept, as x86 F16C does, so the
 * vector kernels and these scalar ones agree bit for bit. */

static inline LOOM_HOSTDEV float loom_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    uint32_t bits;

    if (exponent == 0x1f)
        bits = 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0);
    else if (exponent != 0)
        bits = ((exponent + (127 - 15)) << 23) | (mantissa << 13);
    else if (mantissa != 0)
        /* Subnormal: mantissa * 2^-24. Converting the integer mantissa is exact and
         * gives a normal float; scaling by 2^-24 is then an exponent subtraction. */
        bits = loom_f32_to_bits((float)mantissa) - (24u << 23);
    else
        bits = 0;
    return loom_f32_from_bits(sign | bits);
}

static inline LOOM_HOSTDEV uint16_t loom_f32_to_f16(float f)
{
    uint32_t x = loom_f32_to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t magnitude = x & 0x7fffffffu;

    if (magnitude > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    /* 65520 is halfway between the largest half (65504) and 2^16; its tie goes to
     * the even neighbour, which is infinity. */
    if (magnitude >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (magnitude >= 0x38800000u) {
        /* Normal half. Adding 0xfff plus the lowest kept bit rounds to nearest even
         * in the 13 dropped bits; a carry into the exponent is the right answer. */
        uint32_t lowest_kept_bit = (magnitude >> 13) & 1u;
        magnitude += 0xfffu + lowest_kept_bit;
        magnitude -= (127u - 15u) << 23;
        return (uint16_t)(sign | (magnitude >> 13));
    }
    /* Below 2^-14: the result is round(value * 2^24), a subnormal (or the smallest
     * normal, 0x0400, when it rounds up to 1024, which the encoding gives for free). */
    uint32_t exponent = magnitude >> 23;
    uint32_t shift = 126u - exponent;
    if (shift > 24)
        return (uint16_t)sign; /* at most a quarter of the smallest subnormal */
    uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
    uint32_t quotient = significand >> shift;
    uint32_t remainder = significand & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (quotient & 1u)))
        quotient++;
    return (uint16_t)(sign | quotient);
}

static inline LOOM_HOSTDEV float loom_bf16_to_f32(uint16_t b)
{
    return loom_f32_from_bits((uint32_t)b << 16);
}

/* f rounded to bfloat16, in the upper half of the result (the lower half is junk).
 * Staying 32 bits wide lets vector code merge two results without narrowing. */
static inline LOOM_HOSTDEV uint32_t loom_f32_to_bf16_high(float f)
{
    uint32_t x = loom_f32_to_bits(f);
    uint32_t lowest_kept_bit = (x >> 16) & 1u;
    uint32_t rounded = x + 0x7fffu + lowest_kept_bit;
    /* Rounding would carry a NaN's payload into the exponent; keep it, quiet, instead. */
    return (x & 0x7fffffffu) > 0x7f800000u ? x | 0x00400000u : rounded;
}

static inline LOOM_HOSTDEV uint16_t loom_f32_to_bf16(float f)
{
    return (uint16_t)(loom_f32_to_bf16_high(f) >> 16);
}

/* ---- integer ops --------------------------------------------------------------
 * Signed sums and products are computed in the unsigned type: it wraps by
 * definition, and converting back is two's complement on every target we build
 * for (implementation-defined in C, never undefined). */

#define LOOM_INT_OPS(T, UT, name)                                                       \
    static inline LOOM_HOSTDEV T loom_op_sum_##name(T a, T b)                           \
    {                                                                                   \
        return (T)(UT)((UT)a + (UT)b);                                                  \
    }                                                                                   \
    static inline LOOM_HOSTDEV T loom_op_prod_##name(T a, T b)                          \
    {                                                                                   \
        return (T)(UT)((UT)a * (UT)b);                                                  \
    }                                                                                   \
    static inline LOOM_HOSTDEV T loom_op_min_##name(T a, T b) { return b < a ? b : a; } \
    static inline LOOM_HOSTDEV T loom_op_max_##name(T a, T b) { return a < b ? b : a; } \
    static inline LOOM_HOSTDEV T loom_op_band_##name(T a, T b) { return (T)(a & b); }   \
    static inline LOOM_HOSTDEV T loom_op_bor_##name(T a, T b) { return (T)(a | b); }    \
    static inline LOOM_HOSTDEV T loom_op_bxor_##name(T a, T b) { return (T)(a ^ b); }   \
    /* nranks > 0, so the only overflowing signed division (MIN / -1) cannot occur. */  \
    static inline LOOM_HOSTDEV T loom_op_avg_##name(T sum, int nranks)                  \
    {                                                                                   \
        return (T)(sum / nranks);                                                       \
    }

/* uint8_t promotes to int: 255 * 255 still fits, so no signed overflow; uint16_t
 * would not (65535 * 65535), so the 16-bit types compute in uint32_t.
 * uint32_t * uint32_t stays unsigned because int is 32 bits on every target. */
LOOM_INT_OPS(int8_t, uint8_t, i8)
LOOM_INT_OPS(uint8_t, uint8_t, u8)
LOOM_INT_OPS(int16_t, uint32_t, i16)
LOOM_INT_OPS(uint16_t, uint32_t, u16)
LOOM_INT_OPS(int32_t, uint32_t, i32)
LOOM_INT_OPS(uint32_t, uint32_t, u32)
LOOM_INT_OPS(int64_t, uint64_t, i64)
LOOM_INT_OPS(uint64_t, uint64_t, u64)

#undef LOOM_INT_OPS

/* ---- floating-point ops -------------------------------------------------------
 * MIN and MAX propagate NaN: if either input is NaN the result is NaN (IEEE
 * 754-2019 minimum/maximum), unlike C fmin/fmax and IEEE 754-2008 minNum, which
 * return the other operand. A NaN in one rank's gradients must not vanish in an
 * allreduce. They also order -0 below +0, which makes them commutative, so every
 * rank gets the same bits whatever order a collective combines them in.
 * A NaN result is the NaN operand itself (the first one if both are): computing a
 * quiet one with a + b would be a conditional, possibly trapping, operation, which
 * gcc refuses to if-convert, and these loops must vectorise without AVX-512 masks. */

#define LOOM_FLOAT_OPS(T, name)                                                         \
    static inline LOOM_HOSTDEV T loom_op_sum_##name(T a, T b) { return a + b; }         \
    static inline LOOM_HOSTDEV T loom_op_prod_##name(T a, T b) { return a * b; }        \
    static inline LOOM_HOSTDEV T loom_op_min_##name(T a, T b)                           \
    {                                                                                   \
        T smaller = b < a ? b : a;                                                      \
        /* Equal operands differ only when they are +0 and -0; OR picks -0. */          \
        T equal = loom_##name##_from_bits(loom_##name##_to_bits(a) |                    \
                                          loom_##name##_to_bits(b));                    \
        T ordered = a == b ? equal : smaller;                                           \
        T b_nan_or_ordered = b != b ? b : ordered;                                      \
        return a != a ? a : b_nan_or_ordered;                                           \
    }                                                                                   \
    static inline LOOM_HOSTDEV T loom_op_max_##name(T a, T b)                           \
    {                                                                                   \
        T larger = a < b ? b : a;                                                       \
        /* Equal operands differ only when they are +0 and -0; AND picks +0. */         \
        T equal = loom_##name##_from_bits(loom_##name##_to_bits(a) &                    \
                                          loom_##name##_to_bits(b));                    \
        T ordered = a == b ? equal : larger;                                            \
        T b_nan_or_ordered = b != b ? b : ordered;                                      \
        return a != a ? a : b_nan_or_ordered;                                           \
    }                                                                                   \
    static inline LOOM_HOSTDEV T loom_op_avg_##name(T sum, int nranks)                  \
    {                                                                                   \
        return sum / (T)nranks;                                                         \
    }

LOOM_FLOAT_OPS(float, f32)
LOOM_FLOAT_OPS(double, f64)

#undef LOOM_FLOAT_OPS

/* float16 and bfloat16: widen to float, compute, round back to nearest even. */
#define LOOM_HALF_OPS(name)                                                             \
    static inline LOOM_HOSTDEV uint16_t loom_op_sum_##name(uint16_t a, uint16_t b)      \
    {                                                                                   \
        return loom_f32_to_##name(loom_##name##_to_f32(a) + loom_##name##_to_f32(b));   \
    }                                                                                   \
    static inline LOOM_HOSTDEV uint16_t loom_op_prod_##name(uint16_t a, uint16_t b)     \
    {                                                                                   \
        return loom_f32_to_##name(loom_##name##_to_f32(a) * loom_##name##_to_f32(b));   \
    }                                                                                   \
    static inline LOOM_HOSTDEV uint16_t loom_op_min_##name(uint16_t a, uint16_t b)      \
    {                                                                                   \
        return loom_f32_to_##name(                                                      \
            loom_op_min_f32(loom_##name##_to_f32(a), loom_##name##_to_f32(b)));         \
    }                                                                                   \
    static inline LOOM_HOSTDEV uint16_t loom_op_max_##name(uint16_t a, uint16_t b)      \
    {                                                                                   \
        return loom_f32_to_##name(                                                      \
            loom_op_max_f32(loom_##name##_to_f32(a), loom_##name##_to_f32(b)));         \
    }                                                                                   \
    static inline LOOM_HOSTDEV uint16_t loom_op_avg_##name(uint16_t sum, int nranks)    \
    {                                                                                   \
        return loom_f32_to_##name(loom_##name##_to_f32(sum) / (float)nranks);           \
    }

LOOM_HALF_OPS(f16)
LOOM_HALF_OPS(bf16)

#undef LOOM_HALF_OPS

#endif /* LOOM_REDUCE_OPS_H */
