"""Blocking access to one scope of the driver's KV server, as gloo's rendezvous needs it
(torch-free; the torch Store and the pygloo store both wrap it).

Use a fresh scope for every group you build: gloo never deletes its keys and restarts its
key names after a group is destroyed, so a reused scope hands a new group the previous
round's addresses.

Gloo's full mesh has every rank set one key, then wait for and get every rank's key: N^2
requests for a world of N. Gloo names a rank's key by a prefix and the rank ("0/3" in
torch, "rank_3" and "3" in pygloo); told the group's size (`peers`), the store fetches a whole
family of keys (prefix0 .. prefix<N-1>) in one request once all are set, and answers gloo from
that snapshot. That relies on gloo writing each key once per scope. A rank's own key of such
a family goes with that request too: gloo sets it, then reads its peers', so the set waits for
the read (any other call sends it first).
"""
import time

from hvdlite.worker.kvclient import KVClient

ABANDON_POLL = 0.5  # seconds between checks whether the round was given up


class ScopeStore:
    """`abandoned()` tells a waiting get/wait to give up early: the round it bootstraps fell
    apart (a peer died before publishing its address), so waiting out the timeout is useless.
    Giving up raises `error` (the caller's library's store error). Every value gloo sets or
    reads is appended to `seen`, if given: they hold the addresses gloo's sockets use."""

    def __init__(self, client: KVClient, scope: str, abandoned=lambda: False, error=RuntimeError,
                 peers: int = 0, seen=None):
        self.client, self.scope = client, scope
        self.seen = [] if seen is None else seen
        self.abandoned, self.error = abandoned, error
        self.peers = peers
        self._known = {}  # key -> value from a family's snapshot
        self._gathered = set()  # prefixes whose family was fetched
        self._unsent = None  # (prefix, key, value): this rank's key of a family, not set yet

    def set(self, key: str, value) -> None:
        self._send()
        value = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        self.seen.append(value)
        prefix = self._family(key)
        if prefix is None:
            self.client.put(self.scope, key, value)
        else:
            self._unsent = (prefix, key, value)

    def get(self, key: str, seconds: float) -> bytes:
        """The value once the key is set, waiting up to `seconds`."""
        value = self._wait_one(key, seconds, seconds)
        self.seen.append(value)
        return value

    def wait(self, keys, seconds: float) -> None:
        """Return once every key is set, within `seconds` in all."""
        deadline = time.monotonic() + seconds
        for key in keys:
            self._wait_one(key, max(deadline - time.monotonic(), 0.0), seconds)

    def check(self, keys) -> bool:
        self._send()
        return all(key in self._known or self.client.get(self.scope, key) is not None for key in keys)

    def add(self, key: str, amount: int) -> int:
        self._send()
        self._known.pop(key, None)
        return self.client.add(self.scope, key, amount)

    def delete(self, key: str) -> bool:
        self._send()
        self._known.pop(key, None)
        return self.client.delete(self.scope, key)

    def _family(self, key: str):
        """The prefix of the family `key` belongs to, if its family is yet to be fetched."""
        prefix = key.rstrip("0123456789")
        rank = key[len(prefix):]
        if self.peers and rank.isdigit() and int(rank) < self.peers and prefix not in self._gathered:
            return prefix
        return None

    def _send(self, prefix=None):
        """Set the unsent key now, unless it goes with the gather of family `prefix`; returns
        the (key, value) that goes with it."""
        unsent, self._unsent = self._unsent, None
        if unsent is None or unsent[0] == prefix:
            return unsent and unsent[1:]
        self.client.put(self.scope, *unsent[1:])
        return None

    def _wait_one(self, key: str, seconds: float, limit: float) -> bytes:
        deadline = time.monotonic() + seconds
        prefix = self._family(key)  # the first key of a family asked for brings every rank's
        put = self._send(prefix)
        while not self.abandoned():
            if key in self._known:
                return self._known[key]
            try:
                if prefix is not None:
                    self._known.update(self.client.gather(self.scope, prefix, self.peers,
                                                          min(ABANDON_POLL, seconds), put))
                    self._gathered.add(prefix)
                    prefix = None
                    continue
                return self.client.wait(self.scope, key, min(ABANDON_POLL, seconds))
            except TimeoutError:
                seconds = deadline - time.monotonic()
                if seconds <= 0:
                    raise self.error(f"hvdlite KV store: key {key!r} in scope {self.scope!r} not set "
                                     f"within {limit:g} s") from None
        raise self.error(f"hvdlite KV store: scope {self.scope!r} was abandoned: "
                         f"a peer left before the group formed")
