"""Benchmark worker: one small allreduce + commit per step until $STOP_FILE exists.

Appends "time round rank size" for every completed allreduce to $LOG_DIR/<pid>.log. Runs under
`hvdlite run` (elastic) or, with BASELINE=torchrun, under torchrun with a plain gloo group.
"""
import os
import time

import torch

LOG = open(os.path.join(os.environ["LOG_DIR"], f"{os.getpid()}.log"), "a", buffering=1)
STOP = os.environ["STOP_FILE"]


def record(round_number, rank, size):
    LOG.write(f"{time.time():.6f} {round_number} {rank} {size}\n")


if os.environ.get("BASELINE") == "torchrun":
    import torch.distributed as dist
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # torchrun re-creates the group under the same store keys after a restart, and gloo then
    # reads the dead attempt's addresses (DESIGN.md): a prefix per attempt avoids that hang.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    while not os.path.exists(STOP):
        dist.all_reduce(torch.ones(1))
        record(attempt, dist.get_rank(), dist.get_world_size())
        time.sleep(0.01)
else:
    import hvdlite.torch as hvd
    from hvdlite.torch import runtime

    @hvd.elastic.run
    def train(state):
        while not os.path.exists(STOP):
            hvd.allreduce(torch.ones(1), op=hvd.Sum)
            record(runtime.info().round, hvd.rank(), hvd.size())
            state.step += 1
            state.commit()
            time.sleep(0.01)

    hvd.init()
    train(hvd.elastic.ObjectState(step=0))
