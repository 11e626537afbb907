/* gpu_kernels - the reduction kernels (cuda/kernels.cu) against the CPU kernels
 * (base/reduce.c, themselves checked against a reference by check_reduce), for
 * every dtype x op, lengths that exercise the vector body, the scalar tail and
 * the grid-stride loop, aligned and misaligned pointers, in place and out of
 * place. Random bit patterns include NaNs, infinities and subnormals; results
 * must agree bit for bit, except the payload of a NaN made by arithmetic (the
 * hardware's choice). Exits 77 without a GPU. Also built over the CUDA double
 * (tests/cuda-double/), without the longest length. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_int.h"
#include "gpu_common.h"
#include "base/reduce.h"
#include "base/types.h"

static const char *const dtype_names[LOOM_NUM_DTYPES] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64",
    "float16", "bfloat16", "float32", "float64", "int16", "uint16"};
static const char *const op_names[LOOM_NUM_OPS] = {"sum", "prod", "min", "max", "avg",
                                                   "band", "bor", "bxor"};

static uint64_t rng = 88172645463325252ull;
static uint64_t next_random(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int is_nan(loom_dtype_t dt, const void *p)
{
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

/* Random bytes, and for float types every eighth element a small integer, so the
 * arithmetic is not all NaN and infinity. */
static void fill(loom_dtype_t dt, unsigned char *buf, size_t n)
{
    size_t es = loom_dtype_size(dt);
    for (size_t i = 0; i < n * es; i++)
        buf[i] = (unsigned char)next_random();
    for (size_t i = 0; i < n; i += 8) {
        float v = (float)((int)(next_random() % 17) - 8);
        if (dt == LOOM_FLOAT16) { uint16_t h = loom_float_to_half(v); memcpy(buf + i * 2, &h, 2); }
        if (dt == LOOM_BFLOAT16) { uint16_t h = loom_float_to_bf16(v); memcpy(buf + i * 2, &h, 2); }
        if (dt == LOOM_FLOAT32) memcpy(buf + i * 4, &v, 4);
        if (dt == LOOM_FLOAT64) { double d = v; memcpy(buf + i * 8, &d, 8); }
    }
}

static int passed, failed;

static void one_case(cudaStream_t s, loom_dtype_t dt, loom_op_t op, size_t n, size_t offset,
                     int in_place)
{
    size_t es = loom_dtype_size(dt), bytes = (n + offset) * es;
    unsigned char *a = malloc(bytes), *b = malloc(bytes), *want = malloc(bytes), *got = malloc(bytes);
    unsigned char *da, *db, *dout;
    GPU_CHECK(cudaMalloc((void **)&da, bytes));
    GPU_CHECK(cudaMalloc((void **)&db, bytes));
    GPU_CHECK(cudaMalloc((void **)&dout, bytes));
    fill(dt, a, n + offset);
    fill(dt, b, n + offset);
    GPU_CHECK(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemcpy(db, b, bytes, cudaMemcpyHostToDevice));
    unsigned char *out = in_place ? da : dout;
    const size_t off = offset * es;
    int e = loom_cuda_reduce3(out + off, da + off, db + off, n, dt, op, s);
    if (e == 0 && op == LOOM_AVG)
        e = loom_cuda_avg(out + off, n, dt, 3, s);
    GPU_CHECK((cudaError_t)e);
    GPU_CHECK(cudaStreamSynchronize(s));
    GPU_CHECK(cudaMemcpy(got, out, bytes, cudaMemcpyDeviceToHost));
    memcpy(want, in_place ? a : got, bytes); /* outside [off, off + n): what the GPU holds */
    if (!in_place)
        memset(want + off, 0, n * es);
    loom_reduce_local3(want + off, a + off, b + off, n, dt, op);
    if (op == LOOM_AVG)
        loom_reduce_avg_finalize(want + off, n, dt, 3);
    size_t bad = 0, first = 0;
    int arith = op != LOOM_MIN && op != LOOM_MAX;
    for (size_t i = 0; i < n + offset; i++) {
        const unsigned char *x = got + i * es, *y = want + i * es;
        if (memcmp(x, y, es) != 0 && !(arith && i >= offset && is_nan(dt, x) && is_nan(dt, y)))
            if (bad++ == 0)
                first = i;
    }
    char name[160];
    snprintf(name, sizeof(name), "kernel %s %s n=%zu offset=%zu %s", dtype_names[dt],
             op_names[op], n, offset, in_place ? "in-place" : "out-of-place");
    if (bad) {
        printf("FAIL %s: %zu elements differ, the first at %zu\n", name, bad, first);
        failed++;
    } else {
        passed++;
    }
    cudaFree(da);
    cudaFree(db);
    cudaFree(dout);
    free(a);
    free(b);
    free(want);
    free(got);
}

int main(void)
{
    int skip = gpu_skip_unless_available("gpu_kernels");
    if (skip)
        return skip;
    GPU_CHECK(cudaSetDevice(0));
    cudaStream_t s;
    GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
#ifdef LOOM_ON_CUDA_DOUBLE
    /* The double's kernels are the CPU's: what it checks is how they are
     * launched and what they may touch, not the grid-stride loop. */
    static const size_t lengths[] = {1, 7, 33, 1003, 65536 + 5};
#else
    static const size_t lengths[] = {1, 7, 33, 1003, 65536 + 5, (size_t)3 << 20};
#endif
    for (int dt = 0; dt < LOOM_NUM_DTYPES; dt++)
        for (int op = 0; op < LOOM_NUM_OPS; op++)
            for (size_t l = 0; l < sizeof lengths / sizeof lengths[0] &&
                               loom_op_takes_dtype((loom_op_t)op, (loom_dtype_t)dt); l++)
                for (size_t offset = 0; offset < 2; offset++)
                    for (int in_place = 0; in_place < 2; in_place++)
                        one_case(s, dt, op, lengths[l], offset, in_place);
    cudaStreamDestroy(s);
    printf("gpu_kernels: every dtype x op x length x alignment x in-place checked\n");
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
