"""A numpy worker gives a connect up (its round fell apart while pygloo's connectFullMesh waited
in the store for a peer's address), joins the next world, and ends at once: the given-up thread
is still inside pygloo. It prints "the given-up connect ended" when its store call returns.

    python numpy_exit_after_given_up.py
"""
import time

import pygloo

from hvdlite.numpy import basics
from hvdlite.worker.world import WorldInfo


class Session:
    """What Links.join reads of a worker's session (see tests/test_links.py)."""

    elastic, liveness_timeout = True, 1.0

    def __init__(self):
        self.broken, self.round, self.on_round_broken = 0, 0, None

    def hear(self):
        pass

    def assignment(self, after_round=None, commit=0):
        self.round += 1
        return WorldInfo(rank=0, size=2, local_rank=0, local_size=2, cross_rank=0, cross_size=1,
                         hostname="localhost", round=self.round)


session = Session()


class Store:
    """The round's store: the driver gives the round up while gloo waits for the peer, and the
    wait ends at the store's next look (as ScopeStore's, every ABANDON_POLL)."""

    def set(self, key, data):
        return True

    def get(self, key):
        return self.wait([key])

    def wait(self, keys, timeout=None):
        session.broken = 1
        time.sleep(1.0)
        print("the given-up connect ended", flush=True)
        raise RuntimeError("the round was abandoned")

    def del_keys(self, keys):
        return True


def connect(info, abandoned, seen):
    if info.round > 1:
        return "the next world's group"
    context = pygloo.rendezvous.Context(0, 2)
    device = pygloo.transport.tcp.CreateDevice(pygloo.transport.tcp.attr("127.0.0.1"))
    context.connectFullMesh(pygloo.rendezvous.CustomStore(Store()), device)
    return context


info, _ = basics._links.join(session, connect)
print(f"joined round {info.round}", flush=True)
