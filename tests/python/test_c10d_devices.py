"""The devices the backend "loom" is registered for, without a GPU: "cpu" and
"cuda" where the extension was built with CUDA, which it must be where torch is
a CUDA build, a CUDA toolkit is found and the libloom it loaded has the
stream-ordered calls (unless LOOM_TORCH_CUDA=0 left CUDA out); "cpu" alone
otherwise. A group made with init_process_group(device_id=cpu:0) holds the loom
backend for each, and CPU operations and object collectives run as before.
GPU tensors themselves are tested by test_c10d_cuda.py (tests/gpu/run.sh)."""
import ctypes
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.utils import cpp_extension

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Tally  # noqa: E402

import loom.torch.distributed as ld  # noqa: E402
from loom.torch import _c10d  # noqa: E402


def loaded_libloom_has_cuda():
    """Whether the libloom this process loaded (the extension's) exports
    loom_comm_set_device."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libloom.so" in line}
    return any(hasattr(ctypes.CDLL(p), "loom_comm_set_device") for p in paths)


rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
T = Tally(rank)

want_cuda = (os.environ.get("LOOM_TORCH_CUDA", "auto") != "0" and torch.backends.cuda.is_built()
             and cpp_extension.CUDA_HOME is not None and loaded_libloom_has_cuda())
T.check(_c10d.cuda_built == want_cuda,
        "the extension's cuda_built is %s; torch CUDA build %s, toolkit %s, libloom with CUDA %s"
        % (_c10d.cuda_built, torch.backends.cuda.is_built(), cpp_extension.CUDA_HOME,
           loaded_libloom_has_cuda()))
# Registered for cuda wherever torch has CUDA: an extension without CUDA then
# refuses CUDA tensors itself, saying why (tests/torch_cuda_double.sh).
want = ["cpu", "cuda"] if torch.backends.cuda.is_built() else ["cpu"]
T.check(ld.devices() == want, "devices() %s, not %s" % (ld.devices(), want))
T.check(dist.Backend.backend_capability.get("loom") == want,
        "torch's backend_capability['loom'] %s, not %s"
        % (dist.Backend.backend_capability.get("loom"), want))
print("rank %d: loom registered for %s" % (rank, want), flush=True)

dist.init_process_group("loom", device_id=torch.device("cpu", 0),
                        timeout=datetime.timedelta(seconds=60))
pg = dist.distributed_c10d._get_default_group()
types = sorted(d.type for d in pg._device_types)
T.check(types == sorted(want), "the group's device types %s, not %s" % (types, want))
T.check(dist.get_backend() == "loom", "get_backend() %r" % dist.get_backend())
for d in want:
    b = pg._get_backend(torch.device(d))
    T.check(b is pg._get_backend(torch.device("cpu")),
            "one backend (one communicator) for every device, not another for %s" % d)
t = torch.full((5,), float(rank + 1))
dist.all_reduce(t)
T.check(bool((t == size * (size + 1) / 2).all()), "all_reduce on cpu: %s" % t.tolist())
objs = [None] * size
dist.all_gather_object(objs, {"rank": rank})
T.check(objs == [{"rank": r} for r in range(size)], "all_gather_object: %s" % objs)
dist.barrier()
if torch.cuda.device_count() == 0:
    # torch itself refuses a CUDA device_id without a GPU (before any backend
    # is made); test_c10d_cuda.py binds one where there is a GPU.
    print("rank %d: SKIP: init_process_group(device_id=cuda:0) needs a GPU" % rank, flush=True)
dist.destroy_process_group()
T.finish()
