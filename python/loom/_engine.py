"""The background engine behind the framework adapters' collectives (loom.torch,
loom.tensorflow): Horovod's coordinator, over libloom.

Every collective is an entry with a name, which stays taken on its rank until
synchronize (wait) hands its result over, so a duplicate is refused whatever
the timing. A thread per process set runs
rounds: each round every rank contributes the entries submitted since the last
one (name and metadata, in loom._negotiation's binary format: nothing a peer
sends is unpickled) through an allgather on the engine's own communicator, so
every rank sees the same table and takes the same decisions from it. A name
is ready once every rank has submitted it; ready names run in the order they
became ready (ranks may submit in different orders). Ready allreduces of one
type, op and scaling are packed into a fusion buffer of up to
LOOM_FUSION_THRESHOLD bytes (default 64 MiB, 0 turns fusion off) and reduced in
one call. The engine wakes on a submission and runs a round at once; a round
that moved nothing is followed by the next one only after LOOM_CYCLE_TIME ms
(default 1) or the next submission, so ranks waiting on each other do not spin.
Rounds are run by whichever thread gets the round lock: the engine thread, or
a thread waiting for a handle while the engine thread is idle; synchronous
calls (loom.torch's) do not even wake the engine thread, so a small blocking
allreduce costs its rounds' collectives and no thread hand-over.

Names already negotiated skip the table exchange (Horovod's response cache): a
name that ran with the same metadata on every rank gets a slot in a cache every
rank builds identically (up to LOOM_CACHE_CAPACITY names, default 1024, 0 turns
it off). A round first reduces (MIN) one byte per slot, set where this rank has
that name submitted unchanged, and a leading byte cleared by any rank that
needs a full round (a new name, changed metadata, a pending table, shutdown, or
its cached names found no partner last round); the slots every rank set run at
once, in slot order, without any table exchange. Unnamed calls
("<kind>.noname.N", counted per kind) never repeat a name, so their slots are
per shape (the metadata of every rank), and the round's flags carry the N of
this rank's one unnamed hit: its slot runs only where every rank offers the
same N (two unnamed hits on a rank take a full round, which fuses them). A
round with a lone allreduce hit (a synchronous call's) reduces the flags and,
when every rank offers it, the data in one call into libloom (one release of
the GIL, no Python between the two).

Errors are raised, never turned into hangs: metadata that differs across ranks
fails that name on every rank with a message naming it; names that cannot
complete because every rank is blocked waiting (LOOM_STALL_TIMEOUT seconds,
default 2, of rounds without progress) or has shut down fail likewise. A
collective that fails for its own reasons (a bad argument, an unsupported type
or scaling) fails its own handle only, on every rank, and the engine serves
the next call; only a LoomInternalError (a lost peer, the transport, a
timeout: the communicator is gone) ends the engine and fails everything
pending with it.

Tensors are handled through a Backend (torch tensors, NumPy arrays), chosen by
the prefix of the type name that travels in the metadata ("torch.float32",
"np.float32"), so one engine per process set serves every adapter.

Tensors in CUDA memory (loom.torch's; their type name says so, "torch.cuda.float32",
so a rank on the CPU and one on a GPU fail as a mismatch instead of taking
different paths in libloom) go to libloom as device pointers: its blocking
calls take them (docs/gpu.md) and return once the result is in place. An
entry carries `ready`, an event recorded on the producer's stream at submit,
which the thread running the round waits for before anything reads the
tensor (a fusion copy, libloom); the copies and scaling a round queues on the
device are waited for (Backend.settle) before the handle completes, so the
result is there for whatever the program queues next, on any stream.
"""
import array
import threading
import time

from . import _adasum, _basics, _loom, _negotiation
from ._loom import LoomError, LoomInternalError

JOIN = "__loom_join__"
# The kind a rank submits under a collective's name when its own arguments
# were refused before it could submit the collective itself: the name still
# resolves on every rank (a mismatch where the others submitted the
# collective), so the names after it stay in step.
REFUSED = "__loom_refused__"
# Tensors larger than this are reduced in their own memory, never copied into a
# fusion buffer: at 1 MiB an allreduce already takes about as long as copying
# the tensor in and out of the buffer would (docs/performance.md, "Performance"), so fusing
# them saves nothing and costs two copies.
FUSE_MAX_TENSOR = 1 << 20


