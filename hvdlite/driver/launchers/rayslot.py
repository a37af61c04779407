"""The Ray actor of one slot: it runs on its node and starts the usual worker process there.

The worker is a process in its own process group, as on SSH hosts: signals go to the group,
its exit code is the process's. It starts plainly, or through the spawn client
(hvdlite.template.spawn), which has the node's template fork it; the client's first line says
which process group is the worker's (spawn.MARK). The worker (or its spawn client, whose death
makes the template kill the worker) dies with the actor (PDEATHSIG), so a killed actor leaves
nothing behind. Output is kept in a bounded buffer the driver reads with read(). This module
runs inside Ray's worker processes on every node: it imports the standard library and the
spawn client's marker only.
"""
import collections
import ctypes
import os
import signal
import subprocess
import threading
import time

from hvdlite.procstat import exiting, identity, runs
from hvdlite.template.spawn import MARK, TEMPLATE_DIED, marked
from hvdlite.worker.gpus import VISIBLE

MAX_LINES = 10000  # buffered lines while the driver does not read; older ones are dropped


def die_with_parent():
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def start_process(argv, env: dict, cwd: str, stdin) -> subprocess.Popen:
    """`argv` in a session of its own, its output on pipes; it dies with the calling thread
    (PDEATHSIG), which must live as long as it does."""
    return subprocess.Popen(argv, env=env, cwd=cwd if os.path.isdir(cwd) else None, stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=die_with_parent)


class Slot:
    def __init__(self):
        self.proc = None
        self.code = None
        self.template_died = False  # the worker died with the template it was forked from
        self.lines = collections.deque(maxlen=MAX_LINES)
        self.changed = threading.Condition()
        self.open_pipes = 0
        self.pgid = None  # the worker's process group
        self.template_pid = None  # the template that forks it, if any
        self.marked = threading.Event()  # the spawn client said how the worker started
        self.how = ("ray", None)  # how it started, and why plainly after all (spawn client)

    def start(self, argv, env: dict, cwd: str, template_pid: int = None, timeout: float = 30.0):
        """Start the worker: `argv`, or with `template_pid` a spawn client's argv that has the
        node's template (that process) fork it. Returns (process group, how it started, why
        plainly after all or None, the group leader's PID:STARTTIME for a later driver's
        running())."""
        import ray
        # Exactly the GPUs Ray reserved for this actor (--gpus-per-slot), none if it reserved none.
        # (Outside an actor, get_gpu_ids() would start a Ray instance of its own.)
        if ray.is_initialized():
            env = {**env, VISIBLE: ",".join(str(gpu) for gpu in ray.get_gpu_ids())}
        started = threading.Event()
        errors = []
        self.template_pid = template_pid
        if template_pid is None:
            self.marked.set()
        # PDEATHSIG fires when the thread that forked ends: a thread that lives as long as the
        # worker forks it and then waits for it.
        threading.Thread(target=self._run, args=(argv, env, cwd, started, errors), daemon=True,
                         name="hvdlite-slot").start()
        started.wait(timeout)
        if errors:
            raise errors[0]
        self.marked.wait(timeout)
        pgid = self.pgid or self.proc.pid
        return pgid, *self.how, identity(pgid)

    def _run(self, argv, env, cwd, started, errors):
        try:
            self.proc = start_process(argv, env, cwd, subprocess.DEVNULL)
        except OSError as e:
            errors.append(e)
            started.set()
            return
        self.open_pipes = 2
        for stream, pipe in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            threading.Thread(target=self._pump, args=(stream, pipe), daemon=True).start()
        started.set()
        code = self.proc.wait()
        # A spawn client ends as its worker did; the template's death took the worker if the
        # template is on its way out as the client sees its connection end.
        died = code == -signal.SIGKILL and self.template_pid is not None and exiting(self.template_pid)
        with self.changed:
            self.code, self.template_died = code, died
            self.changed.notify_all()

    def _pump(self, stream, pipe):
        with pipe:
            for raw in iter(pipe.readline, b""):
                if stream == "stdout" and raw.rstrip(b"\n") == TEMPLATE_DIED.encode():
                    continue  # the spawn client's last word, not output: its exit and the template's state tell
                if stream == "stdout" and not self.marked.is_set() and raw.startswith(MARK.encode() + b" "):
                    self._mark(raw.decode("utf-8", "replace").split(None, 3)[1:])
                    continue
                with self.changed:
                    self.lines.append((stream, raw.decode("utf-8", "replace")))
                    self.changed.notify_all()
        with self.changed:
            self.open_pipes -= 1
            self.changed.notify_all()
        self.marked.set()  # ended before its marker: the exit code tells

    def _mark(self, words) -> None:
        """`PGID:START template` or `PGID:START plain REASON`, from the spawn client."""
        self.pgid = marked(words[0])[0]
        if words[1:2] == ["template"]:
            self.how = ("template", None)
        else:
            self.how = ("ray", words[2].strip() if len(words) > 2 else "no reason given")
        self.marked.set()

    def read(self, wait: float):
        """(lines, exit code or None, whether its template's death took it): what the worker
        printed since the last read, waiting up to `wait` seconds for something; the code once
        it exited and its output is all read."""
        with self.changed:
            self.changed.wait_for(lambda: self.lines or self._done(), wait)
            lines = list(self.lines)
            self.lines.clear()
            return lines, self.code if self._done() else None, self.template_died

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
                os.killpg(self.pgid or self.proc.pid, sig)
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
        if self.pgid not in (None, self.proc.pid):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the spawn client's own group
            except ProcessLookupError:
                pass
        try:
            return self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            return None


def running(identities) -> list:
    """Which of `identities` (PID:STARTTIME) run on this node: a task of a driver that takes a
    job over (RayLauncher.running)."""
    return [i for i in identities if runs(i)]
