"""The torch.distributed backend "loom" on CUDA tensors, for a machine with a GPU
(tests/gpu/torch_c10d_cuda.sh runs it on 2 ranks sharing one GPU under
torchrun): every operation against the same operation on CPU tensors over the
same group (which also puts CPU and GPU calls on one communicator in turn) or
against the values every rank held; the stream semantics (the collective waits
for the stream that produced its input; after work.wait() the current stream
sees the result, with no host synchronization in between; the future completes
with the result); mixed devices and a receive from any source refused with an
error. Without a GPU, or with an extension built without CUDA, it prints SKIP
and exits 77.

LOOM_TEST_NO_TORCH_KERNELS=1 (tests/torch_cuda_double.sh, over the CUDA double,
which runs none of torch's kernels): tensors are made on the CPU and copied to
the device, and the parts that need a kernel of torch's are left out, each
named in one line: a non-contiguous tensor (staged by a copy kernel), the list
forms of reduce_scatter, scatter and all_to_all (their inputs are flattened by
at::cat), and the stream test's producer and consumer (a matmul and arithmetic;
there a copy from pinned memory on the side stream produces the input, and a
device-to-device copy consumes the result)."""
import datetime
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import TORCH_KERNELS as KERNELS, Tally, left_out_without_kernels  # noqa: E402

if not torch.cuda.is_available():
    print("test_c10d_cuda: SKIP: no GPU (torch.cuda.is_available() is false)", flush=True)
    sys.exit(77)
import loom.torch.distributed as ld  # noqa: E402

if not ld._c10d.cuda_built:
    print("test_c10d_cuda: SKIP: loom.torch._c10d was built without CUDA", flush=True)
    sys.exit(77)

rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
torch.cuda.set_device(dev)
dist.init_process_group("loom", device_id=dev, timeout=datetime.timedelta(seconds=120))
T = Tally(rank)
R = dist.ReduceOp


def val(r, n=1000, dtype=torch.float32, salt=0):
    """What rank r holds: small integers, exact in every type used here."""
    return ((torch.arange(n) * (r + 2) + salt + r) % 5 + 1).to(dtype)


def on_dev(t):
    """t (made on the CPU) on the device: a copy, no kernel of torch's."""
    return t.to(dev)


def full(n, v):
    return on_dev(torch.full((n,), float(v)))


def without_kernels(what):
    return left_out_without_kernels("test_c10d_cuda", rank, what)


def same(what, got, want):
    # .cpu() runs on the current stream: only wait()'s ordering makes it see
    # the collective's result (no torch.cuda.synchronize() before it).
    got = got.cpu()
    T.check(got.dtype == want.dtype and torch.equal(got, want),
            "%s: got %s, want %s" % (what, got.flatten()[:8].tolist(), want.flatten()[:8].tolist()))


def test_all_reduce():
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                  torch.int64, torch.uint8):
        ops = [R.SUM, R.MAX, R.MIN, R.PRODUCT]
        if dtype.is_floating_point:
            ops.append(R.AVG)
        for op in ops:
            if op == R.PRODUCT and dtype == torch.uint8 and size > 3:
                continue   # 5**4 overflows
            x, y = val(rank, dtype=dtype).to(dev), val(rank, dtype=dtype)
            dist.all_reduce(x, op=op)
            dist.all_reduce(y, op=op)   # the CPU path, the same group
            same("all_reduce %s %s" % (op, dtype), x, y)
    # non-contiguous: staged through a contiguous copy, copied back on the stream
    if without_kernels("all_reduce of a non-contiguous tensor"):
        return
    x = val(rank, 12).view(3, 4).to(dev).t()
    dist.all_reduce(x)
    same("all_reduce non-contiguous", x, sum(val(r, 12) for r in range(size)).view(3, 4).t())


def test_broadcast_reduce():
    for root in range(size):
        x = val(rank, salt=root).to(dev)
        dist.broadcast(x, src=root)
        same("broadcast from %d" % root, x, val(root, salt=root))
        x = val(rank).to(dev)
        dist.reduce(x, dst=root, op=R.MAX)
        want = torch.stack([val(r) for r in range(size)]).max(0).values if rank == root else val(rank)
        same("reduce to %d" % root, x, want)


def test_all_gather():
    outs = [torch.empty(1000, device=dev) for _ in range(size)]
    dist.all_gather(outs, val(rank).to(dev))
    for r in range(size):
        same("all_gather[%d]" % r, outs[r], val(r))
    out = torch.empty(size * 1000, dtype=torch.float16, device=dev)
    dist.all_gather_into_tensor(out, val(rank, dtype=torch.float16).to(dev))
    same("all_gather_into_tensor", out, torch.cat([val(r, dtype=torch.float16) for r in range(size)]))


def test_reduce_scatter():
    if not without_kernels("reduce_scatter (a list of inputs)"):
        reduce_scatter_list()
    reduce_scatter_tensor()


def reduce_scatter_list():
    out = torch.empty(1000, device=dev)
    dist.reduce_scatter(out, [val(rank, salt=r).to(dev) for r in range(size)])
    same("reduce_scatter", out, sum(val(q, salt=rank) for q in range(size)))


def reduce_scatter_tensor():
    out = torch.empty(1000, dtype=torch.bfloat16, device=dev)
    dist.reduce_scatter_tensor(out, torch.cat([val(rank, dtype=torch.bfloat16, salt=r)
                                               for r in range(size)]).to(dev))
    same("reduce_scatter_tensor", out,
         sum(val(q, dtype=torch.bfloat16, salt=rank) for q in range(size)))


