"""loom.tensorflow: Horovod's TensorFlow API over Loom (`import loom.tensorflow
as hvd` in place of `import horovod.tensorflow as hvd`).

The collectives take tf.Tensors (CPU) inside and outside tf.function and in
TF1 graphs: each hands the tensor's values, as a NumPy array, to Loom's
background engine (loom/_engine.py: named, negotiated across ranks, small
allreduces fused) and waits for the result; eagerly at once, in a graph as
the asynchronous op LoomAsyncCall (_async.py), which holds no TensorFlow
thread while it waits, or a tf.py_function where that op was not built.
Names are Horovod's: in a graph made from the inputs' graph
names (the same on every rank), eagerly counted per kind. Failures have
Horovod's types: FailedPreconditionError where the ranks disagree,
InvalidArgumentError for bad arguments (both also LoomError / ValueError).
Every collective has Horovod's gradient; DistributedGradientTape and
DistributedOptimizer (TF1 and Keras optimizers) reduce gradients over the
ranks with one grouped call per step."""
import re

import numpy as np
import tensorflow as tf

from .. import _basics, _engine
from . import _async
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


def _executing_eagerly():
    """True outside graph construction (eager mode, or a py_function's body)."""
    return tf.executing_eagerly()


# ---- errors of the types Horovod raises ------------------------------------

class _FailedPrecondition(tf.errors.FailedPreconditionError, LoomError):
    """A collective the ranks disagree on (shape, type, root, names that never
    match): Horovod's FailedPreconditionError, still a LoomError."""

    def __init__(self, message):
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


class _InvalidArgument(tf.errors.InvalidArgumentError, ValueError):
    """A bad argument (alltoall's splits): Horovod's InvalidArgumentError, still
    a ValueError."""

    def __init__(self, message):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


def _as_tf_error(exc):
    """exc as the TensorFlow error Horovod raises for it; a LoomInternalError
    (a lost peer: elastic recovers from those) stays itself."""
    if isinstance(exc, (LoomInternalError, tf.errors.OpError)):
        return exc
    if isinstance(exc, LoomError):
        return _FailedPrecondition(str(exc))
    if isinstance(exc, (ValueError, TypeError)):
        return _InvalidArgument(str(exc))
    return exc


# Where a graph's collective is a py_function (the op of _async.py not built),
# TensorFlow turns any Python exception from one into UnknownError (ValueError
# and TypeError: InvalidArgumentError). A failed precondition therefore leaves
# the py_function as a status string, and ReadFile of a path under a regular
# file raises it as FailedPreconditionError (ENOTDIR), the message in the
# path: "/dev/null/<loom's message>; Not a directory".
_FAIL_UNDER = "/dev/null/"


def _array(t):
    """A C-contiguous NumPy array we may write into, holding t's values."""
    a = t.numpy() if hasattr(t, "numpy") else np.asarray(t)
    return np.array(a, copy=True, order="C")


def _call(body, inputs, touts):
    """body(*NumPy arrays) -> list of NumPy arrays (one per dtype in touts),
    run on the inputs' values: at once when eager; in a graph as the op
    LoomAsyncCall (loom/tensorflow/_async.py), which holds none of
    TensorFlow's threads while the collective waits for the other ranks, so
    a graph's collectives may start in any order on each rank. Where that
    op's library was not built (setup.py without TensorFlow, LOOM_TF_OP=0;
    _async.reason says why), a tf.py_function instead, which holds its thread:
    a graph of more collectives than TensorFlow's inter-op threads can then
    stall when the ranks start them in different orders. Its failures surface
    as Horovod's TensorFlow errors (_as_tf_error) either way."""
    touts = list(touts)
    if tf.executing_eagerly():
        try:
            outs = body(*[_array(x) for x in inputs])
        except Exception as exc:   # noqa: BLE001 - re-raised as TensorFlow's type
            new = _as_tf_error(exc)
            if new is exc:
                raise
            raise new from exc
        return [tf.convert_to_tensor(o, dtype=t) for o, t in zip(outs, touts)]

    if _async.available([x.dtype for x in inputs] + touts):
        return list(_async.call(body, inputs, touts))

    def wrapped(*vals):
        try:
            outs = body(*[_array(v) for v in vals])
        except LoomInternalError:
            raise
        except LoomError as exc:
            return [np.zeros((0,), t.as_numpy_dtype) for t in touts] + [str(exc).encode()]
        except (ValueError, TypeError) as exc:
            raise ValueError(str(exc)) from exc
        return [np.asarray(o, dtype=t.as_numpy_dtype) for o, t in zip(outs, touts)] + [b""]

    res = tf.py_function(wrapped, list(inputs), touts + [tf.string])
    outs, status = list(res[:-1]), res[-1]
    check = tf.cond(tf.equal(status, ""), lambda: tf.constant(""),
                    lambda: tf.io.read_file(tf.strings.join([_FAIL_UNDER, status])))
    with tf.control_dependencies([check]):
        return [tf.identity(o) for o in outs]


