"""The Horovod-compatible face for numpy workers, on pygloo: `import hvdlite.numpy as hvd`.

Needs no torch; pygloo has wheels for CPython 3.8-3.10 only.
"""
import os
import sys

from hvdlite.worker import env


def _without_pygloo() -> str:
    """What to do when pygloo is missing, in one line."""
    version = "%d.%d" % sys.version_info[:2]
    if (3, 8) <= sys.version_info < (3, 11):
        return f"hvdlite.numpy needs pygloo: pip install pygloo (for {sys.executable})"
    return (f"hvdlite.numpy needs pygloo, which has wheels for CPython 3.8-3.10 only, and this is "
            f"Python {version}: run the workers with a 3.8-3.10 venv "
            f"(pip install pygloo numpy cloudpickle hvdlite)")


try:
    import pygloo  # noqa: F401
except ModuleNotFoundError as e:
    if e.name != "pygloo":
        raise
    if env.SLOT in os.environ:  # a worker of a job: one line, not a traceback from every worker
        raise SystemExit(_without_pygloo()) from None
    raise ModuleNotFoundError(_without_pygloo(), name="pygloo") from None
from hvdlite.numpy.basics import (  # noqa: F401
    abort, cross_rank, cross_size, init, is_initialized, local_rank, local_size, rank, shutdown, size,
    start_timeline, stop_timeline)
from hvdlite.numpy.ops import (  # noqa: F401
    Adasum, Average, Max, Min, Product, Sum, add_process_set, allgather, allgather_object,
    allreduce, alltoall, barrier, broadcast, broadcast_object, join, reducescatter)
from hvdlite.worker.errors import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from hvdlite.worker.runtime import NotInitializedError  # noqa: F401
from hvdlite.numpy import elastic  # noqa: F401,E402
