"""env:// for torchrun scripts in hvdlite workers (hvdlite/torch/boot/sitecustomize.py calls
it): `dist.init_process_group("gloo")` gets a store over the driver's signed KV server, under a
scope of its own per call, instead of the unauthenticated TCPStore torchrun's agent serves."""
import fcntl
import ipaddress
import itertools
import os
import socket
import struct
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import torch
from torch.distributed import distributed_c10d as c10d

from hvdlite.torch.store import KVStore
from hvdlite.worker import env, runtime
from hvdlite.worker.session import session

_calls = itertools.count()  # init_process_group calls in this process: every rank makes as many
_stores = []  # torch keeps only the C++ side of a Python store (store.py): keep the rest


def rendezvous(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs):
    query = parse_qs(urlparse(url).query)
    rank = int(query["rank"][0] if "rank" in query else os.environ["RANK"])
    size = int(query["world_size"][0] if "world_size" in query else os.environ["WORLD_SIZE"])
    scope = f"env.{os.environ.get(env.ROUND, '0')}.{next(_calls)}"
    bind_where_peers_reach(session().local_address(rank))
    # No `peers`: the script's dist.new_group() calls share this store with groups of other sizes.
    _stores.append(KVStore(session().client, scope, timeout))
    if len(_stores) == 1:
        runtime.count_also(_default_group_entered)
    yield _stores[-1], rank, size
    raise RuntimeError("hvdlite: env:// has no second rendezvous; call init_process_group again")


def _default_group_entered() -> int:
    """Collectives of the default group the script made itself, whoever called them (DDP,
    dist.*): its heartbeats carry them, for the driver's hang rule. (Read on the heartbeat
    thread: a reference to the group is held for the call only.)"""
    pg, backends = c10d._world.default_pg, {}
    for device in ("cpu", "cuda") if pg is not None else ():
        try:
            backend = pg._get_backend(torch.device(device))
        except (RuntimeError, ValueError):  # none for that device, or being destroyed
            continue
        backends[id(backend)] = backend  # ("cpu:gloo,cuda:nccl": two; "gloo": one for both)
    return sum(backend._get_sequence_number_for_group() for backend in backends.values())


def bind_where_peers_reach(address: str) -> None:
    """torch's gloo group binds the address its host name resolves to (often none, or a
    loopback one, on cluster nodes), or GLOO_SOCKET_IFNAME's: unless the user chose, name the
    interface of the address on the route to the driver, as hvdlite's own groups bind."""
    if "GLOO_SOCKET_IFNAME" in os.environ or ipaddress.ip_address(address).is_loopback:
        return
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:  # SIOCGIFADDR: the interface's IPv4 address, at bytes 20-24 of struct ifreq
                ifreq = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address
                continue
        if socket.inet_ntoa(ifreq[20:24]) == address:
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return
