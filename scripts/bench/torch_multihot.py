"""PyTorch reference for the multi-hot set of issue 33 (`ringrec data synth --format parquet
--multi-hot`): 10 single-hot fields c0..c9 and 6 list fields l0..l5 (mean length 20).

The network is ringrec's own for this data (`ringrec train --model mlp --dim 16 --hidden
256,128 --sparse-columns c0,..,c9,l0,..,l5`), input slot for input slot — the file's
columns exactly, as ringrec takes a Parquet file's (no slot padded to Criteo's 26
categorical and 13 dense features):
- 10 single-hot slots: c0..c9;
- 6 pooled slots: nn.EmbeddingBag(mode="sum", sparse=True) over l0..l5 (an empty list pools
  to zeros);
- no dense slot (the file has no dense column).
That is 16 x 16 = 256 inputs; MLP 256 -> 256 -> ReLU -> 128 -> ReLU -> 1. Each
(field, id) has its own row (a field's ids are offset by field x 100,000; ringrec hashes
(field, id) into distinct keys of one table: the same thing). Init as ringrec's: rows
U(-1/sqrt(dim), 1/sqrt(dim)) (src/embedding/init.rs), Linear weights Glorot-uniform over
(fan_in, fan_out), biases 0 (MlpShape::init_params). Loss BCEWithLogits, the gradient of
the mean over the global batch (ringrec's loss_scale = 1 / global batch); dense parameters
Adam (lr 0.001, betas 0.9/0.999, eps 1e-8, bias-corrected: ringrec's), every embedding row
plain SGD (--sparse-lr 0.05) on its gradient summed over the batch's occurrences (ringrec's
per-key segment sum; at 1 rank its frequency normalisation divides by 1). Data: the last
round(rows x test_fraction) rows held out, the rest trained in file order (ringrec does not
shuffle without --shuffle), global batches of 1024 (the last one short); each rank's slice as
ringrec cuts it (the first `len % ranks` ranks one row more). Test AUC exact (Mann-Whitney,
ties as average ranks), as ringrec's. What cannot be the same: the random draws (torch's
generator, --seed), and at 2 ranks the sparse gradients' normalisation (DDP averages every
row over the ranks; ringrec divides a row by the number of ranks whose slice held its key).

--init ringrec starts from the very values ringrec draws for --seed: every row by
src/embedding/init.rs's documented formula over ringrec's documented keys (splitmix64 of
the field's salt ^ id; list field g is categorical field max(single-hot fields, 26) + g) and
the MLP from MlpShape::init_params's splitmix64 stream, written here from those formulas
(nothing imported). Then the two runs differ only by floating-point order (with --lr 0
--sparse-lr 0 the test AUCs are equal), so one seed compares the implementations; the
default (torch) draws the same distributions from torch's generator.
--truncate cuts every list to its first id (the figure's "lists cut to their first id").
--ddp N runs N processes (gloo on 127.0.0.1), the whole model inside
DistributedDataParallel, each taking its slice of every global batch.
samples/s counts the training loop only. Reads Parquet with pyarrow (scripts/bench/venv.sh
with WITH_TORCH=1 installs it); imports nothing from ringrec.

    python scripts/bench/torch_multihot.py --data target/bench-data/multihot.parquet --json
    python scripts/bench/torch_multihot.py --data target/bench-data/multihot.parquet --truncate --json
    python scripts/bench/torch_multihot.py --data target/bench-data/multihot.parquet --ddp 2 --threads 1 --json
"""
import argparse
import json
import math
import os
import time

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
import torch.nn as nn

SINGLE, LISTS, VOCAB = 10, 6, 100_000


def load(path, truncate):
    t = pq.read_table(path)
    labels = t.column("label").to_numpy().astype(np.float32)
    single = np.stack([t.column(f"c{f}").to_numpy() + f * VOCAB for f in range(SINGLE)], axis=1).astype(np.int64)
    lists = []
    for g in range(LISTS):
        arr = t.column(f"l{g}").combine_chunks()
        offsets = arr.offsets.to_numpy().astype(np.int64)
        values = arr.values.to_numpy().astype(np.int64) + g * VOCAB
        if truncate:
            lens = np.minimum(np.diff(offsets), 1)
            values = values[offsets[:-1][lens == 1]]
            offsets = np.concatenate([[0], np.cumsum(lens)])
        lists.append((offsets, values))
    return labels, single, lists


