#!/bin/sh
# The ways a user starts a job, each running examples/allreduce on 4 local ranks:
# loomrun; plain LOOM_* variables with rank 0 serving a tcp:// store; torchrun's
# variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); Open MPI's and Slurm's
# variables; a file:// store. Also: a missing rank makes the others fail in time.
set -u
top_builddir=${top_builddir:-.}
prog="$top_builddir/examples/allreduce"
loomrun="$top_builddir/tools/loomrun"
[ -x "$prog" ] || { echo "missing $prog"; exit 1; }
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
passed=0
failed=0
result() {
    if [ "$1" = 0 ]; then echo "PASS $2"; passed=$((passed + 1)); else echo "FAIL $2"; failed=$((failed + 1)); fi
}
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
        echo $((20000 + $$ % 20000))
}
# Start 4 ranks with per-rank variables set by $1 (a function of the rank).
run4() {
    setter=$1
    pids=""
    for r in 0 1 2 3; do
        ( eval "$($setter $r)"; exec "$prog" ) > "$tmp/out.$r" 2>&1 &
        pids="$pids $!"
    done
    rc=0
    for p in $pids; do wait "$p" || rc=1; done
    for r in 0 1 2 3; do grep -q "allreduce OK" "$tmp/out.$r" || { rc=1; cat "$tmp/out.$r"; }; done
    return $rc
}

out=$("$loomrun" -np 4 "$prog" 2>&1)
echo "$out" | grep -c "allreduce OK" | grep -qx 4
result $? "loomrun -np 4 examples/allreduce"

port=$(free_port)
loom_vars() { echo "export LOOM_RANK=$1 LOOM_SIZE=4 LOOM_STORE=tcp://127.0.0.1:$port LOOM_JOB_ID=plain$$"; }
run4 loom_vars
result $? "plain LOOM_RANK/LOOM_SIZE/LOOM_STORE, rank 0 serves the store"

port=$(free_port)
torch_vars() { echo "export RANK=$1 WORLD_SIZE=4 LOCAL_RANK=$1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port"; }
run4 torch_vars
result $? "torchrun-style RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT"

port=$(free_port)
ompi_vars() { echo "export OMPI_COMM_WORLD_RANK=$1 OMPI_COMM_WORLD_SIZE=4 LOOM_STORE=tcp://localhost:$port"; }
run4 ompi_vars
result $? "Open MPI variables with LOOM_STORE (host name, not address)"

port=$(free_port)
slurm_vars() { echo "export SLURM_PROCID=$1 SLURM_NTASKS=4 SLURM_LOCALID=$1 SLURM_JOB_ID=77$$ MASTER_ADDR=127.0.0.1 MASTER_PORT=$port"; }
run4 slurm_vars
result $? "Slurm variables"

file_vars() { echo "export PMI_RANK=$1 PMI_SIZE=4 LOOM_STORE=file://$tmp/store LOOM_JOB_ID=file$$"; }
run4 file_vars
result $? "PMI variables with a file:// store"

if python3 -c 'import socket; s=socket.socket(socket.AF_INET6); s.bind(("::1",0))' 2>/dev/null; then
    port=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET6); s.bind(("::1",0)); print(s.getsockname()[1])')
    v6_vars() { echo "export LOOM_RANK=$1 LOOM_SIZE=4 LOOM_STORE=tcp://[::1]:$port"; }
    run4 v6_vars
    result $? "IPv6: store and ranks on [::1]"
else
    echo "SKIP IPv6: no ::1 on this machine"
fi

port=$(free_port)
ifname_vars() { echo "export LOOM_RANK=$1 LOOM_SIZE=4 LOOM_STORE=tcp://127.0.0.1:$port LOOM_SOCKET_IFNAME=lo"; }
run4 ifname_vars
result $? "LOOM_SOCKET_IFNAME=lo"

out=$(LOOM_RANK=0 LOOM_SIZE=1 LOOM_SOCKET_IFNAME=nosuch0 "$prog" 2>&1)
echo "$out" | grep -q "LOOM_SOCKET_IFNAME=nosuch0: no such interface"
result $? "LOOM_SOCKET_IFNAME naming a missing interface: a clear error"

out=$(LOOM_RANK=0 LOOM_SIZE=1 LOOM_TIMEOUT=soon "$prog" 2>&1)
echo "$out" | grep -q 'LOOM_TIMEOUT="soon"'
result $? "a malformed LOOM_TIMEOUT: a clear error"

# LOOM_TIMELINE: one Chrome trace per rank, merged into one by loom-timeline-merge.
# Over TCP the small allreduce goes by messages; through shared memory it goes
# by the windows' slots, which send none (its span names the algorithm).
merge="${top_srcdir:-$(dirname "$0")/..}/tools/loom-timeline-merge"
check_trace() {  # check_trace WANT: WANT "messages" or "slots"
    python3 "$merge" "$tmp/trace.0.json" "$tmp/trace.1.json" 2>/dev/null | python3 -c '
import json, sys
want = sys.argv[1]
ev = json.load(sys.stdin)["traceEvents"]
ar = [e for e in ev if e["name"] == "allreduce" and e["ph"] == "X"]
assert {e["pid"] for e in ar} == {0, 1} and all(e["dur"] >= 0 and "algorithm" in e["args"] for e in ar)
p2p = [e for e in ev if e["name"] in ("send", "recv")]
if want == "messages":
    assert p2p and all("peer" in e["args"] and "bytes" in e["args"] for e in p2p)
else:
    assert all(e["args"]["algorithm"] == "slots" for e in ar) and not p2p
' "$1" 2>/dev/null
}
LOOM_SHM=0 LOOM_TIMELINE="$tmp/trace.json" "$loomrun" -np 2 "$prog" > /dev/null 2>&1
check_trace messages
result $? "LOOM_TIMELINE writes a Chrome trace per rank (collectives, their sends and receives) that loom-timeline-merge joins"
rm -f "$tmp"/trace.*.json
LOOM_SHM=1 LOOM_TIMELINE="$tmp/trace.json" "$loomrun" -np 2 "$prog" > /dev/null 2>&1
check_trace slots
result $? "LOOM_TIMELINE through shared memory: the small allreduce's span names the slots algorithm, no message"

# Only 3 of 4 ranks start: they must fail within LOOM_TIMEOUT + 5 s, naming rank 3's key.
port=$(free_port)
start=$(date +%s)
pids=""
for r in 0 1 2; do
    ( export LOOM_RANK=$r LOOM_SIZE=4 LOOM_STORE=tcp://127.0.0.1:$port LOOM_TIMEOUT=3; exec "$prog" ) > "$tmp/miss.$r" 2>&1 &
    pids="$pids $!"
done
rc=0
for p in $pids; do if wait "$p"; then rc=1; fi; done
elapsed=$(( $(date +%s) - start ))
grep -qE "rank\(s\) 3 of 4|addr/3" "$tmp/miss.1" || { rc=1; cat "$tmp"/miss.*; }
[ "$elapsed" -le 9 ] || rc=1
result $rc "a missing rank: the others fail within LOOM_TIMEOUT + 5 s ($elapsed s) naming it"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
