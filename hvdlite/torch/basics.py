"""init / shutdown, the rank queries and the capability queries of the Horovod-compatible face."""
import atexit
import functools
import os
import sys
import time

import torch
import torch.distributed as dist

from hvdlite.torch import backend, defaultgroup, devices, gloo, runtime
from hvdlite.torch.processsets import add_process_set, remove_all
from hvdlite.worker import durable, elastic, env, exitcode, trace
from hvdlite.worker.links import EXIT_WAIT, Links
from hvdlite.worker.session import session
from hvdlite.worker.world import WorldInfo

EXIT_RELEASE_WAIT = 10.0  # seconds an exiting worker waits for groups it released to be destroyed

_links = Links(backend.abort)  # the current group's gloo connections (cut: its NCCL one is aborted too)


def init(comm=None, process_sets=None) -> None:
    """Join the world this worker is assigned to at launch. `process_sets`: ProcessSets or
    rank lists to add (sets can also be added later); "dynamic" is accepted and changes
    nothing. `comm` (an MPI communicator in Horovod) must be None."""
    if comm is not None:
        raise ValueError("hvdlite runs on gloo: init(comm=...) takes no MPI communicator")
    if os.environ.get(env.TIMELINE) and trace.recorder() is None:
        trace.start_timeline(os.environ[env.TIMELINE])
    if runtime.is_initialized() and runtime.failed() and not session().elastic:
        # A static world whose collective failed (a peer went its own way, a timeout) is of
        # no more use: init() starts afresh, as after shutdown(), where Horovod's init() does
        # nothing. (An elastic one is reset by hvd.elastic.run.)
        shutdown()
    if not runtime.is_initialized():
        backend.check_requested()
        join()
    devices.say_gpu()
    _gloo_enabled[0] = True
    if process_sets is not None and process_sets != "dynamic":
        for process_set in process_sets:
            add_process_set(process_set)


def join(after_round=None, commit=0) -> None:
    """Join the next world the driver assigns this worker (see Links.join)."""
    end = trace.span("rendezvous", after_round=after_round, commit=commit)
    try:
        info, pg = _links.join(session(), _group, after_round, commit)
    except BaseException:
        end(failed=True)
        raise
    end(round=info.round, rank=info.rank, size=info.size)
    check = elastic.entry_check(_count, info.size) if session().elastic else None
    runtime.activate(pg, info, functools.partial(_first_use, pg, info, check), functools.partial(_entered, pg))
    defaultgroup.bind(pg, info)


def _first_use(pg, info, check) -> None:
    """Before the world's first collective, on every rank: its backend, then the elastic check."""
    backend.begin(pg, info)
    if check is not None:
        check()


def _entered(pg) -> int:
    """Collectives this rank entered in the world of group `pg`, whoever called them (hvd.*,
    torch.distributed, DDP's reducer, Lightning): gloo numbers every collective of a group, at no
    cost to it; an NCCL world's data collectives are numbered on its NCCL group."""
    return pg._get_sequence_number_for_group() + backend.entered()


def _count(flag: int) -> int:
    from hvdlite.torch import ops  # ops' process sets import this module's peers: load it late
    return int(ops.allreduce_(torch.tensor([flag], dtype=torch.int32), op=ops.Sum).item())


def _group(info: WorldInfo, abandoned, seen):
    return gloo.connect(info.store_scope, info.rank, info.size, abandoned, seen)


def abort() -> None:
    """Fail every pending and future collective of the group, here and on its peers."""
    trace.instant("world broke")
    _links.cut()


def shutdown() -> None:
    """Leave the current world (after a failure, call abort() first); its process sets go
    with it. init() may join again."""
    remove_all()
    leave()


def leave() -> None:
    """Leave the current world, keeping the process sets (an elastic reset's)."""
    _links.forget()
    defaultgroup.unbind()
    gloo.release([runtime.deactivate(), backend.leave()])


def _destroy_at_exit() -> None:
    # A gloo group still alive while the interpreter tears down often aborts the process
    # (SIGABRT, exit -6), which would make a finished worker look failed.
    deadline = time.monotonic() + EXIT_WAIT
    defaultgroup.unbind()  # torch's reference to the group would outlive the interpreter's teardown
    runtime.deactivate()
    backend.leave()
    released = gloo.finish_releases(min(EXIT_RELEASE_WAIT, EXIT_WAIT))
    if not (_links.finish_given_up(max(0.0, deadline - time.monotonic())) and released):
        _leave_without_teardown()


def _leave_without_teardown() -> None:
    """gloo still runs a destructor or a given-up connect (one retried up to a
    --gloo-timeout-seconds longer than EXIT_WAIT) on a thread that calls back into Python: once
    the interpreter tears down, such a call ends its thread through gloo's C++ frames, which
    aborts the process. Flush what must reach its place, then end with this process's own code
    before any teardown."""
    durable.finish()
    trace.stop()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe to a driver that is gone
            pass
    os._exit(exitcode.own())


atexit.register(_destroy_at_exit)


def is_initialized() -> bool:
    return runtime.is_initialized()


def rank() -> int:
    return runtime.info().rank


def size() -> int:
    return runtime.info().size


def local_rank() -> int:
    return runtime.info().local_rank


def local_size() -> int:
    return runtime.info().local_size


def cross_rank() -> int:
    return runtime.info().cross_rank


def cross_size() -> int:
    return runtime.info().cross_size


def is_homogeneous() -> bool:
    """True when every host runs the same number of workers (as Horovod's)."""
    info = runtime.info()
    return info.size == info.local_size * info.cross_size


# What this build has, answered as Horovod 0.28.1 answers: gloo, enabled by init() (and still
# so after shutdown()); GPU tensors where torch was built for CUDA or ROCm (through host memory,
# hvdlite.torch.devices, or NCCL, hvdlite.torch.backend); NCCL where torch has it; no MPI, DDL
# or oneCCL.
_gloo_enabled = [False]


def gloo_enabled() -> bool:
    return _gloo_enabled[0]


def gloo_built() -> bool:
    return True


def mpi_enabled() -> bool:
    return False


mpi_built = ddl_built = ccl_built = mpi_enabled


def cuda_built() -> bool:
    return torch.backends.cuda.is_built() and torch.version.hip is None


def rocm_built() -> bool:
    return torch.version.hip is not None


def nccl_built() -> int:
    """The version of the NCCL torch has, as Horovod's number (2.21.5: 22105); 0: none."""
    if not dist.is_nccl_available():
        return 0
    major, minor, patch = torch.cuda.nccl.version()[:3]
    return major * 10000 + minor * 100 + patch


def mpi_threads_supported() -> bool:
    raise ValueError("MPI is not enabled: hvdlite runs on gloo, so it has no MPI threads")


def _check_initialized() -> None:
    if not runtime.is_initialized():
        raise ValueError("hvdlite has not been initialized; use hvd.init().")


def start_timeline(file_path, mark_cycles=False) -> None:
    """Record the collectives (named by their name= where given) and resets in a Chrome trace
    that stop_timeline() writes at rank 0's `file_path`. Every rank records its own events
    beside that file (FILE.parts/); rank 0 merges the parts there, other ranks write no file.
    `mark_cycles` is accepted: hvdlite has no cycles to mark."""
    _check_initialized()
    trace.start_timeline(file_path)


def stop_timeline() -> None:
    """Stop recording; on rank 0, (re)write the trace file from every rank's part recorded so
    far. The parts stay beside it for ranks that stop later, which merge theirs in."""
    _check_initialized()
    trace.stop_timeline(runtime.info().rank)
