"""Run a test function on N real processes joined by a real gloo group, without the CLI.

    gloo_harness.run(check_something, size=2)

`check_something` must be a module-level function of an importable test module; every rank
calls it after `runtime.activate(...)` with a world of `size` ranks on one host. A rank fails
by raising; `run` then raises AssertionError carrying each failed rank's output.

The ranks are forked by a fork server, one per test process, that imported torch and hvdlite
once: each rank is still its own process on a real gloo group, without the ~2 CPU-s an
interpreter spends importing torch (the suite is CPU-bound on two cores). The server forks
before it ran any torch op, so no OpenMP pool is copied into a rank.
"""
import datetime
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback

TIMEOUT = 60.0  # seconds for the whole run
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=30)
# One intra-op thread: the ranks already share two cores. The key objects are signed with the secret.
RANK_ENV = {"OMP_NUM_THREADS": "1", "HVDLITE_SECRET": "harness-secret"}

_store = None  # the child's FileStore, for the end-of-run rendezvous
_store_path = None  # where it lives: in the run's temporary directory
_server = None  # this process's fork server (_Server), started by the first run, again after a failed one


class _Server:
    """The test process's end of the fork server: requests out, `ready`/`pid`/`exit` lines in."""

    def __init__(self, timeout: float):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**os.environ, **RANK_ENV})
        self.buffer = b""
        if self.line(time.monotonic() + timeout) != ["ready"]:  # its imports: once, not per rank
            self.close()
            raise AssertionError(f"the harness's fork server did not start within {timeout:g} s")

    def send(self, request: dict) -> None:
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()

    def line(self, deadline: float):
        """The server's next line as words, or None at the deadline (or if the server died)."""
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode().split()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


def run(func, size: int, timeout: float = TIMEOUT) -> None:
    global _server
    if _server is None or _server.proc.poll() is not None:
        _server = _Server(timeout)
    server = _server
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, **RANK_ENV}
        paths = [os.path.join(tmp, f"rank{rank}.log") for rank in range(size)]
        deadline = time.monotonic() + timeout
        pids, codes = [], {}
        try:
            for rank in range(size):
                server.send({"module": func.__module__, "name": func.__name__, "rank": rank,
                             "size": size, "store": os.path.join(tmp, "store"), "log": paths[rank],
                             "env": env})
            while len(pids) < size and (said := server.line(deadline)) is not None:
                pids.append(int(said[1]))  # "pid PID", in the order of the requests
            while len(pids) == size and len(codes) < size and (said := server.line(deadline)) is not None:
                codes[int(said[1])] = int(said[2])  # "exit PID CODE"
        finally:
            if len(codes) < size:  # timed out (or the server died): end the ranks and the server
                for pid in pids:
                    if pid not in codes:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                server.close()  # a server with ranks of this run still in flight serves no other run
                _server = None
        if len(pids) < size:
            raise AssertionError(f"{func.__name__}: the harness's fork server started {len(pids)} of {size} ranks")
        failures = []
        for rank, pid in enumerate(pids):
            with open(paths[rank]) as log:
                output = log.read()
            code = codes.get(pid)
            if code != 0:
                why = "timed out" if code in (None, -signal.SIGKILL) else f"exit code {code}"
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


def _rank(request: dict) -> int:
    """In a forked rank: its output to its log, the run's environment, then the test function."""
    fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1), os.dup2(fd, 2), os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.environ.clear()
    os.environ.update(request["env"])
    import gloo_harness  # the test modules' copy of this module, so leave() sees the store
    code = 0
    try:
        gloo_harness._child(request["module"], request["name"], request["rank"], request["size"],
                            request["store"])
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _serve() -> None:
    """The fork server: torch and hvdlite imported once; for each request line, fork a rank and
    say `pid PID`; for each rank that ended, `exit PID CODE`. Ends when its stdin closes (the
    test process ended), after its ranks. One thread: a fork copies no other thread's locks."""
    import pytest  # noqa: F401 (imported for the ranks: every test module imports these)
    import torch.distributed  # noqa: F401
    from hvdlite.torch import runtime  # noqa: F401
    from hvdlite.worker.world import WorldInfo  # noqa: F401
    out, pending, running, open_ = sys.stdout.buffer, b"", set(), True
    out.write(b"ready\n")
    out.flush()
    while open_ or running:
        # With no rank running it sleeps until the next request; else it looks for ended ranks.
        if open_ and select.select([0], [], [], 0.02 if running else None)[0]:
            chunk = os.read(0, 65536)
            open_ = bool(chunk)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                pid = os.fork()
                if pid == 0:  # the rank: it never returns into this loop
                    code = 1
                    try:
                        code = _rank(json.loads(line))
                    finally:
                        # Skip interpreter teardown: destroying a gloo group at exit can abort the process
                        # ("terminate called without an active exception") or wait on a peer that is gone.
                        os._exit(code)
                running.add(pid)
                out.write(f"pid {pid}\n".encode())
                out.flush()
        elif not open_:
            time.sleep(0.02)
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            running.discard(pid)
            out.write(f"exit {pid} {os.waitstatus_to_exitcode(status)}\n".encode())
            out.flush()


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()
