"""loom.torch.distributed: Loom as a torch.distributed backend.

    import loom.torch.distributed            # registers the backend "loom"
    torch.distributed.init_process_group("loom")   # instead of "gloo"

Importing registers the name "loom" with torch.distributed.Backend for CPU
tensors. The backend itself is the C++ extension loom.torch._c10d (a
c10d::Backend over libloom), built by python/setup.py where torch 2.1 or later
is installed. It rendezvouses through the store torch hands it (torchrun's
TCPStore, FileStore, a PrefixStore per group): no LOOM_STORE is needed, and
the process group's timeout becomes the communicator's."""
import torch.distributed as _dist

from . import _c10d

BACKEND = "loom"


def _create(store, rank, size, timeout):
    return _c10d.create_backend(store, rank, size, timeout.total_seconds())


def register():
    """Register "loom" with torch.distributed (done at import; idempotent)."""
    if hasattr(_dist.Backend, "LOOM") or BACKEND in getattr(_dist.Backend, "backend_list", []):
        return
    try:
        _dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
    except TypeError:   # torch before 2.2 has no devices argument
        _dist.Backend.register_backend(BACKEND, _create)


register()
