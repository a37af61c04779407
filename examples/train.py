"""A small data-parallel job: `hvdlite run -np 2 python examples/train.py`."""
import torch

import hvdlite.torch as hvd

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                     named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

true_w = torch.arange(8, dtype=torch.float32).unsqueeze(1) / 8
for step in range(100):
    g = torch.Generator().manual_seed(step * hvd.size() + hvd.rank())  # each rank its own shard
    x = torch.randn(32, 8, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), x @ true_w)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 20 == 0:
        avg = hvd.allreduce(loss.detach(), name="loss")
        if hvd.rank() == 0:
            print(f"step {step:3d}  loss {avg.item():.5f}  world size {hvd.size()}")
if hvd.rank() == 0:
    print("done")
