"""What every collective of hvdlite.torch shares: the Handle a caller waits on, a wait that
notices a broken world, the collective trace's spans, and the packing of tensors into one buffer
per dtype around a gloo call."""
import functools
import inspect
import time
import weakref
import zlib
from datetime import timedelta

import torch
from torch._C._distributed_c10d import AllgatherOptions  # not re-exported by torch.distributed

from hvdlite.torch import fusion, runtime
from hvdlite.worker import trace
from hvdlite.worker.errors import HorovodInternalError, MismatchError
from hvdlite.worker.links import broken
from hvdlite.worker.session import session

_SLICE = timedelta(seconds=0.2)  # a wait's checks whether the driver said the world broke


class Handle:
    """A collective in flight: synchronize(handle) waits and returns its result."""

    def __init__(self, works, finish):
        self._works, self._finish = works, finish
        self._done, self._result = False, None
        self.taken = False  # given to synchronize() once: Horovod forgets it then
        self.ended = None  # ends its span in the collective trace, when one is recorded
        self._later = None  # (its world, its issue) while a named collective waits to be issued

    def poll(self) -> bool:
        if self._later is not None:
            issue_deferred()
        return all(work.is_completed() for work in self._works)

    is_completed = poll  # a Handle can wait on other Handles

    def in_flight(self) -> bool:
        """Called and not done: not issued yet, or issued and neither waited for nor completed
        (a reducescatter's gloo Work never says it completed)."""
        return self._later is not None or (not self._done and not self.poll())

    def _issue(self, world) -> None:
        """Issue the deferred collective in `world`, the current one (None: none): an error
        it raises, or its world having ended, is raised by the wait."""
        (its_world, issue), self._later = self._later, None
        try:
            if its_world is not world:
                raise HorovodInternalError("hvdlite: the world this collective was called in ended "
                                           "before it was issued")
            issued = issue()
        except Exception as e:  # (raised here, it would reach the caller of the collective issuing it)
            self._finish = functools.partial(_reraise, e)
            return
        self._works, self._finish = ([issued], issued.wait) if isinstance(issued, Handle) else ([], lambda: issued)

    def wait(self):
        if self._later is not None:
            issue_deferred()
        if not self._done:
            try:
                for work in self._works:
                    wait_work(work)
                self._result, self._done = self._finish(), True
            finally:
                if self.ended is not None:
                    self.ended(**({} if self._done else {"failed": True}))
                    self.ended = None
        return self._result


def _reraise(error):
    raise error


_deferred = []  # named collectives called and not yet issued, in call order (see defer)


def defer(issue) -> Handle:
    """A Handle for the collective `issue()` issues, issued once the next collective other
    than a barrier is called, or once this Handle (or another deferred one) is polled or
    waited for. Ranks match collectives by order, and Horovod by name: a rank may call a named
    collective before a barrier that its peers call after it (Horovod's duplicate-name tests
    do), and with the collective held back until then, every rank's collectives still go out
    in the same order. Barriers are never held back, so the others' barrier meets this one's."""
    handle = Handle([], None)
    handle._later = (runtime.info(), issue)
    _deferred.append(handle)
    runtime.before_next(issue_deferred)
    return handle


def issue_deferred() -> None:
    runtime.before_next(None)  # (issued here, not again when the first of them takes the group)
    world = runtime.info() if runtime.is_initialized() else None
    while _deferred:
        _deferred.pop(0)._issue(world)


def done(result) -> Handle:
    """A Handle for a result computed already."""
    return Handle([], lambda: result)


def wait_work(work) -> None:
    """Wait for a gloo Work; HorovodInternalError when it fails, or once the driver says the
    world broke while it still waits. Cutting the group's sockets (links.py) fails its pending
    work at once, but not always: a gloo pair whose incoming message was meant for a collective
    that failed already reads no more (its buffer is gone), so it sees neither the cut nor the
    peer's exit, and work waiting on that pair waits out the whole collective timeout."""
    if isinstance(work, Handle):  # waits for its own works
        work.wait()
        return
    started = time.perf_counter()
    try:
        if type(work) is Polled:
            _wait_polled(work)
        else:
            _wait_gloo(work)
    finally:  # the straggler rule's measure (driver/decisions/stragglers.py)
        runtime._current.waited += time.perf_counter() - started


