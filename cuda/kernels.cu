/* kernels.cu - element-wise reduction kernels for every dtype x op.
 *
 * The arithmetic is base/reduce_ops.h, compiled here as __host__ __device__, so a
 * GPU reduction gives the same bits as the CPU path (float16 and bfloat16 are
 * widened to float, combined, and rounded to nearest even, per step); the host
 * tests of those functions cover this code too.
 *
 * One kernel shape: grid-stride loops over 16-byte vectors (uint4) when all
 * three pointers are 16-byte aligned, the remainder element by element. Memory
 * bound: every element is read twice and written once, so the grid is sized to
 * keep every SM busy with several resident blocks, no more.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "loom.h"
#include "base/reduce_ops.h"
#include "cuda_int.h"

namespace {

#define LOOM_OP_FUNCTOR(opname, T, sfx)                                                 \
    struct op_##opname##_##sfx {                                                       \
        typedef T type;                                                                \
        static __device__ __forceinline__ T apply(T a, T b)                            \
        {                                                                              \
            return loom_op_##opname##_##sfx(a, b);                                     \
        }                                                                              \
    };
#define LOOM_AVG_FUNCTOR(T, sfx)                                                        \
    struct avg_##sfx {                                                                 \
        typedef T type;                                                                \
        static __device__ __forceinline__ T apply(T a, int n)                          \
        {                                                                              \
            return loom_op_avg_##sfx(a, n);                                            \
        }                                                                              \
    };
#define LOOM_FUNCTORS(T, sfx)                                                           \
    LOOM_OP_FUNCTOR(sum, T, sfx)                                                       \
    LOOM_OP_FUNCTOR(prod, T, sfx)                                                      \
    LOOM_OP_FUNCTOR(min, T, sfx)                                                       \
    LOOM_OP_FUNCTOR(max, T, sfx)                                                       \
    LOOM_AVG_FUNCTOR(T, sfx)

#define LOOM_INT_FUNCTORS(T, sfx)                                                       \
    LOOM_FUNCTORS(T, sfx)                                                              \
    LOOM_OP_FUNCTOR(band, T, sfx)                                                      \
    LOOM_OP_FUNCTOR(bor, T, sfx)                                                       \
    LOOM_OP_FUNCTOR(bxor, T, sfx)

LOOM_INT_FUNCTORS(int8_t, i8)
LOOM_INT_FUNCTORS(uint8_t, u8)
LOOM_INT_FUNCTORS(int16_t, i16)
LOOM_INT_FUNCTORS(uint16_t, u16)
LOOM_INT_FUNCTORS(int32_t, i32)
LOOM_INT_FUNCTORS(uint32_t, u32)
LOOM_INT_FUNCTORS(int64_t, i64)
LOOM_INT_FUNCTORS(uint64_t, u64)
LOOM_FUNCTORS(uint16_t, f16)
LOOM_FUNCTORS(uint16_t, bf16)
LOOM_FUNCTORS(float, f32)
LOOM_FUNCTORS(double, f64)

template <typename T> union vec16 {
    uint4 v;
    T e[16 / sizeof(T)];
};

template <typename Op>
__global__ void reduce3_kernel(typename Op::type *out, const typename Op::type *a,
                               const typename Op::type *b, size_t n, int vectorized)
{
    typedef typename Op::type T;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t done = 0;
    if (vectorized) {
        const int V = 16 / sizeof(T);
        const size_t nv = n / V;
        const uint4 *va = reinterpret_cast<const uint4 *>(a);
        const uint4 *vb = reinterpret_cast<const uint4 *>(b);
        uint4 *vo = reinterpret_cast<uint4 *>(out);
        for (size_t i = tid; i < nv; i += stride) {
            vec16<T> x, y, r;
            x.v = va[i];
            y.v = vb[i];
#pragma unroll
            for (int k = 0; k < V; k++)
                r.e[k] = Op::apply(x.e[k], y.e[k]);
            vo[i] = r.v;
        }
        done = nv * V;
    }
    for (size_t i = done + tid; i < n; i += stride)
        out[i] = Op::apply(a[i], b[i]);
}

template <typename Avg>
__global__ void avg_kernel(typename Avg::type *buf, size_t n, int nranks, int vectorized)
{
    typedef typename Avg::type T;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t done = 0;
    if (vectorized) {
        const int V = 16 / sizeof(T);
        const size_t nv = n / V;
        uint4 *vbuf = reinterpret_cast<uint4 *>(buf);
        for (size_t i = tid; i < nv; i += stride) {
            vec16<T> x;
            x.v = vbuf[i];
#pragma unroll
            for (int k = 0; k < V; k++)
                x.e[k] = Avg::apply(x.e[k], nranks);
            vbuf[i] = x.v;
        }
        done = nv * V;
    }
    for (size_t i = done + tid; i < n; i += stride)
        buf[i] = Avg::apply(buf[i], nranks);
}

const int threads_per_block = 512;

/* Enough blocks to fill the device (blocks_per_sm resident on each SM), fewer when
 * there is less work; the grid-stride loop covers the rest. */
