"""The "loom" backend rendezvousing through a HashStore (the in-process store
torch's own tests use) and a PrefixStore over it: three ranks as threads of
one process, each creating the backend as init_process_group would, then an
allreduce, an allgather and a broadcast on each. Rank 0 of a one-rank default
group, created over a HashStore by init_process_group, reports the tally."""
import os
import sys
import threading

import torch
import torch.distributed as dist

import loom.torch.distributed as loom_dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Tally  # noqa: E402

T = Tally(0)
N = 3


def rank_main(store, r, results, errors):
    try:
        pg = loom_dist._create_backend(dist.PrefixStore("threads", store), r, N,
                               __import__("datetime").timedelta(seconds=60))
        t = torch.full((5,), float(r + 1))
        pg.allreduce([t]).wait()
        outs = [[torch.empty(2) for _ in range(N)]]
        pg.allgather(outs, [torch.full((2,), float(r))]).wait()
        b = torch.full((3,), float(r))
        opts = dist.BroadcastOptions()
        opts.rootRank = 1
        pg.broadcast([b], opts).wait()
        results[r] = (t, [o.clone() for o in outs[0]], b)
        del pg
    except Exception as e:  # reported by the main thread
        errors[r] = e


store = dist.HashStore()
results, errors = {}, {}
threads = [threading.Thread(target=rank_main, args=(store, r, results, errors)) for r in range(N)]
for th in threads:
    th.start()
for th in threads:
    th.join(120)
T.check(not any(th.is_alive() for th in threads), "HashStore ranks: every thread ended")
T.check(not errors, "HashStore ranks: no errors (%s)" % errors)
for r, (t, gathered, b) in sorted(results.items()):
    T.check(torch.equal(t, torch.full((5,), float(N * (N + 1) // 2))), "HashStore rank %d: allreduce" % r)
    T.check(all(torch.equal(gathered[q], torch.full((2,), float(q))) for q in range(N)),
            "HashStore rank %d: allgather" % r)
    T.check(torch.equal(b, torch.full((3,), 1.0)), "HashStore rank %d: broadcast" % r)
T.check(len(results) == N, "HashStore: all %d ranks finished" % N)

# The default group over a HashStore: what a single-process test suite does.
dist.init_process_group("loom", store=dist.HashStore(), rank=0, world_size=1)
t = torch.arange(4.0)
dist.all_reduce(t)
T.check(torch.equal(t, torch.arange(4.0)), "HashStore default group of one: all_reduce")
dist.barrier()
dist.destroy_process_group()
T.finish()
