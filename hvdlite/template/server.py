"""The template process: preload modules, then fork workers on request.

Fork safety: a forked child holds only the forking thread, and any lock another thread held
stays locked in it forever. So the template must have no threads when it forks, and runs no
torch op (torch's thread pools start with the first parallel op, never at import). Importing
numpy starts OpenBLAS's thread pool, but OpenBLAS stops that pool in its own at-fork handler;
`fork_safe` checks this for whatever was preloaded: a probe fork must leave the template with
one thread.

The template is single-threaded: it waits on its connections and on a SIGCHLD wakeup pipe.
On this machine its one connection is the driver's control socket. On a remote host spawn
clients (hvdlite.template.spawn) connect to its listening socket, one per worker, and the
driver's SSH channel on stdin is its lifeline: end of stream, or no heartbeat for
LIFELINE_SILENCE seconds (a partition), means the driver is gone. Then it forks no more, but
waits for its children (and reports their exits to their clients) before it exits, so they
outlive the driver as plainly launched workers do. Its children die with it (see
child.detach); a client's death kills its worker's process group, since nobody would report
that worker's exit any more.

A kept template (kept.py) has no lifeline but an idle timer: it serves spawn clients on its
listener until it has had no client and no child for `idle` seconds. Its clients are jobs'
drivers: a dead one's workers die with it, except a --checkpoint-dir job's, which train on for
the job's next driver as plain workers do. It refuses every spawn
once a module it preloaded changed on disk, and then stops serving at once (its socket goes,
so the next job can start a fresh one).
"""
import gc
import importlib
import os
import select
import signal
import socket
import sys
import threading
import time

from hvdlite.template import child, kept, spawn, wire
from hvdlite.template.command import Refused, plan
from hvdlite.worker import claim, env

# hvdlite/torch/boot, the sitecustomize every worker's PYTHONPATH starts with (torchrunenv.py)
_BOOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch", "boot")
LIFELINE_SILENCE = 10.0  # seconds without a byte from the driver's SSH channel: it is gone


def preload(modules):
    """Import each module; one that needs a module not installed on this interpreter (torch
    under the numpy backend) is skipped, not an error."""
    loaded, skipped = [], []
    for name in modules:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except ModuleNotFoundError as e:
            skipped.append(f"{name} (no module {e.name})")
    return loaded, skipped


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def fork_safe():
    """None if forking now is safe, else why not."""
    if threading.active_count() > 1:
        return f"preloading started Python threads: {[t.name for t in threading.enumerate()]}"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    left = _threads()
    os.waitpid(pid, 0)
    if left > 1:
        return f"preloading started {left - 1} native threads that keep running across fork"
    return None


def exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _tell(conn, header: dict) -> None:
    try:
        wire.send(conn, header)
    except OSError:  # its reader finds the end of stream and hangs up
        pass


class Child:
    """What a forked child goes on to run, once it is out of the template's loop."""

    def __init__(self, template_pid, ready_fd, header, fds, planned):
        self.template_pid, self.ready_fd, self.header, self.fds, self.planned = \
            template_pid, ready_fd, header, fds, planned

    def run(self) -> None:
        child.detach(self.template_pid, self.ready_fd)
        kind, target, args, unbuffered = self.planned
        child.become_worker(self.fds[0], self.fds[1], self.header["env"], self.header["cwd"], unbuffered)
        claim.claim_now()  # the launch's, as a plain start's sitecustomize would (the template had none)
        boot = sys.modules.get("sitecustomize")
        if os.path.dirname(getattr(boot, "__file__", None) or "") == _BOOT:  # it ran in the template
            boot.after_fork()
        if self.header.get("mark"):  # a remote launcher's marker: the group it signals, before any output
            os.write(1, f"{self.header['mark']} {spawn.mark()} template\n".encode())
        child.run(kind, target, args, self.header["argv"][0])


