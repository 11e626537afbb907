"""DDP on a small CNN, 20 steps, through "loom" and its peers in the same
processes, against one process that trains on every rank's batch at once.

Run under torchrun (2 ranks or more). Every backend gets a group of its own
(`dist.new_group(backend=...)`) and a DDP model of its own, started from the
same weights and fed the same batches; at the end rank 0 holds each backend's
weights and those of the one process (the whole batch, as DDP's averaged
gradient equals the mean loss's over the concatenated batch), and says how far
they are apart. On 2 ranks loom must equal gloo bit for bit (both add the same
two gradients) and the one process within float rounding; NCCL is compared where
every rank has a GPU of its own (it refuses two ranks on one GPU,
NVIDIA/nccl#418). Exit status 1 when a comparison fails.

    torchrun --standalone --nproc-per-node 2 torch_ddp_cnn.py --device cuda
    torchrun --standalone --nproc-per-node 2 torch_ddp_cnn.py --device cpu   # no GPU
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

STEPS = 20
BATCH = 8     # per rank


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def batch(step, rank, device):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    return x.to(device), y.to(device)


def fresh_model(device):
    torch.manual_seed(7)
    return SmallCNN().to(device)


def train_ddp(group, device, rank):
    model = nn.parallel.DistributedDataParallel(
        fresh_model(device), device_ids=[device.index] if device.type == "cuda" else None,
        process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        x, y = batch(step, rank, device)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().cpu().clone() for p in model.module.parameters()]


def train_alone(device, world):
    model = fresh_model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        parts = [batch(step, r, device) for r in range(world)]
        x = torch.cat([p[0] for p in parts])
        y = torch.cat([p[1] for p in parts])
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().cpu().clone() for p in model.parameters()]


def max_diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if args.device == "cuda":
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    import loom.torch  # noqa: F401  registers "loom" (an entry point does too)
    dist.init_process_group("gloo")
    backends = ["loom", "gloo"]
    why_no_nccl = None
    if args.device != "cuda":
        why_no_nccl = "CPU tensors"
    elif torch.cuda.device_count() < int(os.environ.get("LOCAL_WORLD_SIZE", world)):
        why_no_nccl = ("%d GPU(s) for %s ranks on this node: NCCL refuses two ranks on one GPU "
                       "(NVIDIA/nccl#418)" % (torch.cuda.device_count(),
                                              os.environ.get("LOCAL_WORLD_SIZE", world)))
    elif not dist.is_nccl_available():
        why_no_nccl = "this torch has no NCCL"
    else:
        backends.append("nccl")
    weights = {}
    for name in backends:
        group = dist.new_group(backend=name)
        weights[name] = train_ddp(group, device, rank)
        dist.barrier()
    # Every rank of a DDP run ends with the same weights.
    for name, w in weights.items():
        mine = torch.cat([p.flatten() for p in w])
        theirs = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(theirs, mine)
        if any(not torch.equal(t, mine) for t in theirs):
            print("ddp_cnn: FAIL: %s: the ranks' weights differ" % name, flush=True)
            sys.exit(1)
    ok = True
    if rank == 0:
        alone = train_alone(device, world)
        d_gloo = max_diff(weights["loom"], weights["gloo"])
        d_alone = max_diff(weights["loom"], alone)
        d_gloo_alone = max_diff(weights["gloo"], alone)
        print("ddp_cnn: %d steps, %d ranks, %s: loom vs gloo max |diff| %.3g, loom vs one "
              "process %.3g (gloo vs one process %.3g)" % (STEPS, world, device, d_gloo, d_alone,
                                                           d_gloo_alone), flush=True)
        # Two gradients add alike in any order; three or more may not.
        ok = (d_gloo == 0 if world == 2 else d_gloo <= 1e-5) and \
            d_alone <= max(1e-4, 4 * d_gloo_alone)
        if "nccl" in weights:
            d_nccl = max_diff(weights["loom"], weights["nccl"])
            print("ddp_cnn: loom vs nccl max |diff| %.3g (nccl vs one process %.3g)"
                  % (d_nccl, max_diff(weights["nccl"], alone)), flush=True)
            ok = ok and d_nccl <= max(1e-4, 4 * max_diff(weights["nccl"], alone))
        else:
            print("ddp_cnn: nccl left out: %s" % why_no_nccl, flush=True)
        print("ddp_cnn: %s" % ("PASS" if ok else "FAIL"), flush=True)
    flag = torch.tensor([1 if ok else 0])
    dist.broadcast(flag, 0)
    dist.destroy_process_group()
    sys.exit(0 if flag.item() else 1)


if __name__ == "__main__":
    main()
