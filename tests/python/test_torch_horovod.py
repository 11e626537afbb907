"""loom.torch's Horovod parity (issue 15): the engine survives every kind of
failing collective; the gradients of every collective; grouped allgather and
reducescatter; sparse allreduce and sparse gradients; int16; Adasum against
its formula; the timeline API; Horovod's
scaling; process-set roots as global ranks; DistributedOptimizer outside its
set and without named_parameters; broadcast_optimizer_state on a new
optimizer; SyncBatchNorm on the CPU; the response cache, unnamed calls and
the fast path of small synchronous calls; Horovod's variables
from loomrun. Run under loomrun -np N (N = 1, 2, 3)."""
import os
import time

import numpy as np
import torch

import loom
import loom.torch as hvd
from common import Tally

hvd.init()
R, N = hvd.rank(), hvd.size()
T = Tally(R)


def good_call(what):
    """After a failure: a fresh collective must succeed."""
    got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="good.after.%s" % what)
    T.check(torch.equal(got, torch.full((3,), float(N))), "the call after %s: %s" % (what, got))


def expect_error(what, fn, kinds=(RuntimeError,)):
    try:
        fn()
        T.check(False, "%s did not fail" % what)
        return
    except kinds as e:
        T.check(not isinstance(e, hvd.HorovodInternalError),
                "%s raised HorovodInternalError (%s): that is for lost peers" % (what, e))
    good_call(what)


