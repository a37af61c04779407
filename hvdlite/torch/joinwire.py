"""join()'s bookkeeping carried inside the allreduces themselves, at no exchange of its own.

A rank in join() must take part in the others' allreduces on the global set without being told
their size. So every rank keeps the same history of those allreduces (their layouts), and the
layout that followed a layout last time is the guess for what follows it now; a joined rank
answers the guessed layout with the op's identity. Every allreduce travels with an envelope
shaped as guessed: one state element, with the data when the data rides in it (carried). The
state says whether any rank is active and whether the active ranks' guess was wrong.

The order of the collectives follows from the guess alone, which every rank shares, so gloo
always sees equal sizes on every rank:
- a carried guess: the envelope, the data in it when the guess is right;
- a guess whose data is not carried (Layout.ahead): first an allreduce of the guessed layout
  (the data when the guess is right, else the op's identity: from a joined rank, or from an
  active one that guessed wrong and so wastes one collective of the guessed size), then the
  state alone. The data goes first because both share one gloo pair per peer: behind the data
  the one-element state ends as the data does, while in front it costs a round trip of its own
  (raw twins at 1 MB, 2 ranks, ten runs at load 0.1-3: data then state 0.91-1.05x of the data
  alone, state first 0.88-0.98x, in no run ahead of data first).
- a flagged guess (Layout.flagged: a big in-place float Sum whose caller waits at once) sends
  no state at all while nothing is amiss: a joined rank, or an active one that guessed wrong,
  puts a NaN in front of the op's identity instead. The sum is the same on every rank, so
  every rank sees that NaN (or one in the data, which only costs the same detour) and only
  then exchanges the state, with each active rank's own first element beside it to put the
  right sum back. Its caller waits at once, so nothing is issued between the data and that
  exchange. Behind the data the state still cost 0-8% at 1 MB, and with our Python around it
  a lone allreduce_ stayed at 0.90x of raw gloo.
Only then does more follow:
- a wrong guess: a control exchange (the real layout) and the real allreduce;
- every rank in join(): a control exchange of who joined just now, to name the last one.
A training loop repeats its allreduces, so from its third step on every guess holds and an
allreduce costs one collective, one element longer (an in-place one above COPY_LIMIT: the data
where it lies, then a one-element state; a flagged one, the data alone). A lone tensor's
envelope is kept per layout and reused (Slot), so a small one's call is a numpy copy in, one
gloo call and a copy out.
"""
import ctypes
import os
import zlib
from typing import NamedTuple

import numpy
import torch
import torch.distributed as dist

from hvdlite.torch import fusion, handles, runtime
from hvdlite.worker.errors import MismatchError
from hvdlite.worker.reduceops import Adasum, Max, Min, Product, Sum

JOIN_ENV = "HVDLITE_JOIN"
# The data rides in the envelope when the buffer is a copy already, or when copying it there
# and back costs less than a second, tiny collective issued alongside: copying 128 KB in and
# out takes ~10 us here, a collective more ~50 us of two ranks' time (1 MB twice: ~180 us).
COPY_LIMIT = 128 * 1024
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
          torch.int16, torch.int32, torch.int64, torch.bool]
_INDEX = {dtype: i for i, dtype in enumerate(DTYPES)}  # a dict finds it 3x quicker than .index
# Dtypes that hold the state exactly however many ranks count in it.
_CARRIERS = {torch.float32, torch.float64, torch.int32, torch.int64}
FLOATS = {torch.float32, torch.float64}  # carriers numpy scales, and a NaN in front can flag


def _options(reduce_op):
    options = dist.AllreduceOptions()
    options.reduceOp = reduce_op
    return options


# One options object per op, reused: gloo copies it at each call (and making one costs ~2 us).
OPTIONS = {Sum: _options(dist.ReduceOp.SUM), Min: _options(dist.ReduceOp.MIN),
           Max: _options(dist.ReduceOp.MAX), Product: _options(dist.ReduceOp.PRODUCT)}
JOINED, RIGHT, WRONG = range(3)  # what a rank says in the state element
_LONGEST_RUN = 16
_SLOTS = 64  # kept envelopes per world, at most COPY_LIMIT each


def enabled() -> bool:
    return os.environ.get(JOIN_ENV, "1") != "0"


AHEAD, CARRIED, FLAGGED, OTHER = range(4)  # a Layout's way (see above; OTHER: see refuse_if_joined)


