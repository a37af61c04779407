"""Allreduce, in every Horovod form, and join(): each allreduce carries join's state (see
joinwire), so a rank that joined takes part in the others' allreduces until every rank has."""
import torch

from hvdlite.torch import adasum, backend, devices, fusion, handles, joinwire, lone, runtime
from hvdlite.torch.handles import Handle
from hvdlite.torch.processsets import global_process_set
from hvdlite.worker import trace
from hvdlite.worker.reduceops import Adasum, Sum, resolve


def _announce(pg, wire, layout, works, room=None, guess=None, data=None):
    """Issue join's envelope (see joinwire) for this rank's allreduce `layout`, carrying the
    data in `room` when given; after a wrong guess, the control exchange too. A guess that
    goes ahead (Layout.ahead) is preceded by its allreduce: of `data` when guessed right,
    else of the identity; a flagged one guessed right has no envelope until its data is
    reduced. Returns what the handle checks once done: (envelope or lone.Flag, control or
    None, layout)."""
    guess = wire.guess() if guess is None else guess
    wire.record(layout)
    wrong = layout != guess
    if guess.flagged and not wrong:
        flag = lone.Flag(pg, guess, data)
        works.append(flag.work)
        return flag, None, layout
    if guess.ahead:
        works.append(joinwire.issue_ahead(pg, guess, None if wrong else data))
    envelope = joinwire.envelope(guess, joinwire.WRONG if wrong else joinwire.RIGHT, pg.size(), room)
    works.append(envelope.issue(pg))
    control = None
    if wrong:
        control, work = joinwire.Control.issue(pg, layout)
        works.append(work)
    return envelope, control, layout


def _check_announced(pg, envelope, control, layout) -> None:
    if isinstance(envelope, lone.Flag):
        envelope.settle(pg, layout)
        return
    said = envelope.said(pg.size())
    if control is None and said == joinwire.WRONG:
        raise joinwire.wrong_elsewhere(pg, layout)
    if control is not None and not control.agrees(layout):
        raise joinwire.disagree(layout)


def _packed(group, room, copy, prescale_factor):
    """`group` packed and prescaled: float32/64 copied into a buffer are scaled as they are
    copied (no pass of its own). An Average's division waits for the sum, as Horovod's does:
    parts divided before their sum lose the bits Horovod keeps (at 3 ranks x + x + x, then
    divided by 3, is x again; x / 3 summed three times is not)."""
    floats = group[0].dtype in joinwire.FLOATS
    pack = fusion.Pack(group, room, copy, scale=prescale_factor if floats else None)
    if not pack.scaled:
        fusion.scale(pack.flat, prescale_factor)
    return pack


def _issue_announced(pg, wire, group, op, prescale_factor, copy, waits, works, shape):
    """Pack `group` and issue its allreduce in join's envelope: one collective when the layout
    was guessed right and its data rides along or is flagged; the data, then the state, when
    it was guessed right and goes ahead; else the envelope and then the data. `shape`: a lone
    tensor's (None for a group's of several)."""
    owned = copy or len(group) > 1 or not group[0].is_contiguous()
    layout = joinwire.layout(sum(t.numel() for t in group), group[0].dtype, op, owned, waits, shape)
    guess = wire.guess()
    rides = layout == guess and layout.carried
    # A carried layout's data sits behind the state element whether it rides in the envelope
    # or follows a wrong guess (Layout.sent): the buffer gloo sums is the same either way.
    pack = _packed(group, layout.sent - layout.numel, copy, prescale_factor)
    checks = _announce(pg, wire, layout, works, pack.buffer if rides else None, guess, pack.flat)
    if layout != guess:  # (guessed right, it rode in the envelope or went ahead of it)
        # Issued once the control exchange shows the ranks agree on it: tensors of another
        # dtype or size would leave gloo waiting out its timeout. (A wrong guess is rare.)
        for work in works:
            handles.wait_work(work)
        _check_announced(pg, *checks)
        works.append(pg.allreduce([pack.buffer], joinwire.OPTIONS[op]))
    return pack, checks


