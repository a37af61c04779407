"""A worker on an SSH host that an earlier driver of the job launched: the Handle a driver that
took the job over on another machine (a standby) has for it.

Its process group id is the journal's pid. No channel of this driver leads to it, so its end
is what it said as it exited (`said`), and otherwise the driver's own judgement: a worker that
stops beating is stopped over SSH like any other, and counted ended once the KILL was sent
(or its host could not be reached to send it). Its output reaches this driver as a local
adopted worker's does, through the files in --checkpoint-dir, which its host shares.
"""
import signal

from hvdlite.driver.launchers.adopted import AdoptedWorker
from hvdlite.driver.launchers.ssh.connection import SSHError, SSHHost


class AdoptedSSHWorker(AdoptedWorker):
    def __init__(self, host: SSHHost, pgid: int, said, output, files: dict, identity=None):
        super().__init__(pgid, identity, said, output, files)  # identity: its host's, for the journal
        self._host = host

    def poll(self):
        if self._code is None and (said := self._said()) is not None:
            self._code = said
            self._ended.set()
        return self._code

    def signal(self, sig) -> None:
        if self._code is not None:
            return
        try:
            self._host.run(f"kill -s {signal.Signals(sig).name[3:]} -- -{int(self._pid)} 2>/dev/null; exit 0")
        except SSHError:
            pass  # its host is cut off or down: it is judged gone, as if the KILL arrived
        if sig == signal.SIGKILL and self._code is None:
            self._code = -signal.SIGKILL
            self._ended.set()
