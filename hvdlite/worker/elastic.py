"""Elastic training, backend-neutral: `run`, State and ObjectState (torch-free).

The reset protocol, on every rank alike:
- a peer's failure surfaces as HorovodInternalError: cut this world's connections (so every
  peer fails fast too), restore the last commit, re-rendezvous;
- a host update surfaces as HostsUpdatedInterrupt at the same commit on every rank (the ranks
  agree on the largest of their views): keep the live state, re-rendezvous; a worker that is
  leaving (hvdlite.worker.stopping) says so and re-rendezvous too, where the driver lets it go
  once its commit is safe; every rank exits there when the job stops;
- then always sync from the world's root (WorldInfo.root), which the driver picks among the
  workers holding the newest commit; ranks stay put (the driver's plan.plan_world), so the
  root need not be rank 0. Always syncing means ranks can never disagree about it (Horovod
  bug #3494); after it every rank holds the commit, so rank 0's writer can write it.

A backend (hvdlite.torch, hvdlite.numpy) binds this to its collectives with a Backend and
State classes whose `backend` attribute is it.
"""
import copy
import functools
import os
import traceback
from dataclasses import dataclass
from typing import Callable

from hvdlite.worker import durable, exitcode, generators, stopping
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
    agree_flag: Callable[[int], int]  # the largest of every rank's small int, on every rank
    broadcast_object: Callable  # broadcast_object(obj, root_rank): root's object everywhere
    # whether an error other than HorovodInternalError says the world broke: one a library
    # raised from a collective on the world's group (DDP's backward)
    world_broke: Callable[[BaseException], bool] = lambda error: False
    allgather_object: Callable = None  # allgather_object(obj): every rank's obj, in rank order
    # this process's global random generators as a plain value, and putting such a value back
    capture_generators: Callable[[], dict] = generators.capture
    put_generators: Callable[[dict], None] = generators.put


_STOP = 2  # check_host_updates' flag for "the job stops" (1: a host update or a leaver)


class State:
    """Training state that survives resets: commit() saves it, restore() goes back to it."""

    backend: Backend = None  # set by the backend's subclass

    def __init__(self):
        # How many commits this state holds; the root of a new world holds the most. Private:
        # a State reserves no public attribute names (a script may have its own `commits`).
        self._commits = 0
        # The training history this state belongs to (durable commits: checkpointdir.py);
        # the root's is every rank's after a sync.
        self._lineage = durable.lineage()
        self._reset_callbacks = []
        self._every_rank = []  # _every_rank_now() of the last commit
        # Host updates told through on_hosts_updated: the newest heard, the newest acted on.
        self._heard_update = self._acted_update = 0

    def on_hosts_updated(self, timestamp, update_res):
        """Horovod's notification hook: an update newer than any this rank heard before makes
        the next check_host_updates() raise HostsUpdatedInterrupt on every rank (`update_res`,
        whether hosts came or went, changes nothing here: every rank re-syncs anyway)."""
        self._heard_update = max(self._heard_update, timestamp)

    def register_reset_callbacks(self, callbacks):
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._acted_update = self._heard_update  # the reset answers every update heard so far
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def reset(self):
        """A hook, as Horovod's: runs at every reset, before the state is synced."""

    def commit(self):
        self._commits += 1
        # Every rank's part first: a commit that fails to reach every rank is not taken (its
        # rollback goes to the one before, whose parts every rank has).
        every_rank = self._every_rank_now()
        with durable.saving(self):
            self.save()
            self._every_rank = every_rank
        session().commits = self._commits
        durable.committed(self)
        self.check_host_updates()

    def check_host_updates(self):
        """Raise HostsUpdatedInterrupt on every rank if any rank heard of a host update or is
        leaving (the leaver exits instead); every rank exits if any heard that the job stops."""
        s = session()
        heard = s.updates > self.backend.info().updates or self._heard_update > self._acted_update
        mine = _STOP if s.stopping else int(heard or stopping.requested)
        agreed = self.backend.agree_flag(mine)
        self._acted_update = self._heard_update
        if agreed == _STOP:  # rank 0's exit writes its newest commit
            stopping.leave()
        if agreed:
            raise HostsUpdatedInterrupt()

    def save(self):
        raise NotImplementedError

    def _every_rank_now(self) -> list:
        """A commit's collective before save(): what each rank alone has, by rank (ObjectState:
        the ranks' random generators)."""
        return []

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError

    def _snapshot(self):
        """(commit, what the last commit saved): shared, not copied; a commit replaces the
        saved copies and never changes them, so a checkpoint writer can read them meanwhile."""
        raise NotImplementedError(f"hvdlite: a {type(self).__name__} cannot be written to --checkpoint-dir: "
                                  f"its commits live in memory only; run without --checkpoint-dir")

    def _load_snapshot(self, commit, snapshot):
        """Make a checkpoint's snapshot the last commit, and go back to it."""
        raise NotImplementedError


