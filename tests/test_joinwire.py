"""join()'s Wire: its steady-state shortcut gives exactly the guesses of the full history; the
short path of a lone small allreduce."""
import json
import os

import torch
from hypothesis import given, settings, strategies as st

import hvdlite.torch as hvd
from hvdlite.torch import joinwire, runtime
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
