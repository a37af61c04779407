"""Workers on remote hosts over SSH: one connection per host, and the host's template."""
import os
import threading

from hvdlite import procstat
from hvdlite.driver.launchers.locality import is_local
from hvdlite.driver.launchers.ssh.adopted import AdoptedSSHWorker
from hvdlite.driver.launchers.ssh.config import SSHError, SSHSettings, host_config
from hvdlite.driver.launchers.ssh.connection import SSHHost
from hvdlite.driver.launchers.ssh.remote import launch
from hvdlite.driver.launchers.ssh.template import RemoteTemplates
from hvdlite.driver.launchers.start import StartRule
from hvdlite.driver.network import route_address


class SSHLauncher:
    private = True  # over SSH, encrypted

    def __init__(self, settings, say):
        self.command = settings.command
        self.settings = SSHSettings(
            port=settings.ssh_port, identity_file=settings.ssh_identity_file,
            accept_unknown_hosts=settings.ssh_accept_unknown_hosts,
            **({"ssh_config": settings.ssh_config} if settings.ssh_config else {}))
        self._rule = StartRule(settings)
        # A host's template starts with its first joining worker (any worker, with --preload)
        # or once the first world formed; its workers start plainly until it is ready.
        self._templates = RemoteTemplates(settings.preload, say) if settings.preload else None
        self._hosts = {}  # hostname -> SSHHost, one connection per remote host
        self._lock = threading.Lock()

    def is_local(self, host) -> bool:
        return is_local(host, self.settings.ssh_config)

    def claims_from(self, host):
        return None  # private: its workers are handed the secret and make no claim

    def route_to(self, host) -> str:
        """This machine's address on the route to the host's ssh HostName."""
        return route_address(host_config(host, self.settings).address)

    def start(self, host, env: dict, output, joining: bool, local_workers: int = 1):
        connection, socket_path = self._host(host), None
        if self._templates:
            socket_path = self._templates.socket(connection, self.command, env, os.getcwd(),
                                                 start=self._rule.template_remotely(joining))
        forget = lambda: self._templates.forget(connection, socket_path)  # noqa: E731
        worker = launch(connection, self.command, env, os.getcwd(), output, template=socket_path,
                        template_gone=forget)
        if worker.fallback:
            self._templates.fell_back(connection, socket_path, worker.fallback)
        return worker

    def adopt(self, host, pgid: int, said, output, files: dict, identity=None):
        """The Handle of a worker an earlier driver launched on `host` (ssh/adopted.py)."""
        return AdoptedSSHWorker(self._host(host), pgid, said, output, files, identity)

    def running(self, host, identities) -> set:
        """Which of `identities` (PGID:START, from the launch's marker: ssh/remote.py) still run
        on `host`, in one exec; none when the host cannot be reached (a take-over then launches
        their slots again, blaming nobody: job.py)."""
        pids = " ".join(str(int(identity.split(":")[0])) for identity in identities)
        try:
            _, out, _ = self._host(host).run(f'for p in {pids}; do echo "$p $(cat /proc/$p/stat 2>/dev/null)"; done')
        except SSHError:
            return set()
        there = {procstat.identity(int(pid), stat) for pid, _, stat in (line.partition(" ") for line in out.splitlines())}
        return set(identities) & there

    def warm(self):
        if self._templates:
            self._templates.warm()

    def _host(self, hostname):
        with self._lock:
            if hostname not in self._hosts:
                self._hosts[hostname] = SSHHost(hostname, self.settings)
            return self._hosts[hostname]

    def close(self):
        if self._templates:
            self._templates.close()
        with self._lock:
            for host in self._hosts.values():
                host.close()
