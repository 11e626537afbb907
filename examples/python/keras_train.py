"""Data-parallel Keras model.fit with loom.keras on synthetic data:
DistributedOptimizer averages the gradients, the callbacks broadcast the
initial state, average the metrics and warm the learning rate up. Prints the
loss per epoch and the final accuracy (rank 0).

    loomrun -np 2 python3 examples/python/keras_train.py [--epochs 10]
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402

import loom.keras as hvd  # noqa: E402


def synthetic(n, seed):
    x = np.random.default_rng(seed).standard_normal((n, 20)).astype(np.float32)
    w = np.random.default_rng(0).standard_normal((20, 4)).astype(np.float32)
    return x, (x @ w).argmax(1)


class PrintLoss(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_epoch_end(self, epoch, logs=None):
        self.losses.append(logs["loss"])
        if hvd.rank() == 0:
            print("epoch %d: loss %.4f accuracy %.3f" % (epoch + 1, logs["loss"], logs["accuracy"]),
                  flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    hvd.init()
    x, y = synthetic(4096, 1)
    xt, yt = synthetic(1024, 2)
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
    lr = args.lr * hvd.size()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    printer = PrintLoss()
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.MetricAverageCallback(),
                         hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=2),
                         printer])
    acc = float(np.mean(np.argmax(model.predict(xt, verbose=0), 1) == yt))
    acc = float(hvd.allreduce(np.float32(acc), name="accuracy"))
    if hvd.rank() == 0:
        print("final accuracy: %.3f on %d ranks" % (acc, hvd.size()))
        if printer.losses[-1] < printer.losses[0]:
            print("loss fell from %.4f to %.4f" % (printer.losses[0], printer.losses[-1]))
    hvd.shutdown()


if __name__ == "__main__":
    main()
