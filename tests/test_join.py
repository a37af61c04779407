"""join() on real gloo groups: ranks that finished answer the others' allreduces of every kind
(guessed right or wrong, data riding in the envelope or not, flagged, every op, Adasum, fused and
async), and a guessed allreduce costs one collective, join's state riding in front of its data (a
big in-place one: its data where it lies, then the state alone; or, waited for at once, the data
alone, a NaN in front calling for the state)."""
import math

import pytest
import torch

import gloo_harness
import hvdlite.torch as hvd
from hvdlite.torch import adasum, joinwire, ops, runtime

BIG = (1 << 19) + 3  # float32 elements: 2 MB, reduced in place without a copy (not carried)


def _mine(rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(5, generator=g), torch.randint(-50, 50, (3,), generator=g)


def _pattern(step, active, size):
    """Each allreduce of one step: (what this rank calls, what it must return)."""
    rank = runtime.info().rank
    floats, ints = _mine(rank, step)
    everyone = [_mine(r, step) for r in active]
    big = _front(rank + 1.0, 100.0 * (rank + 1))
    yield (lambda: hvd.allreduce(floats, op=hvd.Sum), sum(f for f, _ in everyone))
    yield (lambda: hvd.allreduce(floats), sum(f for f, _ in everyone) / size)
    summed = _front(sum(r + 1.0 for r in active), sum(100.0 * (r + 1) for r in active))
    yield (lambda: hvd.allreduce_(big, op=hvd.Sum), summed)
    # Flagged on the general path too (a group of one), scaled; beside another dtype it is not
    # (its state would come after the other group's collective).
    scaled = _front(rank + 1.0, 100.0 * (rank + 1))
    yield (lambda: hvd.grouped_allreduce_([scaled], prescale_factor=2.0, postscale_factor=0.5)[0], summed / size)
    beside = [_front(rank + 1.0, 100.0 * (rank + 1)), ints.clone()]
    yield (lambda: hvd.grouped_allreduce_(beside, op=hvd.Sum), [summed, sum(i for _, i in everyone)])
    yield (lambda: hvd.allreduce(ints, op=hvd.Min), torch.stack([i for _, i in everyone]).min(0).values)
    yield (lambda: hvd.allreduce(ints.to(torch.uint8), op=hvd.Max),
           torch.stack([i.to(torch.uint8) for _, i in everyone]).max(0).values)
    yield (lambda: hvd.allreduce(torch.tensor([2.0, 0.5]), op=hvd.Product),
           torch.tensor([2.0 ** len(active), 0.5 ** len(active)]))
    zero_if_joined = [_mine(r, step)[0].double() if r in active else torch.zeros(5, dtype=torch.float64)
                      for r in range(size)]
    yield (lambda: hvd.allreduce(floats.double(), op=hvd.Adasum), adasum.reduce(zero_if_joined))
    yield (lambda: hvd.grouped_allreduce([floats, ints, floats * 2], op=hvd.Sum),
           [sum(f for f, _ in everyone), sum(i for _, i in everyone), sum(f * 2 for f, _ in everyone)])
    if step % 2:  # a step that differs from the one before: the next guesses are wrong
        yield (lambda: hvd.allreduce(torch.ones(7 + step), op=hvd.Sum), torch.full((7 + step,), float(len(active))))
    handles = [hvd.allreduce_async(floats * k, op=hvd.Sum) for k in (1, 3)]  # two in flight at once
    yield (lambda: [hvd.synchronize(h) for h in handles], [sum(f * k for f, _ in everyone) for k in (1, 3)])


def _front(value, first):
    """BIG elements of `value` but the first, `first`: the element a flagged allreduce takes
    back from join's state when a rank joined."""
    tensor = torch.full((BIG,), value)
    tensor[0] = first
    return tensor


def _same(got, expected):
    if isinstance(expected, list):
        return all(_same(g, e) for g, e in zip(got, expected))
    return torch.allclose(got.to(expected.dtype), expected, atol=1e-5)


def check_join_answers_every_allreduce():
    rank, size = runtime.info().rank, runtime.info().size
    steps = [1] + [k + 2 for k in range(1, size)]  # rank k trains this many steps, then joins
    for step in range(steps[rank]):
        active = [r for r in range(size) if steps[r] > step]
        for call, expected in _pattern(step, active, size):
            got = call()
            assert _same(got, expected), f"rank {rank} step {step}: {got} != {expected}"
    assert hvd.join() == size - 1
    # After join every rank is active again: a plain allreduce sees all of them.
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(size)))


@pytest.mark.parametrize("size", [2, 3])
def test_joined_ranks_answer_every_kind_of_allreduce(size):
    gloo_harness.run(check_join_answers_every_allreduce, size, timeout=120)


