"""loom.torch: Horovod's PyTorch API over Loom. A Horovod script runs after
changing `import horovod.torch as hvd` to `import loom.torch as hvd`.

Collectives take CPU tensors of any Loom type (int8, uint8, int16, int32, int64,
float16, bfloat16, float32, float64, bool), and CUDA tensors where libloom was
built with CUDA, and go through the background engine (see loom/_engine.py):
named, negotiated across ranks, small allreduces fused. A CUDA tensor is
ordered after its producer as Horovod orders it: an event recorded on the
current stream at submit, waited for by the engine before libloom reads the
memory (never a device-wide sync); the result is in place when the handle
completes.
Every collective is differentiable (as Horovod's); errors derive from
RuntimeError (LoomError), HorovodInternalError for a lost peer."""
import contextlib
import io
import itertools
import pickle

import torch
import torch.utils.dlpack

from .. import _basics
from .._basics import (  # noqa: F401
    Sum, Average, Min, Max, Product, Adasum, ProcessSet, global_process_set,
    shutdown, is_initialized, size, rank, local_size, local_rank, cross_size, cross_rank,
    is_homogeneous, remove_process_set,
    mpi_built, mpi_enabled, mpi_threads_supported, gloo_built, gloo_enabled, nccl_built,
    ddl_built, ccl_built, cuda_built, rocm_built, loom_built, start_timeline, stop_timeline)
from .._loom import LoomError, LoomInternalError  # noqa: F401
from .. import _engine, _loom
from ..elastic import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401

_handles = {}      # int handle -> (Engine, Handle)
_handle_ids = itertools.count(1)   # next() is atomic under the GIL: hooks may run on other threads

_DT = {
    torch.int8: _loom.INT8, torch.uint8: _loom.UINT8, torch.int16: _loom.INT16,
    torch.int32: _loom.INT32,
    torch.int64: _loom.INT64, torch.float16: _loom.FLOAT16, torch.bfloat16: _loom.BFLOAT16,
    torch.float32: _loom.FLOAT32, torch.float64: _loom.FLOAT64, torch.bool: _loom.UINT8,
}
if hasattr(torch, "uint16"):   # PyTorch 2.3 and later
    _DT[torch.uint16] = _loom.UINT16
_BY_NAME = {str(k): k for k in _DT}
_ESIZE = {str(k): torch.empty((), dtype=k).element_size() for k in _DT}
# The type name of a CUDA tensor: "torch.cuda.float32" (the device type only,
# not its index: ranks on different GPUs of a node agree on it).
_CUDA = "torch.cuda."


def _type_of(name):
    """(torch dtype, device type) of a type name."""
    if name.startswith(_CUDA):
        return _BY_NAME["torch." + name[len(_CUDA):]], "cuda"
    return _BY_NAME[name], "cpu"


class _TorchBackend(_engine.Backend):
    prefix = "torch"

    def dtype_name(self, t):
        name = str(t.dtype)             # "torch.float32"
        return _CUDA + name[len("torch."):] if t.is_cuda else name

    def loom_dtype(self, name):
        return _DT[_type_of(name)[0]]

    def esize(self, name):
        return _ESIZE[str(_type_of(name)[0])]

    def empty(self, shape, name):
        dtype, device = _type_of(name)
        return torch.empty(shape, dtype=dtype, device=device)

    def zeros(self, shape, name):
        dtype, device = _type_of(name)
        return torch.zeros(shape, dtype=dtype, device=device)

    def empty_on(self, shape, name, like):
        return torch.empty(shape, dtype=_type_of(name)[0], device=like.device)

    def device_of(self, t):
        return t.device

    def settle(self, t):
        # The stream this thread queued the round's copies and scaling on
        # (its current one on that device): that stream only, not the device.
        if t.is_cuda:
            torch.cuda.current_stream(t.device).synchronize()

    def cap(self, t):
        """A DLPack capsule over t's memory: no copy."""
        if t.requires_grad:
            t = t.detach()
        if t.dtype == torch.bool:   # DLPack, as torch 1.x speaks it, has no bool
            t = t.view(torch.uint8)
        return torch.utils.dlpack.to_dlpack(t)

    def copy_(self, dst, src):
        dst.copy_(src)

    def scale_(self, t, factor):
        # As Horovod: integers are scaled in float64 and truncated back,
        # 16-bit floats in float32 (one rounding, not one per operation).
        if not t.dtype.is_floating_point:
            t.copy_(t.double().mul_(factor))
        elif t.element_size() == 2:
            t.copy_(t.float().mul_(factor))
        else:
            t.mul_(factor)

    def clone(self, t):
        return t.clone()

    def int_vector(self, values):
        return torch.tensor(values, dtype=torch.int32)

    def to_float64(self, t):
        # To the host first: the conversion then runs there, on CUDA tensors too.
        return t.detach().reshape(-1).cpu().to(torch.float64).numpy().copy()

    def from_float64_(self, t, values):
        t.copy_(torch.from_numpy(values).to(t.dtype).reshape(t.shape))