def _entry(kind, name, **kw):
    return _engine.Entry(kind, name, backend=_NUMPY, **kw)


def _run(process_set, names, build):
    """Submit the entries build() makes (one per name, in this order) to
    process_set's engine and wait for all of them. Should build() refuse its
    arguments, the names are submitted as refused, so they resolve on every
    rank (failing where the others submitted them) and the names after them
    stay in step; then its error is raised. The engine is looked up here,
    when the collective runs, not when a graph was traced: an elastic reset
    replaces it."""
    eng = _engine.engine_for(process_set)
    try:
        entries = build()
    except Exception:
        handles = eng.submit_many([_engine.Entry(_engine.REFUSED, n) for n in names])
        for h in handles:
            try:
                eng.wait(h)
            except LoomError:
                pass
        raise
    handles = eng.submit_many(entries)
    out, error = [], None
    for h in handles:
        try:
            out.append(eng.wait(h))
        except Exception as exc:   # noqa: BLE001 - every handle is taken, then the first error raised
            out.append(None)
            error = error or exc
    if error is not None:
        raise error
    return out


def _names(base, k):
    return [base] if k == 1 else ["%s.%d" % (base, i) for i in range(k)]


def _normalize(name):
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _name(kind, label, tensors, name, process_set):
    """The collective's name: the caller's; else, in a graph, one made from
    the graph position of its inputs, as Horovod's (every rank builds the same
    graph, so the same names, whatever order the ops then run in); else the
    next unnamed call of its kind (eager calls come in program order)."""
    if name:
        return name
    if not tf.executing_eagerly():
        g = tf.compat.v1.get_default_graph()
        ts = [t.values if isinstance(t, tf.IndexedSlices) else t for t in tensors]
        base = "Horovod%s_%s" % (label, _normalize(ts[0].name))
        if len(ts) > 1:
            base += "_" + _normalize(ts[-1].name)
        return g.unique_name(base)
    return _engine.engine_for(process_set).auto_name(kind)


def _grouped_call(base, xs, process_set, make, rows_vary=False):
    """The collective of each tensor in xs, in one call into the engine:
    make(name, array) is the entry of each (named base, or base.i in a
    group). The results keep the inputs' shapes, dimension 0 aside where
    rows_vary."""
    def body(*vals):
        names = _names(base, len(vals))
        return _run(process_set, names, lambda: [make(n, v) for n, v in zip(names, vals)])
    ys = _call(body, xs, [x.dtype for x in xs])
    for y, x in zip(ys, xs):
        y.set_shape([None] + x.shape[1:].as_list() if rows_vary else x.shape)
    return ys


def _op_of(op, average, what):
    if average is not None:
        op = Average if average else Sum
    if op is None:
        op = Average
    if op == Adasum:
        raise NotImplementedError("%s: Adasum is not implemented by loom.tensorflow" % what)
    return op


def _check_ps(process_set):
    if not process_set.included():
        raise ValueError("this rank is not in process set %d" % process_set.process_set_id)


# ---- allreduce --------------------------------------------------------------

def _grouped_allreduce_dense(tensors, op, pre, post, name, process_set):
    """The allreduce of dense tensors, in one call into the engine (fused
    when they fit); its gradient is the same allreduce of the gradients."""
    base = _name("grouped_allreduce" if len(tensors) > 1 else "allreduce",
                 "GroupedAllreduce" if len(tensors) > 1 else "Allreduce", tensors, name, process_set)

    @tf.custom_gradient
    def _ar(*xs):
        ys = _grouped_call(base, xs, process_set, lambda n, v: _entry(
            "allreduce", n, tensor=v, output=v, op=op, pre=pre, post=post))

        def grad(*dys):
            dys = [tf.zeros_like(x) if d is None else tf.convert_to_tensor(d) for d, x in zip(dys, xs)]
            return _grouped_allreduce_dense(dys, op, pre, post, None, process_set)
        return ys, grad

    return list(_ar(*tensors))


