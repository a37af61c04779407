"""An elastic job: survives workers dying and hosts coming and going.

hvdlite run -np 2 --min-np 1 --max-np 4 --host-discovery-script examples/discover_hosts.sh \
    python examples/elastic_train.py
"""
import os
import time

import torch

import hvdlite.torch as hvd

EPOCHS = int(os.environ.get("EPOCHS", "3"))
BATCH = 16

hvd.init()
torch.manual_seed(0)
dataset = torch.utils.data.TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
model = torch.nn.Linear(8, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
                                     named_parameters=model.named_parameters())


def on_reset():
    # The world changed size: scale the learning rate with it, as Horovod users do.
    for group in optimizer.param_groups:
        group["lr"] = 0.01 * hvd.size()
    print(f"rank {hvd.rank()}: new world of size {hvd.size()}", flush=True)


@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, EPOCHS):
        state.sampler.set_epoch(state.epoch)
        for batch_idx, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            state.sampler.record_batch(batch_idx, BATCH)
            state.commit()
            time.sleep(float(os.environ.get("STEP_SLEEP", "0.02")))
        if hvd.rank() == 0:
            print(f"epoch {state.epoch} done, loss {loss.item():.4f}, world size {hvd.size()}", flush=True)


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)
state.register_reset_callbacks([on_reset])
train(state)
