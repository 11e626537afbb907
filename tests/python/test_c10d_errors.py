"""Wrong usage of the "loom" backend ends in an error, not a hang, on every rank
that is left: `mismatch` (ranks allreduce different sizes) and `dead` (the last
rank exits without a word while the others run a collective), `abort`
(another thread aborts the group while a recv waits). The process
group's timeout (10 s here) bounds each; the error is torch's DistBackendError
(a RuntimeError) with Loom's message naming this rank."""
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Tally  # noqa: E402
from c10d_common import init  # noqa: E402

mode = sys.argv[1]
rank, size = init(timeout_s=10.0)
T = Tally(rank)
err_type = getattr(dist, "DistBackendError", RuntimeError)


def expect_error(fn, what):
    t0 = time.monotonic()
    try:
        fn()
    except err_type as e:
        msg = str(e)
        T.check("rank %d" % rank in msg, "%s: message names the rank: %s" % (what, msg))
        T.check(time.monotonic() - t0 < 30, "%s: error within the timeout" % what)
        return msg
    T.check(False, "%s: no error" % what)
    return ""


t = torch.ones(3)
dist.all_reduce(t)
T.check(bool((t == size).all()), "allreduce before the failure")

if mode == "mismatch":
    bad = torch.ones(4 + rank)
    msg = expect_error(lambda: dist.all_reduce(bad), "mismatched allreduce")
    print("rank %d: %s" % (rank, msg), flush=True)
elif mode == "dead":
    if rank == size - 1:
        os._exit(0)
    big = torch.ones(1 << 18)

    def run():
        for _ in range(100):
            dist.all_reduce(big, async_op=True).wait()
    msg = expect_error(run, "a collective with a dead rank")
    print("rank %d: %s" % (rank, msg), flush=True)
elif mode == "abort":
    buf = torch.empty(3)
    w = dist.irecv(buf, src=(rank + 1) % size, tag=7)   # never sent
    threading.Timer(1.0, dist.distributed_c10d._abort_process_group).start()
    t0 = time.monotonic()
    msg = expect_error(lambda: w.wait(), "a pending recv when the group is aborted")
    T.check("abort" in msg and time.monotonic() - t0 < 8, "abort ends the recv at once: " + msg)
    print("rank %d: %s" % (rank, msg), flush=True)
    T.finish()   # the group is gone: nothing to destroy
else:
    raise SystemExit("unknown mode " + mode)

t0 = time.monotonic()
dist.destroy_process_group()
T.check(time.monotonic() - t0 < 30, "destroy_process_group after the failure returns")
T.finish()
