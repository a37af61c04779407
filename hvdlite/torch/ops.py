"""Horovod's collectives on the current gloo group, or on a process set's.

Tensors must live on the CPU; non-contiguous ones are copied to a buffer and back. The
differentiable faces of these (allreduce, allgather, ...) are in hvdlite.torch.autograd. A
collective that fails because the world broke raises HorovodInternalError, which elastic
training recovers from. `name=` names a collective in the timeline; ranks match collectives by
their order, not by name.
"""
import functools
from datetime import timedelta

import numpy
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions  # not re-exported by torch.distributed

from hvdlite.torch import adasum, fusion, joinwire, runtime
from hvdlite.torch.processsets import global_process_set
from hvdlite.worker import objects, trace
from hvdlite.worker.errors import HorovodInternalError
from hvdlite.worker.links import broken
from hvdlite.worker.reduceops import Adasum, Average, Max, Min, Product, Sum, resolve, shares  # noqa: F401
from hvdlite.worker.session import session

_DTYPES = joinwire.DTYPES
_FLOATS, _INTS = {torch.float32, torch.float64}, {torch.int32, torch.int64}  # join's carriers
_SLICE = timedelta(seconds=0.2)  # a wait's checks whether the driver said the world broke


class Handle:
    """A collective in flight: synchronize(handle) waits and returns its result."""

    def __init__(self, works, finish):
        self._works, self._finish = works, finish
        self._done, self._result = False, None
        self.taken = False  # given to synchronize() once: Horovod forgets it then
        self.ended = None  # ends its span in the collective trace, when one is recorded

    def poll(self) -> bool:
        return all(work.is_completed() for work in self._works)

    is_completed = poll  # a Handle can wait on other Handles

    def wait(self):
        if not self._done:
            try:
                for work in self._works:
                    _wait(work)
                self._result, self._done = self._finish(), True
            finally:
                if self.ended is not None:
                    self.ended(**({} if self._done else {"failed": True}))
                    self.ended = None
        return self._result


def _done(result) -> Handle:
    """A Handle for a result computed already."""
    return Handle([], lambda: result)


def _wait(work) -> None:
    """Wait for a gloo Work; HorovodInternalError when it fails, or once the driver says the
    world broke while it still waits. Cutting the group's sockets (links.py) fails its pending
    work at once, but not always: a gloo pair whose incoming message was meant for a collective
    that failed already reads no more (its buffer is gone), so it sees neither the cut nor the
    peer's exit, and work waiting on that pair waits out the whole collective timeout."""
    if isinstance(work, Handle):  # waits for its own works
        work.wait()
        return
    while True:
        try:
            work.wait(_SLICE)
            return
        except RuntimeError as e:
            if work.is_completed():  # failed, or finished just as the slice ended
                break
            if _world_broke():
                raise HorovodInternalError("hvdlite: the driver said this world broke while a "
                                           "collective waited") from e
    try:
        work.wait()
    except RuntimeError as e:
        # gloo reports a dead, hung or cut-off peer as a plain RuntimeError.
        raise HorovodInternalError(str(e)) from e


def _world_broke() -> bool:
    # Only an elastic world (round 1 on) can break; only a worker of `hvdlite run` has a session.
    round_ = runtime.info().round if runtime.is_initialized() else 0
    return round_ > 0 and broken(round_, session().broken)


def _traced(kind):
    """Record each call as a span of the collective trace, from issue to the handle's wait
    (only while hvdlite.worker.trace records), named by the caller's name= or else by its
    kind (the wrapped function takes no name)."""
    def wrap(issue):
        @functools.wraps(issue)
        def traced(*args, name=None, **kwargs):
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
        return traced
    return wrap


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


