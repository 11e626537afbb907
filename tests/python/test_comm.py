"""The C extension's own API (loom._loom.Comm / Request): every collective
and point-to-point call, blocking and non-blocking (loom_i* + wait/test), the
GIL released while a call blocks, split, errors raised as LoomError with
libloom's message, and gated_allreduce (the loom engine's cached round). Run under loomrun -np N (or alone)."""
import threading
import time

import numpy as np

from loom import _loom
from loom._loom import LoomError
from common import Tally

c = _loom.Comm() if __import__("os").environ.get("LOOM_RANK") else _loom.Comm(rank=0, size=1)
R, N = c.rank, c.size
T = Tally(R)


def test_nonblocking():
    a = np.full(1000, R + 1, dtype=np.float64)
    out = np.empty_like(a)
    req = c.allreduce(a, out, _loom.SUM, nonblocking=True)
    T.check(isinstance(req, _loom.Request), "allreduce returned %r" % (req,))
    req.wait()
    T.check(req.done and np.all(out == N * (N + 1) / 2), "iallreduce result")
    b = np.arange(8, dtype=np.int32) if R == 0 else np.zeros(8, dtype=np.int32)
    req = c.broadcast(b, 0, nonblocking=True)
    while not req.test():
        pass
    T.check(np.array_equal(b, np.arange(8)), "ibroadcast + test")
    reqs = [c.allreduce(None, np.full(4, float(i + R)), _loom.MAX, nonblocking=True) for i in range(5)]
    for q in reqs:
        q.wait()
    g = np.empty(N * 3, dtype=np.int64)
    c.allgather(np.full(3, R, dtype=np.int64), g, nonblocking=True).wait()
    T.check(np.array_equal(g, np.repeat(np.arange(N), 3)), "iallgather")
    c.barrier(nonblocking=True).wait()
    # A request dropped without wait finishes before its buffers go.
    c.allreduce(None, np.ones(10), nonblocking=True)
    T.check(True, "")


def test_everything_blocking():
    # reduce to the last rank
    out = np.zeros(4, dtype=np.float32)
    c.reduce(np.full(4, R + 1.0, dtype=np.float32), out, _loom.SUM, N - 1)
    T.check(R != N - 1 or np.all(out == N * (N + 1) / 2), "reduce")
    # gather / scatter
    g = np.zeros(2 * N, dtype=np.int32) if R == 0 else None
    c.gather(np.full(2, R, dtype=np.int32), g, 0)
    T.check(R != 0 or np.array_equal(g, np.repeat(np.arange(N, dtype=np.int32), 2)), "gather")
    s = np.arange(3 * N, dtype=np.uint64) if R == 0 else None
    got = np.zeros(3, dtype=np.uint64)
    c.scatter(s, got, 0)
    T.check(np.array_equal(got, np.arange(3 * R, 3 * R + 3)), "scatter")
    # reduce_scatter
    rs = np.zeros(2, dtype=np.int64)
    c.reduce_scatter(np.arange(2 * N, dtype=np.int64), rs, _loom.SUM)
    T.check(np.array_equal(rs, N * np.arange(2 * R, 2 * R + 2)), "reduce_scatter")
    # allgatherv: rank r contributes r+1 elements
    counts = [r + 1 for r in range(N)]
    v = np.zeros(sum(counts), dtype=np.float64)
    c.allgatherv(np.full(R + 1, float(R)), v, counts)
    T.check(np.array_equal(v, np.concatenate([np.full(r + 1, float(r)) for r in range(N)])), "allgatherv")
    # alltoallv: rank r sends i+1 elements to rank i
    send = np.concatenate([np.full(i + 1, R * 10 + i, dtype=np.int32) for i in range(N)])
    recv = np.zeros((R + 1) * N, dtype=np.int32)
    c.alltoallv(send, [i + 1 for i in range(N)], recv, [R + 1] * N)
    T.check(np.array_equal(recv, np.concatenate([np.full(R + 1, r * 10 + R) for r in range(N)])), "alltoallv")
    a2a = np.zeros(N, dtype=np.int8)
    c.alltoall(np.arange(N, dtype=np.int8) + R, a2a)
    T.check(np.array_equal(a2a, np.arange(N) + R), "alltoall")
    # send/recv around a ring, raw bytes with an explicit dtype
    if N > 1:
        out = bytearray(b"%03d" % R)
        inn = bytearray(3)
        rq = c.recv(inn, (R - 1) % N, tag=7, dtype=_loom.UINT8, nonblocking=True)
        c.send(out, (R + 1) % N, tag=7, dtype=_loom.UINT8)
        rq.wait()
        T.check(bytes(inn) == b"%03d" % ((R - 1) % N), "send/recv: %r" % bytes(inn))
    T.check(c.local_size >= 1 and 0 <= c.local_rank < c.local_size and c.node_count >= 1, "topology")


