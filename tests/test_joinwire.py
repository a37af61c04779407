"""join()'s Wire: its steady-state shortcut gives exactly the guesses of the full history; the
short paths of a lone allreduce (a small one in its kept envelope, a big in-place one ahead of
its kept state): traced, their kept views, their errors."""
import json
import os
import time

import pytest
import torch
from hypothesis import given, settings, strategies as st

import hvdlite.torch as hvd
from hvdlite.torch import joinwire, runtime
from hvdlite.worker.errors import HorovodInternalError
import gloo_harness

_LAYOUTS = [joinwire.Layout(n, 0, 0, True) for n in (1, 2, 3)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_LAYOUTS), st.integers(1, 20)), max_size=12))
def test_steady_shortcut_changes_no_guess(runs):
    """Runs of layouts (long ones saturate the run count): a Wire whose shortcut is cleared
    before every call must guess alike at every step and end with the same history."""
    fast, full = joinwire.Wire(None), joinwire.Wire(None)
    for layout, count in runs:
        for _ in range(count):
            full.steady = None
            assert fast.guess() == full.guess()
            fast.record(layout)
            full.steady = None
            full.record(layout)
    assert (fast.follows, fast.after, fast.context, fast.last) == \
           (full.follows, full.after, full.context, full.last)


def test_a_saturated_run_is_steady():
    wire, layout = joinwire.Wire(None), _LAYOUTS[0]
    for _ in range(joinwire._LONGEST_RUN + 1):
        wire.record(layout)
    assert wire.steady == layout and wire.guess() == layout
    wire.record(_LAYOUTS[1])
    assert wire.steady is None


def check_lone_allreduces_stay_traced():
    """A lone 4-byte allreduce whose layout is guessed right takes the short path, which must
    still record its span (under the caller's name) while the timeline records."""
    rank, size = runtime.info().rank, runtime.info().size
    path = os.path.join(os.path.dirname(gloo_harness._store_path), "timeline.json")
    x = torch.tensor([float(rank + 1)])
    for _ in range(3):  # from the third the layout is guessed right
        assert hvd.allreduce(x, op=hvd.Sum).item() == size * (size + 1) / 2
    hvd.start_timeline(path)
    assert hvd.allreduce(x, op=hvd.Sum, name="lone").item() == size * (size + 1) / 2
    hvd.allreduce_(x, op=hvd.Sum, name="lone_")
    assert x.item() == size * (size + 1) / 2
    for turn in range(size):  # rank 0 stops first: later ranks add their part to its file
        if turn == rank:
            hvd.stop_timeline()
        hvd.barrier()
    with open(path) as f:
        names = [e["name"] for e in json.load(f)["traceEvents"] if e["ph"] == "B"]
    assert names.count("lone") == size and names.count("lone_") == size, names


def test_lone_allreduces_stay_traced():
    gloo_harness.run(check_lone_allreduces_stay_traced, 2)


def _sum_of_ranks():
    size = runtime.info().size
    return size * (size + 1) / 2


def _slot(tensor, copy=False):
    return joinwire.wire().slots[joinwire.layout(tensor.numel(), tensor.dtype, hvd.Sum, copy, shape=tensor.shape)]


def check_kept_views_follow_the_tensor():
    """The short path keeps a tensor's numpy view in its slot between calls: a tensor given
    new storage (set_) or a new shape of the same size (resize_) must be seen anew, and a
    small window on a big storage is not kept (it would pin the whole storage)."""
    rank, total = runtime.info().rank, _sum_of_ranks()
    x = torch.tensor([0.0])
    for _ in range(4):  # from the third the layout is guessed right: the short path
        assert hvd.allreduce_(x.fill_(rank + 1), op=hvd.Sum).item() == total
    assert _slot(x).tensor is x  # kept
    x.set_(torch.tensor([float(rank + 1)]))  # same object and shape, another address
    hvd.allreduce_(x, op=hvd.Sum)
    assert x.item() == total

    big = torch.zeros(1 << 16)
    row = big[7:8]
    for _ in range(4):
        row.fill_(rank + 1)
        assert hvd.allreduce_(row, op=hvd.Sum) is row and big[7].item() == total
    assert _slot(row).tensor is None and _slot(row).mine is None  # not kept

    y = torch.zeros(2)
    for _ in range(4):
        assert hvd.allreduce(y.fill_(rank + 1), op=hvd.Sum).tolist() == [total] * 2
    y.resize_(2, 1)  # same storage and address, another shape
    out = hvd.allreduce(y, op=hvd.Sum)
    assert out.shape == (2, 1) and out.flatten().tolist() == [total] * 2


def test_kept_views_follow_the_tensor():
    gloo_harness.run(check_kept_views_follow_the_tensor, 2)


BIG = (1 << 18) + 5  # float32 elements, reduced in place ahead of the state (not carried)


