"""Two steps: in the first every rank sleeps $SETTLE seconds, in the second rank 0 comes $HOLD
seconds late to an allreduce: the other ranks wait in pygloo, which holds the GIL, so only
their voucher heartbeats for them meanwhile, and their own heartbeat thread cannot run."""
import os
import time

import numpy as np

import hvdlite.numpy as hvd


@hvd.elastic.run
def train(state):
    while state.step < 2:
        if state.step == 0 or hvd.rank() == 0:
            time.sleep(float(os.environ["SETTLE" if state.step == 0 else "HOLD"]))
        hvd.allreduce(np.ones(1))
        state.step += 1
        state.commit()


hvd.init()
train(hvd.elastic.ObjectState(step=0))
print(f"DONE rank {hvd.rank()}", flush=True)
