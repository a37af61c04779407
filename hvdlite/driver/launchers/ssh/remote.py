"""A worker process on a remote host, started over an SSHHost's connection."""
import re
import shlex
import signal
import socket
import threading
import time

import paramiko

from hvdlite.driver.launchers.ssh.connection import SSHHost, _sh, _signal_code
from hvdlite.driver.launchers.base import TemplateGone
from hvdlite.driver.launchers.ssh.config import SSHError
from hvdlite.driver.launchers.start import spawn_argv
from hvdlite.driver.output import RankOutput
from hvdlite.template.spawn import MARK, TEMPLATE_DIED, marked

LOST = 255  # exit code of a worker whose connection ended before its exit status arrived
# Seconds for the spawn client's last line once its worker ended. The output pump ends at the
# channel's EOF, which came before the exit status, as soon as it gets a CPU: the bound costs
# nothing then, and 2 s was too short at load 17 (the template's death counted against the worker).
TEMPLATE_DIED_WAIT = 10.0
_ENV_END = "__hvdlite_env_end"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Read-only in bash (when /bin/sh is bash): exporting them would end the remote shell.
_SHELL_READONLY = {"BASHOPTS", "BASH_VERSINFO", "EUID", "PPID", "SHELLOPTS", "UID"}


def _exec(host: SSHHost, command, env: dict, cwd: str, announce: bool, lifeline: bool = False):
    """Open a channel and start `command` there with `env` (sent on stdin, never on a command
    line) in `cwd`. With `announce` the shell first prints its pid, the process group, and its
    start time, which exec keeps (else the command prints its own marker). The command's stdin is /dev/null, or with `lifeline`
    the rest of the channel's. Returns (channel, names not exported)."""
    chan = host._open_channel()
    exports, skipped = [], []
    for name, value in env.items():
        if _NAME.match(name) and name not in _SHELL_READONLY:
            exports.append(f"export {name}={shlex.quote(str(value))}\n")
        else:
            skipped.append(name)
    payload = ("".join(exports) + f"{_ENV_END}=1\n").encode()
    script = (f'IFS= read -r __hvdlite_n || exit 97; eval "$(head -c "$__hvdlite_n")" || exit 97; '
              f'[ "${_ENV_END}" = 1 ] || {{ echo "hvdlite: incomplete environment from the driver" >&2; exit 97; }}; '
              f'unset __hvdlite_n {_ENV_END}; ' + (f'echo "{MARK} $$:$(cut -d" " -f22 /proc/$$/stat)"; ' if announce else '') +
              f'cd -- {shlex.quote(cwd)} && exec {" ".join(shlex.quote(str(a)) for a in command)}'
              + ('' if lifeline else ' </dev/null'))
    try:
        chan.exec_command(_sh(script))
        chan.sendall(f"{len(payload)}\n".encode() + payload)
    except (paramiko.SSHException, OSError, EOFError) as e:
        chan.close()
        raise SSHError(f"cannot start {command[0]} on {host.hostname}: {e}") from None
    return chan, skipped


def launch(host: SSHHost, command, env: dict, cwd: str, output: RankOutput,
           template: str = None, template_gone=lambda: None) -> "RemoteWorker":
    """Start `command` (argv) in `cwd` on the host with `env` exported; returns once the
    remote process runs (its process group is known). With `template` (the path of the host's
    template socket) the spawn client asks that template to fork the worker, and launches
    it plainly if it cannot; `template_gone()` is called as soon as its client says that
    template died."""
    if template is not None:
        command = spawn_argv(command, template, host.settings.connect_timeout)
    chan, skipped = _exec(host, command, env, cwd, announce=template is None)
    worker = RemoteWorker(host, chan, output, skipped)
    worker.template_gone = template_gone
    try:
        worker._start_pumps()
        chan.shutdown_write()
    except (paramiko.SSHException, OSError, EOFError) as e:
        chan.close()
        raise SSHError(f"cannot start a worker on {host.hostname}: {e}") from None
    worker._await_start(host.settings.connect_timeout)
    return worker


