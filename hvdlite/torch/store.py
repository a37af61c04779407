"""torch.distributed.Store over the driver's KV server, for bootstrapping gloo process groups.

Use a fresh scope for every process group you build: gloo never deletes its keys and
restarts its key names after a group is destroyed, so a reused scope hands a new group the
previous round's addresses.

Keep a Python reference to the KVStore for as long as torch may use it: torch holds only
the C++ side of a Python store, and once the Python object is collected its methods are gone
("Not implemented" from C++).
"""
import time
from datetime import timedelta

import torch.distributed as dist

from hvdlite.worker.kvclient import KVClient


ABANDON_POLL = 0.5  # seconds between checks whether the round was given up


class KVStore(dist.Store):
    """`abandoned()` tells a waiting get/wait to give up early: the round it bootstraps fell
    apart (a peer died before publishing its address), so waiting out the timeout is useless."""

    def __init__(self, client: KVClient, scope: str, timeout: timedelta = timedelta(seconds=300),
                 abandoned=lambda: False):
        super().__init__()
        self.client = client
        self.scope = scope
        self.abandoned = abandoned
        self.set_timeout(timeout)

    def set(self, key: str, value) -> None:
        self.client.put(self.scope, key, _as_bytes(value))

    def get(self, key: str) -> bytes:
        """Blocks until the key is set, up to the store's timeout."""
        return self._wait_one(key, _seconds(self.timeout))

    def add(self, key: str, value: int) -> int:
        return self.client.add(self.scope, key, value)

    def check(self, keys) -> bool:
        return all(self.client.get(self.scope, key) is not None for key in keys)

    def wait(self, keys, timeout: timedelta = None) -> None:
        seconds = _seconds(self.timeout if timeout is None else timeout)
        deadline = time.monotonic() + seconds
        for key in keys:
            self._wait_one(key, max(deadline - time.monotonic(), 0.0), seconds)

    def delete_key(self, key: str) -> bool:
        return self.client.delete(self.scope, key)

    deleteKey = delete_key  # the name torch's C++ side (e.g. PrefixStore) calls

    def multi_get(self, keys) -> list:
        return [self.get(key) for key in keys]

    def multi_set(self, keys, values) -> None:
        for key, value in zip(keys, values):
            self.set(key, value)

    def _wait_one(self, key: str, seconds: float, total: float = None) -> bytes:
        limit = seconds if total is None else total
        deadline = time.monotonic() + seconds
        while not self.abandoned():
            try:
                return self.client.wait(self.scope, key, min(ABANDON_POLL, seconds))
            except TimeoutError:
                seconds = deadline - time.monotonic()
                if seconds <= 0:
                    raise dist.DistStoreError(
                        f"hvdlite KV store: key {key!r} in scope {self.scope!r} not set within "
                        f"{limit:g} s") from None
        raise dist.DistStoreError(f"hvdlite KV store: scope {self.scope!r} was abandoned: "
                                  f"a peer left before the group formed")


def _seconds(timeout: timedelta) -> float:
    # torch's Store::kNoTimeout (zero) means wait forever.
    return timeout.total_seconds() or float("inf")


def _as_bytes(value) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)