_TORCH = _TorchBackend()
_engine.register_backend(_TORCH)


def Entry(*args, **kwargs):
    e = _engine.Entry(*args, backend=_TORCH, **kwargs)
    t = e.tensor
    if t is not None and t.is_cuda:
        # Made last, after any copy the call made of the input (clone,
        # contiguous): the engine waits for everything queued before it.
        e.ready = torch.cuda.Event()
        e.ready.record(torch.cuda.current_stream(t.device))
    return e


def init(comm=None, process_sets=None):
    _basics.init(comm, process_sets)


def add_process_set(process_set):
    return _basics.add_process_set(process_set)


_engine_for = _engine.engine_for


def _check_tensor(tensor, what):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor, got %s" % (what, type(tensor).__name__))
    if tensor.device.type == "cuda":
        if not _loom.CUDA_BUILT:
            raise ValueError("%s: a CUDA tensor (on %s), but the libloom loom._loom links was built "
                             "without CUDA (configure --with-cuda): pass CPU tensors" % (what, tensor.device))
    elif tensor.device.type != "cpu":
        raise ValueError("%s: loom.torch takes CPU and CUDA tensors (this one is on %s)"
                         % (what, tensor.device))
    if tensor.is_sparse:
        raise ValueError("%s: sparse tensors take sparse_allreduce_async (or "
                         "DistributedOptimizer(sparse_as_dense=True))" % what)
    if tensor.dtype not in _DT:
        raise TypeError("%s: loom has no element type for %s" % (what, tensor.dtype))


def _one_device(tensors, what):
    """tensors as a list, checked: a grouped call's tensors share one device
    (its fusion buffer's)."""
    tensors = list(tensors)
    devices = []
    for t in tensors:
        _check_tensor(t, what)
        if t.device not in devices:
            devices.append(t.device)
    if len(devices) > 1:
        raise ValueError("%s: the tensors of one call must be on one device, these are on %s"
                         % (what, ", ".join(str(d) for d in devices)))
    return tensors


def _op_of(op, average, what):
    if average is not None:
        op = Average if average else Sum
    if op is None or op == Adasum:
        raise LoomError("%s: Adasum is only implemented for allreduce" % what)
    return op


def _allreduce_op(op, average):
    """allreduce's op: Average by default; Adasum passes through."""
    if op == Adasum and average is None:
        return Adasum
    return _op_of(Average if op is None else op, average, "allreduce")


def _root_in_set(root_rank, process_set):
    """Horovod's root ranks are global ranks: the rank within process_set's
    communicator, or a rank out of its range (the engine then fails the call
    on every rank alike) when root_rank is not a member."""
    root = int(root_rank)
    ps = process_set if process_set is not None else global_process_set
    if ps is global_process_set:
        return root
    return ps.ranks.index(root) if root in ps.ranks else len(ps.ranks) + abs(root)


def _sync(submit, *args):
    """submit(*args), then wait: the waiting thread runs the rounds itself, so
    the engine thread is not woken for this call (see _engine.Engine.wait)."""
    _engine.inline.on = True
    try:
        h = submit(*args)
    finally:
        _engine.inline.on = False
    return synchronize(h)


def _enqueue(eng, entry):
    h = eng.submit(entry)
    hid = next(_handle_ids)
    _handles[hid] = (eng, h)
    return hid


def _in_place(tensor):
    """(buffer loom writes, finish) for an in-place call: the tensor itself when
    contiguous, else a contiguous copy written back when done."""
    if tensor.is_contiguous():
        return tensor, None
    work = tensor.contiguous()

    def back(result):
        tensor.copy_(work)
        return tensor
    return work, back


