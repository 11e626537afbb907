"""loom.torch's elastic API in a job that is not elastic (the fault scenarios
run under loomrun --elastic in test_elastic_python.sh): what commit, restore
and sync keep of a model, an optimizer, a sampler and plain values; run()
syncs from rank 0 and returns func's value; the retry loop on
HorovodInternalError and HostsUpdatedInterrupt (reset replaced, as a test
double of the rebuild); a reset in a job that is not elastic says so; the
exception classes Horovod scripts catch."""
import torch

import loom
import loom.torch as hvd
from loom import elastic as lelastic
from common import Tally

hvd.init()
R, N = hvd.rank(), hvd.size()
t = Tally(R)


def names():
    t.check(hvd.HorovodInternalError is hvd.LoomInternalError, "HorovodInternalError is LoomInternalError")
    t.check(issubclass(hvd.LoomInternalError, hvd.LoomError), "LoomInternalError is a LoomError")
    t.check(hvd.elastic.HorovodInternalError is hvd.HorovodInternalError, "hvd.elastic.HorovodInternalError")
    t.check(issubclass(hvd.HostsUpdatedInterrupt, RuntimeError), "HostsUpdatedInterrupt is a RuntimeError")
    t.check(hvd.HostsUpdatedInterrupt(True).skip_sync is True, "HostsUpdatedInterrupt(skip_sync)")
    t.check(hvd.elastic.run is not None and hvd.elastic.ObjectState is not None, "hvd.elastic names")


def object_state():
    s = hvd.elastic.ObjectState(epoch=R, batch=[R])
    s.sync()
    t.check(s.epoch == 0 and s.batch == [0], "ObjectState.sync takes rank 0's values: %r %r" % (s.epoch, s.batch))
    s.epoch, s.batch = 5, [7]
    s.commit()
    s.epoch = 9
    s.batch.append(8)
    s.restore()
    t.check(s.epoch == 5 and s.batch == [7], "ObjectState.restore: the committed values, deep copies")
    s.check_host_updates()   # not elastic: no interrupt
    t.check(True, "check_host_updates outside an elastic job")
    # Horovod's scripts poll it while they wait for new hosts.
    t.check(s._host_messages.empty() and s._host_messages.qsize() == 0,
            "state._host_messages: empty outside an elastic job")


def torch_state():
    torch.manual_seed(R)   # every rank different until the sync
    model = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(list(range(20)), shuffle=False)
    s = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0)
    s.sync()
    w = model.weight.detach().clone()
    ws = hvd.allgather(w.reshape(1, -1), name="tstate.w")
    t.check(all(torch.equal(ws[0], ws[i]) for i in range(N)), "TorchState.sync: the same weights everywhere")
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    s.epoch = 1
    sampler.record_batch(0, 2)
    s.commit()
    committed_w = model.weight.detach().clone()
    committed_m = opt.state_dict()["state"][0]["momentum_buffer"].clone()
    opt.zero_grad()
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    s.epoch = 2
    sampler.record_batch(1, 2)
    t.check(not torch.equal(model.weight, committed_w), "a step after the commit changes the model")
    s.restore()
    t.check(torch.equal(model.weight, committed_w), "TorchState.restore: the model of the commit")
    t.check(torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], committed_m),
            "TorchState.restore: the optimizer's momentum of the commit")
    t.check(s.epoch == 1, "TorchState.restore: plain values of the commit")
    t.check(sampler.processed_num == 2 * N, "TorchState.restore: the sampler's position (%d)" % sampler.processed_num)
    # A backward pass that started allreduces, then a failure: restore drops them.
    model(torch.ones(3, 4)).sum().backward()
    s.restore()
    hvd.barrier()     # (here nothing failed: let those allreduces end first)
    opt.zero_grad()   # would refuse with allreduces pending
    t.check(True, "restore drops the allreduces of a failed step")
    s.model = model
    t.check(s.model is model, "TorchState attributes can be reassigned")


def sampler():
    data = list(range(10))
    sm = hvd.elastic.ElasticSampler(data, shuffle=True, seed=3)
    mine = list(iter(sm))
    everyone = hvd.allgather_object(mine, name="sampler.shards")
    flat = sorted(i for shard in everyone for i in shard)
    t.check(len(sm) == len(mine) == -(-10 // N), "ElasticSampler: %d samples per rank" % len(mine))
    t.check(set(flat) == set(data), "ElasticSampler: the shards cover the dataset")
    sm.record_batch(0, 2)
    sm.load_state_dict(sm.state_dict())
    rest = sorted(i for shard in hvd.allgather_object(list(iter(sm)), name="sampler.rest") for i in shard)
    t.check(len(set(rest)) == 10 - 2 * N, "ElasticSampler: after a batch only the rest of the epoch (%d)" % len(set(rest)))
    sm.set_epoch(1)
    t.check(sm.processed_num == 0 and len(sm) == -(-10 // N), "ElasticSampler.set_epoch starts over")


def run_loop():
    calls, resets = [], []

    def fake_reset():
        resets.append(1)

    s = hvd.elastic.ObjectState(step=0)

    def body(state, fail_on):
        calls.append(state.step)
        if len(calls) in fail_on:
            state.step = 99   # uncommitted progress, rolled back on a failure
            raise fail_on[len(calls)]
        state.step += 1
        state.commit()
        return "done"

    run = lelastic.run_fn(body, fake_reset)
    t.check(run(s, {}) == "done" and calls == [0] and not resets, "run: func once, its value returned")
    calls.clear()
    s2 = hvd.elastic.ObjectState(step=0)
    seen = []
    s2.register_reset_callbacks([lambda: seen.append(s2.step)])
    out = run(s2, {1: hvd.HorovodInternalError("peer lost"), 2: hvd.HostsUpdatedInterrupt(False)})
    t.check(out == "done" and calls == [0, 0, 0], "run: retried after each interrupt from the commit (%r)" % calls)
    t.check(len(resets) == 2 and seen == [0, 99], "run: a reset and the callbacks after each (%r)" % seen)
    calls.clear()
    try:
        run(hvd.elastic.ObjectState(step=0), {1: ValueError("a bug")})
        t.check(False, "run: other exceptions propagate")
    except ValueError:
        t.check(True, "run: other exceptions propagate")


def reset_not_elastic():
    try:
        hvd.elastic.reset()
        t.check(False, "reset outside an elastic job raises")
    except loom.LoomError as e:
        t.check("loomrun --elastic" in str(e), "reset outside an elastic job says how to start one: %s" % e)


for fn in (names, object_state, torch_state, sampler, run_loop, reset_not_elastic):
    t.run(fn)
hvd.shutdown()
t.finish()
