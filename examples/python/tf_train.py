"""Data-parallel training with loom.tensorflow and tf.GradientTape on
synthetic data: each rank trains on its shard, DistributedGradientTape
averages the gradients. Prints the loss per epoch and the final accuracy.

    loomrun -np 2 python3 examples/python/tf_train.py [--epochs 10]
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import loom.tensorflow as hvd  # noqa: E402


def synthetic(n, seed):
    x = np.random.default_rng(seed).standard_normal((n, 20)).astype(np.float32)
    w = np.random.default_rng(0).standard_normal((20, 4)).astype(np.float32)
    return x, (x @ w).argmax(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    x, y = synthetic(4096, 1)
    xt, yt = synthetic(1024, 2)
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]

    tf.random.set_seed(1)
    model = tf.keras.Sequential([tf.keras.Input((20,)), tf.keras.layers.Dense(64, activation="relu"),
                                 tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(4)])
    opt = tf.keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    hvd.broadcast_variables(model.variables, root_rank=0)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    losses = []
    for epoch in range(args.epochs):
        perm = np.random.default_rng(epoch).permutation(len(x))
        total, n = 0.0, 0
        for i in range(0, len(x) - args.batch_size + 1, args.batch_size):
            idx = perm[i:i + args.batch_size]
            total += float(step(x[idx], y[idx]))
            n += 1
        epoch_loss = float(hvd.allreduce(tf.constant(total / n), name="epoch_loss"))
        losses.append(epoch_loss)
        if hvd.rank() == 0:
            print("epoch %d: loss %.4f" % (epoch + 1, epoch_loss), flush=True)

    acc = float(np.mean(np.argmax(model(xt).numpy(), 1) == yt))
    acc = float(hvd.allreduce(tf.constant(acc), name="accuracy"))
    if hvd.rank() == 0:
        print("final accuracy: %.3f on %d ranks" % (acc, hvd.size()))
        if losses[-1] < losses[0]:
            print("loss fell from %.4f to %.4f" % (losses[0], losses[-1]))
    hvd.shutdown()


if __name__ == "__main__":
    main()
