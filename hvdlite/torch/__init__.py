"""The Horovod-compatible face: `import hvdlite.torch as hvd` in place of horovod.torch."""
from hvdlite.torch.basics import (  # noqa: F401
    abort, ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
    init, is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size, start_timeline,
    stop_timeline)
from hvdlite.torch.autograd import (  # noqa: F401
    allgather, allreduce, alltoall, broadcast, grouped_allgather, grouped_allreduce,
    grouped_reducescatter, reducescatter)
from hvdlite.torch.checkpoint import Checkpoint, load_checkpoint  # noqa: F401
from hvdlite.torch.compression import Compression  # noqa: F401
from hvdlite.torch.ops import (  # noqa: F401
    Adasum, Average, Max, Min, Product, Sum, allgather_async, allgather_object, allreduce_,
    allreduce_async, allreduce_async_, alltoall_async, barrier, broadcast_, broadcast_async,
    broadcast_async_, broadcast_object, grouped_allgather_async, grouped_allreduce_,
    grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter_async, join, poll,
    reducescatter_async, sparse_allreduce_async, synchronize)
from hvdlite.torch.optimizer import (  # noqa: F401
    DistributedOptimizer, broadcast_optimizer_state, broadcast_parameters)
from hvdlite.torch.processsets import (  # noqa: F401
    ProcessSet, add_process_set, global_process_set, remove_process_set)
from hvdlite.torch.runtime import NotInitializedError  # noqa: F401
from hvdlite.torch.sync_batch_norm import SyncBatchNorm  # noqa: F401
from hvdlite.worker.errors import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from hvdlite.torch import elastic  # noqa: F401,E402