def _sparse_allreduce(slices, op, pre, post, name, process_set):
    """tf.IndexedSlices: their values and indices allgathered (Horovod's way)."""
    if op not in (Sum, Average):
        raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
    if pre != 1.0 or post != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")
    values = grouped_allgather([s.values for s in slices], name=name and name + ".values",
                               process_set=process_set)
    indices = grouped_allgather([s.indices for s in slices], name=name and name + ".indices",
                                process_set=process_set)
    out = []
    for v, i, s in zip(values, indices, slices):
        if op == Average:
            v = v / tf.cast(process_set.size(), v.dtype)
        out.append(tf.IndexedSlices(v, i, dense_shape=s.dense_shape))
    return out


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=None, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """The reduction of tensor over the process set (Average by default); its
    gradient is the same allreduce of the incoming gradient. A tf.IndexedSlices
    is allgathered (values and indices), as Horovod does."""
    if isinstance(tensor, tf.IndexedSlices):
        if op == Adasum:
            raise NotImplementedError("The Adasum reduction does not support sparse tensors: "
                                      "pass sparse_as_dense=True")
        op = _op_of(op, average, "allreduce")
        return _sparse_allreduce([tensor], op, prescale_factor, postscale_factor, name, process_set)[0]
    op = _op_of(op, average, "allreduce")
    compression = compression or Compression.none
    tensor = tf.convert_to_tensor(tensor)
    tensor, ctx = compression.compress(tensor)
    out = _grouped_allreduce_dense([tensor], op, prescale_factor, postscale_factor, name, process_set)[0]
    return compression.decompress(out, ctx)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=None,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Allreduce a list of tensors in one call into the engine (fused when
    they fit); tf.IndexedSlices among them are allgathered."""
    if not tensors:
        return tensors
    tensors = list(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    if sparse and op == Adasum:
        raise NotImplementedError("The Adasum reduction does not support sparse tensors: "
                                  "pass sparse_as_dense=True")
    op = _op_of(op, average, "grouped_allreduce")
    out = [None] * len(tensors)
    if sparse:
        for i, r in zip(sparse, _sparse_allreduce([tensors[i] for i in sparse], op, prescale_factor,
                                                  postscale_factor, name, process_set)):
            out[i] = r
    dense = [i for i in range(len(tensors)) if i not in sparse]
    if dense:
        compression = compression or Compression.none
        comp = [compression.compress(tf.convert_to_tensor(tensors[i])) for i in dense]
        red = _grouped_allreduce_dense([c for c, _ in comp], op, prescale_factor, postscale_factor,
                                       name, process_set)
        for i, r, (_, ctx) in zip(dense, red, comp):
            out[i] = compression.decompress(r, ctx)
    return out


# ---- allgather --------------------------------------------------------------

def _scalar_to_vector(t):
    t = tf.convert_to_tensor(t)
    return tf.reshape(t, [1]) if t.shape.rank == 0 else t


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Each tensor's rows from every rank, concatenated along dimension 0
    (lengths may differ). The gradient of each: this rank's rows of the
    average of the incoming gradients, as Horovod's."""
    if not tensors:
        return tensors
    tensors = [_scalar_to_vector(t) for t in tensors]
    base = _name("grouped_allgather" if len(tensors) > 1 else "allgather",
                 "GroupedAllgather" if len(tensors) > 1 else "Allgather", tensors, name, process_set)

    @tf.custom_gradient
    def _ag(*xs):
        ys = _grouped_call(base, xs, process_set, lambda n, v: _entry("allgather", n, tensor=v),
                           rows_vary=True)

        def grad(*dys):
            out = []
            for d, x in zip(dys, xs):
                d = tf.zeros_like(x) if d is None else tf.convert_to_tensor(d)
                avg = allreduce(d, op=Average, process_set=process_set)
                dims = tf.reshape(allgather(tf.shape(x)[:1], process_set=process_set), [-1])
                me = process_set.rank()
                start = tf.reduce_sum(dims[:me])
                out.append(avg[start:start + dims[me]])
            return out
        return ys, grad

    return list(_ag(*tensors))


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Every rank's tensor concatenated along dimension 0 (lengths may differ)."""
    return grouped_allgather([tensor], name=name, process_set=process_set)[0]