@handles.traced("allreduce")
@devices.staged
def _allreduce_async(tensors, average, op, prescale_factor, postscale_factor, process_set,
                     copy, single=False, waits=False) -> Handle:
    """Reduce `tensors`, fused into one buffer per dtype: in place, or (copy=True) into new
    tensors. The handle's result is the list of them, or its only one (single=True). With
    waits=True the caller waits on the handle before it issues anything else."""
    op = resolve(op, average)
    pg = process_set.group()
    if op == Adasum:
        return _adasum(pg, tensors, copy, prescale_factor, postscale_factor, single)
    op, divisor = lone.as_sum(op, pg)
    wire = joinwire.wire()
    # (CUDA tensors reach here on NCCL only, devices.staged: join is refused there)
    announced = process_set is global_process_set and wire.on and (not tensors or tensors[0].is_cpu)
    groups, where = fusion.by_dtype(tensors)
    waits = waits and len(groups) == 1  # (a flagged group's state may not come after another's)
    packs, announced_checks, works = [], [], []
    for group in groups:
        if announced:
            pack, checks = _issue_announced(pg, wire, group, op, prescale_factor, copy, waits, works,
                                            tensors[0].shape if len(tensors) == 1 else None)
            announced_checks.append(checks)
        else:
            pack = _packed(group, 0, copy, prescale_factor)
            works.append(backend.data(pg, pack.flat).allreduce([pack.flat], joinwire.OPTIONS[op]))
        packs.append(pack)

    def done():
        for checks in announced_checks:
            _check_announced(pg, *checks)
        for pack in packs:
            fusion.average(pack.flat, postscale_factor, divisor)
        if copy:
            parts = [pack.parts() for pack in packs]
            out = [parts[g][i] for g, i in where]
        else:
            for pack in packs:
                pack.unpack()
            out = tensors
        return out[0] if single else out
    return Handle(works, done)


def prepacked(numel, dtype, process_set, shape=None):
    """For a caller that packs its own fused buffers (DistributedOptimizer's buckets): the
    layout of a summed allreduce of `numel` elements when it can ride alone in join's envelope
    (the global set, join on, float32/64, its layout guessed right, no trace recorded), else
    None: then the caller takes the general path, which keeps the wire's history alike.
    `shape`: the tensor's, for a buffer of one."""
    if process_set is not global_process_set or dtype not in joinwire.FLOATS or trace.recorder() is not None:
        return None
    wire = joinwire.wire()
    layout = joinwire.layout(numel, dtype, Sum, True, shape=shape)
    return layout if wire.on and layout == wire.guess() else None


def prepacked_async(packed, layout, postscale_factor, divisor) -> Handle:
    """Sum a fusion.Packed buffer across the global set in join's envelope: its first element
    is left for the state, the data of `layout` (from prepacked()) follows, packed and
    prescaled by the caller. The handle's result is the buffer, the data postscaled. The
    state goes in and is read back through the buffer's kept numpy view (a new view after
    the transfer costs ~17 us cold)."""
    wire = joinwire.wire()
    wire.record(layout)
    size = wire.world.size
    packed.array[0] = joinwire.states(Sum, size)[joinwire.RIGHT]
    buffer = packed.buffer
    work = runtime.process_group().allreduce([buffer], joinwire.OPTIONS[Sum])

    def done():
        if joinwire.reading(packed.array.item(0), Sum, size) == joinwire.WRONG:
            raise joinwire.wrong_elsewhere(runtime.process_group(), layout)
        fusion.average(buffer[1:], postscale_factor, divisor)
        return buffer
    return Handle([work], done)


def _adasum(pg, tensors, copy, prescale_factor, postscale_factor, single) -> Handle:
    """Adasum needs every rank's whole tensor (its dot products are per tensor): gather them,
    then combine them on every rank alike. Runs at the call; the handle is complete."""
    announced = pg is runtime.process_group() and joinwire.wire().on
    results = []
    for tensor in tensors:
        if not tensor.is_floating_point():
            raise ValueError(f"Adasum needs floating point tensors, got {tensor.dtype}")
        mine = tensor.detach().contiguous().view(1, -1).clone()
        fusion.scale(mine, prescale_factor)
        works = []
        if announced:  # joined ranks take part with zeros, which Adasum leaves out
            checks = _announce(pg, joinwire.wire(), joinwire.layout(mine.numel(), mine.dtype, Adasum, False), works)
        combined = adasum.reduce(handles.gather_equal(backend.data(pg, mine), mine))
        for work in works:
            handles.wait_work(work)
        if works:
            _check_announced(pg, *checks)
        fusion.scale(combined, postscale_factor)
        combined = combined.view(tensor.shape)
        results.append(combined if copy else tensor.detach().copy_(combined))
    out = results if copy else tensors
    return handles.done(out[0] if single else out)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """Reduce `tensors` in place, fused into one buffer per dtype."""
    return _allreduce_async(list(tensors), average, op, prescale_factor, postscale_factor,
                            process_set, False, name=name)



