"""The torch twin of numpy_connect_victim.py: victims die (SIGKILL) while a world's gloo group
connects (see connect_victims.py), and the survivors finish a few steps later, well within
gloo's connect timeout, which the connects they gave up may still be retrying. Prints
'DONE <rank> <size>'."""
import torch

import hvdlite.torch as hvd
from connect_victims import die, doomed_scope
from hvdlite.torch.store import KVStore

if doomed_scope():
    get, wait = KVStore.get, KVStore.wait

    def dying_get(self, key):
        if self.kv.scope == doomed_scope():
            die()
        return get(self, key)

    def dying_wait(self, keys, *args):
        if self.kv.scope == doomed_scope():
            die()
        return wait(self, keys, *args)
    KVStore.get, KVStore.wait = dying_get, dying_wait


@hvd.elastic.run
def train(state):
    while state.step < 5:
        hvd.allreduce(torch.ones(1))
        state.step += 1
        state.commit()


hvd.init()
train(hvd.elastic.ObjectState(step=0))
print(f"DONE {hvd.rank()} {hvd.size()}", flush=True)