def test_failures_then_good_calls():
    """Every kind of failure fails its own handle only; the engine goes on."""
    # Refused at submission, on every rank: unsupported type, bad splits,
    # Adasum where it has no meaning, a scalar to reducescatter.
    expect_error("unsupported type", lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64)),
                 (TypeError, RuntimeError))
    expect_error("bad alltoall splits", lambda: hvd.alltoall(torch.ones(N + 1), splits=[N + 5] * N),
                 (ValueError, RuntimeError))
    expect_error("reducescatter Adasum", lambda: hvd.reducescatter(torch.ones(2 * N), op=hvd.Adasum))
    expect_error("reducescatter scalar", lambda: hvd.reducescatter(torch.tensor(1.0)),
                 (ValueError, RuntimeError))
    # A root outside the set: found from the metadata, failed on every rank.
    expect_error("broadcast root out of range", lambda: hvd.broadcast(torch.ones(2), root_rank=N + 3))
    if N == 1:
        return
    expect_error("shape mismatch", lambda: hvd.allreduce(torch.ones(2 + R), name="bad.shape"))
    expect_error("dtype mismatch", lambda: hvd.allreduce(
        torch.ones(2, dtype=torch.int32 if R % 2 else torch.float32), name="bad.dtype"))
    expect_error("op mismatch", lambda: hvd.allreduce(
        torch.ones(2), op=hvd.Sum if R % 2 else hvd.Max, name="bad.op"))
    expect_error("rank mismatch (same count)", lambda: hvd.allreduce(
        torch.ones(6).reshape(2, 3) if R == 0 else torch.ones(6).reshape(3, 2), name="bad.rank"))
    expect_error("allgather trailing dims", lambda: hvd.allgather(torch.ones(2, 1 + R), name="bad.ag"))
    expect_error("different roots", lambda: hvd.broadcast(torch.ones(2), root_rank=R, name="bad.root"))
    expect_error("kind mismatch", lambda: (hvd.allreduce if R == 0 else hvd.allgather)(
        torch.ones(2), name="bad.kind"))
    expect_error("names nobody else submits", lambda: hvd.allreduce(torch.ones(2), name="only.%d" % R))
    # A duplicate name: refused at once with ValueError; the pending one still completes.
    # Each rank's "dup.R" stays pending until the others submit it, which they do
    # only after the barrier: the refusal cannot race its completion.
    h = hvd.allreduce_async(torch.ones(2), name="dup.%d" % R, op=hvd.Sum)
    try:
        hvd.allreduce_async(torch.ones(2), name="dup.%d" % R)
        T.check(False, "duplicate name accepted")
    except ValueError:
        pass
    hvd.barrier()
    others = [hvd.allreduce_async(torch.ones(2), name="dup.%d" % q, op=hvd.Sum)
              for q in range(N) if q != R]
    T.check(all(torch.equal(hvd.synchronize(x), torch.full((2,), float(N))) for x in [h] + others),
            "the first of a duplicate")
    good_call("duplicate name")
    # add_process_set on one rank while the others are in a collective: it is
    # negotiated like one, so both sides fail after LOOM_STALL_TIMEOUT (not at
    # LOOM_TIMEOUT, with the communicator lost) and the next call succeeds.
    if N > 1:
        t0 = time.monotonic()
        expect_error("add_process_set against a barrier",
                     (lambda: hvd.add_process_set(list(range(N)))) if R == 0 else hvd.barrier)
        T.check(time.monotonic() - t0 < 60, "the mismatch took %.0f s" % (time.monotonic() - t0))
    # A finished collective's name stays taken until synchronize takes its
    # result; else whether a quick second submission is refused would depend
    # on how fast the first one ran (it raced in Horovod's own tests).
    h = hvd.allreduce_async(torch.ones(2), name="taken", op=hvd.Sum)
    while not hvd.poll(h):
        pass
    try:
        hvd.allreduce_async(torch.ones(2), name="taken", op=hvd.Sum)
        T.check(False, "the name of a finished, unsynchronized collective was reused")
    except ValueError as e:
        T.check("synchronize" in str(e), "why the name is taken: %s" % e)
    T.check(torch.equal(hvd.synchronize(h), torch.full((2,), float(N))), "the first 'taken'")
    T.check(torch.equal(hvd.allreduce(torch.ones(2), name="taken", op=hvd.Sum), torch.full((2,), float(N))),
            "the name is free once synchronized")
    if N > 1:
        # A group whose first member fails: synchronize still takes every
        # member, so the group's names are free for the next try.
        expect_error("a group's first member", lambda: hvd.grouped_allreduce_(
            [torch.ones(1 + R), torch.ones(2)], name="grp.retry", op=hvd.Sum))
        got = hvd.grouped_allreduce_([torch.ones(2), torch.ones(2)], name="grp.retry", op=hvd.Sum)
        T.check(all(torch.equal(g, torch.full((2,), float(N))) for g in got), "the group again: %s" % got)
    # Several failures in flight together with good calls: only the bad ones fail.
    hs = [hvd.allreduce_async(torch.ones(2), name="mix.good.%d" % i, op=hvd.Sum) for i in range(3)]
    bad = hvd.allreduce_async(torch.ones(1 + R), name="mix.bad")
    for x in hs:
        T.check(torch.equal(hvd.synchronize(x), torch.full((2,), float(N))), "good call among bad ones")
    try:
        hvd.synchronize(bad)
        T.check(False, "mix.bad completed")
    except RuntimeError:
        pass
    good_call("mixed")
    # While a rank has joined, anything but allreduce fails at once, whatever
    # the unnamed counts of the ranks (which then differ); then join completes.
    for first in range(N):
        if R == first:
            last = hvd.join()
        else:
            try:
                hvd.allgather(torch.ones(2))
                T.check(False, "allgather ran while rank %d had joined" % first)
            except RuntimeError as e:
                T.check("joined" in str(e), "join message: %s" % e)
            last = hvd.join()
        T.check(last != first, "join returned the first rank to join (%d)" % first)
        T.check(hvd.allgather_object(last, name="join.last") == [last] * N, "join's value differs by rank")
    hvd.barrier()
    good_call("join")


