"""Elastic numpy training on hvdlite.numpy (pygloo, no torch), logged like elastic_job.py:
one JSON line per finished step in $LOG_DIR/steps.jsonl, rank 0's progress in $LOG_DIR/progress,
the final parameters in $LOG_DIR/final.<slot>.json. Knobs (env): TOTAL_STEPS, STEP_SLEEP, BATCH,
RESIZE (resize.py), RUN (logged, as in elastic_job.py), SLOW="slot:step:seconds" (that worker,
once, spends that long in user code before the step's allreduce, having made $LOG_DIR/slow),
HOLD_AT=N (every worker waits before step N until $LOG_DIR/go exists, at most 60 s).
"""
import json
import os
import time

import numpy as np

import hvdlite.numpy as hvd
import resize
from hvdlite.worker import env
from npdata import LR, gradient, shares

LOG_DIR = os.environ["LOG_DIR"]
TOTAL = int(os.environ.get("TOTAL_STEPS", "40"))
SLEEP = float(os.environ.get("STEP_SLEEP", "0.05"))
BATCH = int(os.environ.get("BATCH", "2"))
DATASET = 64
SLOT = os.environ[env.SLOT]
SLOW = os.environ.get("SLOW", "::").split(":")
HOLD_AT = int(os.environ.get("HOLD_AT", "-1"))


def write(name, text):
    with open(os.path.join(LOG_DIR, name + ".tmp"), "w") as f:
        f.write(text)
    os.replace(os.path.join(LOG_DIR, name + ".tmp"), os.path.join(LOG_DIR, name))


@hvd.elastic.run
def train(state):
    while state.step < TOTAL:
        resize.hold(state, state.step, hvd.size)
        deadline = time.monotonic() + 60
        while state.step == HOLD_AT and not os.path.exists(os.path.join(LOG_DIR, "go")) and time.monotonic() < deadline:
            time.sleep(0.05)
        world = shares(state.cursor, hvd.size(), BATCH, DATASET)
        if SLOW[0] == SLOT and state.step == int(SLOW[1]) and not os.path.exists(os.path.join(LOG_DIR, "slow")):
            write("slow", "")
            time.sleep(float(SLOW[2]))  # its heartbeats go on: time.sleep frees the GIL
        state.params = state.params - LR * hvd.allreduce(gradient(state.params, world[hvd.rank()]))
        with open(os.path.join(LOG_DIR, "steps.jsonl"), "a") as f:
            f.write(json.dumps({"step": state.step, "size": hvd.size(), "rank": hvd.rank(), "slot": SLOT,
                                "round": hvd.elastic.BACKEND.info().round, "pid": os.getpid(),
                                "run": int(os.environ.get("RUN", "0")),
                                "world": world}) + "\n")
        state.cursor += hvd.size() * BATCH
        state.step += 1
        if hvd.rank() == 0:
            write("progress", str(state.step))
        state.commit()
        time.sleep(SLEEP)
    write(f"final.{SLOT.replace('/', '_')}.json", json.dumps({"params": state.params.tolist()}))


hvd.init()
train(hvd.elastic.ObjectState(step=0, cursor=0, params=np.zeros(5)))
