"""DistributedDataParallel on a small model with torch.distributed, over Loom
or Gloo: the only change from a Gloo script is the backend's name (and the
import that registers it).

    torchrun --nproc-per-node 4 examples/python/ddp_train.py --backend loom
    torchrun --nproc-per-node 4 examples/python/ddp_train.py --backend gloo

Each rank trains on its slice of every batch of a synthetic regression task;
rank 0 prints the loss, which must fall."""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import loom.torch.distributed  # noqa: F401 - registers the "loom" backend

p = argparse.ArgumentParser()
p.add_argument("--backend", default="loom", choices=["loom", "gloo"])
p.add_argument("--steps", type=int, default=200)
p.add_argument("--batch", type=int, default=64, help="global batch, split among the ranks")
args = p.parse_args()

dist.init_process_group(args.backend)   # torchrun's env:// rendezvous
rank, size = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)                    # same weights and data on every rank
model = DDP(nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
w_true = torch.randn(32, 1)

t0 = time.perf_counter()
for step in range(args.steps):
    x = torch.randn(args.batch, 32)
    y = x @ w_true + 0.01 * torch.randn(args.batch, 1)
    n = args.batch // size
    xs, ys = x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(xs), ys)
    loss.backward()                     # gradients averaged across ranks here
    opt.step()
    if rank == 0 and (step % 50 == 0 or step == args.steps - 1):
        print("step %4d  loss %.4f" % (step, loss.item()), flush=True)
if rank == 0:
    print("%s, %d ranks: %.2f ms/step" % (args.backend, size,
                                          1e3 * (time.perf_counter() - t0) / args.steps))
dist.destroy_process_group()
