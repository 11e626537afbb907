#!/bin/sh
# The ibverbs transport over the libibverbs test double (tests/verbs-provider):
# loom-info lists its devices; the collective matrix on 2-5 ranks over
# InfiniBand and RoCE ports, across ports of a two-port device and beside shm;
# the failure tests (a killed rank, a rank that leaves, LOOM_AUTH_KEY,
# mismatches, abort, timeouts); faults injected by the double (remote access
# error, QP to the error state) end in errors within LOOM_TIMEOUT; loom-perf
# p2p -t ibverbs; GPUDirect RDMA on GPU buffers of the CUDA double (CUDA builds),
# and the hierarchical allreduce, reduce_scatter, allgather, reduce and broadcast on them (CUDA IPC inside emulated nodes,
# GPUDirect RDMA between). With the system's libibverbs and no devices:
# LOOM_TRANSPORT=ibverbs fails with a clear error and auto falls back to TCP.
# What the double cannot show (DMA ordering, wire retries, GID routing,
# GPUDirect between a real GPU and HCA) needs a real fabric: see docs/ibverbs.md.
set -u
top_builddir=${top_builddir:-.}
provider="$top_builddir/tests/verbs-provider/.libs"
[ -e "$provider/libibverbs.so.1" ] || [ -e "$provider/libibverbs.so" ] || {
    echo "SKIP: the libibverbs test double was not built (no infiniband/verbs.h: apt-get install libibverbs-dev and run configure again; or --disable-shared)"
    exit 77
}
info="$top_builddir/tools/loom-info"
perf="$top_builddir/tools/loom-perf"
loomrun="$top_builddir/tools/loomrun"
mpc="$top_builddir/tests/mp_collectives"
mpf="$top_builddir/tests/mp_failures"
for p in "$info" "$perf" "$loomrun" "$mpc" "$mpf"; do
    [ -x "$p" ] || { echo "missing $p"; exit 1; }
done
tmp=$(mktemp -d)
registry="/loomfake-test-$$"
# The double's registry is a POSIX shm segment: nothing may be left behind.
trap 'rm -rf "$tmp"; rm -f "/dev/shm${registry}"' EXIT
trap 'exit 1' INT TERM
passed=0
failed=0
result() {
    if [ "$1" = 0 ]; then echo "PASS $2"; passed=$((passed + 1)); else echo "FAIL $2"; failed=$((failed + 1)); fi
}
now() { date +%s; }

unset LOOM_TRANSPORT LOOM_SHM LOOM_IB_HCA LOOM_IB_GID_INDEX LOOM_AUTH_KEY FAKEVERBS_FAULT FAKEVERBS_DEVICES \
      LOOM_NET_GDR LOOM_CUDA_IPC FAKEVERBS_DMABUF LOOM_CUDA_DOUBLE_DMABUF FAKEVERBS_STATS \
      FAKEVERBS_LINK_LAYER LOOM_MP_NODES LOOM_MP_FULL
export LOOM_TIMEOUT=${LOOM_TIMEOUT:-60}

# libibverbs is loaded at run time, never linked.
if [ -e "$top_builddir/.libs/libloom.so" ] && command -v ldd > /dev/null; then
    ! ldd "$top_builddir/.libs/libloom.so" | grep -q libibverbs
    result $? "libloom.so does not link libibverbs (it is dlopen'ed)"
fi

# ---- the system's libibverbs (or none): no devices on this machine ----------------
"$info" > "$tmp/info" 2>&1
if grep -q "no RDMA devices" "$tmp/info"; then
    LOOM_TRANSPORT=ibverbs "$loomrun" -np 2 "$perf" allreduce -b 1K -e 1K -n 1 -w 0 \
        > "$tmp/out" 2>&1
    rc=$?
    grep -q "ibverbs: \(no RDMA devices\|cannot load libibverbs\)" "$tmp/out"
    ok=$?
    [ $rc != 0 ] && [ $ok = 0 ]
    result $? "LOOM_TRANSPORT=ibverbs without RDMA devices fails, saying why"
    [ $ok = 0 ] || cat "$tmp/out"
    LOOM_TRANSPORT=auto LOOM_SHM=0 LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=init "$loomrun" -np 2 "$perf" \
        allreduce -b 1K -e 1K -n 1 -w 0 > "$tmp/out" 2>&1
    rc=$?
    [ $rc = 0 ] && grep -q "no InfiniBand/RoCE.*using TCP" "$tmp/out" && grep -q "transport tcp" "$tmp/out"
    result $? "LOOM_TRANSPORT=auto without RDMA devices falls back to TCP with an INFO line"
