"""The Ray actor of one slot: it runs on its node and starts the usual worker process there.

The worker is a plain process in its own process group, as on SSH hosts: signals go to the
group, its exit code is the process's. It dies with the actor (PDEATHSIG), so a killed actor
leaves nothing behind. Output is kept in a bounded buffer the driver reads with read().
This module runs inside Ray's worker processes on every node: it imports only the standard library.
"""
import collections
import ctypes
import os
import signal
import subprocess
import threading
import time

MAX_LINES = 10000  # buffered lines while the driver does not read; older ones are dropped


def _die_with_parent():
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Slot:
    def __init__(self):
        self.proc = None
        self.code = None
        self.lines = collections.deque(maxlen=MAX_LINES)
        self.changed = threading.Condition()
        self.open_pipes = 0

    def start(self, argv, env: dict, cwd: str) -> int:
        """Start the worker; returns its pid (= its process group id)."""
        started = threading.Event()
        errors = []
        # PDEATHSIG fires when the thread that forked ends: a thread that lives as long as the
        # worker forks it and then waits for it.
        threading.Thread(target=self._run, args=(argv, env, cwd, started, errors), daemon=True,
                         name="hvdlite-slot").start()
        started.wait()
        if errors:
            raise errors[0]
        return self.proc.pid

    def _run(self, argv, env, cwd, started, errors):
        try:
            self.proc = subprocess.Popen(
                argv, env=env, cwd=cwd if os.path.isdir(cwd) else None, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                preexec_fn=_die_with_parent)
        except OSError as e:
            errors.append(e)
            started.set()
            return
        self.open_pipes = 2
        for stream, pipe in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            threading.Thread(target=self._pump, args=(stream, pipe), daemon=True).start()
        started.set()
        code = self.proc.wait()
        with self.changed:
            self.code = code
            self.changed.notify_all()

    def _pump(self, stream, pipe):
        with pipe:
            for raw in iter(pipe.readline, b""):
                with self.changed:
                    self.lines.append((stream, raw.decode("utf-8", "replace")))
                    self.changed.notify_all()
        with self.changed:
            self.open_pipes -= 1
            self.changed.notify_all()

    def read(self, wait: float):
        """(lines, exit code or None): what the worker printed since the last read, waiting up
        to `wait` seconds for something; the code once it exited and its output is all read."""
        with self.changed:
            self.changed.wait_for(lambda: self.lines or self._done(), wait)
            lines = list(self.lines)
            self.lines.clear()
            return lines, self.code if self._done() else None

    def _done(self):
        return self.code is not None and (self.open_pipes == 0 or self._pipes_stuck())

    def _pipes_stuck(self):
        # A child the worker left behind may hold its pipes open: give them a moment after the exit.
        if not hasattr(self, "_exited_at"):
            self._exited_at = time.monotonic()
        return time.monotonic() - self._exited_at > 2.0

    def signal(self, sig: int) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace: float):
        """TERM the worker's group, KILL it after `grace` seconds; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        self.signal(signal.SIGKILL)  # children that outlived the leader still hold the group
        try:
            return self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            return None
