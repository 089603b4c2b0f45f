"""ringrec for PyTorch: Horovod's ``horovod.torch`` over ringrec's engine.

``import ringrec.torch as hvd`` gives the whole core API (``hvd.init()``, ``hvd.rank()``,
``hvd.allreduce``, ``hvd.broadcast_parameters``, ...) and ``DistributedOptimizer``::

    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loss.backward(); opt.step()

``HostEmbedding`` is an ``nn.Module`` over ringrec's host-shared embedding table (one copy
per host), trained by ``SparseOptimizer`` or by ``DistributedOptimizer(..., sparse=model)``::

    emb = hvd.HostEmbedding(embedding_dim=16, lr=0.05, sparse_normalize="frequency")
    opt = hvd.DistributedOptimizer(torch.optim.SGD(dense.parameters(), lr=0.1),
                                   named_parameters=dense.named_parameters(), sparse=emb)
"""

import contextlib
import itertools

import torch
import torch.nn.functional as F

from . import *  # noqa: F401,F403 -- Horovod's horovod.torch holds the core API too
from . import Average, Compression, __all__ as _core_all, _ringrec, allreduce_async_  # noqa: F401

__all__ = list(_core_all) + ["DistributedOptimizer", "HostEmbedding", "SparseOptimizer"]


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods mixed into the user's optimizer class (Horovod's construction)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op, sparse):
        super(self.__class__, self).__init__(params)
        self._sparse = _host_embeddings(sparse)
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
        """The host embeddings' sparse steps (while the dense gradients are reduced), then
        waits for the gradients' allreduces and runs the wrapped optimizer's step."""
        for m in self._sparse:
            m.sparse_step()
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


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, backward_passes_per_step=1, op=Average,
                         sparse=None):
    """Horovod's ``DistributedOptimizer``: wraps ``optimizer`` so that each gradient goes to
    the engine (allreduce, ``op`` Average by default) as backward produces it — fused,
    cached, compressed (``compression``, else ``RINGREC_COMPRESSION``) and traced by the
    engine — and ``step()`` waits for them before the wrapped step. ``sparse`` (a
    ``HostEmbedding``, a list of them, or a model holding them) adds their sparse steps to
    ``step()``, run first, while the dense gradients are being reduced."""
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op, sparse)


def _host_embeddings(sparse):
    """The ``HostEmbedding`` modules named by ``sparse``: one, a list, or a module holding them."""
    if sparse is None:
        return []
    if isinstance(sparse, HostEmbedding):
        return [sparse]
    if isinstance(sparse, torch.nn.Module):
        found = [m for m in sparse.modules() if isinstance(m, HostEmbedding)]
        if not found:
            raise ValueError("sparse=%s holds no HostEmbedding" % type(sparse).__name__)
        return found
    found = list(sparse)
    bad = [type(m).__name__ for m in found if not isinstance(m, HostEmbedding)]
    if bad:
        raise TypeError("sparse takes HostEmbedding modules (or a model holding them), not %s" % ", ".join(bad))
    return found


# Keyword arguments that are not a flag's name: `lr` is `--sparse-lr`.
_LR_ALIAS = {"lr": "sparse_lr"}

# The default names of HostEmbeddings, in the order a process builds them (Horovod's
# auto-names): every rank agrees when it builds its modules in the same order.
_AUTO_NAMES = itertools.count()