else
    echo "(this machine has RDMA devices: the no-device checks are left out)"
fi

# ---- the test double ---------------------------------------------------------------
LD_LIBRARY_PATH="$provider${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
FAKEVERBS_REGISTRY=$registry
export LD_LIBRARY_PATH FAKEVERBS_REGISTRY

FAKEVERBS_DEVICES=loomfake0:1,loomfake1:2 "$info" > "$tmp/info" 2>&1
grep -q "loomfake0 .*1 port" "$tmp/info" && grep -q "loomfake1 .*2 port" "$tmp/info" &&
    grep -q "port 2: ACTIVE, InfiniBand" "$tmp/info"
result $? "loom-info lists the double's devices, ports and link layers"
FAKEVERBS_LINK_LAYER=ethernet "$info" > "$tmp/info" 2>&1
grep -q "Ethernet (RoCE)" "$tmp/info" && grep -q "gid\[1\] 0000:0000:0000:0000:0000:ffff:7f00:0001" "$tmp/info"
result $? "loom-info lists RoCE GIDs"

LOOM_TRANSPORT=auto LOOM_SHM=0 LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=init "$loomrun" -np 2 "$perf" \
    allreduce -b 1K -e 1M -n 2 -w 0 > "$tmp/out" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "transport ibverbs" "$tmp/out"
result $? "LOOM_TRANSPORT=auto takes ibverbs when a port is active"

# Every pair over ibverbs, also ranks of one host.
export LOOM_TRANSPORT=ibverbs LOOM_SHM=0

t0=$(now)
LOOM_MP_SIZES="2 3 4 5" LOOM_MP_QUICK=1 "$mpc" > "$tmp/mpc" 2>&1
rc=$?
result $rc "collective matrix over ibverbs (InfiniBand port) on 2-5 ranks ($(( $(now) - t0 )) s)"
[ $rc = 0 ] || grep -v '^PASS' "$tmp/mpc" | tail -20

t0=$(now)
FAKEVERBS_LINK_LAYER=ethernet LOOM_MP_SIZES="3" LOOM_MP_QUICK=1 "$mpc" > "$tmp/mpc" 2>&1
rc=$?
result $rc "collective matrix over ibverbs on RoCE ports (GID routing) on 3 ranks ($(( $(now) - t0 )) s)"
[ $rc = 0 ] || grep -v '^PASS' "$tmp/mpc" | tail -20

# Two emulated nodes: shared memory inside each, ibverbs across (some peers are
# another transport's: the NULL addresses of transport.h).
t0=$(now)
LOOM_SHM=1 LOOM_MP_NODES=2 LOOM_MP_SIZES="4" LOOM_MP_QUICK=1 "$mpc" > "$tmp/mpc" 2>&1
rc=$?
result $rc "collective matrix on 2 nodes x 2 ranks: shm inside, ibverbs across ($(( $(now) - t0 )) s)"
[ $rc = 0 ] || grep -v '^PASS' "$tmp/mpc" | tail -20

# LOOM_IB_HCA picks the two-port device; ranks spread over its ports.
t0=$(now)
FAKEVERBS_DEVICES=loomfake0:1,loomfake1:2 LOOM_IB_HCA==loomfake1 LOOM_DEBUG=INFO \
    LOOM_DEBUG_SUBSYS=ibverbs LOOM_MP_SIZES="2" LOOM_MP_QUICK=1 "$mpc" > "$tmp/mpc" 2>&1
rc=$?
grep -q "loomfake1:1" "$tmp/mpc" && grep -q "loomfake1:2" "$tmp/mpc" && ! grep -q "loomfake0:" "$tmp/mpc"
ok=$?
[ $rc = 0 ] && [ $ok = 0 ]
result $? "LOOM_IB_HCA==loomfake1: ranks on both ports of loomfake1 ($(( $(now) - t0 )) s)"
[ $rc = 0 ] || grep -v '^PASS' "$tmp/mpc" | grep -v INFO | tail -20

