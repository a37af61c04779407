"""The world's NCCL group, for worlds whose data collectives of CUDA tensors take NCCL
(worker/backends.py says when). It stands beside the world's gloo group, which keeps host
tensors and the control collectives (join's state, agreement checks, shapes, objects): a
collective's data call takes data(pg, tensor), the NCCL group for a CUDA tensor.

The group is made before the world's first collective, on a KV scope of that world's own (a
new one per world, as gloo's); torch makes its communicator at the first NCCL collective, on
that tensor's GPU. Its works are waited by polling is_completed() (handles.Polled): a timed
wait aborts the communicator and throws. Where gloo's sockets are cut (hvd.abort(), the
driver's word that the round broke: worker/links.py), the communicator is aborted, which
ends its pending works with an error. Leaving a world aborts the group and drops it; the
process keeps its CUDA context and tensors, and the next world makes a group of its own."""
import os

import torch
import torch.distributed as dist

from hvdlite.torch import defaultgroup, gloo, handles
from hvdlite.torch.processsets import global_process_set
from hvdlite.worker import backends, env
from hvdlite.worker.links import broken
from hvdlite.worker.session import session

# torch's watchdog, on a failed or timed-out NCCL collective: 2 (CleanUpOnly) aborts the
# communicator and leaves the process alive; its default (3) ends the process, survivors too.
ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
CLEAN_UP_ONLY = "2"

_world = []  # [Nccl] while the current world takes NCCL for its CUDA tensors


def readiness() -> int:
    return backends.readiness(dist.is_nccl_available(), torch.cuda.device_count())


def check_requested(environ=os.environ) -> None:
    """At hvd.init(): a worker asked for NCCL that cannot use it (or asked for a backend that
    does not exist) ends here, with one line."""
    try:
        wanted = backends.requested(environ)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    said = readiness()
    if wanted == "nccl" and said != backends.READY:
        raise SystemExit(backends.refusal(f"slot {environ.get(env.SLOT, '?')}", said))


def begin(pg, info) -> None:
    """Before the first collective of the world `info` (whose gloo group is `pg`), on every
    rank alike: choose the backend of its CUDA tensors, and make the NCCL group where NCCL
    is chosen. Under auto the ranks say what they can do in one small gather; asked for
    NCCL, every rank checked itself at init()."""
    wanted = backends.requested(os.environ)
    if wanted == "gloo":
        return
    if wanted == "nccl":
        said = [backends.READY] * info.size
    else:
        said = handles.gather_equal(pg, torch.tensor([readiness()], dtype=torch.int32)).tolist()
    if backends.choose(wanted, said) == "nccl":
        store = gloo.bootstrap_store(f"nccl.{info.store_scope}", lambda: broken(info.round, session().broken))
        adopt(store, info.rank, info.size)


def adopt(store, rank: int, size: int, timeout=None) -> None:
    """Make the current world take NCCL, bootstrapped through `store`, its collectives
    failing after `timeout` (default: the job's). begin()'s; a harness without a driver
    passes its own store and timeout (bench/allreduce.py, tests/test_gpu_nccl.py)."""
    _world[:] = [Nccl(store, rank, size, timeout or gloo.collective_timeout())]
    defaultgroup.carry_cuda(_world[0].group)  # torch.distributed's CUDA tensors too


def active() -> bool:
    return bool(_world)


def entered() -> int:
    """Collectives of the world's NCCL group so far (0 without one): see basics._entered."""
    return _world[0].group._get_sequence_number_for_group() if _world else 0


def takes(away, count: int, process_set) -> bool:
    """Whether a collective whose `count` tensors include `away` (those off the host) goes to
    NCCL as it is: the world took NCCL, the collective is the global set's (a process set's
    stays on its gloo group), and every tensor is a CUDA one, all on one GPU."""
    return bool(_world) and process_set is global_process_set and len(away) == count \
        and all(t.is_cuda and t.device == away[0].device for t in away)


def data(pg, tensor):
    """The group `tensor`'s data takes: the world's NCCL group for a CUDA tensor (devices.staged
    lets one through only when takes()), `pg` for a host tensor."""
    return pg if tensor.is_cpu or not _world else _world[0]


def abort() -> None:
    """Abort the world's NCCL communicator: its pending and later works end with an error
    (any thread may call it: the heartbeat's does when the driver says the round broke)."""
    for nccl in list(_world):
        nccl.abort()


def leave():
    """Abort the world's NCCL group and hand it back (None if there is none) for the caller to
    drop: after the abort its destructor waits for nothing."""
    abort()
    return _world.pop() if _world else None


class Nccl:
    """The world's NCCL group, with the calls the collectives make; each Work comes back as a
    handles.Polled."""

    def __init__(self, store, rank: int, size: int, timeout):
        os.environ.setdefault(ERROR_HANDLING, CLEAN_UP_ONLY)
        self.store = store  # kept for the group's life: torch holds only a Python store's C++ side
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        self.group = dist.ProcessGroupNCCL(store, rank, size, options)
        self._rank, self._size = rank, size
        self._aborted = False

    def abort(self) -> None:
        """Once: the heartbeat thread calls abort() on every answer while the round is broken."""
        if not self._aborted:
            self._aborted = True
            self.group.abort()

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def allreduce(self, tensors, options):
        return handles.Polled(self.group.allreduce(tensors, options))

    def broadcast(self, tensors, options):
        return handles.Polled(self.group.broadcast(tensors, options))

    def allgather(self, outputs, inputs, options):
        return handles.Polled(self.group.allgather(outputs, inputs, options))

    def alltoall_base(self, out, tensor, recv, send, options):
        return handles.Polled(self.group.alltoall_base(out, tensor, recv, send, options))

    def _reduce_scatter_base(self, out, tensor, options):
        return handles.Polled(self.group._reduce_scatter_base(out, tensor, options))
