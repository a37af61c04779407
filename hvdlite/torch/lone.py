"""A lone tensor's allreduce on its short paths, taken when join's guess (see joinwire) was
right and nothing calls for the general path in allreduce.py: a small one in its layout's kept
envelope, a big in-place one ahead of its kept state, or, flagged, alone."""

import numpy
import torch

from hvdlite.torch import fusion, handles, joinwire, runtime
from hvdlite.torch.handles import Handle
from hvdlite.torch.processsets import global_process_set
from hvdlite.worker import trace
from hvdlite.worker.reduceops import Adasum, Average, Sum, resolve


class Flag:
    """A flagged allreduce guessed right (see joinwire), in flight: its first element (a
    cell in the data), this rank's value there as sent, and its work."""
    __slots__ = ("cell", "first", "work")

    def __init__(self, pg, layout, flat):
        """Issue the allreduce of `flat`, of the flagged `layout`, where it goes ahead
        (joinwire.issue_ahead). The first element is read before gloo may write over it."""
        self.cell = joinwire.front(flat, flat.dtype)
        self.first = self.cell.value
        self.work = joinwire.issue_ahead(pg, layout, flat)

    def settle(self, pg, layout) -> None:
        """Once reduced: a NaN in front calls for join's state, every rank seeing it alike."""
        reduced = self.cell.value
        if reduced == reduced:  # (not a NaN: every rank active and right)
            return
        envelope = joinwire.envelope(layout, joinwire.RIGHT, pg.size())
        envelope.buffer[1] = self.first
        handles.wait_work(envelope.issue(pg))
        if envelope.said(pg.size()) == joinwire.WRONG:
            raise joinwire.wrong_elsewhere(pg, layout)
        self.cell.value = envelope.buffer.numpy().item(1)  # the active ranks' sum


def as_sum(op, pg):
    """(op, divisor): an Average is a Sum divided by the group's size."""
    return (Sum, pg.size()) if op == Average else (op, 1)


# (shape, dtype, op, copy, wait) -> its Layout if a short path takes it (a small carried one,
# or one not carried in place), else False: making a Layout costs more than finding it.
_LAYOUTS = {}


def _short_layout(key):
    shape, dtype, op, copy, wait = key
    numel = shape.numel()
    layout = joinwire.layout(numel, dtype, op, copy, wait, shape)
    if len(_LAYOUTS) > 4096:  # a script of ever-new sizes
        _LAYOUTS.clear()
    if layout.carried:
        taken = numel * dtype.itemsize <= joinwire.COPY_LIMIT
    else:  # (a new tensor out of place is the general path's copy, scaled as it copies)
        taken = not copy
    _LAYOUTS[key] = layout if taken else False
    return _LAYOUTS[key]


def short(tensor, average, op, prescale_factor, postscale_factor, process_set, copy, wait):
    """The allreduce of a contiguous lone tensor whose layout join's guess got right: a small
    carried one rides in its layout's kept envelope (joinwire.Slot), an in-place one that is
    not carried goes ahead of it (_ahead), a flagged one needs none (_flagged). Returns the
    result (wait=True) or a Handle; None for the general path (a span to record, or anything
    else). A small one's call is a numpy copy in, one gloo call and (_landed) a copy out. The
    path stays bare: at 4 bytes each microsecond here costs several of latency, and at 1 MB
    each call still costs ~1 us, the wait having left the caches cold."""
    if process_set is not global_process_set or trace.recorder() is not None:
        return None
    resolved = resolve(op, average)
    wire = joinwire.wire()
    if not wire.on or resolved == Adasum or not tensor.is_cpu or not tensor.is_contiguous():
        return None
    pg = runtime.process_group()
    summed, divisor = as_sum(resolved, pg)
    key = (tensor.shape, tensor.dtype, summed, copy, wait)
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = _short_layout(key)
    if layout != wire.guess():  # (False is never a guess)
        return None
    if layout.flagged:  # (made only for a caller that waits)
        return _flagged(pg, wire, layout, tensor, prescale_factor, postscale_factor, divisor)
    slot = wire.slot(layout)
    if slot is None:
        return None
    if slot.ahead:
        return _ahead(pg, wire, slot, tensor, prescale_factor, postscale_factor, divisor, wait)
    floats = tensor.dtype in joinwire.FLOATS
    if not (floats or (divisor == 1 and prescale_factor == 1 and postscale_factor == 1)):
        return None  # an integer to scale: the general path's torch arithmetic
    slot.take(tensor)
    wire.record(layout)
    if floats and prescale_factor != 1:
        numpy.multiply(slot.mine, prescale_factor, out=slot.view)
    else:
        slot.view[...] = slot.mine  # for a few elements quicker than numpy.copyto
    slot.array[0] = slot.right
    work = pg.allreduce([slot.buffer], joinwire.OPTIONS[summed])
    if not wait:
        return Handle([work], lambda: _landed(pg, slot, tensor, postscale_factor, divisor, copy))
    handles.wait_work(work)  # (failing, it keeps the slot held: its work may still write)
    return _landed(pg, slot, tensor, postscale_factor, divisor, copy)


def _landed(pg, slot, tensor, postscale_factor, divisor, copy):
    """The result of a small lone tensor's allreduce, done: the reduced tensor (a new one
    with copy), postscaled and divided as fusion.average does (numpy's float32/64 arithmetic
    gives torch's bits)."""
    try:
        if slot.said_wrong():
            raise joinwire.wrong_elsewhere(pg, slot.layout)
        data = slot.view
        if postscale_factor != 1:
            numpy.multiply(data, postscale_factor, out=data)
        if divisor != 1:
            numpy.divide(data, divisor, out=data)
        if copy:
            return torch.from_numpy(data.copy())
        slot.mine[...] = data
        return tensor
    finally:
        slot.give_back()


def _flagged(pg, wire, layout, tensor, prescale_factor, postscale_factor, divisor):
    """Reduce the tensor where it lies, alone: join's state follows only when a NaN in front
    calls for it (see joinwire). Scaled as the general path scales it (the same bits)."""
    wire.record(layout)
    # (gloo takes a leaf that requires grad as it is; torch's in-place arithmetic does not)
    flat = tensor if prescale_factor == postscale_factor == divisor == 1 else fusion.plain(tensor)
    fusion.scale(flat, prescale_factor)
    flag = Flag(pg, layout, flat)
    handles.wait_work(flag.work)
    flag.settle(pg, layout)
    fusion.average(flat, postscale_factor, divisor)
    return tensor


def _ahead(pg, wire, slot, tensor, prescale_factor, postscale_factor, divisor, wait):
    """Reduce the tensor where it lies, then issue the slot's one-element state behind it:
    scaled as the general path scales a tensor it reduces in place (the same bits)."""
    slot.busy = True
    wire.record(slot.layout)
    flat = fusion.plain(tensor)
    fusion.scale(flat, prescale_factor)
    slot.array[0] = slot.right
    works = [joinwire.issue_ahead(pg, slot.layout, flat), pg.allreduce([slot.buffer], joinwire.OPTIONS[Sum])]

    def finish():
        try:
            if slot.said_wrong():
                raise joinwire.wrong_elsewhere(pg, slot.layout)
        finally:
            slot.give_back()
        fusion.average(flat, postscale_factor, divisor)
        return tensor
    if not wait:
        return Handle(works, finish)
    for work in works:
        handles.wait_work(work)
    return finish()
