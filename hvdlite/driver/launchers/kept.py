"""The driver's side of kept templates (hvdlite.template.kept): connect to the one that serves
this interpreter, preload list and startup environment, or start it, detached, so that it
outlives this job.

One lock file per socket path keeps two drivers from starting two templates on one path; a
socket file that refuses connections is stale (its template died) and is replaced.
"""
import fcntl
import os
import select
import signal
import socket
import struct
import subprocess
import time

from hvdlite.driver.launchers.template import READY_TIMEOUT, Template, Unavailable, template_env
from hvdlite.template import kept, wire
from hvdlite.template.command import startup_env

_CREDENTIALS = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


class KeptTemplate(Template):
    """A connection to a kept template. Closing it ends what this job spawned there (the
    template kills a hung-up client's workers); the template stays for the next job."""
    kept = True

    def __init__(self, sock: socket.socket, pid: int, path: str):
        self._pid, self.path = pid, path
        self._connected(sock)
        self._start_reading()

    @property
    def pid(self) -> int:
        return self._pid

    def alive(self) -> bool:
        return not self.dead

    def close(self, kill: bool = False) -> None:
        self.hang_up()
        if kill:  # hung: it is ours (checked at connect), and the next job starts a new one
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def connect(path: str, uid: int):
    """A KeptTemplate on `path`, or None when nobody listens there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        pid, peer, _ = _CREDENTIALS.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size))
    except OSError:
        sock.close()
        return None
    if peer != uid:
        sock.close()
        raise Unavailable(f"{path} is served by uid {peer}, not {uid}")
    return KeptTemplate(sock, pid, path)


def _locked(lock_path: str, timeout: float):
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise Unavailable(f"{lock_path} stayed locked for {timeout:.0f} s") from None
            time.sleep(0.05)


def _popen(python, env, preload, idle, path, log_path, stdout, lock=None):
    """A kept template in its own session, its output in `log_path`. With `lock` (the start
    lock's fd) it holds the lock until it listens, so no other driver starts a second one."""
    command = [python, "-m", "hvdlite.template", "--preload", ",".join(preload),
               "--keep", path, "--idle", repr(idle)] + (["--lock-fd", str(lock)] if lock is not None else [])
    with open(os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600), "ab") as log:
        try:
            return subprocess.Popen(command, env=template_env(env), stdin=subprocess.DEVNULL,
                                    stdout=stdout, stderr=log, start_new_session=True,
                                    pass_fds=() if lock is None else (lock,))
        except OSError as e:
            raise Unavailable(f"cannot start {python}: {e.strerror}") from None


def _start(python: str, env: dict, preload, idle: float, path: str, log_path: str) -> dict:
    """Start a kept template and wait for its `ready`."""
    proc = _popen(python, env, preload, idle, path, log_path, subprocess.PIPE)
    reader, deadline = wire.Reader(), time.monotonic() + READY_TIMEOUT
    try:
        while time.monotonic() < deadline:
            for header, _, _ in reader.frames():
                if header.get("op") != "ready":
                    raise Unavailable(header.get("reason", "template unusable"))
                return header
            if select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0] and \
                    not reader.feed(os.read(proc.stdout.fileno(), 65536)):
                raise Unavailable(f"the kept template exited (see {log_path})")
        proc.kill()
        raise Unavailable(f"preloading took over {READY_TIMEOUT:.0f} s")
    finally:
        proc.stdout.close()


def _where(python: str, env: dict, preload):
    """(uid, folder, identity, socket path) of the kept template that would serve."""
    uid = os.getuid()
    folder = kept.runtime_dir(env, uid)
    problem = kept.private_dir(folder, uid)
    if problem:
        raise Unavailable(problem)
    ident = kept.identity(python, preload, startup_env(env))
    return uid, folder, ident, kept.socket_path(folder, ident)


def serving(python: str, env: dict, preload):
    """The kept template that serves now, or None; never starts one, but waits for one that
    is starting (it holds the start lock until it listens): it is further on than an import."""
    uid, folder, ident, path = _where(python, env, preload)
    found = connect(path, uid)
    if found is None:
        os.close(_locked(os.path.join(folder, f"warm-{ident}.lock"), READY_TIMEOUT + 10))
        found = connect(path, uid)
    return found


def start_behind(python: str, env: dict, preload, say, idle: float) -> None:
    """Start the kept template for later jobs without waiting for it (a job that ran without
    it ends): unless one serves, or another driver is starting one."""
    uid, folder, ident, path = _where(python, env, preload)
    try:
        lock = _locked(os.path.join(folder, f"warm-{ident}.lock"), 0)
    except Unavailable:
        return  # another driver is starting it
    try:
        found = connect(path, uid)
        if found is not None:
            found.close()
            return
        try:
            os.unlink(path)  # stale: its template is gone
        except FileNotFoundError:
            pass
        log_path = os.path.join(folder, f"warm-{ident}.log")
        proc = _popen(python, env, preload, idle, path, log_path, subprocess.DEVNULL, lock)
        say(f"hvdlite: kept template {proc.pid} starting for later --keep-warm jobs; it serves "
            f"until {idle:g} s idle (`kill {proc.pid}` ends it; log {log_path})")
    finally:
        os.close(lock)


def obtain(python: str, env: dict, preload, say, idle: float):
    """The kept template for this interpreter, preload list and startup environment, started
    (and said with `say`) if none serves yet. Unavailable with one line why not."""
    uid, folder, ident, path = _where(python, env, preload)
    found = connect(path, uid)
    if found is not None:
        return found
    lock = _locked(os.path.join(folder, f"warm-{ident}.lock"), READY_TIMEOUT + 10)
    try:
        found = connect(path, uid)  # another driver started it while we waited
        if found is not None:
            return found
        try:
            os.unlink(path)  # stale: its template is gone
        except FileNotFoundError:
            pass
        log_path = os.path.join(folder, f"warm-{ident}.log")
        ready = _start(python, env, preload, idle, path, log_path)
        found = connect(path, uid)
        if found is None:
            raise Unavailable(f"the kept template does not listen on {path}")
        say(f"hvdlite: kept template {ready['pid']} started; it serves later --keep-warm jobs "
            f"until {idle:g} s idle (`kill {ready['pid']}` ends it; log {log_path})")
        return found
    finally:
        os.close(lock)


class Keeper:
    """Kept templates for Templates, with the job's --keep-warm seconds: called, the template
    (started and waited for if none serves); `serving` and `start_behind` as above."""

    def __init__(self, idle: float):
        self.idle = idle

    def __call__(self, python, env, preload, say):
        return obtain(python, env, preload, say, self.idle)

    @staticmethod
    def serving(python, env, preload):
        return serving(python, env, preload)

    def start_behind(self, python, env, preload, say) -> None:
        start_behind(python, env, preload, say, self.idle)
