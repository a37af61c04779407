"""The Horovod-compatible face for numpy workers, on pygloo: `import hvdlite.numpy as hvd`.

Needs no torch; pygloo has wheels for CPython 3.8-3.10 only.
"""
from hvdlite.numpy.basics import (  # noqa: F401
    abort, cross_rank, cross_size, init, is_initialized, local_rank, local_size, rank, shutdown, size,
    start_timeline, stop_timeline)
from hvdlite.numpy.ops import (  # noqa: F401
    Adasum, Average, Max, Min, Product, Sum, add_process_set, allgather, allgather_object,
    allreduce, alltoall, barrier, broadcast, broadcast_object, join, reducescatter)
from hvdlite.worker.errors import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from hvdlite.worker.runtime import NotInitializedError  # noqa: F401
from hvdlite.numpy import elastic  # noqa: F401,E402