def _collective(tensors, result, start, finish=None) -> Handle:
    """Issue start(buffer) -> list of Works on one packed buffer per dtype; waiting runs
    finish(buffer), copies the buffers back into `tensors` and returns `result`."""
    packs = [fusion.Pack(group) for group in fusion.by_dtype(tensors)[0]]
    works = [work for pack in packs for work in start(pack.flat)]

    def done():
        for pack in packs:
            if finish:
                finish(pack.flat)
            pack.unpack()
        return result
    return Handle(works, done)


def _announce(pg, layout, works, room=None, guess=None):
    """Issue join's envelope (see joinwire) for this rank's allreduce `layout`, carrying the
    data in `room` when given; after a wrong guess, the control exchange too. Returns what
    the handle checks once done: (envelope, control or None, layout)."""
    wire = joinwire.wire()
    guess = wire.guess() if guess is None else guess
    wire.record(layout)
    wrong = layout != guess
    envelope = joinwire.envelope(guess, joinwire.WRONG if wrong else joinwire.RIGHT, pg.size(), room)
    works.append(envelope.issue(pg))
    control = None
    if wrong:
        control, work = joinwire.Control.issue(pg, layout)
        works.append(work)
    return envelope, control, layout


def _check_announced(pg, envelope, control, layout) -> None:
    said = envelope.said(pg.size())
    if (control is None and said == joinwire.WRONG) or (control is not None and not control.agrees(layout)):
        raise joinwire.disagree(layout)


def _packed(group, room, copy, prescale_factor, divisor):
    """`group` packed and prescaled. Floats copied into a buffer are divided for Average as
    they are copied (no pass of its own); otherwise the division waits for the sum, when it
    overlaps with the peers' work. Returns the pack and the divisor left for after the sum."""
    floats = group[0].is_floating_point()
    pack = fusion.Pack(group, room, copy, scale=prescale_factor / divisor if floats else None)
    if pack.scaled:
        return pack, 1
    fusion.scale(pack.flat, prescale_factor)
    return pack, divisor


def _issue_announced(pg, group, op, prescale_factor, divisor, copy, works):
    """Pack `group` and issue its allreduce in join's envelope: one collective when the layout
    was guessed right and its data rides along, else the envelope and then the data."""
    owned = copy or len(group) > 1 or not group[0].is_contiguous()
    layout = joinwire.layout(sum(t.numel() for t in group), group[0].dtype, op, owned)
    guess = joinwire.wire().guess()
    rides = layout == guess and layout.carried
    pack, left = _packed(group, 1 if rides else 0, copy, prescale_factor, divisor)
    checks = _announce(pg, layout, works, pack.buffer if rides else None, guess)
    if not rides:
        works.append(pg.allreduce([pack.flat], joinwire.OPTIONS[op]))
    return pack, left, checks


@_traced("allreduce")
def _allreduce_async(tensors, average, op, prescale_factor, postscale_factor, process_set,
                     copy, single=False) -> Handle:
    """Reduce `tensors`, fused into one buffer per dtype: in place, or (copy=True) into new
    tensors. The handle's result is the list of them, or its only one (single=True)."""
    op = resolve(op, average)
    pg = process_set.group()
    if op == Adasum:
        return _adasum(pg, tensors, copy, prescale_factor, postscale_factor, single)
    divisor = pg.size() if op == Average else 1
    op = Sum if op == Average else op
    announced = process_set is global_process_set and joinwire.wire().on
    if announced and single:
        handle = _lone(pg, tensors[0], op, prescale_factor, postscale_factor, divisor, copy)
        if handle is not None:
            return handle
    groups, where = fusion.by_dtype(tensors)
    packs, announced_checks, works = [], [], []
    for group in groups:
        if announced:
            pack, left, checks = _issue_announced(pg, group, op, prescale_factor, divisor, copy, works)
            announced_checks.append(checks)
        else:
            pack, left = _packed(group, 0, copy, prescale_factor, divisor)
            works.append(pg.allreduce([pack.flat], joinwire.OPTIONS[op]))
        packs.append((pack, left))

    def done():
        for checks in announced_checks:
            _check_announced(pg, *checks)
        for pack, left in packs:
            fusion.average(pack.flat, postscale_factor, left)
        if copy:
            parts = [pack.parts() for pack, _ in packs]
            out = [parts[g][i] for g, i in where]
        else:
            for pack, _ in packs:
                pack.unpack()
            out = tensors
        return out[0] if single else out
    return Handle(works, done)


