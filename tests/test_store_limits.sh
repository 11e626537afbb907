#!/bin/sh
# test_store_limits.sh - what a stranger who reaches a tcp:// store server can
# take from it is bounded. loom-store listens on loopback unless --host says
# otherwise; 200 idle connections to a store limited to 128 descriptors leave
# a job able to start and finish; a slowloris hello is dropped within the
# hello deadline; SETs beyond LOOM_STORE_MAX_BYTES are refused and the
# server's memory stays near the quota. Also: a world-readable
# LOOM_AUTH_KEY_FILE draws a warning.
# Automake TESTS protocol: 0 pass, 1 fail, 77 skip.

top_builddir=${top_builddir:-.}
STORE="$top_builddir/tools/loom-store"
PROG="$top_builddir/examples/allreduce"
skip() { echo "test_store_limits: skipped: $*"; exit 77; }
command -v python3 >/dev/null 2>&1 || skip "no python3"
[ -x "$STORE" ] && [ -x "$PROG" ] || { echo "test_store_limits: not built" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_store_limits.XXXXXX") || exit 1
spid=""
cleanup() {
    [ -n "$spid" ] && kill "$spid" 2>/dev/null && wait "$spid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# start_store [VAR=VALUE...] -- [OPTIONS]: loom-store on a free port, with a
# 128-descriptor limit; sets $spid and $port.
start_store() {
    rm -f "$tmp/store.out"
    env "$@" sh -c 'ulimit -n 128 && exec "$0" --port 0' "$STORE" >"$tmp/store.out" 2>&1 &
    spid=$!
    port=""
    for _ in $(seq 100); do
        port=$(sed -n 's/^loom-store listening on tcp:\/\/.*:\([0-9][0-9]*\)$/\1/p' "$tmp/store.out" 2>/dev/null)
        [ -n "$port" ] && break
        sleep 0.1
    done
    [ -n "$port" ] || { echo "loom-store did not start:" >&2; cat "$tmp/store.out" >&2; exit 1; }
}
stop_store() {
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    spid=""
}

# ---- loopback by default ----------------------------------------------------
start_store LOOM_STORE_HELLO_TIMEOUT=5
other=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -v '^127\.' | grep '\.' | head -n 1)
if grep -q "listening on tcp://127.0.0.1:$port\$" "$tmp/store.out"; then
    if [ -z "$other" ] || ! python3 -c "
import socket, sys
s = socket.socket(); s.settimeout(3)
try:
    s.connect(('$other', $port))
except OSError:
    sys.exit(1)
"; then
        pass "loom-store listens on 127.0.0.1 only unless --host says otherwise"
    else
        fail "loom-store answered on $other"
    fi
else
    fail "loom-store's default address: $(cat "$tmp/store.out")"
fi

# ---- 200 idle connections, 128 descriptors, a job still runs ----------------
cat >"$tmp/idle.py" <<'EOF'
import socket, sys, time
port, n, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
socks = []
for _ in range(n):
    s = socket.socket()
    s.settimeout(10)
    s.connect(("127.0.0.1", port))   # the backlog takes them all; nothing more is sent
    socks.append(s)
open(ready, "w").close()
time.sleep(120)
EOF
python3 "$tmp/idle.py" "$port" 200 "$tmp/idle.ready" &
ipid=$!
for _ in $(seq 200); do [ -e "$tmp/idle.ready" ] && break; sleep 0.1; done
start=$(date +%s)
jpids=""
for r in 0 1 2 3; do
    LOOM_RANK=$r LOOM_SIZE=4 LOOM_TIMEOUT=60 LOOM_STORE="tcp://127.0.0.1:$port" \
        timeout 90 "$PROG" >"$tmp/job.$r" 2>&1 &
    jpids="$jpids $!"
done
wait_job() {
    ok=0
    for r in 0 1 2 3; do grep -qs 'allreduce OK' "$tmp/job.$r" && ok=$((ok + 1)); done
}
for _ in $(seq 900); do
    wait_job
    [ $ok -eq 4 ] && break
    sleep 0.1
done
took=$(($(date +%s) - start))
kill $ipid 2>/dev/null
wait $ipid $jpids
if [ -e "$tmp/idle.ready" ] && [ $ok -eq 4 ]; then
    pass "200 idle connections to a store with 128 descriptors: a 4-rank job ran (${took} s)"
else
    fail "job beside 200 idle connections: $ok of 4 ranks finished"; cat "$tmp"/job.* >&2
fi

# ---- slowloris --------------------------------------------------------------
cat >"$tmp/slow.py" <<'EOF'
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
hello = b"LOOMSTOR\0\0\0\1\0\0\0\0"
t0 = time.monotonic()
try:
    for b in hello * 10:
        s.send(bytes([b]))
        time.sleep(0.5)
        s.settimeout(0.01)
        try:
            if s.recv(1) == b"":
                break
        except socket.timeout:
            pass
except OSError:
    pass
print("%.1f" % (time.monotonic() - t0))
EOF
held=$(timeout 60 python3 "$tmp/slow.py" "$port")
if [ -n "$held" ] && python3 -c "import sys; sys.exit(0 if $held <= 8 else 1)"; then
    pass "a slowloris hello is dropped within the 5 s hello deadline (${held} s)"
else
    fail "slowloris held its connection ${held:-?} s"
fi
stop_store

# ---- byte quota -------------------------------------------------------------
start_store LOOM_STORE_MAX_BYTES=67108864
cat >"$tmp/quota.py" <<'EOF'
import socket, struct, sys
port = int(sys.argv[1])
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"LOOMSTOR" + struct.pack(">II", 1, 0))
def recv_n(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise SystemExit("closed")
        b += c
    return b
assert recv_n(16)[:8] == b"LOOMSTOR"
val = b"x" * (16 << 20)
ok = full = 0
for i in range(8):
    key = b"big%d" % i
    s.sendall(struct.pack(">IIIIQ", 1, len(key), len(val), 0, 0) + key + val)
    rc, vlen, arg = struct.unpack(">IIQ", recv_n(16))
    if rc == 0:
        ok += 1
    elif rc == 5:
        full += 1
print(ok, full)
EOF
res=$(timeout 120 python3 "$tmp/quota.py" "$port")
rss=$(awk '/^VmRSS/ { print int($2 / 1024) }' /proc/$spid/status)
set -- $res
if [ "${1:-0}" -ge 2 ] && [ "${2:-0}" -ge 1 ] && [ $(( ${1:-0} + ${2:-0} )) -eq 8 ] && [ "$rss" -lt 110 ]; then
    pass "LOOM_STORE_MAX_BYTES=64 MiB: $1 SETs of 16 MiB taken, $2 refused, server RSS ${rss} MiB"
else
    fail "quota: '$res' (taken, refused), server RSS ${rss} MiB"
fi
stop_store

# ---- a key file others can read --------------------------------------------
printf 'k3y\n' >"$tmp/key"
chmod 644 "$tmp/key"
LOOM_RANK=0 LOOM_SIZE=1 LOOM_AUTH_KEY_FILE="$tmp/key" timeout 30 "$PROG" >"$tmp/out" 2>"$tmp/err"
rc1=$?
chmod 600 "$tmp/key"
LOOM_RANK=0 LOOM_SIZE=1 LOOM_AUTH_KEY_FILE="$tmp/key" timeout 30 "$PROG" >"$tmp/out2" 2>"$tmp/err2"
rc2=$?
if [ $rc1 -eq 0 ] && grep -q 'LOOM_AUTH_KEY_FILE=.*other users.*chmod 600' "$tmp/err" &&
   [ $rc2 -eq 0 ] && ! grep -q 'LOOM_AUTH_KEY_FILE' "$tmp/err2"; then
    pass "a key file readable by others draws a warning; a 0600 one none"
else
    fail "key file warning"; cat "$tmp/err" "$tmp/err2" >&2
fi

[ $failures -eq 0 ] || { echo "test_store_limits: $failures check(s) failed" >&2; exit 1; }
exit 0
