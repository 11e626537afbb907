#!/bin/bash
# compare.sh - Loom against the peers of ../shared/anchors on this machine, in
# one run, interleaved (rep -> N -> peer) so drift hits everyone alike:
#   Loom (loom_bench: the anchors' MPI harness calling loom_allreduce, LOOM_SHM=0),
#   Gloo's six allreduce algorithms (Debian's libgloo-dev, TCP on 127.0.0.1),
#   Open MPI with --mca btl tcp,self (Debian's openmpi-bin).
# Then prints, per N and size, each peer's time and its ratio to Loom's.
#
# usage: bench/compare.sh [-n "2 4"] [-r REPS] [-t SECONDS] [-s SIZES] [-q]
#   BUILD=dir  a configured and built Loom tree (default: the source tree)
#   -q         quick: fewer sizes, shorter timing (about 3 minutes)
# needs: apt-get install libgloo-dev openmpi-bin libopenmpi-dev g++
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
BUILD=${BUILD:-$top}
NS="2 4"
REPS=2
T=0.25
SIZES="8,16,64,256,1024,4096,16384,65536,262144,1048576,4194304,16777216,67108864,268435456"
while getopts "n:r:t:s:q" opt; do
    case $opt in
    n) NS=$OPTARG ;;
    r) REPS=$OPTARG ;;
    t) T=$OPTARG ;;
    s) SIZES=$OPTARG ;;
    q) T=0.05; REPS=1; SIZES="8,4096,65536,1048576,16777216,67108864" ;;
    *) sed -n '2,14p' "$0"; exit 2 ;;
    esac
done
out=${OUT:-$here/results}
mkdir -p "$out"
rm -f "$out"/*_n*_r*.txt

for need in g++ mpicc.openmpi mpirun.openmpi; do
    command -v $need >/dev/null || { echo "missing $need: apt-get install libgloo-dev openmpi-bin libopenmpi-dev g++"; exit 2; }
done
[ -x "$BUILD/tools/loomrun" ] || { echo "build Loom first (BUILD=$BUILD)"; exit 2; }
g++ -O2 -std=c++17 -o "$out/gloo_bench" "$here/peers/gloo_bench.cc" -lgloo -lpthread || exit 2
mpicc.openmpi -O2 -o "$out/mpi_bench" "$here/peers/mpi_bench.c" || exit 2
cc -O2 -I"$top/include" -o "$out/loom_bench" "$here/loom_bench.c" -L"$BUILD/.libs" -lloom \
    -Wl,-rpath,"$(cd "$BUILD" && pwd)/.libs" || exit 2

run() {  # run NAME CMD...
    local name=$1; shift
    timeout 600 "$@" > "$out/$name.txt" 2> "$out/$name.err"
    local rc=$?
    printf '%-28s rc=%s\n' "$name" "$rc"
}
export OMPI_MCA_rmaps_base_oversubscribe=1
for rep in $(seq 1 "$REPS"); do
    for N in $NS; do
        LOOM_SHM=0 run "loom_n${N}_r${rep}" "$BUILD/tools/loomrun" -np "$N" "$out/loom_bench" -s "$SIZES" -t "$T" -m 5
        for a in ring ring_chunked hd bcube new_ring new_bcube; do
            run "gloo-${a}_n${N}_r${rep}" "$out/gloo_bench" -n "$N" -a "$a" -s "$SIZES" -t "$T" -m 5
        done
        run "ompi-tcp_n${N}_r${rep}" mpirun.openmpi --oversubscribe --allow-run-as-root -n "$N" \
            --mca btl tcp,self "$out/mpi_bench" -s "$SIZES" -t "$T" -m 5 -l btl=tcp,self
    done
done
python3 "$here/compare.py" "$out"