class Layout(NamedTuple):
    """An allreduce as every rank sees it: elements, dtype (index in DTYPES), op (Sum stands
    for Average too), how join's state travels with it (way) and, for a lone tensor's, its
    shape (shape_key; 0 for a group of several, which goes fused)."""
    numel: int
    dtype: int
    op: int
    way: int
    shape: int = 0

    @property
    def torch_dtype(self):
        return DTYPES[self.dtype]

    @property
    def carried(self) -> bool:
        """Its data rides in the envelope, behind the state element."""
        return self.way == CARRIED

    @property
    def sent(self) -> int:
        """Elements of the buffer its data is summed in: a carried one's sits behind the state
        element even when a wrong guess sends it after the envelope, so that its sum never
        depends on the guess (gloo's ring cuts a buffer into chunks by its length, and which
        chunk an element falls in decides the order its ranks' values are added in)."""
        return self.numel + self.carried

    @property
    def flagged(self) -> bool:
        """Its data goes alone, a NaN in front calling for the state (see above)."""
        return self.way == FLAGGED

    @property
    def ahead(self) -> bool:
        """As a guess: its allreduce goes before the state element (see above). Adasum's data
        is gathered, not reduced, and keeps the state first."""
        return self.way not in (CARRIED, OTHER) and self.op != Adasum


NOTHING = Layout(0, DTYPES.index(torch.int64), Sum, CARRIED)  # the guess at a world's start
# Another collective than allreduce, in the history: a joined rank answers it with its state
# alone, so that the active ranks learn it joined (see refuse_if_joined).
NOT_ALLREDUCE = Layout(0, DTYPES.index(torch.int64), Sum, OTHER)


def layout(numel, dtype, op, owned, waits=False, shape=None) -> Layout:
    """`owned`: the data is in a buffer of ours already (a copy); `waits`: the caller waits
    for the result before anything else is issued; `shape`: a lone tensor's."""
    if dtype in _CARRIERS and op in (Sum, Min, Max) and (owned or numel * dtype.itemsize <= COPY_LIMIT):
        way = CARRIED
    else:
        way = FLAGGED if waits and op == Sum and dtype in FLOATS else AHEAD
    return Layout(numel, _INDEX[dtype], op, way, 0 if shape is None else shape_key(shape))


def shape_key(shape) -> int:
    """A shape as one small positive number, alike in every process and Python build (as
    _key's), small enough that every rank's sum of it fits an int64. Horovod refuses tensors
    of one size and different shapes."""
    return 1 + (zlib.crc32(repr(tuple(shape)).encode()) & 0xFFFFF)


def identity(op, dtype, numel):
    """What a joined rank contributes: a tensor that leaves the others' reduction unchanged."""
    if dtype == torch.bool:
        value = op in (Min, Product)
    elif op in (Min, Max):
        info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
        value = info.max if op == Min else info.min
    else:
        value = 1 if op == Product else 0
    return torch.full((numel,), value, dtype=dtype)


def states(op, size):
    """The state element's value for JOINED, RIGHT and WRONG under `op`, chosen so that the
    reduction shows whether anyone is active and whether anyone guessed wrong."""
    if op == Sum:
        return 0, 1, size + 1  # RIGHT counts at most `size`
    return (0, 1, 2) if op == Max else (3, 2, 1)


def reading(value, op, size) -> int:
    """The reduced state element `value` read back: JOINED when no rank is active, WRONG when
    an active rank guessed wrong, else RIGHT."""
    joined, right, wrong = states(op, size)
    if op == Sum:
        return JOINED if value == 0 else WRONG if value >= wrong else RIGHT
    return {joined: JOINED, right: RIGHT, wrong: WRONG}[value]


# A tensor's first element read and written in place. After a big transfer has evicted the
# caches, each new C entry point costs several us here: a numpy view 17, a ctypes cell 4.
_CELLS = {torch.float32: ctypes.c_float, torch.float64: ctypes.c_double,
          torch.int32: ctypes.c_int32, torch.int64: ctypes.c_int64}


def front(tensor, dtype):
    """The first element of `tensor` (contiguous, of `dtype`, one of _CARRIERS) as a ctypes
    cell: its `value` reads and writes the tensor's memory."""
    return _CELLS[dtype].from_address(tensor.data_ptr())


class Envelope(NamedTuple):
    buffer: torch.Tensor  # the state element, then the data it carries
    guess: Layout
    op: int  # the envelope's reduction
    state: ctypes._SimpleCData  # the buffer's state element (front)

    def issue(self, pg):
        return pg.allreduce([self.buffer], OPTIONS[self.op])

    def said(self, size) -> int:
        return reading(self.state.value, self.op, size)


