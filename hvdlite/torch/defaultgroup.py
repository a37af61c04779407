"""torch.distributed's default process group is the hvdlite world's own gloo group: after
hvd.init() and after every re-form, DDP, `dist.*` and the libraries that call them run on it
(no second set of connections), and a broken world fails them as it fails hvdlite's ops.

torch makes a default group from a registered backend's constructor; this one hands torch the
world's group. dist.new_group() under it gets a gloo group of its own, bootstrapped through
the default store: the driver's signed KV store, under a scope of its own per world.

torch's view stays torch's: the group serves host and CUDA tensors, as stock gloo does (gloo
stages a CUDA tensor through host memory), and dist.get_backend() answers "gloo", or "nccl"
once the world's CUDA tensors take NCCL (carry_cuda): torch code and libraries branch on those
names, never on the name the group was registered under."""
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hvdlite.torch import envstore, gloo
from hvdlite.torch.store import KVStore
from hvdlite.worker.session import session
from hvdlite.worker.world import WorldInfo

NAME = "hvdlite"
_handing = []  # the world's group, while init_process_group makes it the default
_stores = []  # the current default store: torch keeps only its C++ side (store.py)
_bound = []  # torch's default group while it is the world's


def _backend(store, rank: int, size: int, timeout: timedelta):
    if _handing:
        return _handing.pop()
    return gloo.on_store(store, rank, size, timeout)


dist.Backend.register_backend(NAME, _backend, devices=["cpu", "cuda"])


def bind(group, info: WorldInfo) -> None:
    """Make `group`, the world `info` describes, torch's default process group, unless the
    script made a default group of its own."""
    if dist.is_initialized():
        return
    envstore.bind_where_peers_reach(session().local_address(info.rank))  # new_group's gloo, torch's own
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
    _bound[:] = [dist.group.WORLD]
    _answer(dist.Backend.GLOO)


def _answer(name: str) -> None:
    """Make dist.get_backend() of the world's default group answer `name` (torch reads it from
    its group map, where init_process_group put the registered name)."""
    pg = _bound[0]
    c10d._world.pg_map[pg] = (dist.Backend(name), c10d._world.pg_map[pg][1])


def carry_cuda(nccl) -> None:
    """The world's CUDA tensors take the NCCL group `nccl` (a c10d Backend): the default
    group's CUDA collectives go to it, and dist.get_backend() answers "nccl"."""
    if not _bound or dist.group.WORLD is not _bound[0]:
        return  # the script made a default group of its own
    _bound[0]._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL, nccl)
    _answer(dist.Backend.NCCL)


def unbind() -> None:
    """Forget the default group if it is hvdlite's world (before the world is left)."""
    if _bound and dist.is_initialized() and dist.group.WORLD is _bound[0]:
        dist.destroy_process_group()
    _bound.clear()
    _stores.clear()
