#!/bin/sh
# tests/rxe/test_rxe.sh - Loom over a real kernel verbs stack: libibverbs, its
# rxe provider, ib_uverbs and rdma_rxe (soft-RoCE over UDP on a virtio NIC),
# in QEMU VMs booted from this machine's kernel (tests/rxe/vm.sh). What the
# libibverbs test double cannot show: pinned pages under a registration, real
# wire retries and timeouts, GID routing, a slow link.
#
# The short form (the default; CI): one VM, perftest's ib_write_lat as a
# control, the quick collective matrix on 2 ranks over ibverbs (LOOM_SHM=0) for
# int32 and float64, and tests/mp_remap (buffers freed and remapped between
# calls) where built. --full (make check-rxe): in one VM the quick matrix for
# four dtypes on 2 and 3 ranks, 2 emulated nodes x 2 ranks (shm inside, verbs across),
# tests/mp_failures and mp_remap; across two VMs (a socket netdev pair over
# host loopback, the store served by rank 0 on the first VM) perftest's
# ib_write_lat/ib_write_bw and the matrix on 1+1, 2+1 and 2+2 ranks (shm
# inside a VM). Default Loom settings throughout, but for the transport forced
# to ibverbs and LOOM_TIMEOUT=120.
#
# Exit 77 with a message where qemu, the kernel, busybox or the rxe provider is
# missing (vm.sh); LOOM_RXE_ACCEL=tcg|kvm picks the accelerator; LOOM_RXE_OUT=DIR
# keeps every VM's logs there (else they go with a temporary directory).
# Prints PASS/FAIL per step (a step across two VMs passes when it passes on
# both), the times, and "N passed, N failed".
set -u
mode=quick
[ "${1:-}" = --full ] && mode=full
srcdir=$(cd "${top_srcdir:-$(dirname "$0")/../..}" && pwd)
builddir=$(cd "${top_builddir:-.}" && pwd)
vm=$srcdir/tests/rxe/vm.sh
for p in tests/mp_collectives tests/mp_failures tools/loom-info; do
    [ -x "$builddir/$p" ] || { echo "test_rxe: $builddir/$p is not built (make check builds it)"; exit 1; }
done
if [ -n "${LOOM_RXE_OUT:-}" ]; then
    out=$LOOM_RXE_OUT
    mkdir -p "$out" || exit 1
    tmp=""
else
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_rxe.XXXXXX") || exit 1
    out=$tmp
fi
trap '[ -n "$tmp" ] && rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM HUP
t_all=$(date +%s)
passed=0
failed=0
q() { [ $mode = quick ]; }

# The free/remap program is tests/mp_remap.c's; where it can be one rank of a
# job a launcher started (--launched), the two-VM form runs it too.
remap=""
if [ -x "$builddir/tests/mp_remap" ]; then
    remap=tests/mp_remap
elif [ -f "$srcdir/tests/mp_remap.c" ]; then
    echo "test_rxe: tests/mp_remap.c is there but not built"
    exit 1
else
    echo "test_rxe: no tests/mp_remap in this tree: the free/remap steps are left out"
fi
remap_launched=""
[ -n "$remap" ] && grep -q -- '--launched' "$srcdir/tests/mp_remap.c" && remap_launched=1

