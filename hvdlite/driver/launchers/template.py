"""The driver's side of worker templates: start one per interpreter (and Python startup
environment) on this host, fork workers from it, fall back to a plain launch otherwise.

    templates = Templates()
    handle = templates.spawn(command, env, cwd, output)   # LocalWorker's face either way

A worker's exit status comes from the template, which is its parent. If the template dies,
its workers die with it (parent-death signal) and report -9 with `template_died` set, which
the driver does not hold against them; the next spawn starts a new template.
"""
import itertools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from hvdlite import procstat
from hvdlite.driver.launchers.process import LocalWorker
from hvdlite.template import DEFAULT_PRELOAD, wire
from hvdlite.template.command import THREADS, Refused, interpreter, startup_env
from hvdlite.worker import env as worker_env

READY_TIMEOUT = 120.0  # seconds to preload; a loaded machine needs a multiple of the ~5 s
REPLY_TIMEOUT = 10.0  # seconds for a template to fork and answer a spawn


class Unavailable(Exception):
    """No template can serve this host and interpreter: launch plainly."""


class TemplateProcess:
    """A template's child with the face of subprocess.Popen that LocalWorker uses."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode = None
        self.template_died = False
        self._done = threading.Event()

    def exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._done.set()

    def orphaned(self) -> None:
        """The template is gone, and with it the child's exit status: a dead template's
        children got SIGKILL (parent-death signal). Say -9 once the child is gone."""
        self.template_died = True
        def watch():
            while procstat.state(self.pid) not in procstat.GONE:
                time.sleep(0.02)
            self.exited(-signal.SIGKILL)
        threading.Thread(target=watch, daemon=True, name=f"orphan-{self.pid}").start()

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"template child {self.pid}", timeout)
        return self.returncode


class TemplateWorker(LocalWorker):
    """A worker forked by a template: LocalWorker's stop, signals and output on its process."""
    started = "template"

    # Not LocalWorker.__init__: the process exists already; its output arrives on our pipes.
    def __init__(self, proc: TemplateProcess, output, stdout_fd: int, stderr_fd: int):
        self.output = output
        self.proc = proc
        self._pumps = [output.pump("stdout", os.fdopen(stdout_fd, "rb")),
                       output.pump("stderr", os.fdopen(stderr_fd, "rb"))]

    @property
    def template_died(self) -> bool:
        """It died because its template did (not of anything it did)."""
        return self.proc.template_died


class Outdated(Refused):
    """A kept template refused: a module it preloaded changed on disk."""


