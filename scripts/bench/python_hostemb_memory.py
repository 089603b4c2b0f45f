"""HostEmbedding's memory with every rank on one host (issue 32's figure): each rank's PSS
(proportional set size: a page shared by k processes counts 1/k in each, so the sum over
the ranks counts the shared table once) grows by about table / ranks, against ranks x the
rows for per-rank nn.Embedding tables of the same rows.

    mpirun -np 4 python scripts/bench/python_hostemb_memory.py --rows 1000000 --dim 16

Rank 0 prints one JSON line: the table's file bytes (its mapping in /proc/self/smaps), the
sum over the ranks of their PSS growth from before the table was opened to after it holds
--rows rows, the same for an nn.Embedding of --rows rows on every rank, and the ratios.

PSS counts only the pages a process touched, while ringrec allocates its shared segments in
full when it makes them (posix_fallocate in the shared-memory directory): the host's memory
(`host_memory_growth_kib`) is the ranks' PSS growth outside ringrec's segments plus the
sizes of the segments (each once: every local rank maps every one, rank 0's view)."""

import argparse
import ctypes
import json

import torch

import ringrec.torch as hvd


def pss_kib():
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise RuntimeError("no Pss in /proc/self/smaps_rollup")


def smaps():
    """(mapping's name, field, KiB) for every size field of every mapping in
    /proc/self/smaps."""
    name = ""
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
                name = " ".join(parts[5:])
            elif len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                yield name, parts[0], int(parts[1])


def segments_kib():
    """(sizes, this process's PSS) of its mappings of ringrec's shared segments, KiB."""
    size = pss = 0
    for name, field, kib in smaps():
        if "/ringrec-" in name and field == "Size:":
            size += kib
        elif "/ringrec-" in name and field == "Pss:":
            pss += kib
    return size, pss


def kind_of(name):
    """The kind of a mapping: the host table, ringrec's other shared segments, glibc's main
    heap, other anonymous memory (mmapped chunks, threads' arenas and stacks), files
    (libraries) or other."""
    if "/ringrec-" in name:
        return "table" if "table" in name else "segments"
    if name == "[heap]":
        return "heap"
    if name == "" or name.startswith("[stack") or name.startswith("[anon"):
        return "anon"
    return "files" if name.startswith("/") else "other"


def pss_by_kind():
    """This process's PSS (KiB) by kind of mapping (`kind_of`)."""
    kinds = {}
    for name, field, kib in smaps():
        if field == "Pss:":
            kinds[kind_of(name)] = kinds.get(kind_of(name), 0) + kib
    return kinds


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def malloc_kib():
    """glibc's view of the heap (KiB): bytes in use (all arenas), free bytes it keeps, and
    bytes in mmapped chunks; None elsewhere than glibc."""
    try:
        f = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    f.restype = _Mallinfo2
    m = f()
    return {"in_use": m.uordblks // 1024, "free_kept": m.fordblks // 1024, "mmapped": m.hblkhd // 1024}


def table_mapping_kib():
    """The size of the largest shared mapping whose name says table (the host table)."""
    return max((kib for name, field, kib in smaps() if field == "Size:" and "table" in name), default=0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--chunk", type=int, default=4096, help="keys per rank per sparse step")
    p.add_argument("--breakdown", action="store_true",
                   help="also print every rank's PSS growth by kind of mapping and glibc's heap counters")
    a = p.parse_args()
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.set_num_threads(1)

    def total(kib):
        return int(hvd.allreduce(torch.tensor([float(kib)], dtype=torch.float64), op=hvd.Sum, name="pss").item())

    # Torch's and the engine's one-time allocations (autograd, the first allreduce) come
    # before either measurement.
    w = torch.zeros(8, a.dim, requires_grad=True)
    torch.nn.functional.embedding(torch.arange(a.chunk) % 8, w).sum().backward()
    total(0)
    before = pss_kib()
    seg_before = segments_kib()
    kinds_before, malloc_before = (pss_by_kind(), malloc_kib()) if a.breakdown else ({}, None)
    emb = hvd.HostEmbedding(num_embeddings=a.rows, embedding_dim=a.dim, sparse_normalize="frequency")
    opened = total(pss_kib() - before)
    chunk = a.chunk
    steps = -(-(-(-a.rows // n)) // chunk)
    for s in range(steps):  # every rank runs the same number of sparse steps
        # Step s's keys: chunk s of this rank's keys r, r + n, r + 2n, ... (made per step, as
        # a data loader hands out batches: the run's keys are not the table's memory).
        first = r + s * chunk * n
        keys = torch.arange(first, min(a.rows, first + chunk * n), n)
        emb(keys).sum().backward()
        emb.sparse_step()
    hvd.allreduce(torch.zeros(1), name="filled")
    grown = total(pss_kib() - before)
    seg_after = segments_kib()
    # Outside the segments (PSS), then the segments' full sizes once (rank 0's).
    private = total(pss_kib() - before - (seg_after[1] - seg_before[1]))
    host = private + (seg_after[0] - seg_before[0])
    table = table_mapping_kib()
    live = emb.size()[1]
    if a.breakdown:
        kinds = pss_by_kind()
        grown_by_kind = {k: v - kinds_before.get(k, 0) for k, v in sorted(kinds.items()) if v != kinds_before.get(k, 0)}
        heap = malloc_kib()
        line = {"rank": r, "pss_growth_by_kind_kib": grown_by_kind, "malloc_before_kib": malloc_before, "malloc_after_kib": heap}
        for q in range(n):
            if q == r:
                print(json.dumps(line), flush=True)
            hvd.allreduce(torch.zeros(1), name="breakdown.%d" % q)
    emb.close()

    before = pss_kib()
    dense = torch.nn.Embedding(a.rows, a.dim, sparse=True)
    dense.weight.data.add_(1.0)  # touch every page
    per_rank = total(pss_kib() - before)
    if r == 0:
        print(json.dumps({
            "ranks": n, "rows": a.rows, "live_rows": live, "dim": a.dim,
            "table_file_kib": table, "host_embedding_pss_growth_kib": grown, "pss_growth_at_open_kib": opened,
            "per_rank_nn_embedding_pss_growth_kib": per_rank,
            "host_embedding_over_table": round(grown / max(table, 1), 3),
            "host_memory_growth_kib": host, "segments_kib": seg_after[0] - seg_before[0],
            "host_memory_over_table": round(host / max(table, 1), 3),
            "per_rank_over_table": round(per_rank / max(table, 1), 3),
            "per_rank_over_host_embedding": round(per_rank / max(grown, 1), 3),
        }), flush=True)


if __name__ == "__main__":
    main()
