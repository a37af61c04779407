"""An elastic job: survives workers dying and hosts coming and going.

hvdlite run -np 2 --min-np 1 --max-np 4 --host-discovery-script examples/discover_hosts.sh \
    python examples/elastic_train.py

To show what that means in the first minute, the second worker kills itself (kill -9) once,
in epoch 1: the survivor rolls back to its last commit and goes on alone; then the discovery
script offers a third slot, and a new worker joins. DEMO_FAULTS=0 turns the kill off.
"""
import os
import signal
import time

import torch

import hvdlite.torch as hvd

EPOCHS = int(os.environ.get("EPOCHS", "12"))
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
    for epoch in range(state.epoch, EPOCHS):
        state.sampler.set_epoch(epoch)
        for batch_idx, (x, y) in enumerate(loader):
            if epoch == 1 and batch_idx == 5 and os.environ.get("DEMO_FAULTS") != "0" \
                    and os.environ.get("HVDLITE_WORKER_ID") == "localhost/1#1":  # its first launch
                print(f"rank {hvd.rank()}: the demo kills this worker (kill -9)", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            state.sampler.record_batch(batch_idx, BATCH)
            state.loss = loss.item()  # in the state: a rollback to the epoch's last commit runs no batch
            state.commit()
            time.sleep(float(os.environ.get("STEP_SLEEP", "0.05")))
        if hvd.rank() == 0:
            print(f"epoch {epoch} done, loss {state.loss:.4f}, world size {hvd.size()}", flush=True)
        state.epoch = epoch + 1  # committed done: a rerun of a finished job trains nothing
        state.commit()


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, loss=float("nan"))
state.register_reset_callbacks([on_reset])
train(state)
