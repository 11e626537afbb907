"""The torch.distributed backend "loom": every operation, every dtype, uneven
all_to_all, non-contiguous tensors, sub-groups, asynchronous work and futures,
each checked against the result computed locally from what every rank held."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Tally  # noqa: E402
from c10d_common import init  # noqa: E402

rank, size = init()
T = Tally(rank)
R = dist.ReduceOp

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool]
if hasattr(torch, "uint16"):   # torch >= 2.3
    DTYPES.append(torch.uint16)
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def value(r, n=7, dtype=torch.float32, salt=0):
    """What rank r holds: small integers (exact in every type, no overflow of
    int8 in a product of 3 ranks)."""
    x = (torch.arange(n, dtype=torch.int64) * (r + 2) + salt + r) % 4 + 1
    if dtype == torch.bool:
        return (x % 2 == 0) if r % 2 == 0 else (x > 2)
    return x.to(dtype)


BITWISE = (R.BAND, R.BOR, R.BXOR)


def expected(op, dtype, n=7):
    xs = [value(r, n, dtype) for r in range(size)]
    if op in BITWISE:
        acc = xs[0].clone()
        for x in xs[1:]:
            acc = acc & x if op == R.BAND else acc | x if op == R.BOR else acc ^ x
        return acc
    if dtype == torch.bool:
        s = torch.stack(xs)
        return {R.SUM: s.any(0), R.MAX: s.any(0), R.PRODUCT: s.all(0), R.MIN: s.all(0)}[op]
    s = torch.stack([x.to(torch.float64) for x in xs])
    if op == R.SUM:
        out = s.sum(0)
    elif op == R.PRODUCT:
        out = s.prod(0)
    elif op == R.MIN:
        out = s.min(0).values
    elif op == R.MAX:
        out = s.max(0).values
    elif op == R.AVG:
        out = s.sum(0) / size
        if dtype not in FLOATS:
            out = torch.trunc(out)
    return out.to(dtype)


def same(a, b, dtype):
    if dtype in (torch.float16, torch.bfloat16):
        return torch.allclose(a.double(), b.double(), rtol=1e-2, atol=1e-2)
    return torch.equal(a, b)


def test_allreduce():
    for dtype in DTYPES:
        ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX]
        if dtype != torch.bool:
            ops.append(R.AVG)
        if dtype not in FLOATS:
            ops += BITWISE
        for op in ops:
            t = value(rank, dtype=dtype)
            dist.all_reduce(t, op=op)
            T.check(same(t, expected(op, dtype), dtype), "allreduce %s %s: %s" % (dtype, op, t))
            # asynchronous, then through the future
            t = value(rank, dtype=dtype)
            w = dist.all_reduce(t, op=op, async_op=True)
            fut = w.get_future()
            w.wait()
            T.check(w.is_completed(), "allreduce %s %s: work completed" % (dtype, op))
            T.check(same(fut.value()[0], expected(op, dtype), dtype),
                    "allreduce %s %s: future value" % (dtype, op))
    # As Gloo: the bitwise ops refuse floats, with a message, and the group goes on.
    for op in BITWISE:
        try:
            dist.all_reduce(value(rank), op=op)
            T.check(False, "allreduce float32 %s: no error" % op)
        except RuntimeError as e:
            T.check("integer and bool" in str(e), "allreduce float32 %s: %s" % (op, e))
    t = value(rank)
    dist.all_reduce(t)
    T.check(torch.equal(t, expected(R.SUM, torch.float32)), "allreduce after a refused BAND")
    for dtype in FLOATS:
        t = value(rank, dtype=dtype)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
        T.check(same(t, expected(R.SUM, dtype) * 0.5, dtype), "premul_sum %s" % dtype)
    # non-contiguous: every other column of a matrix; the rest stays as it was
    base = torch.full((5, 6), -1.0)
    view = base[:, ::2]
    view.copy_(value(rank, 15).view(5, 3))
    dist.all_reduce(view)
    T.check(torch.equal(view, expected(R.SUM, torch.float32, 15).view(5, 3)),
            "allreduce non-contiguous")
    T.check(bool((base[:, 1::2] == -1).all()), "allreduce non-contiguous: rest untouched")
    # empty and large
    e = torch.empty(0)
    dist.all_reduce(e)
    big = torch.full((1 << 20,), float(rank + 1))
    dist.all_reduce(big)
    T.check(bool((big == size * (size + 1) / 2).all()), "allreduce 4 MiB")


def test_broadcast():
    for dtype in DTYPES:
        for root in range(size):
            t = value(rank, dtype=dtype)
            dist.broadcast(t, src=root)
            T.check(torch.equal(t, value(root, dtype=dtype)), "broadcast %s root %d" % (dtype, root))
    base = torch.zeros(4, 4)
    v = base.t()
    if rank == 0:
        v.copy_(torch.arange(16.0).view(4, 4))
    dist.broadcast(v, src=0)
    T.check(torch.equal(v, torch.arange(16.0).view(4, 4)), "broadcast non-contiguous")
    obj = [{"rank": rank, "s": "x" * rank}]
    dist.broadcast_object_list(obj, src=size - 1)
    T.check(obj[0] == {"rank": size - 1, "s": "x" * (size - 1)}, "broadcast_object_list")


def test_allgather():
    for dtype in DTYPES:
        out = [torch.empty(7, dtype=dtype) for _ in range(size)]
        dist.all_gather(out, value(rank, dtype=dtype))
        T.check(all(torch.equal(out[r], value(r, dtype=dtype)) for r in range(size)),
                "all_gather %s" % dtype)
        flat = torch.empty(7 * size, dtype=dtype)
        dist.all_gather_into_tensor(flat, value(rank, dtype=dtype))
        T.check(torch.equal(flat, torch.cat([value(r, dtype=dtype) for r in range(size)])),
                "all_gather_into_tensor %s" % dtype)
    # non-contiguous input and outputs
    out = [torch.zeros(2, 3).t() for _ in range(size)]
    src = value(rank, 6).view(2, 3).t()
    dist.all_gather(out, src)
    T.check(all(torch.equal(out[r], value(r, 6).view(2, 3).t()) for r in range(size)),
            "all_gather non-contiguous")
    objs = [None] * size
    dist.all_gather_object(objs, ("r", rank))
    T.check(objs == [("r", r) for r in range(size)], "all_gather_object")
    if hasattr(dist, "all_gather_coalesced"):
        ins = [value(rank, 3), value(rank, 5, salt=1)]
        outs = [[torch.empty(3), torch.empty(5)] for _ in range(size)]
        try:
            dist.all_gather_coalesced(outs, ins)
            T.check(all(torch.equal(outs[r][0], value(r, 3)) and
                        torch.equal(outs[r][1], value(r, 5, salt=1)) for r in range(size)),
                    "all_gather_coalesced")
        except (RuntimeError, ValueError) as e:   # removed or deprecated in newer torch
            if "deprecated" not in str(e).lower() and "removed" not in str(e).lower():
                raise


def test_reduce_scatter():
    for dtype in [torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64]:
        n = 4
        full = [value(r, n * size, dtype) for r in range(size)]
        exp = expected(R.SUM, dtype, n * size)
        out = torch.empty(n, dtype=dtype)
        dist.reduce_scatter_tensor(out, full[rank])
        T.check(same(out, exp[rank * n:(rank + 1) * n], dtype), "reduce_scatter_tensor %s" % dtype)
        out = torch.empty(n, dtype=dtype)
        dist.reduce_scatter(out, list(full[rank].split(n)))
        T.check(same(out, exp[rank * n:(rank + 1) * n], dtype), "reduce_scatter %s" % dtype)
    # uneven blocks: rank r's block has r + 1 elements
    sizes = [r + 1 for r in range(size)]
    total = sum(sizes)
    mine = value(rank, total)
    exp = expected(R.SUM, torch.float32, total)
    out = torch.empty(sizes[rank])
    dist.reduce_scatter(out, list(mine.split(sizes)))
    off = sum(sizes[:rank])
    T.check(torch.equal(out, exp[off:off + sizes[rank]]), "reduce_scatter uneven")
    for op in (R.MAX, R.AVG):
        out = torch.empty(2)
        dist.reduce_scatter_tensor(out, value(rank, 2 * size), op=op)
        T.check(torch.allclose(out, expected(op, torch.float32, 2 * size)[2 * rank:2 * rank + 2]),
                "reduce_scatter_tensor %s" % op)
    out = torch.empty(2, dtype=torch.int32)
    dist.reduce_scatter_tensor(out, value(rank, 2 * size, torch.int32), op=R.BXOR)
    T.check(torch.equal(out, expected(R.BXOR, torch.int32, 2 * size)[2 * rank:2 * rank + 2]),
            "reduce_scatter_tensor BXOR int32")


def test_alltoall():
    for dtype in [torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool]:
        inp = torch.stack([value(rank * size + d, 3, dtype) for d in range(size)])
        out = torch.empty_like(inp)
        dist.all_to_all_single(out, inp)
        T.check(all(torch.equal(out[s], value(s * size + rank, 3, dtype)) for s in range(size)),
                "all_to_all_single even %s" % dtype)
    # uneven: rank s sends (s + d) % 3 + (d == 0) rows of 2 to rank d, some of them empty
    def rows(s, d):
        return (s + d) % 3 + (1 if d == 0 else 0)
    in_splits = [rows(rank, d) for d in range(size)]
    out_splits = [rows(s, rank) for s in range(size)]
    inp = torch.cat([torch.full((in_splits[d], 2), float(rank * 10 + d)) for d in range(size)])
    out = torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    exp = torch.cat([torch.full((out_splits[s], 2), float(s * 10 + rank)) for s in range(size)])
    T.check(torch.equal(out, exp), "all_to_all_single uneven: %s" % out.tolist())
    # list form, different sizes per peer
    ins = [torch.full((d + 1,), float(rank * 10 + d)) for d in range(size)]
    outs = [torch.empty(rank + 1) for _ in range(size)]
    dist.all_to_all(outs, ins)
    T.check(all(torch.equal(outs[s], torch.full((rank + 1,), float(s * 10 + rank)))
                for s in range(size)), "all_to_all list")


def test_reduce_gather_scatter():
    for root in range(size):
        for op in (R.SUM, R.MAX):
            t = value(rank, dtype=torch.float64)
            before = t.clone()
            dist.reduce(t, dst=root, op=op)
            if rank == root:
                T.check(torch.equal(t, expected(op, torch.float64)), "reduce root %d" % root)
            else:
                T.check(torch.equal(t, before), "reduce: non-root %d keeps its tensor" % rank)
        t = value(rank, dtype=torch.int64)
        dist.reduce(t, dst=root, op=R.BOR)
        if rank == root:
            T.check(torch.equal(t, expected(R.BOR, torch.int64)), "reduce BOR int64 root %d" % root)
        out = [torch.empty(7, dtype=torch.int32) for _ in range(size)] if rank == root else None
        dist.gather(value(rank, dtype=torch.int32), out, dst=root)
        if rank == root:
            T.check(all(torch.equal(out[r], value(r, dtype=torch.int32)) for r in range(size)),
                    "gather root %d" % root)
        ins = [value(r, 5, salt=root) for r in range(size)] if rank == root else None
        out = torch.empty(5)
        dist.scatter(out, ins, src=root)
        T.check(torch.equal(out, value(rank, 5, salt=root)), "scatter root %d" % root)
    objs = [None] * size if rank == 0 else None
    dist.gather_object({"r": rank}, objs, dst=0)
    if rank == 0:
        T.check(objs == [{"r": r} for r in range(size)], "gather_object")


def test_p2p():
    if size < 2:
        return
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    for dtype in (torch.float32, torch.bfloat16, torch.int8, torch.bool):
        buf = torch.empty(6, dtype=dtype)
        if rank % 2 == 0:
            dist.send(value(rank, 6, dtype), dst=nxt)
            dist.recv(buf, src=prv)
        else:
            dist.recv(buf, src=prv)
            dist.send(value(rank, 6, dtype), dst=nxt)
        T.check(torch.equal(buf, value(prv, 6, dtype)), "send/recv ring %s" % dtype)
    # isend/irecv both ways at once, with tags
    a, b = torch.empty(3), torch.empty(3)
    reqs = [dist.irecv(a, src=prv, tag=1), dist.irecv(b, src=nxt, tag=2),
            dist.isend(torch.full((3,), float(rank)), dst=nxt, tag=1),
            dist.isend(torch.full((3,), float(rank + 100)), dst=prv, tag=2)]
    for r in reqs:
        r.wait()
    T.check(bool((a == prv).all() and (b == nxt + 100).all()), "isend/irecv tags")
    ops = [dist.P2POp(dist.isend, torch.full((4,), float(rank)), nxt),
           dist.P2POp(dist.irecv, a.new_empty(4), prv)]
    got = ops[1].tensor
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    T.check(bool((got == prv).all()), "batch_isend_irecv")
    # a large message
    big = torch.empty(1 << 20)
    if rank == 0:
        dist.send(torch.arange(1 << 20, dtype=torch.float32), dst=1)
    elif rank == 1:
        dist.recv(big, src=0)
        T.check(torch.equal(big, torch.arange(1 << 20, dtype=torch.float32)), "recv 4 MiB")
    # recv from any source: every other rank sends rank 0 its rank, small and
    # large (4 MiB), and rank 0 learns each sender from recv's return value
    if rank == 0:
        got = sorted(dist.recv(torch.empty(2), tag=5) for _ in range(size - 1))
        T.check(got == list(range(1, size)), "recv from any source: senders %s" % got)
        seen = []
        for _ in range(size - 1):
            big = torch.empty(1 << 20)
            w = dist.irecv(big, tag=6)
            w.wait()
            src = w._source_rank()
            seen.append(src)
            T.check(bool((big == src).all()), "irecv from any source: data of rank %d" % src)
        T.check(sorted(seen) == list(range(1, size)), "irecv from any source: senders %s" % seen)
    else:
        dist.send(torch.full((2,), float(rank)), dst=0, tag=5)
        dist.send(torch.full((1 << 20,), float(rank)), dst=0, tag=6)


def test_coalesced():
    a, b = value(rank, 3), value(rank, 9, salt=2)
    if hasattr(dist, "_coalescing_manager"):
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.all_reduce(a)
            dist.all_reduce(b)
        cm.wait()
        T.check(torch.equal(a, expected(R.SUM, torch.float32, 3)), "coalescing manager a")
        xs = [value(r, 9, salt=2) for r in range(size)]
        T.check(torch.equal(b, sum(xs)), "coalescing manager b")
    if hasattr(dist, "all_reduce_coalesced"):
        a, b = value(rank, 3), value(rank, 4).double()
        try:
            dist.all_reduce_coalesced([a, value(rank, 5)], op=R.MAX)
            T.check(torch.equal(a, expected(R.MAX, torch.float32, 3)), "all_reduce_coalesced")
        except (RuntimeError, ValueError) as e:
            if "deprecated" not in str(e).lower() and "removed" not in str(e).lower():
                raise


def test_async_and_futures():
    ts = [torch.full((1000,), float(rank + i)) for i in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    futs = [w.get_future().then(lambda f: f.value()[0] * 2) for w in works]
    base = size * (size - 1) / 2
    vals = [f.wait() for f in futs]
    T.check(all(bool((v == 2 * (base + i * size)).all()) for i, v in enumerate(vals)),
            "chained futures")
    T.check(all(w.is_completed() for w in works), "works completed once futures are")
    w = dist.broadcast(torch.zeros(3), src=0, async_op=True)
    T.check(w.wait(), "wait() returns True")
    # a completion that nobody waits for still completes the future
    t = torch.ones(5)
    fut = dist.all_reduce(t, async_op=True).get_future()
    done = torch.futures.collect_all([fut]).wait()
    T.check(bool((done[0].value()[0] == size).all()), "collect_all on a future")


def test_subgroups():
    if size < 2:
        g = dist.new_group([0])
        t = torch.ones(2)
        dist.all_reduce(t, group=g)
        T.check(torch.equal(t, torch.ones(2)), "one-rank group")
        return
    pair = dist.new_group([0, size - 1])
    evens = dist.new_group([r for r in range(size) if r % 2 == 0])
    odds = dist.new_group([r for r in range(size) if r % 2 == 1])
    t = torch.full((4,), float(rank + 1))
    if rank in (0, size - 1):
        dist.all_reduce(t, group=pair)
        T.check(bool((t == 1 + size).all()), "pair group allreduce")
        T.check(dist.get_world_size(pair) == 2, "pair group size")
    mine = evens if rank % 2 == 0 else odds
    members = [r for r in range(size) if r % 2 == rank % 2]
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t, group=mine)
    T.check(bool((t == sum(r + 1 for r in members)).all()), "even/odd group allreduce")
    out = [torch.empty(2) for _ in members]
    dist.all_gather(out, torch.full((2,), float(rank)), group=mine)
    T.check(all(bool((o == r).all()) for o, r in zip(out, members)), "group all_gather")
    b = torch.full((2,), float(rank))
    dist.broadcast(b, src=members[-1], group=mine)   # a global rank, as torch takes it
    T.check(bool((b == members[-1]).all()), "group broadcast from a global rank")
    dist.barrier(group=mine)
    dist.destroy_process_group(pair)
    # split_group: the ranks in reverse order in one split, rank 0 in none
    # (where torch has it, 2.6 on); positions follow the list given
    if hasattr(dist, "split_group") and size >= 3:
        part = list(range(size - 1, 0, -1))
        g = dist.split_group(split_ranks=[part])
        if rank == 0:
            T.check(g is None or g == dist.GroupMember.NON_GROUP_MEMBER, "split_group: rank 0 in none")
        else:
            T.check(dist.get_group_rank(g, rank) == part.index(rank), "split_group: rank order")
            t = torch.full((2,), float(rank))
            dist.all_reduce(t, group=g)
            T.check(bool((t == sum(part)).all()), "split_group allreduce: %s" % t.tolist())
            src = torch.full((3,), float(rank))
            dist.broadcast(src, src=part[0], group=g)
            T.check(bool((src == part[0]).all()), "split_group broadcast")
            dist.destroy_process_group(g)
    # the world still works after a group went away
    t = torch.ones(3)
    dist.all_reduce(t)
    T.check(bool((t == size).all()), "world after destroying a group")


for fn in (test_allreduce, test_broadcast, test_allgather, test_reduce_scatter, test_alltoall,
           test_reduce_gather_scatter, test_p2p, test_coalesced, test_async_and_futures,
           test_subgroups):
    T.run(fn)
    dist.barrier()
dist.destroy_process_group()
T.finish()
