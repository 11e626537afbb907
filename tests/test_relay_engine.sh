#!/bin/sh
# The code-execution attack of issue 26 on loopback (tests/test_relay.py's
# engine scenario): an interceptor on the path between two loom.torch ranks
# replaces the engine's negotiation messages with a pickle that runs a
# command, without a key and with LOOM_AUTH_MAC=headers (payloads untagged).
# Nothing a peer sends is unpickled, so no rank may run it.
name=test_relay_engine
. "${top_srcdir:-$(dirname "$0")/..}/tests/python_build.sh"
if ! "$py" -c 'import torch' 2>/dev/null; then
    echo "$name: SKIP: $py has no PyTorch (apt-get install python3-torch)"
    exit 77
fi
cc=${CC:-cc}
if ! $cc -shared -fPIC -o "$tmp/relay_shim.so" "$srcdir/tests/relay_shim.c" -ldl 2>"$tmp/cc.log"; then
    echo "$name: SKIP: cannot build the LD_PRELOAD shim"; cat "$tmp/cc.log"; exit 77
fi
exec timeout 300 "$py" "$srcdir/tests/test_relay.py" "$builddir" "$tmp/relay_shim.so" engine "$py"
