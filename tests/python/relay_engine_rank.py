"""One rank of test_relay.py's engine scenario: loom.torch (Horovod's API),
whose background engine negotiates every new name with the other ranks. Five
allreduces of 256 int32, each under a new name so that every one takes a full
negotiation round; prints one line in relay_rank's format:
"rank R status NAME wrong W peak P: message"."""
import sys

import torch

import loom.torch as hvd

status, wrong, msg = "SUCCESS", 0, "ok"
rank = -1
try:
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    base = torch.arange(256, dtype=torch.int32)
    want = base * n + sum(range(n))
    for i in range(5):
        out = hvd.allreduce(base + rank, name="relay.engine.gradient.of.layer.%d" % i, op=hvd.Sum)
        wrong += int((out != want).sum())
    hvd.shutdown()
except Exception as exc:   # noqa: BLE001 - reported on stdout for the test to read
    status, msg = type(exc).__name__, str(exc).replace("\n", " ")
print("rank %s status %s wrong %d peak 0: %s" % (rank, status, wrong, msg))
sys.stdout.flush()
