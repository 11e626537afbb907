"""loom.torch (Horovod's API) on CUDA tensors, on 2 ranks under loomrun
(tests/torch_cuda_double.sh over the CUDA double, tests/gpu/torch_c10d_cuda.sh on
a GPU): every collective (allreduce and its async and in-place forms,
grouped_allreduce, allgather, broadcast, alltoall, reducescatter, the grouped
forms, poll/synchronize) on several types against the same call on CPU
tensors; several small allreduces fused in one round; join (the joined rank's
zeros made on its device); the ordering after the
producer (the input written by a non_blocking copy from pinned memory on a side
stream, the collective called under that stream: it must read the copied
values, which the double's lazy mode runs only when the host waits); a call
mixing devices, and ranks disagreeing on the device, refused with errors that
say so. Where the libloom loom._loom links has no CUDA, only that: every
collective refuses a CUDA tensor with an error that says why, and CPU tensors
still work. Without a GPU (torch.cuda.is_available() false) it prints SKIP and
exits 77.

LOOM_TEST_NO_TORCH_KERNELS=1 (over the CUDA double, which runs none of torch's
kernels): values are made on the CPU and copied to the device, and what needs
a kernel of torch's on the device (prescale/postscale, fp16 compression,
DistributedOptimizer's backward pass, SyncBatchNorm, a sparse allreduce) is left
out, each named in one line."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Tally, left_out_without_kernels  # noqa: E402

if not torch.cuda.is_available():
    print("test_torch_cuda: SKIP: no GPU (torch.cuda.is_available() is false)", flush=True)
    sys.exit(77)

import loom.torch as hvd  # noqa: E402
from loom import _loom  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
dev = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
torch.cuda.set_device(dev)
T = Tally(rank)

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
TYPES = FLOATS + (torch.int8, torch.uint8, torch.int32, torch.int64)


def val(r, n=257, dtype=torch.float32, salt=0):
    """What rank r holds: small integers, exact in every type used here."""
    return ((torch.arange(n) * (r + 2) + salt + r) % 5 + 1).to(dtype)


def needs_kernels(what):
    return left_out_without_kernels("test_torch_cuda", rank, what)


def same(what, got, want):
    T.check(isinstance(got, torch.Tensor) and got.is_cuda, "%s: the result is not on the GPU" % what)
    got = got.cpu()
    T.check(got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want),
            "%s: got %s %s, want %s %s" % (what, got.dtype, got.flatten()[:8].tolist(),
                                           want.dtype, want.flatten()[:8].tolist()))


def test_allreduce():
    for dtype in TYPES:
        ops = [hvd.Sum, hvd.Min, hvd.Max] + ([hvd.Average] if dtype.is_floating_point else [])
        for op in ops:
            what = "%s op=%s" % (dtype, op)
            x = val(rank, dtype=dtype)
            want = hvd.allreduce(x, op=op)   # the CPU path
            same("allreduce " + what, hvd.allreduce(x.cuda(), op=op), want)
            d = x.cuda()
            T.check(hvd.allreduce_(d, op=op) is d, "allreduce_ returns its tensor")
            same("allreduce_ " + what, d, want)
            h = hvd.allreduce_async(x.cuda(), op=op)
            same("allreduce_async " + what, hvd.synchronize(h), want)
            d = x.cuda()
            h = hvd.allreduce_async_(d, op=op)
            hvd.synchronize(h)
            same("allreduce_async_ " + what, d, want)
    # The default op (Average) and Horovod's average= flag.
    x = val(rank)
    same("allreduce default op", hvd.allreduce(x.cuda()), hvd.allreduce(x))
    same("allreduce average=False", hvd.allreduce(x.cuda(), average=False), hvd.allreduce(x, op=hvd.Sum))
    # Adasum: converted to float64 on the host (copies only), never fused.
    x = val(rank, dtype=torch.float32)
    same("allreduce Adasum", hvd.allreduce(x.cuda(), op=hvd.Adasum), hvd.allreduce(x, op=hvd.Adasum))


def test_grouped_allreduce():
    for dtype in (torch.float32, torch.int64, torch.float16):
        xs = [val(rank, n, dtype, salt=i) for i, n in enumerate((1, 7, 100, 33))]
        want = hvd.grouped_allreduce(xs, op=hvd.Sum)
        got = hvd.grouped_allreduce([x.cuda() for x in xs], op=hvd.Sum)
        for i, (g, w) in enumerate(zip(got, want)):
            same("grouped_allreduce %s [%d]" % (dtype, i), g, w)
        ds = [x.cuda() for x in xs]
        hvd.grouped_allreduce_(ds, op=hvd.Max)
        for i, (g, w) in enumerate(zip(ds, hvd.grouped_allreduce(xs, op=hvd.Max))):
            same("grouped_allreduce_ %s [%d]" % (dtype, i), g, w)
        h = hvd.grouped_allreduce_async([x.cuda() for x in xs], op=hvd.Min)
        got = hvd.synchronize(h)
        for i, (g, w) in enumerate(zip(got, hvd.grouped_allreduce(xs, op=hvd.Min))):
            same("grouped_allreduce_async %s [%d]" % (dtype, i), g, w)


def test_fusion():
    """Many small allreduces submitted before any wait: the engine packs
    those ready in one round into the fusion buffer on the device."""
    before = hvd._fusion_stats().get("fused_calls", 0)
    xs = [val(rank, 10 + i, torch.float32, salt=i) for i in range(16)]
    ds = [x.cuda() for x in xs]
    hs = [hvd.allreduce_async_(d, name="fuse.%d" % i, op=hvd.Sum) for i, d in enumerate(ds)]
    T.check(all(isinstance(hvd.poll(h), bool) for h in hs), "poll answers a bool")
    for h in hs:
        hvd.synchronize(h)
    for i, (d, x) in enumerate(zip(ds, xs)):
        same("fused allreduce [%d]" % i, d, hvd.allreduce(x, op=hvd.Sum, name="fuse.cpu.%d" % i))
    # A group is announced in one round: fused for certain.
    mid = hvd._fusion_stats().get("fused_calls", 0)
    ds = [x.cuda() for x in xs]
    hvd.synchronize(hvd.grouped_allreduce_async_(ds, op=hvd.Sum))
    T.check(hvd._fusion_stats()["fused_calls"] > mid,
            "a group of 16 small allreduces was not fused (%s)" % hvd._fusion_stats())
    for i, (d, x) in enumerate(zip(ds, xs)):
        same("fused group [%d]" % i, d, hvd.allreduce(x, op=hvd.Sum))
    # CPU and CUDA tensors of one type in one round: separate fusion buffers.
    cs = [val(rank, 5, torch.float32, salt=i) for i in range(4)]
    ds = [c.cuda() for c in cs]
    hs = [hvd.allreduce_async_(t, op=hvd.Sum) for pair in zip(cs, ds) for t in pair]
    for h in hs:
        hvd.synchronize(h)
    for i, (c, d) in enumerate(zip(cs, ds)):
        same("CPU and CUDA in one round [%d]" % i, d, c)
    if rank == 0:
        print("test_torch_cuda: fused calls %d -> %d" % (before, hvd._fusion_stats()["fused_calls"]),
              flush=True)


def test_allgather():
    for dtype in (torch.float32, torch.float16, torch.int32, torch.uint8, torch.float64):
        x = val(rank, (rank + 1) * 6, dtype).view(rank + 1, 6)   # rows differ by rank
        same("allgather %s" % dtype, hvd.allgather(x.cuda()), hvd.allgather(x))
        h = hvd.allgather_async(x.cuda())
        same("allgather_async %s" % dtype, hvd.synchronize(h), hvd.allgather(x))
    xs = [val(rank, 3 * (rank + 1)), val(rank, rank + 2, torch.int64)]
    want = hvd.grouped_allgather(xs)
    for i, (g, w) in enumerate(zip(hvd.grouped_allgather([x.cuda() for x in xs]), want)):
        same("grouped_allgather [%d]" % i, g, w)


def test_broadcast():
    for root in range(size):
        for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.int8):
            x = val(rank, dtype=dtype, salt=root)
            want = val(root, dtype=dtype, salt=root)
            same("broadcast %s from %d" % (dtype, root), hvd.broadcast(x.cuda(), root), want)
            d = x.cuda()
            hvd.broadcast_(d, root)
            same("broadcast_ %s from %d" % (dtype, root), d, want)
            d = x.cuda()
            hvd.synchronize(hvd.broadcast_async_(d, root))
            same("broadcast_async_ %s from %d" % (dtype, root), d, want)
    params = {"w": val(rank, 12).cuda(), "b": val(rank, 3, torch.int64).cuda()}
    hvd.broadcast_parameters(params, root_rank=0)
    same("broadcast_parameters w", params["w"], val(0, 12))
    same("broadcast_parameters b", params["b"], val(0, 3, torch.int64))


def test_alltoall():
    for dtype in (torch.float32, torch.int32, torch.float16):
        x = val(rank, size * 4 * 3, dtype).view(size * 4, 3)
        same("alltoall %s" % dtype, hvd.alltoall(x.cuda()), hvd.alltoall(x))
        splits = [r + 1 + rank for r in range(size)]
        x = val(rank, sum(splits) * 2, dtype).view(sum(splits), 2)
        got, got_splits = hvd.alltoall(x.cuda(), splits=splits)
        want, want_splits = hvd.alltoall(x, splits=splits)
        same("alltoall %s splits" % dtype, got, want)
        T.check(torch.equal(got_splits.cpu(), want_splits), "alltoall received splits %s, want %s"
                % (got_splits.tolist(), want_splits.tolist()))


def test_reducescatter():
    for dtype in (torch.float32, torch.float64, torch.int32):
        for rows in (size * 3, size * 3 + 1):   # even, and uneven (first ranks one row more)
            x = val(rank, rows * 5, dtype).view(rows, 5)
            for op in (hvd.Sum, hvd.Max) + ((hvd.Average,) if dtype.is_floating_point else ()):
                same("reducescatter %s rows=%d op=%s" % (dtype, rows, op),
                     hvd.reducescatter(x.cuda(), op=op), hvd.reducescatter(x, op=op))
    xs = [val(rank, size * 4), val(rank, size * 2 * 3).view(size * 2, 3)]
    want = hvd.grouped_reducescatter(xs, op=hvd.Sum)
    got = hvd.grouped_reducescatter([x.cuda() for x in xs], op=hvd.Sum)
    for i, (g, w) in enumerate(zip(got, want)):
        same("grouped_reducescatter [%d]" % i, g, w)


def test_join():
    """A rank that joined contributes zeros (made on its current device) to
    the others' allreduces of CUDA tensors."""
    if rank == 0:
        last = hvd.join()
    else:
        got = hvd.allreduce(val(rank, 64).cuda(), op=hvd.Sum, name="join.cuda")
        same("allreduce beside a joined rank", got, sum(val(r, 64) for r in range(1, size)))
        last = hvd.join()
    T.check(last in range(size), "join returned %r" % (last,))


