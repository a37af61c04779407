"""Starting a worker on a host: a local subprocess when the host is this machine, else SSH.

Launches run on the executor's threads, never on the decision thread: name lookups, SSH
connects and remote start-up can take seconds.
"""
import os
import threading

from hvdlite.driver.launchers import ssh
from hvdlite.driver.launchers.kept import Keeper
from hvdlite.driver.launchers.local import LocalWorker
from hvdlite.driver.launchers.locality import is_local
from hvdlite.driver.launchers.ssh.template import RemoteTemplates, fallback_line
from hvdlite.driver.launchers.template import SayOnce, Templates
from hvdlite.driver.network import route_address


def fork_first_world(local_workers: int, cores: int) -> bool:
    """Whether a host's first workers fork from its template (when workers may join later,
    so that the template starts with the job). Below one worker per core they import in
    parallel with the template, on cores nobody else uses; from one per core on, their
    imports would share the cores with the template's, and one import plus forks is faster
    than as many imports as workers."""
    return local_workers >= cores


class Launchers:
    def __init__(self, settings):
        self.command = settings.command
        self.ssh_settings = ssh.SSHSettings(
            port=settings.ssh_port, identity_file=settings.ssh_identity_file,
            accept_unknown_hosts=settings.ssh_accept_unknown_hosts,
            **({"ssh_config": settings.ssh_config} if settings.ssh_config else {}))
        self._remote = {}  # hostname -> SSHHost, one connection per remote host
        self._lock = threading.Lock()
        # Workers that join a running job fork from a template that imported torch already
        # (all local workers with --preload). When workers may join, the local template starts
        # with the first world, so that an early join need not wait for its imports (see
        # fork_first_world). A remote host's template starts with its first joining worker
        # (any worker, with --preload) or once the first world formed; its workers start
        # plainly until it is ready.
        self._say = SayOnce()
        # With --keep-warm the local template is a kept one, and every local worker forks from it.
        keeper = Keeper(settings.keep_warm) if settings.keep_warm else None
        self._templates = Templates(settings.preload, say=self._say, keeper=keeper) if settings.preload else None
        self._remote_templates = RemoteTemplates(settings.preload, self._say) if settings.preload else None
        self._preload_first = settings.preload_first
        self._keep_warm = bool(settings.keep_warm)
        self._joins_possible = settings.joins_possible
        self._cores = len(os.sched_getaffinity(0))
        self._warm_env = None  # a local worker's environment, to start the template with

    def is_local(self, hostname) -> bool:
        return is_local(hostname, self.ssh_settings.ssh_config)

    def route_to(self, hostname) -> str:
        """This machine's address on the route to a remote host (its ssh HostName)."""
        return route_address(ssh.host_config(hostname, self.ssh_settings).address)

    def launch(self, hostname, env: dict, output, joining: bool, local_workers: int = 1):
        """A started worker: a handle with pid, poll, wait, signal_group, stop, finish_output.
        `joining`: the job runs already (a join or a replacement), not its first world;
        `local_workers`: the slots of its host."""
        if not self.is_local(hostname):
            host, socket_path = self._host(hostname), None
            if self._remote_templates:
                socket_path = self._remote_templates.socket(host, self.command, env, os.getcwd(),
                                                            start=joining or self._preload_first)
            worker = ssh.launch(host, self.command, env, os.getcwd(), output, template=socket_path)
            if worker.fallback:
                self._say(fallback_line(hostname, worker.fallback))
            return worker
        if self._templates and (joining or self._preload_first or (
                self._joins_possible and fork_first_world(local_workers, self._cores))):
            return self._templates.spawn(self.command, env, os.getcwd(), output)
        # --keep-warm: fork from the kept template when one serves; the first such job starts
        # its workers as a plain job does (their imports in parallel) and leaves the kept
        # template starting behind it (close), so that it costs no more than a plain job.
        if self._keep_warm and self._templates and self._templates.kept_serving(self.command, env, os.getcwd()):
            return self._templates.spawn(self.command, env, os.getcwd(), output)
        with self._lock:
            first, self._warm_env = self._warm_env is None, self._warm_env or env
        if first and self._joins_possible:
            self._warm_local()
        return LocalWorker(self.command, env, output)

    def warm(self):
        """Start the templates in the background, so that the next joins fork from them."""
        self._warm_local()
        if self._remote_templates:
            self._remote_templates.warm()

    def _warm_local(self):
        with self._lock:
            env = self._warm_env
        if self._templates and env is not None:
            threading.Thread(target=self._templates.warm, args=(self.command, env, os.getcwd()),
                             daemon=True, name="hvdlite-template-warm").start()

    def _host(self, hostname):
        with self._lock:
            if hostname not in self._remote:
                self._remote[hostname] = ssh.SSHHost(hostname, self.ssh_settings)
            return self._remote[hostname]

    def close(self):
        if self._remote_templates:
            self._remote_templates.close()
        with self._lock:
            for host in self._remote.values():
                host.close()
        if self._templates:
            with self._lock:
                env = self._warm_env  # set by a plain local launch
            if self._keep_warm and env is not None:
                self._templates.keep_behind(self.command, env, os.getcwd())
            self._templates.close()
