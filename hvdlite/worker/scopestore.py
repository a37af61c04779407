"""Blocking access to one scope of the driver's KV server, as gloo's rendezvous needs it
(torch-free; the torch Store and the pygloo store both wrap it).

Use a fresh scope for every group you build: gloo never deletes its keys and restarts its
key names after a group is destroyed, so a reused scope hands a new group the previous
round's addresses.

Gloo's full mesh has every rank set one key, then wait for and get every rank's key: N^2
requests for a world of N. Told how many keys the scope holds once every rank has set its
own (`expected_keys`), the store instead fetches the whole scope in one request then, and
answers gloo from that snapshot (a key not in it is still waited for on its own). That relies
on gloo writing each key once per scope.
"""
import time

from hvdlite.worker.kvclient import KVClient

ABANDON_POLL = 0.5  # seconds between checks whether the round was given up


class ScopeStore:
    """`abandoned()` tells a waiting get/wait to give up early: the round it bootstraps fell
    apart (a peer died before publishing its address), so waiting out the timeout is useless.
    Giving up raises `error` (the caller's library's store error)."""

    def __init__(self, client: KVClient, scope: str, abandoned=lambda: False, error=RuntimeError,
                 expected_keys: int = 0):
        self.client, self.scope = client, scope
        self.abandoned, self.error = abandoned, error
        self.expected_keys = expected_keys
        self._known = {}  # key -> value from the scope's snapshot

    def set(self, key: str, value) -> None:
        self.client.put(self.scope, key, value.encode("utf-8") if isinstance(value, str) else bytes(value))

    def get(self, key: str, seconds: float) -> bytes:
        """The value once the key is set, waiting up to `seconds`."""
        return self._wait_one(key, seconds, seconds)

    def wait(self, keys, seconds: float) -> None:
        """Return once every key is set, within `seconds` in all."""
        deadline = time.monotonic() + seconds
        for key in keys:
            self._wait_one(key, max(deadline - time.monotonic(), 0.0), seconds)

    def check(self, keys) -> bool:
        return all(key in self._known or self.client.get(self.scope, key) is not None for key in keys)

    def add(self, key: str, amount: int) -> int:
        self._known.pop(key, None)
        return self.client.add(self.scope, key, amount)

    def delete(self, key: str) -> bool:
        self._known.pop(key, None)
        return self.client.delete(self.scope, key)

    def _wait_one(self, key: str, seconds: float, limit: float) -> bytes:
        deadline = time.monotonic() + seconds
        gather = self.expected_keys and not self._known
        while not self.abandoned():
            if key in self._known:
                return self._known[key]
            try:
                if gather:  # the first key asked for brings every rank's
                    self._known = self.client.gather(self.scope, self.expected_keys, min(ABANDON_POLL, seconds))
                    gather = False
                    continue
                return self.client.wait(self.scope, key, min(ABANDON_POLL, seconds))
            except TimeoutError:
                seconds = deadline - time.monotonic()
                if seconds <= 0:
                    raise self.error(f"hvdlite KV store: key {key!r} in scope {self.scope!r} not set "
                                     f"within {limit:g} s") from None
        raise self.error(f"hvdlite KV store: scope {self.scope!r} was abandoned: "
                         f"a peer left before the group formed")
