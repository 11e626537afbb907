#!/bin/bash
# compare_shm.sh - Loom against Intel MPI over shared memory on this machine,
# in one run, interleaved (rep -> N -> peer) so drift hits both alike, with
# one harness for both (bench/peers/mpi_bench.c; bench/loom_bench.c is the
# same harness calling loom_allreduce), float32 sum, time = the slowest
# rank's mean. Prints per N and size the median of each peer and Intel MPI's
# time over Loom's (above 1: Loom faster).
#
# usage: bench/compare_shm.sh [-n "2 4"] [-r REPS] [-t SECONDS] [-s SIZES] [-B BUSY]
#   -B BUSY    run BUSY processes of `yes > /dev/null` alongside the whole run
#   BUILD=dir  a configured and built Loom tree (default: the source tree)
#   IMPI=dir   Intel MPI (default /opt/impi), e.g. from PyPI:
#              python3 -m venv /opt/impi && /opt/impi/bin/pip install impi-rt impi-devel
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
BUILD=${BUILD:-$top}
IMPI=${IMPI:-/opt/impi}
NS="2 4"
REPS=3
T=0.3
BUSY=0
SIZES="8,64,1024,4096,65536,1048576,16777216,67108864"
while getopts "n:r:t:s:B:" opt; do
    case $opt in
    n) NS=$OPTARG ;;
    r) REPS=$OPTARG ;;
    t) T=$OPTARG ;;
    s) SIZES=$OPTARG ;;
    B) BUSY=$OPTARG ;;
    *) sed -n '2,13p' "$0"; exit 2 ;;
    esac
done
[ -f "$IMPI/include/mpi.h" ] && [ -x "$IMPI/bin/mpiexec" ] || {
    echo "no Intel MPI at $IMPI: python3 -m venv $IMPI && $IMPI/bin/pip install impi-rt impi-devel"
    exit 2
}
[ -x "$BUILD/tools/loomrun" ] || { echo "build Loom first (BUILD=$BUILD)"; exit 2; }
out=$(mktemp -d /tmp/compare_shm.XXXXXX)
cc -O2 -I"$IMPI/include" -o "$out/impi_bench" "$here/peers/mpi_bench.c" -L"$IMPI/lib" -lmpi \
    -Wl,-rpath,"$IMPI/lib" || exit 2
cc -O2 -I"$top/include" -o "$out/loom_bench" "$here/loom_bench.c" -L"$BUILD/.libs" -lloom \
    -Wl,-rpath,"$(cd "$BUILD" && pwd)/.libs" || exit 2

busy_pids=
for _ in $(seq 1 "$BUSY"); do
    yes > /dev/null &
    busy_pids="$busy_pids $!"
done
trap '[ -n "$busy_pids" ] && kill $busy_pids 2>/dev/null' EXIT

# Each harness prints "size count time ..." rows; keep "peer N size time".
for rep in $(seq 1 "$REPS"); do
    for N in $NS; do
        LOOM_SHM=1 timeout 600 "$BUILD/tools/loomrun" -np "$N" "$out/loom_bench" -s "$SIZES" \
            -t "$T" -m 5 2>/dev/null | sed 's/^\[[0-9]*\]<stdout>: //' | grep -v '^#' |
            awk -v n="$N" '{print "loom", n, $1, $3}' >> "$out/rows"
        I_MPI_FABRICS=shm timeout 600 "$IMPI/bin/mpiexec" -n "$N" "$out/impi_bench" \
            -s "$SIZES" -t "$T" -m 5 2>/dev/null | grep -v '^#' |
            awk -v n="$N" '{print "impi", n, $1, $3}' >> "$out/rows"
    done
done
echo "# load: $(cut -d' ' -f1-3 /proc/loadavg), $BUSY busy processes, $REPS repetitions, median us"
python3 - "$out/rows" <<'EOF'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    peer, n, size, t = line.split()
    rows.setdefault((int(n), int(size)), {}).setdefault(peer, []).append(float(t))
print(f"{'ranks':>5} {'bytes':>10} {'Loom':>10} {'Intel MPI':>10} {'IMPI/Loom':>10}")
for (n, size), peers in sorted(rows.items()):
    loom = statistics.median(peers.get('loom', [float('nan')]))
    impi = statistics.median(peers.get('impi', [float('nan')]))
    print(f"{n:>5} {size:>10} {loom:>10.2f} {impi:>10.2f} {impi / loom:>10.2f}")
EOF
rm -rf "$out"