def bag_batch(lists, rows):
    """Per list field: (flat ids, per-row starts) of the rows `rows` (a range)."""
    out = []
    for offsets, values in lists:
        lo, hi = offsets[rows.start], offsets[rows.stop]
        out.append((torch.from_numpy(values[lo:hi]), torch.from_numpy(offsets[rows.start:rows.stop] - lo)))
    return out


U64 = np.uint64
GOLDEN = U64(0x9E3779B97F4A7C15)
FIELD_SALT = 0x5249_4E47_5245_4300  # "RINGREC\0"
EMPTY = U64(0xFFFFFFFFFFFFFFFF)


def splitmix64(z):
    """splitmix64's finaliser of z + golden, over a uint64 array (wrapping arithmetic)."""
    z = np.asarray(z, dtype=U64) + GOLDEN
    z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


def field_keys(slot, ids):
    """ringrec's keys of ids of categorical slot `slot` (docs/DATA.md: splitmix64(salt ^ id),
    salt = splitmix64(FIELD_SALT + slot); the all-ones key is moved one down)."""
    salt = splitmix64(np.array([FIELD_SALT + slot], dtype=U64))[0]
    k = splitmix64(np.asarray(ids, dtype=np.int64).view(U64) ^ salt)
    k[k == EMPTY] = EMPTY - U64(1)
    return k


def initial_rows(keys, seed, dim, scale):
    """ringrec's initial row of each key (src/embedding/init.rs's documented formula)."""
    base = splitmix64(U64(seed) ^ splitmix64(keys))
    j = (np.arange(1, dim + 1, dtype=U64) * GOLDEN)[None, :]
    u = splitmix64(base[:, None] + j) >> U64(40)
    return np.float32(scale) * (u.astype(np.float32) * np.float32(1.0 / (1 << 23)) - np.float32(1.0))


def initial_dense(widths, seed):
    """ringrec's initial MLP (Glorot-uniform from one splitmix64 stream, W in x out
    row-major then zero biases, per layer): [(W (out x in) as torch holds it, b)]."""
    state = U64(seed) ^ U64(0xD1B54A32D192ED03)
    out = []
    for fan_in, fan_out in zip(widths, widths[1:]):
        n = fan_in * fan_out
        stream = state + np.arange(n, dtype=U64) * GOLDEN
        state = state + U64(n) * GOLDEN
        u = (splitmix64(stream) >> U64(11)).astype(np.float64) / float(1 << 53)
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        w = ((2.0 * u - 1.0) * limit).astype(np.float32).reshape(fan_in, fan_out)
        out.append((w.T.copy(), np.zeros(fan_out, dtype=np.float32)))
    return out


def ringrec_init(model, seed, dim):
    """Gives `model` the initial parameters ringrec draws for `--seed seed` (see --init)."""
    scale = 1.0 / np.sqrt(np.float32(dim), dtype=np.float32)
    ids = np.arange(VOCAB, dtype=np.int64)
    with torch.no_grad(), np.errstate(over="ignore"):
        for f in range(SINGLE):
            model.single.weight[f * VOCAB:(f + 1) * VOCAB] = torch.from_numpy(initial_rows(field_keys(f, ids), seed, dim, scale))
        for g in range(LISTS):
            # List field g is categorical field max(single-hot fields, 26) + g.
            model.bags.weight[g * VOCAB:(g + 1) * VOCAB] = torch.from_numpy(initial_rows(field_keys(max(SINGLE, 26) + g, ids), seed, dim, scale))
        linears = [m for m in model.mlp if isinstance(m, nn.Linear)]
        widths = [linears[0].in_features] + [m.out_features for m in linears]
        for m, (w, b) in zip(linears, initial_dense(widths, seed)):
            m.weight.copy_(torch.from_numpy(w))
            m.bias.copy_(torch.from_numpy(b))


