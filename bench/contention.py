#!/usr/bin/env python3
"""The table of contention.sh: per N and size, each peer's median time (us)
over the repetitions on the quiet machine and beside the busy processes, then
Loom's time over Gloo's (at most 1: Loom is no slower) and over the base
build's (1.10: 10% slower), quiet and busy."""
import collections
import glob
import os
import re
import statistics
import sys

ORDER = ["loom-tcp", "loom-shm", "base-tcp", "base-shm", "gloo", "ompi-tcp"]


def parse(path):
    rows, failed = {}, False
    for line in open(path, errors="replace"):
        line = re.sub(r"^\[\d+\]<stdout>: ", "", line)
        f = line.split()
        if line.startswith("#") or len(f) != 7 or not f[0].isdigit():
            continue
        rows[int(f[0])] = float(f[2])
        failed |= f[6] != "OK"
    return rows, failed


def main(out, busy):
    runs = collections.defaultdict(list)   # (peer, n, b, size) -> times
    bad = set()
    for path in glob.glob(os.path.join(out, "*_n*_b*_r*.txt")):
        m = re.match(r"(.+)_n(\d+)_b(\d+)_r\d+\.txt$", os.path.basename(path))
        peer, n, b = m.group(1), int(m.group(2)), int(m.group(3))
        rows, failed = parse(path)
        if failed or not rows:
            bad.add((peer, n, b))
        for size, t in rows.items():
            runs[(peer, n, b, size)].append(t)
    med = {k: statistics.median(v) for k, v in runs.items()}
    peers = [p for p in ORDER if any(k[0] == p for k in med)]
    quiet, loud = 0, int(busy)
    print(f"\n### allreduce float32 sum, time per call in us (median of repetitions); "
          f"quiet | {loud} busy processes\n")
    head = ["N", "size (B)"] + [f"{p} {w}" for p in peers for w in ("quiet", "busy")]
    ratios = []
    for t in ("tcp", "shm"):
        if f"loom-{t}" in peers and "gloo" in peers:
            ratios.append((f"loom-{t}/gloo quiet", f"loom-{t}", "gloo", quiet))
            ratios.append((f"loom-{t}/gloo busy", f"loom-{t}", "gloo", loud))
        if f"loom-{t}" in peers and f"base-{t}" in peers:
            ratios.append((f"loom-{t}/base quiet", f"loom-{t}", f"base-{t}", quiet))
            ratios.append((f"loom-{t}/base busy", f"loom-{t}", f"base-{t}", loud))
    head += [r[0] for r in ratios]
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    worst = {}
    for n, size in sorted({(k[1], k[3]) for k in med}):
        cells = [str(n), str(size)]
        for p in peers:
            for b in (quiet, loud):
                v = med.get((p, n, b, size))
                cells.append(f"{v:.1f}" if v is not None else "-")
        for name, a, c, b in ratios:
            va, vc = med.get((a, n, b, size)), med.get((c, n, b, size))
            if va is None or vc is None:
                cells.append("-")
                continue
            cells.append(f"{va / vc:.2f}")
            worst[name] = max(worst.get(name, 0), va / vc)
        print("| " + " | ".join(cells) + " |")
    for name, w in worst.items():
        print(f"worst {name}: {w:.2f}")
    load = os.path.join(out, "load.txt")
    if os.path.exists(load):
        print("\nload at the start of each block (/proc/loadavg):")
        print(open(load).read().rstrip())
    for peer, n, b in sorted(bad):
        print(f"WARNING: {peer} at N={n} with {b} busy failed or reported wrong results")
    return 1 if any(p.startswith("loom") for p, _, _ in bad) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else 2))