def _lone(pg, tensor, op, prescale_factor, postscale_factor, divisor, copy):
    """A small contiguous lone tensor whose layout was guessed right rides in its layout's
    kept envelope (joinwire.Slot): numpy copies in and out around one gloo call. At 4 bytes
    every microsecond here costs several of latency, so this path stays bare. None when it
    does not apply (the general path)."""
    dtype = tensor.dtype
    floats = dtype in _FLOATS
    if not (floats or (dtype in _INTS and divisor == 1 and prescale_factor == 1 and postscale_factor == 1)):
        return None
    numel = tensor.numel()
    if numel * dtype.itemsize > joinwire.COPY_LIMIT or not tensor.is_cpu or not tensor.is_contiguous():
        return None
    wire = joinwire.wire()
    layout = joinwire.layout(numel, dtype, op, copy)
    slot = wire.slot(layout) if layout == wire.guess() and layout.carried else None
    if slot is None:
        return None
    slot.busy = True
    wire.record(layout)
    mine = (tensor.detach() if tensor.requires_grad else tensor).numpy()
    data = slot.shaped(mine.shape)
    scale = prescale_factor / divisor
    if floats and scale != 1:
        numpy.multiply(mine, scale, out=data)
    else:
        numpy.copyto(data, mine)
    _, right, wrong = joinwire.states(op, pg.size())
    slot.array[0] = right
    work = pg.allreduce([slot.buffer], joinwire.OPTIONS[op])

    def done():
        try:
            said = slot.array[0]
            if said >= wrong if op == Sum else said == wrong:
                raise joinwire.disagree(layout)
            if postscale_factor != 1:
                numpy.multiply(data, postscale_factor, out=data)
            if copy:
                return torch.from_numpy(data.copy())
            numpy.copyto(mine, data)
            return tensor
        finally:
            slot.busy = False
    return Handle([work], done)


def _adasum(pg, tensors, copy, prescale_factor, postscale_factor, single) -> Handle:
    """Adasum needs every rank's whole tensor (its dot products are per tensor): gather them,
    then combine them on every rank alike. Runs at the call; the handle is complete."""
    announced = pg is runtime.process_group() and joinwire.wire().on
    results = []
    for tensor in tensors:
        fusion.check_cpu(tensor)
        if not tensor.is_floating_point():
            raise ValueError(f"Adasum needs floating point tensors, got {tensor.dtype}")
        mine = tensor.detach().contiguous().view(1, -1).clone()
        fusion.scale(mine, prescale_factor)
        works = []
        if announced:  # joined ranks take part with zeros, which Adasum leaves out
            checks = _announce(pg, joinwire.layout(mine.numel(), mine.dtype, Adasum, False), works)
        combined = adasum.reduce(_gather_equal(pg, mine))
        for work in works:
            _wait(work)
        if works:
            _check_announced(pg, *checks)
        fusion.scale(combined, postscale_factor)
        combined = combined.view(tensor.shape)
        results.append(combined if copy else tensor.detach().copy_(combined))
    out = results if copy else tensors
    return _done(out[0] if single else out)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """Reduce `tensors` in place, fused into one buffer per dtype."""
    return _allreduce_async(list(tensors), average, op, prescale_factor, postscale_factor,
                            process_set, False, name=name)