class Model(nn.Module):
    """ringrec's network for the set (see the module docs)."""

    def __init__(self, dim=16):
        super().__init__()
        bound = 1.0 / dim ** 0.5
        self.single = nn.Embedding(SINGLE * VOCAB, dim, sparse=True)
        self.bags = nn.EmbeddingBag(LISTS * VOCAB, dim, mode="sum", sparse=True)
        for e in (self.single, self.bags):
            nn.init.uniform_(e.weight, -bound, bound)
        width = (SINGLE + LISTS) * dim
        layers = []
        for out in (256, 128):
            layers += [nn.Linear(width, out), nn.ReLU()]
            width = out
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def sparse_params(self):
        return [p for name, p in self.named_parameters() if not name.startswith("mlp")]

    def forward(self, single, bags):
        parts = [self.single(single).flatten(1)]
        parts += [self.bags(ids, starts) for ids, starts in bags]
        return self.mlp(torch.cat(parts, dim=1)).squeeze(1)


def rank_slice(b0, b1, rank, world):
    """Rank `rank`'s rows of the global batch b0..b1, as ringrec cuts it (data/shard.rs)."""
    base, rem = divmod(b1 - b0, world)
    start = b0 + rank * base + min(rank, rem)
    return range(start, start + base + (1 if rank < rem else 0))


def auc(scores, labels):
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    pos = labels == 1
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def run(rank, world, args, out):
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world))
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    labels, single, lists = load(args.data, args.truncate)
    n = len(labels)
    n_train = n - min(n, int(np.floor(n * args.test_fraction + 0.5)))
    model = Model()
    if args.init == "ringrec":
        ringrec_init(model, args.seed, 16)
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    dense = torch.optim.Adam([p for name, p in model.named_parameters() if name.startswith("mlp")], lr=args.lr)
    sparse = torch.optim.SGD(model.sparse_params(), lr=args.sparse_lr)
    loss_fn = nn.BCEWithLogitsLoss(reduction="sum")
    start = time.perf_counter()
    for _ in range(args.epochs):
        for b0 in range(0, n_train, args.batch):
            b1 = min(b0 + args.batch, n_train)
            rows = rank_slice(b0, b1, rank, world)
            logits = net(torch.from_numpy(single[rows.start:rows.stop]), bag_batch(lists, rows))
            loss = loss_fn(logits, torch.from_numpy(labels[rows.start:rows.stop])) * (world / (b1 - b0))
            dense.zero_grad()
            sparse.zero_grad()
            loss.backward()
            dense.step()
            sparse.step()
    seconds = time.perf_counter() - start
    if rank == 0:
        with torch.no_grad():
            scores = []
            for b0 in range(n_train, n, 8192):
                rows = range(b0, min(b0 + 8192, n))
                scores.append(torch.sigmoid(model(torch.from_numpy(single[rows.start:rows.stop]), bag_batch(lists, rows))).numpy())
        scores = np.concatenate(scores) if scores else np.zeros(0)
        out.update(test_auc=auc(scores, labels[n_train:]), samples_per_s=n_train * args.epochs / seconds, seconds=seconds, rows=n, ranks=world, truncate=args.truncate, network="ringrec", inputs=model.mlp[0].in_features, seed=args.seed, init=args.init)
        if world > 1:
            print(json.dumps(out) if args.json else out, flush=True)
    if world > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--test-fraction", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=0.001, help="Adam's learning rate (ringrec's --lr)")
    p.add_argument("--sparse-lr", type=float, default=0.05)
    p.add_argument("--truncate", action="store_true")
    p.add_argument("--ddp", type=int, default=1)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--init", choices=("torch", "ringrec"), default="torch",
                   help="torch: the same distributions drawn by torch's generator; ringrec: the very values ringrec draws for --seed (its documented formulas)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.ddp > 1:
        torch.multiprocessing.spawn(run, args=(args.ddp, args, {}), nprocs=args.ddp)
        return
    out = {}
    run(0, 1, args, out)
    print(json.dumps(out) if args.json else out)


if __name__ == "__main__":
    main()
