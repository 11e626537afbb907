"""Elastic training with Horovod's API: the job shrinks when ranks die or
hosts leave, and grows when the launcher starts ranks on new hosts, while
training goes on from the last commit.

    import loom.torch as hvd

    hvd.init()
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()          # a point to roll back to; joins happen here

    train(state)

Start it with `loomrun --elastic --host-discovery-script S ...` (docs/launching.md,
"Elastic jobs"). What happens on a failure: the collective in flight raises
LoomInternalError (Horovod's HorovodInternalError) on every survivor, within
a fraction of a second; run() restores the state of the last commit, the
survivors and any new processes form the next epoch of the world
(loom_comm_rebuild: survivors keep their order and come first), rank 0 (a
survivor) broadcasts the committed state to everyone, and the function is
called again. At a commit where new processes wait to join, commit() raises
HostsUpdatedInterrupt, and run() does the same without the roll back.

Process sets other than the global one end at a reset (their ranks were the
old epoch's): register them again from a reset callback."""
import copy
import functools

from . import _basics
from ._loom import LoomError, LoomInternalError

# Horovod's name for the failures elastic training recovers from.
HorovodInternalError = LoomInternalError


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by State.commit() (check_host_updates) on every rank at once when
    the membership is to change without a failure: processes wait to join.
    skip_sync: True when no rank is new, so the state need not be broadcast."""

    def __init__(self, skip_sync=False):
        super().__init__("loom: the job's hosts changed: the world is rebuilt at this commit")
        self.skip_sync = skip_sync


def reset():
    """Form the next epoch of the world (every engine stopped, every
    communicator of this epoch released). Raises LoomError when it cannot:
    the job is not elastic, fewer than LOOM_ELASTIC_MIN_NP ranks are left, or
    this rank was left out of the new epoch (stale)."""
    if not _basics._elastic():
        raise LoomError("loom: elastic reset needs an elastic job (loomrun --elastic, or "
                        "LOOM_ELASTIC=1 with LOOM_STORE served outside the ranks)")
    _basics._rebuild()


class _HostMessages:
    """What Horovod's State._host_messages (the driver's notifications) tells a
    rank: whether the membership is about to change. Here: whether processes
    wait to join or the launcher has started some (loom_comm_join_waiting), as
    this rank reads the store now (not collective: a rank may poll it while it
    waits for new hosts; commit() decides for all ranks)."""

    def qsize(self):
        world = _basics._world
        if world is None or world.closed or not _basics._elastic():
            return 0
        return world.join_waiting()

    def empty(self):
        return self.qsize() == 0


class State:
    """What elastic training keeps: save() at each commit, restore() after a
    failure, sync() from rank 0 after every reset. bcast_object(obj) -> obj of
    rank 0; get_rank() -> this rank."""

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []
        self._host_messages = _HostMessages()
        # Horovod's scripts reset it to force the next check; nothing here reads it.
        self._last_updated_timestamp = 0

    def register_reset_callbacks(self, callbacks):
        """Call each of callbacks (no arguments) after every reset, once the
        world has its new size: to scale the learning rate, rebuild process
        sets, and the like."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Save the state as the one to roll back to, then check_host_updates()."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Collective: raise HostsUpdatedInterrupt on every rank when processes
        wait to join the job (the launcher started them on new hosts)."""
        world = _basics._world
        if world is None or world.closed or not _basics._elastic():
            return
        if world.join_pending() > 0:
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        """Called after every reset, before the callbacks (subclasses adapt to the new size)."""


class ObjectState(State):
    """Plain Python values as attributes (ObjectState(epoch=0, batch=0)):
    committed by value, restored on failure, broadcast from rank 0 by sync()."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: copy.deepcopy(getattr(self, attr)) for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, copy.deepcopy(value))


def run_fn(func, reset_fn):
    """func(state, ...) run to completion across failures and membership
    changes: the body of every adapter's elastic.run."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except LoomInternalError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            reset_fn()
            state.on_reset()
    return wrapper


def run(func):
    """Decorator: func(state, ...) survives failures and membership changes
    (see the module's documentation)."""
    return run_fn(func, reset)