def envelope(guess: Layout, state: int, size: int, room=None) -> Envelope:
    """The envelope for `guess` saying `state`. Its data part is `room` (a buffer with one
    element free in front of the data) or, when left to this, the op's identity."""
    if guess.flagged:  # the state, then room for an active rank's first element (a rare detour)
        buffer, dtype, op = torch.zeros(2, dtype=guess.torch_dtype), guess.torch_dtype, Sum
    elif not guess.carried:  # the state alone (through numpy: torch.zeros(1) takes ~5x as long)
        buffer, dtype, op = torch.from_numpy(numpy.zeros(1, dtype=numpy.int64)), torch.int64, Sum
    else:
        dtype, op = guess.torch_dtype, guess.op
        buffer = identity(op, dtype, 1 + guess.numel) if room is None else room
    cell = front(buffer, dtype)
    cell.value = states(op, size)[state]
    return Envelope(buffer, guess, op, cell)


def issue_ahead(pg, guess: Layout, data=None):
    """The allreduce that goes ahead of `guess`'s state: this rank's `data` of the guessed
    layout, or the op's identity of its size."""
    if data is None:
        data = identity(guess.op, guess.torch_dtype, guess.numel)
        if guess.flagged:
            data[0] = float("nan")
    return pg.allreduce([data], OPTIONS[guess.op])


class Slot:
    """A kept envelope for one lone tensor's layout, reused by each allreduce of it: making
    the envelope and its numpy views anew costs more than the 4-byte collective itself. A
    small carried layout's holds the data too; another's is the state alone, issued after
    the data (see above). One allreduce holds it at a time (`busy`); a second in flight
    makes its own envelope."""

    def __init__(self, guess: Layout, size: int):
        self.layout = guess
        kept = envelope(guess, RIGHT, size)
        self.buffer = kept.buffer
        self.array = self.buffer.numpy()  # the state element, then any data
        self.data = self.array[1:]
        self.op, self.size = kept.op, size
        self.right = states(kept.op, size)[RIGHT]  # constant for the world
        self.ahead = guess.ahead  # the state alone, issued behind the data
        self.busy = False
        # The tensor last carried, its address and shape when it was, its numpy view (mine)
        # and the data part shaped like it (view): see take().
        self.tensor = self.ptr = self.shape = self.mine = self.view = None

    def take(self, tensor) -> None:
        """Hold the slot for an allreduce of `tensor` (contiguous, on the CPU, of the slot's
        dtype and numel) and point `mine` and `view` at it. A numpy view is an address, a
        shape and a dtype: the one made for this same tensor object still fits while its
        data_ptr and shape are unchanged (set_, resize_ or as_strided_ change one), and as
        `mine` keeps the storage it saw alive, no other storage can come to that address.
        The same object: another one at that address may be what numpy() refuses (a
        negative view)."""
        if tensor is not self.tensor or tensor.data_ptr() != self.ptr or tensor.shape != self.shape:
            self.mine = fusion.plain(tensor).numpy()
            self.view = self.data.reshape(self.mine.shape)
            # Keep it for next time unless that pins a larger storage (a row of a big tensor).
            kept = tensor.untyped_storage().nbytes() <= COPY_LIMIT
            self.tensor = tensor if kept else None
            self.ptr, self.shape = tensor.data_ptr(), tensor.shape
        self.busy = True

    def said_wrong(self) -> bool:
        """After the allreduce: whether an active rank's guess was wrong (see states)."""
        return reading(self.array.item(0), self.op, self.size) == WRONG

    def give_back(self) -> None:
        self.busy = False
        if self.tensor is None:  # not kept: let its storage go
            self.mine = None


