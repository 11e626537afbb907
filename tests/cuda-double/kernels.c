/* kernels.c - Loom's reduction kernels (cuda/kernels.cu) as the CUDA double
 * runs them: queued on the stream, run on its worker with the CPU reduction
 * (which kernels.cu matches bit for bit), over the double's view of the
 * operands. An operand a GPU could not reach (pageable host memory, a range
 * past its allocation, freed memory) faults the context, as an illegal address
 * does on hardware. Linked into the programs that use the double, in place of
 * kernels.cu. */
#include <stdio.h>

#include "cuda/cuda_int.h"
#include "cuda_double.h"
#include "base/reduce.h"

typedef struct {
    void *out;
    const void *a, *b;
    size_t count;
    loom_dtype_t dt;
    loom_op_t op;
    int nranks;
} kernel_args_t;

static void *reach(const void *p, size_t bytes, const char *kernel, const char *operand)
{
    void *at = cuda_double_reach(p, bytes);
    if (!at) {
        char why[160];
        snprintf(why, sizeof(why), "%s kernel: %s %p (%zu bytes) is not memory the GPU can reach",
                 kernel, operand, p, bytes);
        cuda_double_fault(cudaErrorIllegalAddress, why);
    }
    return at;
}

static void run_reduce3(void *arg)
{
    kernel_args_t *k = arg;
    size_t bytes = k->count * loom_dtype_size(k->dt);
    void *out = reach(k->out, bytes, "reduce3", "out");
    const void *a = out ? reach(k->a, bytes, "reduce3", "a") : NULL;
    const void *b = a ? reach(k->b, bytes, "reduce3", "b") : NULL;
    if (b)
        loom_reduce_local3(out, a, b, k->count, k->dt, k->op);
}

static void run_avg(void *arg)
{
    kernel_args_t *k = arg;
    void *buf = reach(k->out, k->count * loom_dtype_size(k->dt), "avg", "buf");
    if (buf)
        loom_reduce_avg_finalize(buf, k->count, k->dt, k->nranks);
}

int loom_cuda_reduce3(void *out, const void *a, const void *b, size_t count, loom_dtype_t dt,
                      loom_op_t op, void *stream)
{
    if (count == 0)
        return cudaSuccess;
    kernel_args_t k = {.out = out, .a = a, .b = b, .count = count, .dt = dt, .op = op};
    return cuda_double_launch(stream, run_reduce3, &k, sizeof(k));
}

int loom_cuda_avg(void *buf, size_t count, loom_dtype_t dt, int nranks, void *stream)
{
    if (count == 0)
        return cudaSuccess;
    kernel_args_t k = {.out = buf, .count = count, .dt = dt, .nranks = nranks};
    return cuda_double_launch(stream, run_avg, &k, sizeof(k));
}
