"""loom.torch: Horovod's PyTorch API over Loom. A Horovod script runs after
changing `import horovod.torch as hvd` to `import loom.torch as hvd`.

Collectives take CPU tensors of any Loom type (int8, uint8, int32, int64,
float16, bfloat16, float32, float64, bool) and go through the background engine
(see loom/_engine.py): named, negotiated across ranks, small allreduces fused."""
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
    torch.int8: _loom.INT8, torch.uint8: _loom.UINT8, torch.int32: _loom.INT32,
    torch.int64: _loom.INT64, torch.float16: _loom.FLOAT16, torch.bfloat16: _loom.BFLOAT16,
    torch.float32: _loom.FLOAT32, torch.float64: _loom.FLOAT64, torch.bool: _loom.UINT8,
}
_BY_NAME = {str(k): k for k in _DT}


class _TorchBackend(_engine.Backend):
    prefix = "torch"

    def dtype_name(self, t):
        return str(t.dtype)             # "torch.float32"

    def loom_dtype(self, name):
        return _DT[_BY_NAME[name]]

    def esize(self, name):
        return torch.empty((), dtype=_BY_NAME[name]).element_size()

    def empty(self, shape, name):
        return torch.empty(shape, dtype=_BY_NAME[name])

    def zeros(self, shape, name):
        return torch.zeros(shape, dtype=_BY_NAME[name])

    def cap(self, t):
        """A DLPack capsule over t's memory: no copy."""
        t = t.detach()
        if t.dtype == torch.bool:   # DLPack, as torch 1.x speaks it, has no bool
            t = t.view(torch.uint8)
        return torch.utils.dlpack.to_dlpack(t)

    def copy_(self, dst, src):
        dst.copy_(src)

    def scale_(self, t, factor):
        t.mul_(factor)

    def clone(self, t):
        return t.clone()

    def int_vector(self, values):
        return torch.tensor(values, dtype=torch.int32)


_TORCH = _TorchBackend()
_engine.register_backend(_TORCH)


def Entry(*args, **kwargs):
    return _engine.Entry(*args, backend=_TORCH, **kwargs)


def init(comm=None, process_sets=None):
    _basics.init(comm, process_sets)


def add_process_set(process_set):
    return _basics.add_process_set(process_set)


_engine_for = _engine.engine_for


def _check_tensor(tensor, what):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor, got %s" % (what, type(tensor).__name__))
    if tensor.device.type != "cpu":
        raise ValueError("%s: loom.torch takes CPU tensors (this one is on %s)" % (what, tensor.device))
    if tensor.is_sparse:
        raise ValueError("%s: sparse tensors are not supported" % what)
    if tensor.dtype not in _DT:
        raise TypeError("%s: loom has no element type for %s" % (what, tensor.dtype))


