"""The strongest check of DistributedOptimizer: N ranks, each training on its
shard of every batch, end with the same weights (to fp32 tolerance) as one
process training on the whole batch from the same seed. Also with gradients
accumulated over two backward passes per step, with fp16 compression (to fp16
tolerance), and with a parameter that never gets a gradient. Every rank also
computes the single-process reference itself, so no files are exchanged."""

import torch

import loom.torch as hvd
from common import Tally

hvd.init()
R, N = hvd.rank(), hvd.size()
T = Tally(R)
BATCH, STEPS = 24, 8          # 24 splits evenly over 1, 2, 3 and 4 ranks


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(10, 32)
        self.l2 = torch.nn.Linear(32, 32)
        self.l3 = torch.nn.Linear(32, 3)
        self.unused = torch.nn.Linear(4, 4)   # never in the graph: no gradient

    def forward(self, x):
        return self.l3(torch.tanh(self.l2(torch.tanh(self.l1(x)))))


def batches():
    g = torch.Generator().manual_seed(1234)
    for _ in range(STEPS):
        x = torch.randn(BATCH, 10, generator=g)
        yield x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()


def make_model():
    torch.manual_seed(42)
    return Net()


def train_reference():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def train_distributed(passes=1, compression=hvd.Compression.none, optim="sgd"):
    torch.manual_seed(100 + R)          # different on every rank: broadcast must fix it
    model = Net()
    if R == 0:
        model.load_state_dict(make_model().state_dict())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression, backward_passes_per_step=passes)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    shard = BATCH // N
    for x, y in batches():
        xs, ys = x[R * shard:(R + 1) * shard], y[R * shard:(R + 1) * shard]
        opt.zero_grad()
        micro = shard // passes
        for p in range(passes):
            out = model(xs[p * micro:(p + 1) * micro])
            loss = torch.nn.functional.cross_entropy(out, ys[p * micro:(p + 1) * micro]) / passes
            loss.backward()
        # The hooks started every gradient's allreduce during backward, before step().
        started = sum(1 for h in opt._handles.values() if h[0] is not None)
        T.check(started == 6, "%d allreduces started by the backward hooks, expected 6" % started)
        opt.step()
    return model


def compare(model, ref, rtol, atol, what):
    worst = 0.0
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        diff = (p.detach() - q.detach()).abs().max().item()
        worst = max(worst, diff)
        T.check(torch.allclose(p.detach(), q.detach(), rtol=rtol, atol=atol),
                "%s: %s differs from the single-process run by %g" % (what, name, diff))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).unsqueeze(0)
    g = hvd.allgather(flat)
    T.check(all(torch.equal(g[0], g[r]) for r in range(N)), "%s: ranks ended with different weights" % what)
    return worst


ref = train_reference()
initial = make_model()
T.check(any(not torch.equal(a, b) for a, b in zip(ref.parameters(), initial.parameters())),
        "the reference did not train")
T.check(torch.equal(ref.unused.weight, initial.unused.weight), "an unused parameter moved")
w1 = compare(train_distributed(), ref, 1e-5, 1e-6, "SGD, %d ranks" % N)
if (BATCH // N) % 2 == 0:
    w2 = compare(train_distributed(passes=2), ref, 1e-5, 1e-6, "backward_passes_per_step=2")
else:
    w2 = 0.0
w3 = compare(train_distributed(compression=hvd.Compression.fp16), ref, 2e-2, 2e-3, "fp16 compression")
stats = hvd._fusion_stats()
if R == 0:
    print("largest difference: %.3g (plain), %.3g (2 passes), %.3g (fp16); engine %s"
          % (w1, w2, w3, stats), flush=True)
hvd.shutdown()
T.finish()
