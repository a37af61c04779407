"""A worker on this machine that an earlier driver of the job launched: the Handle a driver
that took the job over (job.py, --checkpoint-dir) has for it.

It is no child of this process: its end is seen in /proc (its pid and start time, so a pid
given out again is not taken for it), its exit code is what it said as it exited (`said`), or
SIGKILL when it ended without a word. Its output pipes led to the dead driver; it writes on
into files in the driver folder (worker/rescue.py), which are relayed here line by line.
"""
import os
import signal
import threading
import time

from hvdlite import procstat
from hvdlite.driver.launchers.base import term_then_kill
from hvdlite.worker import beacon

POLL = 0.1  # seconds between looks at /proc and at the output files
MARK = ".relayed"  # beside an output file: how many of its bytes a driver relayed


def _relayed(mark: str) -> int:
    try:
        with open(mark, "rb") as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        return 0


class AdoptedWorker:
    started = "adopted"
    error = None

    def __init__(self, pid: int, identity: str, said, output, files: dict):
        """`said()`: the exit code the worker told the driver, or None; `files`: stream -> path."""
        self._pid, self._identity, self._said = pid, identity, said
        self.output = output
        self._code = None
        self._ended = threading.Event()
        self._relays = [threading.Thread(target=self._relay, args=(stream, path), daemon=True,
                                         name=f"hvdlite-relay-{pid}-{stream}") for stream, path in files.items()]
        for relay in self._relays:
            relay.start()

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def identity(self):
        return self._identity

    def poll(self):
        if self._code is None and procstat.identity(self._pid) != self._identity:
            said = self._said()
            self._code = said if said is not None else -signal.SIGKILL
            self._ended.set()
        return self._code

    def wait(self, timeout: float):
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(min(POLL, max(0.0, deadline - time.monotonic())))
        return self._code

    def signal(self, sig) -> None:
        if procstat.identity(self._pid) == self._identity:
            try:
                os.killpg(self._pid, sig)  # it leads its process group, as every launch's worker
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self, grace: float = 3.0) -> None:
        term_then_kill(self, grace)
        self.finish_output()

    def finish_output(self, timeout: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        for relay in self._relays:
            relay.join(max(0.0, deadline - time.monotonic()))

    def _relay(self, stream: str, path: str):
        """Lines of the file as they come, until the worker ended and the file is read; from
        where an earlier driver's relay of it got to (its mark file), so no line is printed
        twice after a second take-over, but the lines of at most one read."""
        f, pending, mark = None, b"", path + MARK
        while True:
            ended = self._ended.is_set()
            if f is None:
                try:
                    f = open(path, "rb")
                    f.seek(_relayed(mark))
                except OSError:
                    f = None
            chunk = f.read() if f is not None else b""
            if chunk:
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    self.output.line(stream, line.decode("utf-8", "replace") + "\n")
                if lines:
                    beacon.write_private(mark, str(f.tell() - len(pending)).encode())
                continue
            if ended:
                break
            self._ended.wait(POLL)
        if pending:
            self.output.line(stream, pending.decode("utf-8", "replace") + "\n")
        if f is not None:
            f.close()