def _op_of(op, average, what):
    if average is not None:
        op = Average if average else Sum
    if op is None:
        raise ValueError("%s: Adasum is not implemented by Loom" % what)
    return op


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
    _check_tensor(tensor, "allreduce")
    op = _op_of(Average if op is None else op, average, "allreduce")
    eng = _engine_for(process_set)
    work, finish = _in_place(tensor)
    e = Entry("allreduce", name or eng.auto_name("allreduce"), tensor=work.detach(),
              output=work.detach(), op=op, pre=prescale_factor, post=postscale_factor, finish=finish)
    if finish is None:
        e.finish = lambda r: tensor
    return _enqueue(eng, e)


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
        return synchronize(allreduce_async(tensor, None, name, op, pre, post, process_set))

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, ps = ctx.args
        return (synchronize(allreduce_async(grad.contiguous(), None, None, op, pre, post, ps)),
                None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """A new tensor holding the reduction of tensor over the process set;
    differentiable."""
    op = _op_of(Average if op is None else op, average, "allreduce")
    compressed, ctx = compression.compress(tensor) if compression else (tensor, None)
    out = _AllreduceGrad.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx) if compression else out


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """One handle for a group of in-place allreduces (fused together when they fit)."""
    eng = _engine_for(process_set)
    base = name or eng.auto_name("grouped_allreduce")
    hs = [allreduce_async_(t, average, "%s.%d" % (base, i), op, prescale_factor, postscale_factor,
                           process_set) for i, t in enumerate(tensors)]
    return _group_handle(hs)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    outs = [t.detach().clone(memory_format=torch.contiguous_format) for t in tensors]
    return grouped_allreduce_async_(outs, average, name, op, prescale_factor, postscale_factor,
                                    process_set)


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                               postscale_factor, process_set))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


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


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenation of every rank's tensor along dimension 0 (whose length may
    differ by rank)."""
    return synchronize(allgather_async(tensor, name, process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    _check_tensor(tensor, "broadcast")
    eng = _engine_for(process_set)
    work, finish = _in_place(tensor)
    e = Entry("broadcast", name or eng.auto_name("broadcast"), tensor=work.detach(),
              output=work.detach(), root=int(root_rank), finish=finish)
    if finish is None:
        e.finish = lambda r: tensor
    return _enqueue(eng, e)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    _check_tensor(tensor, "broadcast")
    return broadcast_async_(tensor.detach().clone(memory_format=torch.contiguous_format),
                            root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    _check_tensor(tensor, "alltoall")
    eng = _engine_for(process_set)
    t = tensor.detach().contiguous()
    n = eng.n
    if splits is None:
        if t.shape[0] % n:
            raise ValueError("alltoall: dimension 0 (%d) does not split over %d ranks" % (t.shape[0], n))
        sp = [t.shape[0] // n] * n
    else:
        sp = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
        if len(sp) != n or sum(sp) != t.shape[0] or min(sp) < 0:
            raise ValueError("alltoall: splits %s do not divide %d rows over %d ranks" % (sp, t.shape[0], n))
    e = Entry("alltoall", name or eng.auto_name("alltoall"), tensor=t, splits=sp)
    if splits is None:
        e.finish = lambda r: r[0]
    return _enqueue(eng, e)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Send splits[i] rows of dimension 0 to rank i (equal parts by default);
    returns what arrived, and the received splits when splits is given."""
    return synchronize(alltoall_async(tensor, splits, name, process_set))


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    _check_tensor(tensor, "reducescatter")
    eng = _engine_for(process_set)
    t = tensor.detach().clone(memory_format=torch.contiguous_format)
    if t.dim() == 0:
        raise ValueError("reducescatter: needs at least one dimension")
    return _enqueue(eng, Entry("reducescatter", name or eng.auto_name("reducescatter"), tensor=t,
                               output=t, op=_op_of(op, None, "reducescatter"),
                               pre=prescale_factor, post=postscale_factor))


def reducescatter(tensor, name=None, compression=None, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduce over the ranks, keep this rank's share of dimension 0 (even split,
    the first ranks take one row more)."""
    return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                           postscale_factor))


def barrier(process_set=global_process_set):
    eng = _engine_for(process_set)
    synchronize(_enqueue(eng, Entry("barrier", eng.auto_name("barrier"))))


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
    return _handles[handle][1].event.is_set()


def synchronize(handle):
    """Wait for an asynchronous operation; returns its result."""
    if handle in _groups:
        return [synchronize(h) for h in _groups.pop(handle)]
    try:
        eng, h = _handles.pop(handle)
    except KeyError:
        raise ValueError("synchronize: unknown handle %r" % (handle,)) from None
    return eng.wait(h)


# ---- objects -------------------------------------------------------------------

def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """obj from root_rank, on every rank (pickled)."""
    name = name or type(obj).__name__
    if _basics._set_comm(process_set).rank == root_rank:
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
    if _basics._set_comm(process_set).rank == root_rank:
        return obj
    return torch.load(io.BytesIO(data.numpy().tobytes()), map_location="cpu")


def allgather_object(obj, name=None, process_set=global_process_set):
    """[obj of rank 0, obj of rank 1, ...] on every rank."""
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
    state = broadcast_object(optimizer.state_dict(), root_rank, "optimizer_state", process_set)
    if _basics._set_comm(process_set).rank != root_rank:
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
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=Average, gradient_predivide_factor=1.0, process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [("allreduce.noname.%s" % i, v)
                                for group in self.param_groups for i, v in enumerate(group["params"])]
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
        self._param_names = {v: k for k, v in sorted(named_parameters)}
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
        name = self._param_names.get(p)
        tensor = p.grad
        if tensor is None:
            tensor = p.grad = torch.zeros_like(p)
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
        missing = self._requires_update - set(self._handles.keys())
        for p in sorted(missing, key=lambda q: self._param_names.get(q, "")):
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx, compressed) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx, compressed) in self._handles.items():
            out = synchronize(handle)
            self._allreduce_delay[p] = self.backward_passes_per_step
            if ctx is not None or compressed is not p.grad:
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
    gradients accumulate locally over N backward passes before one allreduce."""
    if op is None:
        raise ValueError("DistributedOptimizer: Adasum is not implemented by Loom")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, process_set)


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
