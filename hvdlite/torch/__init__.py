"""The Horovod-compatible face: `import hvdlite.torch as hvd` in place of horovod.torch."""
from hvdlite.torch.basics import (  # noqa: F401
    abort, cross_rank, cross_size, init, is_initialized, local_rank, local_size, rank, shutdown, size)
from hvdlite.torch.compression import Compression  # noqa: F401
from hvdlite.torch.ops import (  # noqa: F401
    Adasum, Average, Max, Min, Product, Sum, allgather, allgather_object, allreduce, allreduce_,
    allreduce_async, allreduce_async_, barrier, broadcast, broadcast_, broadcast_async,
    broadcast_async_, broadcast_object, grouped_allreduce, grouped_allreduce_,
    grouped_allreduce_async, grouped_allreduce_async_, poll, synchronize)
from hvdlite.torch.optimizer import (  # noqa: F401
    DistributedOptimizer, broadcast_optimizer_state, broadcast_parameters)
from hvdlite.torch.runtime import NotInitializedError  # noqa: F401
from hvdlite.worker.errors import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from hvdlite.torch import elastic  # noqa: F401,E402