def _wait_gloo(work) -> None:
    while True:
        try:
            work.wait(_SLICE)
            return
        except RuntimeError as e:
            if work.is_completed():  # failed, or finished just as the slice ended
                break
            if _world_broke():
                raise _failed("hvdlite: the driver said this world broke while a collective waited") from e
    try:
        work.wait()
    except RuntimeError as e:
        # gloo reports a dead, hung or cut-off peer as a plain RuntimeError.
        raise _failed(str(e)) from e


def _failed(why: str) -> HorovodInternalError:
    """The error of a collective that failed: its world is of no more use."""
    runtime.fail()
    return HorovodInternalError(why)


class Polled:
    """A Work of an NCCL group (torch/backend.py), with its group, waited by polling: a timed
    wait on one aborts its communicator and throws."""
    __slots__ = ("work", "group")

    def __init__(self, work, group):
        self.work, self.group = work, group

    def is_completed(self) -> bool:
        return self.work.is_completed()


_SPIN = 0.002  # seconds an NCCL wait polls without sleeping: a small collective ends in us
_POLL = 0.001  # seconds between polls after that


def _wait_polled(polled) -> None:
    """Wait for an NCCL Work; HorovodInternalError when it fails (torch's watchdog after the
    collective timeout), once the driver says the world broke while it still waits (the
    heartbeat thread aborts the communicator then: backend.abort), and whenever its group was
    aborted: torch's Work of an aborted communicator says it completed, skipping its error
    check, and its wait() raises nothing, its buffer half reduced."""
    work, group = polled.work, polled.group
    spin = time.perf_counter() + _SPIN
    while not work.is_completed() and not group.aborted:
        if time.perf_counter() < spin:
            time.sleep(0)
            continue
        if _world_broke():
            raise _failed("hvdlite: the driver said this world broke while a collective waited")
        time.sleep(_POLL)
    if group.aborted:
        raise _failed("hvdlite: this world's NCCL communicator was aborted while a collective was pending")
    try:
        work.wait()  # (completed: this raises its error, if it has one)
    except RuntimeError as e:
        raise _failed(str(e)) from e


def _world_broke() -> bool:
    # Only an elastic world (round 1 on) can break; only a worker of `hvdlite run` has a session.
    round_ = runtime.info().round if runtime.is_initialized() else 0
    return round_ > 0 and broken(round_, session().broken)


def traced(kind):
    """Record each call as a span of the collective trace, from issue to the handle's wait
    (only while hvdlite.worker.trace records), named by the caller's name= or else by its
    kind (the wrapped function takes no name). A name= still in flight is refused first, and
    a named call is issued once its ranks agree on the name (_named_issue)."""
    def wrap(issue):
        params = list(inspect.signature(issue).parameters)
        at = params.index("process_set") if "process_set" in params else None

        @functools.wraps(issue)
        def call(*args, name=None, **kwargs):
            if name is not None:
                process_set = args[at] if at is not None and at < len(args) else kwargs.get("process_set")
                return _named(kind, name, lambda: _named_issue(kind, name, process_set, issue, args, kwargs))
            return _traced(kind, issue, name, args, kwargs)
        return call
    return wrap


def _named_issue(kind, name, process_set, issue, args, kwargs):
    """Issue a named collective once every rank of its set issues one of that name here: ranks
    match collectives by order, so named ones called in another order on some rank would
    otherwise sum one tensor with another (MismatchError on every rank instead). One small
    gather, off the unnamed (and the optimizer's) path."""
    pg = process_set.group() if process_set is not None else runtime.process_group()  # (None: the global set)
    agree(pg, kind, f"name {name!r}", name=zlib.crc32(name.encode()))
    return _traced(kind, issue, name, args, kwargs)


def _traced(kind, issue, name, args, kwargs):
    if trace.recorder() is None:
        return issue(*args, **kwargs)
    end = trace.collective(kind, name, runtime.info(), _nbytes(args))
    try:
        out = issue(*args, **kwargs)
    except BaseException:
        end(failed=True)
        raise
    if isinstance(out, Handle):
        out.ended = end
    else:
        end()
    return out


