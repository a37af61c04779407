"""Remote workers over SSH (paramiko), with the same face as LocalWorker.

One SSHHost per remote host holds its connection(s); every slot of the host is one exec
channel on it. The remote command line carries no secret: the login shell runs a short
/bin/sh script that reads the worker's environment as `export K='v'` lines from the channel's
stdin (byte-counted, with an end marker), prints its own pid (sshd makes every session its own
process group, so that pid is the group of the whole worker tree), changes to the working
directory and execs the worker with stdin from /dev/null:

    exec /bin/sh -c 'IFS= read -r n; eval "$(head -c "$n")"; [ end marker ] ...;
                     echo "__hvdlite_pgid__ $$"; cd -- CWD && exec WORKER </dev/null'

stop() kills the group with `kill -s TERM -- -PGID`, then KILL once the grace period is over,
through a second exec on a live connection of the host: closing a channel kills nothing.

Partitions: paramiko alone hangs for the whole TCP retry time (~15 min) when a host vanishes.
Each connection uses its own socket with TCP_USER_TIMEOUT (unacknowledged data for
`dead_after` seconds ends it) and TCP keepalive, and the transport sends an SSH keepalive every
`keepalive_interval` seconds so there always is data in flight: a cut-off host ends the
connection, and every worker on it reports failure, ~4 s after the cut.

Exit codes as LocalWorker.poll(): the worker's exit status; minus the signal number when the
remote process died of a signal (read from the SSH exit-signal message); LOST (255, as ssh
prints) with `error` set when the connection ended before the worker's exit was reported.
"""
import base64
import getpass
import hashlib
import logging
import os
import re
import shlex
import signal
import socket
import threading
import time
from dataclasses import dataclass, field

import paramiko
from paramiko.common import MSG_CHANNEL_REQUEST

from hvdlite.driver.output import RankOutput

# paramiko logs refused channels and dead sockets at ERROR; without a handler Python's
# last-resort handler would print them into the job's output. Our SSHError/`error` say it.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

LOST = 255  # exit code of a worker whose connection ended before its exit status arrived
ACCEPT_FLAG = "--ssh-accept-unknown-hosts"
_PGID_MARK = "__hvdlite_pgid__"
_ENV_END = "__hvdlite_env_end"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Read-only in bash (when /bin/sh is bash): exporting them would end the remote shell.
_SHELL_READONLY = {"BASHOPTS", "BASH_VERSINFO", "EUID", "PPID", "SHELLOPTS", "UID"}


def _default_ssh_config():
    path = os.path.expanduser("~/.ssh/config")
    return path if os.path.isfile(path) else None


@dataclass
class SSHSettings:
    port: int = None                  # None: the ssh config's Port, else 22
    identity_file: str = None         # tried first, before the ssh config's IdentityFile
    accept_unknown_hosts: bool = False  # False: host key must be in known_hosts (RejectPolicy)
    ssh_config: str = field(default_factory=_default_ssh_config)  # None: no ssh config
    connect_timeout: float = 10.0     # TCP connect, banner, auth and channel opening, each
    dead_after: float = 3.0           # TCP_USER_TIMEOUT: unacknowledged data this long = dead
    keepalive_interval: float = 1.0   # SSH keepalive and TCP keepalive probe interval


class SSHError(Exception):
    """A connection or launch failure; str() is a one-line message for the user."""


# ---- host configuration ----------------------------------------------------------------
@dataclass
class HostConfig:
    name: str               # as the user wrote it (hostfile, discovery)
    address: str            # HostName from the ssh config, else the name
    port: int
    user: str
    identity_files: list    # existing private key files, in order
    known_hosts: list       # user then global known_hosts files
    accept_unknown: bool
    identities_only: bool

    @property
    def where(self) -> str:
        shown = self.name if self.address == self.name else f"{self.name} ({self.address})"
        return f"{self.user}@{shown} port {self.port}"


