"""Elastic training with loom.torch, written as for horovod.torch: the job
keeps training when ranks die or hosts leave, and grows when hosts come.

    loomrun --elastic --min-np 2 --max-np 8 \\
        --host-discovery-script ./discover_hosts.sh python3 elastic_torch.py

(discover_hosts.sh prints one "host:slots" line per usable host; docs/launching.md,
"Elastic jobs".) It also runs as a plain job: `loomrun -np 2 python3
elastic_torch.py`, or alone.

The pattern: everything that must survive a failure lives in the state
(model, optimizer, sampler, epoch and batch counters); the training function
is wrapped by hvd.elastic.run and calls state.commit() regularly. On a failure
every surviving rank rolls back to the last commit and the function runs
again on the new world; at a commit where new ranks wait to join, the world
grows and everyone continues from that commit."""
import argparse

import torch
import torch.nn.functional as F

import loom.torch as hvd

parser = argparse.ArgumentParser(description="loom.torch elastic example")
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--batches-per-commit", type=int, default=4)
parser.add_argument("--samples", type=int, default=4096)
args = parser.parse_args()

hvd.init()
torch.manual_seed(1234)

# A synthetic regression task: y = x . w_true + noise.
gen = torch.Generator().manual_seed(42)
w_true = torch.randn(32, 1, generator=gen)
x_all = torch.randn(args.samples, 32, generator=gen)
y_all = x_all @ w_true + 0.01 * torch.randn(args.samples, 1, generator=gen)
dataset = torch.utils.data.TensorDataset(x_all, y_all)

# The sampler shards what this epoch has left over however many ranks there are.
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
# The learning rate grows with the number of ranks (the global batch does).
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


def evaluate():
    with torch.no_grad():
        return F.mse_loss(model(x_all), y_all).item()


@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, args.epochs):
        # After a reset, the sampler resumes the epoch where the last commit left it.
        for state.batch, (x, y) in enumerate(loader, start=state.batch):
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            sampler.record_batch(state.batch, args.batch_size)
            if (state.batch + 1) % args.batches_per_commit == 0:
                state.commit()
        state.batch = 0
        sampler.set_epoch(state.epoch + 1)
        if hvd.rank() == 0:
            print("epoch %d: loss %.5f on %d ranks" % (state.epoch, evaluate(), hvd.size()),
                  flush=True)
        state.commit()


def on_reset():
    # The world changed size: scale the learning rate to the new global batch.
    for group in optimizer.param_groups:
        group["lr"] = args.lr * hvd.size()
    if hvd.rank() == 0:
        print("reset: now %d ranks" % hvd.size(), flush=True)


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
state.register_reset_callbacks([on_reset])

first = evaluate()
train(state)
last = evaluate()
if hvd.rank() == 0:
    print("loss %.5f -> %.5f: %s" % (first, last, "loss fell" if last < first else "loss did not fall"))
hvd.shutdown()
