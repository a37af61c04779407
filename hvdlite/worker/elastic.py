"""Elastic training, backend-neutral: `run`, State and ObjectState (torch-free).

The reset protocol, on every rank alike:
- a peer's failure surfaces as HorovodInternalError: cut this world's connections (so every
  peer fails fast too), restore the last commit, re-rendezvous;
- a host update surfaces as HostsUpdatedInterrupt at the same commit on every rank (rank 0's
  view is broadcast): keep the live state, re-rendezvous;
- then always sync from rank 0, which the driver picks among the workers holding the newest
  commit. Always syncing means ranks can never disagree about it (Horovod bug #3494).

A backend (hvdlite.torch, hvdlite.numpy) binds this to its collectives with a Backend and
State classes whose `backend` attribute is it.
"""
import copy
import functools
from dataclasses import dataclass
from typing import Callable

from hvdlite.worker import durable
from hvdlite.worker.errors import HorovodInternalError, HostsUpdatedInterrupt
from hvdlite.worker.session import session
from hvdlite.worker.world import WorldInfo


@dataclass(frozen=True)
class Backend:
    init: Callable  # init(): join the launch world, unless in a world already
    join: Callable  # join(after_round, commit): join the next world after that round
    shutdown: Callable  # leave the current world
    abort: Callable  # fail the current world's collectives, here and on its peers
    info: Callable[[], WorldInfo]  # this worker's place in the current world
    broadcast_flag: Callable[[int], int]  # rank 0's small int on every rank
    broadcast_object: Callable  # broadcast_object(obj, root_rank): root's object everywhere


class State:
    """Training state that survives resets: commit() saves it, restore() goes back to it."""

    backend: Backend = None  # set by the backend's subclass

    def __init__(self):
        # How many commits this state holds; rank 0 of a new world holds the most. Private:
        # a State reserves no public attribute names (a script may have its own `commits`).
        self._commits = 0
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def reset(self):
        """A hook, as Horovod's: runs at every reset, before the state is synced."""

    def commit(self):
        self._commits += 1
        self.save()
        session().commits = self._commits
        durable.committed(self)
        self.check_host_updates()

    def check_host_updates(self):
        """Raise HostsUpdatedInterrupt on every rank if rank 0 heard of a host update."""
        heard = int(session().updates > self.backend.info().updates)
        if self.backend.broadcast_flag(heard):
            raise HostsUpdatedInterrupt()

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError

    def _snapshot(self):
        """(commit, what the last commit saved): shared, not copied; a commit replaces the
        saved copies and never changes them, so a checkpoint writer can read them meanwhile."""
        raise NotImplementedError

    def _load_snapshot(self, commit, snapshot):
        """Make a checkpoint's snapshot the last commit, and go back to it."""
        raise NotImplementedError


class ObjectState(State):
    """State made of plain picklable attributes: ObjectState(epoch=0, batch=0)."""

    def __init__(self, **kwargs):
        self._names = list(kwargs)
        super().__init__()
        for name, value in kwargs.items():
            setattr(self, name, value)
        self.save()

    def _values(self) -> dict:
        return {name: getattr(self, name) for name in self._names}

    def save(self):
        self._saved = copy.deepcopy(self._values())
        self._saved_commits = self._commits

    def restore(self):
        for name, value in copy.deepcopy(self._saved).items():
            setattr(self, name, value)
        self._commits = self._saved_commits

    def sync(self):
        values, self._commits = self.backend.broadcast_object((self._values(), self._commits), 0)
        for name, value in values.items():
            setattr(self, name, value)
        self.save()

    def _snapshot(self):
        return self._saved_commits, {"values": self._saved}

    def _load_snapshot(self, commit, snapshot):
        values = snapshot["values"]
        if sorted(values) != sorted(self._names):
            raise RuntimeError(f"hvdlite: the checkpoint holds the state {sorted(values)}, this "
                               f"script's state is {sorted(self._names)}")
        self._saved, self._saved_commits = values, commit
        self.restore()


def run(func):
    """Run `func(state, ...)` until it returns, re-forming the world whenever it breaks."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        backend = state.backend
        backend.init()
        while True:
            try:
                durable.catch_up(state)
                state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                backend.abort()
                state.restore()
            except HostsUpdatedInterrupt:
                pass
            _reset(state, backend)
    return wrapper


def _reset(state, backend):
    """Leave this world and join the next one; a worker left out exits cleanly."""
    finished = backend.info().round
    backend.shutdown()
    backend.join(finished, state._commits)
    state.on_reset()
