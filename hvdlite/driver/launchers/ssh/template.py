"""Worker templates on SSH hosts (hvdlite.template, hosttemplates.py): one per host, started
over an SSH channel of its own that is also its lifeline.

The template runs `PYTHON -m hvdlite.template --listen` with the job's environment (minus a
worker's identity and the secret), sent on the channel's stdin as a worker's is. Once it says
`ready` with the path of its socket, workers launched on the host run the spawn client
(hvdlite.template.spawn), which has the template fork them; until then, and when it cannot,
they start plainly. The driver sends a byte on the channel every HEARTBEAT seconds: when the
driver dies or the host is cut off, the template forks no more and exits after its last
worker.
"""
import socket

import paramiko

from hvdlite.driver.launchers.hosttemplates import HostTemplate, HostTemplates
from hvdlite.driver.launchers.ssh.config import SSHError
from hvdlite.driver.launchers.ssh.remote import _exec
from hvdlite.driver.launchers.template import READY_TIMEOUT
from hvdlite.template import wire

HEARTBEAT = 1.0  # seconds between the driver's bytes on a template's channel (it waits 10)


class RemoteTemplate(HostTemplate):
    """One SSH host's template, on a channel of its own."""

    def __init__(self, host, command, env: dict, cwd: str, preload, failed):
        self.host, self.chan = host, None
        super().__init__(host.hostname, command, env, cwd, preload, failed)

    def _run(self, argv, env: dict, cwd: str) -> None:
        try:
            self.chan, _ = _exec(self.host, argv, env, cwd, announce=False, lifeline=True)
            header = self._handshake()
        except SSHError:  # the host's workers report it; try again with the next launch
            self.finished = True
            return
        if header.get("op") != "ready" or not header.get("socket"):
            self.finished = True
            self._failed(header.get("reason", "template unusable"))
            self.close()
            return
        self.socket = header["socket"]
        self._heartbeat()
        self.socket, self.finished = None, True

    def _handshake(self) -> dict:
        reader = wire.Reader()
        self.chan.settimeout(READY_TIMEOUT)
        try:
            while True:
                for header, _, _ in reader.frames():
                    return header
                if not reader.feed(self.chan.recv(65536)):
                    break
            said = self.chan.makefile_stderr("rb").read().decode("utf-8", "replace").strip().splitlines()
        except (socket.timeout, TimeoutError):
            return {"op": "unusable", "reason": f"preloading took over {READY_TIMEOUT:.0f} s"}
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise SSHError(str(e)) from None
        return {"op": "unusable", "reason": f"template exited: {said[-1] if said else 'no message'}"}

    def _heartbeat(self) -> None:
        """Until the template exits, the connection ends or the job closes it."""
        self.chan.settimeout(10 * HEARTBEAT)
        try:
            while not self._closed and not self.chan.exit_status_ready():
                self.chan.sendall(b".")
                while self.chan.recv_stderr_ready():  # its own warnings: do not let them fill the window
                    self.chan.recv_stderr(65536)
                # Woken by its exit (or the channel's close): its socket is forgotten at once.
                self.chan.status_event.wait(HEARTBEAT)
        except (paramiko.SSHException, OSError, EOFError):
            pass

    def close(self) -> None:
        """End the lifeline: the template forks no more and exits after its last worker."""
        self._closed = True
        if self.chan is not None:
            self.chan.close()


class RemoteTemplates(HostTemplates):
    """The job's templates on SSH hosts, by host name."""

    def __init__(self, preload, say):
        super().__init__(preload, say, RemoteTemplate, name=lambda host: host.hostname)
