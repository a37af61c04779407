"""A numpy elastic job whose slot localhost/2 dies (SIGKILL) while the first world's gloo mesh
connects: after every rank published its address, before it connected its own pairs, so the
ranks that listen for it wait for a peer that is gone. Prints 'DONE <rank> <size>' after a few
steps in the world that follows."""
import os
import signal

import numpy as np

import hvdlite.numpy as hvd
from hvdlite.numpy import store

MARK = os.environ["VICTIM_MARK"]
if os.environ["HVDLITE_SLOT"] == "localhost/2" and not os.path.exists(MARK):
    get = store.GlooStore.get

    def dying_get(self, key):
        if key.isdigit():  # the first peer address: every rank has published its own
            open(MARK, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return get(self, key)
    store.GlooStore.get = dying_get


@hvd.elastic.run
def train(state):
    while state.step < 5:
        hvd.allreduce(np.ones(1))
        state.step += 1
        state.commit()


hvd.init()
train(hvd.elastic.ObjectState(step=0))
print(f"DONE {hvd.rank()} {hvd.size()}", flush=True)