def test_int16_and_scaling():
    for op in (hvd.Sum, hvd.Min, hvd.Max, hvd.Average, hvd.Product):
        mine = torch.arange(5, dtype=torch.int16) % 3 + R + 1
        want = torch.stack([(torch.arange(5) % 3 + r + 1).double() for r in range(N)])
        want = {hvd.Sum: want.sum(0), hvd.Min: want.min(0).values, hvd.Max: want.max(0).values,
                hvd.Average: (want.sum(0) / N).trunc(), hvd.Product: want.prod(0)}[op]
        got = hvd.allreduce(mine, op=op)
        T.check(got.dtype == torch.int16 and torch.equal(got.double(), want), "int16 op %s: %s" % (op, got))
    u = loom.allreduce(np.arange(4, dtype=np.uint16) + R, op=loom.Sum)
    T.check(u.dtype == np.uint16 and u.tolist() == [sum(i + r for r in range(N)) for i in range(4)],
            "uint16 (NumPy): %s" % u)
    T.check(hvd.allgather(torch.tensor([R], dtype=torch.int16)).tolist() == list(range(N)), "int16 allgather")
    # Integers scale in float64 and truncate back; float16 scales in float32.
    t = torch.tensor([7, -9, 100], dtype=torch.int32)
    got = hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.37)
    want = ((torch.tensor(0.37, dtype=torch.float64) * t.double()).to(torch.int32) * N)
    T.check(torch.equal(got, want), "int prescale: %s != %s" % (got, want))
    got = hvd.allreduce(t, op=hvd.Sum, postscale_factor=0.37)
    want = (torch.tensor(0.37, dtype=torch.float64) * (t * N).double()).to(torch.int32)
    T.check(torch.equal(got, want), "int postscale: %s != %s" % (got, want))
    h = torch.tensor([0.1, 3.3, -7.7], dtype=torch.float16)
    got = hvd.allreduce(h, op=hvd.Sum, prescale_factor=0.3)
    want = (torch.tensor(0.3, dtype=torch.float32) * h.float()).half().float() * N
    T.check(torch.equal(got.float(), want.half().float()), "float16 prescale: %s != %s" % (got, want))
    rs = hvd.reducescatter(torch.full((2 * N,), 5, dtype=torch.int64), op=hvd.Sum, prescale_factor=0.5)
    T.check(torch.equal(rs, torch.full((2,), 2 * N, dtype=torch.int64)), "int reducescatter prescale: %s" % rs)


def test_gradients():
    # allgather: the average of the gathered gradient, this rank's rows.
    x = torch.full((R + 1, 2), float(R), requires_grad=True)
    y = hvd.allgather(x)
    w = torch.arange(y.shape[0] * 2, dtype=torch.float32).reshape(y.shape) * (R + 1)
    (y * w).sum().backward()
    start = sum(r + 1 for r in range(R))
    wsum = sum(torch.arange(y.shape[0] * 2, dtype=torch.float32).reshape(y.shape) * (r + 1) for r in range(N))
    T.check(torch.allclose(x.grad, (wsum / N)[start:start + R + 1]), "allgather grad %s" % x.grad)
    # broadcast: the average on the root, zeros elsewhere.
    x = torch.ones(3, requires_grad=True)
    (hvd.broadcast(x, root_rank=N - 1) * (R + 1)).sum().backward()
    want = torch.full((3,), sum(r + 1 for r in range(N)) / N) if R == N - 1 else torch.zeros(3)
    T.check(torch.allclose(x.grad, want), "broadcast grad %s" % x.grad)
    # alltoall: the gradient travels back.
    x = torch.arange(2 * N, dtype=torch.float32, requires_grad=True)
    out = hvd.alltoall(x)
    (out * (R + 1)).sum().backward()
    T.check(torch.allclose(x.grad, torch.cat([torch.full((2,), float(r + 1)) for r in range(N)])),
            "alltoall grad %s" % x.grad)
    x = torch.ones(N, requires_grad=True)
    out, splits = hvd.alltoall(x, splits=torch.ones(N, dtype=torch.int32))
    out.sum().backward()
    T.check(torch.equal(x.grad, torch.ones(N)) and splits.tolist() == [1] * N, "alltoall splits grad")
    # reducescatter (Average): the allgather of the gradient.
    x = torch.ones(2 * N, requires_grad=True)
    (hvd.reducescatter(x) * (R + 1)).sum().backward()
    want = torch.cat([torch.full((2,), float(r + 1)) for r in range(N)])
    T.check(torch.allclose(x.grad, want), "reducescatter grad %s" % x.grad)
    # grouped: each member as its single form.
    a, b = torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)
    ra, rb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    (ra.sum() + 2 * rb.sum()).backward()
    T.check(torch.equal(a.grad, torch.full((2,), float(N))) and torch.equal(b.grad, torch.full((3,), 2.0 * N)),
            "grouped_allreduce grad")
    a, b = torch.ones(1, requires_grad=True), torch.ones(2, 2, requires_grad=True)
    ga, gb = hvd.grouped_allgather([a, b])
    T.check(ga.shape == (N,) and gb.shape == (2 * N, 2), "grouped_allgather shapes")
    (ga.sum() + gb.sum()).backward()
    T.check(torch.allclose(a.grad, torch.ones(1)) and torch.allclose(b.grad, torch.ones(2, 2)),
            "grouped_allgather grad")
    a = torch.ones(N, requires_grad=True)
    b = torch.ones(2 * N, 3, requires_grad=True)
    sa, sb = hvd.grouped_reducescatter([a, b], op=hvd.Sum)
    T.check(torch.equal(sa, torch.full((1,), float(N))) and torch.equal(sb, torch.full((2, 3), float(N))),
            "grouped_reducescatter values")
    (sa.sum() + sb.sum()).backward()
    T.check(torch.equal(a.grad, torch.full((N,), float(N))), "grouped_reducescatter grad (Sum: x size)")


