"""The Horovod collectives on NumPy arrays, run synchronously on the calling
thread (the GIL is released inside every libloom call). Also exported by the
plain `loom` package. bfloat16 arrays work when ml_dtypes is installed."""
import pickle

import numpy as np

from . import _basics, _engine, _loom
from ._basics import (Adasum, Average, LoomError, Max, Min, Product, Sum, _set_comm, global_process_set)

try:
    import ml_dtypes
    _BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:   # NumPy alone has no bfloat16
    _BF16 = None

_DTYPES = {
    np.dtype(np.int8): _loom.INT8, np.dtype(np.uint8): _loom.UINT8,
    np.dtype(np.int16): _loom.INT16, np.dtype(np.uint16): _loom.UINT16,
    np.dtype(np.int32): _loom.INT32, np.dtype(np.uint32): _loom.UINT32,
    np.dtype(np.int64): _loom.INT64, np.dtype(np.uint64): _loom.UINT64,
    np.dtype(np.float16): _loom.FLOAT16, np.dtype(np.float32): _loom.FLOAT32,
    np.dtype(np.float64): _loom.FLOAT64, np.dtype(np.bool_): _loom.UINT8,
}
if _BF16 is not None:
    _DTYPES[_BF16] = _loom.BFLOAT16


def _view(a):
    """(object loom reads, loom dtype) for a C-contiguous array, without a copy."""
    dt = _DTYPES.get(a.dtype)
    if dt is None:
        raise TypeError("loom has no element type for numpy dtype %s" % a.dtype)
    if not a.flags.c_contiguous:
        raise ValueError("loom needs a C-contiguous array")
    # Types the buffer protocol cannot describe (bfloat16, bool) go as raw bytes.
    if a.dtype == _BF16:
        return a.view(np.uint16), dt
    if a.dtype == np.bool_:
        return a.view(np.uint8), dt
    return a, dt


def _op(op, what):
    if op is None or op == Adasum:
        raise ValueError("%s: Adasum is not implemented by Loom" % what)
    return op


def _scale(a, factor):
    if factor != 1.0:
        if a.dtype.kind in "iub":
            a[...] = (a * factor).astype(a.dtype)
        elif a.dtype.itemsize == 2:
            # float16 and bfloat16 in float32, as Horovod scales them on the CPU.
            a[...] = (a.astype(np.float32) * np.float32(factor)).astype(a.dtype)
        else:
            a *= factor


def allreduce_(array, op=Average, prescale_factor=1.0, postscale_factor=1.0, name=None,
               process_set=global_process_set):
    """Reduce array in place across the process set; returns it."""
    comm = _set_comm(process_set)
    _scale(array, prescale_factor)
    v, dt = _view(array)
    comm.allreduce(None, v, _op(op, "allreduce"), dtype=dt)
    _scale(array, postscale_factor)
    return array


def allreduce(array, op=Average, prescale_factor=1.0, postscale_factor=1.0, name=None,
              process_set=global_process_set, average=None):
    """A new array holding the reduction of array over the process set."""
    if average is not None:   # Horovod's deprecated spelling
        op = Average if average else Sum
    out = np.array(array, copy=True, order="C")
    return allreduce_(out, op, prescale_factor, postscale_factor, name, process_set)


def grouped_allreduce(arrays, op=Average, prescale_factor=1.0, postscale_factor=1.0, name=None,
                      process_set=global_process_set):
    return [allreduce(a, op, prescale_factor, postscale_factor, None, process_set) for a in arrays]


def grouped_allreduce_(arrays, op=Average, prescale_factor=1.0, postscale_factor=1.0, name=None,
                       process_set=global_process_set):
    return [allreduce_(a, op, prescale_factor, postscale_factor, None, process_set) for a in arrays]


def _rows(a):
    return int(np.prod(a.shape[1:], dtype=np.int64)) if a.ndim > 0 else 1


def allgather(array, name=None, process_set=global_process_set):
    """Concatenate every rank's array along the first dimension (which may differ by rank)."""
    comm = _set_comm(process_set)
    a = np.ascontiguousarray(array)
    if a.ndim == 0:
        a = a.reshape(1)
    first = np.array([a.shape[0]], dtype=np.int64)
    firsts = np.empty(comm.size, dtype=np.int64)
    comm.allgather(first, firsts)
    row = _rows(a)
    out = np.empty((int(firsts.sum()),) + a.shape[1:], dtype=a.dtype)
    v, dt = _view(a)
    ov, _ = _view(out)
    comm.allgatherv(v, ov, [int(f) * row for f in firsts], dtype=dt)
    return out


def broadcast_(array, root_rank, name=None, process_set=global_process_set):
    comm = _set_comm(process_set)
    v, dt = _view(array)
    comm.broadcast(v, root_rank, dtype=dt)
    return array


def broadcast(array, root_rank, name=None, process_set=global_process_set):
    return broadcast_(np.array(array, copy=True, order="C"), root_rank, name, process_set)