class Template:
    """One running template process (python -m hvdlite.template) and its control socket."""
    kept = False

    def __init__(self, python: str, env: dict, preload, started=None):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.errors = tempfile.TemporaryFile()
        command = [python, "-m", "hvdlite.template", "--preload", ",".join(preload),
                   "--control", str(theirs.fileno())]
        try:
            self.proc = subprocess.Popen(command, env=env, pass_fds=(theirs.fileno(),),
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=self.errors, start_new_session=True)
        except OSError as e:
            ours.close()
            raise Unavailable(f"cannot start {python}: {e.strerror}") from None
        finally:
            theirs.close()
        if started is not None:
            started(self.proc.pid)  # before its imports, which launches wait for
        self._connected(ours)
        self.ready = self._handshake()
        self._start_reading()

    def _connected(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = wire.Reader(sock)
        self.lock = threading.Lock()  # pending, children, dead
        self.send_lock = threading.Lock()
        self.ids = itertools.count()
        self.pending = {}  # spawn id -> [Event, reply header, TemplateProcess or None]
        self.children = {}  # spawn id -> TemplateProcess
        self.dead = False

    def _start_reading(self) -> None:
        threading.Thread(target=self._read, daemon=True, name=f"template-{self.pid}").start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _handshake(self) -> dict:
        self.sock.settimeout(READY_TIMEOUT)
        try:
            while True:
                for header, _, _ in self.reader.frames():
                    if header.get("op") == "ready":
                        self.sock.settimeout(None)
                        return header
                    self.close(kill=True)
                    raise Unavailable(header.get("reason", "template unusable"))
                if not self.reader.read_once():
                    break
        except socket.timeout:
            self.close(kill=True)
            raise Unavailable(f"preloading took over {READY_TIMEOUT:.0f} s") from None
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self.errors.seek(0)
        said = self.errors.read().decode("utf-8", "replace").strip().splitlines()
        self.close(kill=True)
        raise Unavailable(f"template exited: {said[-1] if said else 'no message'}")

    def _read(self) -> None:
        try:
            while self.reader.read_once():
                for header, _, _ in self.reader.frames():
                    self._dispatch(header)
        except OSError:
            pass
        with self.lock:
            self.dead = True
            for waiting in self.pending.values():
                waiting[0].set()
            orphans, self.children = list(self.children.values()), {}
        for child in orphans:
            child.orphaned()

    def _dispatch(self, header: dict) -> None:
        op, spawn_id = header.get("op"), header.get("id")
        with self.lock:
            if op == "started" and spawn_id in self.pending:
                self.children[spawn_id] = TemplateProcess(header["pid"])
                self.pending[spawn_id][2] = self.children[spawn_id]
            if op in ("started", "refused") and spawn_id in self.pending:
                self.pending[spawn_id][1] = header
                self.pending[spawn_id][0].set()
            child = self.children.pop(spawn_id, None) if op == "exit" else None
        if child is not None:
            child.exited(header["code"])

    def alive(self) -> bool:
        return not self.dead and self.proc.poll() is None

    def spawn(self, command, env: dict, cwd: str, output) -> TemplateWorker:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        waiting = [threading.Event(), None, None]
        with self.lock:
            spawn_id = next(self.ids)
            self.pending[spawn_id] = waiting
            dead = self.dead
        try:
            if dead:
                raise Unavailable("template died")
            with self.send_lock:
                wire.send(self.sock, {"op": "spawn", "id": spawn_id, "argv": list(command),
                                      "env": env, "cwd": cwd}, fds=(out_w, err_w))
        except (OSError, Unavailable) as e:
            with self.lock:
                self.pending.pop(spawn_id, None)
            for fd in (out_r, err_r):
                os.close(fd)
            raise e if isinstance(e, Unavailable) else Unavailable(f"template unreachable: {e}") from None
        finally:
            os.close(out_w)
            os.close(err_w)
        answered = waiting[0].wait(REPLY_TIMEOUT)
        with self.lock:
            self.pending.pop(spawn_id, None)
        if waiting[2] is not None:
            return TemplateWorker(waiting[2], output, out_r, err_r)
        for fd in (out_r, err_r):
            os.close(fd)
        if waiting[1] is not None:
            raise (Outdated if waiting[1].get("outdated") else Refused)(waiting[1].get("reason", "refused"))
        if not answered:  # a hung template: end it (its children die with it) and go plain
            self.close(kill=True)
        raise Unavailable("template died" if answered else f"no answer in {REPLY_TIMEOUT:.0f} s")

    def hang_up(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def close(self, kill: bool = False) -> None:
        """Without kill the template exits once its children have; with kill, they die too."""
        self.hang_up()
        if kill and self.proc.poll() is None:
            self.proc.kill()
        if kill:
            self.proc.wait(5)
        self.errors.close()


def template_env(env: dict) -> dict:
    """A worker's environment without what makes it that worker, the secret among it, and its
    thread count (each fork sets its own)."""
    return {k: v for k, v in env.items() if k not in worker_env.IDENTITY and k not in (worker_env.SECRET, THREADS)}


class SayOnce:
    """Prints each line once (to stderr unless `say` is given)."""

    def __init__(self, say=None):
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.said = set()
        self.lock = threading.Lock()

    def __call__(self, line: str) -> None:
        with self.lock:
            if line in self.said:
                return
            self.said.add(line)
        self.say(line)


class Templates:
    """This host's templates, one per interpreter and Python startup environment: started
    on first use, restarted if one died, given up (plain launches, said once) if one fails.
    With `keeper` (python, env, preload, say) -> Template, the template it gives (a kept one
    that outlives the job, launchers/kept.py) where it can, else the job's own."""

    def __init__(self, preload=DEFAULT_PRELOAD, say=None, keeper=None):
        self.preload = tuple(preload)
        self.keeper = keeper
        self._say_once = say if isinstance(say, SayOnce) else SayOnce(say)
        self.lock = threading.Lock()
        self.templates = {}
        self.failed = {}
        self.unkept = set()  # keys whose kept template cannot serve this job
        # The pid of the template importing its preload now (made under the lock, one at a
        # time): launches wait for it. Read without the lock, which its imports hold.
        self.preloading = None

    def _key(self, command, env: dict, cwd: str):
        python = interpreter(command, env, cwd)
        return python, (python, tuple(sorted(startup_env(env).items())))

    def template(self, command, env: dict, cwd: str) -> Template:
        python, key = self._key(command, env, cwd)
        with self.lock:
            if key in self.failed:
                raise Unavailable(self.failed[key])
            current = self.templates.get(key)
            if current is None or not current.alive():
                if current is not None:
                    current.close()
                if self.keeper is not None and key not in self.unkept:
                    try:
                        self.templates[key] = current = self.keeper(python, env, self.preload,
                                                                    self._say_once)
                        return current
                    except Unavailable as e:
                        self._unkeep(key, e)
                try:
                    self.templates[key] = current = Template(python, template_env(env), self.preload,
                                                             started=self._preloading)
                except Unavailable as e:
                    self.failed[key] = f"{python}: {e}"
                    raise Unavailable(self.failed[key]) from None
                finally:
                    self.preloading = None
            return current

    def _preloading(self, pid: int) -> None:
        self.preloading = pid

    def preloading_wait(self):
        """Seconds the template importing its preload now waited for a CPU; None when none is."""
        pid = self.preloading
        return procstat.run_wait(pid) if pid is not None else None

    def kept_serving(self, command, env: dict, cwd: str) -> bool:
        """A kept template serves `command` now (found, not started: see keep_behind)."""
        try:
            python, key = self._key(command, env, cwd)
        except Refused:  # no template runs it (`sh`): plain workers, as without --keep-warm
            return False
        with self.lock:
            current = self.templates.get(key)
            if current is not None and current.alive():
                return current.kept
            if key in self.unkept or key in self.failed:
                return False
            try:
                found = self.keeper.serving(python, env, self.preload)
            except Unavailable as e:
                self._unkeep(key, e)
                return False
            if found is not None:
                self.templates[key] = found
            return found is not None

    def keep_behind(self, command, env: dict, cwd: str) -> None:
        """Start the kept template for later jobs, not waiting for it, unless this job has it."""
        try:
            python, key = self._key(command, env, cwd)
        except Refused:
            return
        with self.lock:
            current = self.templates.get(key)
            if key in self.unkept or current is not None and current.kept and current.alive():
                return
        try:
            self.keeper.start_behind(python, env, self.preload, self._say_once)
        except Unavailable as e:
            self._say_once(f"hvdlite: not keeping a template ({e})")

    def _unkeep(self, key, reason) -> None:
        """This job does without the kept template (lock held)."""
        self.unkept.add(key)
        current = self.templates.get(key)
        if current is not None and current.kept:
            del self.templates[key]
            current.close()
        self._say_once(f"hvdlite: not using a kept template ({reason})")

    def warm(self, command, env: dict, cwd: str) -> None:
        """Start the template a spawn of `command` would use, if none runs yet."""
        try:
            self.template(command, env, cwd)
        except (Refused, Unavailable) as e:
            self._say_once(f"hvdlite: starting workers without a preloaded template ({e})")

    def spawn(self, command, env: dict, cwd: str, output):
        try:
            template = self.template(command, env, cwd)
            try:
                return template.spawn(command, env, cwd, output)
            except Outdated as e:
                with self.lock:
                    self._unkeep(self._key(command, env, cwd)[1], e)
            except Unavailable:
                if not template.kept:
                    raise
            # Once more: from the job's own template, or a new kept one if the kept one left
            # (idle) as this job connected.
            return self.template(command, env, cwd).spawn(command, env, cwd, output)
        except (Refused, Unavailable) as e:
            self._say_once(f"hvdlite: starting workers without a preloaded template ({e})")
        return LocalWorker(command, env, output, cwd=cwd)

    def close(self, kill: bool = False) -> None:
        with self.lock:
            for template in self.templates.values():
                template.close(kill)
            self.templates = {}