def _chain(first, then):
    if first is None:
        return then
    if then is None:
        return first
    return lambda r: then(first(r))


# ---- allreduce ---------------------------------------------------------------

def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    eng = _engine_for(process_set)
    return _enqueue(eng, _allreduce_entry(eng, tensor, average, name, op, prescale_factor,
                                          postscale_factor))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    _check_tensor(tensor, "allreduce")
    out = tensor.detach().clone(memory_format=torch.contiguous_format)
    return allreduce_async_(out, average, name, op, prescale_factor, postscale_factor, process_set)


class _AllreduceGrad(torch.autograd.Function):
    """Gradient of an allreduce: the allreduce of the gradient (as Horovod's)."""

    @staticmethod
    def forward(ctx, tensor, name, op, pre, post, process_set):
        ctx.args = (op, pre, post, process_set)
        return _allreduce_new(tensor, name, op, pre, post, process_set)

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, ps = ctx.args
        return (_sync(allreduce_async, grad.contiguous(), None, None, op, pre, post, ps),
                None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """A new tensor holding the reduction of tensor over the process set;
    differentiable."""
    op = _allreduce_op(op, average)
    compressed, ctx = compression.compress(tensor) if compression else (tensor, None)
    if isinstance(compressed, torch.Tensor) and not (compressed.requires_grad and torch.is_grad_enabled()):
        # Nothing to differentiate: the call without autograd's Function
        # (the same result, a few microseconds less on a small tensor).
        out = _allreduce_new(compressed, name, op, prescale_factor, postscale_factor, process_set)
    else:
        out = _AllreduceGrad.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx) if compression else out


def _allreduce_new(tensor, name, op, pre, post, process_set):
    """allreduce into a new tensor, synchronous; op resolved already."""
    _check_tensor(tensor, "allreduce")
    if op == Adasum and not tensor.dtype.is_floating_point:
        raise LoomError("allreduce: Adasum takes floating-point tensors (not %s)" % tensor.dtype)
    eng = _engine_for(process_set)
    out = tensor.detach().clone(memory_format=torch.contiguous_format)
    return eng.run(Entry("allreduce", name or eng.auto_name("allreduce"), tensor=out, output=out, op=op,
                         pre=pre, post=post))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    return _sync(allreduce_async_, tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set)


def _allreduce_entry(eng, tensor, average, name, op, pre, post):
    _check_tensor(tensor, "allreduce")
    if op == Adasum and average is None:
        if not tensor.dtype.is_floating_point:
            raise LoomError("allreduce: Adasum takes floating-point tensors (not %s)" % tensor.dtype)
    else:
        op = _op_of(Average if op is None else op, average, "allreduce")
    work, finish = _in_place(tensor)
    e = Entry("allreduce", name or eng.auto_name("allreduce"), tensor=work.detach(),
              output=work.detach(), op=op, pre=pre, post=post, finish=finish)
    if finish is None:
        e.finish = lambda r: tensor
    return e


def _enqueue_group(eng, entries):
    """Submit entries at once (the engine sees them in one round); one handle."""
    hs = eng.submit_many(entries)
    ids = []
    for h in hs:
        hid = next(_handle_ids)
        _handles[hid] = (eng, h)
        ids.append(hid)
    return _group_handle(ids)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """One handle for a group of in-place allreduces (fused together when they fit)."""
    tensors = _one_device(tensors, "grouped_allreduce")
    eng = _engine_for(process_set)
    base = name or eng.auto_name("grouped_allreduce")
    return _enqueue_group(eng, [_allreduce_entry(eng, t, average, "%s.%d" % (base, i), op,
                                                 prescale_factor, postscale_factor)
                                for i, t in enumerate(tensors)])


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    tensors = _one_device(tensors, "grouped_allreduce")
    outs = [t.detach().clone(memory_format=torch.contiguous_format) for t in tensors]
    return grouped_allreduce_async_(outs, average, name, op, prescale_factor, postscale_factor,
                                    process_set)


