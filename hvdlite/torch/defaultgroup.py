"""torch.distributed's default process group is the hvdlite world's own gloo group: after
hvd.init() and after every re-form, DDP, `dist.*` and the libraries that call them run on it
(no second set of connections), and a broken world fails them as it fails hvdlite's ops.

torch makes a default group from a registered backend's constructor; this one hands torch the
world's group. dist.new_group() under it gets a gloo group of its own, bootstrapped through
the default store: the driver's signed KV store, under a scope of its own per world."""
import sys
from datetime import timedelta

import torch.distributed as dist

from hvdlite.torch import gloo
from hvdlite.torch.store import KVStore
from hvdlite.worker.session import session
from hvdlite.worker.world import WorldInfo

NAME = "hvdlite"
_handing = []  # the world's group, while init_process_group makes it the default
_stores = []  # the current default store: torch keeps only its C++ side (store.py)


def _backend(store, rank: int, size: int, timeout: timedelta):
    if _handing:
        return _handing.pop()
    return gloo.on_store(store, rank, size, timeout)


dist.Backend.register_backend(NAME, _backend, devices=["cpu"])


def bind(group, info: WorldInfo) -> None:
    """Make `group`, the world `info` describes, torch's default process group, unless the
    script made a default group of its own."""
    if dist.is_initialized():
        return
    # A scope of this join's own (init after shutdown joins a round again); no peers: its groups vary.
    _stores[:] = [KVStore(session().client, f"torch.{info.store_scope}")]
    _handing.append(group)
    # torch wraps sys.excepthook to put "[rank<r>]: " before each line of a traceback: the
    # driver labels lines already, and reads the error from the last one; and a wrapper per
    # re-form would nest, with the first world's rank.
    hook = sys.excepthook
    try:
        dist.init_process_group(NAME, store=_stores[0], rank=info.rank, world_size=info.size,
                                timeout=gloo.collective_timeout())
    finally:
        _handing.clear()
        sys.excepthook = hook


def unbind() -> None:
    """Forget the default group if it is hvdlite's world (before the world is left)."""
    if dist.is_initialized() and dist.get_backend() == NAME:
        dist.destroy_process_group()
    _stores.clear()
