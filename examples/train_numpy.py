"""Elastic linear regression on the numpy backend: no torch, workers on pygloo (CPython 3.8-3.10).

python3.10 -m venv venv && venv/bin/pip install pygloo numpy cloudpickle && venv/bin/pip install -e .
hvdlite run -np 2 --min-np 1 venv/bin/python examples/train_numpy.py

Every step each rank computes the gradient on its share of the batch, the ranks average it with
one allreduce, and the state (weights, step, samples seen) is committed: a worker dying rolls the
others back to the last commit, and they go on in a smaller world.
"""
import os
import time

import numpy as np

import hvdlite.numpy as hvd

STEPS = int(os.environ.get("STEPS", "200"))
BATCH = 32  # samples per step across the world, split between the ranks
LR = 0.02
TRUE_W = np.linspace(-1.0, 1.0, 8)


def samples(start, count):
    """The dataset, endless and the same on every rank: sample i is drawn from seed i."""
    xs = np.stack([np.random.default_rng(i).standard_normal(8) for i in range(start, start + count)])
    return xs, xs @ TRUE_W


@hvd.elastic.run
def train(state):
    while state.step < STEPS:
        # This rank's contiguous share of the next BATCH samples, whatever the world's size now.
        share = BATCH // hvd.size()
        xs, ys = samples(state.seen + hvd.rank() * share, share)
        gradient = 2 * xs.T @ (xs @ state.w - ys) / share
        state.w = state.w - LR * hvd.allreduce(gradient)  # Average over the ranks
        state.seen += share * hvd.size()
        state.step += 1
        state.commit()  # a failure rolls back to here, never further
        if hvd.rank() == 0 and state.step % 50 == 0:
            test_x, test_y = samples(state.seen, 64)  # samples no rank trained on yet
            loss = float(np.mean((test_x @ state.w - test_y) ** 2))
            print(f"step {state.step}  loss {loss:.6f}  world size {hvd.size()}", flush=True)
        time.sleep(float(os.environ.get("STEP_SLEEP", "0")))


hvd.init()
state = hvd.elastic.ObjectState(w=np.zeros(8), step=0, seen=0)
train(state)
if hvd.rank() == 0:
    print(f"done: |w - true w| = {np.linalg.norm(state.w - TRUE_W):.2e}", flush=True)
