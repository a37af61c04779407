"""torch.distributed in a Horovod-style script: after hvd.init() the default group is the
world (dist.*, DDP, new_group), as torch sees a gloo group: its backend is "gloo", it serves
host and CUDA tensors, and groups made from it get the job's collective timeout; after
hvd.shutdown() it is gone."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import hvdlite.torch as hvd

hvd.init()
assert dist.is_initialized() and (dist.get_rank(), dist.get_world_size()) == (hvd.rank(), hvd.size())
assert dist.get_backend() == "gloo", dist.get_backend()
world = dist.group.WORLD
# CUDA tensors have a backend (gloo's, which stages them through host memory), as under stock gloo
assert world._get_backend(torch.device("cuda")) is world._get_backend(torch.device("cpu"))
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
    assert pair._get_backend(torch.device("cpu")).options._timeout.total_seconds() == 30  # the job's
# A world whose CUDA tensors take NCCL hands them to its NCCL group (a gloo one stands in here)
from hvdlite.torch import defaultgroup
stand_in = pair._get_backend(torch.device("cpu")) if hvd.rank() < 2 else world._get_backend(torch.device("cpu"))
defaultgroup.carry_cuda(stand_in)
assert dist.get_backend() == "nccl" and world._get_backend(torch.device("cuda")) is stand_in
assert world._get_backend(torch.device("cpu")) is not stand_in or hvd.rank() >= 2
rank = hvd.rank()
hvd.shutdown()
assert not dist.is_initialized()
print("OK", rank, flush=True)
