/* bench_reduce - throughput of the reduction kernel (out = a + b) as a fraction of
 * the device's memory bandwidth: each element is read twice and written once, so
 * bytes moved = 3 x buffer size. Bandwidth references: the theoretical peak
 * (2 x memory clock x bus width) and what cudaMemcpy device-to-device reaches
 * (read once, write once). Usage: bench_reduce [MiB per buffer, default 256]
 * [dtype ... (default float32 bfloat16)]. Exits 77 without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_int.h"
#include "gpu_common.h"
#include "base/types.h"

static double time_ms(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0;
    GPU_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

int main(int argc, char **argv)
{
    int skip = gpu_skip_unless_available("bench_reduce");
    if (skip)
        return skip;
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
    const char *default_types[] = {"float32", "bfloat16"};
    const char *const *types = argc > 2 ? (const char *const *)argv + 2 : default_types;
    int ntypes = argc > 2 ? argc - 2 : 2;
    size_t bytes = mib << 20;
    const int iters = 20;

    GPU_CHECK(cudaSetDevice(0));
    struct cudaDeviceProp prop;
    GPU_CHECK(cudaGetDeviceProperties(&prop, 0));
    int clock_khz = 0, bus_bits = 0;
    GPU_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0));
    GPU_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0));
    double peak = 2.0 * clock_khz * 1e3 * bus_bits / 8.0; /* bytes/s, double data rate */

    char *a, *b, *out;
    GPU_CHECK(cudaMalloc((void **)&a, bytes));
    GPU_CHECK(cudaMalloc((void **)&b, bytes));
    GPU_CHECK(cudaMalloc((void **)&out, bytes));
    GPU_CHECK(cudaMemset(a, 0, bytes));
    GPU_CHECK(cudaMemset(b, 0, bytes));
    cudaStream_t s;
    cudaEvent_t e0, e1;
    GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    GPU_CHECK(cudaEventCreate(&e0));
    GPU_CHECK(cudaEventCreate(&e1));

    /* Reference: device-to-device copy, 2 x bytes moved. */
    GPU_CHECK(cudaMemcpyAsync(out, a, bytes, cudaMemcpyDeviceToDevice, s));
    GPU_CHECK(cudaEventRecord(e0, s));
    for (int i = 0; i < iters; i++)
        GPU_CHECK(cudaMemcpyAsync(out, a, bytes, cudaMemcpyDeviceToDevice, s));
    GPU_CHECK(cudaEventRecord(e1, s));
    GPU_CHECK(cudaEventSynchronize(e1));
    double copy_bw = 2.0 * bytes * iters / (time_ms(e0, e1) * 1e-3);
    printf("device %s: peak memory bandwidth %.0f GB/s (%d kHz x %d bit x 2); "
           "cudaMemcpy D2D %.0f GB/s (%.1f%% of peak)\n",
           prop.name, peak / 1e9, clock_khz, bus_bits, copy_bw / 1e9, 100 * copy_bw / peak);

    int rc = 0;
    for (int t = 0; t < ntypes; t++) {
        int dt = loom_dtype_parse(types[t]);
        if (dt < 0) {
            fprintf(stderr, "bench_reduce: unknown dtype '%s'\n", types[t]);
            rc = 2;
            continue;
        }
        size_t count = bytes / loom_dtype_size(dt);
        GPU_CHECK((cudaError_t)loom_cuda_reduce3(out, a, b, count, dt, LOOM_SUM, s));
        GPU_CHECK(cudaEventRecord(e0, s));
        for (int i = 0; i < iters; i++)
            GPU_CHECK((cudaError_t)loom_cuda_reduce3(out, a, b, count, dt, LOOM_SUM, s));
        GPU_CHECK(cudaEventRecord(e1, s));
        GPU_CHECK(cudaEventSynchronize(e1));
        double ms = time_ms(e0, e1) / iters;
        double bw = 3.0 * bytes / (ms * 1e-3);
        printf("reduce %-8s sum %zu MiB: %.3f ms, %.0f GB/s = %.1f%% of peak, %.1f%% of D2D copy\n",
               types[t], mib, ms, bw / 1e9, 100 * bw / peak, 100 * bw / copy_bw);
    }
    cudaFree(a);
    cudaFree(b);
    cudaFree(out);
    cudaStreamDestroy(s);
    return rc;
}