class _GroupedAllreduceGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, pre, post, process_set, *tensors):
        ctx.args = (average, op, pre, post, process_set)
        return tuple(_sync(grouped_allreduce_async, list(tensors), average, name, op, pre, post,
                                                         process_set))

    @staticmethod
    def backward(ctx, *grads):
        average, op, pre, post, ps = ctx.args
        out = _sync(grouped_allreduce_async, [g.contiguous() for g in grads], average, None, op,
                                                  pre, post, ps)
        return (None, None, None, None, None, None) + tuple(out)


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """New tensors holding the reductions of tensors; differentiable."""
    return list(_GroupedAllreduceGrad.apply(average, name, op, prescale_factor, postscale_factor,
                                            process_set, *tensors))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return _sync(grouped_allreduce_async_, tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set)


_groups = {}   # handle -> list of member handles


def _group_handle(hs):
    hid = next(_handle_ids)
    _groups[hid] = hs
    return hid


# ---- the other collectives ---------------------------------------------------

def allgather_async(tensor, name=None, process_set=global_process_set):
    _check_tensor(tensor, "allgather")
    eng = _engine_for(process_set)
    t = tensor.detach().contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    return _enqueue(eng, Entry("allgather", name or eng.auto_name("allgather"), tensor=t))


def _ps(process_set):
    return process_set if process_set is not None else global_process_set


def _my_rows(grad, dims, ps):
    """This rank's rows of a gradient of gathered rows (dims: rows per rank)."""
    r = ps.rank() if ps is not global_process_set else _basics.rank()
    start = sum(dims[:r])
    return grad.narrow(0, start, dims[r])


class _AllgatherGrad(torch.autograd.Function):
    """Gradient of an allgather (as Horovod's): the average over the ranks of
    the gathered gradient, this rank's rows."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim, ctx.ps = (tensor.shape[0] if tensor.dim() else 1), _ps(process_set)
        return _sync(allgather_async, tensor, name, process_set)

    @staticmethod
    def backward(ctx, grad):
        reduced = _sync(allreduce_async, grad.contiguous(), None, None, Average, 1.0, 1.0, ctx.ps)
        dims = _sync(allgather_async, torch.tensor([ctx.dim], dtype=torch.int64), None, ctx.ps)
        return _my_rows(reduced, dims.tolist(), ctx.ps), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenation of every rank's tensor along dimension 0 (whose length may
    differ by rank); differentiable."""
    return _AllgatherGrad.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    tensors = _one_device(tensors, "grouped_allgather")
    eng = _engine_for(process_set)
    base = name or eng.auto_name("grouped_allgather")
    entries = []
    for i, tensor in enumerate(tensors):
        _check_tensor(tensor, "grouped_allgather")
        t = tensor.detach().contiguous()
        entries.append(Entry("allgather", "%s.%d" % (base, i), tensor=t.reshape(1) if t.dim() == 0 else t))
    return _enqueue_group(eng, entries)


