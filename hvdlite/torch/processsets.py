"""Process sets: collectives on a subset of the ranks, as Horovod's.

A set is its list of ranks; its gloo group is built lazily, on the first collective of the set
in the current world, under a KV scope derived from the world's (so a new world, or a set
removed and added again, never reads an old group's addresses). After an elastic reset a set
keeps its ranks that still exist in the new world and gets a new group there.
"""
from hvdlite.torch import gloo, runtime


class ProcessSet:
    """ProcessSet([0, 2]): the ranks a collective's process_set= argument runs on. Horovod
    also takes an MPI communicator here; hvdlite, without MPI, a list of ranks only."""

    process_set_id = None  # given by add_process_set (or init(process_sets=))
    mpi_comm = None  # Horovod's MPI communicator: never one here

    def __init__(self, ranks_or_comm):
        self._ranks = None if ranks_or_comm is None else _ranks(ranks_or_comm)
        self._world, self._group = None, None

    @property
    def ranks(self):
        """The set's ranks; for the global set, every rank of the current world (None before
        init(), as in Horovod)."""
        if self._ranks is None:
            return list(range(runtime.info().size)) if runtime.is_initialized() else None
        return self._ranks

    def _members(self, size):
        return list(range(size)) if self._ranks is None else [r for r in self._ranks if r < size]

    def size(self):
        """How many ranks the set has; None until it is added, as in Horovod."""
        if self.process_set_id is None:
            return None
        return len(self._members(runtime.info().size))

    def rank(self):
        """This process's rank within the set; None until the set is added, and a ValueError
        if the set does not include this process, as in Horovod."""
        if self.process_set_id is None:
            return None
        return self.set_rank(runtime.info().rank, "this process, rank")

    def included(self):
        """Whether the set includes this process (None before init() for the global set)."""
        ranks = self.ranks
        return None if ranks is None else runtime.info().rank in ranks

    def global_rank(self, set_rank: int) -> int:
        return self._members(runtime.info().size)[set_rank]

    def set_rank(self, global_rank: int, what="rank") -> int:
        """The set's own rank of a world rank (e.g. a broadcast's root)."""
        members = self._members(runtime.info().size)
        if global_rank not in members:
            raise ValueError(f"{what} {global_rank} is not in the process set {members}")
        return members.index(global_rank)

    def group(self, barrier=False):
        """The gloo group of this set in the current world (built on first use). Like the
        world's, it first issues the named collectives called before (handles.defer), unless
        it is taken for a barrier."""
        if self._ranks is None:
            return runtime.process_group(barrier)
        if self.process_set_id is None:
            raise ValueError(f"{self} has not been added: pass it to hvd.add_process_set() first")
        info = runtime.info()
        if not barrier:
            runtime.run_next()
        if self._world is not info:
            members = self._members(info.size)
            if info.rank not in members:
                raise ValueError(f"this process (rank {info.rank}) is not in the process set {members}")
            scope = f"{info.store_scope}.set.{self.process_set_id}.{'-'.join(map(str, members))}"
            old, self._group = [self._group], None
            gloo.release(old)
            self._group = gloo.connect(scope, members.index(info.rank), len(members))
            self._world = info
        return self._group

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm=None)"


def _ranks(ranks_or_comm):
    """The sorted ranks of any iterable of ints, as Horovod takes them."""
    try:
        ranks = sorted(set(ranks_or_comm))
    except TypeError:
        ranks = None
    if ranks is None or not all(isinstance(r, int) for r in ranks):
        raise ValueError(f"ProcessSet takes a list of ranks (hvdlite has no MPI "
                         f"communicators), got {ranks_or_comm!r}")
    return ranks


global_process_set = ProcessSet(None)
global_process_set.process_set_id = 0
_sets = {0: global_process_set}
_next_id = [1]


def add_process_set(process_set):
    """Register a ProcessSet (or a list of ranks); every rank must add the same sets in the
    same order. Returns the registered set."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"{process_set} was added already")
    if any(s._ranks == process_set._ranks for s in _sets.values()):
        raise ValueError(f"a process set with ranks {process_set.ranks} exists already")
    process_set.process_set_id = _next_id[0]
    _next_id[0] += 1
    _sets[process_set.process_set_id] = process_set
    return process_set


def remove_process_set(process_set) -> bool:
    """Unregister a set; False for the global set or one not registered."""
    if process_set is global_process_set or _sets.get(process_set.process_set_id) is not process_set:
        return False
    del _sets[process_set.process_set_id]
    process_set.process_set_id = None
    old, process_set._group, process_set._world = [process_set._group], None, None
    gloo.release(old)
    return True


def remove_all() -> None:
    """Unregister every set but the global one (shutdown(): as in Horovod, the next init()
    starts with none, and numbers them from 1 again)."""
    for process_set in list(_sets.values()):
        remove_process_set(process_set)
    _next_id[0] = 1
