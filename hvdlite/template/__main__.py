"""`python -m hvdlite.template --preload torch,torch.optim --control FD`
   `python -m hvdlite.template --preload torch,torch.optim --listen`
   `python -m hvdlite.template --preload torch,torch.optim --keep PATH --idle SECONDS`

Preloads the modules, says `ready` (or `unusable`), then forks workers on request. With
--control the driver's connected unix socket carries both. With --listen (a remote host,
started over SSH) the frames go to stdout and spawn clients connect to a unix socket in a new
directory only this user can enter; stdin is the driver's lifeline (see server.py). With
--keep (a kept template, kept.py; its starter holds the path's lock and reads the frames on
stdout) the socket is PATH and the lifeline an idle timer. In a forked child this returns into
the worker's own code.
"""
import argparse
import os
import shutil
import signal
import socket
import sys
import tempfile

from hvdlite import exitcodes
from hvdlite.template import child, server, wire
from hvdlite.worker import env


def _listen():
    """A listening socket in a fresh 0700 directory: only this user can connect."""
    folder = tempfile.mkdtemp(prefix="hvdlite-template-")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(folder, "socket"))
    listener.listen(64)
    return folder, listener


def _default_stop_signals() -> None:
    """A kept template may start as its job closes, and outlives it: neither it (`kill PID`)
    nor the workers it forks for later jobs (the driver's SIGTERM, Ctrl-C) may keep them
    ignored. SIGINT as Python sets it up where it starts with the default."""
    for sig in exitcodes.STOP_SIGNALS:
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)


class KeptSocket:
    """A listening socket at `path`, removed when the kept template stops serving, unless
    another one bound there since."""

    def __init__(self, path: str):
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.inode = os.stat(path).st_ino

    def remove(self) -> None:
        try:
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        except OSError:
            pass


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hvdlite.template")
    p.add_argument("--preload", default="", help="comma-separated modules to import first")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--control", type=int,
                     help="file descriptor of a connected unix socket to the driver")
    how.add_argument("--listen", action="store_true",
                     help="serve spawn clients on a unix socket; frames on stdout, stdin the lifeline")
    how.add_argument("--keep", metavar="PATH",
                     help="kept template: serve spawn clients on PATH until --idle seconds without any")
    p.add_argument("--idle", type=float, default=60.0, help="seconds a kept template waits idle")
    p.add_argument("--lock-fd", type=int, help="kept template: the start lock, held until it listens")
    args = p.parse_args(argv)
    child.prepare_title()
    if args.keep:
        _default_stop_signals()
    if args.listen or args.keep:
        frames = os.dup(1)
        os.dup2(2, 1)  # what preloaded modules print must not end up among the frames
        say = lambda header: wire.write(frames, header)  # noqa: E731
    else:
        try:
            control = socket.socket(fileno=args.control)
        except OSError as e:
            print(f"hvdlite.template: --control {args.control}: {e.strerror}", file=sys.stderr)
            return 2
        say = lambda header: wire.send(control, header)  # noqa: E731
    if os.environ.get(env.CLAIM):  # a launch's one-time claim: its worker's, never a template's
        say({"op": "unusable", "reason": f"the template's environment holds a launch's {env.CLAIM}"})
        return 1
    modules = [m for m in args.preload.split(",") if m]
    started_env = dict(os.environ)
    os.environ[env.TEMPLATE] = "1"  # a forked worker gets its own environment (child.become_worker)
    try:
        loaded, skipped = server.preload(modules)
        reason = server.fork_safe()
    except Exception as e:  # a module that fails to import: the driver launches plainly
        loaded, skipped, reason = [], [], f"preloading failed: {type(e).__name__}: {e}"
    if reason:
        say({"op": "unusable", "reason": reason})
        return 1
    ready = {"op": "ready", "pid": os.getpid(), "python": sys.executable,
             "preloaded": loaded, "skipped": skipped}
    if args.keep:
        try:
            kept = KeptSocket(args.keep)
        except OSError as e:  # a path too long has no strerror, only its message
            say({"op": "unusable", "reason": f"cannot listen on {args.keep}: {e.strerror or e}"})
            return 1
        if args.lock_fd is not None:
            os.close(args.lock_fd)  # listening: a driver waiting for the lock connects now
        say(dict(ready, socket=args.keep))
        os.close(frames)
        os.chdir("/")  # it outlives the job that started it: hold on to none of its directories
        print(f"hvdlite: kept template {os.getpid()} serves {args.keep} until {args.idle:g} s idle",
              file=sys.stderr, flush=True)
        job = server.Template(listener=kept.listener, idle=args.idle, on_stop=kept.remove,
                              started_env=started_env).serve()
        if os.getpid() == ready["pid"]:
            kept.remove()
            print(f"hvdlite: kept template {os.getpid()} exits", file=sys.stderr, flush=True)
    elif not args.listen:
        say(ready)
        job = server.Template(control=control, started_env=started_env).serve()
    else:
        folder, listener = _listen()
        try:
            try:
                say(dict(ready, socket=listener.getsockname()))
            except OSError:  # the driver closed the channel while we preloaded
                return 0
            os.close(frames)
            job = server.Template(listener=listener, lifeline=0, started_env=started_env).serve()
        finally:
            if os.getpid() == ready["pid"]:  # the template, not a forked child
                shutil.rmtree(folder, ignore_errors=True)
    if job is not None:
        job.run()  # the worker: its exceptions and exit code are the process's own
    return 0


if __name__ == "__main__":
    code = main()
    if code:
        sys.exit(code)
