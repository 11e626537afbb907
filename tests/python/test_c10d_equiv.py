"""Training with the "loom" backend ends where one process on the whole batch
ends, and where the same run over a "gloo" group (in the same processes) ends:
DDP (plain, no_sync gradient accumulation, find_unused_parameters, the fp16
compression hook, the PowerSGD hook), FSDP2's fully_shard on CPU and
ZeroRedundancyOptimizer. Each rank trains on its slice of every global batch;
the reference trains on the whole batch."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Tally  # noqa: E402
from c10d_common import init  # noqa: E402

rank, size = init()
T = Tally(rank)
loom_pg = dist.group.WORLD
gloo_pg = dist.new_group(backend="gloo")
torch.manual_seed(0)

STEPS, BATCH, LR = 4, 12, 0.05   # BATCH divides by 1, 2, 3, 4 and 6 ranks
DATA = [(torch.randn(BATCH, 8), torch.randn(BATCH, 4)) for _ in range(STEPS)]


class Net(nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)
        self.unused = nn.Linear(3, 3) if unused else None

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def new_net(unused=False):
    torch.manual_seed(1)
    return Net(unused)


def mine(x):
    n = x.shape[0] // size
    return x[rank * n:(rank + 1) * n]


def reference(micro=1, unused=False):
    net = new_net(unused)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for x, y in DATA:
        opt.zero_grad()
        for xm, ym in zip(x.chunk(micro), y.chunk(micro)):
            nn.functional.mse_loss(net(xm), ym).backward()
        opt.step()
    return net


def ddp_run(pg, micro=1, unused=False, hook=None):
    net = new_net(unused)
    model = DDP(net, process_group=pg, find_unused_parameters=unused)
    if hook is not None:
        model.register_comm_hook(*hook(pg))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in DATA:
        opt.zero_grad()
        xs, ys = mine(x).chunk(micro), mine(y).chunk(micro)
        # accumulate locally with no_sync, synchronise on the last micro-batch
        for i, (xm, ym) in enumerate(zip(xs, ys)):
            if i < micro - 1:
                with model.no_sync():
                    nn.functional.mse_loss(model(xm), ym).backward()
            else:
                nn.functional.mse_loss(model(xm), ym).backward()
        opt.step()
    return net


def close(a, b, atol):
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    worst = max((pa[k].detach() - pb[k].detach()).abs().max().item() for k in pa)
    return worst <= atol, worst


def compare(name, net_loom, net_gloo, ref, atol_ref, atol_gloo=1e-6):
    ok, worst = close(net_loom, ref, atol_ref)
    T.check(ok, "%s: loom vs one process: max diff %g" % (name, worst))
    ok, worst = close(net_loom, net_gloo, atol_gloo)
    T.check(ok, "%s: loom vs gloo: max diff %g" % (name, worst))
    moved, _ = close(net_loom, new_net(net_loom.unused is not None), 1e-4)
    T.check(not moved, "%s: the weights moved" % name)


def fp16_hook(pg):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return pg, default_hooks.fp16_compress_hook


def powersgd_hook(pg):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
    # A rank as large as the matrices: the compression is exact up to rounding,
    # so the result can be held against the uncompressed reference.
    state = ps.PowerSGDState(process_group=pg, matrix_approximation_rank=16,
                             start_powerSGD_iter=2, min_compression_rate=0,
                             use_error_feedback=True, warm_start=True)
    return state, ps.powerSGD_hook


def test_ddp():
    compare("ddp", ddp_run(loom_pg), ddp_run(gloo_pg), reference(), 1e-5)


def test_ddp_no_sync():
    compare("ddp no_sync", ddp_run(loom_pg, micro=2), ddp_run(gloo_pg, micro=2),
            reference(micro=2), 1e-5)


def test_ddp_unused():
    a, b = ddp_run(loom_pg, unused=True), ddp_run(gloo_pg, unused=True)
    compare("ddp find_unused_parameters", a, b, reference(unused=True), 1e-5)


def test_ddp_fp16():
    # fp16 rounding of the gradients: the tolerance of half precision
    compare("ddp fp16 hook", ddp_run(loom_pg, hook=fp16_hook), ddp_run(gloo_pg, hook=fp16_hook),
            reference(), 2e-3, 1e-3)


def test_ddp_powersgd():
    compare("ddp PowerSGD", ddp_run(loom_pg, hook=powersgd_hook),
            ddp_run(gloo_pg, hook=powersgd_hook), reference(), 1e-4, 1e-4)


def test_zero():
    from torch.distributed.optim import ZeroRedundancyOptimizer

    def run(pg):
        net = new_net()
        model = DDP(net, process_group=pg)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                      process_group=pg, lr=LR)
        for x, y in DATA:
            opt.zero_grad()
            nn.functional.mse_loss(model(mine(x)), mine(y)).backward()
            opt.step()
        return net
    compare("ZeroRedundancyOptimizer", run(loom_pg), run(gloo_pg), reference(), 1e-5)


def test_fsdp2():
    try:
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:
        print("rank %d: no fully_shard in this torch: FSDP2 not tested" % rank)
        return

    def run(pg):
        net = new_net()
        mesh = DeviceMesh.from_group(pg, "cpu")
        fully_shard(net.a, mesh=mesh)
        fully_shard(net.b, mesh=mesh)
        fully_shard(net, mesh=mesh)
        opt = torch.optim.SGD(net.parameters(), lr=LR)
        for x, y in DATA:
            opt.zero_grad()
            nn.functional.mse_loss(net(mine(x)), mine(y)).backward()
            opt.step()
        # the full weights, gathered from the shards
        full = new_net()
        with torch.no_grad():
            for (k, p), q in zip(net.named_parameters(), full.parameters()):
                q.copy_(p.full_tensor())
        return full
    compare("FSDP2 fully_shard", run(loom_pg), run(gloo_pg), reference(), 1e-5)


tests = [test_ddp, test_ddp_no_sync, test_ddp_unused, test_ddp_fp16, test_ddp_powersgd,
         test_zero, test_fsdp2]
only = os.environ.get("C10D_EQUIV_ONLY")
for fn in tests:
    if only and fn.__name__ not in only.split(","):
        continue
    T.run(fn)
    dist.barrier()
dist.destroy_process_group()
T.finish()
