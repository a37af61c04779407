"""Elastic training on the numpy backend: `@run`, State and ObjectState bound to pygloo.
The reset protocol lives in hvdlite.worker.elastic."""
import numpy as np

from hvdlite.numpy import basics, ops
from hvdlite.numpy.context import runtime
from hvdlite.worker import elastic as core
from hvdlite.worker.elastic import run  # noqa: F401
from hvdlite.worker.trusted import trust  # noqa: F401


def _agree_flag(value: int) -> int:
    return int(ops.allreduce(np.array([value], dtype=np.int32), op=ops.Max)[0])


BACKEND = core.Backend(init=basics.init, join=basics.join, shutdown=basics.shutdown, abort=basics.abort,
                       info=runtime.info, agree_flag=_agree_flag,
                       broadcast_object=ops.broadcast_object, allgather_object=ops.allgather_object)


class State(core.State):
    """Training state that survives resets: commit() saves it, restore() goes back to it."""

    backend = BACKEND


class ObjectState(core.ObjectState, State):
    """State made of plain picklable attributes (numpy arrays included): ObjectState(w=w, step=0)."""
