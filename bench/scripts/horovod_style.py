"""Benchmark worker written as Horovod users write them: hvd.init(), then a model and a
DistributedOptimizer, then @hvd.elastic.run. One SGD step per loop until $STOP_FILE exists.

Appends "time round rank size" for every completed step to $LOG_DIR/<pid>.log. With
BASELINE=torchrun the same model trains under torchrun on a plain gloo group.
"""
import os
import time

import torch

LOG = open(os.path.join(os.environ["LOG_DIR"], f"{os.getpid()}.log"), "a", buffering=1)
STOP = os.environ["STOP_FILE"]


def record(round_number, rank, size):
    LOG.write(f"{time.time():.6f} {round_number} {rank} {size}\n")


def stopping(allreduce_max):
    """Every rank stops at the same step (one seeing the file first would leave the other
    alone in its allreduce)."""
    return allreduce_max(torch.tensor([float(os.path.exists(STOP))])).item() > 0


def batch():
    return torch.randn(32, 64), torch.randint(0, 10, (32,))


if os.environ.get("BASELINE") == "torchrun":
    import torch.distributed as dist
    dist.init_process_group("gloo")
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def allreduce_max(t):
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t

    while not stopping(allreduce_max):
        optimizer.zero_grad()
        x, y = batch()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
        record(0, dist.get_rank(), dist.get_world_size())
        time.sleep(0.01)
else:
    import hvdlite.torch as hvd
    from hvdlite.torch import runtime

    hvd.init()
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())

    @hvd.elastic.run
    def train(state):
        while not stopping(lambda t: hvd.allreduce(t, op=hvd.Max)):
            optimizer.zero_grad()
            x, y = batch()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            record(runtime.info().round, hvd.rank(), hvd.size())
            state.step += 1
            state.commit()
            time.sleep(0.01)

    train(hvd.elastic.TorchState(model, optimizer, step=0))
