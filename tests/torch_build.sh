# torch_build.sh - sourced by the tests on PyPI's torch (test_torch_c10d.sh,
# test_torch_suite.sh): finds /opt/loom-torch (or $LOOM_TORCH_VENV) and this
# tree's shared libloom (else exits 77, skip), builds the package against them
# into python/lib-torch with its metadata (egg_info: the torch.distributed.backends
# entry point), makes $tmp (removed on exit) and puts the package on PYTHONPATH.
# $name names the calling test in messages. A caller may set loom_libdir (a
# directory holding the libloom.so to link; default the tree's .libs) and
# torch_build_tag (a suffix of the build directories, one per such libloom).
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-$(dirname "$0")/..}
srcdir=$(cd "$top_srcdir" && pwd)
builddir=$(cd "$top_builddir" && pwd)
LOOMRUN="$builddir/tools/loomrun"
venv=${LOOM_TORCH_VENV:-/opt/loom-torch}
py="$venv/bin/python"

if [ ! -x "$py" ] || ! "$py" -c 'import torch, torch.distributed as d; assert d.is_available()' >/dev/null 2>&1; then
    echo "$name: SKIP: no PyPI torch in $venv (python/torch_env.sh installs it)"
    exit 77
fi
loom_libdir=${loom_libdir:-$builddir/.libs}
if [ ! -e "$loom_libdir/libloom.so" ]; then
    echo "$name: SKIP: no shared libloom in $loom_libdir (configured with --disable-shared)"
    exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/$name.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
# Built next to the tree, not in $tmp: compiling against torch's headers takes
# minutes, and setup.py rebuilds only what changed. The package's metadata
# (egg_info) goes beside it: its torch.distributed.backends entry point lets a
# script name "loom" without importing anything of Loom.
# torch_build_into TAG: the package built against $loom_libdir into
# python/lib-torchTAG (its objects in python/build-torchTAG), log in $tmp/build.log.
# Both setup.py runs look for libloom (egg_info too decides which extensions
# there are): the variables are exported to each.
torch_build_into() {
    (cd "$srcdir/python" && export LOOM_BUILD_DIR="$loom_libdir" LOOM_INCLUDE_DIR="$srcdir/include" &&
        "$py" setup.py -q build --build-base "$builddir/python/build-torch$1" \
        --build-lib "$builddir/python/lib-torch$1" \
        && "$py" setup.py -q egg_info --egg-base "$builddir/python/lib-torch$1") > "$tmp/build.log" 2>&1
}
lib="$builddir/python/lib-torch${torch_build_tag:-}"
if ! torch_build_into "${torch_build_tag:-}"; then
    cat "$tmp/build.log"
    echo "$name: FAIL: the extension did not build"
    echo "0 passed, 1 failed"
    exit 1
fi
export PYTHONPATH="$lib:$srcdir/tests/python"
