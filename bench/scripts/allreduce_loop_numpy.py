"""Benchmark worker on the numpy backend: one small allreduce + commit per step until
$STOP_FILE exists; appends "time round rank size" per completed allreduce to $LOG_DIR/<pid>.log
(the format of allreduce_loop.py)."""
import os
import time

import numpy as np

import hvdlite.numpy as hvd

LOG = open(os.path.join(os.environ["LOG_DIR"], f"{os.getpid()}.log"), "a", buffering=1)
STOP = os.environ["STOP_FILE"]


@hvd.elastic.run
def train(state):
    while not os.path.exists(STOP):
        hvd.allreduce(np.ones(1), op=hvd.Sum)
        LOG.write(f"{time.time():.6f} {hvd.elastic.BACKEND.info().round} {hvd.rank()} {hvd.size()}\n")
        state.step += 1
        state.commit()
        time.sleep(0.01)


hvd.init()
train(hvd.elastic.ObjectState(step=0))
