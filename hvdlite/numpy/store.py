"""The Python object pygloo's rendezvous.CustomStore calls: the driver's KV server, one scope.

Gloo calls set(key, bytes), wait(keys) then get(key) for every peer, and never deletes keys;
a fresh scope per round (WorldInfo.store_scope) keeps rounds apart.
"""
from hvdlite.worker.scopestore import ScopeStore


class GlooStore:
    """`published()`, if given, is called after each value gloo sets."""

    def __init__(self, kv: ScopeStore, seconds: float, published=lambda: None):
        self.kv, self.seconds, self.published = kv, seconds, published

    def set(self, key: str, data: bytes) -> bool:
        self.kv.set(key, data)
        self.published()
        return True

    def get(self, key: str) -> bytes:
        return self.kv.get(key, self.seconds)

    def wait(self, keys, timeout=None) -> bool:
        self.kv.wait(keys, self.seconds if timeout is None else timeout)
        return True

    def del_keys(self, keys) -> bool:
        return all([self.kv.delete(key) for key in keys])
