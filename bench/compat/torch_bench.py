"""Timings of a Horovod PyTorch program's collectives, for torch_compare.sh:
hvd.allreduce of 8 B, 64 KiB, 1 MiB and 64 MiB of float32 (unnamed, as most
programs call it, and named, which the response cache can serve), and one
DistributedOptimizer step over ResNet-50's parameter shapes (25.6 M float32,
161 tensors; the backward pass is trivial so the step is the communication).
Prints one line per case on rank 0: "case microseconds". BENCH_MODULE picks
the package (default loom.torch; horovod.torch for Horovod itself)."""
import importlib
import os
import time

import torch

hvd = importlib.import_module(os.environ.get("BENCH_MODULE", "loom.torch"))
hvd.init()
scale = float(os.environ.get("BENCH_SCALE", "1"))


def resnet50_shapes():
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    cin = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(width, cin, 1, 1), (width,), (width,), (width, width, 3, 3), (width,), (width,),
                       (4 * width, width, 1, 1), (4 * width,), (4 * width,)]
            if b == 0:
                shapes += [(4 * width, cin, 1, 1), (4 * width,), (4 * width,)]
            cin = 4 * width
    return shapes + [(1000, 2048), (1000,)]


def timed(fn, iters):
    for _ in range(max(2, iters // 10)):
        fn()
    hvd.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


results = []
for nbytes, iters in ((8, 3000), (64 << 10, 1000), (1 << 20, 300), (64 << 20, 10)):
    iters = max(3, int(iters * scale))
    t = torch.ones(nbytes // 4)
    label = "%dB" % nbytes if nbytes < 1024 else "%dKiB" % (nbytes >> 10) if nbytes < 1 << 20 else \
        "%dMiB" % (nbytes >> 20)
    results.append(("allreduce_%s" % label, timed(lambda: hvd.allreduce(t), iters)))
    results.append(("allreduce_%s_named" % label,
                    timed(lambda: hvd.allreduce(t, name="bench.%d" % nbytes), iters)))

params = [torch.nn.Parameter(torch.randn(s) * 0.01) for s in resnet50_shapes()]
opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=1e-6),
                               named_parameters=[("p.%d" % i, p) for i, p in enumerate(params)])


def step():
    opt.zero_grad()
    sum((p * p).sum() for p in params).backward()
    opt.step()


results.append(("resnet50_step", timed(step, max(3, int(10 * scale)))))
if hvd.rank() == 0:
    for name, us in results:
        print("%s %.1f" % (name, us), flush=True)
hvd.shutdown()
