"""Horovod's horovod.tensorflow.elastic over Loom: run, TensorFlowKerasState,
TensorFlowState, ObjectState (see loom/elastic.py for what happens on a
failure). Loom's collectives run inside tf.py_function, so a failure inside a
tf.function reaches Python as a TensorFlow error: run() turns those that carry
a LoomInternalError back into one."""
import functools
import re

import numpy as np
import tensorflow as tf

from .. import elastic as _elastic
from ..elastic import (  # noqa: F401
    HorovodInternalError, HostsUpdatedInterrupt, LoomInternalError, State, reset, run_fn)
from . import broadcast_object, broadcast_variables, rank


class ObjectState(_elastic.ObjectState):
    """ObjectState(epoch=0, batch=0): plain values, broadcast with broadcast_object."""

    def __init__(self, **kwargs):
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)


def _values(variables):
    return [np.array(np.asarray(v), copy=True) for v in variables]


def _assign(variables, values):
    for v, a in zip(variables, values):
        v.assign(a)


class TensorFlowKerasState(ObjectState):
    """TensorFlowKerasState(model, optimizer=None, **kwargs): the weights of a
    Keras model and its optimizer's variables, plus plain values as attributes.
    The optimizer is built before the first sync, so a rank that joins with a
    fresh optimizer receives the same variables the others have."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self._saved_model = None
        self._saved_optimizer = None
        super().__init__(**kwargs)
        self._save_variables()

    def _optimizer_variables(self):
        opt = self.optimizer
        if opt is None:
            return []
        if not getattr(opt, "built", True):
            opt.build(self.model.trainable_variables)
        v = opt.variables
        return list(v() if callable(v) else v)

    def _save_variables(self):
        self._saved_model = _values(self.model.variables)
        self._saved_optimizer = _values(self._optimizer_variables())

    def save(self):
        self._save_variables()
        super().save()

    def restore(self):
        _assign(self.model.variables, self._saved_model)
        _assign(self._optimizer_variables(), self._saved_optimizer)
        super().restore()

    def sync(self):
        broadcast_variables(self.model.variables, root_rank=0)
        broadcast_variables(self._optimizer_variables(), root_rank=0)
        self._save_variables()
        super().sync()


class TensorFlowState(ObjectState):
    """TensorFlowState(variables, **kwargs): a list of tf.Variables plus plain values."""

    def __init__(self, variables=None, session=None, **kwargs):
        if session is not None:
            raise ValueError("TensorFlowState: TensorFlow 1 sessions are not supported by Loom")
        self.variables = list(variables or [])
        self._saved_variables = _values(self.variables)
        super().__init__(**kwargs)

    def save(self):
        self._saved_variables = _values(self.variables)
        super().save()

    def restore(self):
        _assign(self.variables, self._saved_variables)
        super().restore()

    def sync(self):
        broadcast_variables(self.variables, root_rank=0)
        self._saved_variables = _values(self.variables)
        super().sync()


def _internal(exc):
    """The LoomInternalError a TensorFlow error carries (its text is in the
    error's message, after the Python traceback), or None."""
    text = str(getattr(exc, "message", "") or exc)
    m = re.search(r"LoomInternalError: ([^\n]*)", text)
    return LoomInternalError(m.group(1)) if m else None


def run(func):
    """Decorator: func(state, ...) survives failures and membership changes."""

    @functools.wraps(func)
    def unwrapped(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as e:
            internal = _internal(e)
            if internal is None:
                raise
            raise internal from e
    return run_fn(unwrapped, reset)
