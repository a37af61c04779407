"""Worker templates on hosts the driver does not run on: one per host, whatever carries it
there (an SSH channel, ssh/template.py; a Ray actor, raytemplate.py).

A host's template starts with a launch that wants one (or `warm()`, on every host that has had
a worker); launches start plainly until it says it is ready, then fork from it through the
spawn client (hvdlite.template.spawn). A template that died, or hangs, is forgotten as soon
as a spawn client says so (fell_back), and started again by the next launch that wants one; one
that cannot preload is given up for that host (said once).

`make(host, command, env, cwd, preload, failed)` starts one template in the background and
gives a HostTemplate; it calls `failed(reason)` when the template cannot preload.
"""
import threading

from hvdlite.driver.launchers.template import template_env
from hvdlite.template.command import python_name
from hvdlite.template.spawn import REFUSED


def template_argv(command, preload) -> list:
    """The template a host's workers of `command` fork from: on their interpreter, listening."""
    return [command[0], "-m", "hvdlite.template", "--preload", ",".join(preload), "--listen"]


class HostTemplate:
    """One host's template, started by the subclass's `_run(argv, env, cwd)` on a thread of its
    own; `socket` once it is ready, `finished` once it failed or exited, `close()`."""

    def __init__(self, name: str, command, env: dict, cwd: str, preload, failed):
        self.socket = None     # path of its listening socket while it serves
        self.finished = False  # it failed or exited: a later launch may start another
        self._failed = failed  # called with the reason when it cannot preload
        self._closed = False
        threading.Thread(target=self._run, args=(template_argv(command, preload), template_env(env), cwd),
                         daemon=True, name=f"template-{name}").start()


def fallback_line(hostname: str, reason: str) -> str:
    return f"hvdlite: starting workers on {hostname} without a preloaded template ({reason})"


class HostTemplates:
    """The job's templates on remote hosts, by `name(host)`."""

    def __init__(self, preload, say, make, name=str):
        self.preload = tuple(preload)
        self.say = say  # a SayOnce
        self.make, self.name = make, name
        self.lock = threading.Lock()
        self.templates = {}
        self.failed = {}  # host name -> why its template cannot run
        self.first = {}   # host name -> (host, command, env, cwd) of its first launch

    def serving(self, host, command, env: dict, cwd: str, start: bool):
        """The host's ready template, or None (launch plainly). With `start`, start one if
        none runs."""
        name = self.name(host)
        with self.lock:
            self.first.setdefault(name, (host, command, env, cwd))
            current = self.templates.get(name)
            if current is not None and current.socket is not None:
                return current
            if start:
                self._start(host, command, env, cwd)
        return None

    def socket(self, host, command, env: dict, cwd: str, start: bool):
        """The path of the host's ready template's socket, or None (see serving)."""
        current = self.serving(host, command, env, cwd, start)
        return current.socket if current is not None else None

    def forget(self, host, socket_path: str) -> None:
        """The template at socket_path died, or hangs (a spawn client said so): no launch tries
        it again, and the next one that wants a template starts another."""
        with self.lock:
            current = self.templates.get(self.name(host))
            if current is not None and current.socket == socket_path:
                current.socket, current.finished = None, True
                current.close()  # a hung one forks no more once it wakes: its lifeline is gone

    def fell_back(self, host, socket_path: str, reason: str) -> None:
        """A launch's spawn client started its worker plainly after all, for `reason`: said
        once; the template is forgotten unless it serves and only refused this command."""
        self.say(fallback_line(self.name(host), reason))
        if not reason.startswith(REFUSED):  # nobody answers at that socket, or it hangs
            self.forget(host, socket_path)

    def warm(self) -> None:
        """Start a template on every remote host that has had a worker."""
        with self.lock:
            for launch in self.first.values():
                self._start(*launch)

    def _start(self, host, command, env: dict, cwd: str) -> None:
        name = self.name(host)
        current = self.templates.get(name)
        if name in self.failed or (current is not None and not current.finished):
            return
        if not python_name(command[0]):
            self._give_up(name, f"{command[0]} is not a python interpreter")
            return
        self.templates[name] = self.make(host, command, env, cwd, self.preload,
                                         lambda reason: self._give_up(name, reason))

    def _give_up(self, name: str, reason: str) -> None:
        self.failed[name] = reason
        self.say(fallback_line(name, reason))

    def close(self) -> None:
        with self.lock:
            for template in self.templates.values():
                template.close()
            self.templates = {}
