"""torch.distributed's "loom" where loom.torch._c10d was built without CUDA
(tests/torch_cuda_double.sh runs it on 2 ranks over the CUDA double, torch's
CUDA tensors being real to torch there): the backend is registered for cuda
all the same, so a CUDA tensor reaches Loom and is refused with an error that
says the extension has no CUDA, not torch's "No backend type associated with
device type cuda"; after the refusals CPU tensors, barrier and the object
collectives still work."""
import datetime
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Tally  # noqa: E402

import loom.torch.distributed as ld  # noqa: E402

rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
T = Tally(rank)
T.check(not ld._c10d.cuda_built, "the extension was built with CUDA after all")
T.check("cuda" in ld.devices(), "not registered for cuda: %s" % ld.devices())
dist.init_process_group("loom", timeout=datetime.timedelta(seconds=60))
x = torch.ones(4).cuda()
for what, fn in (("all_reduce", lambda: dist.all_reduce(x)),
                 ("broadcast", lambda: dist.broadcast(x, 0)),
                 ("all_gather", lambda: dist.all_gather([x.clone() for _ in range(size)], x)),
                 ("reduce_scatter_tensor",
                  lambda: dist.reduce_scatter_tensor(x[:4 // size].clone(), x)),
                 ("send", lambda: dist.send(x, (rank + 1) % size))):
    T.raises("%s of a CUDA tensor" % what, fn, "loom: ", "built without CUDA", "cuda:0")
t = torch.full((3,), float(rank + 1))
dist.all_reduce(t)
T.check(t.tolist() == [size * (size + 1) / 2] * 3, "all_reduce on cpu after the refusals: %s"
        % t.tolist())
dist.barrier()
objs = [None] * size
dist.all_gather_object(objs, rank)
T.check(objs == list(range(size)), "all_gather_object: %s" % objs)
dist.destroy_process_group()
T.finish()
