"""A survivor left in a broadcast of a broken world that no socket cut reaches.

Cutting a group's sockets fails its pending collectives, unless gloo misses the cut: a pair
whose incoming message was meant for a collective that failed already reads no more, so it
sees neither the cut nor a peer's exit. Here every cut is a no-op, as if gloo missed it. In
round 1 (3 ranks), at step 2: rank 1 dies 1 s in; rank 2, the broadcast's root, is busy in
user code for $BUSY seconds; rank 0 waits in the broadcast and appends to
$LOG_DIR/waits.jsonl how long it waited and whether the broadcast failed or returned.
"""
import json
import os
import signal
import time

import torch

import hvdlite.torch as hvd
from hvdlite.torch import runtime
from hvdlite.worker import sockets

LOG_DIR = os.environ["LOG_DIR"]
BUSY = float(os.environ.get("BUSY", "8"))
sockets.cut = lambda fds, how=None: None  # every cut, whichever side it would shut


def drama():
    if hvd.rank() == 1:
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    elif hvd.rank() == 2:
        time.sleep(BUSY)
    else:
        start, outcome = time.monotonic(), "failed"
        try:
            hvd.broadcast(torch.zeros(1), root_rank=2)
            outcome = "returned"
        finally:
            with open(os.path.join(LOG_DIR, "waits.jsonl"), "a") as f:
                f.write(json.dumps({"waited": time.monotonic() - start, "outcome": outcome}) + "\n")


@hvd.elastic.run
def train(state):
    while state.step < 6:
        if runtime.info().round == 1 and hvd.size() == 3 and state.step == 2:
            drama()
        hvd.allreduce(torch.ones(1))
        state.step += 1
        state.commit()


hvd.init()
train(hvd.elastic.ObjectState(step=0))
