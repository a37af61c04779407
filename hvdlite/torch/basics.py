"""init / shutdown and the rank queries of the Horovod-compatible face."""
import atexit
import threading
from datetime import timedelta

import torch.distributed as dist

from hvdlite.torch import runtime
from hvdlite.torch.store import KVStore
from hvdlite.worker import env
from hvdlite.worker.links import Links
from hvdlite.worker.session import session
from hvdlite.worker.world import WorldInfo

_links = Links()  # the current group's gloo connections


def _timeout(name: str, default: float) -> timedelta:
    return timedelta(seconds=float(session().environ.get(name, default)))


def init() -> None:
    """Join the world this worker is assigned to at launch."""
    if not runtime.is_initialized():
        join()


def join(after_round=None, commit=0) -> None:
    """Join the next world the driver assigns this worker (see Links.join)."""
    info, pg = _links.join(session(), _group, after_round, commit)
    runtime.activate(pg, info)


def _group(info: WorldInfo, abandoned):
    s = session()
    store = KVStore(s.client, info.store_scope, _timeout(env.START_TIMEOUT, 30), abandoned, info.size)
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=s.local_address())]
    options._timeout = _timeout(env.COLLECTIVE_TIMEOUT, 30)
    return dist.ProcessGroupGloo(store, info.rank, info.size, options)


abort = _links.cut  # fail every pending and future collective of the group, here and on peers


def shutdown() -> None:
    """Leave the current world (after a failure, call abort() first)."""
    _links.forget()
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
