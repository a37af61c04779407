"""join()'s Wire: its steady-state shortcut gives exactly the guesses of the full history."""
from hypothesis import given, settings, strategies as st

from hvdlite.torch import joinwire

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
