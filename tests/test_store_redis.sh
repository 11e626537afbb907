#!/bin/sh
# Jobs whose ranks meet in a redis server (LOOM_STORE=redis://host:port/prefix):
# 4 ranks started by hand with LOOM_RANK/LOOM_SIZE run the collective matrix
# (tests/mp_collectives --launched); two jobs share one server at once, kept
# apart by their prefixes; a store where nothing listens fails in time with a
# message naming it. Skipped (exit 77) without redis-server or without the
# redis:// store in this build.
set -u
top_builddir=${top_builddir:-.}
prog=$(cd "$top_builddir" && pwd)/tests/mp_collectives
info="$top_builddir/tools/loom-info"
[ -x "$prog" ] || { echo "missing $prog"; exit 1; }
if ! command -v redis-server > /dev/null 2>&1; then
    echo "SKIP: redis-server not installed (apt-get install redis-server)"
    exit 77
fi
if ! "$info" | grep -q "stores:.*redis"; then
    echo "SKIP: this build has no redis:// store (install libhiredis-dev and re-run configure)"
    exit 77
fi
tmp=$(mktemp -d)
redis_pid=
cleanup() {
    [ -n "$redis_pid" ] && kill -9 "$redis_pid" 2>/dev/null
    kill $(jobs -p) 2>/dev/null
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
export LOOM_TIMEOUT=${LOOM_TIMEOUT:-60}
passed=0
failed=0
result() {
    if [ "$1" = 0 ]; then echo "PASS $2"; passed=$((passed + 1)); else echo "FAIL $2"; failed=$((failed + 1)); fi
}
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
        echo $((20000 + $$ % 20000))
}
# PING over a plain socket: redis-cli is in another package.
redis_up() {
    python3 - "$1" <<'EOF' 2>/dev/null
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1)
s.sendall(b"PING\r\n")
sys.exit(0 if s.recv(64).startswith(b"+PONG") else 1)
EOF
}

port=$(free_port)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no > "$tmp/redis.log" 2>&1 &
redis_pid=$!
i=0
until redis_up "$port"; do
    i=$((i + 1))
    if [ $i -ge 150 ] || ! kill -0 "$redis_pid" 2>/dev/null; then
        echo "redis-server did not come up on 127.0.0.1:$port"
        cat "$tmp/redis.log"
        echo "0 passed, 1 failed"
        exit 1
    fi
    sleep 0.1
done

# Start 4 ranks of job $1 with LOOM_STORE=$2 and wait for them: 0 when every
# rank exits 0 and rank 0 reports the matrix done.
run_job() {
    name=$1 store=$2
    pids=""
    for r in 0 1 2 3; do
        LOOM_RANK=$r LOOM_SIZE=4 LOOM_STORE=$store "$prog" --launched > "$tmp/$name.$r" 2>&1 &
        pids="$pids $!"
    done
    rc=0
    for p in $pids; do wait "$p" || rc=1; done
    grep -q "collective matrix OK on 4 ranks" "$tmp/$name.0" || rc=1
    if [ $rc != 0 ]; then
        for r in 0 1 2 3; do echo "--- rank $r of $name"; tail -n 20 "$tmp/$name.$r"; done
    fi
    return $rc
}

run_job one "redis://127.0.0.1:$port/job$$"
result $? "4 ranks, LOOM_RANK/LOOM_SIZE/LOOM_STORE=redis://127.0.0.1:$port/job$$, collective matrix"

# Two jobs at once on one server, with the same job id: only the prefixes
# keep their keys apart.
( run_job a "redis://127.0.0.1:$port/jobA$$" ) &
pa=$!
( run_job b "redis://127.0.0.1:$port/jobB$$" ) &
pb=$!
rc=0
wait $pa || rc=1
wait $pb || rc=1
result $rc "two 4-rank jobs sharing the server, kept apart by their prefixes"

# Nothing listens: every rank fails within LOOM_TIMEOUT and names the store.
dead=$(free_port)
start=$(date +%s)
LOOM_TIMEOUT=2 LOOM_RANK=1 LOOM_SIZE=2 LOOM_STORE=redis://127.0.0.1:$dead/x "$prog" --launched > "$tmp/dead" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
ok=1
[ $rc != 0 ] && [ $took -lt 30 ] && grep -q "127.0.0.1:$dead" "$tmp/dead" && ok=0
[ $ok = 0 ] || cat "$tmp/dead"
result $ok "no redis at the store's port: an error naming it within LOOM_TIMEOUT (exit $rc after ${took} s)"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
