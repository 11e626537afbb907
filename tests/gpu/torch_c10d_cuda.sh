#!/bin/bash
# tests/gpu/torch_c10d_cuda.sh [BUILD_DIR] - the torch.distributed backend
# "loom" on CUDA tensors: builds loom.torch._c10d with CUDA (LOOM_TORCH_CUDA=1:
# an extension without it is a failure here) against BUILD_DIR's libloom
# (default: the tree's own build) and runs tests/python/test_c10d_cuda.py on
# 2 ranks sharing one GPU under torchrun, then tests/python/test_torch_cuda.py
# (loom.torch, Horovod's API, on CUDA tensors, with the parts that need torch's
# kernels) under loomrun, then DDP on a small CNN (tests/gpu/torch_ddp_cnn.py).
# Takes PyPI's torch in /opt/loom-torch
# (python/torch_env.sh; $LOOM_TORCH_VENV), else python3's own torch; skips (77)
# without either or without a GPU.
name=torch_c10d_cuda
top_srcdir=$(cd "$(dirname "$0")/../.." && pwd)
top_builddir=${1:-$top_srcdir}
venv=${LOOM_TORCH_VENV:-/opt/loom-torch}
# A GPU machine has torch installed for its own python3 and no network to make
# the venv: stand that interpreter (and its torchrun) in for one.
if [ ! -x "$venv/bin/python" ] && command -v python3 >/dev/null &&
        python3 -c 'import torch' >/dev/null 2>&1 && command -v torchrun >/dev/null; then
    venv=$(mktemp -d "${TMPDIR:-/tmp}/$name-venv.XXXXXX") || exit 1
    mkdir "$venv/bin" && ln -s "$(command -v python3)" "$venv/bin/python" &&
        ln -s "$(command -v torchrun)" "$venv/bin/torchrun" || exit 1
fi
export LOOM_TORCH_VENV=$venv
if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -c \
        'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    echo "$name: SKIP: no GPU for $venv's torch (torch.cuda.is_available() is false)"
    exit 77
fi
export LOOM_TORCH_CUDA=1
. "$top_srcdir/tests/torch_build.sh"
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
timeout 600 "$venv/bin/torchrun" --standalone --nproc-per-node 2 \
    "$srcdir/tests/python/test_c10d_cuda.py" > "$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
if grep -q "SKIP" "$tmp/out" && ! grep -q "passed" "$tmp/out"; then
    exit 77
fi
timeout 600 "$LOOMRUN" -np 2 "$py" "$srcdir/tests/python/test_torch_cuda.py" > "$tmp/out" 2>&1
hvd_rc=$?
cat "$tmp/out"
if [ $hvd_rc != 0 ] || grep -q "SKIP" "$tmp/out"; then
    echo "$name: loom.torch on CUDA tensors (test_torch_cuda.py) failed or skipped (exit $hvd_rc)"
    rc=1
fi
# DDP on a small CNN through "loom", "gloo" (and "nccl" where each rank has a
# GPU) in the same processes, against one process that trains on both ranks'
# batches at once: the weights must agree (tests/gpu/torch_ddp_cnn.py).
timeout 300 "$venv/bin/torchrun" --standalone --nproc-per-node 2 \
    "$srcdir/tests/gpu/torch_ddp_cnn.py" --device cuda > "$tmp/out" 2>&1
ddp_rc=$?
grep -v "^W[0-9]* .*torch/distributed/run.py" "$tmp/out"
if [ $ddp_rc != 0 ] || ! grep -q "^ddp_cnn: PASS" "$tmp/out"; then
    echo "$name: DDP on a CNN (torch_ddp_cnn.py) failed (exit $ddp_rc)"
    rc=1
fi
# Figures, not a test (a wrong result fails it): all_reduce of "loom" beside
# "gloo" (which stages CUDA tensors through host memory) and "nccl" (where each
# rank has a GPU of its own) in the same processes.
if [ $rc = 0 ]; then
    timeout 300 "$venv/bin/torchrun" --standalone --nproc-per-node 2 \
        "$srcdir/tests/gpu/torch_allreduce_perf.py" --device cuda --sizes 8,1M,64M,256M 2>&1 |
        grep -v "^W[0-9]* .*torch/distributed/run.py"
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "$name: the all_reduce comparison failed"; rc=1; }
fi
[ $rc = 0 ] && echo "$name: PASS" || echo "$name: FAIL (exit $rc)"
exit $rc
