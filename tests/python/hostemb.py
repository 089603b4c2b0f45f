"""ringrec.torch.HostEmbedding + DistributedOptimizer against torch DDP (gloo) +
nn.Embedding(sparse=True): the same model (embeddings of 3 fields -> Linear), the same
initial weights (the host table's initial rows copied into the nn.Embedding), the same
shards, STEPS steps of SGD; every parameter and every row within 1e-5 on every rank, for
each sparse normalisation against its formula on DDP's averaged gradient g = sum / n:
  world     -> g                 (DDP's average)
  none      -> g * n             (the plain sum)
  frequency -> g * n / c_k       (c_k: the ranks whose batch held key k this step)
Then bad arguments raise naming the problem, the save/load round trip keeps every row,
and the EmbeddingBag form pools as torch's. Needs MASTER_ADDR/MASTER_PORT (gloo) and
SAVE_DIR (a directory every rank sees). Prints `hostemb ok rank R max_diff D`."""

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
V, D, FIELDS, B, LR = 40, 4, 3, 8, 0.2

g = torch.Generator().manual_seed(11)
keys_all = torch.randint(0, V, (steps, n, B, FIELDS), generator=g)  # step, rank, batch, field
y_all = torch.randn(steps, n, B, 1, generator=g)

dist.init_process_group("gloo", rank=r, world_size=n)


class Model(torch.nn.Module):
    def __init__(self, emb):
        super().__init__()
        self.emb = emb
        self.top = torch.nn.Linear(FIELDS * D, 1)

    def forward(self, k):
        return self.top(self.emb(k).reshape(k.shape[0], -1))


def holders(s):
    """c_k at step s: how many ranks' batches hold key k."""
    c = torch.zeros(V)
    for q in range(n):
        c[torch.unique(keys_all[s, q])] += 1
    return c


worst = 0.0
for norm in ("world", "none", "frequency"):
    emb = hvd.HostEmbedding(num_embeddings=V, embedding_dim=D, lr=LR, sparse_normalize=norm, seed=5)
    ours = Model(emb)
    torch.manual_seed(100 + r)  # a different init on every rank: the broadcast fixes it
    ours.top.reset_parameters()
    hvd.broadcast_parameters(ours.top.state_dict(), root_rank=0)
    everything = torch.arange(V)
    with torch.no_grad():
        initial = emb(everything)
    ref_emb = torch.nn.Embedding(V, D, sparse=True)
    with torch.no_grad():
        ref_emb.weight.copy_(initial)
    theirs = Model(ref_emb)
    theirs.top.load_state_dict(ours.top.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(theirs)

    opt = hvd.DistributedOptimizer(torch.optim.SGD(ours.top.parameters(), lr=LR),
                                   named_parameters=ours.top.named_parameters(), sparse=ours)
    ref = torch.optim.SGD(ddp.parameters(), lr=LR)
    for s in range(steps):
        k, y = keys_all[s, r], y_all[s, r]
        opt.zero_grad()
        F.mse_loss(ours(k), y).backward()
        opt.step()
        ref.zero_grad()
        F.mse_loss(ddp(k), y).backward()
        grad = ref_emb.weight.grad.coalesce()
        if norm != "world":
            scale = torch.full((V,), float(n)) if norm == "none" else n / holders(s).clamp(min=1)
            grad.values().mul_(scale[grad.indices()[0]].unsqueeze(1))
        ref_emb.weight.grad = grad
        ref.step()

    with torch.no_grad():
        rows = emb(everything)
    diff_rows = (rows - ref_emb.weight.detach()).abs().max().item()
    diff_top = max((a - b).abs().max().item() for a, b in zip(ours.top.parameters(), theirs.top.parameters()))
    moved = (rows - initial).abs().max().item()
    assert diff_rows <= 1e-5 and diff_top <= 1e-5, \
        "rank %d, sparse_normalize=%s: rows differ from DDP's by %g, the dense layer by %g" % (r, norm, diff_rows, diff_top)
    assert moved > 1e-3, "rank %d, sparse_normalize=%s: the table did not train" % (r, norm)
    # Every rank reads the same rows (one table per host, every host the same).
    assert torch.equal(hvd.broadcast(rows, 0, name="rows." + norm), rows), "rank %d: tables differ" % r
    worst = max(worst, diff_rows, diff_top)
    if norm != "frequency":
        emb.close()


# Bad arguments: each raises on every rank, before any collective.
raises(TypeError, ["int64", "float32"], lambda: emb(torch.zeros(3)))
raises(TypeError, ["int64", "int32"], lambda: emb(torch.zeros(3, dtype=torch.int32)))
raises(ValueError, ["negative"], lambda: emb(torch.tensor([1, -2])))
raises(IndexError, ["num_embeddings"], lambda: emb(torch.tensor([V])))
raises(ValueError, ["offsets", "mode"], lambda: emb(torch.tensor([1, 2]), torch.tensor([0])))
raises(TypeError, ["bogus_option"], lambda: hvd.HostEmbedding(embedding_dim=D, bogus_option=1))
raises(ValueError, ["sparse_normalize", "often"], lambda: hvd.HostEmbedding(embedding_dim=D, sparse_normalize="often"))
raises(ValueError, ["already open", emb.name], lambda: hvd.HostEmbedding(embedding_dim=D, name=emb.name))
raises(TypeError, ["HostEmbedding", "Linear"], lambda: hvd.SparseOptimizer([torch.nn.Linear(2, 2)]))

# Save and load: every row comes back.
path = os.path.join(os.environ["SAVE_DIR"], "table.bin")
with torch.no_grad():
    before = emb(torch.arange(V))
emb.save(path)
emb.close()
back = hvd.HostEmbedding.load(path, sparse_normalize="frequency")
with torch.no_grad():
    after = back(torch.arange(V))
assert torch.equal(before, after), "rank %d: the loaded table differs by %g" % (r, (before - after).abs().max().item())
assert 0 < back.size()[1] <= V, "rank %d: %s rows" % (r, back.size())

# The EmbeddingBag form: sum and mean as torch's over the same rows.
bags, offsets = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6]), torch.tensor([0, 2, 2, 5])
for mode in ("sum", "mean"):
    back.mode = mode
    with torch.no_grad():
        got = back(bags, offsets)
        got2 = back(bags[:6].reshape(2, 3))
    want = F.embedding_bag(bags, after, offsets, mode=mode)
    want2 = F.embedding_bag(bags[:6].reshape(2, 3), after, mode=mode)
    assert torch.allclose(got, want, atol=1e-6) and torch.allclose(got2, want2, atol=1e-6), "rank %d: %s bags differ" % (r, mode)
back.close()

print("hostemb ok rank %d max_diff %.3g" % (r, worst), flush=True)
dist.destroy_process_group()
