"""Data-parallel training of a small classifier with loom.torch, on synthetic
data (nothing to download). Every rank trains on its shard of each epoch;
DistributedOptimizer averages the gradients, so all ranks keep identical
weights. Prints the loss per epoch and the final accuracy (rank 0).

    loomrun -np 2 python3 examples/python/torch_train.py [--epochs 10]
"""
import argparse

import torch

import loom.torch as hvd


def synthetic(n, seed):
    """Points in 20 dimensions, 4 classes set by a fixed random linear map."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    w = torch.randn(20, 4, generator=torch.Generator().manual_seed(0))
    return x, (x @ w).argmax(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(1)
    torch.set_num_threads(1)
    x, y = synthetic(4096, seed=1)
    xt, yt = synthetic(1024, seed=2)
    # This rank's shard: every size()-th sample.
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]

    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    # Scale the learning rate with the number of ranks, as with Horovod.
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

    losses = []
    for epoch in range(args.epochs):
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        total, batches = 0.0, 0
        for i in range(0, len(x) - args.batch_size + 1, args.batch_size):
            idx = perm[i:i + args.batch_size]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += loss.item()
            batches += 1
        # The mean over every rank's batches.
        epoch_loss = hvd.allreduce(torch.tensor(total / batches), name="epoch_loss").item()
        losses.append(epoch_loss)
        if hvd.rank() == 0:
            print("epoch %d: loss %.4f" % (epoch + 1, epoch_loss), flush=True)

    with torch.no_grad():
        acc = (model(xt).argmax(1) == yt).float().mean()
    acc = hvd.allreduce(acc, name="accuracy").item()
    if hvd.rank() == 0:
        print("final accuracy: %.3f on %d ranks" % (acc, hvd.size()))
        if losses[-1] < losses[0]:
            print("loss fell from %.4f to %.4f" % (losses[0], losses[-1]))
    hvd.shutdown()


if __name__ == "__main__":
    main()
