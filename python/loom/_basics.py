"""Process-wide state shared by loom.numpy and loom.torch: the world
communicator, process sets, and the Horovod-style rank/size queries."""
import atexit
import os
import threading
import time

from . import _loom
from ._loom import LoomError

# Horovod's reduction op names; values are libloom's loom_op_t.
Sum = _loom.SUM
Average = _loom.AVG
Min = _loom.MIN
Max = _loom.MAX
Product = _loom.PROD
# Not a libloom op: loom.torch runs Adasum itself (loom/_adasum.py); the other
# adapters refuse it.
Adasum = 100

_lock = threading.RLock()
_world = None            # the world Comm
_sets = {}               # process_set_id -> ProcessSet
_next_set_id = 1
_shutdown_hooks = []     # callables run by shutdown(), last registered first
_add_set_gates = []      # callables run by add_process_set(set_id) before its split
_reset_hooks = []        # callables run after an elastic rebuild (adapters drop stale handles)


class ProcessSet:
    """A subset of the world's ranks with a communicator of its own (made by
    loom_comm_split). Create it before or after init(); add_process_set (or
    init(process_sets=...)) makes it usable, on every rank of the world."""

    def __init__(self, ranks):
        self.ranks = sorted(int(r) for r in ranks)
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError("ProcessSet: duplicate ranks in %r" % (ranks,))
        self.process_set_id = None
        self.comm = None           # None on ranks outside the set
        self._engine_comm = None   # the torch engine's own communicator (a duplicate)

    def included(self):
        _check_init()
        return _world.rank in self.ranks

    def size(self):
        return len(self.ranks)

    def rank(self):
        _check_init()
        return self.ranks.index(_world.rank) if self.included() else -1

    def __repr__(self):
        return "ProcessSet(process_set_id=%r, ranks=%r)" % (self.process_set_id, self.ranks)


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


