#!/bin/sh
# Which transport carries a job, and the one not chosen by default still works:
#  - a job on one node talks through shared memory (the collective matrix of
#    tests/mp_collectives runs that way by default);
#  - LOOM_SHM=0 sends the same matrix over loopback TCP (quick form), and the
#    failure tests (tests/mp_failures) too; and
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

echo "# the collective matrix over shared memory without cross-memory attach (LOOM_SHM_CMA=0)"
LOOM_SHM_CMA=0 LOOM_MP_QUICK=1 LOOM_MP_SIZES="2 4" "$prog" || fail=1

# (The libibverbs test double's registries, loomfake-*, belong to the tests
# that name them, which may run alongside with make -j.)
left=$(ls /dev/shm 2>/dev/null | grep -i loom | grep -v '^loomfake-' || true)
[ -z "$left" ]
check $? "nothing of Loom's in /dev/shm${left:+ (left: $left)}"
echo "$own_passed passed, $own_failed failed"
exit $fail
