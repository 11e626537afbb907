#!/bin/bash
# tests/gpu/run.sh - build Loom with CUDA and run every GPU test and benchmark on
# this machine's GPU (one is enough), then print a summary. About 5-7 minutes on
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
# Ranks of one node go GPU to GPU through CUDA IPC where the collective has that
# path; LOOM_CUDA_IPC=0 stages every call through host memory instead.
step gpu_collectives 240 ./tests/gpu/gpu_collectives
step gpu_collectives_staged 240 env LOOM_CUDA_IPC=0 ./tests/gpu/gpu_collectives
step bench_reduce 60 ./tests/gpu/bench_reduce 256 float32 bfloat16 float16 float64 int32

# perf_path NP COLL PATH MAX: busbw with device buffers, NP ranks sharing the
# GPU (as nccl-tests' all_reduce_perf -g 1 x NP), through CUDA IPC (PATH ipc) or
# staged (PATH staged); fails unless every rank's log names that path.
perf_path() {
    local np=$1 coll=$2 path=$3 max=$4 want out
    if [ "$path" = ipc ]; then want="$coll on GPU buffers: GPU to GPU through CUDA IPC"; else want="$coll on GPU buffers: staged"; fi
    out=$(mktemp)
    LOOM_DEBUG=INFO LOOM_CUDA_IPC=$([ "$path" = ipc ] && echo 1 || echo 0) \
        ./tools/loomrun -np "$np" ./tools/loom-perf "$coll" -g -b 8 -e "$max" -f 8 -n 5 -w 2 > "$out" 2>&1
    local rc=$?
    grep -v " LOOM INFO " "$out"
    local logged
    logged=$(grep -c "$want" "$out")
    rm -f "$out"
    echo "ranks that logged '$want': $logged of $np"
    [ $rc = 0 ] && [ "$logged" = "$np" ]
}
export -f perf_path
for np in 2 4; do
    for path in ipc staged; do
        step "perf_allreduce_gpu_${np}ranks_$path" 150 bash -c 'perf_path "$@"' _ $np allreduce $path 256M
        step "perf_allgather_gpu_${np}ranks_$path" 90 bash -c 'perf_path "$@"' _ $np allgather $path 64M
        step "perf_alltoall_gpu_${np}ranks_$path" 90 bash -c 'perf_path "$@"' _ $np alltoall $path 64M
    done
done
# torch.distributed's "loom" on CUDA tensors (/opt/loom-torch's torch, else
# python3's), then its all_reduce beside gloo's and NCCL's in the same processes.
step torch_c10d_cuda 360 "$src/tests/gpu/torch_c10d_cuda.sh" "$build"
# Horovod's own test_torch.py with CUDA tensors on loom.torch, where
# tests/gpu/carry.sh prepared tests/gpu/carry/ (Horovod's tests and pytest: this
# machine downloads nothing). Its GPU tests pin hvd.local_rank() as the device,
# so each of the 2 ranks acts as a node of its own (LOOM_HOST_ID), local rank 0,
# and both share cuda:0; their CUDA tensors then cross between "nodes" staged
# through host memory.
carry=$src/tests/gpu/carry
if [ -d "$carry/horovod/test/parallel" ] && [ -d "$carry/pylib" ]; then
    # The interpreter torch_c10d_cuda.sh used: $LOOM_TORCH_VENV (default /opt/loom-torch), else python3.
    venv=${LOOM_TORCH_VENV:-/opt/loom-torch}
    hvd_py=$([ -x "$venv/bin/python" ] && echo "$venv/bin/python" || command -v python3)
    printf '#!/bin/sh\n%s\nexec %s "$@"\n' \
        '[ -n "${LOOM_RANK:-}" ] && export LOOM_HOST_ID=gpu-rank-$LOOM_RANK' "$hvd_py" \
        > "$build/python-own-node"
    chmod +x "$build/python-own-node"
    step horovod_torch_gpu 300 env PYTHON="$build/python-own-node" BUILD="$build" \
        SUITE=test_torch.py SUITE_PYTHONPATH="$carry/pylib" SUITE_TIMEOUT=280 \
        "$src/bench/compat/horovod_suite.sh" "$carry/horovod" -np 2
else
    summary+=("SKIP horovod_torch_gpu: no tests/gpu/carry (tests/gpu/carry.sh HOROVOD_DIR prepares it)")
fi

echo
echo "=== summary (logs in $build)"
printf '%s\n' "${summary[@]}"
grep -h "^reduce " "$build/bench_reduce.log" 2>/dev/null
# Out-of-place time per call, staged against CUDA IPC, per rank count and collective.
for coll in allreduce allgather alltoall; do
    for np in 2 4; do
        ipc=$build/perf_${coll}_gpu_${np}ranks_ipc.log staged=$build/perf_${coll}_gpu_${np}ranks_staged.log
        [ -s "$ipc" ] && [ -s "$staged" ] || continue
        echo "$coll, $np ranks on one GPU: out-of-place us per call (size, CUDA IPC, staged, staged/IPC)"
        join <(awk '{sub(/^\[0\]<stdout>: */, "")} $1 ~ /^[0-9]+$/ && NF >= 9 {print $1, $6}' "$ipc" | sort -k1,1) \
             <(awk '{sub(/^\[0\]<stdout>: */, "")} $1 ~ /^[0-9]+$/ && NF >= 9 {print $1, $6}' "$staged" | sort -k1,1) |
            sort -n | awk '{printf "  %12d %10.1f %10.1f %8.2f\n", $1, $2, $3, ($2 > 0 ? $3 / $2 : 0)}'
    done
done
grep -h "^ddp_cnn: " "$build/torch_c10d_cuda.log" 2>/dev/null
grep -h "^per test, " "$build/horovod_torch_gpu.log" 2>/dev/null
grep -h -A8 "^all_reduce, " "$build/torch_c10d_cuda.log" 2>/dev/null
echo "took $(( $(date +%s) - start )) s"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
