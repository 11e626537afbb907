"""loom.tensorflow: every collective on every type (bfloat16 included),
eagerly and inside tf.function; gradients through allreduce and allgather;
broadcast_variables; and the equivalence test: N ranks with
DistributedGradientTape, each on its shard, end with the weights of one process
trained on the whole batch from the same seed. Run under loomrun -np N."""
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
DTYPES = [tf.int8, tf.uint8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64]


def data(r, dt, k=6):
    return tf.cast(tf.range(k) % 5 + r + 1, dt)


def want_sum(dt, k=6):
    return sum(np.arange(k) % 5 + r + 1 for r in range(N)).astype(np.float64)


def test_collectives():
    for dt in DTYPES:
        got = hvd.allreduce(data(R, dt), op=hvd.Sum, name="ar.%s" % dt.name)
        T.check(got.dtype == dt and np.allclose(tf.cast(got, tf.float64).numpy(), want_sum(dt)),
                "allreduce %s: %s" % (dt.name, got))
        mx = hvd.allreduce(data(R, dt), op=hvd.Max)
        T.check(np.allclose(tf.cast(mx, tf.float64).numpy(), tf.cast(data(N - 1, dt), tf.float64).numpy()),
                "allreduce Max %s" % dt.name)
        g = hvd.allgather(tf.stack([data(R, dt, 3)] * (R + 1)))
        want = np.concatenate([np.stack([tf.cast(data(r, dt, 3), tf.float64).numpy()] * (r + 1)) for r in range(N)])
        T.check(np.array_equal(tf.cast(g, tf.float64).numpy(), want), "allgather %s" % dt.name)
        b = hvd.broadcast(data(R, dt), root_rank=N - 1)
        T.check(np.array_equal(tf.cast(b, tf.float64).numpy(), tf.cast(data(N - 1, dt), tf.float64).numpy()),
                "broadcast %s" % dt.name)
    x = tf.reshape(tf.range(2 * N, dtype=tf.float32) + 10 * R, [N, 2])
    got = hvd.alltoall(x)
    _, rs = hvd.alltoall(x, splits=[1] * N)
    want = np.stack([np.arange(2 * R, 2 * R + 2) + 10 * r for r in range(N)])
    T.check(np.array_equal(got.numpy(), want) and rs.numpy().tolist() == [1] * N, "alltoall")
    rsc = hvd.reducescatter(tf.ones([2 * N, 3]), op=hvd.Sum)
    T.check(np.array_equal(rsc.numpy(), np.full((2, 3), float(N))), "reducescatter")
    avg = hvd.allreduce(tf.constant([float(R)]))
    T.check(np.allclose(avg.numpy(), (N - 1) / 2), "allreduce Average")
    grouped = hvd.grouped_allreduce([tf.ones([2]), tf.ones([3], tf.float64) * R], op=hvd.Sum)
    T.check(np.allclose(grouped[1].numpy(), N * (N - 1) / 2), "grouped_allreduce")
    hvd.barrier()
    T.check(hvd.allgather_object(R) == list(range(N)), "allgather_object")
    T.check(hvd.broadcast_object({"r": R}, root_rank=0) == {"r": 0}, "broadcast_object")


@tf.function
def graph_step(x):
    return (hvd.allreduce(x, op=hvd.Sum, name="g.ar"), hvd.allgather(x, name="g.ag"),
            hvd.broadcast(x, 0, name="g.bc"))


def test_tf_function():
    for i in range(3):   # the traced names repeat every call
        x = tf.fill([4], float(R + i))
        ar, ag, bc = graph_step(x)
        T.check(np.allclose(ar.numpy(), sum(r + i for r in range(N))), "tf.function allreduce")
        T.check(ag.shape[0] == 4 * N and np.allclose(bc.numpy(), float(i)), "tf.function allgather/broadcast")


def test_gradients():
    v = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hvd.allreduce(v * (R + 1), op=hvd.Sum, name="grad.ar"))
    g = tape.gradient(loss, v)
    T.check(np.allclose(g.numpy(), N * (R + 1)), "allreduce gradient %s" % g)
    with tf.GradientTape() as tape:
        gathered = hvd.allgather(tf.stack([v] * (R + 1)), name="grad.ag")
        loss = tf.reduce_sum(gathered * tf.cast(tf.range(tf.shape(gathered)[0])[:, None] + 1, tf.float32))
    g = tape.gradient(loss, v)
    # d/dv: this rank's rows sit at offset sum(r+1 for r < R); as Horovod's, the
    # gradient is this rank's rows of the incoming gradients' average over the ranks.
    start = sum(r + 1 for r in range(R))
    want = sum(start + j + 1 for j in range(R + 1))
    T.check(np.allclose(g.numpy(), want), "allgather gradient %s != %s" % (g, want))
    w = tf.Variable(tf.fill([3], float(R)))
    hvd.broadcast_variables([w], root_rank=N - 1)
    T.check(np.allclose(w.numpy(), N - 1), "broadcast_variables")


def test_equivalence():
    BATCH, STEPS = 24, 6

    def batches():
        rng = np.random.default_rng(7)
        for _ in range(STEPS):
            x = rng.standard_normal((BATCH, 8)).astype(np.float32)
            yield x, (x[:, :1] > 0).astype(np.float32)

    def make():
        tf.random.set_seed(3)
        return [tf.Variable(tf.random.normal([8, 16])), tf.Variable(tf.zeros([16])),
                tf.Variable(tf.random.normal([16, 1])), tf.Variable(tf.zeros([1]))]

    def loss_fn(ws, x, y):
        h = tf.tanh(x @ ws[0] + ws[1])
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(y, h @ ws[2] + ws[3]))

    ref = make()
    opt = tf.keras.optimizers.SGD(0.5, momentum=0.9)
    for x, y in batches():
        with tf.GradientTape() as tape:
            loss = loss_fn(ref, x, y)
        opt.apply_gradients(zip(tape.gradient(loss, ref), ref))

    ws = make()
    hvd.broadcast_variables(ws, root_rank=0)
    opt = tf.keras.optimizers.SGD(0.5, momentum=0.9)
    shard = BATCH // N

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(ws, x, y)
        tape = hvd.DistributedGradientTape(tape)
        opt.apply_gradients(zip(tape.gradient(loss, ws), ws))

    for x, y in batches():
        step(x[R * shard:(R + 1) * shard], y[R * shard:(R + 1) * shard])
    worst = max(float(np.abs(a.numpy() - b.numpy()).max()) for a, b in zip(ws, ref))
    T.check(all(np.allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6) for a, b in zip(ws, ref)),
            "DistributedGradientTape on %d ranks differs from one process by %g" % (N, worst))
    T.check(not np.allclose(ref[0].numpy(), make()[0].numpy()), "the reference did not train")
    if R == 0:
        print("largest difference from one process: %.3g" % worst, flush=True)


for fn in (test_collectives, test_tf_function, test_gradients, test_equivalence):
    T.run(fn)
hvd.shutdown()
T.finish()
