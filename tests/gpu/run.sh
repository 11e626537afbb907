#!/bin/bash
# tests/gpu/run.sh - build Loom with CUDA and run every GPU test and benchmark on
# this machine's GPU (one is enough), then print a summary. About 3-5 minutes on
# one GPU; each step has its own time limit so the whole stays under 8.
#   tests/gpu/run.sh [BUILD_DIR]     (default: a fresh directory under /tmp)
# Environment: CUDA_DIR (default /usr/local/cuda), CUDA_ARCH_FLAGS (nvcc targets).
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$(mktemp -d /tmp/loom-gpu.XXXXXX)}
jobs=$(nproc 2>/dev/null || echo 4)
start=$(date +%s)
passed=0
failed=0
summary=()

step() {  # step NAME LIMIT_S COMMAND...: run, log to $build/NAME.log, record the outcome
    local name=$1 limit=$2
    shift 2
    local t0 rc
    t0=$(date +%s)
    echo "=== $name"
    timeout -k 10 "$limit" "$@" > "$build/$name.log" 2>&1
    rc=$?
    tail -n 25 "$build/$name.log"
    if [ $rc = 0 ]; then
        passed=$((passed + 1)); summary+=("PASS $name ($(( $(date +%s) - t0 )) s)")
    elif [ $rc = 77 ]; then
        summary+=("SKIP $name: $(grep -m1 SKIP "$build/$name.log")")
    else
        failed=$((failed + 1)); summary+=("FAIL $name (exit $rc$([ $rc = 124 ] && echo ', timed out'))")
    fi
    return $rc
}

mkdir -p "$build"
echo "source $src, build $build"
if [ ! -x "$src/configure" ]; then
    (cd "$src" && ./autogen.sh > "$build/autogen.log" 2>&1) || { echo "autogen.sh failed"; cat "$build/autogen.log"; exit 1; }
fi
cd "$build" || exit 1
if ! step configure 120 "$src/configure" -q --with-cuda="${CUDA_DIR:-/usr/local/cuda}" ${CUDA_ARCH_FLAGS:+CUDA_ARCH_FLAGS="$CUDA_ARCH_FLAGS"} \
   || ! step build 300 make -j"$jobs" -s all tests/check_unit tests/gpu/gpu_kernels tests/gpu/gpu_collectives tests/gpu/bench_reduce; then
    printf '%s\n' "${summary[@]}"
    echo "$passed passed, $((failed)) failed"
    exit 1
fi

# Host-side unit tests of the shared op code and the staging logic.
step check_cuda_suite 120 env CK_RUN_SUITE=cuda ./tests/check_unit
step gpu_kernels 120 ./tests/gpu/gpu_kernels
if [ $? = 77 ]; then
    echo "no usable GPU here: the GPU steps are skipped"
    printf '%s\n' "${summary[@]}"
    echo "$passed passed, $failed failed"
    exit 77
fi
step gpu_collectives 240 ./tests/gpu/gpu_collectives
step bench_reduce 60 ./tests/gpu/bench_reduce 256 float32 bfloat16 float16 float64 int32
# busbw with device buffers, 2 ranks sharing the GPU (as nccl-tests' all_reduce_perf -g 1 x 2).
step perf_allreduce_gpu_2ranks 120 ./tools/loomrun -np 2 ./tools/loom-perf allreduce -g -b 8 -e 256M -f 4 -n 5 -w 2
step perf_allgather_gpu_2ranks 60 ./tools/loomrun -np 2 ./tools/loom-perf allgather -g -b 1K -e 64M -f 8 -n 5 -w 2
# torch.distributed's "loom" on CUDA tensors (/opt/loom-torch's torch, else python3's).
step torch_c10d_cuda 300 "$src/tests/gpu/torch_c10d_cuda.sh" "$build"

echo
echo "=== summary (logs in $build)"
printf '%s\n' "${summary[@]}"
grep -h "^reduce " "$build/bench_reduce.log" 2>/dev/null
grep -h "Avg bus bandwidth" "$build"/perf_*.log 2>/dev/null
echo "took $(( $(date +%s) - start )) s"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
