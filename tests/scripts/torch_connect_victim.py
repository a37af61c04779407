"""The torch twin of numpy_connect_victim.py: victims die (SIGKILL) while a world's gloo group
connects (see connect_victims.py), and the survivors finish a step later. With
LAGGARD="slot@round:seconds" that survivor's store answers gloo's calls of that round only after
so many seconds, polling meanwhile like a store far away: its connect, given up, goes on in
gloo (as gloo retries a refused peer up to its timeout) while the worker exits. EXIT_WAIT=seconds cuts
the exit's wait for it (as if that connect ran under a --gloo-timeout-seconds longer than the
wait). Prints 'DONE <rank> <size>'."""
import os
import time

import torch

import hvdlite.torch as hvd
import hvdlite.torch.basics
from connect_victims import SLOT, die, doomed_scope
from hvdlite.torch.store import KVStore

get, wait = KVStore.get, KVStore.wait
lagging, _, lag = os.environ.get("LAGGARD", "@:0").partition(":")
LAG_SCOPE = f"gloo.{lagging.split('@')[1]}" if lagging.split("@")[0] == SLOT else None


def answer(store):
    if store.kv.scope == doomed_scope():
        die()
    if store.kv.scope == LAG_SCOPE:
        until = time.monotonic() + float(lag)
        while time.monotonic() < until:  # each poll takes the GIL again, as a real one would
            time.sleep(0.02)


def slow_get(self, key):
    answer(self)
    return get(self, key)


def slow_wait(self, keys, *args):
    answer(self)
    return wait(self, keys, *args)


KVStore.get, KVStore.wait = slow_get, slow_wait
hvdlite.torch.basics.EXIT_WAIT = float(os.environ.get("EXIT_WAIT", hvdlite.torch.basics.EXIT_WAIT))


@hvd.elastic.run
def train(state):
    while state.step < 1:
        hvd.allreduce(torch.ones(1))
        state.step += 1
        state.commit()


hvd.init()
train(hvd.elastic.ObjectState(step=0))
print(f"DONE {hvd.rank()} {hvd.size()}", flush=True)
