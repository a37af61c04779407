"""A numpy elastic job whose victims die (SIGKILL) while a world's gloo mesh connects: after
every rank published its address, before the victim connected its own pairs, so the ranks that
listen for it wait for a peer that is gone. VICTIMS="slot@round,...": that slot dies in the
connect of that round (default localhost/2@1, the first world); each appends its slot to the
file $VICTIM_MARK first. With VICTIM_LINGER=seconds a victim first closes the sockets its
pairs listen on, so that a peer connecting to it is refused at once, and dies that much later:
the driver hears of the death after the peer's connect failed. Prints 'DONE <rank> <size>'
after a few steps in the world that follows."""
import os
import signal
import socket
import time

import numpy as np

import hvdlite.numpy as hvd
from hvdlite.numpy import store
from hvdlite.worker import sockets

MARK = os.environ["VICTIM_MARK"]
VICTIMS = dict(v.split("@") for v in os.environ.get("VICTIMS", "localhost/2@1").split(","))
SLOT = os.environ["HVDLITE_SLOT"]
if SLOT in VICTIMS:
    get = store.GlooStore.get

    def dying_get(self, key):
        # The first peer address of the victim's round: every rank has published its own.
        if key.isdigit() and self.kv.scope == f"gloo.{VICTIMS[SLOT]}":
            with open(MARK, "a") as f:
                f.write(SLOT + "\n")
            linger = float(os.environ.get("VICTIM_LINGER", "0"))
            if linger:
                close_listeners()
                time.sleep(linger)
            os.kill(os.getpid(), signal.SIGKILL)
        return get(self, key)
    store.GlooStore.get = dying_get


def close_listeners():
    for fd, _ in sockets.open_sockets():
        try:
            with socket.socket(fileno=os.dup(fd)) as s:
                listens = s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        except OSError:
            continue
        if listens:
            os.close(fd)


@hvd.elastic.run
def train(state):
    while state.step < 5:
        hvd.allreduce(np.ones(1))
        state.step += 1
        state.commit()


hvd.init()
train(hvd.elastic.ObjectState(step=0))
print(f"DONE {hvd.rank()} {hvd.size()}", flush=True)
