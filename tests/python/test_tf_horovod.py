"""loom.tensorflow's Horovod parity, eagerly and in TF1 graphs: failures of
Horovod's types (FailedPreconditionError where the ranks disagree,
InvalidArgumentError for bad arguments), each followed by a good unnamed call
that must still match across ranks; graph names that do not depend on the
order the ops were built or run in; every collective's gradient against
finite differences of the job's total loss (with Horovod's factor per
collective); the API Horovod has beside the collectives (grouped_allgather,
grouped_reducescatter, broadcast_, the *_op, broadcast_global_variables,
IndexedSlices, DistributedOptimizer for TF1 and Keras optimizers,
PartialDistributedGradientTape). Run under loomrun -np N."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import loom.tensorflow as hvd  # noqa: E402
from common import Tally  # noqa: E402

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
T = Tally(R)


def raises(fn, types):
    try:
        fn()
    except types:
        return True
    except Exception as exc:   # noqa: BLE001 - the wrong type is the failure
        print("rank %d: %s raised %s: %s" % (R, fn, type(exc).__name__, str(exc)[:300]), flush=True)
        return False
    return False


def good_call(what):
    """An unnamed allreduce after a failure: the names must still match."""
    got = hvd.allreduce(tf.constant([float(R + 1)]), op=hvd.Sum)
    T.check(np.allclose(got.numpy(), N * (N + 1) / 2), "%s: the next unnamed call %s" % (what, got))


def session_run(build):
    """build() in a fresh graph, its result run in a session."""
    with tf.Graph().as_default():
        out = build()
        with tf.compat.v1.Session() as s:
            return s.run(out)


def test_errors():
    if N == 1:
        return
    bad = tf.ones([3 + R])
    T.check(raises(lambda: hvd.allreduce(bad), tf.errors.FailedPreconditionError), "shape mismatch type")
    T.check(raises(lambda: hvd.allreduce(bad), hvd.LoomError), "a mismatch is still a LoomError")
    good_call("shape mismatch")
    dt = tf.int32 if R % 2 else tf.float32
    T.check(raises(lambda: hvd.allgather(tf.ones([2, 2], dt)), tf.errors.FailedPreconditionError),
            "allgather type mismatch")
    good_call("allgather type mismatch")
    T.check(raises(lambda: hvd.broadcast(tf.ones([2]), root_rank=R), tf.errors.FailedPreconditionError),
            "broadcast root mismatch")
    good_call("broadcast root mismatch")
    T.check(raises(lambda: hvd.alltoall(tf.ones([N + 1])), tf.errors.InvalidArgumentError),
            "alltoall dimension 0 not divisible")
    T.check(raises(lambda: hvd.alltoall(tf.ones([N + 1]), splits=[1] * N), (tf.errors.InvalidArgumentError,
                                                                             ValueError)),
            "alltoall splits not adding up")
    good_call("alltoall bad splits")
    # The same in a TF1 graph: the errors come out of session.run with their types.
    T.check(raises(lambda: session_run(lambda: hvd.allreduce(tf.ones([2 + R]))),
                   tf.errors.FailedPreconditionError), "graph: shape mismatch type")
    good_call("graph shape mismatch")
    T.check(raises(lambda: session_run(lambda: hvd.alltoall(tf.ones([N + 1]))),
                   tf.errors.InvalidArgumentError), "graph: alltoall bad dimension")
    good_call("graph alltoall")
    # A rank that raises before the engine sees its call (a bad argument on
    # one rank only): the other ranks' call fails by itself, names stay in step.
    T.check(raises(lambda: hvd.alltoall(tf.ones([N + R])), (tf.errors.InvalidArgumentError,
                                                            tf.errors.FailedPreconditionError)),
            "alltoall bad on some ranks")
    good_call("alltoall bad on some ranks")


def test_graph_names():
    """Several unnamed collectives in one session.run, built in a different
    order on each rank: their names come from their inputs, so they match."""
    def build():
        a = tf.constant([1.0, float(R)], name="a")
        b = tf.constant([2.0, float(R)], name="b")
        c = tf.reshape(tf.constant([float(R)] * 3, name="c"), [1, 3])
        ops = [lambda: hvd.allreduce(a, op=hvd.Sum), lambda: hvd.allreduce(b, op=hvd.Sum),
               lambda: hvd.allgather(c)]
        order = list(range(len(ops)))
        if R % 2:
            order.reverse()
        built = {}
        for i in order:
            built[i] = ops[i]()
        return [built[i] for i in range(len(ops))]
    for _ in range(2):
        ra, rb, gc = session_run(build)
        s = sum(range(N))
        T.check(np.allclose(ra, [N, s]) and np.allclose(rb, [2 * N, s]), "graph allreduces %s %s" % (ra, rb))
        T.check(np.allclose(gc[:, 0], list(range(N))), "graph allgather %s" % gc)


# Each collective: f(x) on float64 x of 4 rows; Horovod's gradient is FACTOR
# times the derivative of the job's total loss sum_r <w_r, f(x_r)>.
def _collectives():
    return [
        ("allreduce Sum", lambda x: hvd.allreduce(x, op=hvd.Sum), 1.0),
        ("allreduce Average", lambda x: hvd.allreduce(x, op=hvd.Average), 1.0),
        ("allreduce scaled", lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5,
                                                     postscale_factor=3.0), 1.0),
        ("grouped_allreduce", lambda x: hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum)[1], 1.0),
        ("allgather", lambda x: hvd.allgather(x), 1.0 / N),
        ("grouped_allgather", lambda x: hvd.grouped_allgather([x, 3 * x])[1], 1.0 / N),
        ("broadcast", lambda x: hvd.broadcast(x, root_rank=0), (1.0 / N) if R == 0 else 0.0),
        ("alltoall", lambda x: hvd.alltoall(x, splits=[4 - (N - 1)] + [1] * (N - 1))[0], 1.0),
        ("reducescatter Sum", lambda x: hvd.reducescatter(x, op=hvd.Sum), float(N)),
        ("reducescatter Average", lambda x: hvd.reducescatter(x, op=hvd.Average), float(N)),
        ("grouped_reducescatter", lambda x: hvd.grouped_reducescatter([x, x * 2], op=hvd.Sum)[1], float(N)),
    ]


def test_gradients():
    rng = np.random.default_rng(11 + R)
    x0 = rng.standard_normal((4, 2))
    for what, f, factor in _collectives():
        w = tf.constant(np.random.default_rng(5 + R).standard_normal(tuple(f(tf.constant(x0)).shape)))
        xv = tf.Variable(x0)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * f(xv))
        got = tape.gradient(loss, xv)
        ok = got is not None
        if ok:
            got = got.numpy()
            eps = 1e-4
            num = np.zeros_like(x0)
            for p in range(N):
                for k in range(x0.size):
                    vals = []
                    for sign in (1, -1):
                        x = x0.copy()
                        if p == R:
                            x.flat[k] += sign * eps
                        local = tf.reduce_sum(w * f(tf.constant(x)))
                        vals.append(float(hvd.allreduce(local, op=hvd.Sum).numpy()))
                    if p == R:
                        num.flat[k] = (vals[0] - vals[1]) / (2 * eps)
            ok = np.allclose(got, factor * num, rtol=1e-5, atol=1e-6)
        T.check(ok, "%s gradient %s, want %s x %s" % (what, got, factor, None if not ok else num))


def test_api():
    g = hvd.grouped_allgather([tf.fill([R + 1, 2], float(R)), tf.fill([1], R)])
    T.check(g[0].shape[0] == N * (N + 1) // 2 and g[1].numpy().tolist() == list(range(N)), "grouped_allgather")
    rs = hvd.grouped_reducescatter([tf.ones([2 * N, 3]), tf.ones([N], tf.float64)], op=hvd.Sum)
    T.check(np.allclose(rs[0].numpy(), N) and rs[0].shape == (2, 3) and rs[1].shape == (1,),
            "grouped_reducescatter %s" % rs)
    v = tf.Variable(tf.fill([3], float(R)))
    out = hvd.broadcast_([v], root_rank=N - 1)
    T.check(np.allclose(v.numpy(), N - 1) and np.allclose(np.asarray(out[0]), N - 1), "broadcast_")
    T.check(int(hvd.size_op()) == N and int(hvd.rank_op()) == R and int(hvd.local_size_op()) == hvd.local_size()
            and int(hvd.local_rank_op()) == hvd.local_rank(), "the *_op")
    T.check(session_run(lambda: [hvd.size_op(), hvd.rank_op()]) == [N, R], "the *_op in a graph")
    T.check(raises(lambda: hvd.broadcast_global_variables(0), RuntimeError), "broadcast_global_variables eager")

    def bgv():
        var = tf.compat.v1.Variable(tf.fill([2], float(R)))
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            s.run(hvd.broadcast_global_variables(N - 1))
            return s.run(var)
    with tf.Graph().as_default():
        T.check(np.allclose(bgv(), N - 1), "broadcast_global_variables in a graph")
    got, splits = hvd.alltoall(tf.ones([N, 2]), splits=tf.constant([1] * N, tf.int64))
    T.check(splits.dtype == tf.int32 and splits.numpy().tolist() == [1] * N, "alltoall splits int32")
    T.check(not isinstance(hvd.alltoall(tf.ones([N, 2])), tuple), "alltoall without splits: the tensor alone")

    # float16 scaled in float32, as Horovod on the CPU: its tests want this exactly.
    x16 = tf.constant([0.3, 1.7, 2.9, 100.1], tf.float16)
    got = hvd.allreduce(x16, op=hvd.Sum, prescale_factor=0.37)
    want = tf.cast(tf.cast(x16, tf.float32) * tf.constant(0.37, tf.float32), tf.float16) * N
    T.check(np.array_equal(got.numpy(), want.numpy()), "float16 prescale %s != %s" % (got, want))

    # IndexedSlices: allgathered, averaged by dividing the values.
    sl = tf.IndexedSlices(tf.fill([1, 2], float(R + 1)), tf.constant([R]), dense_shape=tf.constant([N, 2]))
    for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / N)):
        red = hvd.allreduce(sl, op=op)
        dense = tf.convert_to_tensor(red).numpy()
        want = np.array([[r + 1.0] * 2 for r in range(N)]) * scale
        T.check(isinstance(red, tf.IndexedSlices) and np.allclose(dense, want), "IndexedSlices %s" % op)
    T.check(raises(lambda: hvd.allreduce(sl, op=hvd.Max), NotImplementedError), "IndexedSlices Max")


def test_optimizers():
    # A TF1 optimizer in a graph: compute_gradients averages over the ranks.
    with tf.Graph().as_default():
        w = tf.compat.v1.Variable([1.0, 1.0])
        loss = tf.reduce_sum(w * float(R + 1))
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
        train = opt.minimize(loss)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            s.run(train)
            T.check(np.allclose(s.run(w), 1.0 - (N + 1) / 2), "TF1 DistributedOptimizer")
    # A Keras optimizer from loom.tensorflow: a distributed copy of itself.
    import keras
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0))
    v = keras.Variable([1.0, 1.0])
    opt.apply([tf.constant([float(R + 1)] * 2)], [v])
    T.check(np.allclose(np.asarray(v), 1.0 - (N + 1) / 2), "Keras DistributedOptimizer from loom.tensorflow")
    # PartialDistributedGradientTape: a local layer keeps its own gradient / N.
    layer = keras.layers.Dense(1, kernel_initializer="ones", use_bias=False)
    shared = tf.Variable([float(R + 1)])
    x = tf.constant([[1.0]])
    layer(x)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(x) * float(R + 1)) + tf.reduce_sum(shared * float(R + 1))
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[layer])
    gl, gs = tape.gradient(loss, [layer.kernel, shared])
    T.check(np.allclose(gl.numpy(), (R + 1.0) / N) and np.allclose(gs.numpy(), (N + 1) / 2),
            "PartialDistributedGradientTape %s %s" % (gl, gs))
    # None gradients stay None; sparse ones are allgathered or made dense.
    emb = tf.Variable(tf.ones([N, 2]))
    unused = tf.Variable([1.0])
    for as_dense in (False, True):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(emb, [R]) * float(R + 1))
        tape = hvd.DistributedGradientTape(tape, sparse_as_dense=as_dense)
        ge, gu = tape.gradient(loss, [emb, unused])
        want = np.array([[r + 1.0] * 2 for r in range(N)]) / N
        T.check(gu is None and np.allclose(tf.convert_to_tensor(ge).numpy(), want)
                and isinstance(ge, tf.IndexedSlices) != as_dense, "sparse gradients (as dense: %s)" % as_dense)


for fn in (test_errors, test_graph_names, test_gradients, test_api, test_optimizers):
    T.run(fn)
hvd.shutdown()
T.finish()
