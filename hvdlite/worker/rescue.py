"""A worker's output outlives its driver (torch-free): once the pipes to a dead driver break,
or the worker goes over to a new driver (session.py: the old one may be stopped, not dead),
stdout and stderr go on into 0600 files in --checkpoint-dir's driver folder
(beacon.output_path), which the next driver relays.

A stopped driver keeps its end of the pipes open and unread: once one is full (64 KB), a write
blocks in write(2), where moving fd 1 cannot reach it. So the move opens a read end of its own
on each pipe (/proc/self/fd/N) and copies what the pipe holds, and whatever a write already
under way or a child process that inherited the pipe puts in it later, into the file: the write
completes and nothing is lost.

Python's writes to a broken pipe raise BrokenPipeError (SIGPIPE is ignored), which would end
the training script at its next print: sys.stdout and sys.stderr are wrapped so that such a
write moves both streams to the files and is made again there. The heartbeat thread moves them
too as soon as it finds the pipes broken (`check`), so that writes made outside Python (C
libraries writing to fd 2) are not lost either.
"""
import atexit
import os
import select
import stat
import sys
import threading

from hvdlite.worker import beacon

_lock = threading.Lock()
_target = None  # (checkpoint dir, worker id) once installed
_moved = False
_relays = []  # (fd, a copy of its file, the thread relaying into it) once moved


class _Guarded:
    """A text stream whose writes survive the pipe under it breaking."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            move()
            return self._stream.write(text)

    def flush(self):
        try:
            return self._stream.flush()
        except BrokenPipeError:
            move()
            return self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def install(checkpoint_dir: str, worker: str) -> None:
    global _target
    if _target is not None:
        return
    _target = (checkpoint_dir, worker)
    sys.stdout, sys.stderr = _Guarded(sys.stdout), _Guarded(sys.stderr)


def broken() -> bool:
    """Whether stdout's or stderr's pipe lost its reader (the driver)."""
    poller = select.poll()
    for fd in (1, 2):
        poller.register(fd, 0)  # POLLERR is reported whatever the mask
    try:
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except OSError:
        return False


def check() -> None:
    if _target is not None and not _moved and broken():
        move()


def move() -> None:
    """Point fds 1 and 2 at the files (once); Python's streams write on through them. Where
    fd 1 or 2 was a pipe, it becomes a new pipe of this process's, relayed into the file with
    what the old one holds or still gets (_relay)."""
    global _moved
    with _lock:
        if _moved or _target is None:
            return
        checkpoint_dir, worker = _target
        os.makedirs(os.path.join(beacon.folder(checkpoint_dir), beacon.OUTPUT), mode=0o700, exist_ok=True)
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            out = os.open(beacon.output_path(checkpoint_dir, worker, stream),
                          os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            old = _reader(fd)
            if old is None:
                os.dup2(out, fd)
                os.close(out)
                continue
            new, writes = os.pipe()
            os.dup2(writes, fd)
            os.close(writes)
            relay = threading.Thread(target=_relay, args=(old, new, out), daemon=True, name=f"hvdlite-rescue-{stream}")
            relay.start()
            _relays.append((fd, os.dup(out), relay))
        if _relays:
            atexit.register(finish)
        _moved = True


def finish(timeout: float = 2.0) -> None:
    """As the worker exits: what its relays still hold reaches the files (a daemon thread
    would die with the lines that the last prints put in its pipe); the files take the rest."""
    if not _relays:
        return  # nothing relayed; and a print blocked on a stopped driver's pipe holds the streams' locks
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    while _relays:
        fd, out, relay = _relays.pop()
        os.dup2(out, fd)  # this process's end of the relay's pipe closes: it reads to the end
        os.close(out)
        relay.join(timeout)


def _reader(fd: int):
    """A read end of the pipe under `fd` (non-blocking), or None when it is no pipe."""
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        pass
    return None


def _relay(old: int, new: int, out: int) -> None:
    """Into the file, until no process writes to either pipe: what the old pipe holds or gets
    (a write under way as the fd moved, a child's that inherited it) and what comes through
    the new one. The old one is read out before each read of the new one: a writer's next
    write follows the one it made to the old pipe."""
    os.set_blocking(new, False)
    poller = select.poll()
    for fd in (old, new):
        poller.register(fd, select.POLLIN)
    pipes = {old, new}
    try:
        while new in pipes:
            poller.poll()
            for fd in (old, new):  # in this order
                if fd in pipes and not _copy(fd, out):
                    pipes.discard(fd)
                    poller.unregister(fd)
    except OSError:
        pass
    for fd in (old, new, out):
        os.close(fd)


def _copy(pipe: int, out: int) -> bool:
    """What the pipe holds now, into the file; False once no process can write to it."""
    try:
        while True:
            chunk = os.read(pipe, 65536)
            if not chunk:
                return False
            while chunk:
                chunk = chunk[os.write(out, chunk):]
    except BlockingIOError:
        return True
