"""FSDP2 (fully_shard) on CPU over Loom: every rank holds a shard of each
layer's weights; the layers are all-gathered for the forward and backward
passes, and the gradients reduce-scattered back to the shards.

    torchrun --nproc-per-node 2 examples/python/fsdp_train.py --backend loom

rank 0 prints the loss, which must fall, and the share of the weights it holds."""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import loom.torch.distributed  # noqa: F401 - registers the "loom" backend

p = argparse.ArgumentParser()
p.add_argument("--backend", default="loom", choices=["loom", "gloo"])
p.add_argument("--steps", type=int, default=100)
args = p.parse_args()

dist.init_process_group(args.backend)
rank, size = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (size,))

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                      nn.Linear(256, 1))
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
w_true = torch.randn(64, 1)

for step in range(args.steps):
    torch.manual_seed(1000 + step * size + rank)    # each rank its own data
    x = torch.randn(32, 64)
    y = torch.tanh(x @ w_true)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    if rank == 0 and (step % 25 == 0 or step == args.steps - 1):
        print("step %4d  loss %.4f" % (step, loss.item()), flush=True)
local = sum(p.to_local().numel() for p in model.parameters())
total = sum(p.numel() for p in model.parameters())
if rank == 0:
    print("rank 0 holds %d of %d weights" % (local, total))
dist.destroy_process_group()