class _GroupedAllgatherGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims, ctx.ps = [t.shape[0] if t.dim() else 1 for t in tensors], _ps(process_set)
        return tuple(_sync(grouped_allgather_async, list(tensors), name, process_set))

    @staticmethod
    def backward(ctx, *grads):
        reduced = _sync(grouped_allreduce_async, [g.contiguous() for g in grads], None, None,
                                                      Average, 1.0, 1.0, ctx.ps)
        dims = _sync(grouped_allgather_async, [torch.tensor([d], dtype=torch.int64) for d in ctx.dims],
                                                   None, ctx.ps)
        return (None, None) + tuple(_my_rows(g, d.tolist(), ctx.ps) for g, d in zip(reduced, dims))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather of each tensor, in one submission; differentiable."""
    return list(_GroupedAllgatherGrad.apply(name, process_set, *tensors))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    _check_tensor(tensor, "broadcast")
    eng = _engine_for(process_set)
    work, finish = _in_place(tensor)
    e = Entry("broadcast", name or eng.auto_name("broadcast"), tensor=work.detach(),
              output=work.detach(), root=_root_in_set(root_rank, process_set), finish=finish)
    if finish is None:
        e.finish = lambda r: tensor
    return _enqueue(eng, e)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    _check_tensor(tensor, "broadcast")
    return broadcast_async_(tensor.detach().clone(memory_format=torch.contiguous_format),
                            root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return _sync(broadcast_async_, tensor, root_rank, name, process_set)


class _BroadcastGrad(torch.autograd.Function):
    """Gradient of a broadcast (as Horovod's): the average of the gradients on
    the root, zero elsewhere."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root, ctx.ps = root_rank, _ps(process_set)
        return _sync(broadcast_async, tensor, root_rank, name, process_set)

    @staticmethod
    def backward(ctx, grad):
        reduced = _sync(allreduce_async, grad.contiguous(), None, None, Average, 1.0, 1.0, ctx.ps)
        if _basics.rank() != ctx.root:
            reduced.zero_()
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank's tensor (root_rank is a global rank); differentiable."""
    return _BroadcastGrad.apply(tensor, root_rank, name, process_set)


_EQUAL = object()   # alltoall_async: equal splits, and return the received splits too


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    _check_tensor(tensor, "alltoall")
    eng = _engine_for(process_set)
    t = tensor.detach().contiguous()
    n = eng.n
    equal = splits is _EQUAL
    if equal:
        splits = None
    if splits is None:
        if t.shape[0] % n:
            raise ValueError("alltoall: dimension 0 (%d) does not split over %d ranks" % (t.shape[0], n))
        sp = [t.shape[0] // n] * n
    else:
        sp = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
        if len(sp) != n or sum(sp) != t.shape[0] or min(sp) < 0:
            raise ValueError("alltoall: splits %s do not divide %d rows over %d ranks" % (sp, t.shape[0], n))
    e = Entry("alltoall", name or eng.auto_name("alltoall"), tensor=t, splits=sp)
    if splits is None and not equal:
        e.finish = lambda r: r[0]
    return _enqueue(eng, e)


class _AlltoallGrad(torch.autograd.Function):
    """Gradient of an alltoall: the alltoall of the gradient back, with the
    received splits as the splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        out = _sync(alltoall_async, tensor, splits if splits is not None else _EQUAL, name,
                                         process_set)
        output, received = out
        ctx.recv, ctx.ps = received, process_set
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, *ignored):
        back, _ = _sync(alltoall_async, grad.contiguous(), ctx.recv, None, ctx.ps)
        return back, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Send splits[i] rows of dimension 0 to rank i (equal parts by default);
    returns what arrived, and the received splits when splits is given;
    differentiable."""
    return _AlltoallGrad.apply(tensor, splits, name, process_set)


def _reducescatter_entry(eng, tensor, name, op, pre, post, what="reducescatter"):
    _check_tensor(tensor, what)
    op = _op_of(op, None, what)
    t = tensor.detach().clone(memory_format=torch.contiguous_format)
    if t.dim() == 0:
        raise ValueError("%s: needs at least one dimension" % what)
    return Entry("reducescatter", name or eng.auto_name("reducescatter"), tensor=t, output=t, op=op,
                 pre=pre, post=post)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    eng = _engine_for(process_set)
    return _enqueue(eng, _reducescatter_entry(eng, tensor, name, op, prescale_factor, postscale_factor))


def _reducescatter_grad_in(grads, op, ps, pre, post):
    # As Horovod's: the gradient of a Sum is scaled by the set's size.
    out = []
    for g in grads:
        if op == Sum:
            g = g * ps.size()
        if pre != 1.0:
            g = g * pre
        if post != 1.0:
            g = g * post
        out.append(g.contiguous())
    return out


class _ReducescatterGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, pre, post):
        ctx.args = (op, _ps(process_set), pre, post)
        return _sync(reducescatter_async, tensor, name, op, process_set, pre, post)

    @staticmethod
    def backward(ctx, grad):
        op, ps, pre, post = ctx.args
        g, = _reducescatter_grad_in([grad], op, ps, pre, post)
        return _sync(allgather_async, g, None, ps), None, None, None, None, None


def reducescatter(tensor, name=None, compression=None, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduce over the ranks, keep this rank's share of dimension 0 (even split,
    the first ranks take one row more); differentiable."""
    return _ReducescatterGrad.apply(tensor, name, op, process_set, prescale_factor, postscale_factor)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    tensors = _one_device(tensors, "grouped_reducescatter")
    eng = _engine_for(process_set)
    base = name or eng.auto_name("grouped_reducescatter")
    return _enqueue_group(eng, [_reducescatter_entry(eng, t, "%s.%d" % (base, i), op, prescale_factor,
                                                     postscale_factor, "grouped_reducescatter")
                                for i, t in enumerate(tensors)])


class _GroupedReducescatterGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, pre, post, *tensors):
        ctx.args = (op, _ps(process_set), pre, post)
        return tuple(_sync(grouped_reducescatter_async, list(tensors), name, op, process_set,
                                                             pre, post))

    @staticmethod
    def backward(ctx, *grads):
        op, ps, pre, post = ctx.args
        gs = _reducescatter_grad_in(grads, op, ps, pre, post)
        return (None, None, None, None, None) + tuple(_sync(grouped_allgather_async, gs, None, ps))


def grouped_reducescatter(tensors, name=None, compression=None, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """reducescatter of each tensor, in one submission; differentiable."""
    return list(_GroupedReducescatterGrad.apply(name, op, process_set, prescale_factor,
                                                postscale_factor, *tensors))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Allreduce of a sparse tensor as Horovod does it: allgather of its indices
    and values (duplicates add up when used). Returns a callable that waits and
    returns the sparse result."""
    if op not in (Sum, Average):
        raise LoomError("sparse_allreduce_async: op must be Sum or Average")
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    ih = allgather_async(t._indices().transpose(0, 1).contiguous(), name="%s.indices" % name,
                         process_set=process_set)
    vh = allgather_async(t._values(), name="%s.values" % name, process_set=process_set)
    ps = _ps(process_set)

    def handle():
        values = synchronize(vh)
        indices = synchronize(ih)
        if op == Average:
            values = values / ps.size()
        if indices.dim() == 0 or values.dim() == 0:
            return t.new().resize_as_(t)
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size())
    return handle


