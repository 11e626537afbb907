"""Every collective of loom (NumPy) on every element type, values checked
against NumPy's own reduction of what each rank contributed. Run under
loomrun -np N (or alone)."""
import numpy as np

import loom
from common import Tally

loom.init()
R, N = loom.rank(), loom.size()
T = Tally(R)

DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64, np.float16, np.float32,
          np.float64, np.bool_]
try:
    import ml_dtypes
    DTYPES.append(ml_dtypes.bfloat16)
except ImportError:
    pass


def data(r, dt, k=7, op=None):
    """Rank r's contribution: small values that every type holds exactly."""
    base = (np.arange(k) % 3) + 1 if op == loom.Product else (np.arange(k) % 5) + r + 1
    if np.dtype(dt) == np.bool_:
        return ((np.arange(k) + r) % 2).astype(np.bool_)
    return base.astype(dt)


def reference(op, arrays):
    wide = [a.astype(np.float64) for a in arrays]
    if op == loom.Sum or op == loom.Average:
        s = np.sum(wide, axis=0)
        if op == loom.Average:
            s = s / len(arrays)
            if arrays[0].dtype.kind in "iu":
                s = np.trunc(s)
        return s
    if op == loom.Min:
        return np.min(wide, axis=0)
    if op == loom.Max:
        return np.max(wide, axis=0)
    return np.prod(wide, axis=0)


def close(got, want, dt):
    got = np.asarray(got).astype(np.float64)
    if np.dtype(dt).kind == "f" or np.dtype(dt).name == "bfloat16":
        return np.allclose(got, want, rtol=1e-2, atol=1e-2)
    return np.array_equal(got, want)


def test_allreduce():
    for dt in DTYPES:
        for op in (loom.Sum, loom.Min, loom.Max, loom.Product, loom.Average):
            if np.dtype(dt) == np.bool_ and op in (loom.Product, loom.Average):
                continue
            mine = data(R, dt, op=op)
            want = reference(op, [data(r, dt, op=op) for r in range(N)])
            if np.dtype(dt) == np.bool_:
                want = want.astype(bool).astype(np.float64) if op == loom.Sum else want
            got = loom.allreduce(mine, op=op)
            T.check(close(got, want, dt) if np.dtype(dt) != np.bool_ or op != loom.Sum
                    else np.array_equal(got.view(np.uint8), np.sum([data(r, dt).view(np.uint8)
                                                                    for r in range(N)], axis=0)),
                    "allreduce %s op %d: %s != %s" % (np.dtype(dt).name, op, got, want))
            T.check(np.array_equal(mine, data(R, dt, op=op)), "allreduce changed its input")
            buf = mine.copy()
            out = loom.allreduce_(buf, op=op)
            T.check(out is buf and np.array_equal(buf, got), "allreduce_ %s" % np.dtype(dt).name)
    x = np.full(5, float(R + 1), dtype=np.float32)
    got = loom.allreduce(x, op=loom.Sum, prescale_factor=2.0, postscale_factor=0.5)
    T.check(np.allclose(got, N * (N + 1) / 2), "allreduce scale factors: %s" % got)
    g = loom.grouped_allreduce([x, x * 2], op=loom.Sum)
    T.check(np.allclose(g[1], N * (N + 1)), "grouped_allreduce")
    T.check(loom.allreduce(np.zeros(0, np.float32)).size == 0, "empty allreduce")


def test_allgather():
    for dt in DTYPES:
        mine = np.stack([data(R, dt, 3)] * (R + 1))     # R+1 rows: first dims differ by rank
        got = loom.allgather(mine)
        want = np.concatenate([np.stack([data(r, dt, 3)] * (r + 1)) for r in range(N)])
        T.check(got.dtype == mine.dtype and got.shape == want.shape and close(got, want.astype(np.float64), dt),
                "allgather %s" % np.dtype(dt).name)


