"""Elastic Keras training under loomrun --elastic (tests/test_elastic_python.sh):
model.fit inside hvd.elastic.run with KerasState and the commit/batch/epoch
callbacks, as Horovod's Keras elastic examples do. The process with
LOOM_ELASTIC_ID == MPE_KILL_ID SIGKILLs itself at the start of a batch of
epoch 1, so the others fail inside the compiled train step's allreduce: the
TensorFlow error must come back as HorovodInternalError, the world shrink,
training finish every epoch, and every rank end with the same weights.
With MPE_SIZES="3 2 3" the ranks hold at the start of epoch KERAS_HOLD_EPOCH
(3/4 of the epochs) until the job's sizes so far are that sequence (at most
3000 collective polls, 20 ms apart): the rank the test adds takes long to
start TensorFlow on a busy machine. The sizes are part of the state rank 0
broadcasts, so every rank holds alike.
Prints "[keras] ..." lines from rank 0; exits 0 when all of that holds."""
import os
import signal
import sys
import time

import numpy as np
import keras

import loom.keras as hvd

EPOCHS = int(os.environ.get("KERAS_EPOCHS", "4"))
MY_ID = int(os.environ.get("LOOM_ELASTIC_ID", "-1"))
KILL_ID = int(os.environ.get("MPE_KILL_ID", "-1"))
EXPECT_SIZES = [int(n) for n in os.environ.get("MPE_SIZES", "").split()]
HOLD_EPOCH = int(os.environ.get("KERAS_HOLD_EPOCH", str(EPOCHS * 3 // 4)))
HOLD_POLLS = 3000

hvd.init()
keras.utils.set_random_seed(1)
rng = np.random.default_rng(0)
x = rng.normal(size=(768, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")

model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.02, momentum=0.5)),
              loss="mse")
state = hvd.elastic.KerasState(model, batch=0, epoch=0, sizes=[])
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


class HoldForSizes(keras.callbacks.Callback):
    polls = 0   # counted from each epoch of the world (train's start)

    def on_epoch_begin(self, epoch, logs=None):
        while (EXPECT_SIZES and state.epoch >= HOLD_EPOCH and state.sizes != EXPECT_SIZES and
               HoldForSizes.polls < HOLD_POLLS):
            # Collective; raises HostsUpdatedInterrupt when one waits to join. A
            # commit, not only the check: state.epoch moved on after the last one.
            state.commit()
            HoldForSizes.polls += 1
            time.sleep(0.02)


callbacks = [hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
             hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.UpdateEpochStateCallback(state), DieAtEpoch1(), Report(), HoldForSizes()]


@hvd.elastic.run
def train(state):
    # Rank 0's list, just broadcast by the sync; saved at once, so that an
    # epoch of the world that ends before its first commit still counts.
    state.sizes = state.sizes + [hvd.size()]
    state.save()
    HoldForSizes.polls = 0
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