class RemoteWorker:
    """A worker process on a remote host; same methods as LocalWorker."""
    started = "ssh"  # "template" once its marker says a template forked it
    fallback = None  # why a spawn client launched plainly after all
    error = None     # why the worker counts as failed without exit status
    identity = None  # "PGID:START" on its host (procstat.identity there): the journal's
    template_gone = staticmethod(lambda: None)  # called when its spawn client says the template died

    def __init__(self, host: SSHHost, channel: paramiko.Channel, output: RankOutput, skipped_env):
        self.host = host
        self.hostname = host.hostname
        self.channel = channel
        self.output = output
        self.skipped_env = skipped_env  # names a shell cannot export: not forwarded
        self.pgid = None
        self._started = threading.Event()
        self._early_stderr = []
        self._pumps = []
        self._code = None
        self._template_died = False

    @property
    def pid(self) -> int:
        """The remote process group id (= pid of the worker's top process)."""
        return self.pgid

    # -- output --
    def _start_pumps(self):
        for stream, fileobj in (("stdout", self.channel.makefile("rb")),
                                ("stderr", self.channel.makefile_stderr("rb"))):
            t = threading.Thread(target=self._pump, args=(stream, fileobj), daemon=True,
                                 name=f"ssh-output-{self.output.label}-{stream}")
            t.start()
            self._pumps.append(t)

    def _pump(self, stream, fileobj):
        try:
            for raw in iter(fileobj.readline, b""):
                text = raw.decode("utf-8", "replace")
                if stream == "stdout" and text.rstrip("\n") == TEMPLATE_DIED:  # before or after its marker
                    self._template_died = True
                    self.template_gone()
                    continue
                if not self._started.is_set():
                    if stream == "stdout" and text.startswith(MARK + " "):
                        self._marked(text.split(None, 3)[1:])
                        self._started.set()
                        continue
                    if stream == "stderr":
                        self._early_stderr.append(text.rstrip("\n"))
                self.output.line(stream, text)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            if stream == "stdout":
                self._started.set()  # ended before the marker: launch reports it

    def _marked(self, words) -> None:
        """`PGID:START`, or from a spawn client `PGID:START template` / `PGID:START plain REASON`."""
        try:
            self.pgid, self.identity = marked(words[0])
        except (IndexError, ValueError):
            return
        if words[1:2] == ["template"]:
            self.started = "template"
        if words[1:2] == ["plain"]:
            self.fallback = words[2].strip() if len(words) > 2 else "no reason given"

    @property
    def template_died(self) -> bool:
        """It died because the template it was forked from did (not of anything it did): its
        spawn client's last line says so, read once the output ended."""
        if self.started == "template" and self._pumps:
            self._pumps[0].join(TEMPLATE_DIED_WAIT)
        return self._template_died

    def _await_start(self, timeout):
        if not self._started.wait(timeout):
            self.channel.close()
            raise SSHError(f"worker on {self.hostname} did not start within {timeout:g} s")
        if self.pgid is None and self._template_died:
            self.channel.close()
            raise TemplateGone(f"the worker template on {self.hostname} died before forking the worker")
        if self.pgid is None:
            code = self.wait(5.0)
            for t in self._pumps:
                t.join(1.0)
            why = "; ".join(self._early_stderr[-3:]) or self.error or f"exit code {code}"
            raise SSHError(f"worker on {self.hostname} failed to start: {why}")

    def finish_output(self, timeout: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        for pump in self._pumps:
            pump.join(max(0.0, deadline - time.monotonic()))

    # -- status --
    def poll(self):
        """Exit code, minus the signal number for a signal death, LOST (255) when the connection
        ended first, or None while running."""
        if self._code is not None:
            return self._code
        chan = self.channel
        if chan.exit_status != -1 and chan.status_event.is_set():
            self._code = chan.exit_status
        elif (code := _signal_code(chan)) is not None:
            self._code = code
        elif chan.closed:
            transport = chan.get_transport()
            cause = getattr(transport, "saved_exception", None) if transport else None
            if isinstance(cause, (socket.timeout, TimeoutError)) or getattr(cause, "errno", None) == 110:
                why = f"no answer for {self.host.settings.dead_after:g} s (network partition or host down)"
            elif cause is not None:
                why = str(cause) or type(cause).__name__
            else:
                why = "the server closed it"
            self.error = f"lost the SSH connection to {self.hostname}: {why}"
            self._code = LOST
        return self._code

    def wait(self, timeout: float):
        """Exit code (see poll), or None if still running after `timeout` seconds."""
        deadline = time.monotonic() + (timeout or 0)
        while (code := self.poll()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            # set on exit status, exit signal (our hook) or close: then poll() has the code
            self.channel.status_event.wait(left)
        return code

    def signal(self, sig) -> None:
        """Send `sig` to the remote process group (best effort, like LocalWorker)."""
        if self.pgid is not None:
            try:
                self.host.run(f"kill -s {signal.Signals(sig).name[3:]} -- -{int(self.pgid)} 2>/dev/null; exit 0")
            except SSHError:
                pass

    def stop(self, grace: float = 3.0) -> None:
        """TERM the remote process group, KILL it after `grace` seconds (or at once when the
        top process already exited, to end children it left behind)."""
        if self.pgid is not None:
            g = int(self.pgid)
            ticks = max(0, int(grace / 0.05))
            # `kill -s SIG -- -PGID`: the form dash, bash and /bin/kill all accept
            script = (f'kill -s TERM -- -{g} 2>/dev/null || exit 0; i=0; '
                      f'while [ $i -lt {ticks} ] && kill -s 0 -- -{g} 2>/dev/null; do sleep 0.05; i=$((i+1)); done; '
                      f'kill -s KILL -- -{g} 2>/dev/null; exit 0')
            try:
                self.host.run(script, timeout=grace + self.host.settings.connect_timeout)
            except SSHError as e:
                self.error = self.error or f"could not stop the worker on {self.hostname}: {e}"
        if self.wait(5.0) is None:
            self.channel.close()
            self.poll()
        self.finish_output()