def barrier(process_set=global_process_set):
    eng = _engine_for(process_set)
    # One name: a rank has one barrier at a time, and a fixed name cannot
    # drift between ranks that made different numbers of unnamed calls.
    synchronize(_enqueue(eng, Entry("barrier", "__loom_barrier__")))


def join(device=-1):
    """Stop contributing: until every rank has joined, this rank takes part in
    the others' allreduces with zeros. Returns the rank that joined last."""
    eng = _engine_for(global_process_set)
    return synchronize(_enqueue(eng, Entry(_engine.JOIN, _engine.JOIN)))


def poll(handle):
    """True when the operation behind handle has finished."""
    if handle in _groups:
        return all(poll(h) for h in _groups[handle])
    if handle not in _handles:
        raise ValueError("poll: unknown handle %r" % (handle,))
    return _handles[handle][1].done


def synchronize(handle):
    """Wait for an asynchronous operation; returns its result."""
    if handle in _groups:
        # Every member is taken, even after one failed: a member left behind
        # would keep its name taken (see _engine.Handle.held).
        results, error = [], None
        for h in _groups.pop(handle):
            try:
                results.append(synchronize(h))
            except Exception as exc:   # noqa: BLE001 - raised once all are taken
                error = error or exc
        if error is not None:
            raise error
        return results
    try:
        eng, h = _handles.pop(handle)
    except KeyError:
        raise ValueError("synchronize: unknown handle %r" % (handle,)) from None
    return eng.wait(h)


# ---- objects -------------------------------------------------------------------

def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """obj from root_rank, on every rank (pickled: the ranks must trust each
    other, see _basics._warn_objects_trusted)."""
    _basics._warn_objects_trusted()
    name = name or type(obj).__name__
    if _basics.rank() == root_rank:
        b = io.BytesIO()
        torch.save(obj, b)
        data = torch.frombuffer(bytearray(b.getvalue()), dtype=torch.uint8)
        sz = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        data, sz = None, torch.zeros(1, dtype=torch.int64)
    broadcast_(sz, root_rank, name + ".sz", process_set)
    if data is None:
        data = torch.empty(int(sz.item()), dtype=torch.uint8)
    broadcast_(data, root_rank, name + ".t", process_set)
    if _basics.rank() == root_rank:
        return obj
    return torch.load(io.BytesIO(data.numpy().tobytes()), map_location="cpu")


