"""A rank that dies turns into a LoomError on the others, never a hang: rank 1
exits abruptly while a large allreduce runs; rank 0's pending (the one in
flight inside the engine) and later loom.torch calls raise. Started by
test_python.sh with LOOM_* variables, a tcp store and LOOM_SHM=0 (under
loomrun, the launcher would end rank 0 itself)."""
import os
import sys
import time

import torch

import loom.torch as hvd

hvd.init()
R = hvd.rank()
hvd.allreduce(torch.ones(4), name="warmup")
big = torch.ones(48 << 20)   # 192 MiB: long enough over TCP to die in the middle
if R == 1:
    hvd.allreduce_async_(big, name="big", op=hvd.Sum)
    time.sleep(0.05)
    os._exit(3)        # no shutdown, no goodbye
t0 = time.monotonic()
try:
    hvd.allreduce_(big, name="big", op=hvd.Sum)
    print("rank 0: the large allreduce completed before rank 1 died (no failure in flight)")
except hvd.HorovodInternalError as e:
    print("rank 0 got, in flight: %s (after %.1f s)" % (e, time.monotonic() - t0))
try:
    hvd.allreduce(torch.ones(4), name="after.death")
    print("rank 0 FAIL: the allreduce with a dead rank completed")
    sys.exit(1)
except hvd.HorovodInternalError as e:
    took = time.monotonic() - t0
    print("rank 0 got: %s (after %.1f s)" % (e, took))
try:
    hvd.allreduce(torch.ones(4), name="later")
    print("rank 0 FAIL: a later call succeeded")
    sys.exit(1)
except hvd.HorovodInternalError as e:
    print("rank 0 later call: %s" % e)
hvd.shutdown()
print("rank 0: peer loss reported in %.1f s" % took)
sys.exit(0 if took < 30 else 1)
