"""LOOM_AUTH_KEY over the store torch hands the "loom" backend (issue 26): two
ranks as threads over a HashStore sign their address records like those of
any other store (and work over shared memory); then rank 1 alone meets a
rank-0 record a store writer altered, one part at a time (each field with the
MAC kept, the MAC itself, the signature removed), and must fail at once with
an error naming rank 0 and LOOM_AUTH_KEY, never use the record."""
import datetime
import os
import sys
import threading

import torch
import torch.distributed as dist

import loom.torch.distributed as loom_dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Tally  # noqa: E402

T = Tally(0)
JOB = "c10d-signed"
os.environ["LOOM_AUTH_KEY"] = "c10d store key"
os.environ["LOOM_JOB_ID"] = JOB
os.environ["LOOM_SHM"] = "1"
KEY0 = "loom/%s/ext/addr/0" % JOB
SIG, SIG_BYTES = b"LOOMSIG1", 8 + 32
TIMEOUT = datetime.timedelta(seconds=60)


def rank_main(store, r, results, errors):
    try:
        pg = loom_dist._create_backend(store, r, 2, TIMEOUT)
        t = torch.full((5,), float(r + 1))
        pg.allreduce([t]).wait()
        results[r] = t
        del pg
    except Exception as e:  # reported by the main thread
        errors[r] = e


store = dist.HashStore()
results, errors = {}, {}
threads = [threading.Thread(target=rank_main, args=(store, r, results, errors)) for r in range(2)]
for th in threads:
    th.start()
for th in threads:
    th.join(120)
T.check(not errors and len(results) == 2, "signed group: both ranks finished (%s)" % errors)
T.check(all(torch.equal(t, torch.full((5,), 3.0)) for t in results.values()),
        "signed group: allreduce")
good = store.get(KEY0)
for r in range(2):
    v = store.get("loom/%s/ext/addr/%d" % (JOB, r))
    T.check(v.startswith(SIG) and len(v) > SIG_BYTES, "rank %d's record is signed: %r" % (r, v[:12]))

# A writer without the key keeps whatever signature is there.
head = SIG_BYTES if good.startswith(SIG) else 0
fields = good[head:].split(b"\n")
forged = {}
for i, (name, repl) in enumerate([("size", b"3"), ("transport address", b"tcp:127.0.0.1:1"),
                                  ("host id", b"elsewhere/0"), ("shared-memory address", b"-")]):
    f = list(fields)
    f[i] = repl
    forged[name] = good[:head] + b"\n".join(f)
forged["MAC"] = good[:8] + bytes([good[8] ^ 1]) + good[9:]
forged["signature removed"] = good[head:]

for name, value in forged.items():
    s = dist.HashStore()
    s.set(KEY0, value)
    try:
        loom_dist._create_backend(s, 1, 2, TIMEOUT)
        T.check(False, "%s rewritten: rank 1 accepted the record" % name)
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        msg = str(e)
        T.check("rank 0's record" in msg and "LOOM_AUTH_KEY" in msg,
                "%s rewritten: the error names rank 0 and LOOM_AUTH_KEY: %s" % (name, msg))
T.finish()
