"""A training script as a user edits it between runs on the same --checkpoint-dir, on either
backend (BACKEND=torch|numpy). Its state holds a class of its own, trusted for checkpoints.

Knobs (env): CLASS (the name the script gives that class: renaming it is the edit), WIDTH (the
model's width: changing it changes a tensor's shape), TRUST=0 (the script forgets to trust its
class), TOTAL_STEPS, STEP_SLEEP. Rank 0 writes
the step it last committed to $LOG_DIR/progress; every rank appends its steps to
$LOG_DIR/steps.txt as "run step".
"""
import os
import time

import numpy as np

from progress import write_progress

LOG_DIR = os.environ["LOG_DIR"]
TOTAL = int(os.environ.get("TOTAL_STEPS", "20"))
SLEEP = float(os.environ.get("STEP_SLEEP", "0.05"))
WIDTH = int(os.environ.get("WIDTH", "2"))
RUN = os.environ.get("RUN", "0")
TRUSTED = os.environ.get("TRUST", "1") == "1"


class Config:
    def __init__(self, lr):
        self.lr = lr


Config.__name__ = Config.__qualname__ = os.environ.get("CLASS", "Config")
globals()[Config.__name__] = Config

if os.environ.get("BACKEND") == "numpy":
    import hvdlite.numpy as hvd
    if TRUSTED:
        hvd.elastic.trust(Config)  # before init: init reports the commit it can load
    hvd.init()
    state = hvd.elastic.ObjectState(step=0, cfg=Config(0.1), w=np.zeros((WIDTH, 4)))

    def train_step(state):
        state.w = state.w + state.cfg.lr * hvd.allreduce(np.ones((WIDTH, 4)))
else:
    import torch
    import hvdlite.torch as hvd
    if TRUSTED:
        hvd.elastic.trust(Config)  # before init: init reports the commit it can load
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, WIDTH)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = hvd.elastic.TorchState(model, optimizer, step=0, cfg=Config(0.1))

    def train_step(state):
        optimizer.zero_grad()
        loss = model(torch.ones(3, 4)).pow(2).sum()
        loss.backward()
        for p in model.parameters():
            p.grad = hvd.allreduce(p.grad)
        optimizer.step()


@hvd.elastic.run
def train(state):
    while state.step < TOTAL:
        train_step(state)
        state.step += 1
        with open(os.path.join(LOG_DIR, "steps.txt"), "a") as f:
            f.write(f"{RUN} {state.step}\n")
        if hvd.rank() == 0:
            write_progress(LOG_DIR, state.step)
        state.commit()
        time.sleep(SLEEP)


train(state)