def _ssh_lookup(name: str, config_path) -> dict:
    if not config_path or not os.path.isfile(config_path):
        return {}
    try:
        return paramiko.SSHConfig.from_path(config_path).lookup(name)
    except Exception as e:
        raise SSHError(f"cannot read ssh config {config_path}: {e}") from None


def host_config(name: str, settings: SSHSettings) -> HostConfig:
    """What OpenSSH would use for `name`, from the settings and the ssh config."""
    opts = _ssh_lookup(name, settings.ssh_config)
    for unsupported in ("proxycommand", "proxyjump"):
        if opts.get(unsupported, "none").lower() != "none":
            raise SSHError(f"{name}: {unsupported} in {settings.ssh_config} is not supported by "
                           f"hvdlite; list a directly reachable host name")
    port = settings.port or int(opts.get("port", 22))
    identities = []
    if settings.identity_file:
        path = os.path.expanduser(settings.identity_file)
        if not os.path.isfile(path):
            raise SSHError(f"SSH identity file {settings.identity_file} does not exist")
        identities.append(path)
    for path in opts.get("identityfile", []):
        path = os.path.expanduser(path)
        if os.path.isfile(path) and path not in identities:
            identities.append(path)
    user_files = opts.get("userknownhostsfile", "~/.ssh/known_hosts ~/.ssh/known_hosts2")
    global_files = opts.get("globalknownhostsfile", "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2")
    known = [os.path.expanduser(p) for p in (user_files + " " + global_files).split()]
    strict = opts.get("stricthostkeychecking", "ask").lower()
    return HostConfig(
        name=name, address=opts.get("hostname", name), port=port,
        user=opts.get("user") or getpass.getuser(), identity_files=identities, known_hosts=known,
        accept_unknown=settings.accept_unknown_hosts or strict in ("no", "off", "accept-new"),
        identities_only=opts.get("identitiesonly", "no").lower() == "yes")


def _fingerprint(key) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return f"{key.get_name()} SHA256:{base64.b64encode(digest).decode().rstrip('=')}"


class _UnknownHostKey(paramiko.SSHException):
    pass


class _KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """RejectPolicy with a message that says what to do; or accept (in memory only)."""

    def __init__(self, accept: bool):
        self.accept = accept
        self.accepted = None  # fingerprint of a key accepted without known_hosts

    def missing_host_key(self, client, hostname, key):
        if not self.accept:
            raise _UnknownHostKey(hostname, _fingerprint(key))
        self.accepted = _fingerprint(key)
        client.get_host_keys().add(hostname, key.get_name(), key)


# ---- is_local ----------------------------------------------------------------------------
def _local_addresses() -> set:
    """IPv4 and IPv6 addresses of this machine's interfaces (in this network namespace)."""
    addresses = set()
    try:
        with open("/proc/net/fib_trie") as f:
            last = None
            for line in f:
                line = line.strip()
                if line.startswith("|--"):
                    last = line[3:].strip()
                elif line.startswith("/32 host LOCAL") and last:
                    addresses.add(last)
    except OSError:
        pass
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                raw = line.split()[0]
                addresses.add(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(raw)))
    except (OSError, ValueError):
        pass
    return addresses


def _is_loopback(address: str) -> bool:
    return address.startswith("127.") or address in ("::1", "::ffff:127.0.0.1")


def is_local(hostname: str, ssh_config="default") -> bool:
    """True when `hostname` is this machine, so its slots run as local processes without SSH:
    the name (or its HostName in the ssh config) resolves to a loopback address or to an
    address of one of this machine's interfaces. Unresolvable names are not local."""
    if ssh_config == "default":
        ssh_config = _default_ssh_config()
    try:
        name = _ssh_lookup(hostname, ssh_config).get("hostname", hostname)
    except SSHError:
        name = hostname
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(name, None)}
    except (socket.gaierror, UnicodeError):
        return False
    resolved = {a.split("%")[0] for a in resolved}
    if any(_is_loopback(a) for a in resolved):
        return True
    local = _local_addresses()
    return any(a in local or (a.startswith("::ffff:") and a[7:] in local) for a in resolved)