LOOM_IB_HCA=nonesuch "$loomrun" -np 2 "$perf" allreduce -b 1K -e 1K -n 1 -w 0 > "$tmp/out" 2>&1
rc=$?
[ $rc != 0 ] && grep -q "no active RDMA port matches LOOM_IB_HCA=nonesuch" "$tmp/out"
result $? "LOOM_IB_HCA naming no port: a clear error"
LOOM_IB_HCA="mlx5_0:x" "$loomrun" -np 2 "$perf" allreduce -b 1K -e 1K -n 1 -w 0 > "$tmp/out" 2>&1
rc=$?
[ $rc != 0 ] && grep -q "LOOM_IB_HCA=\"mlx5_0:x\": bad port" "$tmp/out"
result $? "a malformed LOOM_IB_HCA: a clear error"


t0=$(now)
"$mpf" > "$tmp/mpf" 2>&1
rc=$?
result $rc "failure tests over ibverbs: killed rank, early exit, LOOM_AUTH_KEY, mismatch, abort, timeout ($(( $(now) - t0 )) s)"
# The ranks' lines come before the verdict they lead to.
[ $rc = 0 ] || grep -v '^PASS' "$tmp/mpf" | grep -B12 '^FAIL'

# Faults injected in rank 1 only: every rank must end with an error, within
# LOOM_TIMEOUT (20 s). The ranks ignore loomrun's SIGTERM, so each one's own
# verdict is kept in its own file.
fault() {
    spec=$1
    want=$2
    rm -f "$tmp"/err.*
    t0=$(now)
    LOOM_TIMEOUT=20 FAULT_SPEC=$spec OUTDIR=$tmp "$loomrun" -np 3 sh -c \
        'trap "" TERM
         if [ "$LOOM_RANK" = 1 ]; then FAKEVERBS_FAULT=$FAULT_SPEC; export FAKEVERBS_FAULT; fi
         exec "$0" "$@" 2> "$OUTDIR/err.$LOOM_RANK"' \
        "$perf" allreduce -b 1M -e 1M -n 50 -w 0 > "$tmp/out" 2>&1
    rc=$?
    dt=$(( $(now) - t0 ))
    ok=0
    for r in 0 1 2; do
        grep -q "allreduce failed: \(transport error\|peer lost\)" "$tmp/err.$r" 2>/dev/null || ok=1
    done
    grep -q "$want" "$tmp/err.1" || ok=1
    # The rank whose WR failed names its status and what it posted, not a flush.
    [ -z "${3:-}" ] || cat "$tmp/err.0" "$tmp/err.2" 2>/dev/null | grep -q "$3" || ok=1
    [ $rc != 0 ] && [ $dt -lt 20 ] && [ $ok = 0 ]
    result $? "FAKEVERBS_FAULT=$spec in rank 1: every rank fails with an error, none hangs ($dt s)"
    [ $ok = 0 ] || head -5 "$tmp"/err.*
}
fault rae@2 "RDMA_WRITE.* to rank [02] failed on loomfake0:1: remote access error (status 10"
# the responder's QP went to the error state too: it reports that, with its own status
fault rae@4 "remote access error (status 10" "rank [02]: .* failed on loomfake0:1: Work Request Flushed Error.*peer may report the cause"
fault qperr@300 "Work Request Flushed Error.*error state"

# Buffers freed and mapped again at the same address, or madvise'd away, between
# calls: the double models pinned pages (an HCA keeps the pages registered), so a
# registration kept across the change moves bytes nobody sees. Right by default;
# with LOOM_IB_REG_CACHE (idle pinned registrations kept) it must go wrong, which
# shows the double can tell (it reads page frames: needs CAP_SYS_ADMIN).
remap="$top_builddir/tests/mp_remap"
t0=$(now)
"$remap" > "$tmp/remap" 2>&1
rc=$?
result $rc "free/remap program (tests/mp_remap) with the default settings ($(( $(now) - t0 )) s)"
[ $rc = 0 ] || grep -v '^PASS' "$tmp/remap" | tail -20
cap=$(awk '/^CapEff/ {print $2}' /proc/self/status 2>/dev/null)
if [ -n "$cap" ] && [ $(( (0x$cap >> 21) & 1 )) = 1 ]; then
    LOOM_IB_REG_CACHE=1073741824 "$remap" > "$tmp/remap" 2>&1
    rc=$?
    [ $rc != 0 ] && grep -q "FAIL munmap+mmap: 1048576-byte" "$tmp/remap" &&
        grep -q "FAIL madvise" "$tmp/remap" && grep -q "PASS loom_comm_register_buffer" "$tmp/remap" &&
        grep -q "fakeverbs: MR .* changed since ibv_reg_mr" "$tmp/remap"
    result $? "the double catches stale registrations: LOOM_IB_REG_CACHE=1G (the old default) fails tests/mp_remap"
