"""Adasum (Maleki et al., "Scaling Distributed Training with Adaptive
Summation", MLSys 2021; Horovod's op=Adasum) over libloom's point-to-point
calls.

Two gradients a and b combine as

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

which is a + b for orthogonal vectors and their average for parallel ones. N
ranks combine in a binary tree by recursive doubling, as Horovod's: at step d
= 1, 2, 4, ... rank r exchanges its partial result with rank r ^ d and both
compute adasum(lower rank's, higher rank's), with the same operations in the
same order, so every rank ends with the same bits. With a rank count that is
not a power of two, each rank p + i (p the largest power of two below N) first
folds its vector into rank i (adasum(v_i, v_p+i)) and receives the result at
the end. Dot products and the combination run in float64; the caller casts
back to the tensor's type.

This exchanges whole vectors (log2 N of them per rank); Horovod's MPI
implementation halves them at each step. The result is the same tree.
"""
import numpy as np

TAG = 0x4144   # the engine's communicator carries no other point-to-point traffic


def combine(a, b):
    """adasum(a, b) in float64; a zero vector leaves the other as it is."""
    ab = float(np.dot(a, b))
    aa = float(np.dot(a, a))
    bb = float(np.dot(b, b))
    ca = 1.0 - ab / (2.0 * aa) if aa > 0 else 1.0
    cb = 1.0 - ab / (2.0 * bb) if bb > 0 else 1.0
    return ca * a + cb * b


def _exchange(comm, mine, peer):
    other = np.empty_like(mine)
    rq = comm.recv(other, peer, TAG, nonblocking=True)
    sq = comm.send(mine, peer, TAG, nonblocking=True)
    rq.wait()
    sq.wait()
    return other


def adasum(comm, v):
    """The Adasum of every rank's v (1-D float64, C-contiguous) over comm."""
    n, r = comm.size, comm.rank
    if n == 1:
        return v
    p = 1 << (n.bit_length() - 1)
    if r >= p:
        comm.send(v, r - p, TAG)
        out = np.empty_like(v)
        comm.recv(out, r - p, TAG)
        return out
    if r + p < n:
        other = np.empty_like(v)
        comm.recv(other, r + p, TAG)
        v = combine(v, other)
    d = 1
    while d < p:
        peer = r ^ d
        other = _exchange(comm, v, peer)
        v = combine(v, other) if r < peer else combine(other, v)
        d <<= 1
    if r + p < n:
        comm.send(np.ascontiguousarray(v), r + p, TAG)
    return v


def reference(vectors):
    """The same tree, computed from every rank's vector (for tests)."""
    vs = [np.asarray(v, dtype=np.float64) for v in vectors]
    n = len(vs)
    p = 1 << (n.bit_length() - 1)
    for i in range(n - p):
        vs[i] = combine(vs[i], vs[p + i])
    vs = vs[:p]
    while len(vs) > 1:
        vs = [combine(vs[i], vs[i + 1]) for i in range(0, len(vs), 2)]
    return vs[0]
