"""Building a gloo process group over the driver's KV store: the world's, and process sets'."""
import os
import threading
from datetime import timedelta

import torch.distributed as dist

from hvdlite import defaults
from hvdlite.torch.store import KVStore
from hvdlite.worker import env
from hvdlite.worker.links import join_all
from hvdlite.worker.session import session


def _timeout(name: str, default: float) -> timedelta:
    return timedelta(seconds=float(session().environ.get(name, default)))


# torch's flight recorder, sized when the first group is made. On by default for gloo, it
# keeps about 460 KB of past collectives, and about 0.3 KB more for every group ever made:
# a long elastic job's survivor grew with its re-forms. A user's setting stands.
FLIGHT_RECORDER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def connect(scope: str, rank: int, size: int, abandoned=lambda: False, seen=None):
    """A gloo group of `size` ranks bootstrapped under KV `scope` (a fresh one per group: gloo
    never deletes its keys). The collective timeout is set explicitly: a group made with
    torch's new_group would not inherit it. `seen`: see ScopeStore."""
    if not any(name in os.environ for name in FLIGHT_RECORDER):
        os.environ[FLIGHT_RECORDER[0]] = "0"
    return on_store(bootstrap_store(scope, abandoned, size, seen), rank, size)


def bootstrap_store(scope: str, abandoned=lambda: False, size: int = 0, seen=None) -> KVStore:
    """The KV store a group of `size` ranks bootstraps through, under KV `scope`."""
    return KVStore(session().client, scope, _timeout(env.START_TIMEOUT, defaults.START_TIMEOUT),
                   abandoned, size, seen)


def collective_timeout() -> timedelta:
    return _timeout(env.COLLECTIVE_TIMEOUT, defaults.COLLECTIVE_TIMEOUT)


def on_store(store, rank: int, size: int, timeout: timedelta = None):
    """A gloo group bootstrapped through `store`, bound where peers reach this worker."""
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=session().local_address(rank))]
    options._timeout = timeout or collective_timeout()
    return dist.ProcessGroupGloo(store, rank, size, options)


_releasing = []  # threads destroying released groups


def release(holder: list) -> None:
    """Drop the groups in `holder`, a list holding their only references, without waiting:
    a group's destructor waits for its pending work, which a hung peer never ends, and for
    its peers to close (20-80 ms at 8 ranks), so it runs on a thread of its own. A reference
    left with the caller would run it there."""
    if all(group is None for group in holder):  # nothing was connected: no thread to start
        return
    thread = threading.Thread(target=holder.clear, daemon=True, name="hvdlite-gloo-release")
    thread.start()
    _releasing[:] = [t for t in _releasing if t.is_alive()] + [thread]


def finish_releases(timeout: float) -> bool:
    """Wait (at most `timeout` seconds) for groups still being destroyed: a destructor cut
    off by the interpreter's exit aborts the process (SIGABRT), so a worker that ends
    cleanly right after leaving a world would look failed. True if all ended."""
    return join_all(_releasing, timeout)