# ---- broadcast --------------------------------------------------------------

def _grouped_broadcast(tensors, root_rank, name, process_set):
    base = _name("broadcast", "Broadcast", tensors, name, process_set)
    root = int(root_rank)

    @tf.custom_gradient
    def _bc(*xs):
        ys = _grouped_call(base, xs, process_set, lambda n, v: _entry(
            "broadcast", n, tensor=v, output=v, root=root))

        def grad(*dys):
            dys = [tf.zeros_like(x) if d is None else tf.convert_to_tensor(d) for d, x in zip(dys, xs)]
            avg = _grouped_allreduce_dense(dys, Average, 1.0, 1.0, None, process_set)
            if process_set.rank() != root:
                avg = [a * 0 for a in avg]
            return avg
        return ys, grad

    return list(_bc(*tensors))


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """root_rank's tensor on every rank. Its gradient, as Horovod's: the
    average of the incoming gradients on root_rank, zero elsewhere."""
    return _grouped_broadcast([tf.convert_to_tensor(tensor)], root_rank, name, process_set)[0]


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Broadcast variables in place from root_rank; returns their new values."""
    variables = list(variables)
    vals = _grouped_broadcast([tf.convert_to_tensor(v) for v in variables], root_rank, name, process_set)
    return [v.assign(x, read_value=True) for v, x in zip(variables, vals)]


# ---- alltoall ---------------------------------------------------------------

def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """splits[i] rows of dimension 0 to rank i (equal parts by default).
    Returns, as Horovod's, the received tensor, and with splits given the
    pair (received tensor, received splits as int32). The gradient is the
    alltoall of the incoming gradient with the received splits."""
    tensor = _scalar_to_vector(tensor)
    name = _name("alltoall", "Alltoall", [tensor], name, process_set)

    def body(v, *sp):
        def build():
            n = process_set.size()
            if sp:
                s = [int(x) for x in np.asarray(sp[0]).reshape(-1)]
                if any(x < 0 for x in s):
                    raise ValueError("alltoall '%s': negative splits %s" % (name, s))
                if len(s) != n:
                    raise ValueError("alltoall '%s': %d splits for %d ranks" % (name, len(s), n))
                if sum(s) != v.shape[0]:
                    raise ValueError("alltoall '%s': splits %s do not add up to dimension 0 (%d)"
                                     % (name, s, v.shape[0]))
            else:
                if v.shape[0] % n:
                    raise ValueError("alltoall '%s': dimension 0 (%d) does not split evenly over %d ranks"
                                     % (name, v.shape[0], n))
                s = [v.shape[0] // n] * n
            return [_entry("alltoall", name, tensor=v, splits=s)]
        out, rs = _run(process_set, [name], build)[0]
        return out, np.asarray(rs, dtype=np.int32)

    @tf.custom_gradient
    def _a2a(x, *sp):
        y, rs = _call(body, [x] + list(sp), [x.dtype, tf.int32])
        y.set_shape([None] + x.shape[1:].as_list())
        rs.set_shape([process_set.size()] if process_set.included() else [None])

        def grad(dy, drs=None):
            dy = tf.zeros_like(y) if dy is None else dy
            gx = alltoall(dy, splits=rs, process_set=process_set)[0]
            return [gx] + [None] * len(sp)
        return (y, rs), grad

    inputs = [tensor]
    if splits is not None:
        inputs.append(tf.cast(tf.convert_to_tensor(splits), tf.int32))
    y, rs = _a2a(*inputs)
    return (y, tf.stop_gradient(rs)) if splits is not None else y


# ---- reducescatter ----------------------------------------------------------

def grouped_reducescatter(tensors, device_dense="", compression=None, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0,
                          name=None):
    """Each tensor reduced over the ranks, this rank's share of dimension 0
    (the first ranks take one row more where it does not divide). The
    gradient: the incoming gradient (times the size for Sum, and the
    scaling) allgathered, as Horovod's."""
    if not tensors:
        return tensors
    if op not in (Sum, Average):
        raise NotImplementedError("reducescatter: only Sum and Average are supported")
    compression = compression or Compression.none
    comp = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    xs_in = [c for c, _ in comp]
    for x in xs_in:
        if x.shape.rank == 0:
            raise ValueError("reducescatter: a scalar cannot be scattered")
    base = _name("grouped_reducescatter" if len(xs_in) > 1 else "reducescatter",
                 "GroupedReducescatter" if len(xs_in) > 1 else "Reducescatter", xs_in, name, process_set)

    @tf.custom_gradient
    def _rs(*xs):
        ys = _grouped_call(base, xs, process_set, lambda n, v: _entry(
            "reducescatter", n, tensor=v, output=v, op=op, pre=prescale_factor, post=postscale_factor),
            rows_vary=True)

        def grad(*dys):
            scale = float(prescale_factor) * float(postscale_factor)
            if op == Sum:
                scale *= process_set.size()
            gs = []
            for d, y in zip(dys, ys):
                d = tf.zeros_like(y) if d is None else tf.convert_to_tensor(d)
                gs.append(d * tf.cast(scale, d.dtype) if scale != 1.0 else d)
            return grouped_allgather(gs, process_set=process_set)
        return ys, grad

    out = _rs(*xs_in)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(out, comp)]


