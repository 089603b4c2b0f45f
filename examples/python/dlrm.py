"""A DLRM-style model in PyTorch on ringrec: the 26 categorical fields' embeddings in one
host-shared table (ringrec.torch.HostEmbedding, one copy per host), the dense layers under
ringrec.torch.DistributedOptimizer (Horovod's), reading a Criteo TSV (`ringrec data synth
--out train.tsv` makes one).

    mpirun -np 2 python examples/python/dlrm.py --data train.tsv --steps 200

Each rank trains on its slice of every global batch (--batch rows per rank); the last
--eval-rows rows of the file are held out, and rank 0 prints their AUC at the end. With
--ddp the same model runs under torch DDP (gloo) with nn.Embedding(sparse=True) per rank
(keys hashed into --buckets rows), the reference of scripts/bench/python_dlrm.sh; it needs
MASTER_ADDR/MASTER_PORT, and ringrec is not used at all.
"""

import argparse
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

NUM_DENSE, NUM_SPARSE = 13, 26
# Each field's keys in their own range: field << 40 | the value's low 40 bits.
FIELD_SHIFT = 40


def read_criteo(path):
    """(labels float32 [N], dense float32 [N, 13] as log1p, keys int64 [N, 26])."""
    labels, dense, keys = [], [], []
    missing = (1 << FIELD_SHIFT) - 1
    with open(path) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if len(cols) != 1 + NUM_DENSE + NUM_SPARSE:
                continue
            labels.append(float(cols[0]))
            dense.append([float(c) if c else 0.0 for c in cols[1:1 + NUM_DENSE]])
            keys.append([(i << FIELD_SHIFT) | (int(c, 16) % missing if c else missing)
                         for i, c in enumerate(cols[1 + NUM_DENSE:])])
    dense = np.log1p(np.maximum(np.asarray(dense, np.float32), 0.0))
    return (torch.tensor(np.asarray(labels, np.float32)), torch.from_numpy(dense),
            torch.tensor(np.asarray(keys, np.int64)))


def mlp(sizes):
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


class Dlrm(torch.nn.Module):
    """Bottom MLP over the dense features, pairwise dot products of the 27 vectors, top MLP."""

    def __init__(self, emb, dim):
        super().__init__()
        self.emb = emb
        self.bottom = mlp([NUM_DENSE, 64, dim])
        pairs = (NUM_SPARSE + 1) * NUM_SPARSE // 2
        self.top = mlp([dim + pairs, 64, 1])
        self.iu = torch.triu_indices(NUM_SPARSE + 1, NUM_SPARSE + 1, offset=1)

    def forward(self, dense, keys):
        x = self.bottom(dense)
        z = torch.cat([x.unsqueeze(1), self.emb(keys)], dim=1)  # batch, 27, dim
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.iu[0], self.iu[1]]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)


def auc(labels, scores):
    """The area under the ROC curve (ties averaged)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    s = scores[order]
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    pos = labels > 0.5
    npos, nneg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - npos * (npos + 1) / 2) / max(npos * nneg, 1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=256, help="rows per rank per step")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05, help="the dense layers' SGD step")
    p.add_argument("--sparse-lr", type=float, default=0.05, help="the table's SGD step")
    p.add_argument("--eval-rows", type=int, default=2000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ddp", action="store_true", help="torch DDP + nn.Embedding(sparse=True) instead of ringrec")
    p.add_argument("--buckets", type=int, default=1 << 20, help="--ddp: rows of each rank's nn.Embedding")
    a = p.parse_args()
    torch.set_num_threads(a.threads)

    if a.ddp:
        import torch.distributed as dist
        r, n = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")), int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
        dist.init_process_group("gloo", rank=r, world_size=n)
        emb = torch.nn.Embedding(a.buckets, a.dim, sparse=True)
        torch.nn.init.uniform_(emb.weight, -a.dim ** -0.5, a.dim ** -0.5)
        hashed = _Hashed(emb, a.buckets)
        torch.manual_seed(1)
        model = torch.nn.parallel.DistributedDataParallel(Dlrm(hashed, a.dim))
        opt = torch.optim.SGD([{"params": [p for n_, p in model.named_parameters() if "emb" not in n_], "lr": a.lr},
                               {"params": emb.parameters(), "lr": a.sparse_lr}])
        sparse = None
    else:
        import ringrec.torch as hvd
        hvd.init()
        r, n = hvd.rank(), hvd.size()
        emb = hvd.HostEmbedding(embedding_dim=a.dim, lr=a.sparse_lr, sparse_normalize="world")
        torch.manual_seed(1)
        model = Dlrm(emb, a.dim)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=a.lr),
                                       named_parameters=model.named_parameters(), sparse=model)
        sparse = emb

    labels, dense, keys = read_criteo(a.data)
    train_rows = len(labels) - a.eval_rows
    if train_rows < a.batch * n:
        raise SystemExit("dlrm: %s has %d rows, fewer than one global batch (%d) plus --eval-rows" % (a.data, len(labels), a.batch * n))
    per_epoch = train_rows // (a.batch * n)
    start = time.perf_counter()
    for step in range(a.steps):
        t = step % per_epoch
        lo = (t * n + r) * a.batch
        sl = slice(lo, lo + a.batch)
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(dense[sl], keys[sl]), labels[sl])
        loss.backward()
        opt.step()
        if step % 50 == 0 and r == 0:
            print("dlrm: step %d loss %.4f" % (step, loss.item()), flush=True)
    seconds = time.perf_counter() - start

    model.eval()
    with torch.no_grad():
        ev = slice(train_rows, len(labels))
        scores = torch.sigmoid(model(dense[ev], keys[ev])).numpy()
    result = auc(labels[ev].numpy(), scores)
    if r == 0:
        print("dlrm: done %s ranks %d steps %d global_batch %d samples_per_s %.1f eval_auc %.5f"
              % ("ddp" if a.ddp else "ringrec", n, a.steps, a.batch * n, a.steps * a.batch * n / seconds, result), flush=True)
    if sparse is not None:
        sparse.close()


class _Hashed(torch.nn.Module):
    """--ddp: keys hashed into an nn.Embedding's rows."""

    def __init__(self, emb, buckets):
        super().__init__()
        self.emb, self.buckets = emb, buckets

    def forward(self, keys):
        return self.emb((keys * 0x9E3779B1) % self.buckets)


if __name__ == "__main__":
    main()
