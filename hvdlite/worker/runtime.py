"""The current world of one collective backend: its group and this worker's place in it."""
from hvdlite.worker.world import WorldInfo

_runtimes = []  # every backend's, for entered()


def entered() -> int:
    """Collectives this process entered in its current world(s): its heartbeats carry it, and
    the driver names a rank that stays behind its peers' count as hung (driver/decisions/hangs.py)."""
    return sum(r.calls for r in _runtimes)


def waited() -> float:
    """Seconds this process waited in collectives in its current world(s): the rest of its time
    is its own work, which the driver compares across ranks (driver/decisions/stragglers.py)."""
    return sum(r.waited for r in _runtimes)


class NotInitializedError(ValueError):
    """A collective or query was called before hvd.init() or after hvd.shutdown()."""


class Runtime:
    """Holds the backend's group object (a torch process group, a pygloo context)."""

    def __init__(self):
        self._group, self._info, self._first_use = None, None, None
        self.calls = 0  # group() calls in the current world: every rank makes as many per collective
        self.waited = 0.0  # seconds its collectives waited in the current world (the backend adds)
        _runtimes.append(self)

    def activate(self, group, info: WorldInfo, first_use=None) -> None:
        """`first_use()`, if given, runs once, before the first collective takes the group."""
        self._group, self._info, self._first_use = group, info, first_use
        self.calls, self.waited = 0, 0.0

    def deactivate(self):
        """Forget the current group; returns it so the caller decides its fate."""
        group, self._group, self._info, self._first_use = self._group, None, None, None
        return group

    def is_initialized(self) -> bool:
        return self._group is not None

    # group() and info() come before every collective: the check is inline, as a call of its
    # own costs a collective ~1 us when the caches are cold after a wait.
    def group(self):
        if self._group is None:
            self._not_initialized()
        self.calls += 1
        first_use, self._first_use = self._first_use, None
        if first_use is not None:
            first_use()
        return self._group

    def info(self) -> WorldInfo:
        if self._group is None:
            self._not_initialized()
        return self._info

    @staticmethod
    def _not_initialized():
        raise NotInitializedError(
            "hvdlite has not been initialized; call hvd.init() first (or again after hvd.shutdown())")

    def query(self, field: str):
        """A function returning `field` (rank, size, ...) of this worker's place in the world."""
        def read() -> int:
            return getattr(self.info(), field)
        read.__name__ = read.__qualname__ = field
        return read
