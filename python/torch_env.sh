#!/bin/sh
# torch_env.sh - PyPI's torch in its own virtual environment (default
# /opt/loom-torch, or $LOOM_TORCH_VENV) for Loom's torch.distributed backend
# and its tests. Does nothing when the environment already imports a torch
# with torch.distributed.
#
# The smallest install that imports and runs on CPU: PyPI's Linux torch is a
# CUDA build whose libraries (libtorch_cuda.so, libtorch_python.so) name the
# CUDA runtime, cuBLAS, cuDNN, NCCL, NVSHMEM, cuFFT, cuSPARSE(Lt), cuSOLVER,
# cuFile, CUPTI and NVRTC as load-time dependencies, so those wheels must be
# there even without a GPU; triton, cuda-bindings and NVTX are not loaded on
# import and are left out. torch is installed without dependencies, then its
# own requirement list (read from its metadata, so this follows new releases)
# less those three. setuptools (torch.utils.cpp_extension builds with it),
# ninja and numpy come too.
set -e
VENV=${LOOM_TORCH_VENV:-/opt/loom-torch}
PY="$VENV/bin/python"

# expecttest: torch's own test helpers import it (tests/test_torch_suite.sh
# runs PyTorch's distributed_test.py).
if [ -x "$PY" ] && "$PY" -c 'import torch, torch.distributed as d, setuptools; assert d.is_available()' >/dev/null 2>&1; then
    "$PY" -c 'import expecttest' >/dev/null 2>&1 || "$PY" -m pip install -q expecttest
    exit 0
fi
[ -x "$PY" ] || /usr/bin/python3 -m venv "$VENV"
"$PY" -m pip install -q --no-deps ${LOOM_TORCH_SPEC:-torch}
# The requirements torch declares for Linux, without those not needed to import.
reqs=$("$PY" - <<'PYEOF'
import re
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
out = []
for r in requires("torch") or []:
    req = Requirement(r)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name in ("triton", "cuda-bindings"):
        continue
    req.extras = {e for e in req.extras if e != "nvtx"}
    req.marker = None
    out.append(str(req))
print("\n".join(out))
PYEOF
) || reqs=""
if [ -z "$reqs" ]; then
    echo "torch_env.sh: could not read torch's requirements" >&2
    exit 1
fi
# shellcheck disable=SC2086
echo "$reqs" | tr '\n' '\0' | xargs -0 "$PY" -m pip install -q ninja numpy expecttest
"$PY" -c 'import torch, torch.distributed as d; assert d.is_available(); torch.ones(2) + 1'