def test_stream_order():
    """The collective waits for the stream that produced its input (an event
    recorded at submit), not for the whole device, and its result is in place
    for what the caller's stream does next."""
    n = 1 << 22
    want = torch.full((n,), float(sum(r + 1 for r in range(size))))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        # Runs on s after the call returns (in the lazy double, only when the
        # host waits for it): the collective must see these values.
        x = torch.full((n,), float(rank + 1)).pin_memory().to(dev, non_blocking=True)
        y = hvd.allreduce(x, op=hvd.Sum)
        got = y.cpu()
    T.check(bool((got == want).all()), "allreduce after a copy on a side stream: %s" % got[:4].tolist())
    with torch.cuda.stream(s):
        x = torch.full((n,), float(rank + 1)).pin_memory().to(dev, non_blocking=True)
        h = hvd.allreduce_async_(x, op=hvd.Sum)
        hvd.synchronize(h)
        got = x.cpu()
    T.check(bool((got == want).all()), "allreduce_async_ after a copy on a side stream: %s"
            % got[:4].tolist())
    # Small tensors through the fusion buffer: its copies in wait for s.
    with torch.cuda.stream(s):
        xs = [torch.full((100,), float(rank + 1 + i)).pin_memory().to(dev, non_blocking=True)
              for i in range(8)]
        hvd.grouped_allreduce_(xs, op=hvd.Sum)
        got = [x.cpu() for x in xs]
    for i, g in enumerate(got):
        w = float(sum(r + 1 + i for r in range(size)))
        T.check(bool((g == w).all()), "fused allreduce after a side-stream copy [%d]: %s, want %s"
                % (i, g[:4].tolist(), w))
    with torch.cuda.stream(s):
        x = val(rank, 4096 * (rank + 1)).pin_memory().to(dev, non_blocking=True)
        got = hvd.allgather(x).cpu()
    same_cpu = hvd.allgather(val(rank, 4096 * (rank + 1)))
    T.check(torch.equal(got, same_cpu), "allgather after a side-stream copy")
    with torch.cuda.stream(s):
        x = val(rank, 4096, salt=7).pin_memory().to(dev, non_blocking=True)
        hvd.broadcast_(x, 0)
        got = x.cpu()
    T.check(torch.equal(got, val(0, 4096, salt=7)), "broadcast_ after a side-stream copy")