class ObjectState(State):
    """State made of plain picklable attributes: ObjectState(epoch=0, batch=0).

    It keeps this rank's random generators with its commits too (Python's, numpy's, the
    backend's): a restore puts them back, so the steps after a rollback draw what they drew
    before. Each commit gathers every rank's (a few KB a rank, one allgather), so a worker that
    takes a rank whose holder died, or a job resumed from --checkpoint-dir, goes on with that
    rank's generators.
    """

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
        self._saved_generators = self.backend.capture_generators()
        generators.saved(self.backend.put_generators, self._saved_generators)

    def _rank_now(self) -> dict:
        """What this rank's save would hold that no other rank has: its generators."""
        return {"generators": self.backend.capture_generators()}

    def _every_rank_now(self):
        return self.backend.allgather_object(self._rank_now())

    def restore(self):
        for name, value in copy.deepcopy(self._saved).items():
            setattr(self, name, value)
        self._commits = self._saved_commits
        self.backend.put_generators(self._saved_generators)
        generators.saved(self.backend.put_generators, self._saved_generators)

    def _take_rank_saved(self):
        """Go on from this rank's part of the last commit, saved by the process that held the
        rank then (if the commit has one: a world that grew has ranks it does not know)."""
        if self._every_rank and self.backend.info().rank < len(self._every_rank):
            self._put_rank_saved(self._every_rank[self.backend.info().rank])

    def _put_rank_saved(self, saved):
        self._saved_generators = saved["generators"]
        self.backend.put_generators(saved["generators"])

    def sync(self):
        held = self._commits
        values, self._commits, self._lineage, self._every_rank = self.backend.broadcast_object(
            (self._values(), self._commits, self._lineage, self._every_rank), self.backend.info().root)
        for name, value in values.items():
            setattr(self, name, value)
        if self._commits != held:  # the state came from the root: this rank's part from the commit
            self._take_rank_saved()
        self.save()

    def _snapshot(self):
        return self._saved_commits, {"values": self._saved, "ranks": self._every_rank}

    def _load_snapshot(self, commit, snapshot):
        values = snapshot["values"]
        if sorted(values) != sorted(self._names):
            raise RuntimeError(f"hvdlite: the checkpoint holds the state {sorted(values)}, this "
                               f"script's state is {sorted(self._names)}")
        self._saved, self._saved_commits = values, commit
        self._every_rank = snapshot.get("ranks", [])  # none in files written before them
        self._saved_generators = self.backend.capture_generators()
        self._take_rank_saved()
        self.restore()


_inside_run = 0  # how many run() calls this worker is in


def run(func):
    """Run `func(state, ...)` until it returns, re-forming the world whenever it breaks."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        global _inside_run
        backend = state.backend
        backend.init()
        _inside_run += 1
        stopping.holding = True
        try:
            while True:
                rolled_back = False
                try:
                    with durable.saving(state):
                        durable.catch_up(state)
                        state.sync()
                    if backend.info().handover:  # its source leaves, or the job stops: rank 0 writes it
                        durable.committed(state)
                        raise HostsUpdatedInterrupt()
                    stopping.at_work = True
                    return func(state, *args, **kwargs)
                except HostsUpdatedInterrupt:
                    pass
                except RuntimeError as error:
                    if not (isinstance(error, HorovodInternalError) or backend.world_broke(error)):
                        raise
                    backend.abort()
                    state.restore()
                    rolled_back = True
                _reset(state, backend, rolled_back)
        except SystemExit as e:  # its code is the process's: an exit hook may need it (exitcode.py)
            exitcode.note(e.code)
            raise
        finally:
            _inside_run -= 1
            stopping.at_work = stopping.holding = False
    return wrapper


def entry_check(count_inside, size: int):
    """A check for the first collective of an elastic worker's new world (Runtime.activate's
    first_use): every rank must be inside run() or every rank outside it.

    A worker joining a running job finds its peers syncing the state in run(); a collective it
    runs before (a top-level broadcast_parameters written for static jobs) would be matched
    with theirs and abort the process inside gloo. `count_inside(flag)` sums a flag over the
    world's ranks (a collective alike on every rank, so it always matches)."""
    def check():
        inside = count_inside(int(_inside_run > 0))
        if inside in (0, size):
            return
        if not _inside_run:
            raise SystemExit(f"hvdlite: {_caller()} runs a collective outside @hvd.elastic.run on a "
                             f"worker that joined a running job, whose other workers are syncing the "
                             f"training state in run(): move it into the function decorated with "
                             f"@hvd.elastic.run, or put what it syncs into the State (e.g. "
                             f"TorchState(model, optimizer)), which run() syncs on every join")
        raise HorovodInternalError("a worker joining this world ran a collective outside @hvd.elastic.run")
    return check


def _caller() -> str:
    """file:line of the innermost call from outside hvdlite (the script's)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for frame in reversed(traceback.extract_stack()):
        if not os.path.abspath(frame.filename).startswith(package + os.sep):
            return f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return "this script"


def _reset(state, backend, rolled_back):
    """Leave this world and join the next one; a worker left out exits cleanly. A leaver
    writes its commit if it is the writer, says it leaves, and waits for the driver's word."""
    stopping.at_work = False
    s = session()
    if stopping.requested:
        durable.flush()
        s.tell("leaving")
    finished = backend.info().round
    backend.shutdown()
    s.kept = not rolled_back
    backend.join(finished, state._commits)
    state.on_reset()
