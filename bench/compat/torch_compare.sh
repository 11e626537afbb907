#!/bin/sh
# torch_compare.sh - loom.torch against another build of it (main's code, or
# Horovod: BENCH_MODULE=horovod.torch with its launcher's environment), in one
# run, interleaved (rep -> build) so machine drift hits both alike.
#
# usage: bench/compat/torch_compare.sh OTHER_PYTHONPATH [-np N] [-r REPS]
#   OTHER_PYTHONPATH  where the other loom package is (a setup.py build's lib
#                     folder, e.g. one built from main's python/ against main's
#                     libloom.so)
#   BUILD=dir  this tree's build (default: the source tree); BENCH_SCALE=0.2
#   shortens every case. Prints, per case, the median microseconds of each
#   build and the ratio this/other.
#   HOROVODRUN=path  the other is Horovod itself: its horovodrun starts the
#   same script with BENCH_MODULE=horovod.torch (--gloo, -H localhost:N),
#   under HOROVOD_PYTHON (default: the same interpreter); OTHER_PYTHONPATH
#   is then its PYTHONPATH ("" for none).
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
[ $# -ge 1 ] || { sed -n '2,18p' "$0"; exit 2; }
other=$1
shift
np=2
reps=3
while [ $# -gt 0 ]; do
    case $1 in
    -np) np=$2; shift 2 ;;
    -r) reps=$2; shift 2 ;;
    *) echo "torch_compare: unknown option $1" >&2; exit 2 ;;
    esac
done
name=torch_compare
top_srcdir=$top
top_builddir=${BUILD:-$top}
. "$top/tests/python_build.sh"
this=$tmp/lib
for rep in $(seq "$reps"); do
    for which in this other; do
        eval "pp=\$$which"
        if [ "$which" = other ] && [ -n "${HOROVODRUN:-}" ]; then
            PYTHONPATH=$pp BENCH_MODULE=horovod.torch "$HOROVODRUN" -np "$np" -H "localhost:$np" \
                --gloo "${HOROVOD_PYTHON:-$py}" "$here/torch_bench.py" 2>&1
        else
            PYTHONPATH=$pp "$LOOMRUN" -np "$np" "$py" "$here/torch_bench.py" 2>&1
        fi | sed -n 's/^\[0\]<stdout>: *//p' | sed "s/^/$which /" >> "$tmp/times"
    done
done
"$py" - "$tmp/times" <<'PY'
import statistics, sys
t = {}
for line in open(sys.argv[1]):
    which, case, us = line.split()
    t.setdefault(case, {}).setdefault(which, []).append(float(us))
print("%-24s %12s %12s %8s" % ("case (us)", "this", "other", "ratio"))
for case, d in t.items():
    a, b = statistics.median(d.get("this", [0])), statistics.median(d.get("other", [0]))
    print("%-24s %12.1f %12.1f %8.2f" % (case, a, b, a / b if b else 0))
PY
