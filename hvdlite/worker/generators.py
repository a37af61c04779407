"""This process's global random generators as a plain value (torch-free): Python's `random`
and numpy's, when the script imported numpy. A backend adds its own (hvdlite.torch.generators).

ObjectState captures them at each save and puts them back at each restore, and every commit
gathers every rank's, so that a replacement draws what the rank it replaces would have drawn.
The value is made of tuples, ints, floats, strings and bytes only, which the checked
unpickler (trusted.py) takes as they are: a checkpoint holding them needs no trusted class.
"""
import array
import random
import sys


def random_state(rng) -> tuple:
    """A random.Random's state (or the `random` module's)."""
    version, internal, gauss = rng.getstate()  # 625 ints < 2**32: bytes pickle in one piece
    return version, array.array("I", internal).tobytes(), gauss


def put_random_state(rng, state) -> None:
    version, internal, gauss = state
    rng.setstate((version, tuple(array.array("I", internal)), gauss))


def capture() -> dict:
    states = {"python": random_state(random)}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, pos, has_gauss, gauss = numpy.random.get_state()
        states["numpy"] = (kind, keys.tobytes(), int(pos), int(has_gauss), float(gauss))
    return states


def put(states: dict) -> None:
    put_random_state(random, states["python"])
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in states:
        kind, keys, pos, has_gauss, gauss = states["numpy"]
        numpy.random.set_state((kind, numpy.frombuffer(keys, dtype=numpy.uint32).copy(), pos, has_gauss, gauss))


_saved = None  # (put, states) of this process's latest save, for put_back()


def saved(put_fn, states) -> None:
    """ObjectState saved `states` (its commit, or the state a sync left it in)."""
    global _saved
    _saved = (put_fn, states)


def put_back() -> None:
    """Put the generators back to the latest save: a data loop that resumes mid-epoch calls it
    once its loader's iterator is made. Making the iterator drew its workers' base seed from
    torch's generator, a draw the uninterrupted run made before that save; so the steps after
    a rollback draw exactly what they drew before (hvdlite.torch.sampler)."""
    if _saved is not None:
        _saved[0](_saved[1])
