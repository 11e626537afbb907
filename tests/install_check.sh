#!/bin/sh
# What a user does after `make install`: build a program against the installed
# header and library through pkg-config, and run it under loomrun, under plain
# LOOM_* variables and under torchrun-style variables.
# usage: tests/install_check.sh [srcdir]   (configures a fresh build of srcdir)
set -eu
srcdir=$(cd "${1:-$(dirname "$0")/..}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
# A source tree configured in place cannot host another build: take a clean
# copy of the distributed files from it.
if [ -f "$srcdir/Makefile" ]; then
    make -s -C "$srcdir" distdir distdir="$work/src" > /dev/null
    srcdir="$work/src"
fi
mkdir "$work/build"
cd "$work/build"
"$srcdir/configure" -q --prefix="$prefix"
make -s -j2 >/dev/null
make -s install >/dev/null

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# shellcheck disable=SC2046
cc -o "$work/allreduce" "$srcdir/examples/allreduce.c" $(pkg-config --cflags --libs loom)
export LD_LIBRARY_PATH="$prefix/lib"
passed=0
failed=0
check() {
    if [ "$(grep -c "allreduce OK" "$work/out")" = 4 ]; then
        echo "PASS $1"; passed=$((passed + 1))
    else
        echo "FAIL $1"; cat "$work/out"; failed=$((failed + 1))
    fi
}
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

"$prefix/bin/loomrun" -np 4 "$work/allreduce" > "$work/out" 2>&1 || true
check "installed loomrun -np 4, program built with pkg-config"

port=$(free_port)
: > "$work/out"
for r in 0 1 2 3; do
    LOOM_RANK=$r LOOM_SIZE=4 LOOM_STORE=tcp://127.0.0.1:$port "$work/allreduce" >> "$work/out" 2>&1 &
done
wait
check "LOOM_RANK/LOOM_SIZE/LOOM_STORE"

port=$(free_port)
: > "$work/out"
for r in 0 1 2 3; do
    RANK=$r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$work/allreduce" >> "$work/out" 2>&1 &
done
wait
check "RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT"

# pip install ./python against the installed libloom, found by pkg-config alone
# (no LOOM_BUILD_DIR), for Debian's python3; the package imports and its
# metadata names the torch.distributed backend entry point.
py3=python3
[ -x /usr/bin/python3 ] && py3=/usr/bin/python3
if $py3 -m pip --version >/dev/null 2>&1; then
    if (cd "$srcdir" && env -u LOOM_BUILD_DIR $py3 -m pip install -q --no-cache-dir \
            --prefix "$work/py" ./python) > "$work/pip.log" 2>&1 &&
        site=$(find "$work/py" -type d -name loom -path '*-packages/loom' | head -n 1) &&
        (cd "$work" && env -u LD_LIBRARY_PATH PYTHONPATH="$(dirname "$site")" $py3 -c '
import loom._loom
from importlib.metadata import entry_points
assert [e.value for e in entry_points(group="torch.distributed.backends") if e.name == "loom"] \
    == ["loom.torch.distributed:register"]'); then
        echo "PASS pip install ./python (pkg-config), import loom._loom, the entry point"
        passed=$((passed + 1))
    else
        echo "FAIL pip install ./python"; cat "$work/pip.log"; failed=$((failed + 1))
    fi
fi

for f in include/loom.h lib/libloom.so lib/libloom.a lib/pkgconfig/loom.pc bin/loomrun bin/loom-store bin/loom-info; do
    if [ -e "$prefix/$f" ]; then passed=$((passed + 1)); else echo "FAIL installed $f"; failed=$((failed + 1)); fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
