"""loom.tensorflow: Horovod's TensorFlow API over Loom (`import loom.tensorflow
as hvd` in place of `import horovod.tensorflow as hvd`).

The collectives take tf.Tensors (CPU) inside and outside tf.function: each is a
tf.py_function that hands the tensor's values, as a NumPy array, to Loom's
background engine (loom/_engine.py: named, negotiated across ranks, small
allreduces fused) and waits for the result. allreduce and allgather have
gradients; DistributedGradientTape averages gradients over the ranks with one
grouped call per step."""
import numpy as np
import tensorflow as tf

from .. import _basics, _engine
from .._basics import (  # noqa: F401
    Sum, Average, Min, Max, Product, Adasum, ProcessSet, global_process_set,
    init, shutdown, is_initialized, size, rank, local_size, local_rank, cross_size, cross_rank,
    is_homogeneous, add_process_set, remove_process_set,
    mpi_built, mpi_enabled, mpi_threads_supported, gloo_built, gloo_enabled, nccl_built,
    ddl_built, ccl_built, cuda_built, rocm_built, loom_built, start_timeline, stop_timeline)
from .._loom import LoomError, LoomInternalError  # noqa: F401
from .. import numpy as _lnp
from ..numpy import _NUMPY
from ..elastic import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401


def _entry(kind, name, **kw):
    return _engine.Entry(kind, name, backend=_NUMPY, **kw)


def _op_of(op, average, what):
    if average is not None:
        op = Average if average else Sum
    if op is None or op == Adasum:
        raise ValueError("%s: Adasum is not implemented by Loom" % what)
    return op


def _array(t):
    """A C-contiguous NumPy array we may write into, holding t's values."""
    a = t.numpy() if hasattr(t, "numpy") else np.asarray(t)
    return np.array(a, copy=True, order="C")


def _run(process_set, entries):
    """Submit entries (in this order) to process_set's engine and wait for all
    of them. The engine is looked up here, when the py_function runs, not
    when the graph was traced: an elastic reset replaces it."""
    eng = _engine.engine_for(process_set)
    handles = [eng.submit(e) for e in entries]
    return [eng.wait(h) for h in handles]


def _py(fn, inputs, touts):
    return tf.py_function(fn, inputs, touts)


# ---- collectives on NumPy values (what the py_functions run) ------------------

