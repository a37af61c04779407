"""A worker's output outlives its driver (torch-free): once the pipes to a dead driver break,
stdout and stderr go on into 0600 files in --checkpoint-dir's driver folder
(beacon.output_path), which the next driver relays.

Python's writes to a broken pipe raise BrokenPipeError (SIGPIPE is ignored), which would end
the training script at its next print: sys.stdout and sys.stderr are wrapped so that such a
write moves both streams to the files and is made again there. The heartbeat thread moves them
too as soon as it finds the pipes broken (`check`), so that writes made outside Python (C
libraries writing to fd 2) are not lost either.
"""
import os
import select
import sys
import threading

from hvdlite.worker import beacon

_lock = threading.Lock()
_target = None  # (checkpoint dir, worker id) once installed
_moved = False


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
    """Point fds 1 and 2 at the files (once); Python's streams write on through them."""
    global _moved
    with _lock:
        if _moved or _target is None:
            return
        checkpoint_dir, worker = _target
        os.makedirs(os.path.join(beacon.folder(checkpoint_dir), beacon.OUTPUT), mode=0o700, exist_ok=True)
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            out = os.open(beacon.output_path(checkpoint_dir, worker, stream),
                          os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(out, fd)
            os.close(out)
        _moved = True
