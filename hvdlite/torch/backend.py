"""The world's NCCL group, for worlds whose data collectives of CUDA tensors take NCCL
(worker/backends.py says when). It stands beside the world's gloo group, which keeps host
tensors and the control collectives (join's state, agreement checks, shapes, objects): a
collective's data call takes data(pg, tensor), the NCCL group for a CUDA tensor.

The group is made before the world's first collective, on a KV scope of that world's own (a
new one per world, as gloo's); torch makes its communicator at the first NCCL collective, on
that tensor's GPU, without blocking (NCCL's non-blocking mode), so that an abort reaches a
communicator whose peer died while it was being made. Its works are waited by polling
is_completed() (handles.Polled): a timed wait aborts the communicator and throws. Where gloo's
sockets are cut (hvd.abort(), the driver's word that the round broke: worker/links.py), the
communicator is aborted on a thread of its own (ncclCommAbort can hang, and the heartbeat
thread must not), and every collective of the group still pending, or waited for later, fails:
torch's works of an aborted communicator say they completed, without an error. Leaving a world
aborts the group and drops it; the process keeps its CUDA context and tensors, and the next
world makes a group of its own."""
import os
import sys
import threading

import torch
import torch.distributed as dist

from hvdlite.torch import defaultgroup, gloo, handles
from hvdlite.torch.processsets import global_process_set
from hvdlite.worker import backends, env
from hvdlite.worker.links import broken, join_all
from hvdlite.worker.session import session

# torch's settings for hvdlite's NCCL groups, read by ProcessGroupNCCL when a group is made
# (names and defaults from its sources, torch 2.11 to 2.13). ASYNC_ERROR_HANDLING: a failed or
# timed-out collective makes the watchdog abort the communicator and leave the process alive
# (2, CleanUpOnly). A cluster's 1 or 3 (torch's default) would end every survivor of a peer's
# death, which elastic training exists to outlive: hvdlite's 2 replaces it, saying so once.
ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
CLEAN_UP_ONLY = "2"
# A user's setting of these stands.
QUIET = {
    # After a failed collective the watchdog sleeps 4 x this (ms, 15 s by default) before it
    # aborts, holding its work list's lock: the old group's destructor and its works wait.
    "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "0",
    # No flight recorder dump: torch's heartbeat monitor would otherwise read the group's store
    # (hvdlite's, in Python, a new signed connection each time) from its C++ thread every
    # second, and once any collective failed, set a process-wide flag that ends the process.
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
    # A watchdog stuck in the abort of a world already left must not end the survivor 480 s
    # later: hvdlite's own heartbeat tells the driver whether this worker lives.
    "TORCH_NCCL_ENABLE_MONITORING": "0",
}
# Non-blocking communicators (NCCL's config.blocking = 0, unless the user set this variable):
# a communicator whose peer died while it was made can then be aborted. Their waits for NCCL
# are bounded by TORCH_NCCL_NONBLOCKING_TIMEOUT (s; 30 min by default): the job's collective
# timeout, unless the user set it (torch reads it once per process).
NONBLOCKING = "TORCH_NCCL_USE_COMM_NONBLOCKING"
NONBLOCKING_TIMEOUT = "TORCH_NCCL_NONBLOCKING_TIMEOUT"
ABORT_WAIT = 10.0  # seconds leave() waits for torch's abort of the left world's communicator

