"""Elastic Keras training under loomrun --elastic (tests/test_elastic_python.sh):
model.fit inside hvd.elastic.run with KerasState and the commit/batch/epoch
callbacks, as Horovod's Keras elastic examples do. The process with
LOOM_ELASTIC_ID == MPE_KILL_ID SIGKILLs itself at the start of a batch of
epoch 1, so the others fail inside the compiled train step's allreduce: the
TensorFlow error must come back as HorovodInternalError, the world shrink,
training finish every epoch, and every rank end with the same weights.
Prints "[keras] ..." lines from rank 0; exits 0 when all of that holds."""
import os
import signal
import sys

import numpy as np
import keras

import loom.keras as hvd

EPOCHS = int(os.environ.get("KERAS_EPOCHS", "4"))
MY_ID = int(os.environ.get("LOOM_ELASTIC_ID", "-1"))
KILL_ID = int(os.environ.get("MPE_KILL_ID", "-1"))

hvd.init()
keras.utils.set_random_seed(1)
rng = np.random.default_rng(0)
x = rng.normal(size=(768, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")

model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.02, momentum=0.5)),
              loss="mse")
state = hvd.elastic.KerasState(model, batch=0, epoch=0)
resets = []
state.register_reset_callbacks([lambda: resets.append(hvd.size())])
first_loss = float(model.evaluate(x, y, verbose=0))


class DieAtEpoch1(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if MY_ID == KILL_ID and state.epoch == 1 and batch == 3:
            os.kill(os.getpid(), signal.SIGKILL)


class Report(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if hvd.rank() == 0:
            print("[keras] epoch %d done on %d ranks" % (state.epoch, hvd.size()), flush=True)


callbacks = [hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
             hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.UpdateEpochStateCallback(state), DieAtEpoch1(), Report()]


@hvd.elastic.run
def train(state):
    n, r = hvd.size(), hvd.rank()
    model.fit(x[r::n], y[r::n], batch_size=16, epochs=EPOCHS - state.epoch, callbacks=callbacks,
              verbose=0)


train(state)
weights = np.concatenate([w.reshape(-1) for w in model.get_weights()])
everyone = hvd.allgather_object(weights.tolist())
same = all(e == everyone[0] for e in everyone)
last_loss = float(model.evaluate(x, y, verbose=0))
ok = same and state.epoch == EPOCHS and last_loss < first_loss
if hvd.rank() == 0:
    print("[keras] final: epoch %d, %d ranks, resets %s, weights %s, loss %.4f -> %.4f: %s" %
          (state.epoch, hvd.size(), resets, "the same everywhere" if same else "DIFFER", first_loss,
           last_loss, "ok" if ok else "WRONG"), flush=True)
hvd.shutdown()
sys.exit(0 if ok else 5)
