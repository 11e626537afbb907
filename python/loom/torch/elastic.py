"""Horovod's horovod.torch.elastic over Loom: run, TorchState, ObjectState,
ElasticSampler (see loom/elastic.py for what happens on a failure)."""
import copy
import math
import random

import torch

from .. import _basics
from ..elastic import (  # noqa: F401
    HorovodInternalError, HostsUpdatedInterrupt, LoomInternalError, State, reset, run, run_fn)
from .. import elastic as _elastic
from . import broadcast_object, broadcast_optimizer_state, broadcast_parameters, rank, size


class ObjectState(_elastic.ObjectState):
    """ObjectState(epoch=0, batch=0): plain values, broadcast with broadcast_object."""

    def __init__(self, **kwargs):
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)


class ElasticSampler(torch.utils.data.Sampler):
    """A sampler that shards a dataset over however many ranks there are now
    and, after a reset, hands out only the samples this epoch has not yet
    processed. Call record_batch(batch_idx, batch_size) after each batch (or
    record_indices) and keep it in a TorchState, which commits, restores and
    broadcasts its position."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0     # samples of this epoch done by all ranks together
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices = []
        self.indices = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices):
        self.processed_num += len(indices) * self.num_replicas

    def get_indices(self, batch_idx, batch_size):
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self):
        self.num_replicas = size() if _basics.is_initialized() else 1
        self.rank = rank() if _basics.is_initialized() else 0
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        idx = self.remaining_indices[:]
        idx += idx[:self.total_size - len(idx)]   # every rank the same number of samples
        self.indices = idx[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self):
        return self.num_samples


class _Handler:
    """Keeps one object with a state_dict (model, optimizer, sampler): a deep
    copy at each commit, loaded back on restore; subclasses say how to sync."""

    def __init__(self, value):
        self.value = value
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def reset(self):
        pass


class _ModelHandler(_Handler):
    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def restore(self):
        super().restore()
        self._drop_pending()

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)

    def reset(self):
        self._drop_pending()

    def _drop_pending(self):
        # A DistributedOptimizer may hold allreduces of the step that failed:
        # they belong to the old epoch and are never waited for.
        opt = self.value
        if hasattr(opt, "_handles"):
            opt._handles.clear()
            opt._synchronized = False
            for p in opt._allreduce_delay:
                opt._allreduce_delay[p] = opt.backward_passes_per_step


class _SamplerHandler(_Handler):
    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), name="sampler_state"))

    def reset(self):
        self.value.reset()


def _handler_for(value):
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(value)
    return None


class TorchState(_elastic.ObjectState):
    """TorchState(model, optimizer, **kwargs): the model's and optimizer's
    state_dicts, any ElasticSampler among kwargs, and plain values (epoch=0,
    batch=0) as attributes. commit() copies them, restore() puts the copies
    back, sync() broadcasts them from rank 0."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for name, value in kwargs.items():
            h = _handler_for(value) if value is not None else None
            if h is not None:
                handlers[name] = h
            else:
                plain[name] = value
        self._handlers = handlers
        for name, h in handlers.items():
            object.__setattr__(self, name, h.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers")
        if handlers and name in handlers:
            handlers[name].value = value
        object.__setattr__(self, name, value)

    def save(self):
        for h in self._handlers.values():
            h.save()
        super().save()

    def restore(self):
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def sync(self):
        for h in self._handlers.values():
            h.sync()
        super().sync()

    def reset(self):
        for h in self._handlers.values():
            h.reset()
        super().reset()
