"""env:// for torchrun scripts in hvdlite workers (hvdlite/torch/boot/sitecustomize.py calls
it): `dist.init_process_group("gloo")` gets a store over the driver's signed KV server, under a
scope of its own per call, instead of the unauthenticated TCPStore torchrun's agent serves."""
import itertools
import os
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

from hvdlite.torch.store import KVStore
from hvdlite.worker import env
from hvdlite.worker.session import session

_calls = itertools.count()  # init_process_group calls in this process: every rank makes as many
_stores = []  # torch keeps only the C++ side of a Python store (store.py): keep the rest


def rendezvous(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs):
    query = parse_qs(urlparse(url).query)
    rank = int(query["rank"][0] if "rank" in query else os.environ["RANK"])
    size = int(query["world_size"][0] if "world_size" in query else os.environ["WORLD_SIZE"])
    scope = f"env.{os.environ.get(env.ROUND, '0')}.{next(_calls)}"
    # No `peers`: the script's dist.new_group() calls share this store with groups of other sizes.
    _stores.append(KVStore(session().client, scope, timeout))
    yield _stores[-1], rank, size
    raise RuntimeError("hvdlite: env:// has no second rendezvous; call init_process_group again")