_in_flight = {}  # name= -> (its world, a weak reference to its Handle: a result is not kept here)


def _named(kind, name, issue):
    """A Handle for a collective named `name`, issued later (defer); refused with ValueError
    before anything is sent while another of this world's collectives of that name is in
    flight, as Horovod refuses a name used twice among its pending ones."""
    world = runtime.info()
    if _flying(_in_flight.get(name), world):
        raise ValueError(f"{kind}: a collective named {name!r} is still in flight on this rank; "
                         f"wait for it before issuing another of that name")
    if len(_in_flight) >= _KEPT_NAMES:  # names used once each (a step number in them) go
        for old in [n for n, entry in _in_flight.items() if not _flying(entry, world)]:
            del _in_flight[old]
    handle = defer(issue)
    _in_flight[name] = (world, weakref.ref(handle))
    return handle


def _flying(entry, world) -> bool:
    """Whether an entry of _in_flight is a collective of `world` still in flight (a handle
    dropped once issued cannot be waited for: its name is free)."""
    if entry is None or entry[0] is not world:
        return False
    handle = entry[1]()
    return handle is not None and handle.in_flight()


_KEPT_NAMES = 1024


def _nbytes(args) -> int:
    """Bytes of the tensors a collective was given (its first tensor or list of tensors)."""
    for arg in args:
        tensors = [arg] if torch.is_tensor(arg) else arg if isinstance(arg, (list, tuple)) else []
        if tensors and all(torch.is_tensor(t) for t in tensors):
            return sum(t.numel() * t.element_size() for t in tensors)
    return 0


def synchronize(handle: Handle):
    """The handle's result; None for a handle synchronized before, as in Horovod (whose
    handle map forgets it at the first synchronize, even one that raised)."""
    if handle.taken:
        return None
    handle.taken = True
    return handle.wait()


def poll(handle: Handle) -> bool:
    return handle.poll()


def collective(tensors, result, start, finish=None) -> Handle:
    """Issue start(buffer) -> list of Works on one packed buffer per dtype; waiting runs
    finish(buffer), copies the buffers back into `tensors` and returns `result`."""
    packs = [fusion.Pack(group) for group in fusion.by_dtype(tensors)[0]]
    works = [work for pack in packs for work in start(fusion.carried(pack.flat))]

    def done():
        for pack in packs:
            if finish:
                finish(pack.flat)
            pack.unpack()
        return result
    return Handle(works, done)



def copies(tensors):
    return [t.detach().clone(memory_format=torch.contiguous_format) for t in tensors]



def gather_equal_async(pg, tensor):
    """Start gathering same-shaped tensors; returns (work, their concatenation along dim 0)."""
    tensor = tensor.contiguous()
    out = tensor.new_empty((pg.size() * tensor.shape[0],) + tuple(tensor.shape[1:]))
    parts = [fusion.carried(part) for part in out.chunk(pg.size())]
    return pg.allgather([parts], [fusion.carried(tensor)], AllgatherOptions()), out


def agree(pg, kind, mine: str, **fields) -> None:
    """Check, in one small gather, that every rank of `pg` called collective `kind` with the
    same `fields` (ints; tensors as layout_key's): else MismatchError on every rank alike,
    naming the first field that differs and this rank's call (`mine`), where gloo would
    fail with a timeout, or not at all."""
    values = list(fields.values())
    everyone = gather_equal(pg, torch.tensor(values, dtype=torch.int64)).view(pg.size(), len(values))
    for name, column in zip(fields, everyone.t().tolist()):
        if len(set(column)) > 1:
            raise MismatchError(f"{kind}: the ranks disagree on the {name} (this rank: {mine})")


def layout_key(tensors, skip=0) -> int:
    """One int for the tensors' dtypes and shapes (less their first `skip` dimensions), alike
    in every process (str's hash is not)."""
    return zlib.crc32(repr([(str(t.dtype), tuple(t.shape[skip:])) for t in tensors]).encode())


def gather_equal(pg, tensor):
    work, out = gather_equal_async(pg, tensor)
    wait_work(work)
    return out