def reducescatter(tensor, device_dense="", compression=None, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False,
                  prescale_factor=1.0, postscale_factor=1.0):
    """The reduction over the ranks, this rank's share of dimension 0."""
    return grouped_reducescatter([tensor], compression=compression, op=op, process_set=process_set,
                                 prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                 name=name)[0]


# ---- the rest of the API ----------------------------------------------------

def barrier(process_set=global_process_set):
    eng = _engine.engine_for(process_set)
    n = eng.auto_name("barrier")
    _run(process_set, [n], lambda: [_entry("barrier", n)])


def join():
    """Stop contributing until every rank has joined; returns the rank that
    joined last (as a tensor where Horovod gives one)."""
    last = _run(global_process_set, [_engine.JOIN], lambda: [_entry(_engine.JOIN, _engine.JOIN)])[0]
    return tf.constant(last, dtype=tf.int32)


def _int_op(fn, name):
    if tf.executing_eagerly():
        return tf.constant(fn(), dtype=tf.int32)
    return tf.py_function(lambda: np.int32(fn()), [], tf.int32, name=name)


def size_op(process_set_id=0, name=None):
    """The size of the process set, read when the op runs."""
    return _int_op(lambda: _basics._sets[process_set_id].size()
                   if process_set_id else size(), name)


def local_size_op(name=None):
    return _int_op(local_size, name)


def rank_op(name=None):
    return _int_op(rank, name)


def local_rank_op(name=None):
    return _int_op(local_rank, name)