def test_errors():
    cpu, cuda = val(rank, 4), val(rank, 4).cuda()
    T.raises("grouped_allreduce on CPU and CUDA tensors",
           lambda: hvd.grouped_allreduce([cpu, cuda]), "one device", "cpu", str(dev))
    T.raises("grouped_allgather on CPU and CUDA tensors",
           lambda: hvd.grouped_allgather([cuda, cpu]), "one device", "cpu", str(dev))
    T.raises("grouped_reducescatter on CPU and CUDA tensors",
           lambda: hvd.grouped_reducescatter([val(rank, size), val(rank, size).cuda()]),
           "one device", "cpu", str(dev))
    # Ranks that disagree on the device: a mismatch on every rank, not a hang.
    t = cuda if rank == 0 else cpu
    T.raises("allreduce on a GPU on rank 0, on the CPU on the others",
           lambda: hvd.allreduce(t, name="mixed", op=hvd.Sum), "disagree", "cuda.float32")
    # The engine still serves calls.
    same("allreduce after the errors", hvd.allreduce(cuda, op=hvd.Sum), hvd.allreduce(cpu, op=hvd.Sum))


def test_with_kernels():
    """What runs torch's kernels on the device: prescale/postscale, fp16
    compression, a DistributedOptimizer step, a non-contiguous tensor,
    SyncBatchNorm, a sparse allreduce."""
    if needs_kernels("allreduce with prescale_factor/postscale_factor, reducescatter with them, "
                     "Compression.fp16, DistributedOptimizer on CUDA, a non-contiguous tensor, "
                     "SyncBatchNorm on CUDA, a sparse allreduce on CUDA"):
        return
    for dtype in (torch.float32, torch.float16, torch.int32):
        x = val(rank, dtype=dtype)
        same("allreduce %s pre/post" % dtype,
             hvd.allreduce(x.cuda(), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5),
             hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5))
    xs = [val(rank, 50, salt=i) for i in range(6)]
    want = hvd.grouped_allreduce(xs, op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.25)
    got = hvd.grouped_allreduce([x.cuda() for x in xs], op=hvd.Sum, prescale_factor=3.0,
                                postscale_factor=0.25)
    for i, (g, w) in enumerate(zip(got, want)):
        same("fused allreduce pre/post [%d]" % i, g, w)
    x = val(rank, size * 6).view(size * 2, 3)
    same("reducescatter pre/post",
         hvd.reducescatter(x.cuda(), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5),
         hvd.reducescatter(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5))
    x = val(rank)
    same("allreduce fp16 compression", hvd.allreduce(x.cuda(), compression=hvd.Compression.fp16),
         hvd.allreduce(x, compression=hvd.Compression.fp16))
    x = val(rank, 12).view(3, 4)
    d = x.cuda().t()
    hvd.allreduce_(d, op=hvd.Sum)
    same("allreduce_ non-contiguous", d, hvd.allreduce(x, op=hvd.Sum).t())
    # One step of DistributedOptimizer on the GPU against the same on the CPU.
    results = []
    for device in ("cpu", dev):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2).to(device)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=[("%s.%s" % (device, k), v)
                                                         for k, v in model.named_parameters()])
        data = val(rank, 8).view(2, 4).to(device)
        opt.zero_grad()
        model(data).sum().backward()
        opt.step()
        results.append([p.detach().cpu() for p in model.parameters()])
    for i, (c, g) in enumerate(zip(*results)):
        T.check(torch.allclose(c, g, rtol=1e-5, atol=1e-6),
                "DistributedOptimizer on the GPU, parameter %d: %s, want %s" % (i, g.tolist(), c.tolist()))
    # SyncBatchNorm: output, input gradient and running statistics on the GPU
    # against the same module on the CPU (both over every rank's batch).
    results = []
    for device in ("cpu", dev):
        torch.manual_seed(0)
        bn = hvd.SyncBatchNorm(3).to(device)
        x = (val(rank, 4 * 3 * 5).view(4, 3, 5).float() / 3).to(device).requires_grad_()
        y = bn(x)
        (y * torch.arange(y.numel(), device=device).view_as(y)).sum().backward()
        results.append([t.detach().cpu() for t in (y, x.grad, bn.running_mean, bn.running_var)])
    for what, c, g in zip(("output", "input gradient", "running mean", "running var"), *results):
        T.check(torch.allclose(c, g, rtol=1e-4, atol=1e-5),
                "SyncBatchNorm on the GPU, %s: %s, want %s" % (what, g.flatten()[:6].tolist(),
                                                               c.flatten()[:6].tolist()))
    # A sparse allreduce (allgather of indices and values, as Horovod's).
    i = torch.tensor([[rank, 2, 4]])
    v = torch.tensor([1.0 + rank, 2.0, 3.0 * (rank + 1)])
    sp = torch.sparse_coo_tensor(i, v, (6,))
    want = hvd.sparse_allreduce_async(sp, "sparse.cpu", hvd.Sum)().to_dense()
    got = hvd.sparse_allreduce_async(sp.cuda(), "sparse.cuda", hvd.Sum)()
    T.check(got.is_cuda and torch.equal(got.to_dense().cpu(), want),
            "sparse allreduce on the GPU: %s, want %s" % (got.to_dense().cpu().tolist(),
                                                          want.tolist()))