# ---- connections -------------------------------------------------------------------------
def _tcp_socket(config: HostConfig, settings: SSHSettings) -> socket.socket:
    try:
        infos = socket.getaddrinfo(config.address, config.port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        shown = config.name if config.address == config.name else f"{config.name} (HostName {config.address})"
        raise SSHError(f"cannot resolve SSH host {shown}: {e.strerror}") from None
    failure = None
    for family, kind, proto, _, sockaddr in infos:
        sock = socket.socket(family, kind, proto)
        sock.settimeout(settings.connect_timeout)
        try:
            sock.connect(sockaddr)
        except OSError as e:
            sock.close()
            failure = e
            continue
        interval = max(1, int(round(settings.keepalive_interval)))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for opt, value in (("TCP_KEEPIDLE", interval), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", 3),
                           ("TCP_USER_TIMEOUT", int(settings.dead_after * 1000))):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
        return sock
    where = f"{config.name}" + ("" if config.address == config.name else f" ({config.address})") \
        + f" port {config.port}"
    if isinstance(failure, ConnectionRefusedError):
        raise SSHError(f"SSH connection to {where} refused: no sshd listening there "
                       f"(wrong host or --ssh-port?)") from None
    if isinstance(failure, (socket.timeout, TimeoutError)):
        raise SSHError(f"SSH connection to {where} timed out after {settings.connect_timeout:g} s "
                       f"(host down or unreachable)") from None
    reason = failure.strerror if failure and failure.strerror else str(failure)
    raise SSHError(f"cannot connect to {where}: {reason}") from None


def _on_channel_request(chan, m):
    """paramiko ignores 'exit-signal': note the signal, then let paramiko handle the request."""
    try:
        pos = m.packet.tell()
        if m.get_text() == "exit-signal":
            m.get_boolean()
            chan.hvdlite_signal = m.get_text()
            chan.status_event.set()
        m.packet.seek(pos)
    except Exception:
        pass
    paramiko.Channel._handle_request(chan, m)


def _connect(config: HostConfig, settings: SSHSettings) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    for path in config.known_hosts:
        if os.path.isfile(path):
            try:
                client.load_system_host_keys(path)
            except (OSError, paramiko.SSHException):
                pass  # unreadable or malformed: as if absent
    policy = _KnownHostsPolicy(config.accept_unknown)
    client.set_missing_host_key_policy(policy)
    sock = _tcp_socket(config, settings)
    t = settings.connect_timeout
    try:
        client.connect(config.address, port=config.port, username=config.user, sock=sock,
                       key_filename=config.identity_files or None, timeout=t, banner_timeout=t,
                       auth_timeout=t, channel_timeout=t,
                       look_for_keys=not config.identities_only,
                       allow_agent=not config.identities_only)
    except _UnknownHostKey as e:
        client.close()
        known = ", ".join(p for p in config.known_hosts if os.path.isfile(p)) or "no known_hosts file"
        raise SSHError(f"host key of {config.name} ({e.args[0]}, {e.args[1]}) is not in known_hosts "
                       f"({known}): add it (ssh-keyscan) or pass {ACCEPT_FLAG}") from None
    except paramiko.BadHostKeyException as e:
        client.close()
        raise SSHError(f"host key of {config.name} ({_fingerprint(e.key)}) does not match known_hosts "
                       f"({_fingerprint(e.expected_key)}): host reinstalled or someone is "
                       f"intercepting; fix known_hosts") from None
    except paramiko.PasswordRequiredException as e:
        client.close()
        raise SSHError(f"SSH identity for {config.where} is passphrase-protected ({e}); "
                       f"load it into ssh-agent") from None
    except paramiko.AuthenticationException as e:
        client.close()
        keys = ", ".join(config.identity_files) or "default keys and ssh-agent"
        raise SSHError(f"SSH authentication failed for {config.where} (tried {keys}): {e}; "
                       f"check --ssh-identity-file or IdentityFile/User in the ssh config") from None
    except (socket.timeout, TimeoutError) as e:
        client.close()
        raise SSHError(f"SSH handshake with {config.where} timed out after "
                       f"{settings.connect_timeout:g} s ({e or 'no answer'})") from None
    except paramiko.SSHException as e:
        client.close()
        text = str(e)
        if "banner" in text:
            raise SSHError(f"{config.where} accepted the connection but did not answer as an SSH "
                           f"server within {settings.connect_timeout:g} s ({text})") from None
        raise SSHError(f"SSH connection to {config.where} failed: {text}") from None
    except OSError as e:
        client.close()
        raise SSHError(f"SSH connection to {config.where} failed: {e.strerror or e}") from None
    transport = client.get_transport()
    transport.set_keepalive(max(1, int(round(settings.keepalive_interval))))
    # per transport, not global: read exit-signal so a signal death has its number
    transport._channel_handler_table = {**transport._channel_handler_table,
                                        MSG_CHANNEL_REQUEST: _on_channel_request}
    client.hvdlite_accepted_key = policy.accepted
    return client


def _sh(script: str) -> str:
    """Run `script` with /bin/sh whatever the remote login shell is. One line, no `!`."""
    return "exec /bin/sh -c " + shlex.quote(script)


class SSHHost:
    """The SSH connection(s) to one host, shared by all its workers.

    Connects on first use (or `connect()`), reconnects when the connection died, opens one more
    connection when the server's MaxSessions refuses another channel on the existing ones.
    """

    failure_memory = 2.0  # seconds a failed connect is reported again without retrying

    def __init__(self, hostname: str, settings: SSHSettings = None):
        self.hostname = hostname
        self.settings = settings or SSHSettings()
        self.config = host_config(hostname, self.settings)
        self._clients = []
        self._lock = threading.Lock()
        self._closed = False
        self._last_failure = (0.0, None)  # (monotonic time, SSHError) of the last failed connect
        self.accepted_key = None          # fingerprint accepted without known_hosts, if any

    # -- connections --
    @property
    def connected(self) -> bool:
        return any(c.get_transport() is not None and c.get_transport().is_active() for c in self._clients)

    def connect(self) -> None:
        """Make sure one live connection exists; SSHError says why not."""
        with self._lock:
            self._live_clients(need=True)

    def _live_clients(self, need: bool, fresh: bool = False):
        """Live clients (lock held); with need, connect when there is none (or `fresh`)."""
        if self._closed:
            raise SSHError(f"SSH connection to {self.hostname} was closed")
        alive = []
        for c in self._clients:
            t = c.get_transport()
            if t is not None and t.is_active():
                alive.append(c)
            else:
                c.close()
        self._clients = alive
        if need and (fresh or not alive):
            when, error = self._last_failure
            # a host that just failed fails again at once, instead of once per slot
            if error is not None and time.monotonic() - when < self.failure_memory and not alive:
                raise SSHError(str(error))
            try:
                client = _connect(self.config, self.settings)
            except SSHError as e:
                self._last_failure = (time.monotonic(), e)
                raise
            self._last_failure = (0.0, None)
            self.accepted_key = self.accepted_key or client.hvdlite_accepted_key
            self._clients.append(client)
        return list(self._clients)

    def _open_channel(self) -> paramiko.Channel:
        with self._lock:
            clients = self._live_clients(need=True)
            for attempt in range(2):
                for c in reversed(clients):
                    try:
                        return c.get_transport().open_session(timeout=self.settings.connect_timeout)
                    except paramiko.ChannelException:
                        continue  # MaxSessions reached on that connection
                    except (paramiko.SSHException, OSError, EOFError):
                        continue  # connection died meanwhile
                if attempt == 0:
                    clients = self._live_clients(need=True, fresh=True)
        raise SSHError(f"{self.hostname} refused a new SSH session (sshd MaxSessions?)")

    def run(self, script: str, timeout: float = None):
        """Run a /bin/sh script on the host: (exit code, stdout, stderr); SSHError on failure."""
        timeout = self.settings.connect_timeout if timeout is None else timeout
        chan = self._open_channel()
        try:
            chan.settimeout(timeout)
            chan.exec_command(_sh(script))
            chan.shutdown_write()
            out = chan.makefile("rb").read()       # until EOF; socket.timeout after `timeout`
            err = chan.makefile_stderr("rb").read()
            if not chan.status_event.wait(timeout):
                raise socket.timeout()
            code = chan.exit_status if chan.exit_status != -1 else _signal_code(chan)
            return code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        except (socket.timeout, TimeoutError):
            raise SSHError(f"{self.hostname}: remote command timed out after {timeout:g} s") from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise SSHError(f"{self.hostname}: remote command failed: {e}") from None
        finally:
            chan.close()

    def launch(self, command, env: dict, cwd: str, output: RankOutput) -> "RemoteWorker":
        """Start `command` (argv) in `cwd` on the host with `env` exported; returns once the
        remote process runs (its process group is known)."""
        chan = self._open_channel()
        exports, skipped = [], []
        for name, value in env.items():
            if _NAME.match(name) and name not in _SHELL_READONLY:
                exports.append(f"export {name}={shlex.quote(str(value))}\n")
            else:
                skipped.append(name)
        payload = ("".join(exports) + f"{_ENV_END}=1\n").encode()
        script = (f'IFS= read -r __hvdlite_n || exit 97; eval "$(head -c "$__hvdlite_n")" || exit 97; '
                  f'[ "${_ENV_END}" = 1 ] || {{ echo "hvdlite: incomplete environment from the driver" >&2; exit 97; }}; '
                  f'unset __hvdlite_n {_ENV_END}; echo "{_PGID_MARK} $$"; '
                  f'cd -- {shlex.quote(cwd)} && exec {" ".join(shlex.quote(str(a)) for a in command)} </dev/null')
        worker = RemoteWorker(self, chan, output, skipped)
        try:
            chan.exec_command(_sh(script))
            worker._start_pumps()
            chan.sendall(f"{len(payload)}\n".encode() + payload)
            chan.shutdown_write()
        except (paramiko.SSHException, OSError, EOFError) as e:
            chan.close()
            raise SSHError(f"cannot start a worker on {self.hostname}: {e}") from None
        worker._await_start(self.settings.connect_timeout)
        return worker

    def close(self) -> None:
        """Close the connections. Remote workers keep running: stop() them first."""
        with self._lock:
            self._closed = True
            for c in self._clients:
                c.close()
            self._clients = []


def _signal_code(chan):
    name = getattr(chan, "hvdlite_signal", None)
    if name is None:
        return None
    try:
        return -int(signal.Signals["SIG" + name.split("@")[0].removeprefix("SIG")])
    except KeyError:
        return -1  # a signal sshd could not name


class RemoteWorker:
    """A worker process on a remote host; same methods as LocalWorker."""

    def __init__(self, host: SSHHost, channel: paramiko.Channel, output: RankOutput, skipped_env):
        self.host = host
        self.hostname = host.hostname
        self.channel = channel
        self.output = output
        self.skipped_env = skipped_env  # names a shell cannot export: not forwarded
        self.pgid = None
        self.error = None               # why the worker counts as failed without exit status
        self._started = threading.Event()
        self._early_stderr = []
        self._pumps = []
        self._code = None

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
                if not self._started.is_set():
                    if stream == "stdout" and text.startswith(_PGID_MARK + " "):
                        try:
                            self.pgid = int(text.split()[1])
                        except (IndexError, ValueError):
                            pass
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

    def _await_start(self, timeout):
        if not self._started.wait(timeout):
            self.channel.close()
            raise SSHError(f"worker on {self.hostname} did not start within {timeout:g} s")
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

    def signal_group(self, sig) -> None:
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
