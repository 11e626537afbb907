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

log=$(mktemp)
trap 'rm -f "$log"' EXIT
LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=init LOOM_MP_QUICK=1 LOOM_MP_SIZES=2 "$prog" >"$log" 2>&1 || fail=1
# (the single-rank communicators split off in the test need no transport but their own.)
if grep -q "transport shm" "$log" && ! grep -q "transport mux" "$log"; then
    echo "PASS one node: ranks talk through shared memory"
else
    echo "FAIL one node: shared memory not chosen"; grep -m3 "transport" "$log"; fail=1
fi
LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=init LOOM_SHM=0 LOOM_MP_QUICK=1 LOOM_MP_SIZES=2 "$prog" >"$log" 2>&1 || fail=1
if grep -q "transport tcp" "$log" && ! grep -q "transport shm" "$log"; then
    echo "PASS LOOM_SHM=0: ranks talk over TCP"
else
    echo "FAIL LOOM_SHM=0: TCP not chosen"; grep -m3 "transport" "$log"; fail=1
fi

echo "# the collective matrix over loopback TCP (LOOM_SHM=0)"
LOOM_SHM=0 LOOM_MP_QUICK=1 LOOM_MP_SIZES="3 4" "$prog" || fail=1

# What users and networks do wrong, over TCP too (mp_failures runs on shared
# memory in make check): a killed rank, mismatches, a rank that gave up and
# lingers, abort, timeouts.
echo "# the failure tests over loopback TCP (LOOM_SHM=0)"
LOOM_SHM=0 "$top_builddir/tests/mp_failures" || fail=1

echo "# the collective matrix over shared memory without cross-memory attach (LOOM_SHM_CMA=0)"
LOOM_SHM_CMA=0 LOOM_MP_QUICK=1 LOOM_MP_SIZES="2 4" "$prog" || fail=1

left=$(ls /dev/shm 2>/dev/null | grep -i loom || true)
if [ -n "$left" ]; then
    echo "FAIL leftovers in /dev/shm: $left"; fail=1
else
    echo "PASS nothing of Loom's in /dev/shm"
fi
exit $fail
