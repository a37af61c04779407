"""Benchmark worker: one small allreduce + commit per step until $STOP_FILE exists (with
DDP=1: one DistributedDataParallel training step instead, the model in the TorchState).

Appends "time round rank size" for every completed step to $LOG_DIR/<pid>.log. Runs under
`hvdlite run` (elastic) or, with BASELINE=torchrun, under torchrun with a plain gloo group.
"""
import os
import time

import torch

LOG = open(os.path.join(os.environ["LOG_DIR"], f"{os.getpid()}.log"), "a", buffering=1)
STOP = os.environ["STOP_FILE"]


DDP = os.environ.get("DDP") == "1"


def record(round_number, rank, size):
    LOG.write(f"{time.time():.6f} {round_number} {rank} {size}\n")


def ddp(init_sync=True):
    """A DDP model on the default group and its optimizer's step."""
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64), init_sync=init_sync)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        optimizer.zero_grad()
        model(torch.ones(8, 64)).sum().backward()
        optimizer.step()
    return model, optimizer, step


if os.environ.get("BASELINE") == "torchrun":
    import torch.distributed as dist
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # torchrun re-creates the group under the same store keys after a restart, and gloo then
    # reads the dead attempt's addresses (DESIGN.md): a prefix per attempt avoids that hang.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    step = ddp()[2] if DDP else lambda: dist.all_reduce(torch.ones(1))
    while not os.path.exists(STOP):
        step()
        record(attempt, dist.get_rank(), dist.get_world_size())
        time.sleep(0.01)
else:
    import hvdlite.torch as hvd
    from hvdlite.torch import runtime

    hvd.init()
    if DDP:
        # init_sync=False: a worker joining a running world builds it before run(), where its
        # peers sync; the state's sync broadcasts the parameters instead (docs/torchrun.md).
        model, optimizer, step = ddp(init_sync=False)
        state = hvd.elastic.TorchState(model, optimizer, step=0)
    else:
        def step():
            hvd.allreduce(torch.ones(1), op=hvd.Sum)
        state = hvd.elastic.ObjectState(step=0)

    @hvd.elastic.run
    def train(state):
        while not os.path.exists(STOP):
            step()
            record(runtime.info().round, hvd.rank(), hvd.size())
            state.step += 1
            state.commit()
            time.sleep(0.01)

    train(state)
