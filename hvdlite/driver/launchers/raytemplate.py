"""The Ray actor that keeps one node's worker template (hvdlite.template) for a job.

It starts `PYTHON -m hvdlite.template --preload ... --listen` on its node, reads the template's
first frame (`ready` with the path of its socket, or `unusable`) and feeds its lifeline, stdin,
a byte every HEARTBEAT seconds for as long as the actor lives. The template dies with the actor
(PDEATHSIG) and the workers it forked die with the template, so ending the actor (the job's
end, the driver's death) leaves no process on the node. This module runs inside Ray's worker
processes on every node: it imports the standard library, the template's frames and rayslot.
"""
import collections
import os
import select
import subprocess
import threading
import time

from hvdlite.driver.launchers.rayslot import start_process
from hvdlite.template import wire

HEARTBEAT = 1.0  # seconds between bytes on the template's lifeline (it waits 10)


class NodeTemplate:
    def __init__(self):
        self.proc = None
        self.exited = threading.Event()
        self.said = collections.deque(maxlen=5)  # the template's last stderr lines

    def start(self, argv, env: dict, cwd: str, timeout: float) -> dict:
        """Start the template; its first frame: ready {pid, socket, ...} or unusable {reason}."""
        answer, answered = {}, threading.Event()
        # PDEATHSIG fires when the thread that forked ends: this one lives as long as the template.
        threading.Thread(target=self._run, args=(argv, env, cwd, timeout, answer, answered),
                         daemon=True, name="hvdlite-template").start()
        answered.wait(timeout + 10)
        return answer or {"op": "unusable", "reason": f"no answer in {timeout:g} s"}

    def wait(self, timeout: float) -> bool:
        """Whether the template exited (waiting up to `timeout` seconds for it)."""
        return self.exited.wait(timeout)

    def _run(self, argv, env, cwd, timeout, answer, answered):
        try:
            self.proc = start_process(argv, env, cwd, subprocess.PIPE)
        except OSError as e:
            answer.update(op="unusable", reason=f"cannot start {argv[0]}: {e.strerror}")
            answered.set()
            self.exited.set()
            return
        threading.Thread(target=self._keep_stderr, daemon=True, name="hvdlite-template-stderr").start()
        answer.update(self._handshake(timeout))
        answered.set()
        try:
            while answer.get("op") == "ready" and self.proc.poll() is None:
                self.proc.stdin.write(b".")
                self.proc.stdin.flush()
                time.sleep(HEARTBEAT)
        except OSError:  # it exited
            pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.exited.set()

    def _handshake(self, timeout: float) -> dict:
        reader, fd = wire.Reader(), self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                if not reader.feed(os.read(fd, 65536)):
                    break
                for header, _, _ in reader.frames():
                    return header
        else:
            return {"op": "unusable", "reason": f"preloading took over {timeout:.0f} s"}
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.1)  # its last stderr lines
        return {"op": "unusable", "reason": f"template exited: {self.said[-1] if self.said else 'no message'}"}

    def _keep_stderr(self):
        with self.proc.stderr:
            for raw in iter(self.proc.stderr.readline, b""):
                if raw.strip():
                    self.said.append(raw.decode("utf-8", "replace").strip())
