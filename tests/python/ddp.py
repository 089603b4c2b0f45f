"""ringrec.torch.DistributedOptimizer against torch DDP (gloo): the same small model, the
same initial weights (broadcast from rank 0 by ringrec), the same shards, N steps of SGD
with momentum; every parameter within 1e-5 on every rank. Needs MASTER_ADDR/MASTER_PORT
for gloo. Prints `ddp ok rank R max_diff D`."""

import os

import torch
import torch.distributed as dist

import ringrec.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
steps = int(os.environ.get("STEPS", "8"))
torch.manual_seed(1234 + r)  # a different init on every rank: the broadcast must fix it
torch.set_num_threads(1)


def model():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 1))


ours = model()
hvd.broadcast_parameters(ours.state_dict(), root_rank=0)
theirs = model()
theirs.load_state_dict(ours.state_dict())

dist.init_process_group("gloo", rank=r, world_size=n)
ddp = torch.nn.parallel.DistributedDataParallel(theirs)

opt = hvd.DistributedOptimizer(torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9),
                               named_parameters=ours.named_parameters())
ref = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
hvd.broadcast_optimizer_state(opt, root_rank=0)

g = torch.Generator().manual_seed(7)
x_all = torch.randn(steps, n, 32, 16, generator=g)  # step, rank's shard, batch, features
y_all = torch.randn(steps, n, 32, 1, generator=g)
loss_fn = torch.nn.MSELoss()
for s in range(steps):
    x, y = x_all[s, r], y_all[s, r]
    opt.zero_grad()
    loss_fn(ours(x), y).backward()
    opt.step()
    ref.zero_grad()
    loss_fn(ddp(x), y).backward()
    ref.step()

diff = max((a - b).abs().max().item() for a, b in zip(ours.parameters(), theirs.parameters()))
moved = max((a - b).abs().max().item() for a, b in zip(ours.parameters(), model().parameters()))
assert diff <= 1e-5, "rank %d: DistributedOptimizer differs from DDP by %g" % (r, diff)
assert moved > 1e-3, "rank %d: the model did not train" % r
# Every rank holds the same parameters.
flat = torch.cat([p.detach().reshape(-1) for p in ours.parameters()])
assert torch.equal(hvd.broadcast(flat, 0, name="final"), flat), "rank %d: replicas differ" % r
print("ddp ok rank %d max_diff %.3g" % (r, diff), flush=True)
dist.destroy_process_group()