class Backend:
    """What the engine needs from a tensor library. Type names are
    "<prefix>.<type>"; tensors are C-contiguous, on the CPU or (where the
    backend says so in the type name) in CUDA memory."""
    prefix = None

    def dtype_name(self, t):
        raise NotImplementedError

    def loom_dtype(self, name):
        """libloom's dtype for a type name; TypeError if it has none."""
        raise NotImplementedError

    def esize(self, name):
        raise NotImplementedError

    def empty(self, shape, name):
        raise NotImplementedError

    def zeros(self, shape, name):
        raise NotImplementedError

    def empty_on(self, shape, name, like):
        """empty, on the device of the tensor like (fusion buffers, outputs)."""
        return self.empty(shape, name)

    def device_of(self, t):
        """A key for t's device (fusion buffers are one per type and device)."""
        return None

    def settle(self, t):
        """Return once the work this thread queued on t's device is done (a
        round's copies and scaling): then the result is in place."""

    def cap(self, t):
        """The object handed to loom._loom for t's memory (no copy)."""
        raise NotImplementedError

    def flat(self, t):
        """A 1-D view of t."""
        return t.reshape(-1)

    def copy_(self, dst, src):
        raise NotImplementedError

    def scale_(self, t, factor):
        raise NotImplementedError

    def clone(self, t):
        raise NotImplementedError

    def int_vector(self, values):
        raise NotImplementedError

    def to_float64(self, t):
        """t's elements as a 1-D NumPy float64 array (Adasum's arithmetic)."""
        raise NotImplementedError

    def from_float64_(self, t, values):
        """Write values (1-D float64) into t, cast to t's type."""
        raise NotImplementedError


BACKENDS = {}


def register_backend(b):
    BACKENDS[b.prefix] = b


def backend_of(name):
    return BACKENDS[name.split(".", 1)[0]]


# Set by a thread that submits and waits at once (loom.torch's synchronous
# calls): its submissions do not wake the engine thread, as the thread runs
# the rounds itself in wait(); waking it would only make the two contend.
inline = threading.local()


class Handle:
    __slots__ = ("done", "event", "result", "error", "name", "held")

    def __init__(self, name):
        self.done = False
        # Its name stays taken until wait() hands the result over, not just
        # until the collective ends: a second submission of the name before
        # then fails on every run, not only when the first was still slower
        # than the program (Horovod's tests of duplicate names rely on it).
        self.held = True
        # Made by the first thread that blocks on it (Engine._block): most
        # synchronous calls complete in the thread that waits, never blocking.
        self.event = None
        self.result = None
        self.error = None
        self.name = name


class Entry:
    """One submitted collective. output is written in place (it is the input
    tensor for the in-place calls); meta travels to the other ranks."""
    __slots__ = ("kind", "name", "tensor", "output", "op", "pre", "post", "root", "splits",
                 "handle", "finish", "backend", "slot", "count", "ready")

    def __init__(self, kind, name, tensor=None, output=None, op=None, pre=1.0, post=1.0,
                 root=-1, splits=None, finish=None, backend=None):
        self.kind, self.name, self.backend = kind, name, backend
        self.tensor, self.output = tensor, output
        self.op, self.pre, self.post, self.root, self.splits = op, pre, post, root, splits
        self.handle = Handle(name)
        self.finish = finish   # optional: called on the result before the handle completes
        self.slot = None       # its response-cache slot while a cache hit
        self.count = None      # N of an unnamed call "<kind>.noname.N" while a cache hit
        # An event on the stream that produced tensor (CUDA memory), else
        # None: waited for (its synchronize()) before the data is read.
        self.ready = None

    def wait_ready(self):
        """Wait until the producer's work on the tensor is done (once)."""
        ev, self.ready = self.ready, None
        if ev is not None:
            ev.synchronize()

    def meta(self):
        t = self.tensor
        return (self.kind, self.backend.dtype_name(t) if t is not None else "",
                tuple(t.shape) if t is not None else (),
                self.op, self.root, float(self.pre), float(self.post),
                tuple(int(s) for s in self.splits) if self.splits is not None else None)


def _describe(meta):
    kind, dtype, shape, op, root, pre, post, splits = meta
    if kind == REFUSED:
        return "nothing (its arguments were refused on that rank)"
    s = "%s %s%s" % (kind, dtype.split(".", 1)[-1], list(shape))
    if kind in ("allreduce", "reducescatter"):
        s += " op=%s" % {_loom.SUM: "Sum", _loom.AVG: "Average", _loom.MIN: "Min",
                         _loom.MAX: "Max", _loom.PROD: "Product",
                         _basics.Adasum: "Adasum"}.get(op, op)
        if pre != 1.0 or post != 1.0:
            s += " scale=%g/%g" % (pre, post)
    if kind == "broadcast":
        s += " root=%d" % root
    if splits is not None:
        s += " splits=%s" % list(splits)
    return s


def _mismatch(name, metas, joined, n):
    """None when the submissions of name agree, else the error text."""
    present = [(r, m) for r, m in enumerate(metas) if m is not None]
    kinds = {m[0] for _, m in present}

    def key(m):
        kind, dtype, shape, op, root, pre, post, splits = m
        if kind in ("allgather", "alltoall"):
            return (kind, dtype, shape[1:])
        if kind == "broadcast":
            return (kind, dtype, shape, root)
        if kind in ("barrier", JOIN, REFUSED):
            return (kind,)
        return (kind, dtype, shape, op, pre, post)

    if len({key(m) for _, m in present}) > 1:
        by = {}
        for r, m in present:
            by.setdefault(_describe(m), []).append(r)
        return ("loom: ranks disagree on tensor '%s': %s" %
                (name, "; ".join("ranks %s: %s" % (rs, d) for d, rs in by.items())))
    kind = kinds.pop()
    if joined and len(present) < len(metas) and kind != "allreduce":
        return ("loom: tensor '%s' (%s) cannot run while ranks %s have joined: only allreduce can"
                % (name, kind, sorted(joined)))
    if kind == "broadcast":
        root = present[0][1][4]
        if not 0 <= root < n:
            return "loom: broadcast '%s': root rank %d is not a rank of this process set (of %d)" % (
                name, root, n)
    if kind == "alltoall":
        for r, m in present:
            if len(m[7]) != n:
                return "loom: alltoall '%s': rank %d gave %d splits for %d ranks" % (name, r, len(m[7]), n)
            if any(s < 0 for s in m[7]) or (m[2] and sum(m[7]) != m[2][0]):
                return "loom: alltoall '%s': rank %d's splits %s do not add up to its dimension 0 (%d)" % (
                    name, r, list(m[7]), m[2][0] if m[2] else 0)
    return None