def test_all_to_all():
    x = torch.cat([torch.full((3,), float(rank * 100 + j)) for j in range(size)])
    out = torch.empty(3 * size, device=dev)
    dist.all_to_all_single(out, x.to(dev))
    same("all_to_all_single", out, torch.cat([torch.full((3,), float(i * 100 + rank))
                                              for i in range(size)]))
    # uneven: rank i sends rank j i + j + 1 rows
    ins = [torch.full((rank + j + 1, 2), float(rank * 100 + j)) for j in range(size)]
    out = torch.empty(sum(i + rank + 1 for i in range(size)), 2, device=dev)
    dist.all_to_all_single(out, torch.cat(ins).to(dev),
                           output_split_sizes=[i + rank + 1 for i in range(size)],
                           input_split_sizes=[rank + j + 1 for j in range(size)])
    same("all_to_all_single uneven", out,
         torch.cat([torch.full((i + rank + 1, 2), float(i * 100 + rank)) for i in range(size)]))
    if without_kernels("all_to_all (lists)"):
        return
    outs = [torch.empty(i + rank + 1, 2, device=dev) for i in range(size)]
    dist.all_to_all(outs, [t.to(dev) for t in ins])
    for i in range(size):
        same("all_to_all[%d]" % i, outs[i], torch.full((i + rank + 1, 2), float(i * 100 + rank)))


def test_gather_scatter():
    root = size - 1
    outs = [torch.empty(1000, device=dev) for _ in range(size)] if rank == root else None
    dist.gather(val(rank).to(dev), outs, dst=root)
    if rank == root:
        for r in range(size):
            same("gather[%d]" % r, outs[r], val(r))
    if without_kernels("scatter (a list of inputs)"):
        return
    out = torch.empty(1000, device=dev)
    dist.scatter(out, [val(r, salt=7).to(dev) for r in range(size)] if rank == root else None,
                 src=root)
    same("scatter", out, val(rank, salt=7))


def test_send_recv():
    if size < 2:
        return
    # 0 -> 1 -> ... -> 0: each rank receives from its left, then sends right
    # (rank 0 the other way round), so no two blocking sends face each other.
    left, right = (rank - 1) % size, (rank + 1) % size
    got = torch.empty(1000, device=dev)
    if rank == 0:
        dist.send(val(rank, salt=3).to(dev), dst=right)
        dist.recv(got, src=left)
    else:
        dist.recv(got, src=left)
        dist.send(val(rank, salt=3).to(dev), dst=right)
    same("recv from %d" % left, got, val(left, salt=3))


def test_streams():
    want = float(sum(r + 1 for r in range(size)))
    s = torch.cuda.Stream()
    # Without kernels: a copy from pinned memory produces the input on s (it
    # runs after the call returns) and a copy consumes the result (factor 1).
    factor = 2 if KERNELS else 1
    with torch.cuda.stream(s):
        if KERNELS:
            # The producer: long GPU work on s ahead of the input's last write.
            a = torch.ones(2048, 2048, device=dev)
            for _ in range(20):
                a = a @ a / 2048
            x = torch.full((1 << 20,), float(rank + 1), device=dev) + (a.sum() - a.numel())
        else:
            x = torch.full((1 << 22,), float(rank + 1)).pin_memory().to(dev, non_blocking=True)
        work = dist.all_reduce(x, async_op=True)
        work.wait()           # s waits for the collective; the host does not
        y = x * 2 if KERNELS else x.clone()   # on s, after the collective
        got = y.cpu()         # on s as well
    T.check(bool((got == factor * want).all()),
            "stream order: %s, want %s" % (got[:4].tolist(), factor * want))
    # The future completes with the result (after the GPU is done).
    x = full(1000, rank + 1)
    work = dist.all_reduce(x, async_op=True)
    vals = work.get_future().wait()
    T.check(work.is_completed(), "work completed once its future is")
    same("future's value", vals[0], torch.full((1000,), want))
    doubled = work.get_future().then(
        lambda f: f.value()[0] * 2 if KERNELS else f.value()[0].clone()).wait()
    same("future then()", doubled, torch.full((1000,), factor * want))
    # A CPU operation on the group between a GPU one and its wait().
    x = full(1000, rank + 1)
    work = dist.all_reduce(x, async_op=True)
    c = torch.full((5,), float(rank + 1))
    dist.all_reduce(c)
    work.wait()
    same("GPU all_reduce before a CPU one", x, torch.full((1000,), want))
    same("CPU all_reduce after a GPU one", c, torch.full((5,), want))
    dist.barrier()   # opts.device is the bound GPU


def test_errors():
    T.raises("all_gather with CPU outputs and a CUDA input",
           lambda: dist.all_gather([torch.empty(4) for _ in range(size)],
                                   on_dev(torch.ones(4))),
           "cpu", str(dev))
    T.raises("recv from any source on a CUDA tensor",
           lambda: dist.recv(torch.empty(4, device=dev)), "any source")
    if torch.cuda.device_count() > 1:
        other = torch.device("cuda", (dev.index + 1) % torch.cuda.device_count())
        T.raises("all_reduce on another GPU than the group's",
               lambda: dist.all_reduce(torch.ones(4).to(other)), str(dev), str(other))
    # the group still works
    x = on_dev(torch.ones(4))
    dist.all_reduce(x)
    same("all_reduce after the errors", x, torch.full((4,), float(size)))


for fn in (test_all_reduce, test_broadcast_reduce, test_all_gather, test_reduce_scatter,
           test_all_to_all, test_gather_scatter, test_send_recv, test_streams, test_errors):
    T.run(fn)
    dist.barrier()
dist.destroy_process_group()
T.finish()
