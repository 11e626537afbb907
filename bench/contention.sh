#!/bin/bash
# contention.sh - allreduce (float32 sum) on a quiet and on a busy machine, in
# one run, interleaved (rep -> busy -> N -> peer) so that drift and the other
# users of the machine hit every peer alike:
#   loom-tcp   Loom over TCP (LOOM_SHM=0)           } bench/loom_bench.c: the anchors'
#   loom-shm   Loom through shared memory            } MPI harness calling loom_allreduce
#   base-tcp, base-shm  the same with a second Loom build (BASE=dir, e.g. main's)
#   gloo       Debian's Gloo (TCP on 127.0.0.1; bench/peers/gloo_bench.cc), its ring
#              allreduce or the one -a names (new_ring: its best at 16-64 MiB when busy)
#   ompi-tcp   Open MPI with --mca btl tcp,self (bench/peers/mpi_bench.c)
# "busy" runs B processes of `yes > /dev/null` alongside (what a training node
# looks like: data loaders, Python threads, other jobs); they are started
# before and killed after each busy block, never left behind.
# Prints one table: per N and size, each peer's median time over the
# repetitions, quiet and busy, and the ratios that matter (Loom / Gloo when
# busy, Loom / base quiet and busy); then how loaded the machine was.
#
# usage: bench/contention.sh [-n "2 4"] [-B 2] [-r REPS] [-t SECONDS] [-s 8,4096,32768]
#                            [-p "loom-tcp loom-shm gloo ompi-tcp"] [-a GLOO_ALGO]
#   BUILD=dir  a built Loom tree (default: the source tree)
#   BASE=dir   a second one (e.g. main's): base-tcp/base-shm beside loom-tcp/loom-shm
#   OUT=dir    where the raw results go (default bench/results-contention)
# needs: apt-get install libgloo-dev openmpi-bin libopenmpi-dev g++
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
BUILD=${BUILD:-$top}
BASE=${BASE:-}
NS="2 4"
BUSY=2
REPS=3
T=0.3
SIZES="8,4096,32768"
PEERS="loom-tcp loom-shm gloo ompi-tcp"
GLOO_ALGO=ring
while getopts "n:B:r:t:s:p:a:" opt; do
    case $opt in
    n) NS=$OPTARG ;;
    B) BUSY=$OPTARG ;;
    r) REPS=$OPTARG ;;
    t) T=$OPTARG ;;
    s) SIZES=$OPTARG ;;
    p) PEERS=$OPTARG ;;
    a) GLOO_ALGO=$OPTARG ;;
    *) sed -n '2,23p' "$0"; exit 2 ;;
    esac
done
# The base build runs beside each Loom peer asked for (no base-shm in a TCP-only run).
[ -n "$BASE" ] && for t in tcp shm; do
    case " $PEERS " in *" loom-$t "*) PEERS="$PEERS base-$t" ;; esac
done
out=${OUT:-$here/results-contention}
mkdir -p "$out"
rm -f "$out"/*_n*_b*_r*.txt "$out"/*.err "$out"/load.txt

[ -x "$BUILD/tools/loomrun" ] || { echo "build Loom first (BUILD=$BUILD)"; exit 2; }
cc -O2 -I"$top/include" -o "$out/loom_bench" "$here/loom_bench.c" -L"$BUILD/.libs" -lloom \
    -Wl,-rpath,"$(cd "$BUILD" && pwd)/.libs" || exit 2
if [ -n "$BASE" ]; then
    [ -x "$BASE/tools/loomrun" ] || { echo "BASE=$BASE is not a built Loom tree"; exit 2; }
    cc -O2 -I"$BASE/include" -o "$out/base_bench" "$here/loom_bench.c" -L"$BASE/.libs" -lloom \
        -Wl,-rpath,"$(cd "$BASE" && pwd)/.libs" || exit 2
fi
case " $PEERS " in *" gloo "*)
    g++ -O2 -std=c++17 -o "$out/gloo_bench" "$here/peers/gloo_bench.cc" -lgloo -lpthread 2>/dev/null ||
        { echo "no Gloo (apt-get install libgloo-dev): leaving it out"; PEERS=${PEERS/gloo/}; } ;;
esac
case " $PEERS " in *" ompi-tcp "*)
    { command -v mpirun.openmpi >/dev/null &&
      mpicc.openmpi -O2 -o "$out/mpi_bench" "$here/peers/mpi_bench.c"; } ||
        { echo "no Open MPI (apt-get install openmpi-bin libopenmpi-dev): leaving it out"; PEERS=${PEERS/ompi-tcp/}; } ;;
esac

busy_pids=()
stop_busy() {
    for p in "${busy_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    busy_pids=()
}
trap 'stop_busy' EXIT
trap 'stop_busy; exit 130' INT TERM

run() {  # run NAME CMD...
    local name=$1; shift
    timeout 300 "$@" > "$out/$name.txt" 2> "$out/$name.err"
    local rc=$?
    printf '%-30s rc=%s  load %s\n' "$name" "$rc" "$(cut -d' ' -f1,4 /proc/loadavg)"
}

export OMPI_MCA_rmaps_base_oversubscribe=1
for rep in $(seq 1 "$REPS"); do
    for b in 0 "$BUSY"; do
        [ "$b" = 0 ] || for i in $(seq 1 "$b"); do yes > /dev/null & busy_pids+=($!); done
        echo "rep $rep, $b busy: $(cat /proc/loadavg)" >> "$out/load.txt"
        for N in $NS; do
            for p in $PEERS; do
                tag="${p}_n${N}_b${b}_r${rep}"
                case $p in
                loom-tcp) LOOM_SHM=0 run "$tag" "$BUILD/tools/loomrun" -np "$N" "$out/loom_bench" -s "$SIZES" -t "$T" -m 5 ;;
                loom-shm) LOOM_SHM=1 run "$tag" "$BUILD/tools/loomrun" -np "$N" "$out/loom_bench" -s "$SIZES" -t "$T" -m 5 ;;
                base-tcp) LOOM_SHM=0 run "$tag" "$BASE/tools/loomrun" -np "$N" "$out/base_bench" -s "$SIZES" -t "$T" -m 5 ;;
                base-shm) LOOM_SHM=1 run "$tag" "$BASE/tools/loomrun" -np "$N" "$out/base_bench" -s "$SIZES" -t "$T" -m 5 ;;
                gloo) run "$tag" "$out/gloo_bench" -n "$N" -a "$GLOO_ALGO" -s "$SIZES" -t "$T" -m 5 ;;
                ompi-tcp) run "$tag" mpirun.openmpi --oversubscribe --allow-run-as-root -n "$N" \
                              --mca btl tcp,self "$out/mpi_bench" -s "$SIZES" -t "$T" -m 5 -l btl=tcp,self ;;
                esac
            done
        done
        stop_busy
    done
done
python3 "$here/contention.py" "$out" "$BUSY"
