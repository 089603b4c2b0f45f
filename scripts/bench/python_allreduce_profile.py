"""Where a small blocking allreduce's time goes on the Python side (issue 32): each piece of
``ringrec.allreduce_`` timed alone in a ``time.perf_counter_ns`` loop, and the whole call by
its paths — the general path (the Python checks, the name, the capsule, the extension), the
extension's fast path (``_ringrec.allreduce_simple``) bare and behind ``ringrec.allreduce_``,
and the same call from Rust (``_ringrec.bench_allreduce``, in place) — as wall time and as the
calling thread's CPU time per call (``time.thread_time_ns``: what the caller itself spends,
the engine thread's and the peers' share left out, so it holds on a loaded machine).

    python scripts/bench/python_allreduce_profile.py            # a world of one rank
    mpirun -np 2 python scripts/bench/python_allreduce_profile.py   # prints on rank 0
"""

import argparse
import statistics
import time

import numpy as np

import ringrec
from ringrec import _ringrec

p = argparse.ArgumentParser()
p.add_argument("--bytes", type=int, default=4096)
p.add_argument("--iters", type=int, default=2000, help="calls per timing")
p.add_argument("--repeats", type=int, default=15, help="alternating timings per path; medians reported")
a = p.parse_args()

ringrec.init()
r = ringrec.rank()
x = np.full(a.bytes // 4, 1.0 + r, np.float32)
z = np.zeros(1, np.float32)
ringrec.allreduce_(x, name="profile.warm")  # imports numpy's table: the fast path is on


def piece(f, n=200000):
    """ns per call of f alone, best of 5 loops (the loop's own cost subtracted)."""
    def loop(g):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            g()
        return (time.perf_counter_ns() - t0) / n
    empty = min(loop(lambda: None) for _ in range(5))
    return min(loop(f) for _ in range(5)) - empty


def general(t, name, op):
    """The general path, as ringrec.allreduce_ takes it for an array the fast path declines."""
    x_ = ringrec._tensor(t, write=True)
    _ringrec.allreduce(ringrec._name("allreduce", name), x_.capsule(), ringrec._op(op), None)


def _stub(t, name=None, op=1, compression=None):
    """A wrapper's own cost: a call with keyword arguments that does nothing."""


n = a.iters
ar_, simple = ringrec.allreduce_, _ringrec.allreduce_simple
paths = {
    "general path (before)": lambda: [general(x, "profile.g", 1) for _ in range(n)],
    "_ringrec.allreduce_simple": lambda: [simple(x, "profile.s", 1, None) for _ in range(n)],
    "ringrec.allreduce_": lambda: [ar_(x, name="profile.a", op=1) for _ in range(n)],
    "Rust (bench_allreduce)": lambda: _ringrec.bench_allreduce("profile.r", a.bytes // 4, n, True),
}
wall = {k: [] for k in paths}
cpu = {k: [] for k in paths}
for _ in range(a.repeats):
    for k, f in paths.items():
        f()  # warm
        ringrec.allreduce_(z, name="profile.barrier")
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        f()
        wall[k].append((time.perf_counter_ns() - t0) / n)
        cpu[k].append((time.thread_time_ns() - c0) / n)

if r == 0:
    print("# %d B float32, %d rank(s), load average %s" % (a.bytes, ringrec.size(), open("/proc/loadavg").read().split()[:3]))
    print("# pieces alone (ns per call, the loop's cost subtracted)")
    nd = np.ndarray
    for label, f in (
        ("call of a def with 3 kwargs", lambda: _stub(x, name="a", op=1)),
        ("type(x) is ndarray", lambda: type(x) is nd),
        ("_tensor(x, write=True)", lambda: ringrec._tensor(x, write=True)),
        ("_tensor(x, copy=True)", lambda: ringrec._tensor(x, copy=True)),
        ("x.copy()", lambda: x.copy()),
        ("_name(kind, 'a')", lambda: ringrec._name("allreduce", "a")),
        ("_name(kind, None)", lambda: ringrec._name("allreduce", None)),
        ("_op(1)", lambda: ringrec._op(1)),
        ("x.__dlpack__()", lambda: x.__dlpack__()),
        ("_ringrec.topology() (an extension call)", lambda: _ringrec.topology()),
    ):
        print("%-45s %7.0f" % (label, piece(f)))
    print("# whole calls (medians of %d timings of %d calls): wall us, caller's CPU us" % (a.repeats, n))
    for k in paths:
        print("%-45s %7.2f %7.2f" % (k, statistics.median(wall[k]) / 1e3, statistics.median(cpu[k]) / 1e3))
