#!/bin/sh
# horovod_suite.sh - run Horovod's own PyTorch test suite against loom.torch.
#
# usage: bench/compat/horovod_suite.sh DIR [-np "2 3"] [pytest args...]
#   DIR  a Horovod checkout (or its test/ folder) holding
#        test/parallel/test_torch.py and test/utils/common.py, e.g.
#        git -C <horovod> archive v0.28.1 test | tar -x -C DIR
#   BUILD=dir  a configured and built Loom tree (default: the source tree)
#   PYTHON=... the interpreter (default: the first with torch, as make check)
#   SUITE=...  the test file under test/parallel (default test_torch.py)
#   SUITE_LOG=path  keep each job's whole output as path.npN
#
# Nothing of Horovod is copied into Loom: a shim package generated in a temp
# directory stands in for horovod, its horovod/torch/__init__.py being only
# `from loom.torch import *`; the suite's helpers (test/utils/common.py) import
# horovod.runner.util.threads.in_thread, which the shim provides too. The file
# runs as ONE job per size under `loomrun -np N python -m pytest` (as Horovod's
# CI runs it under horovodrun); each rank's summary line is printed.
# needs: pytest, mock, cloudpickle, packaging (apt-get install python3-pytest
# python3-mock python3-cloudpickle python3-packaging)
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
[ $# -ge 1 ] || { sed -n '2,9p' "$0"; exit 2; }
dir=$(cd "$1" && pwd) || exit 2
shift
nps="2 3"
if [ "${1:-}" = "-np" ]; then
    nps=$2
    shift 2
fi
suite=${SUITE:-test_torch.py}
if [ -f "$dir/test/parallel/$suite" ]; then
    tdir=$dir/test
elif [ -f "$dir/parallel/$suite" ]; then
    tdir=$dir
else
    echo "horovod_suite: no test/parallel/$suite under $dir" >&2
    exit 2
fi

name=horovod_suite
top_srcdir=$top
top_builddir=${BUILD:-$top}
. "$top/tests/python_build.sh"
for m in pytest mock cloudpickle packaging; do
    "$py" -c "import $m" 2>/dev/null ||
        { echo "horovod_suite: $py lacks $m (apt-get install python3-$m)" >&2; exit 77; }
done

shim=$tmp/shim
mkdir -p "$shim/horovod/torch" "$shim/horovod/runner/util"
cat > "$shim/horovod/__init__.py" <<'PY'
# Shim: the horovod package as far as Horovod's tests import it.
__version__ = "0.28.1"
PY
echo 'from loom.torch import *  # noqa: F401,F403' > "$shim/horovod/torch/__init__.py"
: > "$shim/horovod/runner/__init__.py"
: > "$shim/horovod/runner/util/__init__.py"
cat > "$shim/horovod/runner/util/threads.py" <<'PY'
import threading


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    """Start target(*args) in a daemon thread and return it."""
    t = threading.Thread(target=target, args=args, name=name, daemon=daemon)
    t.start()
    return t
PY
# Run from a copy of the suite's folder so pytest's rootdir and caches stay out of DIR.
cp -r "$tdir/parallel" "$tdir/utils" "$tmp/"
# Not tests/python: its common.py would shadow the suite's.
export PYTHONPATH="$shim:$tmp/lib"
rc=0
for np in $nps; do
    echo "== loomrun -np $np $py -m pytest $suite $*"
    (cd "$tmp/parallel" && timeout "${SUITE_TIMEOUT:-1800}" "$LOOMRUN" -np "$np" \
        "$py" -m pytest -p no:cacheprovider -q -rfE "$suite" "$@") > "$tmp/out.$np" 2>&1 || rc=1
    if grep -qE "[0-9]+ (passed|failed|skipped)" "$tmp/out.$np"; then
        # One line per test that failed on some rank, then each rank's summary.
        grep -E "^\[[0-9]+\]<stdout>: (FAILED|ERROR) " "$tmp/out.$np" |
            sed 's/^\[[0-9]*\]<stdout>: //; s/ - .*//' | sort | uniq -c
        grep -E "[0-9]+ (passed|failed|skipped)" "$tmp/out.$np"
    else
        tail -n 60 "$tmp/out.$np"
    fi
    [ -z "${SUITE_LOG:-}" ] || cp "$tmp/out.$np" "$SUITE_LOG.np$np"
done
exit $rc