class Engine:
    def __init__(self, process_set):
        self.ps = process_set
        comm = _basics._set_comm(process_set)
        if process_set._engine_comm is None:
            # Its own communicator, so the engine's collectives never interleave
            # with calls the program makes on the set's one (loom.numpy).
            process_set._engine_comm = comm.split(0, comm.rank)
        self.comm = process_set._engine_comm
        self.n = self.comm.size
        self.me = self.comm.rank
        self.cycle = max(_basics._env_float("LOOM_CYCLE_TIME", 1.0), 0.0) / 1000.0
        self.threshold = _basics._env_size("LOOM_FUSION_THRESHOLD", 64 << 20)
        stall = _basics._env_float("LOOM_STALL_TIMEOUT", 2.0)
        self.stall_rounds = max(10, int(stall / max(self.cycle, 1e-4)))
        self.capacity = max(0, int(_basics._env_float("LOOM_CACHE_CAPACITY", 1024)))
        self.cond = threading.Condition()
        self.queue = []          # submitted, not yet seen by the engine thread
        self.fresh = []          # seen, to announce in the next full round
        self.hits = {}           # seen, cached unchanged: offered by slot, not announced
        self.local = {}          # announced, waiting for the other ranks
        self.names = set()       # every name pending here (queue, fresh, hits, local)
        self.idle = False        # the last round moved nothing
        self.done = False        # every rank shut down: no more rounds
        self.round_lock = threading.Lock()   # one round at a time, engine thread or waiter
        # The response cache, identical on every rank: name -> (slot, metas).
        # Keys are names, or (prefix, metas) for unnamed calls ("allreduce.noname"):
        # their names never come again, but their shapes do.
        self.cache = {}
        self.slots = []          # slot -> key
        self.mine = {}           # (prefix, this rank's meta) -> key of an unnamed call's slot
        self.waiting = 0         # user threads blocked in synchronize
        self.stop_req = False
        self.broken = None       # the LoomError that ended the engine
        self.thread = None
        self.counters = {}       # kind -> unnamed calls so far
        # State every rank keeps identical: it is computed from the round's messages only.
        self.table = {}          # name -> [meta or None] per rank, in the order names appeared
        self.join_round = {}     # rank -> round its join arrived
        self.shut = set()        # ranks that asked to stop
        self.stalled = 0
        self.round = 0
        self.fusion = {}         # dtype -> reusable fusion buffer
        self.stats = {"rounds": 0, "fused_calls": 0, "tensors": 0, "cached_rounds": 0}

    # ---- the program's side ------------------------------------------------

    def auto_name(self, kind):
        # Counted per kind: ranks that skip an unnamed call of one kind (an
        # allgather refused while they had joined) keep the others in step.
        n = self.counters[kind] = self.counters.get(kind, 0) + 1
        return "%s.noname.%d" % (kind, n)

    def submit(self, entry):
        return self.submit_many([entry])[0]

    def submit_many(self, entries, wake=True):
        """Submit entries together: the engine sees all of them in one round
        (so a group fuses), or none when one name is a duplicate. wake=False:
        the caller waits for them at once (its rounds, as inline.on)."""
        with self.cond:
            if self.broken is not None:
                raise _like(self.broken, "loom: the engine stopped after an error: %s" % self.broken)
            if self.stop_req:
                raise ValueError("loom: submit after shutdown")
            seen = set()
            for entry in entries:
                if entry.name in self.names or entry.name in seen:
                    raise ValueError("loom: a collective named '%s' is already pending on this rank "
                                     "(submitted, and its result not yet taken by synchronize); names "
                                     "must be unique among unfinished operations" % entry.name)
                seen.add(entry.name)
            self.names.update(seen)
            self.queue.extend(entries)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="loom-engine", daemon=True)
                self.thread.start()
            if wake and not getattr(inline, "on", False):
                self.cond.notify_all()
        return [e.handle for e in entries]

    def run(self, entry):
        """Submit entry and wait for it: a synchronous call, whose rounds this
        thread runs (see wait) without waking the engine thread."""
        return self.wait(self.submit_many([entry], wake=False)[0])

    def wait(self, handle):
        if not handle.done:
            with self.cond:
                self.waiting += 1
            try:
                while not handle.done:
                    # While the engine thread is not in a round, the waiting
                    # thread runs the rounds itself: a synchronous call then
                    # costs no hand-over to the engine thread and back. Rounds
                    # stay serial on this rank (the round lock), whoever runs them.
                    if self.round_lock.acquire(blocking=False):
                        try:
                            if not handle.done:
                                self._step_guarded()
                        finally:
                            self.round_lock.release()
                        if self.idle and not handle.done:
                            self._block(handle, self.cycle)
                    else:
                        self._block(handle, max(self.cycle, 1e-3))
            finally:
                with self.cond:
                    self.waiting -= 1
                    if not self.waiting and (self.queue or self.fresh or self.hits or self.local or
                                             self.stop_req):
                        # The engine thread's turn again. With nothing pending it
                        # would only wake to sleep again: a thread switch per call.
                        self.cond.notify_all()
        self._release(handle)
        if handle.error is not None:
            raise handle.error
        return handle.result

    def _release(self, handle):
        """The name of a finished handle is free again (see Handle.held)."""
        with self.cond:
            if handle.held:
                handle.held = False
                self.names.discard(handle.name)

    def _block(self, handle, timeout):
        """Wait up to timeout for handle to complete."""
        with self.cond:
            if handle.done:
                return
            if handle.event is None:
                handle.event = threading.Event()
            event = handle.event
        event.wait(timeout)

    def stop(self):
        with self.cond:
            if self.thread is None or self.stop_req:
                return
            self.stop_req = True
            self.cond.notify_all()
        self.thread.join()

    # ---- the engine thread -------------------------------------------------

    def _run(self):
        while True:
            with self.cond:
                # While a thread waits in wait() it runs the rounds itself:
                # rounds from this thread too would only contend with it for
                # the round lock (and the GIL), once a cycle.
                while (not (self.queue or self.fresh or self.hits or self.local or self.stop_req or
                            self.broken is not None or self.done) or
                       (self.waiting and not self.stop_req and self.broken is None and not self.done)):
                    self.cond.wait()
                if self.broken is not None or self.done:
                    return
                if self.idle and not self.queue and not self.stop_req:
                    # Nothing moved last round: wait for a submission (or
                    # the cycle) instead of spinning with the other ranks.
                    self.cond.wait(self.cycle)
            with self.round_lock:
                self._step_guarded()

    def _step_guarded(self):
        try:
            self._step()
        except LoomError as exc:   # the engine's own exchange failed: the communicator is gone
            self._break(exc)
        except BaseException as exc:   # a bug must not leave the program waiting forever
            self._break(LoomError("loom engine failed: %r" % (exc,)))
            raise

    def _step(self):
        """One round, under the round lock; nothing when nothing is pending."""
        with self.cond:
            if self.broken is not None or self.done:
                return
            if not (self.queue or self.fresh or self.hits or self.local or self.stop_req):
                return
            new, self.queue = self.queue, []
            waiting = self.waiting > 0 or self.stop_req
            stopping = self.stop_req
        tl = _basics.timeline
        if tl and tl.mark_cycles:
            tl.instant("CYCLE_START", "cycle")
        for e in new:
            if self._slot_of(e):
                self.hits[e.name] = e
            else:
                self.fresh.append(e)
        self._negotiate(stopping, waiting)

    def _negotiate(self, stopping, waiting):
        """The round proper: the cache's, else a full one."""
        if self.slots and self._cached_round(stopping):
            return
        with self.cond:
            # A full round announces everything not yet announced, the hits too.
            announce = self.fresh + list(self.hits.values())
            self.fresh, self.hits = [], {}
            for e in announce:
                self.local[e.name] = e
                e.slot = e.count = None
        msg = ([(e.name, e.meta()) for e in announce], stopping, waiting)
        if self._round(msg):
            with self.cond:
                self.done = True
                self.cond.notify_all()

    def _slot_of(self, e):
        """Whether e is a cache hit (its slot, and its N when unnamed, set on e)."""
        c = self.cache.get(e.name)
        if c is not None:
            if c[1][self.me] != e.meta():
                return False
            e.slot = c[0]
            return True
        counted = _counted(e.name)
        if counted is None or not self.mine:
            return False
        key = self.mine.get((counted[0], e.meta()))
        if key is None:
            return False
        e.slot, e.count = self.cache[key][0], counted[1]
        return True

    def _cached_round(self, stopping):
        """The cache's round: True when it ran instead of a full round.

        flags: [0] go (MIN: every rank can do without a full round), [1:9] the
        N of this rank's unnamed hit and [9:17] its complement (0xff where it
        has none: MIN's identity), then a byte per slot. The N of an unnamed
        call is what matches it across ranks (its slot only says its shape),
        so its slot runs only when every rank offers the same N: MIN of the
        bytes and of their complements gives this rank's bytes back only
        when every rank's are the same, and then on every rank."""
        flags = bytearray(_FLAG_SLOTS + len(self.slots))
        flags[1:_FLAG_SLOTS] = _NO_COUNT
        counted = None
        go = not (self.fresh or stopping or self.table or (self.hits and self.idle))
        for e in self.hits.values():
            flags[_FLAG_SLOTS + e.slot] = 1
            if e.count is not None:
                if counted is not None:
                    # Unnamed calls submitted together: one full round
                    # announces them all, so they fuse.
                    go = False
                counted = e
        flags[0] = go
        if counted is not None:
            mine = counted.count.to_bytes(8, "little") + (counted.count ^ _ALL_ONES).to_bytes(8, "little")
            flags[1:_FLAG_SLOTS] = mine
        tl = _basics.timeline
        if len(self.hits) == 1 and not tl:
            e = next(iter(self.hits.values()))
            if e.kind == "allreduce" and e.pre == 1.0 and e.op != _basics.Adasum:
                return self._gated_round(flags, e)
        t0 = tl.now() if tl else 0
        self.comm.allreduce(None, flags, _loom.MIN, dtype=_loom.UINT8)
        if not flags[0]:
            return False
        ready = []
        i = flags.find(1, _FLAG_SLOTS)
        while i >= 0:
            ready.append(self.slots[i - _FLAG_SLOTS])
            i = flags.find(1, i + 1)
        if counted is not None and flags[1:_FLAG_SLOTS] != mine:
            # Ranks offer different N: none runs it (the same test on every
            # rank); the next round is a full one, which names them.
            key = self.slots[counted.slot]
            if key in ready:
                ready.remove(key)
        if tl:
            tl.span("NEGOTIATE_CACHED", "negotiation", t0, tl.now(), {"ready": [_key_name(k) for k in ready]})
        self.stats["rounds"] += 1
        self.stats["cached_rounds"] += 1
        run = []
        with self.cond:
            if ready:
                by_slot = {e.slot: e for e in self.hits.values()}
                for key in ready:
                    e = by_slot[self.cache[key][0]]
                    del self.hits[e.name]
                    self.local[e.name] = e
                    run.append((e.name, list(self.cache[key][1])))
        self.idle = not ready
        self._execute(run, (), checked=True)
        return True

    def _gated_round(self, flags, e):
        """_cached_round for a lone allreduce (a synchronous call's): the
        flags and, when every rank offers it, the data in one call."""
        b = e.backend
        dt = b.loom_dtype(self.cache[self.slots[e.slot]][1][self.me][1])
        try:
            e.wait_ready()
            r = self.comm.gated_allreduce(flags, _FLAG_SLOTS + e.slot, 1 if e.count is None else _FLAG_SLOTS,
                                          b.cap(e.output), e.op, dt)
        except LoomInternalError:
            raise
        except LoomError as exc:
            if self._comm_broken(exc):
                raise
            # The data's call refused its arguments before moving anything,
            # as on every rank (the same metadata): this call fails alone.
            self.idle = False
            self._complete(e, error=exc)
            return True
        if not r:
            return False
        self.stats["rounds"] += 1
        self.stats["cached_rounds"] += 1
        self.idle = r == 1
        if r == 1:
            return True
        self.stats["tensors"] += 1
        try:
            if e.post != 1.0:
                b.scale_(e.output, e.post)
        except Exception as exc:   # noqa: BLE001 - handed to the waiting thread
            self._complete(e, error=LoomError("loom: '%s' failed: %s: %s" % (e.name, type(exc).__name__, exc)))
            return True
        self._complete(e, e.output)
        return True

    def _break(self, exc):
        with self.cond:
            self.broken = exc
            self.cond.notify_all()
            pending = list(self.local.values()) + self.queue + self.fresh + list(self.hits.values())
            self.local, self.queue, self.fresh, self.hits = {}, [], [], {}
            self.names.clear()
        for e in pending:
            self._complete(e, error=_like(exc, "loom: '%s' failed: %s" % (e.name, exc)))

    def _complete(self, e, result=None, error=None):
        if error is None and e.finish is not None:
            try:
                result = e.finish(result)
            except Exception as exc:   # noqa: BLE001 - handed to the waiting thread
                error = exc
        if error is None and e.tensor is not None:
            try:
                e.backend.settle(e.tensor)
            except Exception as exc:   # noqa: BLE001 - handed to the waiting thread
                error = LoomError("loom: '%s' failed: %s: %s" % (e.name, type(exc).__name__, exc))
        h = e.handle
        h.result, h.error = result, error
        with self.cond:
            if self.local.get(e.name) is e:
                del self.local[e.name]
            if self.hits.get(e.name) is e:
                del self.hits[e.name]
            h.done = True
            event = h.event
        if event is not None:
            event.set()

    def _exchange(self, msg):
        """Every rank's message of this round, decoded (loom._negotiation:
        bytes that can only describe collectives, never objects or code)."""
        data = _negotiation.encode(msg)
        lens = array.array("q", bytes(8 * self.n))
        self.comm.allgather(array.array("q", [len(data)]), lens, dtype=_loom.INT64)
        lens = lens.tolist()
        for r, n in enumerate(lens):
            if not 0 < n <= _negotiation.MAX_MESSAGE_BYTES:
                self._refuse(r, "it announced a message of %d bytes (at most %d)"
                             % (n, _negotiation.MAX_MESSAGE_BYTES))
        out = bytearray(sum(lens))
        self.comm.allgatherv(data, out, lens, dtype=_loom.UINT8)
        msgs, off = [], 0
        view = memoryview(out)
        for r, n in enumerate(lens):
            try:
                msgs.append(_negotiation.decode(view[off:off + n]))
            except _negotiation.NegotiationError as exc:
                self._refuse(r, exc)
            off += n
        return msgs

    def _refuse(self, r, why):
        """A message that is not negotiation: the exchange cannot be trusted
        any more, so the communicator is closed (the other ranks fail at
        once, not after LOOM_TIMEOUT) and the engine stops."""
        try:
            self.comm.abort()
        except LoomError:
            pass
        exc = LoomInternalError("loom: rank %d of process set %d sent a negotiation message this rank "
                                "cannot read: %s (a rank of another Loom version, or bytes changed on the way, "
                                "which LOOM_AUTH_KEY with LOOM_AUTH_MAC=full detects)"
                                % (r, self.ps.process_set_id, why))
        exc.status = _loom.ERR_TRANSPORT
        raise exc

    def _round(self, msg):
        """One negotiation round; True when the engine is to stop."""
        tl = _basics.timeline
        t0 = tl.now() if tl else 0
        msgs = self._exchange(msg)
        if tl:
            tl.span("NEGOTIATE", "negotiation", t0, tl.now(), {"announced": [n for n, _ in msg[0]]})
        self.round += 1
        self.stats["rounds"] += 1
        any_new = False
        for r, (new, stopping, _) in enumerate(msgs):
            for name, meta in new:
                any_new = True
                slot = self.table.setdefault(name, [None] * self.n)
                slot[r] = meta
                if meta[0] == JOIN:
                    self.join_round[r] = self.round
            if stopping:
                self.shut.add(r)
        joined = set(self.join_round)
        ready, failed = [], []
        lost = set()   # names that failed because ranks left
        for name, slot in self.table.items():
            kind = next(m for m in slot if m is not None)[0]
            if joined and name != JOIN and kind != "allreduce":
                # As Horovod: with a rank joined only allreduce runs; fail the
                # others at once rather than wait for every rank's name.
                failed.append((name, "loom: tensor '%s' (%s) cannot run while ranks %s have joined: "
                               "only allreduce can" % (name, kind, sorted(joined))))
                continue
            missing = [r for r in range(self.n) if slot[r] is None]
            if name != JOIN:
                missing = [r for r in missing if r not in joined]
            if not missing:
                ready.append(name)
            elif all(r in self.shut for r in missing):
                failed.append((name, "loom: tensor '%s' was submitted by ranks %s, but ranks %s shut "
                               "down without submitting it" % (name, _ranks(slot), missing)))
                lost.add(name)
        if not ready and not any_new and self.table and all(w for _, _, w in msgs):
            self.stalled += 1
        else:
            self.stalled = 0
        if self.stalled >= self.stall_rounds:
            # Every rank is blocked waiting and nothing moved: nothing pending can complete.
            waits = {r: [nm for nm, s in self.table.items() if s[r] is not None] for r in range(self.n)}
            for name, slot in self.table.items():
                if name not in ready and all(name != f for f, _ in failed):
                    missing = [r for r in range(self.n) if slot[r] is None]
                    failed.append((name, "loom: tensor '%s' was submitted by ranks %s but not by ranks %s, "
                                   "which are waiting on %s: every rank must submit the same names" %
                                   (name, _ranks(slot), missing,
                                    sorted({x for r in missing for x in waits[r]}) or "nothing")))
            self.stalled = 0
        # In an elastic job a rank that left is what hvd.elastic.run recovers
        # from: Horovod's HorovodInternalError, as for a lost connection.
        retry = LoomInternalError if _basics._elastic() else LoomError
        for name, text in failed:
            del self.table[name]
            e = self.local.pop(name, None)
            if e is not None:
                self._complete(e, error=(retry if name in lost else LoomError)(text))
        self.idle = not (ready or failed or any_new)
        self._execute([(name, self.table.pop(name)) for name in ready], joined)
        if len(self.shut) == self.n:
            for name, slot in list(self.table.items()):
                e = self.local.pop(name, None)
                if e is not None:
                    self._complete(e, error=LoomError(
                        "loom: tensor '%s' never ran: every rank shut down" % name))
            self.table.clear()
            return True
        return False

    def _execute(self, ready, joined, checked=False):
        """Run the ready names, [(name, metas)], in this order on every rank
        (checked: the cache's, whose metadata passed every check already)."""
        buckets = {}   # (dtype, op, pre, post) -> [(name, metas)], bytes
        for name, metas in ready:
            error = None if checked else _mismatch(name, metas, joined, self.n)
            # Left in self.local until completed: should the collective fail,
            # _break completes it with the error (nobody waits forever).
            e = self.local.get(name)
            if error is not None:
                if e is not None:
                    self._complete(e, error=LoomError(error))
                continue
            meta = next(m for m in metas if m is not None)
            kind = meta[0]
            if kind not in (JOIN, REFUSED) and not checked and all(m is not None for m in metas):
                self._remember(name, metas)
            if kind == "allreduce" and meta[3] == _basics.Adasum:
                self._guarded([(e, meta)], self._adasum)
                continue
            if kind == "allreduce":
                key = (meta[1], meta[3], meta[5], meta[6])
                nbytes = _numel(meta[2]) * backend_of(meta[1]).esize(meta[1])
                if nbytes > FUSE_MAX_TENSOR:
                    self._guarded([(e, meta)], self._allreduce)
                    continue
                items, size = buckets.get(key, ([], 0))
                if items and (size + nbytes > self.threshold):
                    self._guarded(items, self._allreduce)
                    items, size = [], 0
                items.append((e, meta))
                buckets[key] = (items, size + nbytes)
                continue
            self._guarded([(e, meta)], lambda items: self._one(kind, name, e, metas, meta))
        for items, _ in buckets.values():
            self._guarded(items, self._allreduce)

    def _one(self, kind, name, e, metas, meta):
        result = self._other(kind, name, e, metas, meta)
        if e is not None:
            self._complete(e, result)

    def _guarded(self, items, run):
        """run(items); should it fail for a reason of its own (not the
        communicator's), fail the entries still pending and go on. The checks
        that can fail before any data moves see the same metadata on every
        rank, so every rank fails the same entries and stays in step."""
        tl = _basics.timeline
        t0 = tl.now() if tl else 0
        try:
            run(items)
            if tl:
                m = items[0][1]
                tl.span(("ADASUM" if m[3] == _basics.Adasum else m[0].upper()), "collective", t0, tl.now(),
                        {"tensors": [e.name for e, _ in items if e is not None], "dtype": m[1],
                         "fused": len(items)})
        except LoomInternalError:
            raise
        except Exception as exc:   # noqa: BLE001 - handed to the waiting threads
            if isinstance(exc, LoomError) and self._comm_broken(exc):
                raise
            for e, _ in items:
                if e is not None and not e.handle.done:
                    err = exc if isinstance(exc, LoomError) else LoomError(
                        "loom: '%s' failed: %s: %s" % (e.name, type(exc).__name__, exc))
                    self._complete(e, error=err)

    @staticmethod
    def _comm_broken(exc):
        # libloom refuses bad arguments before any data moves (the call can be
        # retried); any other status left messages in flight.
        return getattr(exc, "status", None) not in (_loom.ERR_INVALID_ARG, _loom.ERR_UNSUPPORTED)

    def _remember(self, name, metas):
        metas = tuple(metas)
        key = name
        if ".noname." in name:
            counted = _counted(name)
            if counted is None:
                return   # a group's unnamed members: the group's N is not what matches them
            key = (counted[0], metas)
        c = self.cache.get(key)
        if c is not None:
            self.cache[key] = (c[0], metas)
        elif len(self.slots) < self.capacity:
            self.cache[key] = (len(self.slots), metas)
            self.slots.append(key)
            if key is not name:
                self.mine[(key[0], metas[self.me])] = key

    def _allreduce(self, items):
        """Reduce items (entries, or None where this rank joined) in one call."""
        meta = items[0][1]
        name, op, pre, post = meta[1], meta[3], meta[5], meta[6]
        b = backend_of(name)
        dt = b.loom_dtype(name)
        self.stats["tensors"] += len(items)
        for e, _ in items:
            if e is not None:
                e.wait_ready()
        if len(items) == 1:
            e = items[0][0]
            buf = e.output if e is not None else b.zeros(meta[2], name)
            if pre != 1.0:
                b.scale_(buf, pre)
            b.settle(buf)
            self.comm.allreduce(None, b.cap(buf), op, dtype=dt)
            if post != 1.0:
                b.scale_(buf, post)
            if e is not None:
                self._complete(e, e.output)
            return
        self.stats["fused_calls"] += 1
        total = sum(_numel(m[2]) for _, m in items)
        # On the device of this rank's first tensor (the others are copied
        # from theirs); one buffer per type and device.
        like = next((e.output for e, _ in items if e is not None), None)
        key = (name, b.device_of(like) if like is not None else None)
        fb = self.fusion.get(key)
        if fb is None or fb.shape[0] < total:
            fb = self.fusion[key] = (b.empty_on((total,), name, like) if like is not None
                                     else b.empty((total,), name))
        buf = fb[:total]
        tl = _basics.timeline
        t0 = tl.now() if tl else 0
        off = 0
        for e, m in items:
            k = _numel(m[2])
            if e is not None:
                b.copy_(buf[off:off + k], b.flat(e.output))
            else:
                b.copy_(buf[off:off + k], b.zeros((k,), name))
            off += k
        if tl:
            t1 = tl.now()
            tl.span("MEMCPY_IN_FUSION_BUFFER", "fusion", t0, t1, {"tensors": len(items)})
        if pre != 1.0:
            b.scale_(buf, pre)
        # libloom's call is not ordered after this thread's stream: the
        # copies in (and the scaling) must have landed first.
        b.settle(buf)
        self.comm.allreduce(None, b.cap(buf), op, dtype=dt)
        if post != 1.0:
            b.scale_(buf, post)
        t0 = tl.now() if tl else 0
        off = 0
        for e, m in items:
            k = _numel(m[2])
            if e is not None:
                b.copy_(b.flat(e.output), buf[off:off + k])
            off += k
        if tl:
            tl.span("MEMCPY_OUT_FUSION_BUFFER", "fusion", t0, tl.now(), {"tensors": len(items)})
        for e, m in items:
            if e is not None:
                self._complete(e, e.output)

    def _adasum(self, items):
        """op=Adasum: never fused (the combination depends on whole vectors)."""
        (e, meta), = items
        name, pre, post = meta[1], meta[5], meta[6]
        b = backend_of(name)
        self.stats["tensors"] += 1
        if e is not None:
            e.wait_ready()
        buf = e.output if e is not None else b.zeros(meta[2], name)
        if pre != 1.0:
            b.scale_(buf, pre)
        b.from_float64_(buf, _adasum.adasum(self.comm, b.to_float64(buf)))
        if post != 1.0:
            b.scale_(buf, post)
        if e is not None:
            self._complete(e, e.output)

    def _other(self, kind, name, e, metas, meta):
        c = self.comm
        if kind == JOIN:
            last = max(self.join_round.items(), key=lambda kv: (kv[1], kv[0]))[0]
            self.join_round.clear()
            return last
        if kind == "barrier":
            c.barrier()
            return None
        if kind == REFUSED:
            return None   # refused on every rank: each raises its own error
        t, b = e.tensor, e.backend
        e.wait_ready()
        dt = b.loom_dtype(meta[1])
        row = _numel(t.shape[1:])
        if kind == "broadcast":
            c.broadcast(b.cap(e.output), meta[4], dtype=dt)
            return e.output
        if kind == "allgather":
            firsts = [m[2][0] for m in metas]
            out = b.empty_on((sum(firsts),) + tuple(t.shape[1:]), meta[1], t)
            c.allgatherv(b.cap(t), b.cap(out), [f * row for f in firsts], dtype=dt)
            return out
        if kind == "alltoall":
            send = list(metas[self.me][7])
            recv = [metas[r][7][self.me] for r in range(self.n)]
            out = b.empty_on((sum(recv),) + tuple(t.shape[1:]), meta[1], t)
            c.alltoallv(b.cap(t), [s * row for s in send], b.cap(out), [s * row for s in recv], dtype=dt)
            return out, b.int_vector(recv)
        if kind == "reducescatter":
            a = e.output
            if e.pre != 1.0:
                b.scale_(a, e.pre)
            b.settle(a)
            shares = split_rows(t.shape[0], self.n)
            if shares[0] == shares[-1]:
                out = b.empty_on((shares[0],) + tuple(t.shape[1:]), meta[1], t)
                c.reduce_scatter(b.cap(a), b.cap(out), e.op, dtype=dt)
            else:
                c.allreduce(None, b.cap(a), e.op, dtype=dt)
                start = sum(shares[:self.me])
                out = b.clone(a[start:start + shares[self.me]])
            if e.post != 1.0:
                b.scale_(out, e.post)
            return out
        raise LoomError("loom: unknown collective %r for '%s'" % (kind, name))