unsigned grid_for(size_t work)
{
    static int sm_count[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        dev = 0;
    if (sm_count[dev] == 0) {
        int n = 0;
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
            n = 16;
        sm_count[dev] = n; /* racing writers store the same value */
    }
    const size_t blocks_per_sm = 4;
    size_t want = (work + threads_per_block - 1) / threads_per_block;
    size_t cap = (size_t)sm_count[dev] * blocks_per_sm;
    if (want > cap)
        want = cap;
    return want ? (unsigned)want : 1u;
}

int aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

template <typename Op>
int launch_reduce3(void *out, const void *a, const void *b, size_t n, cudaStream_t s)
{
    typedef typename Op::type T;
    int vec = aligned16(out) && aligned16(a) && aligned16(b);
    size_t work = vec ? n / (16 / sizeof(T)) + n % (16 / sizeof(T)) : n;
    reduce3_kernel<Op><<<grid_for(work), threads_per_block, 0, s>>>(
        static_cast<T *>(out), static_cast<const T *>(a), static_cast<const T *>(b), n, vec);
    return (int)cudaGetLastError();
}

template <typename Avg>
int launch_avg(void *buf, size_t n, int nranks, cudaStream_t s)
{
    typedef typename Avg::type T;
    int vec = aligned16(buf);
    size_t work = vec ? n / (16 / sizeof(T)) + n % (16 / sizeof(T)) : n;
    avg_kernel<Avg><<<grid_for(work), threads_per_block, 0, s>>>(static_cast<T *>(buf), n,
                                                                    nranks, vec);
    return (int)cudaGetLastError();
}

#define LOOM_DISPATCH_OP(sfx)                                                           \
    switch (op) {                                                                      \
    case LOOM_SUM:                                                                     \
    case LOOM_AVG: return launch_reduce3<op_sum_##sfx>(out, a, b, count, s);           \
    case LOOM_PROD: return launch_reduce3<op_prod_##sfx>(out, a, b, count, s);         \
    case LOOM_MIN: return launch_reduce3<op_min_##sfx>(out, a, b, count, s);           \
    case LOOM_MAX: return launch_reduce3<op_max_##sfx>(out, a, b, count, s);           \
    default: break; /* the bitwise ops: integers only */                               \
    }                                                                                  \
    break;

#define LOOM_DISPATCH_INT_OP(sfx)                                                       \
    switch (op) {                                                                      \
    case LOOM_BAND: return launch_reduce3<op_band_##sfx>(out, a, b, count, s);         \
    case LOOM_BOR: return launch_reduce3<op_bor_##sfx>(out, a, b, count, s);           \
    case LOOM_BXOR: return launch_reduce3<op_bxor_##sfx>(out, a, b, count, s);         \
    default: LOOM_DISPATCH_OP(sfx)                                                     \
    }                                                                                  \
    break;

} // namespace

extern "C" int loom_cuda_reduce3(void *out, const void *a, const void *b, size_t count,
                                 loom_dtype_t dt, loom_op_t op, void *stream)
{
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (count == 0)
        return (int)cudaSuccess;
    switch (dt) {
    case LOOM_INT8: LOOM_DISPATCH_INT_OP(i8)
    case LOOM_UINT8: LOOM_DISPATCH_INT_OP(u8)
    case LOOM_INT16: LOOM_DISPATCH_INT_OP(i16)
    case LOOM_UINT16: LOOM_DISPATCH_INT_OP(u16)
    case LOOM_INT32: LOOM_DISPATCH_INT_OP(i32)
    case LOOM_UINT32: LOOM_DISPATCH_INT_OP(u32)
    case LOOM_INT64: LOOM_DISPATCH_INT_OP(i64)
    case LOOM_UINT64: LOOM_DISPATCH_INT_OP(u64)
    case LOOM_FLOAT16: LOOM_DISPATCH_OP(f16)
    case LOOM_BFLOAT16: LOOM_DISPATCH_OP(bf16)
    case LOOM_FLOAT32: LOOM_DISPATCH_OP(f32)
    case LOOM_FLOAT64: LOOM_DISPATCH_OP(f64)
    }
    return (int)cudaErrorInvalidValue;
}

extern "C" int loom_cuda_avg(void *buf, size_t count, loom_dtype_t dt, int nranks, void *stream)
{
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (count == 0)
        return (int)cudaSuccess;
    switch (dt) {
    case LOOM_INT8: return launch_avg<avg_i8>(buf, count, nranks, s);
    case LOOM_UINT8: return launch_avg<avg_u8>(buf, count, nranks, s);
    case LOOM_INT16: return launch_avg<avg_i16>(buf, count, nranks, s);
    case LOOM_UINT16: return launch_avg<avg_u16>(buf, count, nranks, s);
    case LOOM_INT32: return launch_avg<avg_i32>(buf, count, nranks, s);
    case LOOM_UINT32: return launch_avg<avg_u32>(buf, count, nranks, s);
    case LOOM_INT64: return launch_avg<avg_i64>(buf, count, nranks, s);
    case LOOM_UINT64: return launch_avg<avg_u64>(buf, count, nranks, s);
    case LOOM_FLOAT16: return launch_avg<avg_f16>(buf, count, nranks, s);
    case LOOM_BFLOAT16: return launch_avg<avg_bf16>(buf, count, nranks, s);
    case LOOM_FLOAT32: return launch_avg<avg_f32>(buf, count, nranks, s);
    case LOOM_FLOAT64: return launch_avg<avg_f64>(buf, count, nranks, s);
    }
    return (int)cudaErrorInvalidValue;
}
