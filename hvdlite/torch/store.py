"""torch.distributed.Store over the driver's KV server, for bootstrapping gloo process groups.

Use a fresh scope for every process group you build (see hvdlite.worker.scopestore).

Keep a Python reference to the KVStore for as long as torch may use it: torch holds only
the C++ side of a Python store, and once the Python object is collected its methods are gone
("Not implemented" from C++).
"""
from datetime import timedelta

import torch.distributed as dist

from hvdlite.worker.kvclient import KVClient
from hvdlite.worker.scopestore import ScopeStore


class KVStore(dist.Store):
    """`abandoned()` tells a waiting get/wait to give up early; `peers`, the group's size,
    lets gloo's reads of its peers' addresses cost one request; `seen`: see ScopeStore."""

    def __init__(self, client: KVClient, scope: str, timeout: timedelta = timedelta(seconds=300),
                 abandoned=lambda: False, peers: int = 0, seen=None):
        super().__init__()
        self.kv = ScopeStore(client, scope, abandoned, error=dist.DistStoreError, peers=peers, seen=seen)
        self.set_timeout(timeout)

    def set(self, key: str, value) -> None:
        self.kv.set(key, value)

    def get(self, key: str) -> bytes:
        """Blocks until the key is set, up to the store's timeout."""
        return self.kv.get(key, _seconds(self.timeout))

    def add(self, key: str, value: int) -> int:
        return self.kv.add(key, value)

    def check(self, keys) -> bool:
        return self.kv.check(keys)

    def wait(self, keys, timeout: timedelta = None) -> None:
        self.kv.wait(keys, _seconds(self.timeout if timeout is None else timeout))

    def delete_key(self, key: str) -> bool:
        return self.kv.delete(key)

    deleteKey = delete_key  # the name torch's C++ side (e.g. PrefixStore) calls

    def multi_get(self, keys) -> list:
        return [self.get(key) for key in keys]

    def multi_set(self, keys, values) -> None:
        for key, value in zip(keys, values):
            self.set(key, value)


def _seconds(timeout: timedelta) -> float:
    # torch's Store::kNoTimeout (zero) means wait forever.
    return timeout.total_seconds() or float("inf")