def test_without_cuda():
    """A libloom without CUDA: CUDA tensors are refused before anything is
    submitted, with an error that says why; CPU tensors still work."""
    cpu, cuda = val(rank, 4), val(rank, 4).cuda()
    for what, fn in (("allreduce", lambda: hvd.allreduce(cuda)),
                     ("allreduce", lambda: hvd.allreduce_async_(cuda)),
                     ("grouped_allreduce", lambda: hvd.grouped_allreduce([cuda])),
                     ("allgather", lambda: hvd.allgather(cuda)),
                     ("broadcast", lambda: hvd.broadcast_(cuda, 0)),
                     ("alltoall", lambda: hvd.alltoall(cuda)),
                     ("reducescatter", lambda: hvd.reducescatter(val(rank, size).cuda()))):
        T.raises("%s of a CUDA tensor, libloom without CUDA" % what, fn, what + ":", "without CUDA")
    # The module's own check too: a DLPack capsule of CUDA memory.
    T.raises("a CUDA capsule to loom._loom", lambda: _loom.buffer_info(torch.utils.dlpack.to_dlpack(cuda)),
             "without CUDA")
    T.check(torch.equal(hvd.allreduce(cpu, op=hvd.Sum), val(0, 4) + val(1, 4)) or size != 2,
            "allreduce of a CPU tensor after the refusals")


if _loom.CUDA_BUILT:
    tests = (test_allreduce, test_grouped_allreduce, test_fusion, test_allgather, test_broadcast,
             test_alltoall, test_reducescatter, test_join, test_stream_order, test_errors,
             test_with_kernels)
else:
    if rank == 0:
        print("test_torch_cuda: the libloom loom._loom links has no CUDA: the refusal alone",
              flush=True)
    tests = (test_without_cuda,)
for fn in tests:
    T.run(fn)
    hvd.barrier()
hvd.shutdown()
T.finish()
