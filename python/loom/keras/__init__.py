"""loom.keras: Horovod's Keras API over Loom, for Keras 3 on the TensorFlow
backend (`import loom.keras as hvd` in place of `import horovod.keras as hvd`
or `horovod.tensorflow.keras`): DistributedOptimizer and the callbacks
BroadcastGlobalVariablesCallback, MetricAverageCallback,
LearningRateWarmupCallback, plus the collectives of loom.tensorflow."""
import keras
import numpy as np
import tensorflow as tf

from .. import numpy as _lnp
from ..tensorflow import (  # noqa: F401
    Sum, Average, Min, Max, Product, Adasum, ProcessSet, global_process_set,
    init, shutdown, is_initialized, size, rank, local_size, local_rank, cross_size, cross_rank,
    is_homogeneous, add_process_set, remove_process_set,
    mpi_built, mpi_enabled, mpi_threads_supported, gloo_built, gloo_enabled, nccl_built,
    ddl_built, ccl_built, cuda_built, rocm_built, loom_built,
    allreduce, grouped_allreduce, allgather, broadcast, alltoall, reducescatter, barrier, join,
    broadcast_variables, broadcast_object, allgather_object, Compression, HorovodInternalError,
    HostsUpdatedInterrupt, LoomError, LoomInternalError, _allreduce_grads,
    grouped_allgather, grouped_reducescatter, broadcast_, broadcast_global_variables, size_op,
    local_size_op, rank_op, local_rank_op, process_set_included_op, broadcast_object_fn,
    DistributedGradientTape, PartialDistributedGradientTape, _executing_eagerly, _layer_list)
from .. import _basics, _engine


def _key(v):
    return id(v)


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True,
                         local_layers=None, **kwargs):
    """A copy of optimizer (same class and configuration) whose apply() first
    reduces the gradients (op, Average by default) over the ranks, in one
    grouped call per step. Works inside model.fit's compiled train step. The
    trainable weights of local_layers (PartialDistributedOptimizer) keep
    their own gradients, divided by the size where scale_local_gradients."""
    if op == Adasum:
        raise NotImplementedError("DistributedOptimizer: Adasum is not implemented by Loom")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be at least 1")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if isinstance(optimizer, type) or not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError("DistributedOptimizer takes a Keras optimizer instance, not %r" % (optimizer,))
    op = Average if op is None else op
    base = optimizer.__class__
    pre, post = ((1.0 / gradient_predivide_factor, gradient_predivide_factor) if op == Average
                 else (1.0, 1.0))
    prefix = _engine.engine_for(process_set).auto_name(name or "DistributedOptimizer")
    local = {_key(v) for layer in (local_layers or []) for v in layer.trainable_weights}

    # backward_passes_per_step: Keras' own gradient accumulation, which
    # applies the mean of the accumulated gradients; Horovod applies their
    # sum unless average_aggregated_gradients.
    k = int(backward_passes_per_step)
    if k > 1 and not average_aggregated_gradients:
        post = post * k

    def reduce(self, grads, variables):
        grads = list(grads)
        shared = [i for i, v in enumerate(variables) if _key(v) not in local]
        reduced = _allreduce_grads([grads[i] for i in shared], compression, op, process_set, prefix,
                                   pre, post, sparse_as_dense)
        for i, g in zip(shared, reduced):
            grads[i] = g
        if local and scale_local_gradients:
            n = process_set.size()
            for i, v in enumerate(variables):
                if _key(v) in local and grads[i] is not None:
                    grads[i] = grads[i] / n
        return grads

    def apply(self, grads, trainable_variables=None):
        variables = list(trainable_variables if trainable_variables is not None
                         else self._trainable_variables)
        return base.apply(self, reduce(self, grads, variables), trainable_variables)

    def _compute_gradients(self, loss, var_list, tape=None):
        """[(reduced gradient, variable)] of loss (Keras 2's private API,
        which Horovod's tests call)."""
        var_list = list(var_list)
        if tape is None:
            if not callable(loss):
                raise ValueError("_compute_gradients: a tf.GradientTape, or loss as a callable, is required")
            with tf.GradientTape() as tape:
                loss = loss()
        return list(zip(reduce(self, tape.gradient(loss, var_list), var_list), var_list))

    cls = type(base.__name__, (base,), {"apply": apply, "_compute_gradients": _compute_gradients,
                                       "_loom_distributed": True})
    config = optimizer.get_config()
    if k > 1:
        config["gradient_accumulation_steps"] = k
    return cls.from_config(config)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                                average_aggregated_gradients=False, groups=None,
                                process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """DistributedOptimizer whose local_layers (Keras layers) keep their own
    gradients."""
    local_layers = _layer_list(local_layers)
    return DistributedOptimizer(optimizer, name=name, compression=compression,
                                sparse_as_dense=sparse_as_dense,
                                gradient_predivide_factor=gradient_predivide_factor, op=op,
                                backward_passes_per_step=backward_passes_per_step,
                                average_aggregated_gradients=average_aggregated_gradients,
                                groups=groups, process_set=process_set,
                                scale_local_gradients=scale_local_gradients, local_layers=local_layers)


def _assign_broadcast(variables, root_rank, process_set):
    broadcast_variables(list(variables), root_rank, process_set)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Make every rank start from root_rank's weights (at the start of training)
    and optimizer state (after the first batch, once the optimizer built it).
    local_variables: variables left as they are on each rank."""

    def __init__(self, root_rank, device="", local_variables=None, process_set=global_process_set):
        super().__init__()
        if isinstance(device, _basics.ProcessSet):   # the old (root_rank, process_set) call
            device, process_set = "", device
        self.root_rank = root_rank
        self.process_set = process_set
        self._local_vars = {_key(v) for v in (local_variables or [])}
        self._optimizer_done = False

    def register_local_var(self, var):
        """var is left out of the broadcast."""
        self._local_vars.add(_key(var))

    def on_train_begin(self, logs=None):
        _assign_broadcast([v for v in self.model.variables if _key(v) not in self._local_vars],
                          self.root_rank, self.process_set)

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