# The dtypes NCCL carries (torch's ncclDataType map, 2.11 to 2.13, less float8, which NCCL
# reduces only in part): a collective with a tensor of another (int16, the unsigned ints above
# uint8, complex) goes over gloo through host copies, as on a gloo world.
DTYPES = frozenset({torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.float32,
                    torch.float64, torch.bfloat16, torch.bool})

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
    stays on its gloo group), and every tensor is a CUDA one of a dtype NCCL carries, all on
    one GPU."""
    return bool(_world) and process_set is global_process_set and len(away) == count \
        and all(t.is_cuda and t.device == away[0].device and t.dtype in DTYPES for t in away)


def data(pg, tensor):
    """The group `tensor`'s data takes: the world's NCCL group for a CUDA tensor (devices.staged
    lets one through only when takes()), `pg` for a host tensor."""
    return pg if tensor.is_cpu or not _world else _world[0]


def abort() -> None:
    """Abort the world's NCCL communicator: its pending and later works fail (any thread may
    call it: the heartbeat's does when the driver says the round broke). It returns at once:
    torch's abort runs on a thread of its own."""
    for nccl in list(_world):
        nccl.abort()


def leave():
    """Abort the world's NCCL group and hand it back (None if there is none) for the caller to
    drop: after the abort its destructor waits for nothing. A torch abort still running after
    ABORT_WAIT seconds (a hung ncclCommAbort) is said, and left running."""
    abort()
    if not _world:
        return None
    nccl = _world.pop()
    if not nccl.abort_ended(ABORT_WAIT):
        sys.stderr.write(f"hvdlite: the abort of the left world's NCCL communicator has not returned "
                         f"after {ABORT_WAIT:g} s (a hung ncclCommAbort); going on without it\n")
        sys.stderr.flush()
    return nccl


def environment(environ, timeout) -> None:
    """Set torch's NCCL settings for hvdlite's groups in `environ` (see QUIET and the others
    above), before a group is made."""
    for name, value in {**QUIET, NONBLOCKING_TIMEOUT: str(max(1, round(timeout.total_seconds())))}.items():
        environ.setdefault(name, value)
    theirs = environ.get(ERROR_HANDLING)
    if theirs is not None and theirs.strip() != CLEAN_UP_ONLY:
        sys.stderr.write(f"hvdlite: {ERROR_HANDLING}={theirs} is replaced with {CLEAN_UP_ONLY} in this "
                         f"worker: hvdlite's survivors of a failed NCCL collective must live on\n")
        sys.stderr.flush()
    environ[ERROR_HANDLING] = CLEAN_UP_ONLY


class Nccl:
    """The world's NCCL group, with the calls the collectives make; each Work comes back as a
    handles.Polled."""

    def __init__(self, store, rank: int, size: int, timeout):
        environment(os.environ, timeout)
        self.store = store  # kept for the group's life: torch holds only a Python store's C++ side
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        if NONBLOCKING not in os.environ:
            options.config.blocking = 0
        self.group = dist.ProcessGroupNCCL(store, rank, size, options)
        self._rank, self._size = rank, size
        self.aborted = False  # read by the waits of its works (handles._wait_polled)
        self._aborting = None  # the thread running torch's abort
        self._lock = threading.Lock()

    def abort(self) -> None:
        """Once (the heartbeat thread calls abort() on every answer while the round is broken),
        on a thread of its own."""
        with self._lock:
            if self.aborted:
                return
            self.aborted = True
            self._aborting = threading.Thread(target=self.group.abort, daemon=True, name="hvdlite-nccl-abort")
            self._aborting.start()

    def abort_ended(self, timeout: float) -> bool:
        """Whether torch's abort, if one was started, returned within `timeout` seconds."""
        return self._aborting is None or join_all([self._aborting], timeout)

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def allreduce(self, tensors, options):
        return handles.Polled(self.group.allreduce(tensors, options), self)

    def broadcast(self, tensors, options):
        return handles.Polled(self.group.broadcast(tensors, options), self)

    def allgather(self, outputs, inputs, options):
        return handles.Polled(self.group.allgather(outputs, inputs, options), self)

    def alltoall_base(self, out, tensor, recv, send, options):
        return handles.Polled(self.group.alltoall_base(out, tensor, recv, send, options), self)

    def _reduce_scatter_base(self, out, tensor, options):
        return handles.Polled(self.group._reduce_scatter_base(out, tensor, options), self)
