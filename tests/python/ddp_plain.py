"""A gloo DDP script as a user writes it, the backend's name its one argument:
nothing of Loom is imported, so "loom" must come from the package's
torch.distributed.backends entry point. Under torchrun (env://), or with
--init-method file://PATH --rank R --world-size N. Prints the loss of each
step and, at the end, the weights' sum (the same for every backend).

    torchrun --nproc-per-node 2 ddp_plain.py loom
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("backend")
p.add_argument("--init-method")
p.add_argument("--rank", type=int)
p.add_argument("--world-size", type=int)
p.add_argument("--steps", type=int, default=20)
args = p.parse_args()

if args.init_method:
    dist.init_process_group(args.backend, init_method=args.init_method, rank=args.rank,
                            world_size=args.world_size)
else:
    dist.init_process_group(args.backend)
rank, size = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == args.backend, dist.get_backend()

torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(100 + rank)
x = torch.randn(64, 8, generator=g)
y = x.sum(1, keepdim=True)
for step in range(args.steps):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    if rank == 0 and step in (0, args.steps - 1):
        print(f"{args.backend} step {step} loss {loss.item():.6f}", flush=True)
total = sum(float(q.detach().double().sum()) for q in model.parameters())
backend_name = model._get_ddp_logging_data().get("backend_name")
print(f"rank {rank} of {size}: {args.backend} weights {total:.9f} ddp backend_name {backend_name}",
      flush=True)
dist.destroy_process_group()