# run_vms NAME NVMS LIMIT CMDS: boot, run, tally (a step counts once; it passes
# when no VM failed it and one passed it).
run_vms() {
    name=$1 nvms=$2 limit=$3 cmds=$4
    echo "== $name: $nvms VM(s)"
    t0=$(date +%s)
    (cd "$builddir" && "$vm" --vms "$nvms" --timeout "$limit" --out "$out/$name" "$cmds")
    rc=$?
    [ $rc = 77 ] && exit 77
    i=0
    while [ $i -lt "$nvms" ]; do
        [ -f "$out/$name/vm$i/cmds.log" ] && sed "s/^/vm$i: /" "$out/$name/vm$i/cmds.log"
        i=$((i + 1))
    done
    # shellcheck disable=SC2046
    set -- $(cat "$out/$name"/vm*/cmds.log 2>/dev/null | awk '
        /^PASS / { if (!($2 in st)) st[$2] = "pass" }
        /^FAIL / { st[$2] = "fail" }
        END { p = f = 0; for (k in st) if (st[k] == "pass") p++; else f++; print p, f }')
    passed=$((passed + $1))
    failed=$((failed + $2))
    # A VM that crashed or ran out of time fails the run even where its steps passed.
    if [ $rc != 0 ] && [ "$2" = 0 ]; then
        echo "FAIL $name: the VMs ended with status $rc"
        failed=$((failed + 1))
    fi
    echo "== $name: $(( $(date +%s) - t0 )) s"
}

# One VM.
# The emulated link moves a few MB/s with milliseconds per message, so the
# matrix runs its quick counts (0 to 100003: eager slots and RDMA writes) for a
# few dtypes (LOOM_MP_DTYPES), every collective, algorithm, op and placement.
if q; then dtypes="int32 float64" sizes=2; else dtypes="int8 int32 bfloat16 float64" sizes="2 3"; fi
cat > "$out/one.sh" <<EOF
export LOOM_TIMEOUT=120 LOOM_MP_QUICK=1 LOOM_MP_DTYPES="$dtypes"
rxe_perftest perftest_write_lat ib_write_lat -n 100
rxe_step matrix_$(echo "$sizes" | tr ' ' _)ranks 1500 env LOOM_TRANSPORT=ibverbs LOOM_SHM=0 \\
    LOOM_MP_SIZES="$sizes" tests/mp_collectives
EOF
q || cat >> "$out/one.sh" <<'EOF'
rxe_perftest perftest_write_bw ib_write_bw -n 200 -s 65536
rxe_step matrix_2nodes_x2 1500 env LOOM_TRANSPORT=ibverbs LOOM_SHM=1 LOOM_MP_NODES=2 \
    LOOM_MP_SIZES=4 tests/mp_collectives
rxe_step mp_failures 900 env LOOM_TRANSPORT=ibverbs LOOM_SHM=0 tests/mp_failures
EOF
[ -n "$remap" ] && echo "rxe_step mp_remap 600 env LOOM_TRANSPORT=ibverbs LOOM_SHM=0 $remap" >> "$out/one.sh"
if q; then limit=900; else limit=3000; fi
run_vms one_vm 1 "$limit" "$out/one.sh"

# Two VMs: ranks A+B, A on the first VM, B on the second.
if ! q; then
    cat > "$out/two.sh" <<EOF
export LOOM_TIMEOUT=120 LOOM_TRANSPORT=ibverbs LOOM_MP_DTYPES="$dtypes"
EOF
    cat >> "$out/two.sh" <<'EOF'
rxe_perftest perftest_write_lat_2vm ib_write_lat -n 100
rxe_perftest perftest_write_bw_2vm ib_write_bw -n 200 -s 65536
for split in 1+1 2+1 2+2; do
    a=${split%+*} b=${split#*+}
    if [ "$RXE_VM" = 0 ]; then first=0 count=$a; else first=$a count=$b; fi
    rxe_ranks "matrix_2vm_$split" 1500 $((a + b)) $first $count tests/mp_collectives --launched
done
EOF
    if [ -n "$remap_launched" ]; then
        cat >> "$out/two.sh" <<EOF
if [ "\$RXE_VM" = 0 ]; then first=0; else first=1; fi
rxe_ranks mp_remap_2vm 600 2 \$first 1 $remap --launched
EOF
    fi
    run_vms two_vms 2 3000 "$out/two.sh"
fi

echo "test_rxe ($mode): $(( $(date +%s) - t_all )) s in all"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ] && [ "$passed" -gt 0 ]