class Template:
    """Serves spawn requests: from the driver's `control` socket (this machine; its end of
    stream ends the job's use of the template), or from clients accepted on `listener`
    while `lifeline` (a readable fd) lives."""

    def __init__(self, control: socket.socket = None, listener: socket.socket = None,
                 lifeline: int = None, silence: float = LIFELINE_SILENCE, idle: float = None,
                 on_stop=None, started_env: dict = None):
        self.control, self.listener, self.lifeline, self.silence = control, listener, lifeline, silence
        self.idle, self.on_stop = idle, on_stop  # kept: the idle timer, and what stops serving does
        self.stamps = kept.module_stamps() if idle is not None else None
        self.stale = None  # why a kept template refuses: a preloaded module changed
        self.readers = {control: wire.Reader(control)} if control is not None else {}
        # The environment the process started with, which a worker's must match (command.plan):
        # not what preloading set in it (torch._dynamo sets TORCHINDUCTOR_CACHE_DIR).
        self.started_env = dict(os.environ) if started_env is None else started_env
        self.children = {}  # pid -> (connection or None once it closed, spawn id)
        self.train_on = set()  # children of a --checkpoint-dir job: they outlive their driver
        self.serving = True  # the driver is there: accept and fork
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)

    def serve(self):
        """Serve spawn requests until the driver is gone and the last child exited; returns a
        Child in a forked child, None in the template."""
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        heard = time.monotonic()
        while self.serving or self.children:
            watch = [self.wake_r, *self.readers]
            if self.serving and self.lifeline is not None:
                watch += [fd for fd in (self.lifeline, self.listener) if fd is not None]
            timeout = max(0.0, heard + self.silence - time.monotonic()) \
                if self.serving and self.lifeline is not None else None
            if self.serving and self.idle is not None:
                watch.append(self.listener)
                if self.readers or self.children:
                    heard = time.monotonic()
                timeout = max(0.0, heard + self.idle - time.monotonic())
            readable, _, _ = select.select(watch, [], [], timeout)
            if self.serving and self.idle is not None and not self.readers and not self.children \
                    and self.listener not in readable and time.monotonic() > heard + self.idle:
                self._orphaned()
            if self.wake_r in readable:
                os.read(self.wake_r, 4096)
                self._reap()
            if self.lifeline in readable and self.serving:
                if os.read(self.lifeline, 4096):
                    heard = time.monotonic()
                else:
                    self._orphaned()
            if self.serving and self.lifeline is not None and time.monotonic() > heard + self.silence:
                self._orphaned()
            if self.listener in readable and self.serving:
                conn, _ = self.listener.accept()
                self.readers[conn] = wire.Reader(conn)
            for conn in [c for c in readable if c in self.readers]:
                job = self._receive(conn)
                if job is not None:
                    return job
        signal.set_wakeup_fd(-1)
        return None

    def _receive(self, conn):
        try:
            more = self.readers[conn].read_once()
        except OSError:
            more = False
        for header, _, fds in list(self.readers[conn].frames()):
            job = self._spawn(conn, header, fds) if header.get("op") == "spawn" else None
            if job is not None:
                return job
        if not more:
            self._hangup(conn)
        return None

    def _orphaned(self) -> None:
        """The driver is gone: fork no more."""
        if not self.serving:
            return
        self.serving = False
        if self.listener is not None:
            self.listener.close()
        if self.on_stop is not None:
            self.on_stop()

    def _hangup(self, conn) -> None:
        del self.readers[conn]
        conn.close()
        if conn is self.control:
            self._orphaned()
            return
        for pid, (owner, spawn_id) in list(self.children.items()):
            if owner is conn:  # its client died: nobody would report this worker's end
                self.children[pid] = (None, spawn_id)
                # A kept template's client is a job's driver: its dead driver's workers train
                # on for the next one, as plain workers do (failover.md).
                if self.idle is not None and pid in self.train_on:
                    continue
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _reap(self) -> None:
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            conn, spawn_id = self.children.pop(pid, (None, None))
            self.train_on.discard(pid)
            if conn is not None and conn in self.readers:
                _tell(conn, {"op": "exit", "id": spawn_id, "pid": pid, "code": exit_code(status)})

    def _spawn(self, conn, header, fds):
        try:
            if self.stamps is not None and self.stale is None:
                changed = kept.first_changed(self.stamps)
                if changed:
                    self.stale = f"kept template {os.getpid()} is out of date: {changed} changed on disk"
                    self._orphaned()
            if self.stale:
                raise Refused(self.stale)
            if not self.serving:
                raise Refused("the driver is gone")
            if len(fds) != 2:
                raise Refused(f"expected 2 output descriptors, got {len(fds)}")
            planned = plan(header["argv"], header["env"], header["cwd"], sys.executable,
                           self.started_env)
        except Refused as e:
            for fd in fds:
                os.close(fd)
            _tell(conn, {"op": "refused", "id": header["id"], "reason": str(e),
                         "outdated": self.stale is not None})
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            # What it inherited, out of its collections: its first full one would walk all that
            # was preloaded (400,000 objects with transformers: 0.2-0.3 s of CPU, copying each
            # page it touches) holding the GIL, its heartbeat silent for seconds on a busy machine.
            gc.freeze()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(ready_r)
            for sock in [*self.readers, self.listener]:
                if sock is not None:
                    sock.close()
            for fd in (self.wake_r, self.wake_w):
                os.close(fd)
            return Child(os.getppid(), ready_w, header, fds, planned)
        os.close(ready_w)
        os.read(ready_r, 1)  # the child leads its own group now (or is dead: then b"")
        os.close(ready_r)
        for fd in fds:
            os.close(fd)
        self.children[pid] = (conn, header["id"])
        if env.DRIVER_GRACE in header["env"]:
            self.train_on.add(pid)
        _tell(conn, {"op": "started", "id": header["id"], "pid": pid})
        return None
