"""all_reduce through torch.distributed: "loom" beside "gloo" and "nccl" in the
same processes, interleaved, as nccl-tests reports it (time per call, busbw) and
as ratios (peer time / loom time: below 1, Loom is slower). Run under torchrun:

    torchrun --standalone --nproc-per-node N torch_allreduce_perf.py [--device cuda|cpu]
        [--sizes 8,1M,64M,256M] [--rounds 3] [--backends loom,gloo,nccl]

Each rank uses device local_rank % device_count. NCCL needs a GPU of its own per
rank (it refuses two ranks on one GPU: "Duplicate GPU detected"), so with fewer
GPUs than ranks on a node it is left out and the table says why; so is a
backend that is not available. Every call's result is checked (sum of the ranks'
values); a wrong one fails the run. Not a test of speed: figures for notes."""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def human(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return "%d %s" % (n // div, unit)
    return "%d B" % n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--sizes", default="8,1M,64M,256M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backends", default="loom,gloo,nccl")
    args = ap.parse_args()

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    import loom.torch.distributed  # noqa: F401  (registers the "loom" backend)

    dist.init_process_group("gloo")
    groups, left_out = {}, {}
    for name in args.backends.split(","):
        if name == "nccl" and not cuda:
            left_out[name] = "CPU tensors"
        elif name == "nccl" and torch.cuda.device_count() < local_size:
            left_out[name] = ("%d ranks per node on %d GPU(s): NCCL refuses two ranks on one GPU"
                              % (local_size, torch.cuda.device_count()))
        elif name == "nccl" and not dist.is_nccl_available():
            left_out[name] = "this torch has no NCCL"
        else:
            groups[name] = dist.new_group(backend=name)
    if "loom" not in groups:
        raise SystemExit("torch_allreduce_perf: the loom backend is required")

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    # times[name][size]: the time per call of each round, in seconds
    times = {name: {n: [] for n in sizes} for name in groups}
    wrong = 0
    for n in sizes:
        count = max(1, n // 4)
        iters = 200 if n <= 64 << 10 else 40 if n <= 4 << 20 else 8 if n <= 64 << 20 else 4
        t = torch.empty(count, dtype=torch.float32, device=device)
        for _ in range(args.rounds):
            for name, group in groups.items():
                t.fill_(float(rank + 1))
                dist.all_reduce(t, group=group)  # warm-up, and the check
                want = float(size * (size + 1) // 2)
                if cuda:
                    torch.cuda.synchronize()
                got = t[-1].item(), t[0].item()
                if got != (want, want):
                    wrong += 1
                    print("rank %d: %s all_reduce of %s gave %s, want %s"
                          % (rank, name, human(n), got, want), flush=True)
                dist.barrier(group=groups["loom"])
                t0 = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(t, group=group)
                if cuda:
                    torch.cuda.synchronize()
                times[name][n].append((time.perf_counter() - t0) / iters)
        del t

    # Every rank's worst median: a collective is as slow as its slowest rank.
    med = torch.tensor([[statistics.median(times[name][n]) for n in sizes] for name in groups],
                       dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    total_wrong = torch.tensor([wrong])
    dist.all_reduce(total_wrong)
    if rank == 0:
        names = list(groups)
        print("all_reduce, %d ranks, %s tensors, float32 sum, median of %d interleaved rounds"
              % (size, args.device, args.rounds))
        for name, why in left_out.items():
            print("  %s left out: %s" % (name, why))
        head = "%10s" % "size"
        for name in names:
            head += " %12s %9s" % (name + " us", "busbw")
        for name in names[1:]:
            head += " %11s" % (name + "/loom")
        print(head)
        for j, n in enumerate(sizes):
            line = "%10s" % human(n)
            for i, _ in enumerate(names):
                sec = med[i][j].item()
                busbw = 2.0 * (size - 1) / size * n / sec / 1e9
                line += " %12.1f %9.2f" % (sec * 1e6, busbw)
            for i in range(1, len(names)):
                line += " %11.2f" % (med[i][j].item() / med[0][j].item())
            print(line)
        print("wrong results: %d" % total_wrong.item(), flush=True)
    dist.destroy_process_group()
    sys.exit(1 if total_wrong.item() else 0)


if __name__ == "__main__":
    main()