else
    echo "(no CAP_SYS_ADMIN: the double cannot read page frames, so it cannot model pinning: check left out)"
fi

"$loomrun" -np 2 "$perf" p2p -t ibverbs -b 8 -e 1M -f 16 -n 5 -w 1 > "$tmp/out" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "over ibverbs" "$tmp/out" && grep -q "Out of bounds values : 0 OK" "$tmp/out"
result $? "loom-perf p2p -t ibverbs"

# ---- GPUDirect RDMA (CUDA builds) ----------------------------------------------------
# GPU buffers from the CUDA double over the ibverbs transport, whose
# ibv_reg_dmabuf_mr maps the CUDA double's dma-bufs, so the double's "HCA" moves
# device memory while Loom's view of it stays PROT_NONE (a host touch is a
# SIGSEGV). tests/mp_cuda_gdr runs every collective and blocking send/recv:
# with LOOM_NET_GDR=1 on 2, 3 and 4 ranks, with no copy between host and device
# during a call (the CUDA double's counters) and the device bytes the verbs
# double moved; with LOOM_NET_GDR=0 and unset staged through host memory;
# LOOM_NET_GDR=1 on a GPU without dma-buf (and no nvidia-peermem) must fail
# saying why. The INFO log names the path. LOOM_CUDA_IPC=0: on one node CUDA
# IPC would come first.
gdr="$top_builddir/tests/mp_cuda_gdr"
if [ -x "$gdr" ]; then
    export LOOM_TRANSPORT=ibverbs LOOM_SHM=0 LOOM_CUDA_IPC=0
    for n in 2 3 4; do
        LOOM_NET_GDR=1 LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=cuda,ibverbs FAKEVERBS_STATS=1 \
            "$gdr" direct $n > "$tmp/out" 2>&1
        rc=$?
        grep -q "GPU buffers on .*: dmabuf (GPUDirect RDMA through dma-buf)" "$tmp/out" &&
            grep -q "allreduce on GPU buffers: GPU to network through GPUDirect RDMA" "$tmp/out" &&
            ! grep -q "on GPU buffers: staged" "$tmp/out" &&
            grep -q "fakeverbs: pid .*: dmabuf registrations [1-9]" "$tmp/out"
        ok=$?
        # Registered once per allocation (the buffers, the communicator's scratch
        # and accumulator as it grows, one re-made buffer), not per call: before
        # the GPU registration cache one rank made over 1200 here.
        most=$(sed -n 's/.*dmabuf registrations \([0-9]*\),.*/\1/p' "$tmp/out" | sort -n | tail -1)
        [ "${most:-0}" -le 16 ] || { echo "a rank made $most dma-buf registrations (want <= 16)"; ok=1; }
        [ $rc = 0 ] && [ $ok = 0 ]
        result $? "LOOM_NET_GDR=1, $n ranks: every collective GPU to HCA, no staging copy, GPU memory registered once per allocation"
        [ $rc = 0 ] && [ $ok = 0 ] || tail -40 "$tmp/out"
        grep "during the GPU collectives" "$tmp/out" | head -2
        grep "fakeverbs: pid .*: dmabuf registrations [1-9]" "$tmp/out" | head -2
    done

    LOOM_NET_GDR=0 LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=cuda,ibverbs "$gdr" staged 2 > "$tmp/out" 2>&1
    rc=$?
    grep -q "staging (LOOM_NET_GDR=0" "$tmp/out" && grep -q "on GPU buffers: staged" "$tmp/out"
    ok=$?
    [ $rc = 0 ] && [ $ok = 0 ]
    result $? "LOOM_NET_GDR=0, 2 ranks: the matrix staged through host memory"
    [ $rc = 0 ] && [ $ok = 0 ] || tail -40 "$tmp/out"

    # Unset: the distance between GPU and HCA is measured from sysfs, where
    # neither double has a PCI device, so auto stages (as NCCL does when it
    # cannot tell) and says so.
    LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=ibverbs "$gdr" staged 2 > "$tmp/out" 2>&1
    rc=$?
    grep -q "staging (distance unknown: staging through host memory (.* has no PCI device in sysfs" "$tmp/out"
    ok=$?
    [ $rc = 0 ] && [ $ok = 0 ]
    result $? "LOOM_NET_GDR unset: staged, the INFO log says why"
    [ $rc = 0 ] && [ $ok = 0 ] || tail -40 "$tmp/out"

    LOOM_CUDA_DOUBLE_DMABUF=0 LOOM_NET_GDR=1 "$gdr" refused 2 > "$tmp/out" 2>&1
    rc=$?
    result $rc "LOOM_NET_GDR=1, a GPU without dma-buf and no nvidia-peermem: the GPU call fails, saying why"
    [ $rc = 0 ] || tail -20 "$tmp/out"

    # Several ranks on each of several emulated nodes (LOOM_MP_NODES ranks a
    # node): allreduce, reduce_scatter, allgather, reduce and broadcast go
    # hierarchically, CUDA IPC inside each node (the
    # double's IPC handles map another process's device memory), GPUDirect
    # RDMA between; whether the host's transport inside a node is shared
    # memory or ibverbs does not matter to it. Every rank names the path, and
    # moves no byte between host and device (tests/mp_cuda_gdr hier); in the
    # lazy double a step that does not wait for the one before reads stale
    # bytes. LOOM_CUDA_IPC=0 or LOOM_NET_GDR=0: staged, as before.
    # each_coll_logged FILE PATH N: each of the five collectives logged that
    # it went PATH ("<coll> on GPU buffers: PATH") N times, once per rank.
    each_coll_logged() {
        for coll in allreduce reduce_scatter allgather reduce broadcast; do
            [ "$(grep -c " $coll on GPU buffers: $2" "$1")" = "$3" ] || return 1
        done
    }
    for spec in "2 4 1 hier" "3 6 1 hier" "2 4 0 hier" "3 6 1 hier-lazy"; do
        set -- $spec
        LOOM_MP_NODES=$1 LOOM_SHM=$3 LOOM_CUDA_IPC=1 LOOM_NET_GDR=1 LOOM_DEBUG=INFO \
            LOOM_DEBUG_SUBSYS=cuda,ibverbs FAKEVERBS_STATS=1 "$gdr" $4 $2 > "$tmp/out" 2>&1
        rc=$?
        each_coll_logged "$tmp/out" "hierarchical: CUDA IPC inside each node, GPUDirect RDMA between nodes" $2 &&
            ! grep -q "on GPU buffers: staged" "$tmp/out" &&
            grep -q "fakeverbs: pid .*: dmabuf registrations [1-9]" "$tmp/out"
        ok=$?
        [ $rc = 0 ] && [ $ok = 0 ]
        result $? "$(( $2 / $1 )) nodes x $1 ranks (shm $3), $4: allreduce, reduce_scatter, allgather, reduce and broadcast (3 roots) on GPU buffers by IPC inside nodes and GPUDirect RDMA between, no staging copy, the same bits everywhere (reduce's root: allreduce's)"
        [ $rc = 0 ] && [ $ok = 0 ] || tail -40 "$tmp/out"
        grep "during the GPU allreduces, reduce_scatters, allgathers, reduces and broadcasts" "$tmp/out" | head -1
    done
    for off in LOOM_CUDA_IPC LOOM_NET_GDR; do
        env LOOM_MP_NODES=2 LOOM_SHM=1 LOOM_CUDA_IPC=1 LOOM_NET_GDR=1 $off=0 LOOM_DEBUG=INFO \
            LOOM_DEBUG_SUBSYS=cuda "$gdr" hier-staged 4 > "$tmp/out" 2>&1
        rc=$?
        each_coll_logged "$tmp/out" "staged through host memory" 4 && ! grep -q "hierarchical: CUDA IPC" "$tmp/out"
        ok=$?
        [ $rc = 0 ] && [ $ok = 0 ]
        result $? "2 nodes x 2 ranks, $off=0: allreduce, reduce_scatter, allgather, reduce and broadcast on GPU buffers staged through host memory, right"
        [ $rc = 0 ] && [ $ok = 0 ] || tail -40 "$tmp/out"
    done
else
    echo "(no CUDA build: the GPUDirect RDMA checks are left out)"
fi

echo "$passed passed, $failed failed"
[ $failed = 0 ]