def test_broadcast():
    for dt in DTYPES:
        for root in range(N):
            mine = data(R, dt)
            got = loom.broadcast(mine, root)
            T.check(np.array_equal(got, data(root, dt)), "broadcast %s root %d" % (np.dtype(dt).name, root))
            loom.broadcast_(mine, root)
            T.check(np.array_equal(mine, data(root, dt)), "broadcast_ %s" % np.dtype(dt).name)


def test_alltoall():
    for dt in DTYPES:
        rows = np.stack([data(R, dt, 2) + (np.zeros(2, dt) if np.dtype(dt) == np.bool_ else dt(i))
                         for i in range(N)])
        got = loom.alltoall(rows)
        want = np.stack([np.stack([data(r, dt, 2) + (np.zeros(2, dt) if np.dtype(dt) == np.bool_ else dt(i))
                                   for i in range(N)])[R] for r in range(N)])
        T.check(np.array_equal(got, want), "alltoall %s" % np.dtype(dt).name)
    # uneven: rank r sends i+1 rows to rank i, each row holding (sender, receiver)
    send = np.concatenate([np.full((i + 1, 2), [R, i], dtype=np.int64) for i in range(N)])
    got, rsplits = loom.alltoall(send, splits=[i + 1 for i in range(N)])
    want = np.concatenate([np.full((R + 1, 2), [r, R], dtype=np.int64) for r in range(N)])
    T.check(np.array_equal(got, want) and list(rsplits) == [R + 1] * N, "alltoall splits")


def test_reducescatter():
    for dt in (np.int32, np.float32, np.float64, np.int64):
        for rows in (N * 2, N * 2 + 1):
            mine = np.stack([data(R, dt, 3)] * rows)
            full = reference(loom.Sum, [np.stack([data(r, dt, 3)] * rows) for r in range(N)])
            got = loom.reducescatter(mine, op=loom.Sum)
            base, extra = divmod(rows, N)
            start = R * base + min(R, extra)
            share = base + (1 if R < extra else 0)
            T.check(close(got, full[start:start + share], dt), "reducescatter %s rows %d" % (np.dtype(dt).name, rows))


def test_objects_and_sets():
    objs = loom.allgather_object({"rank": R})
    T.check(objs == [{"rank": r} for r in range(N)], "allgather_object %s" % objs)
    T.check(loom.broadcast_object(("hi", R), root_rank=N - 1) == ("hi", N - 1), "broadcast_object")
    loom.barrier()
    T.check(loom.join() == N - 1, "join")
    evens = loom.add_process_set([r for r in range(N) if r % 2 == 0])
    if evens.included():
        got = loom.allreduce(np.ones(3, np.float32), op=loom.Sum, process_set=evens)
        T.check(np.allclose(got, evens.size()), "process set allreduce")
    else:
        try:
            loom.allreduce(np.ones(3, np.float32), process_set=evens)
            T.check(False, "a non-member used a process set")
        except ValueError:
            T.check(True, "")
    loom.remove_process_set(evens)


def test_errors():
    try:
        loom.broadcast(np.ones(2, np.float32), N + 5)
        T.check(False, "bad root accepted")
    except loom.LoomError as e:
        T.check("root" in str(e) and e.status == loom._loom.ERR_INVALID_ARG, "bad root message: %s" % e)
    try:
        loom.allreduce(np.ones(2, np.complex64))
        T.check(False, "complex64 accepted")
    except TypeError as e:
        T.check("complex64" in str(e), "complex64 message: %s" % e)
    a = np.ones(4, np.float32)
    addr, nbytes, dt = loom._loom.buffer_info(a)
    T.check(addr == a.ctypes.data and nbytes == 16 and dt == loom._loom.FLOAT32, "zero-copy buffer")
    T.check(not loom.mpi_built() and not loom.nccl_built() and not loom.cuda_built() and loom.loom_built(),
            "predicates")


for t in (test_allreduce, test_allgather, test_broadcast, test_alltoall, test_reducescatter,
          test_objects_and_sets, test_errors):
    T.run(t)
loom.shutdown()
T.finish()
