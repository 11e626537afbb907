#!/bin/sh
# bench_staging.sh - what overlapping the staging passes buys: a 2-rank
# allreduce over TCP (LOOM_SHM=0) on host buffers, on GPU buffers staged with
# overlapped passes, and on GPU buffers one pass at a time (LOOM_CUDA_OVERLAP=0),
# over the CUDA double with its host<->device copies slowed to GBPS GB/s per
# stream (LOOM_CUDA_DOUBLE_GBPS). The three runs are interleaved, ROUNDS times;
# each gives loom-perf's out-of-place time per call (the mean of ITERS calls,
# default 3, after an untimed one); the end prints the medians and their ratios.
#
#   make tests/cuda-double/loom-perf &&
#   [ITERS=N] tests/cuda-double/bench_staging.sh [GBPS [ROUNDS [SIZE]]]
#
# Defaults: 3 GB/s, 3 rounds, 256M. Not a test: timings belong here, not in
# make check. On the double the copies and the reduction "kernels" run on the
# host's cores, beside the TCP loopback they should hide under; on a GPU, copy
# engines and SMs do that work (tests/gpu/run.sh runs loom-perf -g there).
set -eu
top_builddir=${top_builddir:-.}
gbps=${1:-3}
rounds=${2:-3}
size=${3:-256M}
iters=${ITERS:-3}
perf=$top_builddir/tests/cuda-double/loom-perf
run=$top_builddir/tools/loomrun
[ -x "$perf" ] || { echo "missing $perf: make tests/cuda-double/loom-perf" >&2; exit 1; }

# One run of MODE (host, overlapped, serial): microseconds per allreduce.
one() {
    case $1 in
    host) gpu= overlap=1 ;;
    overlapped) gpu=-g overlap=1 ;;
    serial) gpu=-g overlap=0 ;;
    esac
    LOOM_SHM=0 LOOM_CUDA_IPC=0 LOOM_CUDA_OVERLAP=$overlap LOOM_CUDA_DOUBLE_GBPS=$gbps \
        "$run" -np 2 "$perf" allreduce -b "$size" -e "$size" -n "$iters" -w 0 -c 0 -t tcp $gpu |
        awk '$1 == "[0]<stdout>:" && $4 == "float" { print $7 }'
}

median() {
    tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

echo "# allreduce $size float, 2 ranks over TCP, copies at $gbps GB/s; us per call"
host= overlapped= serial=
i=1
while [ "$i" -le "$rounds" ]; do
    h=$(one host)
    o=$(one overlapped)
    s=$(one serial)
    [ -n "$h" ] && [ -n "$o" ] && [ -n "$s" ] || { echo "a run printed no time" >&2; exit 1; }
    echo "round $i: host $h  gpu-overlapped $o  gpu-serial $s"
    host="$host $h" overlapped="$overlapped $o" serial="$serial $s"
    i=$((i + 1))
done
mh=$(echo "$host" | median)
mo=$(echo "$overlapped" | median)
ms=$(echo "$serial" | median)
echo "median: host $mh  gpu-overlapped $mo  gpu-serial $ms"
awk -v h="$mh" -v o="$mo" -v s="$ms" 'BEGIN {
    printf "gpu-overlapped / host %.2f   gpu-serial / host %.2f   gpu-serial / gpu-overlapped %.2f\n",
           o / h, s / h, s / o }'
