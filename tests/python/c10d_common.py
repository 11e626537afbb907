"""Starting a torch.distributed process group in the c10d tests, whichever
launcher started the ranks: torchrun (RANK, WORLD_SIZE, MASTER_ADDR/PORT: the
env:// rendezvous and its TCPStore) or loomrun (LOOM_RANK, LOOM_SIZE: a
FileStore in C10D_FILESTORE, which the test script sets, so the backend's
rendezvous runs over a second kind of torch store)."""
import datetime
import os

import torch.distributed as dist

import loom.torch.distributed  # noqa: F401 - registers "loom"


def init(backend="loom", timeout_s=60.0):
    timeout = datetime.timedelta(seconds=timeout_s)
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, timeout=timeout)
    else:
        rank, size = int(os.environ["LOOM_RANK"]), int(os.environ["LOOM_SIZE"])
        path = os.environ["C10D_FILESTORE"]
        store = dist.FileStore(path, size)
        dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                                timeout=timeout)
    return dist.get_rank(), dist.get_world_size()