def test_sparse():
    torch.manual_seed(5 + R)
    t = torch.rand(7, 4)
    t[t < 0.7] = 0
    h = hvd.sparse_allreduce_async(t.to_sparse(), name="sp", op=hvd.Average)
    got = h().to_dense()
    T.check(torch.allclose(got, hvd.allreduce(t, name="sp.dense")), "sparse_allreduce_async")
    for dense in (False, True):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 3, sparse=True)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=1.0),
                                       named_parameters=emb.named_parameters(), sparse_as_dense=dense)
        before = emb.weight.detach().clone()
        emb(torch.tensor([R % 10, 9])).sum().backward()
        opt.step()
        step = before - emb.weight.detach()
        want = torch.zeros(10, 3)
        for r in range(N):
            want[r % 10] += 1.0 / N
            want[9] += 1.0 / N
        T.check(torch.allclose(step, want), "sparse gradient step (sparse_as_dense=%s): %s" % (dense, step))


def test_process_sets_and_optimizer():
    odd = hvd.add_process_set([r for r in range(N) if r % 2 == 1])
    if odd.included():
        got = hvd.broadcast(torch.tensor([float(R)]), root_rank=odd.ranks[-1], process_set=odd)
        T.check(got.item() == odd.ranks[-1], "process-set root is a global rank: %s" % got)
        obj = hvd.broadcast_object({"r": R}, root_rank=odd.ranks[0], process_set=odd)
        T.check(obj == {"r": odd.ranks[0]}, "broadcast_object root in a set: %s" % obj)
    # Outside the set, DistributedOptimizer takes a local step.
    torch.manual_seed(R)
    model = torch.nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), process_set=odd)
    before = model.weight.detach().clone()
    model(torch.ones(2, 3)).sum().backward()
    grad = model.weight.grad.clone()
    opt.step()
    if not odd.included():
        T.check(torch.allclose(model.weight.detach(), before - 0.1 * grad), "local step outside the set")
    hvd.remove_process_set(odd)
    # No named_parameters and two param groups: names unique and the same everywhere.
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([{"params": net[0].parameters()},
                                                    {"params": net[1].parameters()}], lr=0.1))
    names = set(opt._parameter_names.values())
    T.check(len(names) == 4, "generated names collide: %s" % names)
    T.check(all(x == names for x in hvd.allgather_object(names)), "generated names differ by rank")
    # broadcast_optimizer_state on a new optimizer: zero gradients, state from the root.
    model = torch.nn.Linear(2, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    T.check(model.weight.grad is not None and not model.weight.grad.any(), "zero grads after the state broadcast")


def test_sync_batch_norm():
    torch.manual_seed(11)
    full = torch.randn(2 * N, 4, 3)
    mine = full[2 * R:2 * R + 2].clone().requires_grad_()
    ref_in = full.clone().requires_grad_()
    sbn, bn = hvd.SyncBatchNorm(4), torch.nn.BatchNorm1d(4)
    out, ref = sbn(mine), bn(ref_in)
    T.check(torch.allclose(out, ref[2 * R:2 * R + 2], atol=1e-5), "SyncBatchNorm output")
    T.check(torch.allclose(sbn.running_mean, bn.running_mean, atol=1e-6) and
            torch.allclose(sbn.running_var, bn.running_var, atol=1e-5), "SyncBatchNorm running stats")
    out.sum().backward()
    ref.sum().backward()
    T.check(torch.allclose(mine.grad, ref_in.grad[2 * R:2 * R + 2], atol=1e-5), "SyncBatchNorm input grad")
    T.check(torch.allclose(hvd.allreduce(sbn.weight.grad, op=hvd.Sum), bn.weight.grad, atol=1e-4),
            "SyncBatchNorm weight grad")
    sbn.eval()
    bn.eval()
    T.check(torch.allclose(sbn(mine), bn(mine), atol=1e-5), "SyncBatchNorm eval")


def test_cache_and_fusion():
    before = hvd._fusion_stats()
    t = torch.ones(2)
    for _ in range(20):
        hvd.allreduce_(t, op=hvd.Max, name="cached.one")
    after = hvd._fusion_stats()
    T.check(after["cached_rounds"] - before.get("cached_rounds", 0) >= 15,
            "repeated names did not skip negotiation: %s" % after)
    # Tensors submitted together still fuse (a group, and async calls in a burst).
    before = after
    outs = hvd.grouped_allreduce([torch.full((5,), float(i)) for i in range(8)], op=hvd.Sum, name="g")
    T.check(all(torch.equal(o, torch.full((5,), float(i * N))) for i, o in enumerate(outs)), "group values")
    after = hvd._fusion_stats()
    T.check(after["fused_calls"] > before["fused_calls"], "a group was not fused: %s" % after)


def test_small_calls_fast_path():
    """Synchronous small calls, unnamed too, run from the response cache (a
    cached round, one C call for a lone allreduce) with Horovod's semantics:
    unnamed calls match by their call count, not by their shape; ranks may
    submit in different orders; tensors submitted together still fuse; a
    failing call is followed by good ones on the fast path."""
    eng = hvd._engine_for(None)
    stats = hvd._fusion_stats
    t = torch.arange(2.0) + R
    want = (torch.arange(2.0) * N + N * (N - 1) / 2)
    before = stats()
    for i in range(20):
        got = hvd.allreduce(t, op=hvd.Sum)
        T.check(torch.equal(got, want), "unnamed allreduce %d: %s" % (i, got))
    after = stats()
    if N > 1:
        T.check(after["cached_rounds"] - before["cached_rounds"] >= 15,
                "unnamed calls did not skip negotiation: %s then %s" % (before, after))
    # Scaling and every op on the fast path.
    got = hvd.allreduce(t, op=hvd.Sum, postscale_factor=0.5)
    T.check(torch.equal(got, want * 0.5), "unnamed postscale: %s" % got)
    got = hvd.allreduce(t)   # Average
    T.check(torch.allclose(got, want / N), "unnamed average: %s" % got)
    for _ in range(3):
        got = hvd.allreduce(t, op=hvd.Max)
    T.check(torch.equal(got, torch.arange(2.0) + N - 1), "unnamed max: %s" % got)
    # A named and an unnamed call submitted in opposite orders on odd ranks,
    # warm (cached) and over several rounds: each still meets its partner.
    for i in range(5):
        a, u = torch.full((3,), float(R)), torch.full((2,), 1.0)
        if R % 2:
            hu = hvd.allreduce_async(u, op=hvd.Sum)
            ha = hvd.allreduce_async(a, op=hvd.Sum, name="order.a")
        else:
            ha = hvd.allreduce_async(a, op=hvd.Sum, name="order.a")
            hu = hvd.allreduce_async(u, op=hvd.Sum)
        ga, gu = hvd.synchronize(ha), hvd.synchronize(hu)
        T.check(torch.equal(ga, torch.full((3,), N * (N - 1) / 2.0)) and torch.equal(gu, torch.full((2,), float(N))),
                "opposite orders, round %d: %s %s" % (i, ga, gu))
    # Unnamed calls of one shape submitted together (cached) still fuse.
    before = stats()
    hs = [hvd.allreduce_async(torch.full((2,), float(i)), op=hvd.Sum) for i in range(6)]
    outs = [hvd.synchronize(h) for h in hs]
    T.check(all(torch.equal(o, torch.full((2,), float(i * N))) for i, o in enumerate(outs)), "burst values")
    after = stats()
    if N > 1:
        T.check(after["fused_calls"] > before["fused_calls"], "a burst of unnamed calls was not fused: %s" % after)
    if N == 1:
        return
    # Unnamed calls are matched by count: shapes both cached, but different on
    # odd ranks for the same count, fail on every rank...
    hvd.allreduce(torch.ones(3))
    expect_error("unnamed shape mismatch (both shapes cached)", lambda: hvd.allreduce(torch.ones(2 + R % 2)))
    # ... and the same shape under different counts must not run together.
    extra = eng.auto_name("allreduce") if R == 1 else None   # rank 1 counts one call ahead
    expect_error("unnamed calls of different counts", lambda: hvd.allreduce(t, op=hvd.Sum))
    if R != 1:
        eng.auto_name("allreduce")   # in step again
    T.check(extra is None or extra.startswith("allreduce.noname."), "auto_name: %s" % extra)
    before = stats()
    for _ in range(5):
        got = hvd.allreduce(t, op=hvd.Sum)
    T.check(torch.equal(got, want), "unnamed allreduce after the failures: %s" % got)
    T.check(stats()["cached_rounds"] - before["cached_rounds"] >= 3,
            "the fast path after the failures: %s then %s" % (before, stats()))


def test_adasum():
    """op=Adasum against the formula: the tree of adasum(a, b) = (1 - a.b/2|a|^2) a
    + (1 - a.b/2|b|^2) b over every rank's vector, computed here in float64."""
    from loom import _adasum

    def mine(r, n=37):
        g = torch.Generator().manual_seed(100 + r)
        return torch.randn(n, generator=g, dtype=torch.float64)
    vs = [mine(r).numpy() for r in range(N)]
    # The formula written out, independent of _adasum.combine.
    def formula(a, b):
        ab, aa, bb = np.dot(a, b), np.dot(a, a), np.dot(b, b)
        return (1 - ab / (2 * aa)) * a + (1 - ab / (2 * bb)) * b
    p = 1 << (N.bit_length() - 1)
    tree = list(vs)
    for i in range(N - p):
        tree[i] = formula(tree[i], tree[p + i])
    tree = tree[:p]
    while len(tree) > 1:
        tree = [formula(tree[i], tree[i + 1]) for i in range(0, len(tree), 2)]
    want = torch.from_numpy(tree[0])
    T.check(np.allclose(_adasum.reference(vs), tree[0]), "adasum reference tree")
    for dt, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5), (torch.float16, 2e-2)):
        got = hvd.allreduce(mine(R).to(dt), op=hvd.Adasum, name="adasum.%s" % dt)
        T.check(got.dtype == dt and torch.allclose(got.double(), want, rtol=tol, atol=tol),
                "Adasum %s: %s vs %s" % (dt, got[:4], want[:4]))
    T.check(all(torch.equal(x, hvd.allgather(got.unsqueeze(0))[0]) for x in hvd.allgather(got.unsqueeze(0))),
            "Adasum: the same bits on every rank")
    # Orthogonal vectors add up; parallel ones average.
    e = torch.zeros(max(N, 2), dtype=torch.float64)
    e[R] = R + 1.0
    T.check(torch.allclose(hvd.allreduce(e, op=hvd.Adasum), torch.arange(1.0, N + 1).double()
                           if N > 1 else e), "Adasum of orthogonal vectors is their sum")
    if N & (N - 1) == 0:
        par = torch.full((4,), float(R + 1), dtype=torch.float64)
        T.check(torch.allclose(hvd.allreduce(par, op=hvd.Adasum), torch.full((4,), (N + 1) / 2.0, dtype=torch.float64)),
                "Adasum of parallel vectors is their average")
    expect_error("Adasum on integers", lambda: hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum))
    # DistributedOptimizer(op=Adasum): SGD steps by the Adasum of the gradients.
    w = torch.nn.Parameter(torch.zeros(37, dtype=torch.float64))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)], op=hvd.Adasum)
    (w * mine(R)).sum().backward()
    opt.step()
    T.check(torch.allclose(-w.detach(), want, atol=1e-10), "DistributedOptimizer(op=Adasum) step")


