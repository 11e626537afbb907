"""The engine's negotiation messages on the wire: a fixed, versioned,
length-checked binary format that can only describe collectives.

What a rank announces in a full round (loom._engine) is its new entries (name
and metadata), whether it is stopping and whether it is waiting. Other ranks
are peers, not code: a message is bytes that decode into names, numbers and a
few strings of a closed vocabulary, or into NegotiationError. Nothing received
is ever unpickled or evaluated (Horovod's Request/Response lists are a flat
binary format for the same reason), and every length is checked against the
bytes that are left before anything is allocated for it, so a hostile or
broken peer costs at most a clear error.

Layout, little-endian (version 1):

  message: magic "LMNG" | u8 version | u8 flags (1 stopping, 2 waiting)
           | u32 entry count | entries, nothing after them
  entry:   u16 name length | name (UTF-8) | u8 kind code | u8 dtype length
           | dtype (ASCII letters, digits, '.', '_') | u8 rank of the shape
           | i64 dims, each >= 0 | u8 has-op | i64 op | i64 root
           | f64 prescale | f64 postscale | u32 split count (0xffffffff: none)
           | i64 splits, each >= 0

A message is (entries, stopping, waiting), entries [(name, meta)] with meta
(kind, dtype, shape, op, root, pre, post, splits), as Entry.meta() makes it.
tests/fuzz/fuzz_negotiation.py fuzzes decode().
"""
import struct

MAGIC = b"LMNG"
VERSION = 1
# What one rank may announce in one round. Far above any honest round (a
# round announcing 10,000 tensors with long names is about 1.5 MB), and
# checked before the receive buffer is made.
MAX_MESSAGE_BYTES = 64 << 20
MAX_NAME_BYTES = 0xFFFF
MAX_DTYPE_BYTES = 64
MAX_RANK = 32       # of a shape; NumPy allows 64, torch 25 (CUDA) to 64
MAX_DIM = 1 << 48
MAX_SPLITS = 1 << 20

# The closed vocabulary of collectives; the codes never change meaning.
KINDS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "barrier",
         "__loom_join__", "__loom_refused__")
_KIND_CODE = {k: i for i, k in enumerate(KINDS)}

_HEAD = struct.Struct("<4sBBI")
_U16 = struct.Struct("<H")
_U8 = struct.Struct("<B")
_KIND_DTYPE = struct.Struct("<BB")
_TAIL = struct.Struct("<BqqddI")       # has-op, op, root, pre, post, split count (as u32)
_FLAG_STOPPING, _FLAG_WAITING = 1, 2
_NO_SPLITS = 0xFFFFFFFF
_DTYPE_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._")
_MIN_ENTRY = _U16.size + 1 + 1 + 1 + _TAIL.size


_dtype_seen = {}   # decoded type names, by their bytes


class NegotiationError(ValueError):
    """A negotiation message that is not a well-formed one of this version."""


_dtype_ok = {}   # type names seen valid: a round repeats a handful of them


def _dtype_bytes(dtype):
    d = _dtype_ok.get(dtype)
    if d is None:
        d = dtype.encode("ascii", "replace")
        if len(d) > MAX_DTYPE_BYTES or not _DTYPE_CHARS.issuperset(d):
            raise ValueError("loom: type name %r cannot be negotiated" % dtype)
        if len(_dtype_ok) < 256:
            _dtype_ok[dtype] = d
    return d


def encode(msg):
    """The bytes of msg = (entries, stopping, waiting)."""
    entries, stopping, waiting = msg
    out = [_HEAD.pack(MAGIC, VERSION, (_FLAG_STOPPING if stopping else 0) |
                      (_FLAG_WAITING if waiting else 0), len(entries))]
    for name, meta in entries:
        kind, dtype, shape, op, root, pre, post, splits = meta
        raw = name.encode("utf-8")
        code = _KIND_CODE.get(kind)
        if code is None:
            raise ValueError("loom: '%s': %r is not a collective the engine negotiates" % (name, kind))
        if len(raw) > MAX_NAME_BYTES:
            raise ValueError("loom: tensor name of %d bytes is longer than %d" % (len(raw), MAX_NAME_BYTES))
        if len(shape) > MAX_RANK:
            raise ValueError("loom: tensor '%s' has %d dimensions; at most %d can be negotiated"
                             % (name, len(shape), MAX_RANK))
        if splits is not None and len(splits) > MAX_SPLITS:
            raise ValueError("loom: %d splits are more than %d" % (len(splits), MAX_SPLITS))
        d = _dtype_bytes(dtype)
        try:
            out.append(b"".join((
                _U16.pack(len(raw)), raw, _KIND_DTYPE.pack(code, len(d)), d,
                _U8.pack(len(shape)), struct.pack("<%dq" % len(shape), *shape),
                _TAIL.pack(op is not None, 0 if op is None else op, root, pre, post,
                           _NO_SPLITS if splits is None else len(splits)),
                b"" if splits is None else struct.pack("<%dq" % len(splits), *splits))))
        except struct.error as exc:
            raise ValueError("loom: tensor '%s' cannot be negotiated: %s (dimensions, op, root and "
                             "splits are 64-bit integers)" % (name, exc)) from None
    return b"".join(out)


