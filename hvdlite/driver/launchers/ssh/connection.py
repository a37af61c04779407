"""Remote workers over SSH (paramiko), with the same face as LocalWorker.

One SSHHost per remote host holds its connection(s); every slot of the host is one exec
channel on it. The remote command line carries no secret: the login shell runs a short
/bin/sh script that reads the worker's environment as `export K='v'` lines from the channel's
stdin (byte-counted, with an end marker), prints its own pid (sshd makes every session its own
process group, so that pid is the group of the whole worker tree) and start time (which tells
it from a later process of that pid: a take-over asks), changes to the working directory and
execs the worker with stdin from /dev/null:

    exec /bin/sh -c 'IFS= read -r n; eval "$(head -c "$n")"; [ end marker ] ...;
                     echo "__hvdlite_pgid__ $$:START"; cd -- CWD && exec WORKER </dev/null'

When the host runs a worker template (ssh/template.py), the command is its spawn client
(hvdlite.template.spawn) and the marker comes from the forked worker: its own group.

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
import hashlib
import logging
import os
import shlex
import signal
import socket
import threading
import time

import paramiko
from paramiko.common import MSG_CHANNEL_REQUEST

from hvdlite.driver.launchers.ssh.config import ACCEPT_FLAG, HostConfig, SSHError, SSHSettings, host_config

# paramiko logs refused channels and dead sockets at ERROR; without a handler Python's
# last-resort handler would print them into the job's output. Our SSHError/`error` say it.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


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
    name = name.split("@")[0]
    try:  # sshd names signals without "SIG"; no str.removeprefix: Python 3.8 runs this too
        return -int(signal.Signals["SIG" + (name[3:] if name.startswith("SIG") else name)])
    except KeyError:
        return -1  # a signal sshd could not name
