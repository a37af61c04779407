"""init / shutdown and the rank queries of the Horovod-compatible face."""
import atexit
import threading
from datetime import timedelta

import torch.distributed as dist

from hvdlite.torch import runtime
from hvdlite.torch.store import KVStore
from hvdlite.worker import env, sockets
from hvdlite.worker.session import session
from hvdlite.worker.world import WorldInfo

_connections = (None, set())  # (round, gloo socket fds) of the current group
_cut_lock = threading.Lock()


def _timeout(name: str, default: float) -> timedelta:
    return timedelta(seconds=float(session().environ.get(name, default)))


def init(world: WorldInfo = None) -> None:
    """Join the world this worker is assigned to (the launch assignment unless given)."""
    global _connections
    if runtime.is_initialized():
        return
    s = session()
    s.on_round_broken = _on_round_broken
    info = world or s.assignment()
    store = KVStore(s.client, info.store_scope, _timeout(env.START_TIMEOUT, 30),
                    abandoned=lambda: _broken(info.round, s.broken))
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=s.local_address())]
    options._timeout = _timeout(env.COLLECTIVE_TIMEOUT, 30)
    before = sockets.socket_fds()
    pg = dist.ProcessGroupGloo(store, info.rank, info.size, options)
    fds = sockets.tcp_fds(sockets.socket_fds() - before, exclude_peer=(s.addr, s.port))
    with _cut_lock:
        _connections = (info.round, fds)
    runtime.activate(pg, info)


def abort() -> None:
    """Fail every pending and future collective of the current group, here and on peers."""
    with _cut_lock:
        sockets.cut(_connections[1])


def _broken(round_number, newest_broken) -> bool:
    # Elastic rounds count from 1; a static job's world (round 0) is never given up.
    return round_number is not None and 0 < round_number <= newest_broken


def _on_round_broken(newest_broken: int) -> None:
    with _cut_lock:
        if _broken(_connections[0], newest_broken):
            sockets.cut(_connections[1])


def shutdown() -> None:
    """Leave the current world (after a failure, call abort() first)."""
    global _connections
    with _cut_lock:
        _connections = (None, set())
    pg = runtime.deactivate()
    if pg is not None:
        # The group's destructor waits for its pending work, which a hung peer never ends:
        # let it run on a thread of its own rather than block the reset.
        threading.Thread(target=_release, args=([pg],), daemon=True).start()
        del pg


def _release(holder: list) -> None:
    holder.clear()


def _destroy_at_exit() -> None:
    # A gloo group still alive while the interpreter tears down often aborts the process
    # (SIGABRT, exit -6), which would make a finished worker look failed.
    runtime.deactivate()


atexit.register(_destroy_at_exit)


def is_initialized() -> bool:
    return runtime.is_initialized()


def rank() -> int:
    return runtime.info().rank


def size() -> int:
    return runtime.info().size


def local_rank() -> int:
    return runtime.info().local_rank


def local_size() -> int:
    return runtime.info().local_size


def cross_rank() -> int:
    return runtime.info().cross_rank


def cross_size() -> int:
    return runtime.info().cross_size
