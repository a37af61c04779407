"""torch.distributed in a Horovod-style script: after hvd.init() the default group is the
world (dist.*, DDP, new_group); after hvd.shutdown() it is gone."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import hvdlite.torch as hvd

hvd.init()
assert dist.is_initialized() and (dist.get_rank(), dist.get_world_size()) == (hvd.rank(), hvd.size())
total = torch.tensor([hvd.rank() + 1.0])
dist.all_reduce(total)
dist.barrier()
assert total.item() == hvd.size() * (hvd.size() + 1) / 2
torch.manual_seed(hvd.rank())  # different weights and data: DDP makes them agree
model = DDP(torch.nn.Linear(4, 1))
model(torch.randn(8, 4)).sum().backward()
grads = hvd.allgather(model.module.weight.grad.unsqueeze(0))
assert all(torch.equal(grads[0], g) for g in grads)
pair = dist.new_group([0, 1])
if hvd.rank() < 2:
    one = torch.ones(1)
    dist.all_reduce(one, group=pair)
    assert one.item() == 2
rank = hvd.rank()
hvd.shutdown()
assert not dist.is_initialized()
print("OK", rank, flush=True)
