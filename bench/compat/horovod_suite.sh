#!/bin/sh
# horovod_suite.sh - run Horovod's own test files (PyTorch, TensorFlow, Keras)
# against loom.torch, loom.tensorflow and loom.keras.
#
# usage: bench/compat/horovod_suite.sh DIR [-np "2 3"] [pytest args...]
#   DIR  a Horovod checkout (or its test/ folder) holding
#        test/parallel/<SUITE> and test/utils/common.py, e.g.
#        git -C <horovod> archive v0.28.1 test | tar -x -C DIR
#   BUILD=dir  a configured and built Loom tree (default: the source tree)
#   SUITE=...  the test file under test/parallel (default test_torch.py), e.g.
#              test_tensorflow.py, test_tensorflow2_keras.py
#   PYTHON=... the interpreter (default: the first with torch, as make check;
#              for a TensorFlow or Keras suite $LOOM_TF_PYTHON, else
#              /opt/loom-tf/bin/python, as test_python.sh)
#   SUITE_PYTHONPATH=dir  added to PYTHONPATH: where pytest, mock, cloudpickle,
#              parameterized live when the interpreter lacks them, e.g.
#              /opt/loom-tf/bin/python -m pip install --target DIR pytest mock cloudpickle parameterized
#   SUITE_LOG=path  keep each job's whole output as path.npN
#   SUITE_TIMEOUT=s the limit of each job (default 1800)
#
# Nothing of Horovod is copied into Loom: a shim package generated in a temp
# directory stands in for horovod, its horovod/torch/__init__.py being only
# `from loom.torch import *` (horovod.tensorflow: loom.tensorflow, horovod.keras
# and horovod.tensorflow.keras: loom.keras); the suite's helpers
# (test/utils/common.py) import horovod.runner.util.threads.in_thread, which
# the shim provides too, with the two small helpers the TensorFlow files import
# (horovod.tensorflow.util._executing_eagerly,
# horovod.common.util.is_version_greater_equal_than). The file runs as ONE job
# per size under `loomrun -np N python -m pytest` (as Horovod's CI runs it
# under horovodrun); each rank's summary line is printed.
# needs: pytest, mock, cloudpickle, packaging, parameterized (apt-get install
# python3-pytest python3-mock python3-cloudpickle python3-packaging
# python3-parameterized, or SUITE_PYTHONPATH above)
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
name=horovod_suite
. "$here/horovod_common.sh"
horovod_find "$dir" parallel "$suite"
top_srcdir=$top
top_builddir=${BUILD:-$top}
horovod_python "$suite"
. "$top/tests/python_build.sh"
export PYTHONPATH="$PYTHONPATH${SUITE_PYTHONPATH:+:$SUITE_PYTHONPATH}"
for m in pytest mock cloudpickle packaging parameterized; do
    "$py" -c "import $m" 2>/dev/null ||
        { echo "horovod_suite: $py lacks $m (apt-get install python3-$m, or SUITE_PYTHONPATH)" >&2; exit 77; }
done

shim=$tmp/shim
horovod_shim "$shim"
mkdir -p "$shim/horovod/common"
cat > "$shim/horovod/tensorflow/__init__.py" <<'PY'
from loom.tensorflow import *  # noqa: F401,F403
from loom.tensorflow import _executing_eagerly  # noqa: F401
from loom.tensorflow import elastic  # noqa: F401
from . import util  # noqa: F401
PY
echo 'from loom.tensorflow import _executing_eagerly  # noqa: F401' > "$shim/horovod/tensorflow/util.py"
cat > "$shim/horovod/common/util.py" <<'PY'
from packaging import version


def is_version_greater_equal_than(ver, target):
    return version.parse(ver) >= version.parse(target)
PY
: > "$shim/horovod/common/__init__.py"
# Run from a copy of the suite's folder so pytest's rootdir and caches stay out of DIR.
cp -r "$tdir/parallel" "$tdir/utils" "$tmp/"
# Not tests/python: its common.py would shadow the suite's.
export PYTHONPATH="$shim:$tmp/lib${SUITE_PYTHONPATH:+:$SUITE_PYTHONPATH}"
rc=0
for np in $nps; do
    echo "== loomrun -np $np $py -m pytest $suite $*"
    (cd "$tmp/parallel" && timeout "${SUITE_TIMEOUT:-1800}" "$LOOMRUN" -np "$np" \
        "$py" -m pytest -p no:cacheprovider -v -rfE "$suite" "$@") > "$tmp/out.$np" 2>&1 || rc=1
    if grep -qE "[0-9]+ (passed|failed|skipped)" "$tmp/out.$np"; then
        # One verdict per test over every rank (run_all_in_graph_and_eager_modes
        # runs a test's graph and eager halves as subtests: either failing
        # fails the test): failed where it failed or erred on some rank,
        # skipped where every rank skipped it, else passed. Then the failed
        # tests, and each rank's own summary line.
        "$py" - "$tmp/out.$np" "$np" <<'PY'
import re
import sys

verdicts = {}
pat = re.compile(r"^\[(\d+)\]<stdout>: (\S+\.py::\S+)(?: \[[^\]]*\])?\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS|SUBPASSED|SUBFAILED|SUBSKIPPED)")
sub = re.compile(r"^\[(\d+)\]<stdout>: (SUBFAILED|FAILED|ERROR)(?:\[[^\]]*\])? (\S+\.py::\S+)")
for line in open(sys.argv[1], errors="replace"):
    m = pat.match(line)
    if m:
        verdicts.setdefault(m.group(2), {}).setdefault(int(m.group(1)), set()).add(m.group(3))
        continue
    m = sub.match(line)
    if m:
        verdicts.setdefault(m.group(3), {}).setdefault(int(m.group(1)), set()).add(m.group(2))
ranks = int(sys.argv[2])
count = {"passed": 0, "failed": 0, "skipped": 0}
failed = []
for test, by_rank in sorted(verdicts.items()):
    seen = set().union(*by_rank.values())
    if seen & {"FAILED", "SUBFAILED", "ERROR"} or len(by_rank) < ranks:
        count["failed"] += 1
        failed.append(test)
    elif all(v <= {"SKIPPED", "SUBSKIPPED"} for v in by_rank.values()):
        count["skipped"] += 1
    else:
        count["passed"] += 1
        # pytest -v reports a test whose halves were skipped as PASSED: the
        # GPU tests without a GPU; their names say so.
        count["gpu"] = count.get("gpu", 0) + ("gpu" in test.rsplit("::", 1)[-1])
for t in failed:
    print("  failed: %s" % t)
print("per test, %d ranks: %d passed (%d of them *gpu* tests, skipped inside without a GPU), "
      "%d failed, %d skipped" % (ranks, count["passed"], count.get("gpu", 0), count["failed"], count["skipped"]))
PY
        grep -E "^\[[0-9]+\]<stdout>: =+ .*[0-9]+ (passed|failed|skipped)" "$tmp/out.$np"
    else
        tail -n 60 "$tmp/out.$np"
    fi
    [ -z "${SUITE_LOG:-}" ] || cp "$tmp/out.$np" "$SUITE_LOG.np$np"
done
exit $rc