def allgather_object(obj, name=None, process_set=global_process_set):
    """[obj of rank 0, obj of rank 1, ...] on every rank (pickled, as broadcast_object)."""
    _basics._warn_objects_trusted()
    name = name or type(obj).__name__
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    sizes = allgather(torch.tensor([data.numel()], dtype=torch.int64), name + ".sz", process_set)
    gathered = allgather(data, name + ".t", process_set).numpy().tobytes()
    out, off = [], 0
    for s in sizes.tolist():
        out.append(pickle.loads(gathered[off:off + s]))
        off += s
    return out


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrite params (a state_dict, or (name, tensor) pairs such as
    model.named_parameters()) with root_rank's, in place."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list) or isinstance(params, tuple) or hasattr(params, "__iter__"):
        items = list(params)
        if items and not isinstance(items[0], tuple):
            items = [("param.%d" % i, p) for i, p in enumerate(items)]
    else:
        raise ValueError("broadcast_parameters: invalid params of type %s" % type(params))
    handles = []
    for name, p in items:
        if p is None:
            continue
        t = p.data if isinstance(p, torch.nn.Parameter) else p
        if not isinstance(t, torch.Tensor):
            continue
        handles.append(broadcast_async_(t, root_rank, "broadcast." + name, process_set))
    for h in handles:
        synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank, process_set=global_process_set):
    """Make every rank's optimizer state (and hyper-parameters) root_rank's."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state: LBFGS is not supported")
    if not optimizer.state_dict()["state"]:
        # A new optimizer has no state yet: as Horovod, give every trainable
        # parameter a zero gradient and take one local step to create it.
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
                    if isinstance(optimizer, torch.optim.SparseAdam):
                        p.grad = p.grad.to_sparse()
        if getattr(optimizer, "_loom_distributed", False):
            super(optimizer.__class__, optimizer).step()   # no allreduce: a local step
        else:
            optimizer.step()
    state = broadcast_object(optimizer.state_dict(), root_rank, "optimizer_state", process_set)
    if _basics.rank() != root_rank:
        optimizer.load_state_dict(state)


# ---- compression -------------------------------------------------------------

class Compressor:
    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx) if ctx is not None else tensor


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor


# ---- DistributedOptimizer ------------------------------------------------------

class _DistributedOptimizer(torch.optim.Optimizer):
    _loom_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=Average, gradient_predivide_factor=1.0, process_set=global_process_set,
                 sparse_as_dense=False):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self.sparse_as_dense = sparse_as_dense
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [("allreduce.noname.%d.%d" % (i, j), v)
                                for i, group in enumerate(self.param_groups)
                                for j, v in enumerate(group["params"])]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of (name, parameter) tuples")
        names = [k for k, _ in named_parameters]
        dups = sorted({k for k in names if names.count(k) > 1})
        if dups:
            raise ValueError("named_parameters has duplicate names: %s" % ", ".join(dups))
        all_ids = {id(v) for group in self.param_groups for v in group["params"]}
        named_ids = {id(v) for _, v in named_parameters}
        if all_ids - named_ids:
            raise ValueError("named_parameters was given but does not cover every optimized parameter")
        self._parameter_names = {v: k for k, v in sorted(named_parameters)}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in sorted(named_parameters)}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.process_set = process_set
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        # A rank outside process_set takes local steps (as Horovod's).
        self._member = _ps(process_set).included()
        if self._member:
            self._register_hooks()

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    # The gradient accumulator's hook runs once p.grad holds this
                    # backward pass's gradient: start its allreduce right then.
                    p_tmp = p.expand_as(p)
                    grad_acc = p_tmp.grad_fn.next_functions[0][0]
                    grad_acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(grad_acc)

    def _allreduce_grad_async(self, p):
        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor is None:
            tensor = p.grad = torch.zeros_like(p)
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                return sparse_allreduce_async(tensor, name, self.op, self.process_set), None, None
            tensor = tensor.to_dense()
        compressed, ctx = self._compression.compress(tensor)
        if self.op == Average:
            pre = 1.0 / self.gradient_predivide_factor
            post = self.gradient_predivide_factor
        else:
            pre = post = 1.0
        handle = allreduce_async_(compressed, name=name, op=self.op, prescale_factor=pre,
                                  postscale_factor=post, process_set=self.process_set)
        return handle, ctx, compressed

    def _make_hook(self, p):
        def hook(*ignore):
            if p in self._handles and self._handles[p][0] is not None:
                if self._allreduce_delay[p] <= 0:
                    raise AssertionError(
                        "Gradients were computed more than backward_passes_per_step times before "
                        "optimizer.step() or optimizer.synchronize(); increase backward_passes_per_step "
                        "to accumulate gradients locally.")
            assert not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            handle, ctx, compressed = None, None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                handle, ctx, compressed = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx, compressed)
        return hook

    def synchronize(self):
        """Wait for every gradient's allreduce (starting those whose hook never ran)."""
        if not self._member:
            self._synchronized = True
            return
        missing = self._requires_update - set(self._handles.keys())
        for p in sorted(missing, key=lambda q: self._parameter_names.get(q, "")):
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx, compressed) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx, compressed) in self._handles.items():
            out = handle() if callable(handle) else synchronize(handle)
            self._allreduce_delay[p] = self.backward_passes_per_step
            if p.grad.is_sparse:
                # The sparse path's sum, or the dense one's (sparse_as_dense), back in place.
                agg = self._compression.decompress(out, ctx) if not callable(handle) else out
                p.grad.zero_().add_(agg if agg.is_sparse else agg.to_sparse())
            elif ctx is not None or compressed is not p.grad:
                p.grad.copy_(self._compression.decompress(out, ctx))
        self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """For step() after an explicit synchronize() (e.g. to clip gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                import warnings
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() after "
                              "optimizer.synchronize(): gradients are reduced twice.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(): the gradients would be "
                                 "zeroed while their allreduce runs.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wrap optimizer so that step() applies gradients averaged (op) over the
    ranks. Each gradient's allreduce starts from a backward hook as soon as it is
    computed and is waited for in step(); with backward_passes_per_step=N,
    gradients accumulate locally over N backward passes before one allreduce.
    op=Adasum combines the gradients with Adasum (loom/_adasum.py) before the
    wrapped optimizer's step; Horovod combines the steps' parameter deltas
    instead, which is the same for plain SGD (Adasum is homogeneous)."""
    if op is None:
        op = Adasum
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, process_set, sparse_as_dense)


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Batch normalization over the whole batch of every rank of process_set
    (Horovod's SyncBatchNorm), on the CPU too: in training, the per-channel
    sums, sums of squares and counts are allreduced (differentiably, so the
    gradient flows to every rank's inputs); in eval, the running statistics."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("SyncBatchNorm: expected at least 2D input (got %dD)" % input.dim())

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        if not self.training and self.track_running_stats:
            return torch.nn.functional.batch_norm(input, self.running_mean, self.running_var,
                                                  self.weight, self.bias, False, 0.0, self.eps)
        c = input.shape[1]
        # float64 statistics: E[x^2] - E[x]^2 cancels badly in float32.
        x = input.transpose(0, 1).reshape(c, -1).double()
        local = torch.cat([x.sum(1), (x * x).sum(1),
                           torch.tensor([x.shape[1]], dtype=torch.float64, device=x.device)])
        total = allreduce(local, op=Sum, name=None, process_set=self.process_set)
        n = total[-1]
        mean = total[:c] / n
        var = total[c:2 * c] / n - mean * mean
        if self.training and self.track_running_stats:
            with torch.no_grad():
                unbiased = var * n / (n - 1) if n > 1 else var
                self.running_mean.mul_(1 - factor).add_(factor * mean.to(self.running_mean.dtype))
                self.running_var.mul_(1 - factor).add_(factor * unbiased.to(self.running_var.dtype))
        shape = [1, c] + [1] * (input.dim() - 2)
        y = (input.double() - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        y = y.to(input.dtype)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y


def _fusion_stats(process_set=global_process_set):
    """Counters of the engine (rounds, fused_calls, tensors): for tests and tuning."""
    eng = _engine.engines.get(process_set.process_set_id)
    return dict(eng.stats) if eng else {}


def _drop_stale_handles():
    # After an elastic reset the handles of the old epoch can never complete.
    _handles.clear()
    _groups.clear()


_basics._reset_hooks.append(_drop_stale_handles)

from . import elastic  # noqa: E402,F401  (uses the functions above)

__all__ = [n for n in dir() if not n.startswith("_") and n not in (
    "contextlib", "io", "itertools", "pickle", "torch", "Entry")]


# torch.distributed's "loom" backend, where its extension was built (torch 2.1+).
def _register_c10d():
    import importlib.util
    if importlib.util.find_spec(__name__ + "._c10d") is not None:
        from . import distributed  # noqa: F401


_register_c10d()
