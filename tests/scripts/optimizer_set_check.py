"""A DistributedOptimizer on the even ranks' process set: the even ranks average their
gradients, the odd ones keep their own, as in Horovod. Prints 'OK' on every rank."""
import torch

import hvdlite.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
evens = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
model = torch.nn.Linear(2, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), process_set=evens)
model(torch.ones(1, 2) * (rank + 1)).sum().backward()
mine = model.weight.grad.clone()
opt.step()
everyone = hvd.allgather_object(mine)
if rank % 2:
    assert torch.equal(model.weight.grad, mine)
else:
    assert torch.allclose(model.weight.grad, sum(everyone[0::2]) / len(everyone[0::2]))
print("OK", flush=True)