# Any of these tells loom_init which rank this is (DESIGN.md, "Starting a job").
_LAUNCHER_VARS = ("LOOM_RANK", "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def _check_init():
    if _world is None or _world.closed:
        raise ValueError("loom has not been initialized; call init() first")


def init(comm=None, process_sets=None):
    """Join the job described by the environment (loomrun, torchrun, Slurm,
    mpirun: see DESIGN.md). comm: a list of world ranks to run on instead of all
    (the others get no communicator), as Horovod's init(comm=[...]). process_sets:
    ProcessSets to register at once. Calling init twice is harmless."""
    global _world
    with _lock:
        if _world is not None and not _world.closed:
            return
        if any(os.environ.get(v) for v in _LAUNCHER_VARS):
            _world = _loom.Comm()
        else:
            # Started by hand, as `python3 train.py`: a job of one, as Horovod does.
            _world = _loom.Comm(rank=0, size=1)
        if comm is not None and not isinstance(comm, _loom.Comm):
            ranks = sorted(int(r) for r in comm)
            sub = _world.split(0 if _world.rank in ranks else -1, _world.rank)
            _world.close()
            if sub is None:
                raise ValueError("init: rank is not in comm=%r" % (comm,))
            _world = sub
        global_process_set.ranks = list(range(_world.size))
        global_process_set.comm = _world
        _sets[0] = global_process_set
        for ps in process_sets or []:
            add_process_set(ps)
        # Horovod's variable (loom.runner --timeline-filename sets it); "DYNAMIC"
        # only allows start_timeline, which is always allowed here.
        path = os.environ.get("HOROVOD_TIMELINE")
        if path and path != "DYNAMIC" and timeline is None:
            start_timeline(path, os.environ.get("HOROVOD_TIMELINE_MARK_CYCLES") == "1")


def _release_sets():
    """Stop the adapters' engines and close every communicator but the world's;
    the process sets other than the global one are unregistered."""
    for hook in reversed(_shutdown_hooks):
        hook()
    stop_timeline()
    for ps in list(_sets.values()):
        if ps._engine_comm is not None:
            ps._engine_comm.close()
            ps._engine_comm = None
        if ps is not global_process_set:
            if ps.comm is not None:
                ps.comm.close()
            ps.process_set_id = None
        ps.comm = None
    _sets.clear()


def _elastic():
    """True in an elastic job (loomrun --elastic, or LOOM_ELASTIC=1)."""
    return os.environ.get("LOOM_ELASTIC") == "1"


def _rebuild():
    """Move to the next elastic epoch: stop the engines, release every
    communicator of this epoch and replace the world by the rebuilt one
    (survivors keep their order and come first, newcomers follow). Process
    sets other than the global one end here: their ranks were the old epoch's;
    add them again after the reset. Raises LoomError when the round fails
    (fewer than the minimum of ranks, or this rank was left out as stale)."""
    global _world
    with _lock:
        _check_init()
        old = _world
        old.revoke()   # frees any thread still blocked in a call of this epoch
        _release_sets()
        try:
            _world = old.rebuild()
            old.close()
        finally:
            global_process_set.ranks = list(range(_world.size))
            global_process_set.comm = _world
            _sets[0] = global_process_set
        for hook in _reset_hooks:
            hook()


def is_initialized():
    return _world is not None and not _world.closed


def shutdown():
    """Finish the adapters' background work, then release every communicator."""
    global _world
    with _lock:
        if _world is None:
            return
        _release_sets()
        _world.close()
        _world = None


atexit.register(shutdown)


def size():
    _check_init()
    return _world.size


def rank():
    _check_init()
    return _world.rank


def local_size():
    _check_init()
    return _world.local_size


def local_rank():
    _check_init()
    return _world.local_rank


def cross_size():
    """Number of hosts (Horovod: ranks with this local_rank across hosts)."""
    _check_init()
    return _world.node_count


def cross_rank():
    """Index of this host among the job's hosts."""
    _check_init()
    return _world.node_rank


def is_homogeneous():
    _check_init()
    counts = _world.size / max(_world.node_count, 1)
    return counts == _world.local_size


def add_process_set(process_set):
    """Register a ProcessSet (or a list of ranks); collective over the world,
    every rank must call it with the same ranks in the same order."""
    global _next_set_id
    _check_init()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    # The split below is a collective of the world outside the engine: a rank
    # still in an engine collective would meet it only at LOOM_TIMEOUT, with
    # the communicator lost. Negotiated first, such a mismatch fails here, on
    # every rank, after LOOM_STALL_TIMEOUT, and the engine goes on.
    for gate in _add_set_gates:
        gate(_next_set_id)
    with _lock:
        if ps.process_set_id is not None and ps.process_set_id in _sets:
            raise ValueError("add_process_set: %r is already registered" % (ps,))
        for r in ps.ranks:
            if not 0 <= r < _world.size:
                raise ValueError("add_process_set: rank %d outside the world of %d" % (r, _world.size))
        member = _world.rank in ps.ranks
        ps.comm = _world.split(0 if member else -1, ps.ranks.index(_world.rank) if member else 0)
        ps.process_set_id = _next_set_id
        _next_set_id += 1
        _sets[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set):
    """Unregister a ProcessSet; collective over the world."""
    _check_init()
    with _lock:
        ps = process_set
        if ps is global_process_set or ps.process_set_id not in _sets:
            return False
        for hook in reversed(_shutdown_hooks):
            hook(ps)
        if ps._engine_comm is not None:
            ps._engine_comm.close()
            ps._engine_comm = None
        if ps.comm is not None:
            ps.comm.close()
        del _sets[ps.process_set_id]
        ps.process_set_id = None
        ps.comm = None
        return True


def _set_comm(process_set):
    """The communicator of process_set on this rank, or an error if it is not a member."""
    _check_init()
    ps = process_set if process_set is not None else global_process_set
    if ps.process_set_id is None or _sets.get(ps.process_set_id) is not ps:
        raise ValueError("%r is not registered: call add_process_set first" % (ps,))
    if ps.comm is None:
        raise ValueError("rank %d is not a member of %r" % (_world.rank, ps))
    return ps.comm


# The build and runtime predicates a Horovod script may ask: Loom has no MPI,
# NCCL, Gloo, CUDA or ROCm inside this package, whatever the machine has.
def mpi_built():
    return False


def mpi_enabled():
    return False


def mpi_threads_supported():
    return False


def gloo_built():
    return False


def gloo_enabled():
    return False


def nccl_built():
    return 0


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    return False


def rocm_built():
    return False


def loom_built():
    return True


class Timeline:
    """A Chrome trace (chrome://tracing, Perfetto) of the engine's work, in the
    format of Loom's LOOM_TIMELINE files (loom-timeline-merge merges them):
    per round a "negotiation" span (NEGOTIATE, or NEGOTIATE_CACHED when the
    response cache served it; args: the names announced or run), per fused
    allreduce a "fusion" span (MEMCPY_IN_FUSION_BUFFER / _OUT_), per collective
    a "collective" span named after it (ALLREDUCE, ALLGATHER, ...; args: the
    tensor names, bytes, op), and with mark_cycles an instant CYCLE_START per
    round."""

    def __init__(self, path, rank, mark_cycles):
        self.path, self.rank, self.mark_cycles = path, rank, mark_cycles
        self.lock = threading.Lock()
        self.f = open(path, "w")
        self.f.write('[\n{"name": "process_name", "ph": "M", "pid": %d, "args": {"name": "rank %d"}}'
                     % (rank, rank))

    @staticmethod
    def now():
        return time.time() * 1e6

    def span(self, name, cat, start_us, end_us, args=None):
        import json
        with self.lock:
            if self.f is None:
                return
            self.f.write(',\n{"name": %s, "cat": "%s", "ph": "X", "ts": %.3f, "dur": %.3f, "pid": %d, '
                         '"tid": %d, "args": %s}' % (json.dumps(name), cat, start_us, end_us - start_us,
                                                     self.rank, threading.get_ident() & 0xffff,
                                                     json.dumps(args or {})))

    def instant(self, name, cat):
        with self.lock:
            if self.f is not None:
                self.f.write(',\n{"name": "%s", "cat": "%s", "ph": "i", "s": "p", "ts": %.3f, "pid": %d, '
                             '"tid": 0}' % (name, cat, self.now(), self.rank))

    def close(self):
        with self.lock:
            if self.f is not None:
                self.f.write("\n]\n")
                self.f.close()
                self.f = None


timeline = None   # the Timeline between start_timeline and stop_timeline


def _timeline_path(pattern, rank):
    """Rank 0 writes file_path itself; rank r the name with .r before the
    extension (as LOOM_TIMELINE without %r), or %r replaced by the rank."""
    if "%r" in pattern:
        return pattern.replace("%r", str(rank))
    if rank == 0:
        return pattern
    head, tail = os.path.split(pattern)
    stem, ext = os.path.splitext(tail)
    return os.path.join(head, "%s.%d%s" % (stem, rank, ext) if stem else "%s.%d" % (tail, rank))


def start_timeline(file_path, mark_cycles=False):
    """Horovod's timeline: from now on the engine records its negotiation,
    fusion and collectives into a Chrome trace (see Timeline). Starting again
    switches to the new file."""
    global timeline
    _check_init()
    with _lock:
        if timeline is not None:
            timeline.close()
        timeline = Timeline(_timeline_path(file_path, _world.rank), _world.rank, mark_cycles)


def stop_timeline():
    """End the trace started by start_timeline (the file is complete JSON)."""
    global timeline
    with _lock:
        if timeline is not None:
            timeline.close()
            timeline = None


def _env_float(name, default):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return float(v)
    except ValueError:
        raise ValueError("%s=%r is not a number" % (name, v)) from None


def _env_size(name, default):
    """A byte count with an optional K/M/G suffix (powers of 1024)."""
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    s = v.strip().upper().rstrip("B").rstrip("I")
    mult = 1
    if s and s[-1] in "KMG":
        mult = 1024 ** ("KMG".index(s[-1]) + 1)
        s = s[:-1]
    try:
        return int(float(s) * mult)
    except ValueError:
        raise ValueError("%s=%r is not a byte count" % (name, v)) from None


_objects_warned = False


def _warn_objects_trusted():
    """broadcast_object and allgather_object unpickle what other ranks send,
    as Horovod's do, so whoever can change those bytes on the way can run
    code in this process. Only LOOM_AUTH_KEY with LOOM_AUTH_MAC=full or encrypt
    (every TCP payload tagged) keeps a stranger's bytes out; say once when that is
    not set, so that nobody relies on it unawares (docs/security.md, "Threat model")."""
    global _objects_warned
    if _objects_warned:
        return
    _objects_warned = True
    keyed = bool(os.environ.get("LOOM_AUTH_KEY") or os.environ.get("LOOM_AUTH_KEY_FILE"))
    if keyed and os.environ.get("LOOM_AUTH_MAC", "full") != "headers":
        return
    import warnings
    warnings.warn("loom: broadcast_object/allgather_object unpickle what the other ranks send: "
                  "%s, so the ranks and the network between them must be trusted (whoever can "
                  "change the bytes on the way can run code here); set LOOM_AUTH_KEY with "
                  "LOOM_AUTH_MAC=full to refuse changed bytes" %
                  ("LOOM_AUTH_MAC=headers leaves payloads untagged" if keyed else "there is no LOOM_AUTH_KEY"),
                  RuntimeWarning, stacklevel=3)
