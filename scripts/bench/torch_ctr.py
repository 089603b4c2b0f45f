"""PyTorch reference of `ringrec train`: the same CTR model, data split and hyperparameters.

--model mlp|dlrm|dcn|deepfm|wide-deep (default mlp, the model described next) picks one of
issue 31's models from torch_models.py, with ringrec's shape flags (--bottom-mlp and
--interaction-self for dlrm; --cross-layers, --cross-rank, --cross-structure for dcn; a
shape flag of another model is refused); every model's table is the one nn.Embedding (rows
of dim + 1 for deepfm / wide-deep, the first-order weight last) trained by the sparse
optimizer, every other parameter by the dense one.

Model (mlp): one embedding row per (categorical field, value) (a missing value is its own value
of its field; no hashing, the vocabulary is built over the whole file), dim 16; the 26
embeddings concatenated with the 13 dense features ln(1 + max(x, 0)) (missing -> 0), in
that order (width 26*dim + 13); MLP 429 -> 256 -> ReLU -> 128 -> ReLU -> 1; loss
BCEWithLogits, mean over the global batch. Init: embeddings U(-1/sqrt(dim), 1/sqrt(dim)),
Linear weights Glorot-uniform, biases 0. Dense parameters: Adam (lr 0.001, 0.9/0.999, 1e-8);
embeddings: plain SGD (--sparse-lr 0.05) or row-wise Adagrad (one accumulator per row, as
TorchRec's EXACT_ROWWISE_ADAGRAD and ringrec's table; initial accumulator 0, eps 1e-8);
--sparse-optimizer adagrad-elementwise is torch.optim.Adagrad (for comparison).
Data: first (1 - test_fraction) of the rows train, the rest test, in file order (unless
--shuffle); global batch 1024, last partial batch kept. Test metrics: logloss and exact AUC
(Mann-Whitney, ties as average ranks).

Embedding gradients are sparse by default (nn.Embedding(sparse=True), --embedding-grad
sparse), as PyTorch users train CTR models: a step touches only the rows of its batch, and
torch.optim.SGD / Adagrad apply the sparse gradient to those rows. --embedding-grad dense
(the whole table's gradient materialised, and under DDP allreduced, every step) is kept
for comparison only: its results carry "embedding_grad": "dense" and the benchmark report
lists them as informational, never as the reference.

--ddp N runs N processes (torch.multiprocessing.spawn, gloo on 127.0.0.1) with the whole
model (embedding + MLP) inside DistributedDataParallel, as a plain PyTorch DDP user would;
with sparse embedding gradients DDP allreduces the embedding's sparse gradient (gloo
allgathers its indices and values) and the MLP's dense gradient in buckets. Every process
takes a disjoint slice of every global batch (per-process batch = global batch / N), so the
global batch and the gradient (the mean over the global batch) are those of one process.

Threads: --threads sets torch.set_num_threads per process (default: cores / processes),
which sets both the OpenMP and the MKL thread counts, so OMP_NUM_THREADS / MKL_NUM_THREADS
are not needed; --interop-threads sets torch.set_num_interop_threads (default: PyTorch's
own; eager training has no inter-op parallelism, and 1 vs 2 made no difference on a 2-core
VM; neither did OMP_NUM_THREADS, while OMP_WAIT_POLICY=passive was slower). The benchmark
(scripts/bench/train.sh) sweeps the thread counts and takes the best.

--autocast bf16 runs the forward pass (and the test scoring) under
torch.autocast(device, dtype=torch.bfloat16): the Linear layers' GEMMs take bf16 inputs (on
the CPU through oneDNN, AVX-512 BF16 / AMX where the CPU has them), the parameters and the
optimizers stay f32, the loss is computed on the f32 logits. The reference of `ringrec train
--dense-precision bf16` (scripts/bench/bf16.sh).

--device cuda (one process) puts the model and the whole data set on the GPU before the loop,
as a PyTorch user with a GPU runs this model; samples/s then waits for the GPU at the end.

This file imports nothing from ringrec (numpy and torch only): it is an independent
cross-check of ringrec's training, data parsing and metrics.

samples/s counts the training loop only (no parsing, no evaluation).

    python scripts/bench/torch_ctr.py --data target/bench-data/synth-200k.tsv --json
    python scripts/bench/torch_ctr.py --data target/bench-data/synth-200k.tsv --ddp 2 --threads 1 --json
    python scripts/bench/torch_ctr.py --data target/bench-data/synth-200k.tsv --embedding-grad dense --json
    python scripts/bench/torch_ctr.py --data target/bench-data/interactions-400k.tsv --model dcn --cross-rank 64 --json
"""
import argparse
import gc
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402  (beside this file)

