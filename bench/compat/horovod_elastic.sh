#!/bin/sh
# horovod_elastic.sh - run Horovod's own elastic integration tests
# (test/integration/test_elastic_torch.py, ...) against loom.runner, loomrun
# --elastic and loom.torch / loom.tensorflow.
#
# usage: bench/compat/horovod_elastic.sh DIR [pytest args...]
#   DIR  a Horovod checkout (or its test/ folder) holding
#        test/integration/<SUITE> and test/utils/common.py, e.g.
#        git -C <horovod> archive v0.28.1 test | tar -x -C DIR
#   BUILD=dir  a configured and built Loom tree (default: the source tree)
#   SUITE=...  the test file under test/integration (default test_elastic_torch.py)
#   PYTHON=... the interpreter (default: the first with torch, as make check)
#
# Horovod's tests drive its launcher in-process: parse_args() and
# _run_elastic(args) of horovod.runner.launch. The shim package generated in a
# temp directory maps them onto `python -m loom.runner`'s parser and a run of
# loomrun --elastic; Horovod's driver knobs the tests patch
# (DISCOVER_HOSTS_FREQUENCY_SECS, ELASTIC_TIMEOUT_SECS) become loomrun's
# --discovery-interval and --elastic-timeout, and a failed loomrun raises
# RuntimeError with the message horovodrun gives for the same end. Nothing of
# Horovod is copied into Loom.
# needs: pytest, mock, psutil (apt-get install python3-pytest python3-mock python3-psutil python3-cloudpickle)
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
[ $# -ge 1 ] || { sed -n '2,10p' "$0"; exit 2; }
dir=$(cd "$1" && pwd) || exit 2
shift
suite=${SUITE:-test_elastic_torch.py}
name=horovod_elastic
. "$here/horovod_common.sh"
horovod_find "$dir" integration "$suite"
top_srcdir=$top
top_builddir=${BUILD:-$top}
horovod_python "$suite"
. "$top/tests/python_build.sh"
for m in pytest mock psutil cloudpickle; do
    "$py" -c "import $m" 2>/dev/null ||
        { echo "horovod_elastic: $py lacks $m (apt-get install python3-$m)" >&2; exit 77; }
done

shim=$tmp/shim
horovod_shim "$shim"
mkdir -p "$shim/horovod/runner/elastic" "$shim/horovod/runner/common/util"
echo 'from loom.tensorflow import *  # noqa: F401,F403' > "$shim/horovod/tensorflow/__init__.py"
: > "$shim/horovod/runner/common/__init__.py"
: > "$shim/horovod/runner/common/util/__init__.py"
: > "$shim/horovod/runner/elastic/__init__.py"
cat > "$shim/horovod/runner/common/util/config_parser.py" <<'PY'
def set_env_from_args(env, args):
    """loom.runner turns the arguments into loomrun's flags and environment itself."""
    return env
PY
cat > "$shim/horovod/runner/elastic/constants.py" <<'PY'
# The texts horovodrun ends an elastic job with (the tests match them).
RESET_LIMIT_EXCEEDED_MESSAGE = 'Horovod was shutdown because number of resets during elastic job exceeded limit: {}'
PY
cat > "$shim/horovod/runner/elastic/driver.py" <<'PY'
# Horovod's driver knobs; the tests patch them, _run_elastic reads them.
DISCOVER_HOSTS_FREQUENCY_SECS = 1.0
ELASTIC_TIMEOUT_SECS = 600
PY
cat > "$shim/horovod/runner/gloo_run.py" <<'PY'
def _get_min_start_hosts(settings):
    return 1
PY
cat > "$shim/horovod/runner/launch.py" <<'PY'
import os
import subprocess
import sys

from loom import runner as _runner

from .elastic import constants as _constants, driver as _driver


def parse_args():
    return _runner.parser().parse_args(sys.argv[1:])


def _run_elastic(args):
    argv, env = _runner.loomrun_command(args)
    knobs = ["--discovery-interval", repr(float(_driver.DISCOVER_HOSTS_FREQUENCY_SECS)),
             "--elastic-timeout", str(_driver.ELASTIC_TIMEOUT_SECS)]
    if args.elastic_timeout is not None:
        knobs = knobs[:2]
    argv = argv[:2] + knobs + argv[2:]
    print(" ".join(argv), flush=True)
    p = subprocess.run(argv, env=dict(os.environ, **env), stderr=subprocess.PIPE,
                       universal_newlines=True)
    sys.stderr.write(p.stderr)
    if p.returncode != 0:
        if "--reset-limit" in p.stderr and "exceed" in p.stderr:
            raise RuntimeError(_constants.RESET_LIMIT_EXCEEDED_MESSAGE.format(args.reset_limit))
        raise RuntimeError("Horovod detected that one or more processes exited with non-zero "
                           "status (loomrun exited with %d)" % p.returncode)
    return None
PY
cp -r "$tdir/integration" "$tdir/utils" "$tmp/"
[ -f "$tdir/conftest.py" ] && cp "$tdir/conftest.py" "$tmp/"
# The tests start `python SCRIPT`: the interpreter chosen here, by its own path
# (a symlink elsewhere would lose a virtual environment, found next to it).
mkdir -p "$tmp/bin"
printf '#!/bin/sh\nexec "%s" "$@"\n' "$(command -v "$py")" >"$tmp/bin/python"
chmod +x "$tmp/bin/python"
export PATH="$tmp/bin:$PATH"
export PYTHONPATH="$shim:$tmp/lib:$tmp/utils"
export LOOMRUN
(cd "$tmp/integration" && timeout "${SUITE_TIMEOUT:-1800}" "$py" -m pytest -p no:cacheprovider -v -rfE \
    "$suite" "$@") 2>&1 | tee "$tmp/out"
grep -E "^=+ .*[0-9]+ (passed|failed|skipped)" "$tmp/out" | tail -1
