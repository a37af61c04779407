"""init / shutdown, the rank queries and the capability queries of the Horovod-compatible face."""
import atexit
import os

import torch

from hvdlite.torch import gloo, runtime
from hvdlite.torch.processsets import add_process_set
from hvdlite.worker import elastic, env, trace
from hvdlite.worker.links import Links
from hvdlite.worker.session import session
from hvdlite.worker.world import WorldInfo

EXIT_RELEASE_WAIT = 10.0  # seconds an exiting worker waits for groups it released to be destroyed

_links = Links()  # the current group's gloo connections


def init(comm=None, process_sets=None) -> None:
    """Join the world this worker is assigned to at launch. `process_sets`: ProcessSets or
    rank lists to add (sets can also be added later); "dynamic" is accepted and changes
    nothing. `comm` (an MPI communicator in Horovod) must be None."""
    if comm is not None:
        raise ValueError("hvdlite runs on gloo: init(comm=...) takes no MPI communicator")
    if os.environ.get(env.TIMELINE) and trace.recorder() is None:
        start_timeline(os.environ[env.TIMELINE])
    if not runtime.is_initialized():
        join()
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
    runtime.activate(pg, info, elastic.entry_check(_count, info.size) if session().elastic else None)


def _count(flag: int) -> int:
    from hvdlite.torch import ops  # ops' process sets import this module's peers: load it late
    return int(ops.allreduce(torch.tensor([flag], dtype=torch.int32), op=ops.Sum).item())


def _group(info: WorldInfo, abandoned, seen):
    return gloo.connect(info.store_scope, info.rank, info.size, abandoned, seen)


def abort() -> None:
    """Fail every pending and future collective of the group, here and on its peers."""
    trace.instant("world broke")
    _links.cut()


def shutdown() -> None:
    """Leave the current world (after a failure, call abort() first)."""
    _links.forget()
    gloo.release([runtime.deactivate()])


def _destroy_at_exit() -> None:
    # A gloo group still alive while the interpreter tears down often aborts the process
    # (SIGABRT, exit -6), which would make a finished worker look failed.
    runtime.deactivate()
    gloo.finish_releases(EXIT_RELEASE_WAIT)


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


# What this build has: gloo on the CPU, nothing else.
def gloo_enabled() -> bool:
    return True


gloo_built = gloo_enabled


def mpi_enabled() -> bool:
    return False


mpi_built = nccl_built = cuda_built = rocm_built = ddl_built = ccl_built = mpi_enabled


def mpi_threads_supported() -> bool:
    return False


def start_timeline(file_path, mark_cycles=False) -> None:
    """Record this rank's collectives and resets for a Chrome trace at `file_path` (written
    by stop_timeline(), with the events of every rank that recorded for the same path on
    this host). `mark_cycles` is accepted: hvdlite has no cycles to mark."""
    trace.start(file_path, os.environ.get(env.WORKER) or f"pid{os.getpid()}")


def stop_timeline() -> None:
    """Stop recording and (re)write the trace file from every rank's part recorded so far;
    the parts stay beside it (FILE.parts/) for ranks that stop later."""
    path = trace.stop()
    if path is not None:
        trace.merge_parts(path, remove=False)
