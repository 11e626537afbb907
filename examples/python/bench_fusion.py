"""Time per step of DistributedOptimizer on a ResNet-50-sized gradient set:
the 161 parameter tensors of ResNet-50 (25.6 M float32), with a loss whose
backward pass is one pass over memory, so the step time is mostly the
gradients' allreduce (plus an SGD update). Compares tensor fusion on and off:

    loomrun -np 2 python3 examples/python/bench_fusion.py

alternates steps with fusion at LOOM_FUSION_THRESHOLD (64 MiB by default) and
steps with fusion off, in the same processes, so a busy machine slows both
alike; the medians are printed. --threshold / --cycle set the variables for
one mode only (no alternation). It also times one plain allreduce of all the
gradients in a single buffer, the floor fusion aims at, and the step without
any communication.
"""
import argparse
import os
import time


def resnet50_shapes():
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(width, inplanes, 1, 1), (width,), (width,),
                       (width, width, 3, 3), (width,), (width,),
                       (width * 4, width, 1, 1), (width * 4,), (width * 4,)]
            if b == 0:
                shapes += [(width * 4, inplanes, 1, 1), (width * 4,), (width * 4,)]
            inplanes = width * 4
    return shapes + [(1000, 2048), (1000,)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threshold", help="LOOM_FUSION_THRESHOLD for this run (bytes, K/M suffix)")
    ap.add_argument("--cycle", help="LOOM_CYCLE_TIME for this run (ms)")
    ap.add_argument("--steps", type=int, default=12, help="timed steps per mode")
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    if args.threshold is not None:
        os.environ["LOOM_FUSION_THRESHOLD"] = args.threshold
    if args.cycle is not None:
        os.environ["LOOM_CYCLE_TIME"] = args.cycle

    import torch
    import loom.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s) * 0.01) for s in resnet50_shapes()]
    nparams = sum(p.numel() for p in params)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.01),
                                   named_parameters=[("p%03d" % i, p) for i, p in enumerate(params)])

    def step():
        opt.zero_grad()
        # d/dp of 0.5 * sum(p*p) is p: a backward pass that costs one pass over memory.
        loss = sum((p * p).sum() for p in params) * 0.5
        loss.backward()
        opt.step()

    def timed(fn, n):
        hvd.barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        hvd.barrier()
        return (time.perf_counter() - t0) / n

    for _ in range(args.warmup):
        step()
    # Alternate the modes step by step (the engine reads its threshold at each
    # round; every rank switches between barriers, while nothing is pending).
    from loom.torch import _engine_for
    engine = _engine_for(hvd.global_process_set)
    modes = {"fusion on (%d B)" % engine.threshold: engine.threshold}
    if args.threshold is None:
        modes["fusion off"] = 0
    times = {m: [] for m in modes}
    before = hvd._fusion_stats()
    for _ in range(args.steps):
        for m, threshold in modes.items():
            engine.threshold = threshold
            times[m].append(timed(step, 1))
    after = hvd._fusion_stats()
    engine.threshold = list(modes.values())[0]

    # Floor: one allreduce over a single buffer holding every gradient.
    flat = torch.ones(nparams)
    hvd.allreduce_(flat, name="flat.warmup")
    t_flat = timed(lambda: hvd.allreduce_(flat, name="flat"), args.steps)

    # Local work alone: the same step without any communication.
    # (on copies: the optimizer's hooks stay on the originals)
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    local = torch.optim.SGD(copies, lr=0.01)

    def local_step():
        local.zero_grad()
        (sum((p * p).sum() for p in copies) * 0.5).backward()
        local.step()
    t_local = timed(local_step, args.steps)

    if hvd.rank() == 0:
        print("ranks %d, %d tensors, %.1f M float32 (%.0f MiB), LOOM_CYCLE_TIME=%s, %d steps per mode"
              % (hvd.size(), len(params), nparams / 1e6, nparams * 4 / 2**20,
                 os.environ.get("LOOM_CYCLE_TIME", "1 (default)"), args.steps))
        for m, ts in times.items():
            ts = sorted(ts)
            print("DistributedOptimizer step, %s: median %.1f ms (min %.1f, max %.1f)"
                  % (m, ts[len(ts) // 2] * 1e3, ts[0] * 1e3, ts[-1] * 1e3))
        print("fused allreduces: %d in %d rounds over all timed steps"
              % (after["fused_calls"] - before["fused_calls"], after["rounds"] - before["rounds"]))
        print("one allreduce of all gradients in one buffer: %.1f ms" % (t_flat * 1e3))
        print("the step without communication: %.1f ms" % (t_local * 1e3))
    hvd.shutdown()


if __name__ == "__main__":
    main()
