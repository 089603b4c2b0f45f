"""ringrec for Python: Horovod's API over ringrec's engine.

Every rank is one process started by ``mpirun`` (or ``srun``), as for the ``ringrec``
binary::

    import ringrec
    ringrec.init()
    avg = ringrec.allreduce(np.ones(4, np.float32), name="w")   # averaged over the ranks

The collectives are ringrec's engine (``ringrec::init()`` in Rust): named asynchronous
operations negotiated by a background thread, fused, cached, compressed and traced as the
``RINGREC_*`` variables say, with the binary's deadlines and dead-rank checks. This module
only turns numpy arrays and torch CPU tensors into (address, dtype, shape) for the Rust
extension ``ringrec._ringrec``, which reduces them where they are (the forms that return a
new tensor copy the input once first). An uncaught exception
on one rank prints its traceback and ends the whole job (``MPI_Abort``), so no rank hangs.
"""

import atexit
import sys
import traceback

from . import _ringrec
from ._ringrec import RingrecError

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "Sum", "Average", "Min", "Max", "Compression",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_async", "allgather", "allgather_async", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "synchronize", "poll", "broadcast_parameters",
    "broadcast_optimizer_state", "Handle", "RingrecError",
]

# The reduction operations, Horovod's names (their values are ringrec's wire codes).
Sum = 0
Average = 1
Min = 2
Max = 3
_OPS = {Sum: "Sum", Average: "Average", Min: "Min", Max: "Max"}


class Compression:
    """Horovod's ``hvd.Compression``: how an allreduce's values travel. The engine compresses
    (fp16/bf16 casts, 1-bit with error feedback), as in the binary; ``None`` as an argument
    takes ``RINGREC_COMPRESSION`` (none by default)."""

    none = "none"
    fp16 = "fp16"
    bf16 = "bf16"
    onebit = "1bit"


_hooked = False


def _excepthook(kind, value, tb):
    """An uncaught exception on one rank: its traceback, then the whole job ends."""
    text = "".join(traceback.format_exception(kind, value, tb))
    try:
        who = "ringrec rank %d" % rank()
    except ValueError:
        who = "ringrec"
    _ringrec.abort("%s: uncaught Python exception, ending the job:\n%s" % (who, text.rstrip()), 1)


def init():
    """Starts MPI, the topology and the engine (collective: every rank calls it). Safe to
    call twice. Installs the hook that ends the job on an uncaught exception and the
    ``shutdown()`` at exit."""
    global _hooked
    _ringrec.init()
    if not _hooked:
        _hooked = True
        sys.excepthook = _excepthook
        atexit.register(shutdown)


def shutdown():
    """Stops the engine on every rank and finalises MPI (collective)."""
    _ringrec.shutdown()


def is_initialized():
    """True between ``init()`` and ``shutdown()``."""
    return _ringrec.is_initialized()


def rank():
    """This process's rank in the world."""
    return _ringrec.topology()[0]


def size():
    """The number of ranks."""
    return _ringrec.topology()[1]


def local_rank():
    """This process's rank on its host (``RINGREC_RANKS_PER_HOST`` simulates hosts)."""
    return _ringrec.topology()[2]


def local_size():
    """The number of ranks on this host."""
    return _ringrec.topology()[3]


def cross_rank():
    """This rank's index among the ranks with its local_rank (its host's index)."""
    return _ringrec.topology()[4]


def cross_size():
    """The number of ranks with this local_rank (the number of hosts)."""
    return _ringrec.topology()[5]


# -- tensors ---------------------------------------------------------------------------

_NUMPY_DTYPES = ("float32", "float64", "float16", "int32", "int64", "uint8")


def _torch_module(t):
    mod = type(t).__module__
    return mod == "torch" or mod.startswith("torch.")


class _Tensor:
    """A tensor as the extension takes it: the contiguous object that lends its memory
    (``keep``), handed over as a DLPack capsule (``capsule()``); ``torch`` says what to hand
    results back as, ``copied`` whether ``keep`` is a contiguous copy of the caller's."""

    __slots__ = ("keep", "torch", "copied")

    def capsule(self):
        """A fresh ``__dlpack__()`` capsule of ``keep`` (zero-copy; one per submission); a
        torch CPU tensor's from torch's C export (``__dlpack__`` is microseconds of Python)."""
        if self.torch and self.keep.is_cpu:
            return _to_dlpack(self.keep)
        return self.keep.__dlpack__()


