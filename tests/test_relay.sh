#!/bin/sh
# The relay attack of issue 13 on loopback (tests/test_relay.py): with
# LOOM_AUTH_KEY a process that rewrites the store or relays a connection makes
# both ranks fail (AUTH or TRANSPORT) and no call returns a wrong element.
set -u
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
cc=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! $cc -shared -fPIC -o "$tmp/relay_shim.so" "$top_srcdir/tests/relay_shim.c" -ldl 2>"$tmp/cc.log"; then
    echo "SKIP: cannot build the LD_PRELOAD shim"; cat "$tmp/cc.log"; exit 77
fi
exec timeout 600 python3 "$top_srcdir/tests/test_relay.py" "$top_builddir" "$tmp/relay_shim.so"
