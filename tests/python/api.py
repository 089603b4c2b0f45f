"""The ringrec Python module's API under mpirun (tests/python.rs runs it at 1, 2 and 4
ranks, 4 as 2 simulated hosts): topology, every collective against numpy, torch tensors,
and the bad arguments' exceptions. Prints `api ok rank R` at the end."""

import os

import numpy as np

import ringrec

ringrec.init()
r, n = ringrec.rank(), ringrec.size()
per_host = int(os.environ.get("RINGREC_RANKS_PER_HOST", "0")) or n


def check(cond, what):
    if not cond:
        raise AssertionError("rank %d: %s" % (r, what))


# Topology as Horovod defines it, with simulated hosts of per_host ranks.
check(n == int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")), "size")
check(r == int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")), "rank")
check((ringrec.local_rank(), ringrec.local_size()) == (r % per_host, per_host), "local_rank/local_size")
check((ringrec.cross_rank(), ringrec.cross_size()) == (r // per_host, n // per_host), "cross_rank/cross_size")
ringrec.init()  # a second init is a no-op, as Horovod's


def raises(kind, words, f):
    try:
        f()
    except kind as e:
        check(all(w in str(e) for w in words), "%s names %s: %s" % (kind.__name__, words, e))
        return
    raise AssertionError("rank %d: no %s for %s" % (r, kind.__name__, words))


def data(rank, dtype, shape, seed):
    g = np.random.default_rng(seed * 1000 + rank)
    if np.issubdtype(dtype, np.integer):
        return g.integers(-1000, 1000, size=shape).astype(dtype)
    return g.standard_normal(shape).astype(dtype)


# allreduce: every op and dtype against numpy over every rank's data.
ops = {ringrec.Sum: lambda a: a.sum(0), ringrec.Min: lambda a: a.min(0), ringrec.Max: lambda a: a.max(0),
       ringrec.Average: lambda a: a.sum(0) / n}
seed = 0
for dtype in (np.float32, np.float64, np.int32, np.int64, np.float16):
    for shape in ((5,), (3, 4), (2, 3, 1000)):
        for op, ref in ops.items():
            seed += 1
            mine = data(r, dtype, shape, seed)
            every = np.stack([data(q, dtype, shape, seed) for q in range(n)]).astype(np.float64)
            got = ringrec.allreduce(mine, name="ar.%d" % seed, op=op)
            want = ref(every)
            if np.issubdtype(dtype, np.integer) and op == ringrec.Average:
                want = np.trunc(want)
            check(got.dtype == dtype and got.shape == shape, "allreduce %s %s keeps dtype and shape" % (dtype, shape))
            tol = 2e-2 if dtype == np.float16 else 1e-5
            check(np.allclose(got.astype(np.float64), want, rtol=tol, atol=tol), "allreduce %s %s op %d" % (dtype, shape, op))
            check(np.array_equal(mine, data(r, dtype, shape, seed)), "allreduce leaves its input alone")
# Automatic names, non-contiguous input, and the in-place form.
x = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2] * (r + 1)
check(np.allclose(ringrec.allreduce(x, op=ringrec.Sum), np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2] * n * (n + 1) / 2), "non-contiguous allreduce")
y = np.full(7, r, np.float64)
check(ringrec.allreduce_(y, name="inplace") is y and np.allclose(y, (n - 1) / 2), "allreduce_ in place")
# The extension's fast path (a contiguous numpy array) and the general path count automatic
# names together: the blocking call takes the name after the async call's, not the same.
h = ringrec.allreduce_async(np.ones(2, np.float32), op=ringrec.Sum)
k = int(h.name.rsplit(".", 1)[1])
check(np.allclose(ringrec.allreduce(np.ones(3, np.float32), op=ringrec.Sum), n) and np.allclose(h.wait(), n), "fast path beside an async call")
check(ringrec._name("allreduce", None) == "allreduce.noname.%d" % (k + 2), "automatic names counted once for both paths")
z = np.arange(12, dtype=np.float32).reshape(3, 4) * (r + 1)
ringrec.allreduce_(z[:, ::2], name="inplace.strided", op=ringrec.Sum)
want = np.arange(12, dtype=np.float32).reshape(3, 4)
check(np.allclose(z[:, ::2], want[:, ::2] * n * (n + 1) / 2) and np.allclose(z[:, 1::2], want[:, 1::2] * (r + 1)), "strided allreduce_ writes back its columns only")
# async handles: poll until done, then wait; many in flight at once (fused by the engine).
hs = [ringrec.allreduce_async(np.full(100, r + i, np.float32), name="async.%d" % i, op=ringrec.Sum) for i in range(20)]
while not all(h.poll() for h in hs):
    pass
for i, h in enumerate(hs):
    check(np.allclose(h.wait(), n * i + n * (n - 1) / 2), "async allreduce %d" % i)
    check(ringrec.synchronize(h) is h.wait(), "synchronize is wait")
# Compression: fp16 in the engine, close to the exact average.
c = ringrec.allreduce(data(r, np.float32, (1000,), 99), name="fp16", compression=ringrec.Compression.fp16)
check(np.allclose(c, np.mean([data(q, np.float32, (1000,), 99) for q in range(n)], 0), atol=1e-2), "fp16 compression")
# grouped allreduce
g = ringrec.grouped_allreduce([np.full(3, r, np.float32), np.full((2, 2), 2 * r, np.int64)], name="group", op=ringrec.Sum)
check(np.allclose(g[0], n * (n - 1) / 2) and g[1].dtype == np.int64 and (g[1] == n * (n - 1)).all(), "grouped allreduce")
# allgather: first dimensions differ by rank.
ga = ringrec.allgather(np.full((r + 1, 2), r, np.int32), name="gather")
check(ga.shape == (n * (n + 1) // 2, 2) and (ga[:, 0] == np.repeat(np.arange(n), np.arange(1, n + 1))).all(), "allgather")
# broadcast and broadcast_parameters from the last rank.
root = n - 1
check((ringrec.broadcast(np.full(5, r, np.float32), root, name="bc") == root).all(), "broadcast")
params = {"w": np.full((2, 3), float(r)), "b": np.full(4, r, np.int32)}
ringrec.broadcast_parameters(params, root_rank=root)
check((params["w"] == root).all() and (params["b"] == root).all(), "broadcast_parameters")
# Empty tensors (Horovod's no-ops): every collective, the fast path and the general one; an
# allgather where some ranks give no rows returns the others'.
e = ringrec.allreduce(np.zeros((0, 3), np.float32), name="empty.ar", op=ringrec.Sum)
check(e.shape == (0, 3) and e.dtype == np.float32, "empty allreduce")
check(ringrec.allreduce_(np.zeros(0, np.int64), name="empty.ar_").shape == (0,), "empty allreduce_")
check(ringrec.allreduce_async(np.zeros(0, np.float64), name="empty.async").wait().shape == (0,), "empty allreduce_async")
eg = ringrec.grouped_allreduce([np.zeros(0, np.float32), np.full(2, r, np.float32)], name="empty.group", op=ringrec.Sum)
check(eg[0].shape == (0,) and np.allclose(eg[1], n * (n - 1) / 2), "grouped allreduce with an empty tensor")
check(ringrec.broadcast(np.zeros((0, 2), np.int32), root, name="empty.bc").shape == (0, 2), "empty broadcast")
odd = np.full((r % 2, 2), r, np.int32)  # even ranks give no rows
eo = ringrec.allgather(odd, name="empty.gather")
check(eo.shape == (n // 2, 2) and (eo[:, 0] == np.arange(1, n, 2)).all(), "allgather with ranks of no rows")
check(ringrec.allgather(np.zeros((0, 4), np.float32), name="empty.gather.all").shape == (0, 4), "allgather of no rows anywhere")

# torch CPU tensors, when torch is there.
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    import ringrec.torch as hvd
    ti = torch.full((5,), float(r))
    check(hvd.allreduce_(ti, name="torch.inplace", op=hvd.Sum) is ti and bool((ti == n * (n - 1) / 2).all()), "torch allreduce_ in place")
    t = hvd.allreduce(torch.full((3, 2), float(r + 1)), name="torch.avg")
    check(torch.is_tensor(t) and t.shape == (3, 2) and torch.allclose(t, torch.full((3, 2), (n + 1) / 2)), "torch allreduce")
    b = hvd.allreduce(torch.full((4,), float(r), dtype=torch.bfloat16), name="torch.bf16", op=hvd.Sum)
    check(b.dtype == torch.bfloat16 and bool((b == n * (n - 1) / 2).all()), "torch bfloat16 allreduce")
    te = torch.zeros((0, 2))
    check(hvd.allreduce(te, name="torch.empty").shape == (0, 2) and hvd.allreduce_(te, name="torch.empty_") is te, "torch empty allreduce")
    check(hvd.broadcast(torch.zeros(0, dtype=torch.int64), 0, name="torch.empty.bc").shape == (0,), "torch empty broadcast")
    tg = hvd.allgather(torch.full((r % 2, 3), float(r)), name="torch.empty.gather")
    check(tg.shape == (n // 2, 3) and bool((tg[:, 0] == torch.arange(1, n, 2, dtype=torch.float32)).all()), "torch allgather with ranks of no rows")
    # DLPack, zero-copy: the engine works in the tensor's own storage, so a view taken
    # before the call sees the result and the storage has not moved.
    tz = torch.full((2, 3), float(r + 1))
    view, ptr = tz[1], tz.data_ptr()
    hvd.allreduce_(tz, name="torch.dlpack", op=hvd.Sum)
    check(tz.data_ptr() == ptr and bool((view == n * (n + 1) / 2).all()), "torch allreduce_ in the tensor's storage (DLPack)")
    ts = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (r + 1)
    tv = ts[:, ::2]
    check(hvd.allreduce_(tv, name="torch.strided", op=hvd.Sum) is tv and bool((tv == torch.arange(12.).reshape(3, 4)[:, ::2] * n * (n + 1) / 2).all()), "torch allreduce_ of a non-contiguous view")
    tc = torch.full((4,), float(r))
    ringrec._ringrec.allreduce("torch.capsule", tc.__dlpack__(), ringrec.Sum)
    check(bool((tc == n * (n - 1) / 2).all()), "a torch tensor's __dlpack__ capsule reduced in place by the extension")
    if torch.cuda.is_available():
        raises(TypeError, ["cuda"], lambda: hvd.allreduce(torch.ones(2, device="cuda"), name="torch.cuda"))
    m = torch.nn.Linear(3, 2)
    with torch.no_grad():
        m.weight.fill_(r)
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    check(bool((m.weight == 0).all()), "torch broadcast_parameters")
    opt = torch.optim.Adam(m.parameters(), lr=0.1 * (r + 1))
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    check(opt.param_groups[0]["lr"] == 0.1 and len(opt.state_dict()["state"]) == 2, "broadcast_optimizer_state")


# Bad arguments: Python exceptions that name the problem.
raises(TypeError, ["complex64"], lambda: ringrec.allreduce(np.zeros(3, np.complex64)))
raises(TypeError, ["list"], lambda: ringrec.allreduce([1.0, 2.0]))
raises(ValueError, ["op"], lambda: ringrec.allreduce(np.zeros(3, np.float32), op=7))
raises(ValueError, ["uint8", "cannot be reduced"], lambda: ringrec.allreduce(np.zeros(3, np.uint8), name="u8"))
raises(ValueError, ["compression"], lambda: ringrec.allreduce(np.zeros(3, np.float32), compression="zip"))
ro = np.zeros(3, np.float32)
ro.flags.writeable = False
raises(ValueError, ["read-only"], lambda: ringrec.allreduce_(ro))
# A DLPack capsule is taken once (the extension renames it used_dltensor); anything else
# is refused before it reaches the engine. A numpy array's capsule is reduced in place.
nz = np.full(3, float(r), np.float32)
cap = nz.__dlpack__()
ringrec._ringrec.allreduce("dlpack.once", cap, ringrec.Sum)
check(np.allclose(nz, n * (n - 1) / 2), "a numpy array's __dlpack__ capsule reduced in place by the extension")
raises(TypeError, ["DLPack", "dltensor"], lambda: ringrec._ringrec.allreduce("dlpack.twice", cap, ringrec.Sum))
raises(TypeError, ["DLPack"], lambda: ringrec._ringrec.allreduce("dlpack.object", object(), ringrec.Sum))
raises(ValueError, ["appears twice"], lambda: ringrec.broadcast_parameters([("a", np.zeros(1)), ("a", np.zeros(1))], 0))
raises(ValueError, ["root", "not a rank"], lambda: ringrec.broadcast(np.zeros(1), n, name="badroot"))
if n > 1:
    # A name reused while in flight: the second submission fails, the first completes. Rank
    # 0 submits it twice while the others have not submitted it yet (they wait in 'order').
    if r == 0:
        h1 = ringrec.allreduce_async(np.ones(2, np.float32), name="twice", op=ringrec.Sum)
        raises(ValueError, ["twice", "already in flight"], lambda: ringrec.allreduce(np.ones(2, np.float32), name="twice"))
        ringrec.allreduce(np.ones(1, np.float32), name="order")
    else:
        ringrec.allreduce(np.ones(1, np.float32), name="order")
        h1 = ringrec.allreduce_async(np.ones(2, np.float32), name="twice", op=ringrec.Sum)
    check(np.allclose(h1.wait(), n), "the first 'twice' completes")
    raises(ValueError, ["already waited"], lambda: h1._inner.wait())
    # Shapes (or dtypes) that differ across ranks: every rank gets an error naming the tensor.
    raises(ValueError, ["'shape'", "differently"], lambda: ringrec.allreduce(np.zeros(3 + r, np.float32), name="shape"))
    raises(ValueError, ["'dtype'", "differently"], lambda: ringrec.allreduce(np.zeros(3, np.float32 if r else np.float64), name="dtype"))
# The engine still works after the errors.
check(np.allclose(ringrec.allreduce(np.ones(3, np.float32), name="after", op=ringrec.Sum), n), "allreduce after errors")
print("api ok rank %d" % r, flush=True)
ringrec.shutdown()
raises(ValueError, ["shut down"], lambda: ringrec.rank())
