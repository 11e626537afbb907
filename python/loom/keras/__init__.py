"""loom.keras: Horovod's Keras API over Loom, for Keras 3 on the TensorFlow
backend (`import loom.keras as hvd` in place of `import horovod.keras as hvd`
or `horovod.tensorflow.keras`): DistributedOptimizer and the callbacks
BroadcastGlobalVariablesCallback, MetricAverageCallback,
LearningRateWarmupCallback, plus the collectives of loom.tensorflow."""
import keras
import numpy as np

from .. import numpy as _lnp
from ..tensorflow import (  # noqa: F401
    Sum, Average, Min, Max, Product, Adasum, ProcessSet, global_process_set,
    init, shutdown, is_initialized, size, rank, local_size, local_rank, cross_size, cross_rank,
    is_homogeneous, add_process_set, remove_process_set,
    mpi_built, mpi_enabled, mpi_threads_supported, gloo_built, gloo_enabled, nccl_built,
    ddl_built, ccl_built, cuda_built, rocm_built, loom_built,
    allreduce, grouped_allreduce, allgather, broadcast, alltoall, reducescatter, barrier, join,
    broadcast_variables, broadcast_object, allgather_object, Compression, HorovodInternalError,
    HostsUpdatedInterrupt, LoomError, LoomInternalError, _allreduce_grads)
from .. import _engine


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average,
                         process_set=global_process_set, **kwargs):
    """A copy of optimizer (same class and configuration) whose apply() first
    averages the gradients (op) over the ranks, in one grouped call per step.
    Works inside model.fit's compiled train step."""
    if op is None:
        raise ValueError("DistributedOptimizer: Adasum is not implemented by Loom")
    base = optimizer.__class__
    pre, post = ((1.0 / gradient_predivide_factor, gradient_predivide_factor) if op == Average
                 else (1.0, 1.0))
    prefix = _engine.engine_for(process_set).auto_name(name or "DistributedOptimizer")

    def apply(self, grads, trainable_variables=None):
        grads = _allreduce_grads(list(grads), compression, op, process_set, prefix, pre, post)
        return base.apply(self, grads, trainable_variables)

    cls = type(base.__name__, (base,), {"apply": apply, "_loom_distributed": True})
    return cls.from_config(optimizer.get_config())


def _assign_broadcast(variables, root_rank, process_set):
    broadcast_variables(list(variables), root_rank, process_set)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Make every rank start from root_rank's weights (at the start of training)
    and optimizer state (after the first batch, once the optimizer built it)."""

    def __init__(self, root_rank, process_set=global_process_set):
        super().__init__()
        self.root_rank = root_rank
        self.process_set = process_set
        self._optimizer_done = False

    def on_train_begin(self, logs=None):
        _assign_broadcast(self.model.variables, self.root_rank, self.process_set)

    def on_train_batch_end(self, batch, logs=None):
        if self._optimizer_done:
            return
        self._optimizer_done = True
        opt = self.model.optimizer
        if opt is not None and opt.variables:
            _assign_broadcast(opt.variables, self.root_rank, self.process_set)


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of each epoch, replace the numeric entries of logs by their
    average over the ranks (so rank 0 reports the whole job's metrics).
    Place it before callbacks that read the metrics."""

    def __init__(self, process_set=global_process_set):
        super().__init__()
        self.process_set = process_set

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        vals = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        avg = _lnp.allreduce(vals, op=Average, process_set=self.process_set)
        for k, v in zip(keys, avg):
            logs[k] = float(v)


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Ramp the learning rate from initial_lr / size to initial_lr over
    warmup_epochs (Goyal et al., 2017), batch by batch, as Horovod's does."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None,
                 verbose=0):
        super().__init__()
        self.initial_lr = initial_lr
        self.warmup_epochs = warmup_epochs
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def _steps(self):
        if self.steps_per_epoch:
            return self.steps_per_epoch
        return self.params.get("steps") or 1

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch >= self.warmup_epochs:
            return
        epoch = self.current_epoch + float(batch) / self._steps()
        n = size()
        lr = self.initial_lr / n * (epoch * (n - 1) / self.warmup_epochs + 1)
        self.model.optimizer.learning_rate = lr

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.warmup_epochs - 1:
            self.model.optimizer.learning_rate = self.initial_lr
            if self.verbose and rank() == 0:
                print("\nEpoch %d: finished gradual learning rate warmup to %g." % (epoch + 1, self.initial_lr))


class callbacks:
    """hvd.callbacks.X, as horovod.keras spells them."""
    BroadcastGlobalVariablesCallback = BroadcastGlobalVariablesCallback
    MetricAverageCallback = MetricAverageCallback
    LearningRateWarmupCallback = LearningRateWarmupCallback


from . import elastic  # noqa: E402,F401
