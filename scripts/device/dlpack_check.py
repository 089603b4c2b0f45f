"""The Python module's CUDA tensors on a GPU (issue 32): torch CUDA tensors lent to the
engine through DLPack and reduced by NCCL on the rank's GPU, checked against torch, and the
time per blocking allreduce of 4 KiB and 16 MiB beside the same call on a CPU tensor. The
device side is made at the first CUDA tensor (none after `init()` and a CPU allreduce);
empty CUDA tensors (a null data pointer) are no-ops, an allgather with ranks of no rows
returns the others'.

Needs the extension built with the cuda feature and a torch with CUDA:

    venv=$(scripts/python-venv.sh)          # numpy, torch, maturin (and the CPU extension)
    CARGO_TARGET_DIR=target $(dirname $venv)/maturin build --release -m python/Cargo.toml \\
        --features cuda -i $venv --out target/python-wheel-cuda
    $venv -m pip install --no-deps --target target/python-site-cuda target/python-wheel-cuda/ringrec-*.whl
    PYTHONPATH=target/python-site-cuda mpirun -np 1 $venv scripts/device/dlpack_check.py
    PYTHONPATH=target/python-site-cuda mpirun -np 2 $venv scripts/device/dlpack_check.py   # 2 GPUs

With 2 ranks on a machine with one GPU it says so and skips (NCCL cannot run two ranks on
one GPU). Not part of scripts/gpu-check.sh: building the extension with the cuda feature
takes minutes, more than the 30 s a step there may add. Exit status 0 when every check
passed.
"""

import sys
import time

import torch

import ringrec


def seeded(rank, n, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randint(-50, 50, (n,), generator=g).to(dtype)


def per_call(x, name, iters):
    ringrec.allreduce_(x, name=name, op=ringrec.Sum)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        ringrec.allreduce_(x, name=name, op=ringrec.Sum)
    if x.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters


def main():
    ringrec.init()
    r, n = ringrec.rank(), ringrec.size()
    if n > torch.cuda.device_count():
        if r == 0:
            print("dlpack_check: skipped: %d ranks, %d GPU(s) on this machine" % (n, torch.cuda.device_count()))
        return 0
    torch.cuda.set_device(ringrec.local_rank())
    ringrec.allreduce(torch.ones(4), name="cpu.first")
    if ringrec._ringrec.device() is not None:
        raise SystemExit("dlpack_check: a device side before any CUDA tensor: %s" % ringrec._ringrec.device())
    cuda = torch.device("cuda", ringrec.local_rank())
    failures = []

    def check(what, got, want):
        ok = got.device.type == "cuda" and torch.equal(got.cpu(), want.cpu())
        print("rank %d %-28s %s" % (r, what, "ok" if ok else "WRONG"), flush=True)
        if not ok:
            failures.append(what)

    count = 1 << 16
    total = sum(seeded(q, count) for q in range(n))
    for op, want in [(ringrec.Sum, total), (ringrec.Average, total / n),
                     (ringrec.Min, torch.stack([seeded(q, count) for q in range(n)]).min(0).values),
                     (ringrec.Max, torch.stack([seeded(q, count) for q in range(n)]).max(0).values)]:
        check("allreduce op %d" % op, ringrec.allreduce(seeded(r, count).to(cuda), name="op.%d" % op, op=op), want)
        dev = ringrec._ringrec.device()
        if dev is None:
            raise SystemExit("dlpack_check: the extension has no GPU executor (built without the cuda feature, or no driver)")
    x = seeded(r, count).to(cuda)
    ringrec.allreduce_(x, name="inplace", op=ringrec.Sum)
    check("allreduce_ (in place)", x, total)
    h = ringrec.allreduce_async(seeded(r, count).to(cuda), name="async", op=ringrec.Sum)
    check("allreduce_async", h.wait(), total)
    for dt in (torch.float16, torch.bfloat16, torch.int32, torch.float64):
        check("allreduce %s" % dt, ringrec.allreduce(seeded(r, 4096, dt).to(cuda), name="dt.%s" % dt, op=ringrec.Sum),
              sum(seeded(q, 4096, dt) for q in range(n)))
    check("allreduce fp16 compression", ringrec.allreduce(seeded(r, count).to(cuda), name="fp16", op=ringrec.Sum, compression=ringrec.Compression.fp16), total)
    check("broadcast", ringrec.broadcast(seeded(r, count).to(cuda), n - 1, name="bcast"), seeded(n - 1, count))
    g = ringrec.allgather(torch.full((r + 1, 3), float(r), device=cuda), name="gather")
    check("allgather", g, torch.cat([torch.full((q + 1, 3), float(q)) for q in range(n)]))
    empty = torch.empty((0, 3), device=cuda)
    check("empty allreduce", ringrec.allreduce(empty, name="empty.ar", op=ringrec.Sum), torch.empty((0, 3)))
    check("empty broadcast", ringrec.broadcast(torch.empty(0, dtype=torch.int64, device=cuda), 0, name="empty.bc"), torch.empty(0, dtype=torch.int64))
    check("allgather, ranks of no rows", ringrec.allgather(torch.full((r % 2, 3), float(r), device=cuda), name="empty.gather"),
          torch.cat([torch.full((q % 2, 3), float(q)) for q in range(n)]))

    print("rank %d device: %s" % (r, dev))
    for size, iters in [(4 << 10, 200), (16 << 20, 20)]:
        elems = size // 4
        gpu = per_call(torch.ones(elems, device=cuda), "t.gpu.%d" % size, iters)
        cpu = per_call(torch.ones(elems), "t.cpu.%d" % size, iters)
        if r == 0:
            print("allreduce_ %8d bytes: cuda tensor %9.1f us/call, cpu tensor %9.1f us/call (cuda/cpu %.2fx)" % (size, gpu * 1e6, cpu * 1e6, gpu / cpu), flush=True)
    if failures:
        print("rank %d: FAILED %s" % (r, ", ".join(failures)), flush=True)
        return 1
    print("dlpack_check ok rank %d" % r, flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    ringrec.shutdown()
    sys.exit(code)