def alltoall(array, splits=None, name=None, process_set=global_process_set):
    """Scatter slices of the first dimension to the ranks (splits[i] rows to rank
    i; equal parts by default) and gather what they send here. Returns the
    array, or (array, received_splits) when splits is given."""
    comm = _set_comm(process_set)
    n = comm.size
    a = np.ascontiguousarray(array)
    if splits is None:
        if a.shape[0] % n:
            raise ValueError("alltoall: first dimension %d does not split over %d ranks" % (a.shape[0], n))
        send_splits = np.full(n, a.shape[0] // n, dtype=np.int64)
    else:
        send_splits = np.asarray(splits, dtype=np.int64).reshape(-1)
        if send_splits.size != n or send_splits.sum() != a.shape[0] or (send_splits < 0).any():
            raise ValueError("alltoall: splits %r do not divide %d rows over %d ranks"
                             % (list(send_splits), a.shape[0], n))
    recv_splits = np.empty(n, dtype=np.int64)
    comm.alltoall(send_splits, recv_splits)
    row = _rows(a)
    out = np.empty((int(recv_splits.sum()),) + a.shape[1:], dtype=a.dtype)
    v, dt = _view(a)
    ov, _ = _view(out)
    comm.alltoallv(v, [int(s) * row for s in send_splits], ov, [int(s) * row for s in recv_splits], dtype=dt)
    return out if splits is None else (out, recv_splits)


def _split_rows(rows, n):
    base, extra = divmod(rows, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def reducescatter(array, op=Average, name=None, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduce array over the ranks and keep this rank's share of the first
    dimension (as even as possible, the first ranks take one row more)."""
    comm = _set_comm(process_set)
    n = comm.size
    a = np.array(array, copy=True, order="C")
    _scale(a, prescale_factor)
    shares = _split_rows(a.shape[0], n)
    v, dt = _view(a)
    if shares[0] == shares[-1]:
        out = np.empty((shares[0],) + a.shape[1:], dtype=a.dtype)
        ov, _ = _view(out)
        comm.reduce_scatter(v, ov, _op(op, "reducescatter"), dtype=dt)
    else:
        comm.allreduce(None, v, _op(op, "reducescatter"), dtype=dt)
        start = sum(shares[:comm.rank])
        out = a[start:start + shares[comm.rank]].copy()
    _scale(out, postscale_factor)
    return out


def barrier(process_set=global_process_set):
    _set_comm(process_set).barrier()


def join():
    """Synchronous collectives cannot have ranks join early: this is a barrier,
    returning the last rank (size - 1) as Horovod's does when all join together."""
    comm = _set_comm(global_process_set)
    comm.barrier()
    return comm.size - 1


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """obj from root_rank on every rank, pickled: the ranks must trust each
    other (see _basics._warn_objects_trusted)."""
    _basics._warn_objects_trusted()
    comm = _set_comm(process_set)
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if comm.rank == root_rank else None
    n = np.array([data.size if data is not None else 0], dtype=np.int64)
    comm.broadcast(n, root_rank)
    buf = data.copy() if data is not None else np.empty(int(n[0]), dtype=np.uint8)
    comm.broadcast(buf, root_rank)
    return obj if comm.rank == root_rank else pickle.loads(buf.tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """[obj of rank 0, obj of rank 1, ...] on every rank, pickled (as broadcast_object)."""
    _basics._warn_objects_trusted()
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    comm = _set_comm(process_set)
    sizes = np.empty(comm.size, dtype=np.int64)
    comm.allgather(np.array([data.size], dtype=np.int64), sizes)
    out = np.empty(int(sizes.sum()), dtype=np.uint8)
    comm.allgatherv(data, out, [int(s) for s in sizes])
    objs, off = [], 0
    for s in sizes:
        objs.append(pickle.loads(out[off:off + int(s)].tobytes()))
        off += int(s)
    return objs


__all__ = ["Average", "Sum", "Min", "Max", "Product", "LoomError", "allreduce", "allreduce_",
           "grouped_allreduce", "grouped_allreduce_", "allgather", "broadcast", "broadcast_",
           "alltoall", "reducescatter", "barrier", "join", "broadcast_object", "allgather_object"]


class _NumpyBackend(_engine.Backend):
    """NumPy arrays in the background engine (loom._engine): what loom.tensorflow
    hands it. Type names are "np.<dtype name>"."""
    prefix = "np"

    def dtype_name(self, t):
        return "np." + t.dtype.name

    def _dtype(self, name):
        n = name.split(".", 1)[1]
        return _BF16 if n == "bfloat16" else np.dtype(n)

    def loom_dtype(self, name):
        dt = _DTYPES.get(self._dtype(name))
        if dt is None:
            raise TypeError("loom has no element type for numpy dtype %s" % name)
        return dt

    def esize(self, name):
        return self._dtype(name).itemsize

    def empty(self, shape, name):
        return np.empty(shape, dtype=self._dtype(name))

    def zeros(self, shape, name):
        return np.zeros(shape, dtype=self._dtype(name))

    def cap(self, t):
        return _view(t)[0]

    def flat(self, t):
        return t.reshape(-1)

    def copy_(self, dst, src):
        np.copyto(dst, src)

    def scale_(self, t, factor):
        _scale(t, factor)

    def clone(self, t):
        return t.copy()

    def int_vector(self, values):
        return np.asarray(values, dtype=np.int32)


_NUMPY = _NumpyBackend()
_engine.register_backend(_NUMPY)