class HostEmbedding(torch.nn.Module):
    """An embedding table held once per host in shared memory: ringrec's host table, as
    ``ringrec train`` runs it (``EmbeddingStage``). Keys are any int64 ids >= 0 (a hashed
    table, not an index range); a key seen for the first time reads its deterministic
    initial row (uniform in +-``table_init_scale``, 1/sqrt(dim) by default, from ``seed``).

    ``forward(input)`` returns the rows of an int64 tensor of any shape (shape + (dim,)),
    ``forward(input, offsets)`` (or a 2-D ``input`` with ``mode``) pools them as
    ``nn.EmbeddingBag`` does (``mode`` "sum" or "mean"). Backward leaves each distinct key's
    gradient (torch's embedding backward sums a key's rows); the sparse step
    (``sparse_step()``, ``SparseOptimizer`` or ``DistributedOptimizer(sparse=...)``), which
    every rank runs once per step, exchanges them between the ranks, divides each key's sum
    as ``sparse_normalize`` says (``frequency``: by the ranks whose batch held the key;
    ``world``: by the ranks, as DDP averages; ``none``: the plain sum) and lets the host
    leader apply them with the table's optimizer (``sparse_optimizer``: sgd or adagrad, at
    ``lr``), then the host barrier.

    Keyword arguments are ``ringrec train``'s flags, named with ``_``: ``table_capacity``,
    ``table_max_bytes``, ``evict``, ``expire_after_steps``, ``admit_after``,
    ``admit_sketch_mib``, ``table_dtype``, ``table_init_scale``, ``seed``,
    ``sparse_optimizer``, ``sparse_normalize``, ``sparse_exchange``, ``sparse_compression``,
    ``onebit_lambda``, ``nan_policy``, and ``lr`` (``--sparse-lr``). ``num_embeddings``, when
    given, bounds the keys (< num_embeddings) and sizes the table to hold them all without
    growing. Construction is collective over the world.

    A process may hold several (a table per feature, each of its own size and dim), each
    with its own shared memory, exchange and checkpoint. ``name`` tells them apart; by
    default ``HostEmbedding.<n>``, ``n`` counting the tables this process built, so ranks
    that build their modules in the same order agree. A name open in this process already
    is a ``ValueError``; ranks that open different names or dims at the same point get an
    error saying what each rank opened. Together they share the shared-memory directory's
    free space: at each open, the tables open then without a ``table_max_bytes`` share what
    is left, by their files' sizes (an earlier table's largest size may go down, never
    below its file); sizes given that cannot fit are a ``ValueError`` naming them.
    """

    def __init__(self, num_embeddings=None, embedding_dim=None, mode=None, name=None, _saved=None, **settings):
        super().__init__()
        if embedding_dim is None:
            raise TypeError("HostEmbedding() needs embedding_dim")
        if mode not in (None, "sum", "mean"):
            raise ValueError("HostEmbedding mode must be None (rows), 'sum' or 'mean' (pooled bags), not %r" % (mode,))
        if num_embeddings is not None:
            if int(num_embeddings) < 1:
                raise ValueError("num_embeddings must be positive, got %r" % (num_embeddings,))
            # Rows fit below the 70% load at which a table grows.
            settings.setdefault("table_capacity", -(-int(num_embeddings) * 10 // 7))
        pairs = []
        for k, v in settings.items():
            if v is None:
                continue
            if isinstance(v, bool):
                v = str(v).lower()
            pairs.append((_LR_ALIAS.get(k, k), str(v)))
        self.num_embeddings = num_embeddings
        self.embedding_dim = int(embedding_dim)
        self.mode = mode
        self.name = "HostEmbedding.%d" % next(_AUTO_NAMES) if name is None else str(name)
        self._table = _ringrec.HostTable(self.embedding_dim, pairs, self.name, _saved)
        self._pending = []

    @classmethod
    def load(cls, path, **settings):
        """A HostEmbedding holding the table saved at ``path`` (``save``), opened with its
        saved shape (dim, capacity, storage dtype, optimizer, seed, initial scale);
        ``settings`` (``name`` included) as for the constructor (collective)."""
        dim, capacity, dtype, optimizer, seed, scale = _ringrec.saved_table_shape(str(path))
        for k, v in (("table_capacity", capacity), ("table_dtype", dtype), ("sparse_optimizer", optimizer),
                     ("seed", seed), ("table_init_scale", scale)):
            settings.setdefault(k, v)
        return cls(embedding_dim=dim, _saved=str(path), **settings)

    def save(self, path):
        """Writes the table to ``path`` (collective; rank 0 writes) in ringrec's table format,
        with the checksums every open verifies: ``HostEmbedding.load`` or ``ringrec train
        --resume``'s table. Call it between steps."""
        self._table.save(str(path))

    def close(self):
        """Releases this rank's table (collective). Later use raises."""
        self._pending = []
        self._table.close()

    def size(self):
        """(slots, live rows, the largest size it may grow to in bytes)."""
        return self._table.size()

    def set_lr(self, lr):
        """The learning rate of the table's optimizer from the next sparse step on."""
        self._table.set_lr(float(lr))

    def _keys(self, input, what):
        if not isinstance(input, torch.Tensor):
            raise TypeError("HostEmbedding %s must be a torch tensor of int64 keys, not %s" % (what, type(input).__name__))
        if input.dtype != torch.int64:
            raise TypeError("HostEmbedding %s must be int64 keys, got %s" % (what, input.dtype))
        if input.device.type != "cpu":
            raise TypeError("HostEmbedding %s must be on the CPU, not %s" % (what, input.device))
        flat = input.reshape(-1).contiguous()
        if flat.numel():
            if int(flat.min()) < 0:
                raise ValueError("HostEmbedding %s hold a negative key (%d): keys are ids >= 0" % (what, int(flat.min())))
            if self.num_embeddings is not None and int(flat.max()) >= self.num_embeddings:
                raise IndexError("HostEmbedding %s hold key %d, not below num_embeddings %d"
                                 % (what, int(flat.max()), self.num_embeddings))
        return flat

    def _dedupe(self, flat):
        """(distinct keys in key order, each key's place among them) from ringrec's deduper."""
        n = flat.numel()
        unique = torch.empty(n, dtype=torch.int64)
        places = torch.empty(n, dtype=torch.int64)
        u = self._table.dedupe(flat.data_ptr(), n, unique.data_ptr(), places.data_ptr())
        return unique[:u], places

    def forward(self, input, offsets=None):
        flat = self._keys(input, "input")
        if offsets is not None:
            if self.mode is None:
                raise ValueError("HostEmbedding got offsets: pooled bags need mode='sum' or 'mean'")
            if input.dim() != 1:
                raise ValueError("HostEmbedding input with offsets must be 1-D, got shape %s" % (tuple(input.shape),))
            if not isinstance(offsets, torch.Tensor) or offsets.dtype != torch.int64 or offsets.dim() != 1:
                raise TypeError("HostEmbedding offsets must be a 1-D int64 tensor")
        elif self.mode is not None and input.dim() != 2:
            raise ValueError("HostEmbedding(mode=%r) pools the rows of a 2-D input (bags of equal length) or takes "
                             "offsets; got shape %s" % (self.mode, tuple(input.shape)))
        unique, places = self._dedupe(flat)
        u = unique.numel()
        rows = torch.empty(u, self.embedding_dim, dtype=torch.float32)
        self._table.lookup(unique.data_ptr(), u, rows.data_ptr())
        if torch.is_grad_enabled() and self.training:
            rows.requires_grad_(True)
            self._pending.append((unique, rows))
        if self.mode is None:
            return F.embedding(places.view(input.shape), rows)
        return F.embedding_bag(places.view(input.shape), rows, offsets, mode=self.mode)

    def sparse_step(self):
        """This rank's part of the sparse step (collective): the distinct keys of the forward
        passes since the last step and their gradients (zero where backward left none) are
        exchanged, normalised and applied by the host leader; then the host barrier."""
        step_bytes, moved = self._exchange()
        # The step's tensors went with `_exchange`'s frame: the memory they leave goes back
        # to the system (large steps).
        self._table.release_after_step(step_bytes)
        return moved

    def _exchange(self):
        """The sparse step's exchange: (its gradient bytes, (bytes sent, bytes received))."""
        pending, self._pending = self._pending, []
        grads = [(k, r.grad if r.grad is not None else torch.zeros_like(r)) for k, r in pending]
        if not grads:
            keys, g = torch.empty(0, dtype=torch.int64), torch.empty(0, self.embedding_dim)
        elif len(grads) == 1:
            keys, g = grads[0]
        else:  # several forward passes: one gradient per distinct key
            keys, places = self._dedupe(torch.cat([k for k, _ in grads]))
            g = torch.zeros(keys.numel(), self.embedding_dim).index_add_(0, places, torch.cat([x for _, x in grads]))
        keys, g = keys.contiguous(), g.detach().to(torch.float32).contiguous()
        return g.numel() * 4, self._table.exchange_and_apply(keys.data_ptr(), keys.numel(), g.data_ptr())

    def extra_repr(self):
        return "name=%r, num_embeddings=%s, embedding_dim=%d, mode=%s" % (self.name, self.num_embeddings, self.embedding_dim,
                                                                           self.mode)


class SparseOptimizer:
    """Runs the sparse step of ``HostEmbedding`` modules (one, a list, or a model holding
    them): ``step()`` exchanges and applies their gradients; ``lr`` (when given) replaces
    each table's learning rate."""

    def __init__(self, modules, lr=None):
        self.modules = _host_embeddings(modules)
        if lr is not None:
            for m in self.modules:
                m.set_lr(lr)

    def zero_grad(self, set_to_none=True):
        """Nothing to clear: each forward pass's rows are fresh tensors."""

    def step(self):
        """Every module's sparse step (collective)."""
        for m in self.modules:
            m.sparse_step()
