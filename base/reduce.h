/* reduce.h - element-wise CPU reductions for every dtype x op. */
#ifndef LOOM_REDUCE_H
#define LOOM_REDUCE_H

#include <stddef.h>
#include <stdint.h>
#include "loom.h"

/* inout[i] = inout[i] (op) in[i] for i < count. LOOM_AVG reduces as LOOM_SUM;
 * the division happens once at the end in loom_reduce_avg_finalize. float16 and
 * bfloat16 are computed in float and rounded to nearest even. Signed integers
 * wrap on overflow (computed in unsigned arithmetic, no undefined behaviour).
 * Buffers need no particular alignment; in and inout must not overlap partially. */
void loom_reduce_local(void *inout, const void *in, size_t count, loom_dtype_t dt, loom_op_t op);

/* out[i] = a[i] (op) b[i]; out may equal a or b. Saves a copy in ring algorithms. */
void loom_reduce_local3(void *out, const void *a, const void *b, size_t count,
                        loom_dtype_t dt, loom_op_t op);

/* buf[i] /= nranks, in the element type (integers truncate toward zero). */
void loom_reduce_avg_finalize(void *buf, size_t count, loom_dtype_t dt, int nranks);

/* IEEE binary16 and bfloat16 conversions, round to nearest even, NaN kept NaN. */
float loom_half_to_float(uint16_t h);
uint16_t loom_float_to_half(float f);
float loom_bf16_to_float(uint16_t b);
uint16_t loom_float_to_bf16(float f);

/* Name of the vector code chosen at run time ("avx512", "avx2", "generic"). */
const char *loom_reduce_isa(void);

/* Use the named vector code from now on instead of the best one, so tests can run
 * every variant this CPU supports; NULL goes back to the best. LOOM_ERR_UNSUPPORTED
 * when this CPU or build lacks it. Reductions already running finish with the code
 * they started with. */
loom_status_t loom_reduce_use_isa(const char *isa);

#endif
