"""Key families: the keys prefix0 .. prefix<N-1> of a scope, which ranks read in one request
once all exist (gloo names a rank's key by a prefix and the rank). Each family is counted once
and kept up to date as keys come and go, so a set costs no scan; its snapshot is encoded
once and shared by every rank's answer."""
from hvdlite.worker import kvproto

MAX_FAMILY = 1 << 20  # keys one snapshot may wait for


class Family:
    def __init__(self, prefix, count, keys):
        self.prefix, self.count = prefix, count
        self.present = sum(1 for i in range(count) if f"{prefix}{i}" in keys)
        self.waiters = {}  # token -> callback(snapshot or None)
        self.snapshot = None  # encoded once complete, shared by every answer

    def member(self, key) -> bool:
        rank = key[len(self.prefix):]
        return key.startswith(self.prefix) and rank.isdigit() and str(int(rank)) == rank \
            and int(rank) < self.count

    def complete(self) -> bool:
        return self.present == self.count

    def encode(self, keys) -> bytes:
        if self.snapshot is None:
            names = (f"{self.prefix}{i}" for i in range(self.count))
            self.snapshot = kvproto.encode_snapshot((name, keys[name]) for name in names)
        return self.snapshot


class Families:
    """Every scope's families; the caller holds the lock of the data they count."""

    def __init__(self):
        self._by_scope = {}  # scope -> {(prefix, count): Family}

    def find(self, scope, prefix, count, keys) -> Family:
        families = self._by_scope.setdefault(scope, {})
        family = families.get((prefix, count))
        if family is None:  # shared by every rank asking: counted once, then kept up to date
            family = families[prefix, count] = Family(prefix, count, keys)
        return family

    def on_set(self, scope, key, new: bool, keys) -> list:
        """(callback, snapshot) of each waiter whose family the key completed."""
        woken = []
        for family in self._by_scope.get(scope, {}).values():
            if not family.member(key):
                continue
            family.snapshot = None
            family.present += new
            if family.complete() and family.waiters:
                snapshot = family.encode(keys)
                woken += [(cb, snapshot) for cb in family.waiters.values()]
                family.waiters = {}
        return woken

    def on_delete(self, scope, key) -> None:
        for family in self._by_scope.get(scope, {}).values():
            if family.member(key):
                family.present -= 1
                family.snapshot = None

    def drop(self, scope, under) -> None:
        """Forget the scope's families and those of the scopes whose names start with `under`."""
        for name in [s for s in self._by_scope if s == scope or s.startswith(under)]:
            del self._by_scope[name]

    def drain(self) -> list:
        """Every waiter's callback, forgotten (the server is stopping)."""
        callbacks = [cb for fams in self._by_scope.values() for f in fams.values() for cb in f.waiters.values()]
        self._by_scope = {}
        return callbacks

    def __len__(self):
        return len(self._by_scope)