def _copies(tensors):
    return [t.detach().clone(memory_format=torch.contiguous_format) for t in tensors]


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """Reduce `tensors` into new ones (views of one fused buffer per dtype)."""
    return _allreduce_async(list(tensors), average, op, prescale_factor, postscale_factor,
                            process_set, True, name=name)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                    postscale_factor, process_set).wait()


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set) -> Handle:
    return _allreduce_async([tensor], average, op, prescale_factor, postscale_factor,
                            process_set, False, True, name=name)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set) -> Handle:
    return _allreduce_async([tensor], average, op, prescale_factor, postscale_factor,
                            process_set, True, True, name=name)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                            process_set).wait()


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    raise NotImplementedError(
        "hvdlite has no sparse allreduce: reduce tensor.to_dense() with allreduce, or pass "
        "sparse_as_dense=True to DistributedOptimizer")


@_traced("join")
def join(device=-1) -> int:
    """This rank has no more data: answer the other ranks' allreduces on the global set with
    zeros (the op's identity for Min, Max and Product) until every rank joined. Returns the
    rank that joined last. While a rank is joined the others may only allreduce."""
    pg = runtime.process_group()
    if not joinwire.wire().on:
        raise RuntimeError(f"hvd.join() needs the allreduce envelopes that {joinwire.JOIN_ENV}=0 turned off")
    wire, first = joinwire.wire(), True
    while True:
        guess = wire.guess()
        envelope = joinwire.envelope(guess, joinwire.JOINED, pg.size())
        _wait(envelope.issue(pg))
        said = envelope.said(pg.size())
        if said == joinwire.JOINED:  # everyone is in join(): who came last?
            control, work = joinwire.Control.issue(pg, joined_now=first)
            _wait(work)
            return max(control.joined_now(), default=pg.rank())
        first = False
        actual = guess
        if said == joinwire.WRONG:
            control, work = joinwire.Control.issue(pg)
            _wait(work)
            actual = control.layout()
        wire.record(actual)
        if said == joinwire.RIGHT and actual.carried:
            continue  # the data rode in the envelope
        dtype = actual.torch_dtype
        if actual.op == Adasum:
            _gather_equal(pg, torch.zeros(1, actual.numel, dtype=dtype))
        else:
            _wait(pg.allreduce([joinwire.identity(actual.op, dtype, actual.numel)],
                               joinwire.OPTIONS[actual.op]))


@_traced("broadcast")
def _broadcast_async(tensors, result, root_rank, process_set) -> Handle:
    pg = process_set.group()
    if not 0 <= root_rank < runtime.info().size:
        raise ValueError(f"root_rank {root_rank} is outside the world of size {runtime.info().size}")
    options = dist.BroadcastOptions()
    options.rootRank = process_set.set_rank(root_rank, "root_rank")
    return _collective(tensors, result, lambda flat: [pg.broadcast([flat], options)])


def grouped_broadcast_async_(tensors, root_rank, process_set=global_process_set) -> Handle:
    """Overwrite `tensors` with root_rank's, fused into one buffer per dtype."""
    tensors = list(tensors)
    return _broadcast_async(tensors, tensors, root_rank, process_set)


