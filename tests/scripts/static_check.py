"""Checks every collective and DistributedOptimizer on every rank; prints 'OK <rank>'."""
import os
import time

import torch

import hvdlite.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
assert (r, n) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
assert hvd.local_rank() == int(os.environ["HVDLITE_LOCAL_RANK"]) and hvd.local_size() <= n
assert 0 <= hvd.cross_rank() < hvd.cross_size()

x = torch.tensor([float(r + 1), -float(r)])
ranks = torch.arange(n, dtype=torch.float32)
assert torch.equal(hvd.allreduce(x, op=hvd.Sum), torch.stack([(ranks + 1).sum(), -ranks.sum()]))
assert torch.allclose(hvd.allreduce(x), torch.stack([(ranks + 1).mean(), -ranks.mean()]))
assert torch.equal(hvd.allreduce(x, op=hvd.Min), torch.tensor([1.0, -(n - 1.0)]))
assert torch.equal(hvd.allreduce(x, op=hvd.Max), torch.tensor([float(n), 0.0]))
a, b = hvd.grouped_allreduce([x, x * 2], op=hvd.Sum)
assert torch.equal(b, a * 2)

time.sleep(1.2)  # outlive a few heartbeats: a static world must stay intact

gathered = hvd.allgather(torch.full((r + 1, 2), float(r)))  # first dimension differs per rank
assert gathered.shape == (n * (n + 1) // 2, 2)
assert torch.equal(gathered[:, 0], torch.cat([torch.full((k + 1,), float(k)) for k in range(n)]))
root = n - 1
assert torch.equal(hvd.broadcast(torch.tensor([float(r)]), root_rank=root), torch.tensor([float(root)]))
assert hvd.broadcast_object({"from": r}, root_rank=root) == {"from": root}
assert hvd.allgather_object(r * 10) == [k * 10 for k in range(n)]
hvd.barrier()

# DistributedOptimizer on n shards == one process on the concatenated batch.
def rows(k):
    g = torch.Generator().manual_seed(100 + k)
    return torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)


def model_and_opt(distributed):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if distributed:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    return model, opt


model, opt = model_and_opt(True)
ref, ref_opt = model_and_opt(False)
all_x = torch.cat([rows(k)[0] for k in range(n)])
all_y = torch.cat([rows(k)[1] for k in range(n)])
for step in range(5):
    xs, ys = rows(r)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(xs), ys).backward()
    opt.step()
    ref_opt.zero_grad()
    torch.nn.functional.mse_loss(ref(all_x), all_y).backward()
    ref_opt.step()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
assert torch.allclose(flat, torch.cat([p.detach().flatten() for p in ref.parameters()]), atol=1e-5)
replicas = hvd.allgather(flat.unsqueeze(0))
assert all(torch.equal(replicas[0], replicas[k]) for k in range(n)), "replicas differ"
print(f"OK {r}")