def test_gil_released():
    """A Python thread keeps running while this one blocks in a collective."""
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)
    t = threading.Thread(target=spin)
    t.start()
    if R == 0:
        time.sleep(0.5)   # everyone else waits in the barrier meanwhile
    start = ticks[0]
    c.barrier()
    ran = ticks[0] - start
    stop.set()
    t.join()
    T.check(R == 0 or N == 1 or ran > 20, "the thread made %d ticks during a 0.5 s barrier" % ran)


def test_split_and_errors():
    sub = c.split(R % 2, -R)     # key -R: reversed order
    members = [r for r in range(N) if r % 2 == R % 2]
    T.check(sub.size == len(members) and sub.rank == len(members) - 1 - members.index(R), "split ranks")
    x = np.ones(3)
    sub.allreduce(None, x, _loom.SUM)
    T.check(np.all(x == len(members)), "allreduce on a split")
    sub.close()
    T.check(sub.closed, "closed")
    try:
        sub.barrier()
        T.check(False, "a closed comm ran a barrier")
    except ValueError:
        T.check(True, "")
    T.check(c.split(-1, 0) is None, "color < 0 gives None")
    try:
        c.broadcast(np.ones(2), N)
        T.check(False, "bad root accepted")
    except LoomError as e:
        T.check(e.status == _loom.ERR_INVALID_ARG and "root" in str(e), "LoomError: %s" % e)
    try:
        c.allreduce(np.ones(2), np.ones(3))
        T.check(False, "size mismatch accepted")
    except ValueError as e:
        T.check("bytes" in str(e), "size mismatch message: %s" % e)
    try:
        c.allreduce(None, b"abcd")
        T.check(False, "read-only buffer accepted")
    except TypeError as e:
        T.check("writable" in str(e), "read-only message: %s" % e)
    if N == 2:
        # Ranks disagree on the count: each one gets LOOM_ERR_MISMATCH, on a
        # throwaway communicator since a failed collective breaks its comm.
        # (2 ranks only: on 3, over shm, the middle rank waits for LOOM_TIMEOUT.)
        bad = c.split(0, R)
        try:
            bad.allreduce(None, np.ones(4 + R), _loom.SUM)
            T.check(False, "count mismatch completed")
        except LoomError as e:
            T.check(e.status in (_loom.ERR_MISMATCH, _loom.ERR_PEER_LOST), "mismatch status: %s" % e)
        bad.close()
    c.barrier()


def test_gated_allreduce():
    """The engine's cached round in one call: flags reduced (MIN), then the data
    only where flags[0] and flags[slot] are set on every rank and flags[1:keep]
    came back the same; the same answer on every rank."""
    def gated(go, slot_set, mark, slot=4, keep=3):
        flags = bytearray([go, mark, 0xff ^ mark, 0, 0, 0])
        flags[slot] = slot_set
        data = np.full(5, R + 1.0)
        r = c.gated_allreduce(flags, slot, keep, data, _loom.SUM, _loom.FLOAT64)
        return r, data
    r, data = gated(1, 1, 7)
    T.check(r == 2 and np.all(data == N * (N + 1) / 2), "gated: every rank offers: %s %s" % (r, data))
    r, data = gated(1 if R else 0, 1, 7)
    T.check(r == 0 and np.all(data == R + 1.0), "gated: rank 0 clears flags[0]: %s" % r)
    r, data = gated(1, 1 if R else 0, 7)
    T.check(r == 1 and np.all(data == R + 1.0), "gated: rank 0 does not offer the slot: %s" % r)
    r, data = gated(1, 1, 7 + R % 2)
    T.check(r == 2 if N == 1 else r == 1 and np.all(data == R + 1.0),
            "gated: odd ranks offer another mark: %s" % r)
    r, data = gated(1, 1, 7 + R % 2, keep=1)
    T.check(r == 2, "gated: marks not compared with keep=1: %s" % r)
    for args in ((bytearray(4), 4, 1), (bytearray(4), 2, 3), (bytearray(4), 0, 1)):
        try:
            c.gated_allreduce(args[0], args[1], args[2], np.ones(2), _loom.SUM, _loom.FLOAT64)
            T.check(False, "gated_allreduce%s did not fail" % (args[1:],))
        except ValueError:
            T.check(True, "")


for fn in (test_nonblocking, test_everything_blocking, test_gil_released, test_split_and_errors,
           test_gated_allreduce):
    T.run(fn)
c.close()
T.finish()