def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """Reduce `tensors` into new ones (views of one fused buffer per dtype)."""
    return _allreduce_async(list(tensors), average, op, prescale_factor, postscale_factor,
                            process_set, True, name=name)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return _allreduce_async(list(tensors), average, op, prescale_factor, postscale_factor,
                            process_set, False, waits=True, name=name).wait()


def _one_async(tensor, average, op, prescale_factor, postscale_factor, process_set, copy, name):
    if name is None:  # (a named one's is checked against the names in flight: handles.traced)
        handle = lone.short(tensor, average, op, prescale_factor, postscale_factor, process_set, copy, False)
        if handle is not None:
            return handle
    return _allreduce_async([tensor], average, op, prescale_factor, postscale_factor,
                            process_set, copy, True, name=name)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set) -> Handle:
    return _one_async(tensor, average, op, prescale_factor, postscale_factor, process_set, False, name)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set) -> Handle:
    return _one_async(tensor, average, op, prescale_factor, postscale_factor, process_set, True, name)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Waits at the call, with no Handle where a short path applies: ~1 us less than
    allreduce_async_(...).wait(). A failed wait keeps the slot held (its works may still
    write)."""
    done = lone.short(tensor, average, op, prescale_factor, postscale_factor, process_set, False, True)
    if done is not None:
        return done
    return _allreduce_async([tensor], average, op, prescale_factor, postscale_factor,
                            process_set, False, True, waits=True, name=name).wait()


@handles.traced("join")
def join(device=-1) -> int:
    """This rank has no more data: answer the other ranks' allreduces on the global set with
    zeros (the op's identity for Min, Max and Product) until every rank joined. Returns the
    rank that joined last. While a rank is joined the others may only allreduce: their other
    collectives raise RuntimeError (joinwire.refuse_if_joined)."""
    pg = runtime.process_group()
    if not joinwire.wire().on:
        raise RuntimeError(f"hvd.join() needs the allreduce envelopes that {joinwire.JOIN_ENV}=0 turned off")
    if backend.active():
        raise RuntimeError("hvd.join() runs on gloo only: this world's CUDA allreduces take NCCL, "
                           "which carries no join state; run with --backend gloo")
    current = runtime._current
    current.idle = True  # idle, not slow: its heartbeats say so (worker/runtime.idle)
    try:
        return _answer_until_all_joined(pg)
    finally:
        current.idle = False


def _answer_until_all_joined(pg) -> int:
    wire, first = joinwire.wire(), True
    while True:
        guess = wire.guess()
        # (a guess that goes ahead: the active ranks' data comes first)
        works = [joinwire.issue_ahead(pg, guess)] if guess.ahead else []
        envelope = joinwire.envelope(guess, joinwire.JOINED, pg.size())
        works.append(envelope.issue(pg))
        for work in works:
            handles.wait_work(work)
        said = envelope.said(pg.size())
        if said == joinwire.JOINED:  # everyone is in join(): who came last?
            control, work = joinwire.Control.issue(pg, joined_now=first)
            handles.wait_work(work)
            return max(control.joined_now(), default=pg.rank())
        first = False
        actual = guess
        if said == joinwire.WRONG:
            control, work = joinwire.Control.issue(pg)
            handles.wait_work(work)
            actual = control.layout()
        wire.record(actual)
        if actual == joinwire.NOT_ALLREDUCE or (said == joinwire.RIGHT and (actual.carried or actual.ahead)):
            continue  # another collective refused, or the data rode in the envelope or went ahead
        dtype = actual.torch_dtype
        if actual.op == Adasum:
            handles.gather_equal(pg, torch.zeros(1, actual.numel, dtype=dtype))
        else:
            handles.wait_work(pg.allreduce([joinwire.identity(actual.op, dtype, actual.sent)],
                               joinwire.OPTIONS[actual.op]))

