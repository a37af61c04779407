"""Starting a worker on a host: a local subprocess when the host is this machine, else SSH.

Launches run on the executor's threads, never on the decision thread: name lookups, SSH
connects and remote start-up can take seconds.
"""
import os
import threading

from hvdlite.driver.launchers import ssh
from hvdlite.driver.launchers.local import LocalWorker
from hvdlite.driver.launchers.locality import is_local
from hvdlite.driver.launchers.template import Templates, preload_setting
from hvdlite.driver.network import route_address


class Launchers:
    def __init__(self, settings):
        self.command = settings.command
        self.ssh_settings = ssh.SSHSettings(
            port=settings.ssh_port, identity_file=settings.ssh_identity_file,
            accept_unknown_hosts=settings.ssh_accept_unknown_hosts,
            **({"ssh_config": settings.ssh_config} if settings.ssh_config else {}))
        self._remote = {}  # hostname -> SSHHost, one connection per remote host
        self._lock = threading.Lock()
        # Local workers fork from a preloaded template (issue 12).
        preload = preload_setting(settings.env.get("HVDLITE_PRELOAD"))
        self._templates = Templates(preload) if preload else None

    def is_local(self, hostname) -> bool:
        return is_local(hostname, self.ssh_settings.ssh_config)

    def route_to(self, hostname) -> str:
        """This machine's address on the route to a remote host (its ssh HostName)."""
        return route_address(ssh.host_config(hostname, self.ssh_settings).address)

    def launch(self, hostname, env: dict, output):
        """A started worker: a handle with pid, poll, wait, signal_group, stop, finish_output."""
        if self.is_local(hostname) and self._templates:
            return self._templates.spawn(self.command, env, os.getcwd(), output)
        if self.is_local(hostname):
            return LocalWorker(self.command, env, output)
        return ssh.launch(self._host(hostname), self.command, env, os.getcwd(), output)

    def _host(self, hostname):
        with self._lock:
            if hostname not in self._remote:
                self._remote[hostname] = ssh.SSHHost(hostname, self.ssh_settings)
            return self._remote[hostname]

    def close(self):
        with self._lock:
            for host in self._remote.values():
                host.close()
        if self._templates:
            self._templates.close()
