"""ringrec for PyTorch: Horovod's ``horovod.torch`` over ringrec's engine.

``import ringrec.torch as hvd`` gives the whole core API (``hvd.init()``, ``hvd.rank()``,
``hvd.allreduce``, ``hvd.broadcast_parameters``, ...) and ``DistributedOptimizer``::

    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loss.backward(); opt.step()

``HostEmbedding`` (issue 32, point 4) is not built yet.
"""

import contextlib

import torch

from . import *  # noqa: F401,F403 -- Horovod's horovod.torch holds the core API too
from . import Average, Compression, __all__ as _core_all, allreduce_async_  # noqa: F401

__all__ = list(_core_all) + ["DistributedOptimizer"]


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods mixed into the user's optimizer class (Horovod's construction)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op):
        super(self.__class__, self).__init__(params)
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [("allreduce.noname.%d" % i, p)
                                for i, p in enumerate(p for g in self.param_groups for p in g["params"])]
        if any(not isinstance(n, tuple) or len(n) != 2 for n in named_parameters):
            raise ValueError("named_parameters must be a sequence of (name, parameter) pairs, as model.named_parameters() gives")
        names = [n for n, _ in named_parameters]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ValueError("named_parameters should not contain duplicate names: %s" % ", ".join(dups))
        all_params = {id(p) for g in self.param_groups for p in g["params"]}
        named = {id(p) for _, p in named_parameters}
        missing = all_params - named
        if named_parameters and missing:
            raise ValueError("named_parameters was given, but %d of the optimizer's parameters are not in it" % len(missing))
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1, not %r" % (backward_passes_per_step,))
        self._names = {id(p): n for n, p in named_parameters}
        self._compression = compression
        self._op = op
        self._passes = backward_passes_per_step
        self._delay = {}
        self._handles = {}
        self._requires_update = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        self._synchronized = False
        self._skip_synchronize = False
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook) for p in self._requires_update]
        for p in self._requires_update:
            self._delay[id(p)] = self._passes

    def _submit(self, p):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        # Reduced in place, without a copy: backward does not touch this gradient again
        # before step() waits for it.
        self._handles[id(p)] = (p, allreduce_async_(p.grad, name=self._names[id(p)], op=self._op,
                                                    compression=self._compression))

    def _hook(self, p):
        if id(p) in self._handles:
            raise RuntimeError(
                "gradient of %r computed twice before step(): call optimizer.synchronize() between backward "
                "passes, or pass backward_passes_per_step" % self._names[id(p)])
        self._delay[id(p)] -= 1
        if self._delay[id(p)] == 0:
            self._submit(p)

    def synchronize(self):
        """Waits for every gradient's allreduce (submitting those backward did not produce);
        the averages are then in ``p.grad``."""
        for p in self._requires_update:
            if id(p) not in self._handles:
                self._submit(p)
        for p, h in list(self._handles.values()):
            h.wait()
            self._delay[id(p)] = self._passes
        self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside, ``step()`` does not synchronize (call ``synchronize()`` yourself first)."""
        self._skip_synchronize = True
        try:
            yield
        finally:
            self._skip_synchronize = False

    def step(self, closure=None):
        """Waits for the gradients' allreduces, then the wrapped optimizer's step."""
        if not self._skip_synchronize and not self._synchronized:
            self.synchronize()
        self._synchronized = False
        return self._ringrec_inner_step(closure)

    def _ringrec_inner_step(self, closure=None):
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        """The wrapped optimizer's ``zero_grad``; refused while allreduces are in flight."""
        if self._handles:
            raise RuntimeError("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
                               "or optimizer.synchronize(): the gradients are still being reduced")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, backward_passes_per_step=1, op=Average):
    """Horovod's ``DistributedOptimizer``: wraps ``optimizer`` so that each gradient goes to
    the engine (allreduce, ``op`` Average by default) as backward produces it — fused,
    cached, compressed (``compression``, else ``RINGREC_COMPRESSION``) and traced by the
    engine — and ``step()`` waits for them before the wrapped step."""
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op)