def process_set_included_op(process_set_id=0, name=None):
    return _int_op(lambda: int(_basics._sets[process_set_id].included())
                   if process_set_id else 1, name)


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assign root_rank's values to variables (tf.Variable or Keras
    variables), in one call into the engine. Returns the assign op in a graph."""
    variables = list(variables)
    if not variables:
        return tf.no_op() if not tf.executing_eagerly() else None
    if tf.executing_eagerly():
        arrays = [np.array(np.asarray(v), copy=True, order="C") for v in variables]
        eng = _engine.engine_for(process_set)
        base = eng.auto_name("broadcast_variables")
        try:
            names = ["%s.%d" % (base, i) for i in range(len(arrays))]
            _run(process_set, names, lambda: [_entry("broadcast", n, tensor=a, output=a, root=int(root_rank))
                                              for n, a in zip(names, arrays)])
        except Exception as exc:   # noqa: BLE001 - re-raised as TensorFlow's type
            new = _as_tf_error(exc)
            if new is exc:
                raise
            raise new from exc
        for v, a in zip(variables, arrays):
            v.assign(a)
        return None
    vals = _grouped_broadcast([tf.convert_to_tensor(v) for v in variables], root_rank, None, process_set)
    return tf.group(*[v.assign(x) for v, x in zip(variables, vals)])


def broadcast_global_variables(root_rank):
    """Broadcast every global variable (TF1 graphs) from root_rank."""
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. "
                           "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook if hasattr(tf.compat.v1.train, "SessionRunHook")
                                   else object):
    """SessionRunHook: broadcast the global variables from root_rank once the
    session is created."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op = None

    def begin(self):
        if not self.bcast_op or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """obj from root_rank on every rank (pickled; synchronous, outside the engine)."""
    return _lnp.broadcast_object(obj, root_rank, process_set=process_set)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function obj -> root_rank's obj (Horovod's, for graph sessions)."""
    return lambda obj: broadcast_object(obj, root_rank, process_set=process_set)


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
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


def _allreduce_grads(grads, compression, op, process_set, name=None, pre=1.0, post=1.0,
                     sparse_as_dense=False):
    """Reduce a list of gradients (None kept as None) over the ranks in one
    grouped call; tf.IndexedSlices are allgathered, or made dense first
    (sparse_as_dense). pre and post are gradient_predivide_factor's pair,
    whose product is 1: sparse gradients, which take no scaling, skip it."""
    idx = [i for i, g in enumerate(grads) if g is not None]
    gs = [tf.convert_to_tensor(grads[i]) if isinstance(grads[i], tf.IndexedSlices) and sparse_as_dense
          else grads[i] for i in idx]
    if not gs:
        return list(grads)
    if any(isinstance(g, tf.IndexedSlices) for g in gs):
        pre = post = 1.0
    reduced = grouped_allreduce(gs, compression=compression, op=op, name=name, process_set=process_set,
                                prescale_factor=pre, postscale_factor=post)
    out = list(grads)
    for i, r in zip(idx, reduced):
        out[i] = r
    return out


class DistributedGradientTape:
    """Wraps a tf.GradientTape: gradient() returns gradients reduced (op,
    Average by default) over the ranks, in one grouped call per step. Sources
    registered as local (register_local_source, PartialDistributedGradientTape)
    keep their own gradient, divided by the size where scale_local_gradients.
    Everything else is the wrapped tape's."""

    def __init__(self, gradtape, device_dense="", device_sparse="", compression=None,
                 sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0,
                 num_groups=0, groups=None, process_set=global_process_set, scale_local_gradients=True):
        if op == Adasum:
            raise NotImplementedError("DistributedGradientTape: Adasum is not implemented by loom.tensorflow")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        self._tape = gradtape
        self._compression = compression or Compression.none
        self._sparse_as_dense = sparse_as_dense
        self._op = Average if op is None else op
        self._predivide = gradient_predivide_factor
        self._process_set = process_set
        self._local_sources = set()
        self.scale_local_gradients = scale_local_gradients

    def register_local_source(self, source):
        """source's gradient stays this rank's own (not reduced)."""
        self._local_sources.add(source.ref() if hasattr(source, "ref") else id(source))

    def _is_local(self, s):
        return (s.ref() if hasattr(s, "ref") else id(s)) in self._local_sources

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False, **kwargs):
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        flat_s = tf.nest.flatten(sources)
        flat = tf.nest.flatten(grads)
        pre, post = ((1.0 / self._predivide, self._predivide) if self._op == Average
                     else (1.0, 1.0))
        shared = [i for i, s in enumerate(flat_s) if not self._is_local(s)]
        reduced = _allreduce_grads([flat[i] for i in shared], self._compression, self._op,
                                   self._process_set, None, pre, post, self._sparse_as_dense)
        out = list(flat)
        for i, r in zip(shared, reduced):
            out[i] = r
        if self.scale_local_gradients and self._local_sources:
            n = self._process_set.size()
            for i, s in enumerate(flat_s):
                g = out[i]
                if self._is_local(s) and g is not None:
                    if isinstance(g, tf.IndexedSlices):
                        out[i] = tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                    else:
                        out[i] = g / tf.cast(n, g.dtype)
        return tf.nest.pack_sequence_as(grads, out)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       use_generic_names=False):
        grads = self.gradient(target, sources, output_gradients)
        local, shared = [], []
        for s, g in zip(sources, grads):
            (local if self._is_local(s) else shared).append((s, g))
        return local, shared

    def __getattr__(self, attr):
        return getattr(self._tape, attr)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)


