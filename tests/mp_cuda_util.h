/* mp_cuda_util.h - what the multi-process GPU tests over the CUDA double share
 * (check_cuda_ipc.c, mp_cuda_gdr.c): the collectives and element types they cover, inputs that
 * are small integers (exact in every type, float16 and bfloat16 too, so the
 * order of a reduction does not matter), the double's counters over a call, a
 * comparison with the host's result and a CUDA call check. */
#ifndef LOOM_MP_CUDA_UTIL_H
#define LOOM_MP_CUDA_UTIL_H

#include <stdint.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda-double/cuda_double.h"
#include "loom.h"
#include "mp_util.h"

/* The collectives of a matrix (ALLREDUCE and REDUCE first and adjacent:
 * mp_cuda_gdr.c loops over the two). */
enum {
    ALLREDUCE,
    REDUCE,
    BROADCAST,
    ALLGATHER,
    ALLGATHERV,
    REDUCE_SCATTER,
    ALLTOALL,
    ALLTOALLV,
    GATHER,
    SCATTER,
    NCOLLS
};
static const char *const coll_names[NCOLLS] = {
    "allreduce",      "reduce",   "broadcast", "allgather", "allgatherv",
    "reduce_scatter", "alltoall", "alltoallv", "gather",    "scatter"};

static const struct {
    loom_dtype_t dt;
    size_t es;
    const char *name;
} dtypes[] = {
    {LOOM_FLOAT32, 4, "float32"}, {LOOM_FLOAT16, 2, "float16"}, {LOOM_BFLOAT16, 2, "bfloat16"},
    {LOOM_FLOAT64, 8, "float64"}, {LOOM_INT32, 4, "int32"},     {LOOM_INT8, 1, "int8"},
};
#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

/* Small integers and quarters only: exact in binary16, no rounding needed. */
static inline uint16_t to_f16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) == 0)
        return (uint16_t)(u >> 16);
    uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu, man = u & 0x7fffffu;
    return (uint16_t)(sign | ((exp - 127 + 15) << 10) | (man >> 13));
}

/* Element i of rank r's input: an integer in [-4, 4]. */
static inline void put(void *buf, size_t i, loom_dtype_t dt, int r)
{
    int v = (int)((size_t)r * 5 + i * 3) % 9 - 4;
    float f = (float)v;
    switch (dt) {
    case LOOM_FLOAT32: ((float *)buf)[i] = f; break;
    case LOOM_FLOAT64: ((double *)buf)[i] = v; break;
    case LOOM_FLOAT16: ((uint16_t *)buf)[i] = to_f16(f); break;
    case LOOM_BFLOAT16: ((uint16_t *)buf)[i] = (uint16_t)(f32_bits(f) >> 16); break;
    case LOOM_INT32: ((int32_t *)buf)[i] = v; break;
    default: ((int8_t *)buf)[i] = (int8_t)v; break;
    }
}

/* The ops of a reducing case of the matrix: every op on the largest count of
 * float32 (dtypes[0]), sum elsewhere; a product runs on 1001 elements, where
 * 4^P stays exact. */
static const loom_op_t matrix_ops[] = {LOOM_SUM, LOOM_AVG, LOOM_MAX, LOOM_PROD};
static inline int matrix_nops(int reduces, size_t dti, int largest)
{
    return reduces && dti == 0 && largest ? 4 : 1;
}
static inline size_t matrix_count(loom_op_t op, size_t count)
{
    return op == LOOM_PROD ? 1001 : count;
}

/* What happened between two looks at the double's counters, added to sum. */
static inline void counts_since(cuda_double_counts_t *sum, const cuda_double_counts_t *before,
                                const cuda_double_counts_t *after)
{
    sum->h2d += after->h2d - before->h2d;
    sum->d2h += after->d2h - before->d2h;
    sum->d2d += after->d2d - before->d2d;
    sum->kernels += after->kernels - before->kernels;
    sum->dmabuf_exports += after->dmabuf_exports - before->dmabuf_exports;
    sum->allocs += after->allocs - before->allocs;
    sum->frees += after->frees - before->frees;
    sum->ipc_opens += after->ipc_opens - before->ipc_opens;
}

/* 1 when the n bytes of got (a case's result, downloaded) are want's (the
 * same call on host buffers); else mp_bad names the case and the first byte
 * that differs. */
static inline int same_bytes(loom_comm_t c, const char *coll, size_t dti, loom_op_t op, int root,
                             size_t count, int in_place, const char *got, const char *want,
                             size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            mp_bad(c, "%s %s op %d root %d count %zu %s: byte %zu is 0x%02x, host gives 0x%02x",
                   coll, dtypes[dti].name, (int)op, root, count,
                   in_place ? "in place" : "out of place", i, (unsigned char)got[i],
                   (unsigned char)want[i]);
            return 0;
        }
    return 1;
}

static inline int cuda_ok(loom_comm_t c, cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        mp_bad(c, "%s: %s", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}

#endif
