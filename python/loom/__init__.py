"""Loom for Python: collectives over libloom with Horovod's names.

    import loom                      # NumPy arrays (also loom.numpy)
    import loom.torch as hvd         # PyTorch, a drop-in for horovod.torch
    import loom.tensorflow as hvd    # TensorFlow, for horovod.tensorflow
    import loom.keras as hvd         # Keras 3, for horovod.keras

Launch with `loomrun -np 4 python3 train.py` (or torchrun, srun, mpirun: see
the Loom README and docs/launching.md). The C core is loom._loom: Comm (one per communicator) and
Request (a non-blocking operation)."""
from ._loom import Comm, Request, LoomError, version  # noqa: F401
from ._basics import (  # noqa: F401
    Sum, Average, Min, Max, Product, Adasum, ProcessSet, global_process_set,
    init, shutdown, is_initialized, size, rank, local_size, local_rank, cross_size, cross_rank,
    is_homogeneous, add_process_set, remove_process_set,
    mpi_built, mpi_enabled, mpi_threads_supported, gloo_built, gloo_enabled, nccl_built,
    ddl_built, ccl_built, cuda_built, rocm_built, loom_built, start_timeline, stop_timeline)

try:
    from .numpy import (  # noqa: F401
        allreduce, allreduce_, grouped_allreduce, grouped_allreduce_, allgather, broadcast,
        broadcast_, alltoall, reducescatter, barrier, join, broadcast_object, allgather_object)
except ImportError as _e:   # NumPy missing: the Comm API and loom.torch still work
    if getattr(_e, "name", None) != "numpy":
        raise

__version__ = version()