class _Counting:
    """A process group that counts the collectives issued on it."""

    def __init__(self, pg):
        self.pg, self.allreduces, self.buffers = pg, 0, []

    def allreduce(self, tensors, *args):
        self.allreduces += 1
        self.buffers.append(tensors[0])
        return self.pg.allreduce(tensors, *args)

    def __getattr__(self, name):
        return getattr(self.pg, name)


def check_a_guessed_allreduce_is_one_collective():
    info = runtime.info()
    counting = _Counting(runtime.deactivate())
    runtime.activate(counting, info)
    x, grads = torch.ones(3), [torch.ones(4), torch.ones(2, 2)]

    def step():
        hvd.allreduce(x)
        hvd.allreduce_(x, op=hvd.Sum)
        hvd.grouped_allreduce_(grads)
        hvd.allreduce(torch.tensor(1.0))  # a loss to average
    step()  # the first two steps guess wrong: no history yet, then none from a step's start
    step()
    before = counting.allreduces
    for _ in range(3):
        step()
    assert counting.allreduces - before == 3 * 4, counting.allreduces - before
    before = counting.allreduces
    for _ in range(40):  # the same allreduce over and over: guessed right past the run's count
        hvd.allreduce(x)
    # one wrong guess where the run leaves the step's pattern (a third x where grads came)
    assert counting.allreduces - before == 40 + 2, counting.allreduces - before
    before = counting.allreduces
    hvd.allreduce(torch.ones(11))  # not what followed last time: envelope, control, data
    assert counting.allreduces - before == 3
    runtime.deactivate()
    runtime.activate(counting.pg, info)


def test_a_guessed_allreduce_is_one_collective():
    gloo_harness.run(check_a_guessed_allreduce_is_one_collective, 2)


def check_an_in_place_allreduce_of_1mb_reduces_the_tensor_itself():
    info = runtime.info()
    counting = _Counting(runtime.deactivate())
    runtime.activate(counting, info)
    x = torch.ones(1 << 18)  # 1 MB: copying it into an envelope and back costs more than a collective
    for _ in range(3):  # guessed right from the third on
        before = len(counting.buffers)
        hvd.allreduce_(x, op=hvd.Sum)
    issued = counting.buffers[before:]
    # Waited for at once, flagged: the data alone (no rank put a NaN in front).
    assert [b.numel() for b in issued] == [x.numel()], [b.numel() for b in issued]
    assert issued[0].data_ptr() == x.data_ptr()  # gloo reduced x's own memory: no copy
    assert torch.equal(x, torch.full_like(x, 8.0))
    for _ in range(3):
        before = len(counting.buffers)
        hvd.synchronize(hvd.allreduce_async_(x, op=hvd.Sum))
    issued = counting.buffers[before:]
    # Asynchronous: the data first, then the state (behind the data it costs no round trip).
    assert [b.numel() for b in issued] == [x.numel(), 1], [b.numel() for b in issued]
    assert issued[0].data_ptr() == x.data_ptr()
    assert torch.equal(x, torch.full_like(x, 64.0))
    for op, expected in ((hvd.Sum, 2.0), (hvd.Average, 1.0)):  # a leaf that requires grad
        leaf = torch.ones(1 << 18, requires_grad=True)
        for _ in range(3):
            leaf.detach().fill_(1.0)
            assert hvd.allreduce_(leaf, op=op) is leaf
        assert torch.equal(leaf.detach(), torch.full_like(x, expected)) and leaf.grad_fn is None
    runtime.deactivate()
    runtime.activate(counting.pg, info)


def test_an_in_place_allreduce_of_1mb_reduces_the_tensor_itself():
    gloo_harness.run(check_an_in_place_allreduce_of_1mb_reduces_the_tensor_itself, 2)


def _lean_cases():
    """(tensor of this rank, op, prescale, postscale) for a lone in-place allreduce whose data
    is not carried: big, or of a dtype or op the state element cannot ride with."""
    rank = runtime.info().rank
    g = torch.Generator().manual_seed(rank)
    yield torch.randn(BIG, generator=g), hvd.Average, 0.3, 1.7
    yield torch.randn(BIG, generator=g).double(), hvd.Sum, 1.0, 0.25
    yield torch.randint(-1000, 1000, (BIG,), generator=g, dtype=torch.int32), hvd.Average, 3.0, 0.5
    yield torch.randint(-1000, 1000, (BIG,), generator=g), hvd.Max, 1.0, 1.0
    yield torch.randn(7, generator=g).half(), hvd.Average, 2.0, 1.0  # small, not a carrier
    yield torch.rand(5, generator=g) + 0.5, hvd.Product, 1.0, 3.0


