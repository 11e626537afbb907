"""torch.distributed: the "loom" backend against "gloo", in the same processes
(the default group is loom, a second group over every rank is gloo), with the
two interleaved so a busy machine slows both alike.

    torchrun --nproc-per-node 2 examples/python/bench_c10d.py

1. dist.all_reduce of float32 tensors from 8 B to 64 MiB (x4 steps, then 64 MiB): median
   time per call of each backend and loom's speed-up.
2. A DDP step on ResNet-50-sized gradients (its 161 parameter tensors, 25.6 M
   float32; the loss's backward pass is one pass over memory, so the step is
   mostly DDP's bucketed allreduce): median step time of each backend.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import loom.torch.distributed  # noqa: F401 - registers "loom"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fusion import resnet50_shapes  # noqa: E402


def timed(fn, iters):
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per size")
    ap.add_argument("--ddp-steps", type=int, default=6)
    ap.add_argument("--skip-ddp", action="store_true")
    args = ap.parse_args()

    dist.init_process_group("loom")
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = {"loom": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    torch.set_num_threads(1)
    if rank == 0:
        print("all_reduce float32, %d ranks (median us per call over %d interleaved rounds)"
              % (size, args.rounds))
        print("%10s %12s %12s %8s" % ("bytes", "gloo_us", "loom_us", "speedup"))
    sizes = []
    nbytes = 8
    while nbytes < args.max_bytes:
        sizes.append(nbytes)
        nbytes *= 4
    sizes.append(args.max_bytes)
    for nbytes in sizes:
        t = torch.ones(nbytes // 4)
        iters = max(2, min(200, (8 << 20) // max(nbytes, 1) // 4 + 2))
        res = {"loom": [], "gloo": []}
        for name, g in groups.items():    # warm-up
            dist.all_reduce(t, group=g)
        for _ in range(args.rounds):
            for name, g in groups.items():
                dist.barrier(group=groups["loom"])
                res[name].append(timed(lambda: dist.all_reduce(t, group=g), iters))
        med = {k: statistics.median(v) * 1e6 for k, v in res.items()}
        if rank == 0:
            print("%10d %12.1f %12.1f %7.2fx" % (nbytes, med["gloo"], med["loom"],
                                                 med["gloo"] / med["loom"]), flush=True)

    if args.skip_ddp:
        dist.destroy_process_group()
        return
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Grads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.ps = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.randn(s) * 0.01) for s in resnet50_shapes()])

        def forward(self):
            return sum((p * p).sum() for p in self.ps) * 0.5

    models = {name: DDP(Grads(), process_group=g) for name, g in groups.items()}
    opts = {name: torch.optim.SGD(m.parameters(), lr=0.01) for name, m in models.items()}
    nparams = sum(p.numel() for p in models["loom"].parameters())
    times = {"loom": [], "gloo": []}
    for i in range(args.ddp_steps + 1):
        for name in ("gloo", "loom"):
            dist.barrier(group=groups["loom"])
            t0 = time.perf_counter()
            opts[name].zero_grad()
            models[name]().backward()
            opts[name].step()
            if i > 0:     # the first step builds DDP's buckets
                times[name].append(time.perf_counter() - t0)
    if rank == 0:
        g, lm = (statistics.median(times[k]) * 1e3 for k in ("gloo", "loom"))
        print("DDP step, %.1f M float32 parameters in %d tensors, %d ranks: gloo %.1f ms, "
              "loom %.1f ms (%.2fx)" % (nparams / 1e6, len(resnet50_shapes()), size, g, lm, g / lm))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