def test_timeline():
    import json
    import tempfile
    d = hvd.broadcast_object(tempfile.mkdtemp() if R == 0 else None, 0, name="timeline.dir")
    path = os.path.join(d, "timeline.json")
    hvd.start_timeline(path, mark_cycles=True)
    hvd.allreduce(torch.ones(3), name="tl.allreduce")
    hvd.grouped_allreduce([torch.ones(3), torch.ones(4)], name="tl.group")
    hvd.allgather(torch.ones(2), name="tl.allgather")
    hvd.stop_timeline()
    mine = path if R == 0 else os.path.join(d, "timeline.%d.json" % R)
    events = json.load(open(mine))   # complete JSON once stopped
    names = {e["name"] for e in events}
    for want in ("NEGOTIATE", "ALLREDUCE", "ALLGATHER", "CYCLE_START", "MEMCPY_IN_FUSION_BUFFER"):
        T.check(want in names, "timeline lacks %s: %s" % (want, sorted(names)))
    T.check(any("tl.allreduce" in e.get("args", {}).get("tensors", []) for e in events),
            "timeline names the tensors")
    hvd.allreduce(torch.ones(1), name="tl.after")   # no timeline: nothing more written
    T.check(json.load(open(mine)) == events, "written after stop_timeline")
    hvd.barrier()
    os.remove(mine)