def _np_allreduce(process_set, a, name, op, pre, post):
    out = _array(a)
    return _run(process_set, [_entry("allreduce", name, tensor=out, output=out, op=op, pre=pre, post=post)])[0]


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=None, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set):
    """The reduction of tensor over the process set (Average by default); its
    gradient is the same allreduce of the incoming gradient."""
    op = _op_of(Average if op is None else op, average, "allreduce")
    eng = _engine.engine_for(process_set)
    name = name or eng.auto_name("allreduce")
    tensor = tf.convert_to_tensor(tensor)
    if isinstance(tensor, tf.IndexedSlices):
        tensor = tf.convert_to_tensor(tensor)
    ctx = None
    if compression is not None:
        tensor, ctx = compression.compress(tensor)

    @tf.custom_gradient
    def _allreduce(x):
        y = _py(lambda v: _np_allreduce(process_set, v, name, op, prescale_factor, postscale_factor),
                [x], x.dtype)
        y.set_shape(x.shape)

        def grad(dy):
            return allreduce(dy, op=op, prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor, name=name + ".grad",
                             process_set=process_set)
        return y, grad

    out = _allreduce(tensor)
    return compression.decompress(out, ctx) if compression is not None else out


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=None,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, name=None,
                      process_set=global_process_set):
    """Allreduce a list of tensors in one call into the engine (fused when they fit)."""
    op = _op_of(Average if op is None else op, average, "grouped_allreduce")
    eng = _engine.engine_for(process_set)
    base = name or eng.auto_name("grouped_allreduce")
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []

    def run(*vals):
        outs = [_array(v) for v in vals]
        return _run(process_set, [_entry("allreduce", "%s.%d" % (base, i), tensor=o, output=o, op=op,
                                 pre=prescale_factor, post=postscale_factor)
                          for i, o in enumerate(outs)])
    ys = _py(run, tensors, [t.dtype for t in tensors])
    for y, t in zip(ys, tensors):
        y.set_shape(t.shape)
    return list(ys)


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's tensor concatenated along dimension 0 (lengths may differ);
    the gradient is this rank's slice of the summed incoming gradient."""
    eng = _engine.engine_for(process_set)
    name = name or eng.auto_name("allgather")
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        tensor = tf.reshape(tensor, [1])

    @tf.custom_gradient
    def _allgather(x):
        def run(v):
            a = _array(v)
            return _run(process_set, [_entry("allgather", name, tensor=a)])[0]
        y = _py(run, [x], x.dtype)
        y.set_shape([None] + x.shape[1:].as_list())

        def grad(dy):
            summed = allreduce(dy, op=Sum, name=name + ".grad", process_set=process_set)
            firsts = allgather(tf.shape(x)[:1], name=name + ".grad.dims", process_set=process_set)
            me = process_set.rank()
            start = tf.reduce_sum(firsts[:me])
            return summed[start:start + tf.shape(x)[0]]
        return y, grad

    return _allgather(tensor)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank's tensor on every rank (no gradient)."""
    eng = _engine.engine_for(process_set)
    name = name or eng.auto_name("broadcast")
    tensor = tf.convert_to_tensor(tensor)

    def run(v):
        a = _array(v)
        return _run(process_set, [_entry("broadcast", name, tensor=a, output=a, root=int(root_rank))])[0]
    y = _py(run, [tensor], tensor.dtype)
    y.set_shape(tensor.shape)
    return tf.stop_gradient(y)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """splits[i] rows of dimension 0 to rank i (equal parts by default); returns
    (received tensor, received splits)."""
    eng = _engine.engine_for(process_set)
    name = name or eng.auto_name("alltoall")
    tensor = tf.convert_to_tensor(tensor)

    def run(v, *sp):
        n = _engine.engine_for(process_set).n
        a = _array(v)
        s = [int(x) for x in sp[0].numpy()] if sp else None
        if s is None:
            if a.shape[0] % n:
                raise ValueError("alltoall: dimension 0 (%d) does not split over %d ranks" % (a.shape[0], n))
            s = [a.shape[0] // n] * n
        out, rs = _run(process_set, [_entry("alltoall", name, tensor=a, splits=s)])[0]
        return out, rs
    inputs = [tensor] + ([tf.convert_to_tensor(splits, dtype=tf.int32)] if splits is not None else [])
    y, rs = _py(run, inputs, [tensor.dtype, tf.int32])
    y.set_shape([None] + tensor.shape[1:].as_list())
    return y, rs


def reducescatter(tensor, op=Average, name=None, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """The reduction over the ranks, this rank's share of dimension 0."""
    eng = _engine.engine_for(process_set)
    name = name or eng.auto_name("reducescatter")
    tensor = tf.convert_to_tensor(tensor)

    def run(v):
        a = _array(v)
        return _run(process_set, [_entry("reducescatter", name, tensor=a, output=a, op=op,
                                 pre=prescale_factor, post=postscale_factor)])[0]
    y = _py(run, [tensor], tensor.dtype)
    y.set_shape([None] + tensor.shape[1:].as_list())
    return y


def barrier(process_set=global_process_set):
    eng = _engine.engine_for(process_set)
    _run(process_set, [_entry("barrier", eng.auto_name("barrier"))])


def join():
    return _run(global_process_set, [_entry(_engine.JOIN, _engine.JOIN)])[0]


def broadcast_variables(variables, root_rank, process_set=global_process_set):
    """Assign root_rank's values to variables (tf.Variable or Keras variables)."""
    variables = list(variables)
    arrays = [np.array(np.asarray(v), copy=True, order="C") for v in variables]
    _run(process_set, [_entry("broadcast", "broadcast_variables.%d" % i, tensor=a, output=a,
                              root=int(root_rank))
                       for i, a in enumerate(arrays)])
    for v, a in zip(variables, arrays):
        v.assign(a)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """obj from root_rank on every rank (pickled; synchronous, outside the engine)."""
    return _lnp.broadcast_object(obj, root_rank, process_set=process_set)


def allgather_object(obj, name=None, process_set=global_process_set):
    return _lnp.allgather_object(obj, process_set=process_set)


class Compression:
    class none:
        @staticmethod
        def compress(tensor):
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            return tensor

    class fp16:
        @staticmethod
        def compress(tensor):
            if tensor.dtype.is_floating and tensor.dtype != tf.float16:
                return tf.cast(tensor, tf.float16), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            return tf.cast(tensor, ctx) if ctx is not None else tensor


def _allreduce_grads(grads, compression, op, process_set, prefix, pre=1.0, post=1.0):
    """Average a list of gradients (None kept as None) over the ranks in one call."""
    idx = [i for i, g in enumerate(grads) if g is not None]
    dense = [tf.convert_to_tensor(grads[i]) for i in idx]
    comp = [compression.compress(g) for g in dense]
    reduced = grouped_allreduce([c for c, _ in comp], op=op, name=prefix, process_set=process_set,
                                prescale_factor=pre, postscale_factor=post)
    out = list(grads)
    for i, r, (_, ctx) in zip(idx, reduced, comp):
        out[i] = compression.decompress(r, ctx)
    return out


class DistributedGradientTape:
    """Wraps a tf.GradientTape: gradient() returns gradients averaged (op) over
    the ranks. Everything else is the wrapped tape's."""

    def __init__(self, gradtape, device_dense="", device_sparse="", compression=None,
                 sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0,
                 num_groups=0, groups=None, process_set=global_process_set):
        if op is None or op == Adasum:
            raise ValueError("DistributedGradientTape: Adasum is not implemented by Loom")
        self._tape = gradtape
        self._compression = compression or Compression.none
        self._op = op
        self._predivide = gradient_predivide_factor
        self._process_set = process_set

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        flat = tf.nest.flatten(grads)
        pre, post = ((1.0 / self._predivide, self._predivide) if self._op == Average
                     else (1.0, 1.0))
        prefix = _engine.engine_for(self._process_set).auto_name("DistributedGradientTape")
        reduced = _allreduce_grads(flat, self._compression, self._op, self._process_set,
                                   prefix, pre, post)
        return tf.nest.pack_sequence_as(grads, reduced)

    def __getattr__(self, attr):
        return getattr(self._tape, attr)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)


def _fusion_stats(process_set=global_process_set):
    eng = _engine.engines.get(process_set.process_set_id)
    return dict(eng.stats) if eng else {}


from . import elastic  # noqa: E402,F401  (uses the functions above)