def check_the_lean_path_gives_the_general_paths_bits():
    """A lone in-place tensor that is not carried and guessed right takes the lean path (the
    data where it lies, then the kept one-element state; a big float Sum or Average, flagged,
    the data alone): same bits as the general path."""
    info = runtime.info()
    counting = _Counting(runtime.deactivate())
    runtime.activate(counting, info)
    for mine, op, pre, post in _lean_cases():
        kwargs = dict(op=op, prescale_factor=pre, postscale_factor=post)
        flagged = mine.numel() == BIG and mine.is_floating_point()
        for _ in range(3):  # guessed right from the third on
            lean = hvd.allreduce_(mine.clone(), **kwargs)
        # A group of one: the general path, with the same layout (so still guessed right).
        general = hvd.grouped_allreduce_([mine.clone()], **kwargs)[0]
        kept = counting.buffers[-1]  # the general path's state: made anew
        lean = mine.clone()
        before = len(counting.buffers)
        assert hvd.allreduce_(lean, **kwargs) is lean
        issued = counting.buffers[before:]
        assert issued[0].data_ptr() == lean.data_ptr() and len(issued) == (1 if flagged else 2)
        if not flagged:
            state = issued[1]
            assert state.numel() == 1 and state is not kept
            assert hvd.allreduce_(lean.copy_(mine), **kwargs) is lean and counting.buffers[-1] is state  # kept
        assert torch.equal(lean.view(torch.uint8), general.view(torch.uint8)), (op, lean, general)
        assert not torch.equal(lean, mine)  # reduced
    runtime.deactivate()
    runtime.activate(counting.pg, info)


def test_the_lean_path_gives_the_general_paths_bits():
    gloo_harness.run(check_the_lean_path_gives_the_general_paths_bits, 2)


def check_a_wrong_guess_of_a_big_allreduce_sends_its_size_first():
    """A guess whose data goes ahead of the state (a big in-place allreduce) and is wrong:
    every rank must still issue an allreduce of the guessed size first, or gloo gets mismatched
    sizes (and aborts the process)."""
    rank, size = runtime.info().rank, runtime.info().size
    big = torch.full((BIG,), float(rank + 1))
    for _ in range(3):  # every rank: the guess is now this big in-place Sum
        hvd.allreduce_(big, op=hvd.Sum)
    assert joinwire.wire().guess().ahead
    if rank == size - 1:
        assert hvd.join() == size - 2
        return
    active = size - 1
    floats = torch.arange(5, dtype=torch.float64) + rank
    zero_if_joined = [torch.arange(5, dtype=torch.float64) + r for r in range(active)]
    zero_if_joined.append(torch.zeros(5, dtype=torch.float64))
    for _ in range(2):
        # Guessed: the big Sum. Adasum gathers after the guessed size's allreduce.
        assert torch.allclose(hvd.allreduce(floats, op=hvd.Adasum), adasum.reduce(zero_if_joined))
        for _ in range(3):  # guessed right from the second: the lean path, a rank joined
            big.fill_(float(rank + 1))
            hvd.allreduce_(big, average=True, prescale_factor=2.0)
            assert torch.equal(big, torch.full((BIG,), 2.0 * sum(range(1, active + 1)) / size))
        # Guessed: the big Sum again; a small carried one and a big Min come instead.
        assert torch.equal(hvd.allreduce(torch.ones(3), op=hvd.Sum), torch.full((3,), float(active)))
        low = torch.full((BIG,), float(rank))
        assert torch.equal(hvd.allreduce_(low, op=hvd.Min), torch.zeros(BIG))
        big.fill_(1.0)
    assert torch.equal(hvd.allreduce_(big, op=hvd.Sum), torch.full((BIG,), float(active)))
    assert hvd.join() == size - 2  # the active ranks join together


@pytest.mark.parametrize("size", [2, 3])
def test_a_wrong_guess_of_a_big_allreduce_sends_its_size_first(size):
    gloo_harness.run(check_a_wrong_guess_of_a_big_allreduce_sends_its_size_first, size, timeout=120)


def test_the_state_element_shows_joined_right_and_wrong_under_every_op():
    # A wrong guess shows over right ones (ranks that disagree), a right one over joined ranks.
    for op in (ops.Sum, ops.Min, ops.Max):
        for size in (1, 2, 5):
            for states in ([joinwire.JOINED] * size, [joinwire.RIGHT] + [joinwire.JOINED] * (size - 1),
                           [joinwire.RIGHT] * size, [joinwire.WRONG] * size,
                           [joinwire.WRONG] + [joinwire.RIGHT] * (size - 1) + [joinwire.JOINED]):
                values = [joinwire.states(op, size)[s] for s in states]
                reduced = sum(values) if op == ops.Sum else min(values) if op == ops.Min else max(values)
                guess = joinwire.Layout(0, 0, op, True)
                buffer = torch.tensor([float(reduced)])
                envelope = joinwire.Envelope(buffer, guess, op, joinwire.front(buffer, buffer.dtype))
                assert envelope.said(size) == max(states), (op, size, states)


