#!/bin/sh
# Which transport carries a job, and the one not chosen by default still works:
#  - a job on one node talks through shared memory (the collective matrix of
#    tests/mp_collectives runs that way by default);
#  - LOOM_SHM=0 sends the same matrix over loopback TCP (quick form), and the
#    failure tests (tests/mp_failures) too, with one TCP stream per peer and
#    with large messages striped over four (LOOM_SOCKETS_PER_PEER=4); and
#    LOOM_SHM_CMA=0 through the shared-memory rings only (as where the kernel
#    forbids cross-memory attach);
#  - emulated nodes mix both (tests/test_nodes.sh runs the whole matrix there);
#  - nothing of Loom's is left in /dev/shm afterwards (segments are memfds).
set -u
top_builddir=${top_builddir:-.}
prog="$top_builddir/tests/mp_collectives"
[ -x "$prog" ] || { echo "missing $prog"; exit 1; }
fail=0
own_passed=0
own_failed=0
check() {  # check OK NAME: this script's own checks (the programs count theirs)
    if [ "$1" = 0 ]; then echo "PASS $2"; own_passed=$((own_passed + 1))
    else echo "FAIL $2"; own_failed=$((own_failed + 1)); fail=1; fi
}

log=$(mktemp)
trap 'rm -f "$log"' EXIT
LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=init LOOM_MP_QUICK=1 LOOM_MP_SIZES=2 "$prog" >"$log" 2>&1
check $? "the quick matrix on 2 ranks, shared memory chosen by default"
grep -E "^FAIL|killed|corrupt" "$log" | head -20
# (the single-rank communicators split off in the test need no transport but their own.)
grep -q "transport shm" "$log" && ! grep -q "transport mux" "$log"
check $? "one node: ranks talk through shared memory"
grep -q "transport shm" "$log" || grep -m3 "transport" "$log"
LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=init LOOM_SHM=0 LOOM_MP_QUICK=1 LOOM_MP_SIZES=2 "$prog" >"$log" 2>&1
check $? "the quick matrix on 2 ranks with LOOM_SHM=0"
grep -E "^FAIL|killed|corrupt" "$log" | head -20
grep -q "transport tcp" "$log" && ! grep -q "transport shm" "$log"
check $? "LOOM_SHM=0: ranks talk over TCP"
grep -q "transport tcp" "$log" || grep -m3 "transport" "$log"

echo "# the collective matrix over loopback TCP (LOOM_SHM=0)"
LOOM_SHM=0 LOOM_MP_QUICK=1 LOOM_MP_SIZES="3 4" "$prog" || fail=1

# What users and networks do wrong, over TCP too (mp_failures runs on shared
# memory in make check): a killed rank, mismatches, a rank that gave up and
# lingers, abort, timeouts.
echo "# the failure tests over loopback TCP (LOOM_SHM=0)"
LOOM_SHM=0 "$top_builddir/tests/mp_failures" || fail=1

# Several TCP streams per peer (LOOM_SOCKETS_PER_PEER): the quick matrix and
# the failure tests again with large messages striped across 4 streams. The
# quick sizes stay under the default 1 MiB threshold, so LOOM_STRIPE_MIN_BYTES
# is lowered (to 1 byte for the failure tests: every message with a payload is
# striped, empty slices included), and LOOM_DEBUG=INFO's count of striped
# messages shows that striping really happened.
striped() {  # striped LOG: messages the ranks sent striped, all runs together
    awk '/LOOM INFO \[tcp\] rank [0-9]+ striped [0-9]+ messages it sent/ {
             for (i = 1; i < NF; i++) if ($i == "striped") n += $(i + 1) }
         END { print n + 0 }' "$1"
}
LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=tcp LOOM_SOCKETS_PER_PEER=4 LOOM_STRIPE_MIN_BYTES=4096 \
    LOOM_SHM=0 LOOM_MP_QUICK=1 LOOM_MP_SIZES="2 3" "$prog" >"$log" 2>&1
check $? "the quick matrix on 2 and 3 ranks over 4 TCP streams per peer, 4 KiB and up striped"
grep -E "^FAIL|killed|corrupt" "$log" | head -20
n=$(striped "$log")
[ "$n" -gt 1000 ]
check $? "4 streams per peer: $n messages went striped in the matrix"
LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=tcp LOOM_SOCKETS_PER_PEER=4 LOOM_STRIPE_MIN_BYTES=1 LOOM_SHM=0 \
    "$top_builddir/tests/mp_failures" >"$log" 2>&1
check $? "the failure tests over 4 TCP streams per peer, every payload striped"
grep -E "^FAIL" "$log" | head -20
n=$(striped "$log")
[ "$n" -gt 0 ]
check $? "4 streams per peer: $n messages went striped in the failure tests"
# Ranks that disagree on the count refuse each other at the handshake, naming
# the setting, within LOOM_TIMEOUT.
port=$((20000 + $$ % 20000))
for r in 0 1; do
    LOOM_RANK=$r LOOM_SIZE=2 LOOM_STORE=tcp://127.0.0.1:$port LOOM_JOB_ID="spp$$" LOOM_SHM=0 \
        LOOM_TIMEOUT=5 LOOM_SOCKETS_PER_PEER=$((r + 1)) \
        timeout 60 "$top_builddir/examples/allreduce" >"$log.$r" 2>&1 &
done
wait
grep -q "LOOM_SOCKETS_PER_PEER differs" "$log.0" && grep -q "LOOM_SOCKETS_PER_PEER differs" "$log.1"
check $? "LOOM_SOCKETS_PER_PEER 1 against 2: both ranks refuse, naming the setting"
cat "$log.0" "$log.1" | grep -v "LOOM_SOCKETS_PER_PEER differs"
rm -f "$log.0" "$log.1"

echo "# the collective matrix over shared memory without cross-memory attach (LOOM_SHM_CMA=0)"
LOOM_SHM_CMA=0 LOOM_MP_QUICK=1 LOOM_MP_SIZES="2 4" "$prog" || fail=1

# (The libibverbs test double's registries, loomfake-*, belong to the tests
# that name them, which may run alongside with make -j.)
left=$(ls /dev/shm 2>/dev/null | grep -i loom | grep -v '^loomfake-' || true)
[ -z "$left" ]
check $? "nothing of Loom's in /dev/shm${left:+ (left: $left)}"
echo "$own_passed passed, $own_failed failed"
exit $fail
