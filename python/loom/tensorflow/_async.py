"""The graph form of loom.tensorflow's collectives that holds no TensorFlow
thread while a collective waits for the other ranks: the op LoomAsyncCall of
the compiled library _async_op (python/loom/tensorflow/_async_op.cc).

A tf.py_function keeps the inter-op thread that runs it until its body
returns, and a loom collective returns only once every rank has started it:
a graph with more collectives than TensorFlow has threads, which the ranks
start in different orders, can have every thread of every rank waiting on a
collective that no rank has a thread left to start. Horovod's ops are
asynchronous kernels for that reason; so is LoomAsyncCall. Its kernel hands
the inputs to _start below and returns; the body runs on a thread of this
module's (as many as there are bodies waiting at once, kept for the next
ones) and completes the op from there.

available() is False where the library was not built (setup.py builds it
where TensorFlow is importable; LOOM_TF_OP) or does not load into this
TensorFlow; `reason` then says why, and loom.tensorflow uses tf.py_function."""
import collections
import importlib.util
import itertools
import threading
import weakref

import numpy as np
import tensorflow as tf

from .._loom import LoomError, LoomInternalError

_lib = None
reason = None


def _load():
    global _lib, reason
    try:
        spec = importlib.util.find_spec(__package__ + "._async_op")
    except (ImportError, ValueError) as exc:
        spec, reason = None, str(exc)
    if spec is None or not spec.origin:
        reason = reason or "loom.tensorflow._async_op was not built (no TensorFlow where setup.py ran?)"
        return
    try:
        _lib = tf.load_op_library(spec.origin)
    except (tf.errors.OpError, OSError) as exc:
        reason = "%s does not load into TensorFlow %s: %s" % (spec.origin, tf.__version__, exc)
        return
    # Each collective's gradient is its own custom_gradient, around the op.
    tf.no_gradient("LoomAsyncCall")
    _unordered_in_functions("LoomAsyncCall")


def _unordered_in_functions(op_type):
    """A tf.function runs its stateful ops in program order (control edges
    its tracing adds: auto_control_deps), so each rank would start its
    collectives one at a time in the order its program made them, and ranks
    whose orders differ would wait on each other for good. TensorFlow exempts
    its own collectives for that reason (ASYNC_STATEFUL_OPS); op_type joins
    them. The op stays stateful: never constant-folded, never merged with a
    twin. Where a TensorFlow lacks that set, collectives in a tf.function keep
    the program's order (fine where every rank makes them in the same one)."""
    from tensorflow.python.framework import auto_control_deps
    exempt = getattr(auto_control_deps, "ASYNC_STATEFUL_OPS", None)
    if isinstance(exempt, frozenset):
        auto_control_deps.ASYNC_STATEFUL_OPS = exempt | {op_type}


_load()

# TensorFlow dtypes whose tensors are their bytes (not strings, resources, variants).
_PLAIN = frozenset(d for d in (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.complex64,
                               tf.complex128, tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8,
                               tf.uint16, tf.uint32, tf.uint64, tf.bool))


def available(dtypes=()):
    """Whether LoomAsyncCall can run a body on tensors of these dtypes."""
    return _lib is not None and all(tf.as_dtype(d) in _PLAIN for d in dtypes)


# ---- the bodies a graph's ops run -------------------------------------------

class _Body:
    __slots__ = ("fn", "touts", "__weakref__")

    def __init__(self, fn, touts):
        self.fn, self.touts = fn, touts


# key -> _Body, for as long as the outermost graph holding the op lives (its
# list below): the op outlives the FuncGraph it was traced in.
_bodies = weakref.WeakValueDictionary()
_keys = itertools.count(1)


def _outermost(graph):
    while getattr(graph, "outer_graph", None) is not None:
        graph = graph.outer_graph
    return graph


def call(fn, inputs, touts):
    """The outputs (dtypes touts) of fn(*NumPy arrays) on the values of
    inputs, as one LoomAsyncCall op of the graph being built. fn raises
    LoomError (FailedPreconditionError), ValueError or TypeError
    (InvalidArgumentError), LoomInternalError (UnknownError whose message
    starts "LoomInternalError: ", as a py_function's does: elastic finds it
    there), anything else (UnknownError)."""
    # fn runs as it is, eagerly, not as AutoGraph made it over for the
    # function being traced (its loops and waits become graph code to
    # interpret: slow, and its threading no longer what the engine wrote).
    body = _Body(tf.autograph.experimental.do_not_convert(fn), [tf.as_dtype(t) for t in touts])
    key = next(_keys)
    _bodies[key] = body
    graph = _outermost(tf.compat.v1.get_default_graph())
    if not hasattr(graph, "_loom_async_bodies"):
        graph._loom_async_bodies = []
    graph._loom_async_bodies.append(body)
    return _lib.loom_async_call(list(inputs), key=key, Tout=body.touts)


# ---- the kernel's side ------------------------------------------------------

class _Workers:
    """Threads for the bodies: one per body running at once, started when
    none is idle, each kept for the next body (a collective costs no thread
    start in a training loop)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.jobs = collections.deque()
        self.idle = 0

    def submit(self, job):
        with self.cond:
            self.jobs.append(job)
            # A thread woken but not yet running still counts as idle and
            # takes one job: a new thread only where the jobs outnumber them.
            if self.idle >= len(self.jobs):
                self.cond.notify()
                return
        threading.Thread(target=self._serve, name="loom-tf-async", daemon=True).start()

    def _serve(self):
        while True:
            with self.cond:
                while not self.jobs:
                    self.idle += 1
                    self.cond.wait()
                    self.idle -= 1
                job = self.jobs.popleft()
            job()
            del job   # its inputs and op, not kept until the next job


_workers = _Workers()


def _start(key, inputs, complete):
    """Called by the kernel (GIL held, on a TensorFlow thread): queue the body
    and return. inputs: (bytearray, dtype enum, shape) per input tensor, ours
    to keep; complete(outputs, code, message) finishes the op, once."""
    body = _bodies.get(key)
    if body is None:
        complete(None, int(tf.errors.INTERNAL),
                 "loom: LoomAsyncCall %d outlived the graph that made it" % key)
        return
    _workers.submit(lambda: _run(body, inputs, complete))


def _run(body, inputs, complete):
    outs, code, message = None, 0, ""
    try:
        arrays = [np.frombuffer(data, dtype=tf.as_dtype(dtype).as_numpy_dtype).reshape(shape)
                  for data, dtype, shape in inputs]
        outs = [np.ascontiguousarray(np.asarray(o, dtype=t.as_numpy_dtype))
                for o, t in zip(body.fn(*arrays), body.touts)]
    except LoomInternalError as exc:
        code, message = tf.errors.UNKNOWN, "LoomInternalError: %s" % exc
    except LoomError as exc:
        code, message = tf.errors.FAILED_PRECONDITION, str(exc)
    except (ValueError, TypeError) as exc:
        code, message = tf.errors.INVALID_ARGUMENT, str(exc)
    except BaseException as exc:   # noqa: BLE001 - the op fails with it: it must end either way
        code, message = tf.errors.UNKNOWN, "%s: %s" % (type(exc).__name__, exc)
    if outs is not None:
        outs = [(o.shape, o.reshape(-1).view(np.uint8)) for o in outs]
    try:
        complete(outs, int(code), message)
    except ValueError:
        pass   # outputs that do not fit the op: it failed with the reason already
