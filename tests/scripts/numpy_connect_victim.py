"""A numpy elastic job whose victims die (SIGKILL) while a world's gloo mesh connects: after
every rank published its address, before the victim connected its own pairs, so the ranks that
listen for it wait for a peer that is gone. Who dies when: see connect_victims.py. Prints
'DONE <rank> <size>' after a few steps in the world that follows."""
import numpy as np

import hvdlite.numpy as hvd
from connect_victims import die, doomed_scope
from hvdlite.numpy import store

if doomed_scope():
    get = store.GlooStore.get

    def dying_get(self, key):
        # The first peer address of the victim's round: every rank has published its own.
        if key.isdigit() and self.kv.scope == doomed_scope():
            die()
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
