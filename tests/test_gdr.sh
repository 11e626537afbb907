#!/bin/sh
# GPUDirect RDMA over the doubles: GPU buffers on the ibverbs transport over
# the libibverbs double (tests/verbs-provider), device memory from the CUDA
# double (tests/cuda-double), whose dma-bufs the verbs double maps, so its
# "HCA" moves device memory while Loom's view of it stays PROT_NONE (a host
# touch of GPU memory is a SIGSEGV). mp_cuda_gdr runs the collective
# matrix: with LOOM_NET_GDR=1 on 2, 3 and 4 ranks, with no copy between host
# and device during a call and the double's counters of device bytes moved;
# with LOOM_NET_GDR=0 staged through host memory; LOOM_NET_GDR=1 where the
# GPU exports no dma-buf (and no nvidia-peermem) must fail saying why. The INFO log names the
# path. Skipped (77) without CUDA or the verbs double.
set -u
top_builddir=${top_builddir:-.}
provider="$top_builddir/tests/verbs-provider/.libs"
prog="$top_builddir/tests/mp_cuda_gdr"
[ -e "$provider/libibverbs.so.1" ] || { echo "SKIP: the libibverbs test double was not built"; exit 77; }
[ -x "$prog" ] || { echo "SKIP: no CUDA build (tests/mp_cuda_gdr not built)"; exit 77; }
tmp=$(mktemp -d)
registry="/loomfake-gdr-$$"
trap 'rm -rf "$tmp"; rm -f "/dev/shm${registry}"' EXIT
trap 'exit 1' INT TERM
passed=0
failed=0
result() {
    if [ "$1" = 0 ]; then echo "PASS $2"; passed=$((passed + 1)); else echo "FAIL $2"; failed=$((failed + 1)); fi
}
unset LOOM_IB_HCA LOOM_AUTH_KEY FAKEVERBS_FAULT FAKEVERBS_DEVICES FAKEVERBS_LINK_LAYER \
      LOOM_MP_NODES FAKEVERBS_DMABUF LOOM_CUDA_DOUBLE_DMABUF LOOM_DEBUG LOOM_DEBUG_SUBSYS
LD_LIBRARY_PATH="$provider${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
FAKEVERBS_REGISTRY=$registry
LOOM_TRANSPORT=ibverbs
LOOM_SHM=0
LOOM_CUDA_IPC=0
LOOM_TIMEOUT=${LOOM_TIMEOUT:-60}
export LD_LIBRARY_PATH FAKEVERBS_REGISTRY LOOM_TRANSPORT LOOM_SHM LOOM_CUDA_IPC LOOM_TIMEOUT

for n in 2 3 4; do
    LOOM_NET_GDR=1 LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=cuda,ibverbs FAKEVERBS_STATS=1 \
        "$prog" direct $n > "$tmp/out" 2>&1
    rc=$?
    grep -q "GPU buffers on .*: dmabuf (GPUDirect RDMA through dma-buf)" "$tmp/out" &&
        grep -q "allreduce on GPU buffers: GPU to network through GPUDirect RDMA" "$tmp/out" &&
        ! grep -q "on GPU buffers: staged" "$tmp/out" &&
        grep -q "fakeverbs: pid .*: dmabuf registrations [1-9]" "$tmp/out"
    ok=$?
    [ $rc = 0 ] && [ $ok = 0 ]
    result $? "LOOM_NET_GDR=1, $n ranks: every collective GPU to HCA, no staging copy"
    [ $rc = 0 ] && [ $ok = 0 ] || tail -40 "$tmp/out"
    grep "copies host to device" "$tmp/out" | head -1
    grep "fakeverbs: pid .*: dmabuf registrations [1-9]" "$tmp/out" | head -2
done

LOOM_NET_GDR=0 LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=cuda,ibverbs "$prog" staged 2 > "$tmp/out" 2>&1
rc=$?
grep -q "staging (LOOM_NET_GDR=0" "$tmp/out" && grep -q "on GPU buffers: staged" "$tmp/out"
ok=$?
[ $rc = 0 ] && [ $ok = 0 ]
result $? "LOOM_NET_GDR=0, 2 ranks: the matrix staged through host memory"
[ $rc = 0 ] && [ $ok = 0 ] || tail -40 "$tmp/out"

# Unset: GPU and HCA are not known to be close, so auto stages (as NCCL does).
LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=ibverbs "$prog" staged 2 > "$tmp/out" 2>&1
rc=$?
grep -q "staging (GPU and HCA are not under one PCIe switch" "$tmp/out"
ok=$?
[ $rc = 0 ] && [ $ok = 0 ]
result $? "LOOM_NET_GDR unset: staged, the INFO log says why"
[ $rc = 0 ] && [ $ok = 0 ] || tail -40 "$tmp/out"

LOOM_CUDA_DOUBLE_DMABUF=0 LOOM_NET_GDR=1 "$prog" refused 2 > "$tmp/out" 2>&1
rc=$?
result $rc "LOOM_NET_GDR=1, a GPU without dma-buf and no nvidia-peermem: the GPU call fails, saying why"
[ $rc = 0 ] || tail -20 "$tmp/out"

echo "$passed passed, $failed failed"
[ $failed = 0 ]