def decode(data):
    """(entries, stopping, waiting) from bytes; NegotiationError for
    anything else, never another exception."""
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    n = len(view)
    if n < _HEAD.size:
        raise NegotiationError("a message of %d bytes is shorter than the %d-byte header" % (n, _HEAD.size))
    magic, version, flags, count = _HEAD.unpack_from(view, 0)
    if magic != MAGIC:
        raise NegotiationError("not a negotiation message (magic %r)" % bytes(magic))
    if version != VERSION:
        raise NegotiationError("negotiation format version %d, this rank speaks %d (mixed Loom "
                               "versions in one job?)" % (version, VERSION))
    if flags & ~(_FLAG_STOPPING | _FLAG_WAITING):
        raise NegotiationError("unknown flags 0x%x" % flags)
    off = _HEAD.size
    if count > (n - off) // _MIN_ENTRY:
        raise NegotiationError("%d entries cannot fit in %d bytes" % (count, n - off))
    entries = []
    for i in range(count):
        if n - off < _U16.size:
            raise NegotiationError("entry %d: the name's length runs past the end of the message" % i)
        (ln,) = _U16.unpack_from(view, off)
        off += _U16.size
        if n - off < ln + 2:
            raise NegotiationError("entry %d: the name runs past the end of the message" % i)
        try:
            name = str(view[off:off + ln], "utf-8")
        except UnicodeDecodeError:
            raise NegotiationError("entry %d: the name is not UTF-8" % i) from None
        off += ln
        code, ld = _KIND_DTYPE.unpack_from(view, off)
        off += 2
        if code >= len(KINDS):
            raise NegotiationError("entry %d ('%s'): unknown collective code %d" % (i, name, code))
        if ld > MAX_DTYPE_BYTES or n - off < ld + 1:
            raise NegotiationError("entry %d ('%s'): a type name of %d bytes" % (i, name, ld))
        d = bytes(view[off:off + ld])
        dtype = _dtype_seen.get(d)
        if dtype is None:
            if not _DTYPE_CHARS.issuperset(d):
                raise NegotiationError("entry %d ('%s'): the type name has characters no type has"
                                       % (i, name))
            dtype = d.decode("ascii")
            if len(_dtype_seen) < 256:
                _dtype_seen[d] = dtype
        off += ld
        rank = view[off]
        off += 1
        if rank > MAX_RANK:
            raise NegotiationError("entry %d ('%s'): %d dimensions" % (i, name, rank))
        if n - off < rank * 8 + _TAIL.size:
            raise NegotiationError("entry %d ('%s'): the shape runs past the end of the message" % (i, name))
        shape = struct.unpack_from("<%dq" % rank, view, off)
        off += rank * 8
        if shape and (min(shape) < 0 or max(shape) > MAX_DIM):
            raise NegotiationError("entry %d ('%s'): a dimension out of range in %s" % (i, name, list(shape)))
        has_op, op, root, pre, post, n_splits = _TAIL.unpack_from(view, off)
        off += _TAIL.size
        if has_op > 1 or (not has_op and op != 0):
            raise NegotiationError("entry %d ('%s'): a malformed op" % (i, name))
        splits = None
        if n_splits != _NO_SPLITS:
            if n_splits > MAX_SPLITS or n - off < n_splits * 8:
                raise NegotiationError("entry %d ('%s'): %d splits in what is left of the message"
                                       % (i, name, n_splits))
            splits = struct.unpack_from("<%dq" % n_splits, view, off)
            off += n_splits * 8
            if splits and min(splits) < 0:
                raise NegotiationError("entry %d ('%s'): a negative split" % (i, name))
        entries.append((name, (KINDS[code], dtype, shape, op if has_op else None, root, pre, post, splits)))
    if off != n:
        raise NegotiationError("%d bytes after the last entry" % (n - off))
    return entries, bool(flags & _FLAG_STOPPING), bool(flags & _FLAG_WAITING)
