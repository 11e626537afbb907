# python_build.sh - sourced by the Python tests: finds an interpreter, builds
# the extension against this tree's libloom into a scratch directory ($tmp,
# removed on exit) and puts it on PYTHONPATH. Exits 77 (skip) where that
# cannot be done; $name names the calling test in messages.
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-$(dirname "$0")/..}
srcdir=$(cd "$top_srcdir" && pwd)
builddir=$(cd "$top_builddir" && pwd)
LOOMRUN="$builddir/tools/loomrun"

# The interpreter: the first of $PYTHON, python3 on PATH and Debian's (where
# apt's python3-numpy and python3-torch land) that has NumPy and PyTorch, else
# the first that has NumPy.
# A caller that needs other modules names them in $py_need (e.g. 'import numpy, tensorflow').
py=""
for need in ${py_need:+"$py_need"} 'import numpy, torch' 'import numpy'; do
    for cand in ${PYTHON:-} python3 /usr/bin/python3; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "$need" 2>/dev/null; then
            py=$cand
            break 2
        fi
    done
done
if [ -z "$py" ]; then
    echo "$name: SKIP: no python3 with NumPy (apt-get install python3-numpy python3-torch)"
    exit 77
fi
if [ ! -e "$builddir/.libs/libloom.so" ]; then
    echo "$name: SKIP: no shared libloom in $builddir/.libs (configured with --disable-shared)"
    exit 77
fi
if ! "$py" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
    echo "$name: SKIP: $py has no Python.h (apt-get install python3-dev)"
    exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/$name.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
build_package() {  # build_package INTERP DIR: the package for INTERP into $tmp/DIR (its log: $tmp/DIR.log)
    if ! (cd "$srcdir/python" && LOOM_BUILD_DIR="$builddir/.libs" LOOM_INCLUDE_DIR="$srcdir/include" \
            "$1" setup.py -q build --build-base "$tmp/build-$2" --build-lib "$tmp/$2") > "$tmp/$2.log" 2>&1; then
        cat "$tmp/$2.log"
        echo "$name: FAIL: the extension did not build for $1"
        echo "0 passed, 1 failed"
        exit 1
    fi
}
build_package "$py" lib
export PYTHONPATH="$tmp/lib:$srcdir/tests/python"

# tf_package INTERP: the TensorFlow interpreter's package first on PYTHONPATH
# from now on. setup.py compiles the op that runs collectives in a graph
# (loom.tensorflow._async_op) only where it imports TensorFlow, against that
# TensorFlow: built again for INTERP where it is not $py.
tf_package() {
    [ "$1" = "$py" ] && return
    build_package "$1" lib-tf
    export PYTHONPATH="$tmp/lib-tf:$PYTHONPATH"
}
export PYTHONDONTWRITEBYTECODE=1
