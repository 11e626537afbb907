"""Horovod's first example, as a Horovod user writes it: hvd.init(), a Keras
model, the learning rate scaled by the size, hvd.DistributedOptimizer around
a Keras optimizer (from horovod.tensorflow, as Horovod's README does), rank
0's initial weights broadcast to the others, model.fit, checkpoints and
output on rank 0 only. The data are MNIST-shaped and synthetic (28x28 images
of ten classes, each class a fixed pattern plus noise): nothing here downloads.
Only the import differs from Horovod: `import loom.tensorflow as hvd`.

    loomrun -np 2 python3 examples/python/horovod_tf_keras_mnist.py [--epochs 3]
    python3 -m loom.runner -np 2 python3 examples/python/horovod_tf_keras_mnist.py
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import loom.tensorflow as hvd  # noqa: E402


def synthetic_mnist(n, seed):
    """n images 28x28x1 in [0, 1] and their labels 0-9 (this rank's shard)."""
    patterns = np.random.default_rng(0).random((10, 28, 28, 1)).astype(np.float32)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    images = 0.5 * patterns[labels] + 0.5 * rng.random((n, 28, 28, 1)).astype(np.float32)
    return images, labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args()

    # Initialize Horovod
    hvd.init()
    tf.random.set_seed(hvd.rank())

    (images, labels) = synthetic_mnist(2048, seed=1 + hvd.rank())
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(2048).batch(args.batch_size)

    mnist_model = tf.keras.Sequential([
        tf.keras.Input(shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(16, [3, 3], activation="relu"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])

    # Scale the learning rate by the number of workers; add Horovod Distributed Optimizer.
    opt = tf.keras.optimizers.Adam(0.001 * hvd.size())
    opt = hvd.DistributedOptimizer(opt)
    mnist_model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(), optimizer=opt,
                        metrics=["accuracy"])

    # Broadcast the initial variable states from rank 0 to all other processes.
    hvd.broadcast_variables(mnist_model.variables, root_rank=0)

    history = mnist_model.fit(dataset, epochs=args.epochs, verbose=2 if hvd.rank() == 0 else 0)

    # Every rank holds the same weights: compare a checksum across ranks.
    checksum = float(sum(tf.reduce_sum(tf.cast(v, tf.float64)) for v in mnist_model.trainable_variables))
    sums = hvd.allgather(tf.constant([checksum], tf.float64)).numpy().tolist()
    losses = history.history["loss"]
    if hvd.rank() == 0:
        print("weights identical on every rank: %s" % (len(set(sums)) == 1))
        print("accuracy %.3f" % history.history["accuracy"][-1])
        if losses[-1] < losses[0] and len(set(sums)) == 1:
            print("loss fell from %.4f to %.4f" % (losses[0], losses[-1]))
        else:
            print("loss did not fall (%s) or the ranks differ (%s)" % (losses, sums))


if __name__ == "__main__":
    main()
