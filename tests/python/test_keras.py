"""loom.keras: model.fit with DistributedOptimizer on N ranks, each on its
shard of every batch, ends with the weights of one process fitting the whole
batches from the same seed; BroadcastGlobalVariablesCallback makes ranks that
started apart equal; MetricAverageCallback averages the logs;
LearningRateWarmupCallback ramps the learning rate. Run under loomrun -np N."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import loom.keras as hvd  # noqa: E402
from common import Tally  # noqa: E402

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
T = Tally(R)
BATCH, NBATCH = 24, 6

rng = np.random.default_rng(11)
X = rng.standard_normal((BATCH * NBATCH, 10)).astype(np.float32)
Y = ((X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0.5).astype(np.int64))


def make(seed=5):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(3)])


def shard(a):
    """Rank R's part of every batch, so its batches of BATCH/N rows line up with the whole ones."""
    per = BATCH // N
    return np.concatenate([a[b * BATCH + R * per:b * BATCH + (R + 1) * per] for b in range(NBATCH)])


def compile_(model, opt):
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])


def test_fit_equivalence():
    ref = make()
    compile_(ref, keras.optimizers.SGD(0.1, momentum=0.9))
    ref.fit(X, Y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    model = make()
    compile_(model, hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)))
    hist = model.fit(shard(X), shard(Y), batch_size=BATCH // N, epochs=2, shuffle=False, verbose=0,
                     callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                hvd.callbacks.MetricAverageCallback()])
    worst = max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), ref.get_weights()))
    T.check(all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(model.get_weights(), ref.get_weights())),
            "model.fit on %d ranks differs from one process by %g" % (N, worst))
    T.check(not np.allclose(ref.get_weights()[0], make().get_weights()[0]), "the reference did not train")
    losses = hvd.allgather_object(hist.history["loss"][-1])
    T.check(all(abs(v - losses[0]) < 1e-9 for v in losses), "MetricAverageCallback: %s" % losses)
    if R == 0:
        print("largest difference from one process: %.3g" % worst, flush=True)


def test_broadcast_callback():
    model = make(seed=100 + R)     # every rank starts elsewhere
    compile_(model, hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)))
    model.fit(shard(X), shard(Y), batch_size=BATCH // N, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    flat = np.concatenate([w.reshape(-1) for w in model.get_weights()])
    all_flat = hvd.allgather_object(flat)
    T.check(all(np.array_equal(all_flat[0], f) for f in all_flat), "ranks ended with different weights")


def test_warmup():
    model = make()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    compile_(model, opt)
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(float(np.asarray(self.model.optimizer.learning_rate)))
    model.fit(shard(X), shard(Y), batch_size=BATCH // N, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=1),
                         Record()])
    T.check(abs(seen[0] - 0.1 / N) < 1e-7, "warmup starts at lr/size: %s" % seen[:3])
    T.check(abs(seen[-1] - 0.1) < 1e-7, "warmup ends at lr: %s" % seen[-3:])
    T.check(all(a <= b + 1e-9 for a, b in zip(seen, seen[1:])), "warmup never decreases")


def test_partial():
    """PartialDistributedOptimizer: a local layer's gradient is its own over
    the size, the others' averaged; BroadcastGlobalVariablesCallback leaves
    local_variables as they are."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="ones", use_bias=False),
                              keras.layers.Dense(1, kernel_initializer="ones", use_bias=False)])
    x = tf.constant([[float(R + 1), 0.0]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x))
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[model.layers[0]])
    gv = opt._compute_gradients(loss, model.trainable_weights, tape=tape)
    g_local, g_shared = gv[0][0].numpy(), gv[1][0].numpy()
    T.check(np.allclose(g_local[0], (R + 1.0) / N) and np.allclose(g_shared, (N + 1) / 2.0),
            "PartialDistributedOptimizer %s %s" % (g_local, g_shared))
    keras.utils.set_random_seed(R)
    model = make(seed=R)
    compile_(model, hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)))
    local = list(model.layers[0].weights)
    mine = [np.asarray(v).copy() for v in local]
    model.fit(shard(X)[:4], shard(Y)[:4], batch_size=4, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(N - 1, local_variables=local)])
    T.check(all(np.array_equal(np.asarray(v), m) for v, m in zip(local, mine)), "local_variables kept")
    others = np.asarray(model.layers[1].weights[0])
    T.check(np.allclose(hvd.broadcast(tf.constant(others), root_rank=N - 1).numpy(), others),
            "the other variables broadcast")


for fn in (test_fit_equivalence, test_broadcast_callback, test_warmup, test_partial):
    T.run(fn)
hvd.shutdown()
T.finish()