def _layer_list(local_layers):
    """local_layers (None, a Keras layer or several) as a list of layers."""
    import keras
    if local_layers is None:
        return []
    if isinstance(local_layers, keras.layers.Layer):
        return [local_layers]
    local_layers = list(local_layers)
    if not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError("All local layers must be of keras.layers.Layer type.")
    return local_layers


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=None,
                                   sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0,
                                   num_groups=0, groups=None, process_set=global_process_set,
                                   local_layers=None, scale_local_gradients=True):
    """DistributedGradientTape whose local_layers' (Keras layers') trainable
    weights keep their own gradients."""
    local_layers = _layer_list(local_layers)
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense,
                                   op, gradient_predivide_factor, num_groups, groups, process_set,
                                   scale_local_gradients)
    for layer in local_layers:
        for v in layer.trainable_weights:
            tape.register_local_source(v)
    return tape


class _DistributedTF1Optimizer(tf.compat.v1.train.Optimizer):
    """A tf.compat.v1.train.Optimizer whose compute_gradients reduces the
    gradients over the ranks (op, Average by default)."""

    def __init__(self, optimizer, name, use_locking, compression, sparse_as_dense, op,
                 gradient_predivide_factor, backward_passes_per_step, process_set):
        super().__init__(name=name or "Distributed" + type(optimizer).__name__, use_locking=use_locking)
        self._optimizer = optimizer
        self._compression = compression or Compression.none
        self._sparse_as_dense = sparse_as_dense
        self._op = op
        self._pre, self._post = ((1.0 / gradient_predivide_factor, gradient_predivide_factor)
                                 if op == Average else (1.0, 1.0))
        self._process_set = process_set
        if backward_passes_per_step != 1:
            raise NotImplementedError("loom.tensorflow: backward_passes_per_step > 1 is not implemented "
                                      "for TF1 optimizers")

    def compute_gradients(self, *args, **kwargs):
        gv = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = zip(*gv) if gv else ((), ())
        reduced = _allreduce_grads(list(grads), self._compression, self._op, self._process_set,
                                   None, self._pre, self._post, self._sparse_as_dense)
        return list(zip(reduced, variables))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=None, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set,
                         scale_local_gradients=True):
    """Horovod's DistributedOptimizer: a TF1 optimizer (tf.compat.v1.train)
    wrapped so compute_gradients reduces over the ranks, or a Keras optimizer
    made a distributed copy of itself (loom.keras.DistributedOptimizer)."""
    if op == Adasum:
        raise NotImplementedError("DistributedOptimizer: Adasum is not implemented by loom.tensorflow")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return _DistributedTF1Optimizer(optimizer, name, use_locking, compression, sparse_as_dense, op,
                                        gradient_predivide_factor, backward_passes_per_step, process_set)
    import keras
    if isinstance(optimizer, keras.optimizers.Optimizer):
        from .. import keras as _lk
        return _lk.DistributedOptimizer(optimizer, name=name, compression=compression or Compression.none,
                                        sparse_as_dense=sparse_as_dense,
                                        gradient_predivide_factor=gradient_predivide_factor, op=op,
                                        backward_passes_per_step=backward_passes_per_step,
                                        average_aggregated_gradients=average_aggregated_gradients,
                                        process_set=process_set)
    raise ValueError("Provided optimizer doesn't inherit from either legacy TensorFlow or Keras optimizer: %s"
                     % optimizer)


def _fusion_stats(process_set=global_process_set):
    eng = _engine.engines.get(process_set.process_set_id)
    return dict(eng.stats) if eng else {}


from . import elastic  # noqa: E402,F401  (uses the functions above)


def __getattr__(attr):
    # Names Horovod keeps elsewhere: say where, rather than a bare AttributeError.
    where = {"callbacks": "loom.keras.callbacks (Horovod: horovod.tensorflow.keras.callbacks)",
             "SyncBatchNormalization": "nowhere yet: loom.tensorflow has no SyncBatchNormalization",
             "load_model": "loom.keras.load_model is not provided: load with keras.models.load_model, "
                           "then wrap the optimizer in DistributedOptimizer"}
    if attr in where:
        raise AttributeError("module 'loom.tensorflow' has no attribute '%s': see %s" % (attr, where[attr]))
    raise AttributeError("module 'loom.tensorflow' has no attribute '%s'" % attr)
