"""Several ringrec.torch.HostEmbeddings in one process: two tables of different sizes and
dims (a table per feature, as a DLRM or TorchRec's EmbeddingBagCollection has) trained
together with DistributedOptimizer equal torch DDP (gloo) + two nn.Embedding(sparse=True)
under hostemb.py's reference settings (same initial rows, shards, SGD; `world` is DDP's
average, `frequency` DDP's times n / c_k); every row and parameter within 1e-5. Then both
tables are saved, closed, loaded back by name, and trained on: still DDP's. Ranks that
open different names or dims get a ValueError saying what each opened (no hang), and a
name open already is a ValueError naming it. Needs MASTER_ADDR/MASTER_PORT (gloo) and
SAVE_DIR (a directory every rank sees). Prints `tables ok rank R max_diff D`."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import ringrec.torch as hvd
from checks import raises

hvd.init()
r, n = hvd.rank(), hvd.size()
steps = int(os.environ.get("STEPS", "6"))
torch.set_num_threads(1)
# Table "user": 40 keys of dim 4, two fields; the other (auto-named): 25 keys of dim 3, one field.
VA, DA, FA = 40, 4, 2
VB, DB, FB = 25, 3, 1
B, LR, MORE = 8, 0.2, 2

g = torch.Generator().manual_seed(13)
keys_a = torch.randint(0, VA, (steps + MORE, n, B, FA), generator=g)  # step, rank, batch, field
keys_b = torch.randint(0, VB, (steps + MORE, n, B, FB), generator=g)
y_all = torch.randn(steps + MORE, n, B, 1, generator=g)

dist.init_process_group("gloo", rank=r, world_size=n)


class Model(torch.nn.Module):
    def __init__(self, a, b):
        super().__init__()
        self.a, self.b = a, b
        self.top = torch.nn.Linear(FA * DA + FB * DB, 1)

    def forward(self, ka, kb):
        return self.top(torch.cat([self.a(ka).reshape(ka.shape[0], -1), self.b(kb).reshape(kb.shape[0], -1)], 1))


def holders(keys, s, v):
    """c_k at step s: how many ranks' batches hold key k of a table."""
    c = torch.zeros(v)
    for q in range(n):
        c[torch.unique(keys[s, q])] += 1
    return c


def normalised(ref_emb, keys, s, v, norm):
    """DDP's averaged gradient of ref_emb turned into what `norm` applies."""
    grad = ref_emb.weight.grad.coalesce()
    if norm == "frequency":
        scale = n / holders(keys, s, v).clamp(min=1)
        grad.values().mul_(scale[grad.indices()[0]].unsqueeze(1))
    ref_emb.weight.grad = grad


def reference(a, b, ours):
    """DDP over nn.Embedding(sparse=True) copies of the tables' rows and ours' top layer."""
    ref_a, ref_b = torch.nn.Embedding(VA, DA, sparse=True), torch.nn.Embedding(VB, DB, sparse=True)
    with torch.no_grad():
        ref_a.weight.copy_(a(torch.arange(VA)))
        ref_b.weight.copy_(b(torch.arange(VB)))
    theirs = Model(ref_a, ref_b)
    theirs.top.load_state_dict(ours.top.state_dict())
    return theirs, torch.nn.parallel.DistributedDataParallel(theirs)


def train(ours, theirs, ddp, norm, first, last):
    opt = hvd.DistributedOptimizer(torch.optim.SGD(ours.top.parameters(), lr=LR),
                                   named_parameters=ours.top.named_parameters(), sparse=ours)
    ref = torch.optim.SGD(ddp.parameters(), lr=LR)
    for s in range(first, last):
        ka, kb, y = keys_a[s, r], keys_b[s, r], y_all[s, r]
        opt.zero_grad()
        F.mse_loss(ours(ka, kb), y).backward()
        opt.step()
        ref.zero_grad()
        F.mse_loss(ddp(ka, kb), y).backward()
        normalised(theirs.a, keys_a, s, VA, norm)
        normalised(theirs.b, keys_b, s, VB, norm)
        ref.step()


def differences(ours, theirs, what):
    with torch.no_grad():
        rows_a, rows_b = ours.a(torch.arange(VA)), ours.b(torch.arange(VB))
    d = max((rows_a - theirs.a.weight.detach()).abs().max().item(), (rows_b - theirs.b.weight.detach()).abs().max().item(),
            max((x - y).abs().max().item() for x, y in zip(ours.top.parameters(), theirs.top.parameters())))
    assert d <= 1e-5, "rank %d, %s: the two tables' model differs from DDP's by %g" % (r, what, d)
    for name, rows in (("a", rows_a), ("b", rows_b)):
        assert torch.equal(hvd.broadcast(rows, 0, name="rows.%s.%s" % (what, name)), rows), "rank %d: tables differ" % r
    return d


worst = 0.0
for norm in ("world", "frequency"):
    a = hvd.HostEmbedding(num_embeddings=VA, embedding_dim=DA, lr=LR, sparse_normalize=norm, seed=5, name="user")
    b = hvd.HostEmbedding(num_embeddings=VB, embedding_dim=DB, lr=LR, sparse_normalize=norm, seed=6)
    assert a.name == "user" and b.name.startswith("HostEmbedding."), (a.name, b.name)
    ours = Model(a, b)
    torch.manual_seed(100 + r)  # a different init on every rank: the broadcast fixes it
    ours.top.reset_parameters()
    hvd.broadcast_parameters(ours.top.state_dict(), root_rank=0)
    with torch.no_grad():
        initial_b = b(torch.arange(VB))
    theirs, ddp = reference(a, b, ours)
    train(ours, theirs, ddp, norm, 0, steps)
    worst = max(worst, differences(ours, theirs, norm))
    with torch.no_grad():
        assert (b(torch.arange(VB)) - initial_b).abs().max().item() > 1e-3, "rank %d: table b did not train" % r
    if norm == "world":
        a.close()
        b.close()


# A name open already; ranks opening different names or dims: errors, not hangs.
raises(ValueError, ["already open", "user"], lambda: hvd.HostEmbedding(embedding_dim=DA, name="user"))
if n > 1:
    raises(ValueError, ["different host tables", "rank 0", "rank 1", "odd.0", "odd.1"],
           lambda: hvd.HostEmbedding(embedding_dim=DA, name="odd.%d" % r))
    raises(ValueError, ["different host tables", "dim %d" % DA, "dim %d" % (DA + 1)],
           lambda: hvd.HostEmbedding(embedding_dim=DA + (r % 2), name="odd"))

# Checkpoint both, restore both by name, train on: still DDP's.
paths = [os.path.join(os.environ["SAVE_DIR"], t + ".bin") for t in ("a", "b")]
a.save(paths[0])
b.save(paths[1])
top = {k: v.clone() for k, v in ours.top.state_dict().items()}
a.close()
b.close()
a = hvd.HostEmbedding.load(paths[0], name="user", lr=LR, sparse_normalize="frequency")
b = hvd.HostEmbedding.load(paths[1], name="item", lr=LR, sparse_normalize="frequency")
assert (a.embedding_dim, b.embedding_dim) == (DA, DB), (a.embedding_dim, b.embedding_dim)
ours = Model(a, b)
ours.top.load_state_dict(top)
worst = max(worst, differences(ours, theirs, "restored"))
train(ours, theirs, ddp, "frequency", steps, steps + MORE)
worst = max(worst, differences(ours, theirs, "after restore"))
a.close()
b.close()

print("tables ok rank %d max_diff %.3g" % (r, worst), flush=True)
dist.destroy_process_group()
