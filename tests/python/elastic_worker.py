"""The Python worker of the elastic tests (tests/test_elastic_python.sh runs
it through tests/test_elastic.sh under loomrun --elastic): tests/mp_elastic's
toy training, written the way a Horovod elastic script is, with loom.torch's
hvd.elastic.run, TorchState, DistributedOptimizer and commit().

The model is a float64 vector w (a bias-free Linear layer) trained by SGD with
momentum through DistributedOptimizer(op=Sum). Step s has MPE_BATCH samples
x_j, integer vectors fixed by (s, j); rank r of n takes the samples with
j % n == r and its loss is the sum of x_j . w, so the reduced gradient is the
sum of all x_j whatever the split, and with a learning rate and momentum that
are powers of two every value stays exact: after MPE_STEPS steps w must equal
the serial computation bit for bit, if no committed step was lost or applied
twice and the optimizer's momentum was restored and broadcast right.

Faults and outputs as tests/mp_elastic.c: MPE_KILL_ID/MPE_KILL_STEP (SIGKILL
right after the backward pass started the step's allreduce),
MPE_REBUILD_DIE_ID (SIGKILL a few ms into the first reset), MPE_DIR/progress
and MPE_DIR/death, "[mpe] ..." lines from rank 0; MPE_SIZES="3 2 3" holds
the ranks before step MPE_HOLD_STEP (3/4 of the steps) until the job's sizes
so far are that sequence (at most MPE_HOLD_POLLS collective polls, 20 ms
apart): a rank the test adds may take long to start Python. The sizes are
part of the state rank 0 broadcasts, so every rank holds alike. Exit codes:
0 the model matches, 5 it differs."""
import faulthandler
import hashlib
import os
import signal
import sys
import threading
import time

import torch

import loom.torch as hvd

STEPS = int(os.environ.get("MPE_STEPS", "24"))
DIM = int(os.environ.get("MPE_DIM", "4096"))
BATCH = int(os.environ.get("MPE_BATCH", "12"))
SLEEP_MS = int(os.environ.get("MPE_SLEEP_MS", "30"))
DIR = os.environ.get("MPE_DIR")
MY_ID = int(os.environ.get("LOOM_ELASTIC_ID", "-1"))
KILL_ID = int(os.environ.get("MPE_KILL_ID", "-1"))
KILL_STEP = int(os.environ.get("MPE_KILL_STEP", "-1"))
REBUILD_DIE_ID = int(os.environ.get("MPE_REBUILD_DIE_ID", "-1"))
EXPECT_SIZES = [int(n) for n in os.environ.get("MPE_SIZES", "").split()]
HOLD_STEP = int(os.environ.get("MPE_HOLD_STEP", str(STEPS * 3 // 4)))
HOLD_POLLS = int(os.environ.get("MPE_HOLD_POLLS", "3000"))
LR, MOMENTUM = 2.0 ** -4, 0.5
if os.environ.get("MPE_DUMP_AFTER"):   # for hunting a hang: every thread's stack, to stderr
    faulthandler.dump_traceback_later(float(os.environ["MPE_DUMP_AFTER"]))


def sample(step, j):
    g = torch.Generator().manual_seed(step * 1009 + j)
    return torch.randint(-8, 9, (DIM,), generator=g, dtype=torch.int64).to(torch.float64)


def make_model():
    model = torch.nn.Linear(DIM, 1, bias=False, dtype=torch.float64)
    with torch.no_grad():
        model.weight.copy_((torch.arange(DIM, dtype=torch.float64) % 13).reshape(1, DIM))
    return model


def reference():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for s in range(STEPS):
        opt.zero_grad()
        x = torch.stack([sample(s, j) for j in range(BATCH)])
        model(x).sum().backward()
        opt.step()
    return model.weight.detach().clone()


def digest(w):
    return hashlib.sha1(w.numpy().tobytes()).hexdigest()[:16]


def write_file(name, text):
    if DIR:
        path = os.path.join(DIR, name)
        with open("%s.%d" % (path, os.getpid()), "w") as f:
            f.write(text)
        os.rename("%s.%d" % (path, os.getpid()), path)   # readers never see half a file


def die_now():
    write_file("death", "%.3f\n" % (time.time() * 1e3))
    os.kill(os.getpid(), signal.SIGKILL)


class State(hvd.elastic.TorchState):
    rebuilds = 0
    last_death = None

    def restore(self):
        super().restore()
        if MY_ID == REBUILD_DIE_ID and State.rebuilds == 0:
            # Die a few ms into the reset that follows.
            threading.Thread(target=lambda: (time.sleep(0.002 + os.getpid() % 20 / 1000), die_now()),
                             daemon=True).start()
        State.rebuilds += 1


hvd.init()
model = make_model()
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM),
                                     named_parameters=model.named_parameters(), op=hvd.Sum)
state = State(model, optimizer, step=0, sizes=[])


def report_epoch():
    if hvd.rank() != 0:
        return
    print("[mpe] epoch %d size %d step %d" % (hvd._basics._world.epoch, hvd.size(), state.step),
          flush=True)
    try:
        with open(os.path.join(DIR, "death")) as f:
            t = float(f.read())
    except (OSError, TypeError, ValueError):
        return
    if t != State.last_death:
        State.last_death = t
        print("[mpe] resumed %.1f ms after the death" % (time.time() * 1e3 - t), flush=True)


@hvd.elastic.run
def train(state):
    # Rank 0's list, just broadcast by the sync; saved at once, so that an
    # epoch that ends before its first commit still counts.
    state.sizes = state.sizes + [hvd.size()]
    state.save()
    report_epoch()
    polls = 0
    while state.step < STEPS:
        n, r = hvd.size(), hvd.rank()
        if EXPECT_SIZES and state.step >= HOLD_STEP and state.sizes != EXPECT_SIZES and polls < HOLD_POLLS:
            if polls == 0 and r == 0:
                print("[mpe] holding at step %d for the sizes of MPE_SIZES; so far: %s" %
                      (state.step, " ".join(map(str, state.sizes))), flush=True)
            state.check_host_updates()   # collective; raises HostsUpdatedInterrupt when one waits to join
            polls += 1
            if polls == HOLD_POLLS and r == 0:
                print("[mpe] held %d polls at step %d for the sizes of MPE_SIZES: going on" %
                      (polls, state.step), flush=True)
            time.sleep(0.02)
            continue
        optimizer.zero_grad()
        mine = [sample(state.step, j) for j in range(r, BATCH, n)]
        if mine:
            state.model(torch.stack(mine)).sum().backward()
        if MY_ID == KILL_ID and state.step == KILL_STEP:
            die_now()   # the backward hooks started the step's allreduce: the others are in it
        optimizer.step()
        state.step += 1
        state.commit()
        if r == 0:
            write_file("progress", "%d\n" % state.step)
        time.sleep(SLEEP_MS / 1000.0)


train(state)
w = model.weight.detach()
ref = reference()
same = torch.equal(w, ref)
if hvd.rank() == 0:
    print("[mpe] final epoch %d size %d model %s reference %s %s" %
          (hvd._basics._world.epoch, hvd.size(), digest(w), digest(ref), "MATCH" if same else "DIFFER"),
          flush=True)
hvd.shutdown()
sys.exit(0 if same else 5)
