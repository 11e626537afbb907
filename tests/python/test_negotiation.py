"""The engine's negotiation format (loom._negotiation), in one process: every
kind of entry survives a round trip exactly as Entry.meta() makes it; every
malformed message (each truncation of a good one, a byte past its end, bad
magic, version, flags, kind, lengths, dimensions, splits, names) is refused
with NegotiationError and nothing else; the encoder refuses what the format
cannot carry; and a seeded mutation run over good messages finds nothing
but well-typed messages that encode back to the same bytes, or
NegotiationError. tests/fuzz/fuzz_negotiation.py hunts further."""
import os
import pickle
import random
import struct
import sys

from common import Tally
from loom import _negotiation as neg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz"))
import fuzz_negotiation  # noqa: E402 - the fuzz target's property and seeds

t = Tally(0)

METAS = fuzz_negotiation.METAS + [
    ("big.dims", ("allreduce", "torch.uint8", (0, 1 << 40), 100, -1, 1e-300, -3.5, None)),
    ("empty splits", ("alltoall", "np.int8", (0,), None, -1, 1.0, 1.0, ())),
]


def refused(data, what):
    try:
        neg.decode(data)
    except neg.NegotiationError:
        t.check(True, what)
        return
    except Exception as exc:   # noqa: BLE001 - the failure being tested for
        t.check(False, "%s: raised %r, not NegotiationError" % (what, exc))
        return
    t.check(False, "%s: accepted" % what)


def test_round_trip():
    for flags in ((False, False), (True, False), (False, True), (True, True)):
        msg = (METAS, flags[0], flags[1])
        back = neg.decode(neg.encode(msg))
        t.check(back == (METAS, flags[0], flags[1]), "round trip with flags %s: %r" % (flags, back))
    t.check(neg.decode(neg.encode(([], False, False))) == ([], False, False), "an empty round")
    one = neg.decode(neg.encode(([METAS[0]], False, False)))[0][0][1]
    t.check([type(x) for x in one] == [str, str, tuple, int, int, float, float, type(None)],
            "decoded fields have the types Entry.meta() gives: %r" % (one,))
    t.check(isinstance(neg.decode(bytearray(neg.encode(([METAS[3]], 0, 0))))[0][0][1][7], tuple),
            "splits come back as a tuple (bytearray input)")


def test_malformed():
    good = neg.encode((METAS, True, False))
    for n in range(len(good)):
        refused(good[:n], "truncated to %d of %d bytes" % (n, len(good)))
    refused(good + b"\0", "a byte after the last entry")
    refused(b"LMNX" + good[4:], "another magic")
    refused(good[:4] + bytes([neg.VERSION + 1]) + good[5:], "another version")
    refused(good[:5] + b"\x04" + good[6:], "an unknown flag")
    head = neg.encode(([], False, False))[:6]

    def with_entry(body, count=1):
        return head + struct.pack("<I", count) + body

    name = struct.pack("<H", 1) + b"x"
    tail = struct.pack("<BqqddI", 0, 0, -1, 1.0, 1.0, 0xFFFFFFFF)
    refused(with_entry(name + bytes([len(neg.KINDS), 0, 0]) + tail), "an unknown collective code")
    refused(with_entry(struct.pack("<H", 2) + b"\xff\xfe" + bytes([0, 0, 0]) + tail), "a name that is not UTF-8")
    refused(with_entry(name + bytes([0, 3]) + b"a b" + bytes([0]) + tail), "a type name with a space")
    refused(with_entry(name + bytes([0, 65]) + b"a" * 65 + bytes([0]) + tail), "a type name of 65 bytes")
    refused(with_entry(name + bytes([0, 0, 33]) + struct.pack("<33q", *([1] * 33)) + tail), "33 dimensions")
    refused(with_entry(name + bytes([0, 0, 1]) + struct.pack("<q", -1) + tail), "a negative dimension")
    refused(with_entry(name + bytes([0, 0, 1]) + struct.pack("<q", (1 << 48) + 1) + tail), "a dimension past 2^48")
    refused(with_entry(name + bytes([0, 0, 0]) + struct.pack("<BqqddI", 2, 0, -1, 1.0, 1.0, 0xFFFFFFFF)),
            "has-op neither 0 nor 1")
    refused(with_entry(name + bytes([0, 0, 0]) + struct.pack("<BqqddI", 0, 5, -1, 1.0, 1.0, 0xFFFFFFFF)),
            "an op without has-op")
    refused(with_entry(name + bytes([0, 0, 0]) + struct.pack("<BqqddI", 0, 0, -1, 1.0, 1.0, 2) +
                       struct.pack("<qq", 1, -1)), "a negative split")
    refused(with_entry(name + bytes([0, 0, 0]) + struct.pack("<BqqddI", 0, 0, -1, 1.0, 1.0, 0xFFFFFFFE)),
            "4 billion splits announced in a short message")
    refused(with_entry(b"", count=0xFFFFFFFF), "4 billion entries announced in an empty message")
    refused(with_entry(name + bytes([0, 0, 0]) + tail, count=2), "one entry where two are announced")
    t.check(neg.decode(with_entry(name + bytes([0, 0, 0]) + tail))[0][0][0] == "x",
            "the hand-made entry those are made from is good")
    refused(pickle.dumps((METAS, False, False)), "the pickle the engine used to send")
    refused(memoryview(b"cos\nsystem\n(S'true'\ntR."), "a pickle that would run a command")


def test_encoder_limits():
    def refuses(msg, what):
        try:
            neg.encode(msg)
        except ValueError:
            t.check(True, what)
            return
        t.check(False, "%s: encoded" % what)
    m = METAS[0][1]
    refuses(([("x" * 70000, m)], False, False), "a name of 70000 bytes")
    refuses(([("x", ("gather",) + m[1:])], False, False), "an unknown kind")
    refuses(([("x", (m[0], "torch float") + m[2:])], False, False), "a type name with a space")
    refuses(([("x", m[:2] + ((1,) * 33,) + m[3:])], False, False), "33 dimensions")
    refuses(([("x", m[:3] + (1 << 63,) + m[4:])], False, False), "an op past 64 bits")


def test_mutations():
    rng = random.Random(26)
    pool = fuzz_negotiation.seeds()
    bad = decoded = 0
    for _ in range(20000):
        data = fuzz_negotiation.mutate(rng.choice(pool), rng, pool)
        try:
            fuzz_negotiation.check(data)
        except Exception as exc:   # noqa: BLE001 - the failure being tested for
            bad += 1
            if bad <= 3:
                t.check(False, "mutated input %r: %r" % (data, exc))
            continue
        try:
            neg.decode(data)
            decoded += 1
        except neg.NegotiationError:
            pass
    t.check(bad == 0, "20000 mutated messages: %d broke the decoder's promise" % bad)
    t.check(decoded > 100, "the mutations reach past the header (%d decoded)" % decoded)


for fn in (test_round_trip, test_malformed, test_encoder_limits, test_mutations):
    t.run(fn)
t.finish()