def check_a_small_guessed_allreduce_reuses_its_envelope():
    info = runtime.info()
    rank, size = info.rank, info.size
    counting = _Counting(runtime.deactivate())
    runtime.activate(counting, info)
    x = torch.ones(1)
    for _ in range(4):  # guessed right from the third on
        hvd.allreduce_(x, op=hvd.Sum)
    last = counting.buffers[-2:]
    assert last[0] is last[1] and last[0].numel() == 2  # the kept envelope: state, then data
    assert torch.equal(x, torch.tensor([16.0]))
    # Two of the same layout in flight: the second may not take the envelope the first holds.
    a, b = torch.ones(1), torch.full((1,), 3.0)
    first, second = hvd.allreduce_async_(a, op=hvd.Sum), hvd.allreduce_async_(b, op=hvd.Sum)
    assert torch.equal(hvd.synchronize(second), torch.tensor([6.0]))
    assert torch.equal(hvd.synchronize(first), torch.tensor([2.0]))
    # What the kept envelopes serve, each repeated until guessed right.
    mine = torch.arange(6, dtype=torch.float64).view(2, 3) + rank
    total = torch.arange(6, dtype=torch.float64).view(2, 3) * size + size * (size - 1) // 2
    ints = torch.tensor([rank, -rank], dtype=torch.int32)
    for _ in range(3):
        assert torch.allclose(hvd.allreduce(mine, prescale_factor=2, postscale_factor=0.25), total / size / 2)
        assert torch.equal(mine, torch.arange(6, dtype=torch.float64).view(2, 3) + rank)  # left alone
        assert torch.equal(hvd.allreduce(ints, op=hvd.Max), torch.tensor([size - 1, 0], dtype=torch.int32))
        leaf = torch.full((3,), float(rank), requires_grad=True)
        assert hvd.allreduce_(leaf, op=hvd.Sum) is leaf
        assert torch.equal(leaf.detach(), torch.full((3,), float(size * (size - 1) // 2)))
        strided = mine.t()  # not contiguous: the general path
        assert torch.equal(hvd.allreduce(strided, op=hvd.Sum), total.t())
    runtime.deactivate()
    runtime.activate(counting.pg, info)


def test_a_small_guessed_allreduce_reuses_its_envelope():
    gloo_harness.run(check_a_small_guessed_allreduce_reuses_its_envelope, 2)


def check_a_nan_in_front_of_the_data_costs_a_detour_not_the_data():
    """A flagged allreduce whose sum has a NaN in front (the data's own NaN, or infinities of
    both signs) looks to every rank like a joined rank's flag: one exchange of the state more,
    the sum intact. An infinity alone is no flag."""
    info = runtime.info()
    rank, size = info.rank, info.size
    counting = _Counting(runtime.deactivate())
    runtime.activate(counting, info)
    total = sum(r + 1.0 for r in range(size))
    x = torch.full((BIG,), rank + 1.0)
    for _ in range(3):  # guessed right from the third on
        hvd.allreduce_(x.fill_(rank + 1.0), op=hvd.Sum)
    for first, reduced, collectives in ((math.nan if rank == 0 else 1.0, math.nan, 2),
                                        (math.inf if rank == 0 else -math.inf, math.nan, 2),
                                        (math.inf if rank == 0 else 1.0, math.inf, 1),
                                        (rank + 1.0, total, 1)):
        x.fill_(rank + 1.0)[0] = first
        before = len(counting.buffers)
        assert hvd.allreduce_(x, op=hvd.Sum, postscale_factor=0.5) is x
        assert len(counting.buffers) - before == collectives, (first, counting.buffers[before:])
        assert math.isnan(x[0]) if math.isnan(reduced) else x[0].item() == reduced / 2, (first, x[0])
        assert torch.equal(x[1:], torch.full((BIG - 1,), total / 2)), first
    runtime.deactivate()
    runtime.activate(counting.pg, info)


@pytest.mark.parametrize("size", [2, 3])
def test_a_nan_in_front_of_the_data_costs_a_detour_not_the_data(size):
    gloo_harness.run(check_a_nan_in_front_of_the_data_costs_a_detour_not_the_data, size)
