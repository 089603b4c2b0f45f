"""Times allreduce from Python (numpy arrays through ringrec.allreduce: the extension, the
copy of the input, the engine in place), the same calls from Rust through the same engine
in the same job (`rust-engine`: `Runtime::allreduce` on a fresh copy, the layer's
reference), both again in place without a copy (`python-inplace`: ringrec.allreduce_ with
Average; `rust-engine-inplace`: a Vec moved into the engine and back), and torch.distributed.all_reduce over gloo; one JSON line per (what, size) on
rank 0: the median of --repeats timings (Python and Rust alternating), wall time and the
calling thread's CPU time per call (`cpu_us`, which a loaded machine disturbs less). Run by
scripts/bench/python_allreduce.sh."""

import argparse
import json
import os
import statistics
import time

import numpy as np

import ringrec

p = argparse.ArgumentParser()
p.add_argument("--min-bytes", type=int, default=4096)
p.add_argument("--max-bytes", type=int, default=64 << 20)
p.add_argument("--factor", type=int, default=4)
p.add_argument("--gloo-bytes", type=int, default=16 << 20)
p.add_argument("--repeats", type=int, default=9, help="alternating Python and Rust timings per size; the medians are reported")
a = p.parse_args()

ringrec.init()
r = ringrec.rank()


def iters(size):
    # As `ringrec bench allreduce`: small sizes until 8 MiB moved (at most 1000), large at least 3.
    return max(3, min(1000, (8 << 20) // size))


def timed(f, n, warm=3):
    """Seconds per call of f, wall and this thread's CPU (what the caller itself spends)."""
    for _ in range(warm):
        f()
    ringrec.allreduce(np.zeros(1, np.float32), name="bench.barrier")
    t, c = time.perf_counter(), time.thread_time()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n, (time.thread_time() - c) / n


def rust_timed(name, count, n, in_place=False):
    """bench_allreduce's seconds per call, and this thread's CPU per call: the loop runs in
    Rust, so its CPU is the difference from a second run of one call (the same input made,
    the same 3 warm-up calls), over n - 1 calls."""
    c0 = time.thread_time()
    wall = ringrec._ringrec.bench_allreduce(name, count, n, in_place)
    c1 = time.thread_time()
    ringrec._ringrec.bench_allreduce(name, count, 1, in_place)
    return wall, ((c1 - c0) - (time.thread_time() - c1)) / (n - 1)


size = a.min_bytes
while size <= a.max_bytes:
    x = np.full(size // 4, 1.0 + r, np.float32)
    n = iters(size)
    out = {}

    # The names are made once, as a caller with a fixed name does (and as the Rust side does).
    name, name_in = "bench.%d" % size, "bench.inplace.%d" % size

    def once():
        out["y"] = ringrec.allreduce(x, name=name, op=ringrec.Sum)

    def in_place():
        ringrec.allreduce_(x, name=name_in, op=ringrec.Average)

    py, rust, py_in, rust_in = [], [], [], []
    for _ in range(a.repeats):  # alternating, so both sides see the same machine
        py.append(timed(once, n))
        assert np.allclose(out["y"][:4], 3.0)
        ringrec.allreduce(np.zeros(1, np.float32), name="bench.barrier")
        rust.append(rust_timed("bench.rust.%d" % size, size // 4, n))
        ringrec.allreduce(np.zeros(1, np.float32), name="bench.barrier")
        py_in.append(timed(in_place, n))
        ringrec.allreduce(np.zeros(1, np.float32), name="bench.barrier")
        rust_in.append(rust_timed("bench.rust.inplace.%d" % size, size // 4, n, True))
    if r == 0:
        for what, ts in (("python", py), ("rust-engine", rust), ("python-inplace", py_in), ("rust-engine-inplace", rust_in)):
            row = {"what": what, "size": size, "iters": n, "time_us": statistics.median(t for t, _ in ts) * 1e6, "runs_us": [round(t * 1e6, 2) for t, _ in ts],
                   "cpu_us": statistics.median(c for _, c in ts) * 1e6}
            print(json.dumps(row), flush=True)
    size *= a.factor

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "1")))
dist.init_process_group("gloo", rank=r, world_size=ringrec.size())
for size in (a.gloo_bytes,):
    t_ = torch.full((size // 4,), 1.0 + r)
    n = iters(size)
    for _ in range(3):
        dist.all_reduce(t_)
    ts = []
    for _ in range(a.repeats):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(t_)
        ts.append((time.perf_counter() - t0) / n)
    if r == 0:
        print(json.dumps({"what": "gloo", "size": size, "iters": n, "time_us": statistics.median(ts) * 1e6, "runs_us": [round(t * 1e6, 2) for t in ts]}), flush=True)
dist.destroy_process_group()
