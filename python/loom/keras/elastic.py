"""Horovod's horovod.keras.elastic over Loom: run, KerasState, ObjectState and
the callbacks that commit and track progress inside model.fit."""
import keras

from ..tensorflow.elastic import (  # noqa: F401
    HorovodInternalError, HostsUpdatedInterrupt, LoomInternalError, ObjectState, State,
    TensorFlowKerasState, run)


class KerasState(TensorFlowKerasState):
    """KerasState(model, optimizer=None, **kwargs): model weights, optimizer
    variables and plain values (batch=0, epoch=0)."""


class CommitStateCallback(keras.callbacks.Callback):
    """state.commit() every batches_per_commit batches (and so a membership
    change can interrupt model.fit there)."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        # Every rank counts from here, survivors of a reset and newcomers alike:
        # commit() is collective, all must reach it at the same batch.
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps state.batch at the batch reached in this epoch; after a reset the
    epoch resumes with the batches it had left."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params.get("steps")
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch + 1

    def on_epoch_end(self, epoch, logs=None):
        if self.steps_per_epoch is not None:
            self.params["steps"] = self.steps_per_epoch
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps state.epoch at the number of epochs finished."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = self.state.epoch

    def on_train_begin(self, logs=None):
        # model.fit starts over at its epoch 0 after a reset.
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + epoch + 1