class _DeviceTensor(_Tensor):
    """A tensor in a GPU's memory (DLPack device type kDLCUDA: torch CUDA tensors), lent to
    the engine's device executor (NCCL on the rank's GPU) without a copy."""

    __slots__ = ()

    def capsule(self):
        """A capsule asked for with the executor's stream, which the producer makes wait for
        its pending work on the tensor (DLPack's protocol)."""
        stream = _ringrec.device_stream() if _ringrec.is_initialized() else None
        return self.keep.__dlpack__() if stream is None else self.keep.__dlpack__(stream=stream)


_KDLCUDA = 2


def _device_tensor(t, what, copy, write):
    """A CUDA tensor (torch's, or any object whose ``__dlpack_device__()`` is kDLCUDA) as the
    engine takes it: contiguous, a private copy on its device for the forms that return a
    new tensor. Results come back in place, or (allgather) through DLPack."""
    x = _DeviceTensor()
    x.torch = _torch_module(t)
    if x.torch:
        c = t.detach()
        x.copied = copy or not c.is_contiguous()
        x.keep = c.clone(memory_format=__import__("torch").contiguous_format) if x.copied else c
    else:
        # Another framework's device tensor: it must be contiguous; ``clone()`` copies it.
        x.copied = copy
        x.keep = t.clone() if copy else t
    return x


_TORCH_NAMES = None
# torch.Tensor, torch's DLPack export and contiguous format, once a first call met torch.
_torch_tensor = _to_dlpack = _contiguous = None


def _tensor(t, what="tensor", copy=False, write=False):
    """A numpy array or torch CPU tensor as the engine takes it, without a copy (a
    non-contiguous one is made contiguous first); ``copy``: a private copy, for the forms
    that return a new tensor; ``write``: the engine will write into it."""
    global _TORCH_NAMES, _torch_tensor, _to_dlpack, _contiguous
    x = _Tensor()
    if _torch_module(t):
        import torch
        if _TORCH_NAMES is None:
            import torch.utils.dlpack
            _torch_tensor, _to_dlpack, _contiguous = torch.Tensor, torch.utils.dlpack.to_dlpack, torch.contiguous_format
            _TORCH_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                            torch.bfloat16: "bfloat16", torch.int32: "int32", torch.int64: "int64", torch.uint8: "uint8"}
        if t.dtype not in _TORCH_NAMES:
            raise TypeError("%s has dtype %s: ringrec takes float32, float64, float16, bfloat16, int32, int64 and uint8" % (what, t.dtype))
        if t.is_cuda:
            return _device_tensor(t, what, copy, write)
        c = t.detach()
        x.copied = copy or not c.is_contiguous()
        x.keep = c.clone(memory_format=torch.contiguous_format) if x.copied else c
        x.torch = True
        return x
    np = _numpy()
    if not isinstance(t, np.ndarray):
        if hasattr(t, "__dlpack_device__") and t.__dlpack_device__()[0] == _KDLCUDA:
            return _device_tensor(t, what, copy, write)
        raise TypeError("%s is a %s: ringrec takes numpy arrays and torch tensors" % (what, type(t).__name__))
    if _NUMPY_NAMES.get(t.dtype) is None or not t.dtype.isnative:
        raise TypeError("%s has dtype %s: ringrec takes float32, float64, float16, bfloat16, int32, int64 and uint8" % (what, t.dtype))
    writeable = t.flags.writeable
    if write and not copy and not writeable:
        raise ValueError("%s is read-only: the in-place forms write the result into it" % what)
    # A read-only array is copied: DLPack's capsule cannot say read-only.
    x.copied = copy or not writeable or not t.flags.c_contiguous
    x.keep = t.copy(order="C") if x.copied else t
    x.torch = False
    return x


_NUMPY_NAMES = {}

# numpy.ndarray once a first call imported numpy (``_numpy()``): arrays of exactly this type
# may take the extension's fast path (``_ringrec.allreduce_simple``).
_ndarray = None


def _numpy():
    """numpy, and the dtype -> name table of the dtypes ringrec takes (a dtype's ``.name``
    costs microseconds per call; the table's lookup does not)."""
    global _ndarray
    import numpy as np
    if not _NUMPY_NAMES:
        _NUMPY_NAMES.update({np.dtype(n): n for n in _NUMPY_DTYPES})
        _ndarray = np.ndarray
    return np


