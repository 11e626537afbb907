"""loom.torch.distributed: Loom as a torch.distributed backend.

    torch.distributed.init_process_group("loom")   # instead of "gloo"

An installed package (pip install ./python) declares the entry point
torch.distributed.backends: loom, from which torch 2.x registers the backend
the first time a group names it; without one (the package on PYTHONPATH),
``import loom.torch.distributed`` registers it. The backend itself is the C++
extension loom.torch._c10d (a c10d::Backend over libloom), built by
python/setup.py where torch 2.1 or later is installed. It rendezvouses through
the store torch hands it (torchrun's TCPStore, FileStore, a PrefixStore per
group): no LOOM_STORE is needed, and the process group's timeout becomes the
communicator's.

Where torch has CUDA the backend is registered for the devices "cpu" and
"cuda", else for "cpu" alone. Where libloom has CUDA too (the extension was
then compiled to take CUDA tensors: ``_c10d.cuda_built``), operations on CUDA
tensors are Loom's stream-ordered calls (docs/torch-distributed.md); without
it they fail with an error saying the extension was built without CUDA.

Per group, ``pg_options=loom.torch.distributed.Options(timeout=...)`` (torch's
Backend.Options for "loom") sets the timeout instead of ``timeout=``. The
group is a ProcessGroup whose backend name (what DDP's logging reports) is
"loom", wrapped in torch's ProcessGroupWrapper under
TORCH_DISTRIBUTED_DEBUG=DETAIL as torch wraps gloo."""
from datetime import timedelta

import torch
import torch.distributed as _dist

from . import _c10d

BACKEND = "loom"

try:
    from torch._C._distributed_c10d import Backend as _C10dBackend
    _OPTIONS_DEFAULT_TIMEOUT = _C10dBackend.Options(BACKEND)._timeout
except (ImportError, AttributeError):   # a torch without Backend.Options
    _C10dBackend = None
    _OPTIONS_DEFAULT_TIMEOUT = None


def Options(timeout=None):
    """Options of a loom group, for new_group(pg_options=...) or
    init_process_group(pg_options=...): torch's Backend.Options named "loom".
    timeout (a timedelta), where given, is the group's timeout in place of
    the timeout= argument."""
    if _C10dBackend is None:
        raise RuntimeError("loom: this torch has no Backend.Options")
    opts = _C10dBackend.Options(BACKEND)
    if timeout is not None:
        opts._timeout = timeout
    return opts


def _group_timeout(timeout, backend_options):
    """The timeout a group gets: pg_options' where it sets one (any
    Backend.Options, Loom's or another backend's), else timeout=."""
    if backend_options is None:
        return timeout
    t = getattr(backend_options, "_timeout", None)
    if t is None:
        t = getattr(backend_options, "timeout", None)
    if not isinstance(t, timedelta):
        raise TypeError("loom: pg_options must be loom.torch.distributed.Options() "
                        f"(torch's Backend.Options), not {type(backend_options).__name__}")
    if _OPTIONS_DEFAULT_TIMEOUT is not None and t == _OPTIONS_DEFAULT_TIMEOUT:
        return timeout   # left as constructed: timeout= decides
    return t


def devices():
    """The device types the backend is registered for: ["cpu", "cuda"] where
    torch is a CUDA build, else ["cpu"]. CUDA tensors go to Loom's GPU path
    where the extension was built with CUDA (libloom with loom_cuda.h,
    _c10d.cuda_built); without it the backend still takes them, to refuse
    them with an error that says why instead of torch's "No backend type
    associated with device type cuda"."""
    if torch.backends.cuda.is_built():
        return ["cpu", "cuda"]
    return ["cpu"]


def _bound_cuda_index(opts):
    """The CUDA device init_process_group's device_id binds the group to, or
    -1 (none, or a build without CUDA)."""
    bound = getattr(getattr(opts, "process_group", None), "bound_device_id", None)
    if bound is None or bound.type != "cuda" or not getattr(_c10d, "cuda_built", False):
        return -1
    return bound.index if bound.index is not None else torch.cuda.current_device()


def _backend(opts, backend_options, profile_name=BACKEND):
    timeout = _group_timeout(opts.timeout, backend_options)
    return _c10d.create_backend(opts.store, opts.group_rank, opts.group_size,
                                timeout.total_seconds(), profile_name,
                                _bound_cuda_index(opts)), timeout


def _create_backend(store, rank, size, timeout):
    """A bare Loom backend (a c10d::Backend, no ProcessGroup around it) over
    store, for rank of size ranks: what the tests drive directly."""
    return _c10d.create_backend(store, rank, size, timeout.total_seconds())


def _wrapped_for_debug(backend, opts, timeout):
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL, torch's ProcessGroupWrapper
    around backend, as torch puts it around gloo's and plugins' backends."""
    from torch.distributed import distributed_c10d as c10d
    if c10d.get_debug_level() != _dist.DebugLevel.DETAIL or not c10d.is_gloo_available():
        return backend
    return c10d._create_process_group_wrapper(
        wrapped_pg=backend, store_prefix=opts.group_id, store=opts.store,
        rank=opts.group_rank, world_size=opts.group_size, timeout=timeout)


class _LoomProcessGroup(_dist.ProcessGroup):
    """A ProcessGroup reporting its backend as "loom" (torch names every
    plugin's group "custom", which DDP's logging data then reports)."""

    def getBackendName(self):
        return BACKEND


def _create(opts, backend_options, btype=None, profile_name=BACKEND):
    """torch's extended-API creator: the group itself, its backend set."""
    backend, timeout = _backend(opts, backend_options, profile_name)
    backend = _wrapped_for_debug(backend, opts, timeout)
    try:
        pg = _LoomProcessGroup(opts.store, opts.group_rank, opts.group_size)
        btype = btype if btype is not None else _dist.ProcessGroup.BackendType.CUSTOM
        pg._set_default_backend(btype)
        for device in devices():   # one backend (one communicator) for each
            pg._register_backend(torch.device(device), btype, backend)
        bound = getattr(opts.process_group, "bound_device_id", None)
        if bound is not None:
            pg.bound_device_id = bound
    except (AttributeError, TypeError):   # a torch that builds groups otherwise
        return backend
    return pg


def _create_as_gloo(opts, backend_options):
    # Registered as gloo's type, its profiler events named "gloo:...", but the
    # C++ side of torch must not take it for Gloo's (DDP's logger reads a
    # group named "gloo" as a ProcessGroupGloo): the group's name stays "loom".
    return _create(opts, backend_options, _dist.ProcessGroup.BackendType.GLOO, "gloo")


def register():
    """Register "loom" with torch.distributed (done at import, and by torch
    through the package's entry point; idempotent)."""
    if BACKEND.upper() in getattr(_dist.Backend, "_plugins", {}):
        return
    try:
        _dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=devices())
    except TypeError:   # torch before 2.2 has no devices argument
        _dist.Backend.register_backend(BACKEND, _create, extended_api=True)


def map_gloo_to_loom():
    """Make the backend torch knows as "gloo" a Loom one: a program (or
    PyTorch's own test suite) that asks for gloo runs its groups over Loom,
    the name "gloo" and its group type unchanged. For tests and comparisons."""
    register()
    _dist.Backend._plugins["GLOO"] = _dist.Backend._BackendPlugin(_create_as_gloo, True)


register()
