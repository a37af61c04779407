"""Durable commits (`hvdlite run --checkpoint-dir DIR`): rank 0 writes the newest commit to
DIR in the background, and a worker resumes from DIR when it holds less (torch-free).

- Writing: commit() hands rank 0's writer the copy it has just saved (never copied again,
  never changed afterwards); a thread serialises it and writes it, at most every
  `--checkpoint-interval` seconds, the newest commit winning over ones not written yet.
- Resuming: a worker tells the driver the newest commit it holds in memory *or* can read
  from DIR, so the driver makes rank 0 the one with the newest of either; rank 0 reads DIR
  before syncing when DIR is newer than its memory. So a new job on the same DIR resumes,
  and so does a job whose every worker died while the driver lived on.
"""
import atexit
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Optional

from hvdlite.worker import checkpoints, env

EXIT_FLUSH = 20.0  # seconds a finishing worker waits to write its newest commit (exit grace: 30)
WRITER_NICE = 10
# What a write may take of one core and of the disk. 100 MB take ~13 ms of CPU (all in the
# kernel: O_DIRECT from the tensors' memory). The bytes cost more: measured in one process on
# this 2-core VM, writing 100 MB each 1.3 s slowed training steps 6%, the same writer with the
# write() calls left out 0.2%. So 100 MB take 2.5 s at 40 MB/s, and at interval 0 the newest
# checkpoint trails the newest commit by about that.
CPU_SHARE = 0.01
DISK_RATE = 40e6  # bytes per second


@dataclass(frozen=True)
class Config:
    directory: str
    interval: float  # seconds between the starts of two writes; 0: write every commit
    keep: int  # checkpoints kept


def config(environ=os.environ) -> Optional[Config]:
    directory = environ.get(env.CHECKPOINT_DIR)
    if not directory:
        return None
    return Config(directory, float(environ.get(env.CHECKPOINT_INTERVAL, "0")),
                  int(environ.get(env.CHECKPOINT_KEEP, "2")))


def wait_before_write(now: float, last_start: Optional[float], interval: float) -> float:
    """Seconds to wait before the next write may start."""
    return 0.0 if last_start is None else max(0.0, last_start + interval - now)


def pause(cpu: float, written: int, elapsed: float, share: float, rate: float) -> float:
    """Seconds to sleep so that a write that used `cpu` seconds of CPU and wrote `written`
    bytes in `elapsed` seconds stays within `share` of one core and `rate` bytes a second."""
    return max(0.0, cpu / share - elapsed, written / rate - elapsed)


class Pacer:
    """Holds a write to CPU_SHARE of a core and DISK_RATE. Training threads that fill every
    core wait for any one of them that is preempted (a parallel op ends with its slowest
    thread), so even a low-priority writer slows a step by about the CPU it takes, and the
    disk's transfers slow it as well; paced, it takes little. Once `hurry()`, it holds nothing."""

    def __init__(self, share: float, rate: float, hurry):
        self.share, self.rate, self.hurry, self.written = share, rate, hurry, 0
        self.cpu, self.start = time.thread_time(), time.monotonic()

    def __call__(self, written: int):
        self.written += written
        if not self.hurry():
            time.sleep(pause(time.thread_time() - self.cpu, self.written, time.monotonic() - self.start,
                             self.share, self.rate))


def _say(message):
    try:
        sys.stderr.write(f"hvdlite: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr is a pipe to a dead driver


class Writer:
    """A thread that writes the newest commit offered, at most every `interval` seconds."""

    def __init__(self, cfg: Config, clock=time.monotonic):
        self.cfg, self.clock = cfg, clock
        self._cond = threading.Condition()
        self._pending = None  # (commit, snapshot) not written yet
        self._busy = False
        self._last_start = None
        self._hurry = False  # a forced flush: the training is over, write at full speed
        self._errors = set()
        threading.Thread(target=self._run, daemon=True, name="hvdlite-checkpoint").start()

    def offer(self, commit: int, snapshot) -> None:
        with self._cond:
            self._pending = (commit, snapshot)
            self._cond.notify_all()

    def flush(self, timeout: float, forced=True) -> bool:
        """Write what is pending now, whatever the interval, and if `forced` unpaced; True if
        done within timeout."""
        deadline = self.clock() + timeout
        with self._cond:
            if forced:
                self._last_start, self._hurry = None, True
                self._cond.notify_all()
            while self._pending is not None or self._busy:
                left = deadline - self.clock()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _run(self):
        _low_priority()
        while True:
            with self._cond:
                while True:
                    wait = wait_before_write(self.clock(), self._last_start, self.cfg.interval)
                    if self._pending is not None and wait <= 0:
                        break
                    self._cond.wait(wait if self._pending is not None else None)
                (commit, snapshot), self._pending = self._pending, None
                self._busy, self._last_start = True, self.clock()
            try:
                checkpoints.write(self.cfg.directory, commit, snapshot, self.cfg.keep,
                                  Pacer(CPU_SHARE, DISK_RATE, lambda: self._hurry))
            except Exception as e:  # noqa: BLE001 - a full disk must not stop training
                why = f"{type(e).__name__}: {e}"
                if why not in self._errors:
                    self._errors.add(why)
                    _say(f"could not write checkpoint {commit} to {self.cfg.directory} ({why}); "
                         f"training goes on, later commits will be tried")
            finally:
                del snapshot
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


def _low_priority():
    """Nice 10 for the calling thread (Linux schedules threads alone): against busy training
    threads the writer gets about a tenth of a core, which its O_DIRECT writes need (~13 ms
    of CPU per 100 MB); at nice 19 it would starve and fall seconds behind."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
    except (AttributeError, OSError):
        pass  # not Linux, or not allowed: the writer runs at the worker's priority


_writer = None


def committed(state) -> None:
    """State.commit() calls this after saving: rank 0 hands its new commit to the writer."""
    global _writer
    cfg = config()
    if cfg is None or state.backend.info().rank != 0:
        return
    if _writer is None:
        _writer = Writer(cfg)
        # A finished job's last commit is on disk, so running the same command again ends at once.
        atexit.register(_writer.flush, EXIT_FLUSH)
    _writer.offer(*state._snapshot())


def available_commit() -> int:
    """The newest commit this worker could restore from disk (0: none, or no --checkpoint-dir)."""
    cfg = config()
    return checkpoints.newest_commit(cfg.directory) if cfg is not None else 0


def catch_up(state) -> None:
    """Before a sync: rank 0 loads the newest checkpoint when it is newer than its memory."""
    cfg = config()
    if cfg is None or state.backend.info().rank != 0:
        return
    if checkpoints.newest_commit(cfg.directory) <= state._commits:
        return
    found = checkpoints.load_newest(cfg.directory, warn=_say)
    if found is None or found[0] <= state._commits:
        return
    commit, path, snapshot = found
    state._load_snapshot(commit, snapshot)
    _say(f"resumed from commit {commit} ({path})")
