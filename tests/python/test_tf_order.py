"""loom.tensorflow in a graph whose collectives each rank starts in its own
order: 20 independent collectives (allreduce, allgather of rows that differ
per rank, reducescatter, broadcast), created in an order that depends on the
rank, so TensorFlow's executor starts them in that order, on 2 inter-op
threads. Each held a thread while it waited for the other ranks when it was
a tf.py_function: the first two of every rank then waited on each other's
last ones until LOOM_STALL_TIMEOUT failed them. As the asynchronous op
LoomAsyncCall (loom/tensorflow/_async.py), no thread waits and every result
is right. Once in a tf.function, once in a TF1 session. Fails, rather than
passing on the old path, where the op library is missing: every graph
collective is then a py_function. Run under loomrun -np N (N >= 2)."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402
import numpy as np  # noqa: E402

import loom.tensorflow as hvd  # noqa: E402
from loom.tensorflow import _async  # noqa: E402
from common import Tally  # noqa: E402

KINDS = 20     # collectives in the graph
THREADS = 2    # TensorFlow's inter-op threads: fewer than KINDS
tf.config.threading.set_inter_op_parallelism_threads(THREADS)
hvd.init()
R, N = hvd.rank(), hvd.size()
T = Tally(R)


def mine(k, r):
    """Rank r's input of collective k: rows that differ per rank for the
    allgathers (k % 4 == 1), N rows of 3 otherwise."""
    rows = r + 1 if k % 4 == 1 else N
    return (np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) + 100 * k + 10 * r)


def collective(k, x):
    name = "order.%d" % k
    if k % 4 == 0:
        return hvd.allreduce(x, op=hvd.Sum, name=name)
    if k % 4 == 1:
        return hvd.allgather(x, name=name)
    if k % 4 == 2:
        return hvd.reducescatter(x, op=hvd.Sum, name=name)
    return hvd.broadcast(x, root_rank=N - 1, name=name)


def want(k):
    if k % 4 == 0:
        return sum(mine(k, r) for r in range(N))
    if k % 4 == 1:
        return np.concatenate([mine(k, r) for r in range(N)])
    if k % 4 == 2:
        return sum(mine(k, r) for r in range(N))[R:R + 1]   # N rows: one per rank
    return mine(k, N - 1)


def order():
    """This rank's order of the collectives: rotated by a share of KINDS per
    rank, so each rank's first ones are others' last ones."""
    shift = R * KINDS // N
    return [(i + shift) % KINDS for i in range(KINDS)]


def check(outs, how):
    for k in range(KINDS):
        T.check(np.array_equal(outs[k], want(k)), "%s: collective %d: %s, want %s"
                % (how, k, outs[k], want(k)))


def test_op_built():
    T.check(_async.available(), "the op library did not load: %s" % _async.reason)


def test_tf_function():
    @tf.function
    def step(xs):
        outs = [None] * KINDS
        for k in order():
            outs[k] = collective(k, xs[k])
        return outs

    xs = [tf.constant(mine(k, R)) for k in range(KINDS)]
    for attempt in range(3):   # the graph again: the same names, free again
        check([o.numpy() for o in step(xs)], "tf.function, step %d" % attempt)


def test_session():
    with tf.Graph().as_default():
        outs = [None] * KINDS
        for k in order():
            outs[k] = collective(k, tf.constant(mine(k, R)))
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=THREADS)
        with tf.compat.v1.Session(config=config) as s:
            check(s.run(outs), "session")


T.run(test_op_built)
T.run(test_tf_function)
T.run(test_session)
T.finish()
