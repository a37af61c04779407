"""A worker process on this machine, in its own process group: the Handle of local launches."""
import os
import signal
import subprocess
import time

from hvdlite.driver.launchers.base import term_then_kill
from hvdlite.driver.output import RankOutput


class LocalWorker:
    started = "process"  # how the worker was started, for the event log
    error = None

    def __init__(self, command, env: dict, output: RankOutput, cwd=None):
        self.output = output
        # A new session makes the worker the leader of its own process group, so stop()
        # reaches everything it spawned and a Ctrl-C on the driver's terminal does not.
        self.proc = subprocess.Popen(
            command, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self._pumps = [output.pump("stdout", self.proc.stdout), output.pump("stderr", self.proc.stderr)]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self):
        """Exit code, negative for a signal, or None while running."""
        return self.proc.poll()

    def wait(self, timeout: float):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace: float = 3.0) -> None:
        """TERM the worker's process group, KILL it after `grace` seconds."""
        term_then_kill(self, grace)
        # Children that outlived the leader still hold the group; end them too.
        self.signal(signal.SIGKILL)
        self.finish_output()

    def finish_output(self, timeout: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        for pump in self._pumps:
            pump.join(max(0.0, deadline - time.monotonic()))
