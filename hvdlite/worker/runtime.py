"""The current world of one collective backend: its group and this worker's place in it."""
import functools
import threading
import time

from hvdlite.worker.world import WorldInfo

_runtimes = []  # every backend's, for entered()
_counters = []  # count_also()'s
_waits = []  # wait_also()'s
_timed = []  # one [seconds] per thread that made timed() calls: the time they took
_timing = threading.local()  # a thread's {"inside": in a timed() call, "seconds": its entry of _timed}
_clock = time.perf_counter


def entered() -> int:
    """Collectives this process entered in its current world(s): its heartbeats carry it, and
    the driver names a rank that stays behind its peers' count as hung (driver/decisions/hangs.py)."""
    return sum(r.entered() for r in _runtimes) + sum(count() for count in _counters)


def count_also(count) -> None:
    """Count, beside the runtimes' worlds, the collectives `count()` says this process entered
    (a group a torchrun script made itself: torch/envstore.py)."""
    _counters.append(count)


def waited() -> float:
    """Seconds this process waited in collectives in its current world(s): the rest of its time
    is its own work, which the driver compares across ranks (driver/decisions/stragglers.py).
    (The driver takes differences within a world: a source that counts on across worlds does.)"""
    return sum(r.waited for r in _runtimes) + sum(wait() for wait in _waits) + sum(t[0] for t in _timed)


def wait_also(wait) -> None:
    """Count, beside the runtimes' timed waits, the seconds `wait()` says this process waited
    in collectives whose waits run out of hvdlite's sight (DDP's reducer: torch/ddpwait.py)."""
    _waits.append(wait)


def timed(collective):
    """`collective`, a blocking call into a group hvdlite does not drive (the torch.distributed
    functions a script calls: the boot sitecustomize wraps them), with the time its calls take
    counted as waited. Issuing is a few us of the call; an async_op call's wait, done later on
    the Work it returns, is not seen. A call made inside another (all_gather_into_tensor's
    all_gather_single) counts once."""
    @functools.wraps(collective)
    def timed_collective(*args, **kwargs):
        mine = _timing.__dict__
        if mine.get("inside"):
            return collective(*args, **kwargs)
        mine["inside"], started = True, _clock()
        try:
            return collective(*args, **kwargs)
        finally:
            mine["inside"] = False
            (mine.get("seconds") or _seconds_of(mine))[0] += _clock() - started
    return timed_collective


def _seconds_of(mine: dict) -> list:
    """A thread's own total of timed() calls (each thread adds to its own: no lock per call)."""
    mine["seconds"] = [0.0]
    _timed.append(mine["seconds"])
    return mine["seconds"]


def idle() -> bool:
    """This process waits in hvd.join() with no data left: its peers' steps go on without its
    own work, so the straggler rule leaves it out (driver/decisions/stragglers.py)."""
    return any(r.idle for r in _runtimes) or any(idle() for idle in _idles)


_idles = []  # idle_also()'s


def idle_also(idle) -> None:
    """Count this process idle also while `idle()` says so (a rank shadowing its peers in DDP's
    join(): torch/ddpwait.py)."""
    _idles.append(idle)


class NotInitializedError(ValueError):
    """A collective or query was called before hvd.init() or after hvd.shutdown()."""


class Runtime:
    """Holds the backend's group object (a torch process group, a pygloo context)."""

    def __init__(self):
        self._group, self._info, self._first_use, self._next = None, None, None, None
        self.failed = False  # a collective of this world failed (HorovodInternalError)
        self.calls = 0  # group() calls in the current world: every rank makes as many per collective
        self.waited = 0.0  # seconds its collectives waited in the current world (the backend adds)
        self.idle = False  # in hvd.join() (the backend sets it)
        self._counted = None  # what counts the world's collectives itself, where its group does
        self._counting = threading.Lock()  # (the heartbeat thread asks it)
        _runtimes.append(self)

    def activate(self, group, info: WorldInfo, first_use=None, counted=None) -> None:
        """`first_use()`, if given, runs once, before the first collective takes the group.
        `counted()`, if given, is the count of collectives entered in this world, whoever
        called them (else group()'s calls)."""
        self._group, self._info, self._first_use, self._next = group, info, first_use, None
        self.failed = False
        self.calls, self.waited, self.idle = 0, 0.0, False
        with self._counting:
            self._counted = counted

    def deactivate(self):
        """Forget the current group; returns it so the caller decides its fate (no heartbeat
        holds it afterwards: its destructor never runs on that thread)."""
        with self._counting:
            self._counted = None
        group, self._group, self._info, self._first_use, self._next = self._group, None, None, None, None
        return group

    def entered(self) -> int:
        with self._counting:
            return self._counted() if self._counted is not None else self.calls

    def before_next(self, then) -> None:
        """`then()` runs once, before the next collective other than a barrier takes the group
        (None: nothing does)."""
        self._next = then

    def is_initialized(self) -> bool:
        return self._group is not None

    # group() and info() come before every collective: the check is inline, as a call of its
    # own costs a collective ~1 us when the caches are cold after a wait.
    def group(self, barrier=False):
        if self._group is None:
            self._not_initialized()
        self.calls += 1
        first_use, self._first_use = self._first_use, None
        if first_use is not None:
            first_use()
        if self._next is not None and not barrier:
            self.run_next()
        return self._group

    def run_next(self) -> None:
        """Run what before_next() set, now (a process set's collective: its members alone take
        the world's group, whose first use is everyone's)."""
        then, self._next = self._next, None
        if then is not None:
            then()

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
