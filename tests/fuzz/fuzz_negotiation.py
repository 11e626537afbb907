#!/usr/bin/env python3
"""fuzz_negotiation.py - fuzzes the decoder of the engine's negotiation
messages (python/loom/_negotiation.py), what every rank of a loom.torch or
loom.tensorflow job reads from its peers each full round.

The property: decode() returns a message or raises NegotiationError, nothing
else, whatever the bytes; what it returns is well typed and encodes back to
the very same bytes (the format is canonical, so nothing decoded was
guessed at). Python cannot overflow a buffer, so what is hunted is an
unexpected exception (which would break the engine), an allocation not
bounded by the input, or a message accepted in two spellings.

Runs under atheris (coverage-guided, libFuzzer's arguments) when the
interpreter has it (tests/install-deps.sh makes /opt/loom-fuzz with it);
otherwise a plain mutator of its own with the same arguments, reduced to:
  fuzz_negotiation.py -runs=0 SEEDS...                 replay the corpus
  fuzz_negotiation.py -max_total_time=S WORK SEEDS...  fuzz for S seconds
A failing input is written to -artifact_prefix (default ./) + crash-<sha1>.
"""
import hashlib
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "loom"))
try:
    import atheris
    with atheris.instrument_imports():
        import _negotiation as neg
except ImportError:
    atheris = None
    import _negotiation as neg


def check(data):
    try:
        entries, stopping, waiting = neg.decode(data)
    except neg.NegotiationError:
        return
    assert isinstance(stopping, bool) and isinstance(waiting, bool)
    for name, meta in entries:
        kind, dtype, shape, op, root, pre, post, splits = meta
        assert isinstance(name, str) and kind in neg.KINDS and isinstance(dtype, str)
        assert isinstance(shape, tuple) and all(isinstance(s, int) and s >= 0 for s in shape)
        assert op is None or isinstance(op, int)
        assert isinstance(root, int) and isinstance(pre, float) and isinstance(post, float)
        assert splits is None or all(isinstance(s, int) and s >= 0 for s in splits)
    again = neg.encode((entries, stopping, waiting))
    assert again == bytes(data), "decoded and encoded again, the bytes differ"


# Entries of every kind, as Entry.meta() makes them (tests/python/test_negotiation.py too).
METAS = [
    ("grad.layer1.weight", ("allreduce", "torch.float32", (64, 3, 3, 3), 0, -1, 1.0, 1.0, None)),
    ("allgather.noname.7", ("allgather", "np.int64", (5, 2), None, -1, 1.0, 1.0, None)),
    ("b", ("broadcast", "torch.bfloat16", (), None, 1, 1.0, 1.0, None)),
    ("a2a", ("alltoall", "np.float16", (6,), None, -1, 1.0, 1.0, (1, 2, 3))),
    ("rs", ("reducescatter", "torch.float64", (8, 8), 4, -1, 0.5, 2.0, None)),
    ("__loom_barrier__", ("barrier", "", (), None, -1, 1.0, 1.0, None)),
    ("__loom_join__", ("__loom_join__", "", (), None, -1, 1.0, 1.0, None)),
    ("ünïcode/名前", ("allreduce", "torch.uint8", (0,), 100, -1, 1.0, 1.0, None)),
]


def seeds():
    """Valid messages of every kind, as the engine makes them."""
    metas = METAS
    out = [neg.encode(([], False, False)), neg.encode(([], True, True))]
    for i in range(len(metas)):
        out.append(neg.encode((metas[i:i + 3], i % 2 == 0, i % 3 == 0)))
    return out


def mutate(data, rng, pool):
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        if op == 0 and b:                       # flip a bit
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:                     # an interesting byte
            b[rng.randrange(len(b))] = rng.choice((0, 1, 0x7f, 0x80, 0xfe, 0xff))
        elif op == 2 and b:                     # truncate
            del b[rng.randrange(len(b)):]
        elif op == 3:                           # insert random bytes
            i = rng.randrange(len(b) + 1)
            b[i:i] = os.urandom(rng.randint(1, 8))
        elif op == 4 and len(b) > 1:            # delete a run
            i = rng.randrange(len(b))
            del b[i:i + rng.randint(1, 16)]
        elif op == 5:                           # splice another input
            other = rng.choice(pool)
            i, j = rng.randrange(len(b) + 1), rng.randrange(len(other) + 1)
            b = b[:i] + other[j:]
        elif op == 6 and len(b) >= 4:           # a large little-endian number
            i = rng.randrange(len(b) - 3)
            b[i:i + 4] = rng.choice((b"\xff\xff\xff\xff", b"\xff\xff\x00\x00", b"\x00\x00\x00\x80"))
    return bytes(b)


def save_crash(prefix, data):
    path = "%scrash-%s" % (prefix, hashlib.sha1(data).hexdigest())
    with open(path, "wb") as f:
        f.write(data)
    return path


def passes(data, prefix, what):
    """check(data); a failure is reported and its input saved."""
    try:
        check(data)
        return True
    except Exception as exc:   # noqa: BLE001 - the finding
        print("fuzz_negotiation: FAIL on %s (%r): %s" % (what, exc, save_crash(prefix, data)))
        return False


def plain(argv):
    opts, dirs = {}, []
    for a in argv:
        if a.startswith("-") and "=" in a:
            k, v = a[1:].split("=", 1)
            opts[k] = v
        else:
            dirs.append(a)
    prefix = opts.get("artifact_prefix", "./")
    corpus = []
    for d in dirs:
        for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            with open(os.path.join(d, f), "rb") as fh:
                corpus.append(fh.read())
    runs = 0
    for data in corpus + seeds():
        if not passes(data, prefix, "a corpus input"):
            return 1
        runs += 1
    if opts.get("runs") == "0":
        print("fuzz_negotiation: replayed %d inputs" % runs)
        return 0
    seconds = float(opts.get("max_total_time", 10))
    rng = random.Random(int(opts.get("seed", 0)) or None)
    pool = corpus + seeds()
    work = dirs[0] if dirs else None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        data = mutate(rng.choice(pool), rng, pool)
        if not passes(data, prefix, "a mutated input"):
            return 1
        runs += 1
        if work and len(pool) < 4096 and rng.random() < 0.001:
            # Keep a few decodable variants as new seeds (no coverage to go by).
            try:
                neg.decode(data)
                pool.append(data)
                with open(os.path.join(work, hashlib.sha1(data).hexdigest()), "wb") as fh:
                    fh.write(data)
            except neg.NegotiationError:
                pass
    print("stat::number_of_executed_units: %d" % runs)
    return 0


def main():
    if atheris is None:
        sys.exit(plain(sys.argv[1:]))
    atheris.Setup(sys.argv, check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