def _result(buf, as_torch):
    """A new result (allgather's) as a numpy array or torch tensor viewing the engine's
    memory (no copy); on a GPU, a torch CUDA tensor through DLPack (another framework's
    device tensor: the result object, which that framework's ``from_dlpack`` takes)."""
    if buf.__dlpack_device__()[0] == _KDLCUDA:
        return __import__("torch").from_dlpack(buf) if as_torch else buf
    import numpy as np
    a = np.asarray(buf)
    if not as_torch:
        return a
    import torch
    t = torch.from_numpy(a)
    return t.view(torch.bfloat16) if buf.dtype == "bfloat16" else t


def _into(dst, src):
    """Copies a result into the caller's non-contiguous tensor (the in-place forms)."""
    if _torch_module(dst):
        with __import__("torch").no_grad():
            dst.copy_(src)
    else:
        import numpy as np
        np.copyto(dst, src)
    return dst


class Handle:
    """An operation in flight: ``poll()`` says whether it finished, ``wait()`` returns its
    result (waiting with the GIL released, under the engine's deadlines)."""

    def __init__(self, inner, x, into=None, new=False):
        self._inner, self._x, self._into, self._new, self._done = inner, x, into, new, None

    @property
    def name(self):
        """The tensor's name."""
        return self._inner.name

    def poll(self):
        """True once the result is there."""
        return self._done is not None or self._inner.poll()

    def wait(self):
        """The result (for the in-place forms, the caller's tensor, updated)."""
        if self._done is None:
            buf = self._inner.wait()
            if self._new:
                out = _result(buf, self._x.torch)
            elif self._into is not None and self._x.copied:
                out = _into(self._into, self._x.keep)
            else:
                out = self._into if self._into is not None else self._x.keep
            self._done, self._x = out, None
        return self._done


def _name(kind, name):
    """Horovod's automatic names: ``kind.noname.N``, the same on every rank that makes the
    same calls in the same order (counted by the extension, whose fast path names too)."""
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string, not %r" % (name,))
        return name
    return _ringrec.auto_name(kind)


def _op(op):
    if op not in _OPS:
        raise ValueError("op %r is not one of ringrec.Sum, ringrec.Average, ringrec.Min, ringrec.Max" % (op,))
    return op


def allreduce_async(tensor, name=None, op=Average, compression=None):
    """Starts reducing ``tensor`` over all ranks (``op``: Sum, Average, Min, Max); returns a
    ``Handle`` whose ``wait()`` gives a new tensor with the result."""
    x = _tensor(tensor, copy=True)
    h = _ringrec.allreduce_async(_name("allreduce", name), x.capsule(), _op(op), compression)
    return Handle(h, x)


def allreduce_async_(tensor, name=None, op=Average, compression=None):
    """``allreduce_async`` whose ``wait()`` writes the result into ``tensor``."""
    x = _tensor(tensor, write=True)
    h = _ringrec.allreduce_async(_name("allreduce", name), x.capsule(), _op(op), compression)
    return Handle(h, x, tensor)


# The common blocking calls, on a numpy array or a torch CPU tensor of a dtype ringrec takes,
# are one extension call (``_ringrec.allreduce_simple``); whatever it declines takes the
# general path, whose checks name the problem.


def allreduce(tensor, name=None, op=Average, compression=None):
    """The reduction of ``tensor`` over all ranks, a new tensor (Horovod's ``allreduce``)."""
    kind = type(tensor)
    if kind is _ndarray:
        y = tensor.copy()
        if _ringrec.allreduce_simple(y, name, op, compression):
            return y
    elif kind is _torch_tensor and tensor.is_cpu and tensor.dtype in _TORCH_NAMES:
        y = tensor.detach().clone(memory_format=_contiguous)
        if _ringrec.allreduce_simple(_to_dlpack(y), name, op, compression):
            return y
    x = _tensor(tensor, copy=True)
    _ringrec.allreduce(_name("allreduce", name), x.capsule(), _op(op), compression)
    return x.keep


def allreduce_(tensor, name=None, op=Average, compression=None):
    """Reduces ``tensor`` over all ranks in place; returns it."""
    kind = type(tensor)
    if kind is _ndarray:
        if _ringrec.allreduce_simple(tensor, name, op, compression):
            return tensor
    elif kind is _torch_tensor and tensor.is_cpu and tensor.dtype in _TORCH_NAMES:
        if _ringrec.allreduce_simple(_to_dlpack(tensor), name, op, compression):
            return tensor
    x = _tensor(tensor, write=True)
    _ringrec.allreduce(_name("allreduce", name), x.capsule(), _op(op), compression)
    return _into(tensor, x.keep) if x.copied else tensor