def test_object_warning():
    """Object collectives unpickle peers' bytes: a one-time warning unless
    LOOM_AUTH_KEY with LOOM_AUTH_MAC=full tags every payload."""
    import warnings
    from loom import _basics
    saved = {v: os.environ.pop(v, None) for v in ("LOOM_AUTH_KEY", "LOOM_AUTH_KEY_FILE", "LOOM_AUTH_MAC")}
    try:
        for env, want in (({}, True), ({"LOOM_AUTH_KEY": "k"}, False),
                          ({"LOOM_AUTH_KEY": "k", "LOOM_AUTH_MAC": "full"}, False),
                          ({"LOOM_AUTH_KEY_FILE": "/k", "LOOM_AUTH_MAC": "headers"}, True)):
            for v in saved:
                os.environ.pop(v, None)
            os.environ.update(env)
            _basics._objects_warned = False
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = hvd.broadcast_object({"x": 1} if R == 0 else None, 0, name="warn.%d" % len(env))
                hvd.allgather_object(R, name="warn.ag.%d" % len(env))
            texts = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
            T.check(got == {"x": 1}, "broadcast_object's value with %s" % env)
            T.check(len(texts) == (1 if want else 0) and all("trusted" in x for x in texts),
                    "with %s: %s" % (env or "no key", texts))
    finally:
        for v, val in saved.items():
            os.environ.pop(v, None)
            if val is not None:
                os.environ[v] = val


def test_horovod_variables():
    if "HOROVOD_RANK" not in os.environ:
        return   # run by hand: loomrun exports them
    T.check(int(os.environ["HOROVOD_RANK"]) == R and int(os.environ["HOROVOD_SIZE"]) == N and
            int(os.environ["HOROVOD_LOCAL_RANK"]) == hvd.local_rank() and
            int(os.environ["HOROVOD_LOCAL_SIZE"]) == hvd.local_size() and
            int(os.environ["HOROVOD_CROSS_SIZE"]) == hvd.cross_size(), "HOROVOD_* variables")


for fn in (test_failures_then_good_calls, test_int16_and_scaling, test_gradients, test_sparse,
           test_process_sets_and_optimizer, test_sync_batch_norm, test_cache_and_fusion,
           test_small_calls_fast_path, test_adasum,
           test_timeline, test_object_warning, test_horovod_variables):
    T.run(fn)
hvd.shutdown()
T.finish()
