"""Workers on this machine: a subprocess per slot, or a fork of the local template."""
import os
import threading

from hvdlite.driver.launchers.kept import Keeper
from hvdlite.driver.launchers.locality import is_local
from hvdlite.driver.launchers.process import LocalWorker
from hvdlite.driver.launchers.start import StartRule
from hvdlite.driver.launchers.template import Templates
from hvdlite.driver.network import LOOPBACK


class LocalLauncher:
    private = True  # this machine

    def __init__(self, settings, say):
        self.command = settings.command
        self._rule = StartRule(settings)
        self._ssh_config = settings.ssh_config or "default"  # a host named in it may be this one
        # With --keep-warm the local template is a kept one, and every local worker forks from it
        # once it serves.
        keeper = Keeper(settings.keep_warm) if settings.keep_warm else None
        self._templates = Templates(settings.preload, say=say, keeper=keeper) if settings.preload else None
        self._lock = threading.Lock()
        self._warm_env = None  # a local worker's environment, to start the template with

    def is_local(self, host) -> bool:
        return is_local(host, self._ssh_config)

    def claims_from(self, host):
        return None  # private: its workers are handed the secret and make no claim

    def route_to(self, host) -> str:
        return LOOPBACK

    def start(self, host, env: dict, output, joining: bool, local_workers: int = 1):
        if self._templates and self._rule.fork_locally(joining, local_workers):
            return self._templates.spawn(self.command, env, os.getcwd(), output)
        # --keep-warm: fork from the kept template when one serves; the first such job starts
        # its workers as a plain job does (their imports in parallel) and leaves the kept
        # template starting behind it (close), so that it costs no more than a plain job.
        if self._rule.keep_warm and self._templates and self._templates.kept_serving(self.command, env, os.getcwd()):
            return self._templates.spawn(self.command, env, os.getcwd(), output)
        with self._lock:
            first, self._warm_env = self._warm_env is None, self._warm_env or env
        if first and self._rule.joins_possible:
            self.warm()
        return LocalWorker(self.command, env, output)

    def launch_wait(self):
        """Seconds the template a pending launch waits for (still importing what it preloads)
        waited for a CPU; None when no template is starting."""
        return self._templates.preloading_wait() if self._templates else None

    def warm(self):
        """Start the template in the background once a worker's environment is known."""
        with self._lock:
            env = self._warm_env
        if self._templates and env is not None:
            threading.Thread(target=self._templates.warm, args=(self.command, env, os.getcwd()),
                             daemon=True, name="hvdlite-template-warm").start()

    def close(self):
        if self._templates:
            with self._lock:
                env = self._warm_env  # set by a plain local launch
            if self._rule.keep_warm and env is not None:
                self._templates.keep_behind(self.command, env, os.getcwd())
            self._templates.close()