def _disagreement(numel, other):
    """Rank 0's allreduce_ of a steady layout (`numel` float32s: the short path when small,
    the lean path when big) while rank 1 reduces `other` elements: both raise at once, as
    Horovod's ranks do, and the world goes on."""
    rank = runtime.info().rank
    x = torch.ones(numel)
    for _ in range(4):
        hvd.allreduce_(x, op=hvd.Sum)
    with pytest.raises(ValueError, match="disagree"):
        hvd.allreduce_(x if rank == 0 else torch.ones(other), op=hvd.Sum)
    assert hvd.allreduce_(torch.ones(3), op=hvd.Sum).tolist() == [2, 2, 2]


def check_short_path_disagreement():
    _disagreement(1, 2)


def check_lean_path_disagreement():
    _disagreement(BIG, BIG + 8)


@pytest.mark.parametrize("check", [check_short_path_disagreement, check_lean_path_disagreement])
def test_disagreement_raises(check):
    gloo_harness.run(check, 2)


def _peer_death(numel):
    """Rank 1 dies at once (its sockets closed by the kernel, as at a kill -9) while rank 0
    waits in an allreduce_ of a steady layout on the short or the lean path."""
    x = torch.ones(numel)
    for _ in range(4):
        hvd.allreduce_(x, op=hvd.Sum)
    if runtime.info().rank == 1:
        time.sleep(0.5)  # rank 0 is in the call by now
        gloo_harness.leave()
    with pytest.raises(HorovodInternalError):
        hvd.allreduce_(x, op=hvd.Sum)


def check_short_path_peer_death():
    _peer_death(1)


def check_lean_path_peer_death():
    _peer_death(BIG)


@pytest.mark.parametrize("check", [check_short_path_peer_death, check_lean_path_peer_death])
def test_peer_death_raises(check):
    gloo_harness.run(check, 2)


MARK = 12345.5  # the first gradient's first value: where the data sits in a buffer


class _Layouts:
    """The world's process group, noting the length of each allreduce's buffer that holds the
    data (found by its first value, MARK) and the data's offset in it."""

    def __init__(self, pg):
        self.pg, self.seen = pg, []

    def allreduce(self, tensors, options):
        (buffer,) = tensors
        at = (buffer == MARK).nonzero().flatten().tolist() if buffer.is_floating_point() else []
        if at:
            self.seen.append((buffer.numel(), at[0]))
        return self.pg.allreduce(tensors, options)

    def __getattr__(self, name):
        return getattr(self.pg, name)


def _summed_in_order(n):
    """Values whose sum over 3 ranks depends on the order it is added in (magnitudes 1e-3 to
    1e3): gloo's ring adds each chunk starting at another rank, so an element that moves into
    another chunk may be summed in another order."""
    generator = torch.Generator().manual_seed(runtime.info().rank)
    return torch.randn(n, generator=generator) * 10.0 ** torch.randint(-3, 4, (n,), generator=generator)


def check_a_sum_is_the_same_whichever_path_it_takes():
    """A fresh world guesses wrong for its first allreduces (the general path), then right (a
    lone one's kept envelope, a bucket's prepacked buffer): each call's data sits at the same
    offset of a buffer of the same length every time, and its sum has the same bits (issue 35:
    offset 0 of 6,538 elements, then 1 of 6,539, moved gloo's ring chunks by one element)."""
    recorder = _Layouts(runtime.process_group())
    runtime.activate(recorder, runtime.info())
    grads = [_summed_in_order(n) for n in (6538, 1)]
    grads[0][0] = MARK
    model = torch.nn.Linear(6538, 1)  # one bucket of 6,539 elements
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                         named_parameters=model.named_parameters(), op=hvd.Sum)
    paths = {"lone": [], "grouped": [], "optimizer": []}
    layouts = {name: set() for name in paths}
    for _ in range(4):
        for name, call in (("lone", lambda: [hvd.allreduce(grads[0], op=hvd.Sum)]),
                           ("grouped", lambda: hvd.grouped_allreduce(grads, op=hvd.Sum)),
                           ("optimizer", lambda: _synchronized(model, optimizer, grads))):
            recorder.seen = []
            paths[name].append(call())
            layouts[name].update(recorder.seen)
    moved = {name: seen for name, seen in layouts.items() if len(seen) != 1}
    assert not moved, f"the data moved in its buffer (length, offset): {moved}"
    changed = [name for name, results in paths.items()
               if any(not torch.equal(r, f) for result in results for r, f in zip(result, results[0]))]
    assert not changed, f"these paths changed the sum's bits: {changed}"


def _synchronized(model, optimizer, grads):
    model.weight.grad, model.bias.grad = grads[0].view(1, -1).clone(), grads[1].clone()
    optimizer.synchronize()
    return [model.weight.grad.clone().view(-1), model.bias.grad.clone()]


def test_a_sum_is_the_same_whichever_path_it_takes():
    gloo_harness.run(check_a_sum_is_the_same_whichever_path_it_takes, 3)
