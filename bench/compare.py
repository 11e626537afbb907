#!/usr/bin/env python3
"""Tables of compare.sh's results: per N and size, the best time of each peer
over the repetitions, Gloo's best algorithm, and each peer's time divided by
Loom's (a ratio above 1 means Loom is faster)."""
import collections
import glob
import os
import re
import sys


def parse(path):
    rows = {}
    failed = False
    for line in open(path, errors="replace"):
        line = re.sub(r"^\[\d+\]<stdout>: ", "", line)
        if line.startswith("#"):
            continue
        f = line.split()
        if len(f) == 7 and f[0].isdigit():
            size, t = int(f[0]), float(f[2])
            rows[size] = min(t, rows.get(size, float("inf")))
            failed |= f[6] != "OK"
    return rows, failed


def main(out):
    times = collections.defaultdict(dict)   # (N, peer) -> size -> best time
    bad = set()
    for path in glob.glob(os.path.join(out, "*_n*_r*.txt")):
        m = re.match(r"(.+)_n(\d+)_r\d+\.txt$", os.path.basename(path))
        peer, n = m.group(1), int(m.group(2))
        rows, failed = parse(path)
        if failed:
            bad.add((n, peer))
        for size, t in rows.items():
            cur = times[(n, peer)].get(size)
            times[(n, peer)][size] = t if cur is None else min(cur, t)
    for n in sorted({k[0] for k in times}):
        loom = times.get((n, "loom"), {})
        gloo = [p for (nn, p) in times if nn == n and p.startswith("gloo-")]
        print(f"\n### N={n} (time per allreduce in us; ratio = peer time / Loom time)\n")
        print("| size (B) | Loom | best Gloo (algorithm) | ratio | Open MPI tcp | ratio | Loom busbw (GB/s) |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for size in sorted(loom):
            lt = loom[size]
            best = min(((times[(n, p)].get(size, float("inf")), p[5:]) for p in gloo), default=(float("inf"), "-"))
            ompi = times.get((n, "ompi-tcp"), {}).get(size, float("nan"))
            busbw = size / (lt * 1e-6) * 2 * (n - 1) / n / 1e9 if n > 1 else 0
            print(f"| {size} | {lt:.1f} | {best[0]:.1f} ({best[1]}) | {best[0] / lt:.2f} | "
                  f"{ompi:.1f} | {ompi / lt:.2f} | {busbw:.3f} |")
    for n, peer in sorted(bad):
        print(f"\nWARNING: {peer} at N={n} reported wrong results")
    return 1 if any(p == "loom" for _, p in bad) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "results")))
