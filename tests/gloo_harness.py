"""Run a test function on N real processes joined by a real gloo group, without the CLI.

    gloo_harness.run(check_something, size=2)

`check_something` must be a module-level function of an importable test module; every rank
calls it after `runtime.activate(...)` with a world of `size` ranks on one host. A rank fails
by raising; `run` then raises AssertionError carrying each failed rank's output.
"""
import datetime
import importlib
import os
import subprocess
import sys
import tempfile
import time
import traceback

TIMEOUT = 60.0  # seconds for the whole run: importing torch alone takes ~2 s per process
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=30)

_store = None  # the child's FileStore, for the end-of-run rendezvous
_store_path = None  # where it lives: in the run's temporary directory


def run(func, size: int, timeout: float = TIMEOUT) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        procs, logs = [], []
        try:
            for rank in range(size):
                log = open(os.path.join(tmp, f"rank{rank}.log"), "w+")
                logs.append(log)
                cmd = [sys.executable, os.path.abspath(__file__), func.__module__, func.__name__,
                       str(rank), str(size), os.path.join(tmp, "store")]
                # One intra-op thread: the ranks already share two cores.
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL,
                                              env={**os.environ, "OMP_NUM_THREADS": "1",
                                                   # the key objects are signed with
                                                   "HVDLITE_SECRET": "harness-secret"}))
            deadline = time.monotonic() + timeout
            for proc in procs:
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    break
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
        failures = []
        for rank, (proc, log) in enumerate(zip(procs, logs)):
            log.seek(0)
            output = log.read()
            log.close()
            if proc.returncode != 0:
                why = "timed out" if proc.returncode == -9 else f"exit code {proc.returncode}"
                failures.append(f"--- rank {rank} ({why}) ---\n{output}")
        if failures:
            raise AssertionError(f"{func.__name__} failed on {size} ranks:\n" + "\n".join(failures))


def _child(module: str, name: str, rank: int, size: int, store_path: str) -> None:
    import torch.distributed as dist

    from hvdlite.torch import runtime
    from hvdlite.worker.world import WorldInfo

    global _store, _store_path
    store = _store = dist.FileStore(store_path, size)
    _store_path = store_path
    pg = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, size, COLLECTIVE_TIMEOUT)
    runtime.activate(pg, WorldInfo(rank=rank, size=size, local_rank=rank, local_size=size,
                                   cross_rank=0, cross_size=1, hostname="localhost"))
    getattr(importlib.import_module(module), name)()
    # Stay alive until every rank is done, so no peer loses data still in flight to it.
    _mark_done(rank)
    store.wait([f"done/{r}" for r in range(size)], COLLECTIVE_TIMEOUT)


def _mark_done(rank: int) -> None:
    _store.set(f"done/{rank}", b"1")


def leave() -> None:
    """End this rank at once, as a crash would, but count it as a success."""
    from hvdlite.torch import runtime
    _mark_done(runtime.info().rank)
    os._exit(0)


if __name__ == "__main__":
    import gloo_harness  # the test modules' copy of this module, so leave() sees the store
    code = 0
    try:
        gloo_harness._child(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: destroying a gloo group at exit can abort the process
    # ("terminate called without an active exception") or wait on a peer that is gone.
    os._exit(code)
