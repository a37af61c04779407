"""Starting a worker on a host, by the launcher that reaches it.

Each kind of launcher is one file (base.py says what a launcher is); KINDS names them, and
imports each only when a job uses it. `--launcher KIND` sends every host's workers through one
kind; without it, this machine's hosts run local processes and the others go over SSH.

Launches run on the executor's threads, never on the decision thread: name lookups, SSH
connects and remote start-up can take seconds.
"""
import importlib
import threading

from hvdlite.driver.launchers.base import LaunchError  # noqa: F401 - launchers raise it
from hvdlite.driver.launchers.template import SayOnce

KINDS = {  # name -> "module:class"; the class takes (settings, say)
    "local": "hvdlite.driver.launchers.local:LocalLauncher",
    "ssh": "hvdlite.driver.launchers.ssh.launcher:SSHLauncher",
    "ray": "hvdlite.driver.launchers.ray:RayLauncher",
    "srun": "hvdlite.driver.launchers.srun:SrunLauncher",
}


def _load(kind: str):
    module, name = KINDS[kind].split(":")
    return getattr(importlib.import_module(module), name)


class Launchers:
    """The job's launchers, started on first use; each host's workers go through one."""

    def __init__(self, settings):
        self.settings = settings
        self.kind = settings.launcher  # None: local or SSH by host
        self._say = SayOnce()
        self._made = {}
        self._lock = threading.Lock()

    def _get(self, kind: str):
        with self._lock:
            if kind not in self._made:
                self._made[kind] = _load(kind)(self.settings, self._say)
            return self._made[kind]

    def for_host(self, host: str):
        if self.kind is not None:
            return self._get(self.kind)
        local = self._get("local")
        return local if local.is_local(host) else self._get("ssh")

    def is_local(self, host) -> bool:
        return self.for_host(host).is_local(host)

    def route_to(self, host) -> str:
        return self.for_host(host).route_to(host)

    def private(self, host) -> bool:
        return self.for_host(host).private

    def claims_from(self, host):
        return self.for_host(host).claims_from(host)

    def launch(self, host, env: dict, output, joining: bool, local_workers: int = 1):
        """A started worker's Handle (base.py)."""
        return self.for_host(host).start(host, env, output, joining, local_workers)

    def warm(self):
        """Start the templates in the background, so that the next joins fork from them."""
        for launcher in self._started():
            launcher.warm()

    def _started(self):
        with self._lock:
            return list(self._made.values())

    def close(self):
        for launcher in self._started():
            launcher.close()