NUM_DENSE, NUM_SPARSE = 13, 26


def log(msg):
    print(f"[torch_ctr] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------- data
def load_tsv(path):
    """Parses a Criteo TSV into (labels f32 [n], dense f32 [n,13], sparse int64 [n,26]).

    sparse holds global row indices: field f's values get the rows offsets[f] ..
    offsets[f+1] (the empty string, a missing value, is one of them). Returns
    (label, dense, sparse, vocab_rows)."""
    with open(path, "r", encoding="ascii", newline="\n") as fh:
        lines = fh.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    rows = [ln.split("\t") for ln in lines]
    del lines
    for i, r in enumerate(rows):
        if len(r) != 1 + NUM_DENSE + NUM_SPARSE:
            raise SystemExit(f"{path}:{i + 1}: {len(r)} fields, expected 40")
    cols = list(zip(*rows))
    del rows
    n = len(cols[0])
    label = np.array(cols[0], dtype=np.float32)
    dense = np.empty((n, NUM_DENSE), dtype=np.float32)
    for k in range(NUM_DENSE):
        c = np.array(cols[1 + k], dtype=object)
        c[c == ""] = "0"
        x = c.astype(np.int64)
        dense[:, k] = np.log1p(np.maximum(x, 0).astype(np.float64)).astype(np.float32)
    sparse = np.empty((n, NUM_SPARSE), dtype=np.int64)
    offset = 0
    for f in range(NUM_SPARSE):
        uniq, inv = np.unique(np.array(cols[1 + NUM_DENSE + f]), return_inverse=True)
        sparse[:, f] = inv.reshape(-1) + offset
        offset += len(uniq)
    return label, dense, sparse, offset


def load_cached(path, cache_dir):
    """load_tsv through a .npz cache keyed by the file's name, size and mtime."""
    if not cache_dir:
        return load_tsv(path)
    st = os.stat(path)
    key = f"{os.path.basename(path)}-{st.st_size}-{st.st_mtime_ns}.npz"
    cpath = os.path.join(cache_dir, key)
    if os.path.exists(cpath):
        with np.load(cpath) as z:
            return z["label"], z["dense"], z["sparse"], int(z["vocab_rows"])
    label, dense, sparse, vocab_rows = load_tsv(path)
    try:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = f"{cpath}.{os.getpid()}.tmp.npz"
        np.savez(tmp, label=label, dense=dense, sparse=sparse, vocab_rows=vocab_rows)
        os.replace(tmp, cpath)
    except OSError as e:
        log(f"cannot write the cache {cpath}: {e}")
    return label, dense, sparse, vocab_rows


def auc_exact(scores, labels):
    """ROC AUC by the Mann-Whitney U statistic, ties as average ranks (float64)."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels) > 0.5
    pos = int(labels.sum())
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    uniq, inv, counts = np.unique(scores, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts).astype(np.float64)  # 1-based rank of the last of each tie group
    avg_rank = upper - (counts - 1) / 2.0
    ranks = avg_rank[inv.reshape(-1)]
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


# ---------------------------------------------------------------------------------- model
def build_model(vocab_rows, args):
    """The model of --model (torch_models.py) with this run's shape flags."""
    net = torch_models.build(args.model, vocab_rows, args.dim, args.hidden,
                             args.embedding_grad == "sparse", args.bottom_mlp,
                             args.interaction_self, args.cross_layers, args.cross_rank,
                             args.cross_structure)
    # ringrec's --table-init-scale: its default for deepfm is 0.01 (rows of 1/sqrt(d + 1)
    # make the second-order term noise), else the reference's own embedding init.
    scale = args.init_scale if args.init_scale > 0 else (0.01 if args.model == "deepfm" else 0.0)
    if scale > 0:
        nn.init.uniform_(net.emb.weight, -scale, scale)
    return net


class RowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad, the embedding optimizer of TorchRec / FBGEMM
    (EXACT_ROWWISE_ADAGRAD) and of ringrec's table: one accumulator per row,
    acc += mean over the row of g^2, then row -= lr * g / (sqrt(acc) + eps). Written here
    from that definition (no ringrec code); sparse gradients are coalesced first, so a row
    the batch holds several times takes one step with its summed gradient."""

    def __init__(self, params, lr, eps=1e-8):
        super().__init__(params, dict(lr=lr, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                acc = self.state[p].setdefault("acc", torch.zeros(p.shape[0], dtype=p.dtype, device=p.device))
                g = p.grad
                if g.is_sparse:
                    g = g.coalesce()
                    idx, val = g.indices()[0], g.values()
                    rows = acc.index_select(0, idx) + val.pow(2).mean(dim=1)
                    acc.index_copy_(0, idx, rows)
                    p.index_add_(0, idx, -group["lr"] * val / (rows.sqrt() + group["eps"]).unsqueeze(1))
                else:
                    acc.add_(g.pow(2).mean(dim=1))
                    p.add_(-group["lr"] * g / (acc.sqrt() + group["eps"]).unsqueeze(1))


def make_optimizers(model, args):
    net = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    dense = net.dense_parameters()
    if args.dense_optimizer == "adam":
        dense_opt = torch.optim.Adam(dense, lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    else:
        dense_opt = torch.optim.SGD(dense, lr=args.lr)
    if args.sparse_optimizer == "sgd":
        sparse_opt = torch.optim.SGD(net.emb.parameters(), lr=args.sparse_lr)
    elif args.sparse_optimizer == "adagrad":
        sparse_opt = RowWiseAdagrad(net.emb.parameters(), lr=args.sparse_lr, eps=1e-8)
    else:
        sparse_opt = torch.optim.Adagrad(net.emb.parameters(), lr=args.sparse_lr,
                                         initial_accumulator_value=0.0, eps=1e-8)
    return dense_opt, sparse_opt


# ------------------------------------------------------------------------------- training
def worker(rank, world, args, data):
    label, dense, sparse, vocab_rows = data
    dev = torch.device(args.device)
    label, dense, sparse = label.to(dev), dense.to(dev), sparse.to(dev)
    ddp = world > 0
    nproc = max(world, 1)
    torch.set_num_threads(args.threads)
    if args.interop_threads > 0:
        torch.set_num_interop_threads(args.interop_threads)
    if ddp:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(args.port)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    model = build_model(vocab_rows, args).to(dev)
    if ddp:
        model = nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's parameters
    dense_opt, sparse_opt = make_optimizers(model, args)

    n = label.shape[0]
    n_test = int(round(n * args.test_fraction))
    n_train = n - n_test
    B = args.batch
    steps_per_epoch = (n_train + B - 1) // B
    total_steps = steps_per_epoch * args.epochs
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    gen = torch.Generator().manual_seed(args.seed)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    bf16 = args.autocast == "bf16"

    def autocast():
        return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16)

    loss_sum = torch.zeros((), dtype=torch.float64, device=dev)  # sum over this rank's samples
    seen = 0  # global samples trained on
    step = 0
    if ddp:
        dist.barrier()
    load_before = os.getloadavg()[0]
    sync()
    t0 = time.perf_counter()
    t_last = t0
    for epoch in range(args.epochs):
        order = torch.randperm(n_train, generator=gen) if args.shuffle else None
        for b in range(steps_per_epoch):
            if step >= total_steps:
                break
            lo, hi = b * B, min((b + 1) * B, n_train)
            g = hi - lo  # global batch size
            # This rank's disjoint slice of the global batch.
            a = lo + (g * rank) // nproc
            z = lo + (g * (rank + 1)) // nproc
            if order is None:
                ys, xs, xd = label[a:z], sparse[a:z], dense[a:z]
            else:
                idx = order[a:z]
                idx = idx.to(dev)
                ys, xs, xd = label[idx], sparse[idx], dense[idx]
            with autocast():
                logits = model(xs, xd)
            logits = logits.float()
            loss_local = F.binary_cross_entropy_with_logits(logits, ys, reduction="sum")
            # DDP averages gradients over the ranks: scale so the result is the mean over
            # the global batch even when the slices differ in size (last batch).
            loss = loss_local * (nproc / g)
            dense_opt.zero_grad(set_to_none=True)
            sparse_opt.zero_grad(set_to_none=True)
            loss.backward()
            dense_opt.step()
            sparse_opt.step()
            loss_sum += loss_local.detach().double()
            seen += g
            step += 1
            if rank == 0 and args.progress_every and step % args.progress_every == 0:
                now = time.perf_counter()
                log(f"step {step}/{total_steps} epoch {epoch} batch loss "
                    f"{loss_local.item() / max(z - a, 1):.5f} "
                    f"{args.progress_every * B / (now - t_last):,.0f} samples/s")
                t_last = now
    if ddp:
        dist.barrier()
    sync()
    elapsed = time.perf_counter() - t0
    load_after = os.getloadavg()[0]
    if ddp:
        t = torch.tensor([elapsed], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        elapsed = float(t[0])
        dist.all_reduce(loss_sum)
    train_loss = float(loss_sum) / max(seen, 1)

    result = None
    if rank == 0:
        net = model.module if ddp else model
        net.eval()
        with torch.no_grad(), autocast():
            out = []
            for s in range(n_train, n, 8192):
                out.append(net(sparse[s:s + 8192], dense[s:s + 8192]).float().double())
            logits = torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)
            logits, yt = logits.cpu(), label[n_train:].double().cpu()
            test_logloss = (F.binary_cross_entropy_with_logits(logits, yt).item()
                            if n_test else float("nan"))
        test_auc = auc_exact(logits.numpy(), yt.numpy()) if n_test else float("nan")
        result = {
            "impl": "pytorch-ddp" if ddp else "pytorch",
            "model": args.model,
            "procs": nproc,
            "autocast": args.autocast,
            "samples_per_sec": seen / elapsed if elapsed > 0 else float("nan"),
            "train_loss": train_loss,
            "test_logloss": test_logloss,
            "test_auc": test_auc,
            "steps": step,
            "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "train_rows": n_train,
            "test_rows": n_test,
            "samples": seen,
            "train_seconds": elapsed,
            "epochs": args.epochs,
            "batch": B,
            "dim": args.dim,
            "hidden": args.hidden,
            "lr": args.lr,
            "dense_optimizer": args.dense_optimizer,
            "sparse_lr": args.sparse_lr,
            "sparse_optimizer": args.sparse_optimizer,
            "embedding_grad": args.embedding_grad,
            "init_scale": args.init_scale or None,
            **model_shape(args),
            "ddp_backend": "gloo" if ddp else None,
            "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
            "vocab_rows": vocab_rows,
            "seed": args.seed,
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            # 1-minute load average before and after the loop: > cores means someone else
            # was using the CPUs and samples/s is low.
            "loadavg_before": load_before,
            "loadavg_after": load_after,
        }
        if args.save_params:
            np.savez(args.save_params, **{k: v.detach().cpu().numpy()
                                          for k, v in net.state_dict().items()})
        log(f"done: {step} steps, {result['samples_per_sec']:,.0f} samples/s, train loss "
            f"{train_loss:.5f}, test logloss {test_logloss:.5f}, test AUC {test_auc:.5f}")
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            for k, v in result.items():
                print(f"{k:>18}: {v}")
    if ddp:
        # The DDP reducer (it holds the process group's pending work) goes before the group.
        model = net = dense_opt = sparse_opt = None
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    return result


SHAPE_FLAGS = {  # flag -> (the model that uses it, its default)
    "bottom_mlp": ("dlrm", "64"), "interaction_self": ("dlrm", False),
    "cross_layers": ("dcn", 3), "cross_rank": ("dcn", 0), "cross_structure": ("dcn", "stacked"),
}


def model_shape(args):
    """The shape flags of this run's model (for the JSON record)."""
    return {k: getattr(args, k) for k, (m, _) in SHAPE_FLAGS.items() if m == args.model}


def main():
    ap = argparse.ArgumentParser(description="PyTorch reference of `ringrec train`.")
    ap.add_argument("--data", required=True, help="Criteo-format TSV")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1024, help="global batch size")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--hidden", default="256,128")
    ap.add_argument("--model", choices=torch_models.MODELS, default="mlp",
                    help="the model (torch_models.py), as `ringrec train --model`")
    ap.add_argument("--bottom-mlp", default=None, help="dlrm: bottom MLP hidden widths (64)")
    ap.add_argument("--interaction-self", action="store_true", default=None,
                    help="dlrm: include each vector's dot with itself")
    ap.add_argument("--cross-layers", type=int, default=None, help="dcn: cross layers (3)")
    ap.add_argument("--cross-rank", type=int, default=None, help="dcn: 0 = full W, R = low rank")
    ap.add_argument("--cross-structure", choices=["stacked", "parallel"], default=None,
                    help="dcn: stacked (default) or parallel")
    ap.add_argument("--lr", type=float, default=0.001, help="lr of the dense optimizer")
    ap.add_argument("--init-scale", type=float, default=0.0,
                    help="table rows U(-s, s) instead of 1/sqrt(row width) (ringrec's --table-init-scale; default: 0.01 for deepfm, as ringrec)")
    ap.add_argument("--dense-optimizer", choices=["adam", "sgd"], default="adam")
    ap.add_argument("--sparse-lr", type=float, default=0.05)
    ap.add_argument("--sparse-optimizer", choices=["sgd", "adagrad", "adagrad-elementwise"], default="sgd",
                    help="adagrad: row-wise (TorchRec's EXACT_ROWWISE_ADAGRAD, as ringrec's table); adagrad-elementwise: torch.optim.Adagrad")
    ap.add_argument("--test-fraction", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per process "
                    "(default: cores / processes)")
    ap.add_argument("--ddp", type=int, default=0, help="N processes, DDP over gloo")
    ap.add_argument("--port", type=int, default=29517, help="gloo rendezvous port on 127.0.0.1")
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--shuffle", action="store_true", help="shuffle the training rows each epoch")
    ap.add_argument("--embedding-grad", choices=["dense", "sparse"], default="sparse",
                    help="nn.Embedding(sparse=...); dense (the whole table's gradient every "
                    "step) is for comparison only")
    ap.add_argument("--interop-threads", type=int, default=0,
                    help="torch.set_num_interop_threads per process (0: PyTorch's default)")
    ap.add_argument("--save-params", default="",
                    help="write the trained parameters (rank 0) to this .npz")
    ap.add_argument("--progress-every", type=int, default=50, help="steps; 0 = quiet")
    ap.add_argument("--json", action="store_true", help="print one JSON line at the end")
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none",
                    help="bf16: the forward pass under torch.autocast(dtype=torch.bfloat16) "
                    "(f32 parameters and optimizers)")
    ap.add_argument("--device", default="cpu",
                    help="cpu, or cuda (one process: the model and the whole data set on the "
                    "GPU before the loop, as a PyTorch user with a GPU runs it)")
    default_cache = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "target",
                                 "bench-data", "torch-cache")
    ap.add_argument("--cache-dir", default=os.path.normpath(default_cache),
                    help="where parsed TSVs are cached as .npz ('' = no cache)")
    args = ap.parse_args()
    args.hidden = [int(h) for h in args.hidden.split(",") if h.strip()]
    for k, (m, default) in SHAPE_FLAGS.items():
        if getattr(args, k) is None:
            setattr(args, k, default)
        elif m != args.model:
            ap.error(f"--{k.replace('_', '-')} is a {m} flag; --model is {args.model}")
    args.bottom_mlp = [int(h) for h in str(args.bottom_mlp).split(",") if h.strip()]
    nproc = max(args.ddp, 1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if args.threads <= 0:
        args.threads = max(1, cores // nproc)

    t = time.perf_counter()
    label, dense, sparse, vocab_rows = load_cached(args.data, args.cache_dir)
    log(f"parsed {args.data}: {len(label)} rows, {vocab_rows} embedding rows, "
        f"{time.perf_counter() - t:.1f}s")
    data = (torch.from_numpy(label), torch.from_numpy(dense), torch.from_numpy(sparse), vocab_rows)
    if args.device != "cpu" and args.ddp:
        ap.error("--device cuda runs one process (no --ddp)")
    if args.ddp:
        for x in data[:3]:
            x.share_memory_()
        mp.spawn(worker, args=(args.ddp, args, data), nprocs=args.ddp, join=True)
    else:
        worker(0, 0, args, data)


if __name__ == "__main__":
    main()