def grouped_broadcast_(tensors, root_rank, process_set=global_process_set):
    return grouped_broadcast_async_(tensors, root_rank, process_set).wait()


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """root_rank is a rank of the world, and must be in the process set."""
    return _broadcast_async([tensor], tensor, root_rank, process_set, name=name)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    return broadcast_async_(_copies([tensor])[0], root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


def _gather_equal_async(pg, tensor):
    """Start gathering same-shaped tensors; returns (work, their concatenation along dim 0)."""
    fusion.check_cpu(tensor)
    tensor = tensor.contiguous()
    out = tensor.new_empty((pg.size() * tensor.shape[0],) + tuple(tensor.shape[1:]))
    return pg.allgather([list(out.chunk(pg.size()))], [tensor], AllgatherOptions()), out


def _gather_equal(pg, tensor):
    work, out = _gather_equal_async(pg, tensor)
    _wait(work)
    return out


@_traced("allgather")
def _allgather_async(tensor, process_set) -> Handle:
    """A Handle whose result is every rank's tensor, in rank order; first dimensions may
    differ between ranks. The shapes are exchanged at the call, the data in the background."""
    if tensor.dim() == 0:
        raise ValueError("allgather needs a tensor with at least one dimension")
    pg = process_set.group()
    size, rest = pg.size(), tuple(tensor.shape[1:])
    # One small gather of (first dim, rest of the shape) lets every rank size its buffer and
    # lets all ranks agree to fail when the shapes are incompatible.
    meta = torch.tensor([tensor.shape[0], tensor.dim(), torch.Size(rest).numel(),
                         _DTYPES.index(tensor.dtype)])
    metas = _gather_equal(pg, meta).view(size, len(meta)).tolist()
    if any(m[1:] != metas[0][1:] for m in metas):
        raise ValueError(f"allgather: ranks disagree on the dtype or on all but the first "
                         f"dimension: {metas}")
    firsts = [m[0] for m in metas]
    longest = max(firsts)
    if longest == 0:
        return _done([tensor.new_empty((0,) + rest)] * size)
    padded = tensor.detach()
    if tensor.shape[0] < longest:
        padded = torch.cat([padded, padded.new_empty((longest - tensor.shape[0],) + rest)])
    work, gathered = _gather_equal_async(pg, padded)
    return Handle([work], lambda: [gathered[r * longest: r * longest + n] for r, n in enumerate(firsts)])


def allgather_async(tensor, name=None, process_set=global_process_set) -> Handle:
    """Concatenate every rank's tensor along the first dimension, in rank order."""
    parts = _allgather_async(tensor, process_set, name=name)
    return Handle([parts], lambda: torch.cat(parts.wait()))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> Handle:
    handles = [allgather_async(t, name, process_set) for t in tensors]
    return Handle(handles, lambda: [h.wait() for h in handles])


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> Handle:
    """Send rows splits[i] (in order) of `tensor` to rank i of the set; the result is the rows
    received from every rank, in rank order, and how many came from each rank (int32, or the
    dtype of `splits` when a tensor), as Horovod's. Without splits the first dimension is
    split evenly."""
    return _alltoall_async(tensor, splits, process_set, name=name)


@_traced("alltoall")
def _alltoall_async(tensor, splits, process_set) -> Handle:
    fusion.check_cpu(tensor)
    pg = process_set.group()
    size = pg.size()
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")
    if splits is None:
        if tensor.shape[0] % size:
            raise ValueError(f"alltoall: the first dimension ({tensor.shape[0]}) is not divisible "
                             f"by the number of ranks ({size}); pass splits")
        send = [tensor.shape[0] // size] * size
    else:
        send = [int(s) for s in (splits.tolist() if torch.is_tensor(splits) else splits)]
        if len(send) != size or any(s < 0 for s in send) or sum(send) != tensor.shape[0]:
            raise ValueError(f"alltoall: splits {send} must be {size} non-negative counts "
                             f"summing to the first dimension ({tensor.shape[0]})")
    received = torch.empty(size, dtype=torch.int64)
    _wait(pg.alltoall_base(received, torch.tensor(send, dtype=torch.int64), [], [],
                           dist.AllToAllOptions()))
    recv = received.tolist()
    rest = tuple(tensor.shape[1:])
    out = tensor.new_empty((sum(recv),) + rest)
    row = torch.Size(rest).numel()
    if row == 0 or (sum(recv) == 0 and sum(send) == 0):
        works = []
    else:
        works = [pg.alltoall_base(out, tensor.detach().contiguous(), recv, send,
                                  dist.AllToAllOptions())]
    kind = splits.dtype if torch.is_tensor(splits) else torch.int32
    return Handle(works, lambda: (out, received.to(kind)))


@_traced("reducescatter")
def _reducescatter_async(tensors, op, prescale_factor, postscale_factor, process_set) -> Handle:
    op = Average if op is None else op
    if op not in (Average, Sum):
        raise ValueError("reducescatter reduces with op=Average or op=Sum only")
    pg = process_set.group()
    size, me = pg.size(), pg.rank()
    works, finishers = [], []
    for tensor in tensors:
        fusion.check_cpu(tensor)
        if tensor.dim() == 0:
            raise ValueError("reducescatter needs a tensor with at least one dimension")
        counts, rest = shares(tensor.shape[0], size), tuple(tensor.shape[1:])
        longest = counts[0]
        # Every rank's rows padded to the longest share, so that gloo scatters equal parts.
        padded = tensor.new_zeros((size * longest,) + rest)
        for r, part in enumerate(tensor.detach().split(counts)):
            padded[r * longest: r * longest + counts[r]] = part
        fusion.scale(padded, prescale_factor)
        out = tensor.new_empty((longest,) + rest)
        if out.numel():
            options = dist.ReduceScatterOptions()
            options.reduceOp = dist.ReduceOp.SUM
            works.append(pg._reduce_scatter_base(out, padded, options))
        finishers.append((out, counts[me]))

    def finish():
        results = []
        for out, rows in finishers:
            out = out[:rows]
            fusion.average(out, postscale_factor, size if op == Average else 1)
            results.append(out)
        return results
    return Handle(works, finish)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    return _reducescatter_async(list(tensors), op, prescale_factor, postscale_factor, process_set,
                                name=name)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    """Reduce every rank's tensor and give rank i its i-th share of the first dimension
    (as even as possible, the first ranks one row more)."""
    handle = _reducescatter_async([tensor], op, prescale_factor, postscale_factor, process_set,
                                  name=name)
    return Handle([handle], lambda: handle.wait()[0])


def _to_bytes_tensor(obj):
    return torch.frombuffer(bytearray(objects.dumps(obj)), dtype=torch.uint8)


def _from_bytes_tensor(tensor):
    return objects.loads(tensor.numpy())


# broadcast_object sends the length and the first bytes of the pickle in one collective of
# this size, and the rest (if any) in a second: the small objects of a state sync (optimizer
# layout, plain attributes) cost one collective, not two.
_OBJECT_HEAD = 4096
_LENGTH = 8


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's `obj` on every rank of the set (the root gets its own object back)."""
    is_root = runtime.info().rank == root_rank
    head = torch.zeros(_OBJECT_HEAD, dtype=torch.uint8)
    if is_root:
        payload = _to_bytes_tensor(obj)
        head[:_LENGTH] = torch.tensor(list(len(payload).to_bytes(_LENGTH, "little")), dtype=torch.uint8)
        first = payload[:_OBJECT_HEAD - _LENGTH]
        head[_LENGTH:_LENGTH + len(first)] = first
    broadcast_(head, root_rank, process_set=process_set)
    length = int.from_bytes(head[:_LENGTH].numpy().tobytes(), "little")
    if length > _OBJECT_HEAD - _LENGTH:
        rest = payload[_OBJECT_HEAD - _LENGTH:] if is_root \
            else torch.empty(length - (_OBJECT_HEAD - _LENGTH), dtype=torch.uint8)
        broadcast_(rest, root_rank, process_set=process_set)
        if not is_root:
            payload = torch.cat([head[_LENGTH:], rest])
    elif not is_root:
        payload = head[_LENGTH:_LENGTH + length]
    return obj if is_root else _from_bytes_tensor(payload)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's `obj`, as a list in rank order."""
    parts = _allgather_async(_to_bytes_tensor(obj), process_set).wait()
    return [_from_bytes_tensor(part) for part in parts]


@_traced("barrier")
def barrier(process_set=global_process_set):
    _wait(process_set.group().barrier(dist.BarrierOptions()))
