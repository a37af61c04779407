"""The template process: preload modules, then fork workers on request.

Fork safety: a forked child holds only the forking thread, and any lock another thread held
stays locked in it forever. So the template must have no threads when it forks, and runs no
torch op (torch's thread pools start with the first parallel op, never at import). Importing
numpy starts OpenBLAS's thread pool, but OpenBLAS stops that pool in its own at-fork handler;
`fork_safe` checks this for whatever was preloaded: a probe fork must leave the template with
one thread.

The template is single-threaded: it waits on its control socket and on a SIGCHLD wakeup
pipe. When the driver goes away (end of stream) it forks no more, but waits for its children
before it exits, so they outlive the driver as plainly launched workers do. Its children
die with it (see child.detach).
"""
import importlib
import os
import select
import signal
import socket
import sys
import threading

from hvdlite.template import child, wire
from hvdlite.template.command import Refused, plan


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


class Child:
    """What a forked child goes on to run, once it is out of the template's loop."""

    def __init__(self, template_pid, ready_fd, header, fds, planned):
        self.template_pid, self.ready_fd, self.header, self.fds, self.planned = \
            template_pid, ready_fd, header, fds, planned

    def run(self) -> None:
        child.detach(self.template_pid, self.ready_fd)
        kind, target, args, unbuffered = self.planned
        child.become_worker(self.fds[0], self.fds[1], self.header["env"], self.header["cwd"], unbuffered)
        child.run(kind, target, args, self.header["argv"][0])


class Template:
    def __init__(self, control: socket.socket):
        self.control = control
        self.reader = wire.Reader(control)
        self.started_env = dict(os.environ)
        self.children = {}  # pid -> spawn id
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)

    def serve(self):
        """Serve spawn requests until the driver goes away; returns a Child in a forked
        child, None in the template once its children are gone."""
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        try:
            while True:
                readable, _, _ = select.select([self.control, self.wake_r], [], [])
                if self.wake_r in readable:
                    os.read(self.wake_r, 4096)
                    self._reap()
                if self.control in readable:
                    if not self.reader.read_once():
                        break
                    for header, _, fds in list(self.reader.frames()):
                        job = self._spawn(header, fds) if header.get("op") == "spawn" else None
                        if job is not None:
                            return job
        except (ConnectionError, BrokenPipeError):
            pass
        signal.set_wakeup_fd(-1)
        self.control.close()
        while self.children:
            pid, _ = os.waitpid(-1, 0)
            self.children.pop(pid, None)
        return None

    def _reap(self) -> None:
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            spawn_id = self.children.pop(pid, None)
            if spawn_id is not None:
                wire.send(self.control, {"op": "exit", "id": spawn_id, "pid": pid,
                                         "code": exit_code(status)})

    def _spawn(self, header, fds):
        try:
            if len(fds) != 2:
                raise Refused(f"expected 2 output descriptors, got {len(fds)}")
            planned = plan(header["argv"], header["env"], header["cwd"], sys.executable,
                           self.started_env)
        except Refused as e:
            for fd in fds:
                os.close(fd)
            wire.send(self.control, {"op": "refused", "id": header["id"], "reason": str(e)})
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(ready_r)
            self.control.close()
            for fd in (self.wake_r, self.wake_w):
                os.close(fd)
            return Child(os.getppid(), ready_w, header, fds, planned)
        os.close(ready_w)
        os.read(ready_r, 1)  # the child leads its own group now (or is dead: then b"")
        os.close(ready_r)
        for fd in fds:
            os.close(fd)
        self.children[pid] = header["id"]
        wire.send(self.control, {"op": "started", "id": header["id"], "pid": pid})
        return None