_FLAG_SLOTS = 17               # the cached round's flags before the slots
_NO_COUNT = b"\xff" * 16
_ALL_ONES = (1 << 64) - 1


def _counted(name):
    """("<kind>.noname", N) for an unnamed call's name, else None."""
    head, _, n = name.rpartition(".")
    if head.endswith(".noname") and n.isdigit():
        return head, int(n)
    return None


def _key_name(key):
    return key if isinstance(key, str) else key[0] + ".*"


def _like(exc, text):
    """A new error of exc's class (LoomInternalError stays one: elastic code
    recovers from those only) with text and exc's status."""
    cls = type(exc) if isinstance(exc, LoomError) else LoomError
    new = cls(text)
    new.status = getattr(exc, "status", None)
    return new


def split_rows(rows, n):
    base, extra = divmod(rows, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def _numel(shape):
    k = 1
    for s in shape:
        k *= int(s)
    return k


def _ranks(slot):
    return [r for r, m in enumerate(slot) if m is not None]


engines = {}   # process_set_id -> Engine


_engines_lock = threading.Lock()


def engine_for(process_set):
    """The engine of process_set (made at its first use: a collective over the set)."""
    ps = process_set if process_set is not None else _basics.global_process_set
    _basics._set_comm(ps)
    eng = engines.get(ps.process_set_id)
    if eng is None:
        # One maker at a time: collectives of a graph start on several threads
        # at once (loom.tensorflow's async op), and each engine splits off a
        # communicator, a collective every rank must make once.
        with _engines_lock:
            eng = engines.get(ps.process_set_id)
            if eng is None:
                eng = engines[ps.process_set_id] = Engine(ps)
    return eng


def _stop_engines(process_set=None):
    for sid in list(engines):
        if process_set is None or sid == process_set.process_set_id:
            engines.pop(sid).stop()


_basics._shutdown_hooks.append(_stop_engines)


def _gate_add_set(set_id):
    """add_process_set's negotiation on the world's engine, where one runs."""
    eng = engines.get(_basics.global_process_set.process_set_id)
    if eng is not None and eng.broken is None:
        eng.wait(eng.submit(Entry("barrier", "__loom_add_process_set__.%d" % set_id)))


_basics._add_set_gates.append(_gate_add_set)
