"""A torchrun script as people write them: env:// init, DDP, DistributedSampler, all_reduce,
barrier. Each rank writes OUT_DIR/rank<r>.json: torchrun's variables as it saw them, the store
env:// gave it, its groups' collective timeouts, and a hash of the final parameters."""
import hashlib
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_USE_AGENT_STORE")

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
sampler = DistributedSampler(data, shuffle=True, seed=1)
loader = DataLoader(data, batch_size=16, sampler=sampler)
for epoch in range(2):
    sampler.set_epoch(epoch)
    total = torch.zeros(1)
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.detach()
    dist.all_reduce(total)
    dist.barrier()
pair = dist.new_group([0, 1])  # a group of another size through the same store
if rank < 2:
    one = torch.ones(1)
    dist.all_reduce(one, group=pair)
    assert one.item() == 2
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
store = dist.distributed_c10d._get_default_store()
while hasattr(store, "underlying_store"):
    store = store.underlying_store
timeouts = [g._get_backend(torch.device("cpu")).options._timeout.total_seconds()
            for g in (dist.group.WORLD, pair) if g != dist.GroupMember.NON_GROUP_MEMBER]
with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as f:
    json.dump({"env": {k: os.environ.get(k) for k in TORCHRUN}, "store": type(store).__name__,
               "timeouts": timeouts, "params": digest, "loss": total.item()}, f)
dist.destroy_process_group()