def grouped_allreduce_async(tensors, name=None, op=Average):
    """Starts reducing ``tensors`` together, in one engine cycle; one ``Handle`` each."""
    base = _name("grouped_allreduce", name)
    xs = [_tensor(t, "tensor %d" % i, copy=True) for i, t in enumerate(tensors)]
    hs = _ringrec.grouped_allreduce_async([("%s.%d" % (base, i), x.capsule()) for i, x in enumerate(xs)], _op(op))
    return [Handle(h, x) for h, x in zip(hs, xs)]


def grouped_allreduce(tensors, name=None, op=Average):
    """The reductions of ``tensors``, reduced together; a list of new tensors."""
    return [h.wait() for h in grouped_allreduce_async(tensors, name, op)]


def allgather_async(tensor, name=None):
    """Starts concatenating every rank's ``tensor`` along the first dimension (its length may
    differ between ranks), in rank order."""
    x = _tensor(tensor)
    return Handle(_ringrec.allgather_async(_name("allgather", name), x.capsule()), x, new=True)


def allgather(tensor, name=None):
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order."""
    return allgather_async(tensor, name).wait()


def broadcast_async(tensor, root_rank, name=None):
    """Starts sending rank ``root_rank``'s ``tensor`` to every rank."""
    x = _tensor(tensor, copy=True)
    return Handle(_ringrec.broadcast_async(_name("broadcast", name), x.capsule(), root_rank), x)


def broadcast_async_(tensor, root_rank, name=None):
    """``broadcast_async`` whose ``wait()`` writes the result into ``tensor``."""
    x = _tensor(tensor, write=True)
    return Handle(_ringrec.broadcast_async(_name("broadcast", name), x.capsule(), root_rank), x, tensor)


def broadcast(tensor, root_rank, name=None):
    """Rank ``root_rank``'s ``tensor``, a new tensor on every rank."""
    return broadcast_async(tensor, root_rank, name).wait()


def broadcast_(tensor, root_rank, name=None):
    """Overwrites ``tensor`` with rank ``root_rank``'s; returns it."""
    return broadcast_async_(tensor, root_rank, name).wait()


def synchronize(handle):
    """Horovod's ``synchronize(handle)``: ``handle.wait()``."""
    return handle.wait()


def poll(handle):
    """Horovod's ``poll(handle)``: ``handle.poll()``."""
    return handle.poll()


def broadcast_parameters(params, root_rank):
    """Overwrites every parameter with rank ``root_rank``'s, in place. ``params`` is a
    ``state_dict()``, ``named_parameters()`` or a list of (name, tensor); all are submitted
    at once, so the engine fuses them."""
    items = sorted(params.items()) if isinstance(params, dict) else list(params)
    seen = set()
    for name, _ in items:
        if name in seen:
            raise ValueError("parameter name %r appears twice; broadcast_parameters needs unique names" % (name,))
        seen.add(name)
    handles = [broadcast_async_(p, root_rank, name="broadcast_parameters." + name) for name, p in items]
    for h in handles:
        h.wait()


def broadcast_optimizer_state(optimizer, root_rank, prefix="broadcast_optimizer_state"):
    """Overwrites a torch optimizer's state (moments, step counts) and hyper-parameters with
    rank ``root_rank``'s (Horovod's: a rank without state yet makes it with one zero-gradient
    step of the wrapped optimizer first)."""
    import torch
    if len(optimizer.state_dict()["state"]) == 0:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
        step = getattr(optimizer, "_ringrec_inner_step", optimizer.step)
        step()
    state = optimizer.state_dict()
    tensors, scalars = [], []
    for pid, st in sorted(state["state"].items()):
        for key, value in sorted(st.items()):
            name = "%s.state.%s.%s" % (prefix, pid, key)
            (tensors if torch.is_tensor(value) else scalars).append((name, st, key, value))
    for gi, group in enumerate(state["param_groups"]):
        for key, value in sorted(group.items()):
            if key != "params" and isinstance(value, (int, float)) and not isinstance(value, bool):
                scalars.append(("%s.group.%d.%s" % (prefix, gi, key), group, key, value))
    handles = [broadcast_async_(v, root_rank, name=n) for n, _, _, v in tensors]
    import numpy as np
    sh = [broadcast_async(np.array([float(v)]), root_rank, name=n) for n, _, _, v in scalars]
    for h in handles:
        h.wait()
    for (_, holder, key, old), h in zip(scalars, sh):
        v = float(h.wait()[0])
        holder[key] = int(v) if isinstance(old, int) else v
    optimizer.load_state_dict(state)