class Control(NamedTuple):
    """The exchange after a wrong guess (the active ranks' real layout) or once every rank is
    in join() (who joined just now): int64, summed, rank r's flag in slot r, then rank r's
    layout as one nonzero number in slot size + r (sums alone can agree by chance: layouts
    of 1, 2 and 3 elements sum to three times 2)."""
    buffer: torch.Tensor

    @staticmethod
    def issue(pg, mine=None, joined_now=False):
        size, rank = pg.size(), pg.rank()
        values = [0] * (_HEAD + 2 * size)
        if mine is not None:
            values[:_HEAD] = [1, *mine]
            values[_HEAD + size + rank] = _key(mine)
        values[_HEAD + rank] = int(joined_now)
        control = Control(torch.tensor(values, dtype=torch.int64))
        return control, pg.allreduce([control.buffer], OPTIONS[Sum])

    def layout(self) -> Layout:
        """The active ranks' layout (each of them wrote it once)."""
        active, *fields = self.buffer[:_HEAD].tolist()
        return Layout(*(value // active for value in fields))

    def agrees(self, mine: Layout) -> bool:
        size = (len(self.buffer) - _HEAD) // 2
        return set(self.buffer[_HEAD + size:].tolist()) <= {0, _key(mine)}

    def joined_now(self) -> list:
        size = (len(self.buffer) - _HEAD) // 2
        return [r for r, flag in enumerate(self.buffer[_HEAD:_HEAD + size].tolist()) if flag]


_HEAD = 1 + len(Layout._fields)  # a Control's count of active ranks and their layout's sum


def _key(layout: Layout) -> int:
    """A layout as one positive number, alike in every process."""
    return 1 + zlib.crc32(repr(tuple(layout)).encode())


class Wire:
    """The allreduce history of one world, the same on every rank. What comes next is guessed
    from the last three layouts and how often the last one came in a row (counted up to
    _LONGEST_RUN, so an endless run keeps one guess): a step that allreduces the same layout
    twice, then others, is told apart at each point. A context not seen yet falls back on
    what followed the last layout alone."""

    def __init__(self, world):
        self.world = world
        self.follows = {}  # context -> the layout that followed it last time
        self.after = {}  # layout -> the layout that followed it last time
        self.context, self.last = (), None
        self.slots = {}  # layout -> Slot
        self.on = enabled()  # read once a world: every rank must carry the state or none
        # A saturated run of one layout: the guess is it, and recording it changes nothing.
        self.steady = None

    def guess(self) -> Layout:
        if self.steady is not None:
            return self.steady
        guess = self.follows.get(self.context)
        return guess if guess is not None else self.after.get(self.last, NOTHING)

    def record(self, actual: Layout) -> None:
        if actual == self.steady:
            return
        before = self.context
        if len(self.follows) > 4096:  # a script of ever-new sizes: keep the history small
            self.follows.clear()
            self.after.clear()
        self.follows[self.context] = self.after[self.last] = actual
        recent, run = self.context or ((), 0)
        run = min(run + 1, _LONGEST_RUN) if self.last == actual else 1
        self.context, self.last = ((*recent, actual)[-3:], run), actual
        # Unchanged context: it was followed by `actual` (set just now), as was `actual` itself.
        self.steady = actual if self.context == before else None

    def slot(self, lone: Layout):
        """The kept envelope of a lone tensor's layout (a small one if carried), or None while
        another call holds it."""
        slot = self.slots.get(lone)
        if slot is None:
            if len(self.slots) >= _SLOTS:  # a script of ever-new sizes
                self.slots.clear()
            slot = self.slots[lone] = Slot(lone, self.world.size)
        return None if slot.busy else slot


_wire = [None]


def wire() -> Wire:
    """This world's Wire (a new world starts a new history)."""
    world = runtime.info()
    if _wire[0] is None or _wire[0].world is not world:
        _wire[0] = Wire(world)
    return _wire[0]


def refuse_if_joined(pg, kind) -> None:
    """Before a collective other than allreduce on the global set (`kind`): a joined rank
    answers allreduces only, so the active ranks announce it in join's state, as an
    allreduce of the layout NOT_ALLREDUCE, and raise RuntimeError on every one of them when
    a rank joined, as Horovod's do; the joined rank goes on waiting. Costs one one-element
    collective when guessed right (a loop's repeated gather), else two."""
    wire_ = wire()
    if not wire_.on:
        return
    guess = wire_.guess()
    wire_.record(NOT_ALLREDUCE)
    works = [issue_ahead(pg, guess)] if guess.ahead else []  # as a joined rank sends it
    right = guess == NOT_ALLREDUCE
    sent = envelope(guess, RIGHT if right else WRONG, pg.size())
    works.append(sent.issue(pg))
    for work in works:
        handles.wait_work(work)
    if right and sent.said(pg.size()) == RIGHT:
        active = int(sent.state.value)  # (RIGHT counts 1, JOINED 0)
    else:
        control, work = Control.issue(pg, NOT_ALLREDUCE)
        handles.wait_work(work)
        if not control.agrees(NOT_ALLREDUCE):
            raise disagree(NOT_ALLREDUCE)
        active = int(control.buffer[0])
    if active < pg.size():
        raise RuntimeError(f"{kind}: {pg.size() - active} rank(s) joined: until every rank has, "
                           f"only allreduce works (as in Horovod)")


def wrong_elsewhere(pg, mine: Layout) -> MismatchError:
    """This rank guessed right and an active rank wrong, so their layouts differ: take part
    in the control exchange the wrong ones issue, so that every rank's collectives stay in
    step, and return the error every active rank raises."""
    control, work = Control.issue(pg, mine)
    handles.wait_work(work)
    return disagree(mine)


def disagree(mine: Layout) -> MismatchError:
    """The error every active rank raises when their layouts differ. Each rank recorded its
    own layout, so the histories now differ and so would the next guesses, and gloo aborts
    the process when envelopes of different sizes meet: every such rank starts afresh."""
    _wire[0] = None
    return MismatchError(f"allreduce: ranks disagree on the tensors' shape, dtype or op (this rank: "
                      f"{mine.numel} elements of {mine.torch_dtype}, op {mine.op})")
