"""Durable commits (`hvdlite run --checkpoint-dir DIR`): rank 0 writes the newest commit to
DIR in the background, and a worker resumes from DIR when it holds less (torch-free).

- Writing: commit() hands rank 0's writer the copy it has just saved (never copied again,
  never changed afterwards); a thread serialises it and writes it, at most every
  `--checkpoint-interval` seconds, the newest commit winning over ones not written yet.
- Resuming: a worker tells the driver the newest commit it holds in memory *or* can load
  from DIR (of the lineage it resumes: checkpointdir.py), so the driver makes the world's root
  (the rank every rank syncs from) the one with the newest of either. A checkpoint counts only once it has loaded in full, every byte
  checked and nothing untrusted called; before the first sync every worker holding less puts
  it into its state. So a new job on the same DIR resumes, and so does a job whose every
  worker died while the driver lived on.
- A checkpoint that exists but does not load (damaged, a class or shape the script no longer
  has) ends the worker with exit code exitcodes.UNLOADABLE, after telling the driver, which
  ends the job with one line naming the file and the cause; never a fresh start over it.
  `--fresh` starts a new lineage on purpose.
- A write that fails (a class not passed to hvd.elastic.trust(), a full disk, a folder not
  writable) ends the job at that commit with one line naming the commit, the folder and the
  cause (exit 1): never training on without the checkpoints the user counts on.
- The writer's newest commit reaches the disk before the worker exits, within EXIT_FLUSH, even
  when it exits because the driver is gone. When no driver came back within --driver-grace,
  every worker writes the newest commit it holds as it exits, whatever its rank (rank 0 may
  have died in the gap), unless the folder holds it already: the first one writes it, the
  others find it there (finish, leaves_held). Writers take turns under a lock in the driver
  folder. A snapshot holds rank 0's parts whichever rank takes it (State._snapshot), so any
  worker writes what rank 0 would have written.
"""
import atexit
import fcntl
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

from hvdlite import exitcodes
from hvdlite.printable import printable
from hvdlite.worker import beacon, checkpointdir, env, stopping

EXIT_FLUSH = 20.0  # seconds a finishing worker waits to write its newest commit (exit grace: 30)
LOCK = "commits.lock"  # in the driver folder (beacon.folder): writers of commits take turns on it
REPORT_TIMEOUT = 5.0  # seconds to tell the driver a checkpoint does not load or was not written
WRITER_NICE = 10
# What a write may take of one core and of the disk. 100 MB take ~13 ms of CPU to write (all
# in the kernel: O_DIRECT from the tensors' memory) and ~26 ms to checksum. The bytes cost
# more: measured in one process on this 2-core VM, writing 100 MB each 1.3 s slowed training
# steps 6%, the same writer with the write() calls left out 0.2%. So 100 MB take 2.5 s at
# 40 MB/s (2 s of it for the CPU share), and at interval 0 the newest checkpoint trails the
# newest commit by about that.
CPU_SHARE = 0.02
DISK_RATE = 40e6  # bytes per second


@dataclass(frozen=True)
class Config:
    directory: str
    interval: float  # seconds between the starts of two writes; 0: write every commit
    keep: int  # checkpoints kept
    lineage: Optional[str] = None  # --fresh: the lineage this job starts; None: resume the newest


def config(environ=os.environ) -> Optional[Config]:
    directory = environ.get(env.CHECKPOINT_DIR)
    if not directory:
        return None
    return Config(directory, float(environ.get(env.CHECKPOINT_INTERVAL, "0")),
                  int(environ.get(env.CHECKPOINT_KEEP, "2")), environ.get(env.CHECKPOINT_LINEAGE) or None)


def lineage() -> str:
    """The lineage of a state that starts from nothing: --fresh's, or a new one."""
    cfg = config()
    return cfg.lineage if cfg is not None and cfg.lineage else checkpointdir.new_lineage()


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

    def __init__(self, cfg: Config, clock=time.monotonic, fence=None):
        self.cfg, self.clock = cfg, clock
        # A worker's last write as it exits with no driver (finish): () -> (the epoch the beacon
        # names, the one this worker accepted); it writes only into its driver generation's folder.
        self.fence = fence
        self._cond = threading.Condition()
        self._pending = None  # (lineage, commit, snapshot) not written yet
        self._busy = False
        self._last_start = None
        self._hurry = False  # a forced flush: the training is over, write at full speed
        self._closed = False  # a last flush, or a write failed: later commits are not written
        threading.Thread(target=self._run, daemon=True, name="hvdlite-checkpoint").start()

    def offer(self, lineage: str, commit: int, snapshot) -> None:
        with self._cond:
            if not self._closed:
                self._pending = (lineage, commit, snapshot)
                self._cond.notify_all()

    def flush(self, timeout: float, forced=True, last=False) -> bool:
        """Write what is pending now, whatever the interval, and if `forced` unpaced; if
        `last`, nothing offered later; True if done within timeout."""
        deadline = self.clock() + timeout
        with self._cond:
            self._closed = self._closed or last
            if forced:
                self._last_start, self._hurry = None, True
                self._cond.notify_all()
            while self._pending is not None or self._busy:
                left = deadline - self.clock()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _failed(self, commit: int, error: BaseException) -> None:
        """A write failed: the job ends at this commit rather than train on while the user counts
        on checkpoints that are not there (a class not trusted fails every write the same way;
        a full disk or a folder not writable any more is as silent). The files on disk stay.
        The driver ends the job with this one line; when it cannot be told, it is said here."""
        with self._cond:
            self._closed, self._pending = True, None
        reason = f"could not write checkpoint {commit} to {self.cfg.directory}: {_cause(error)}"
        if not _told_driver("write_failed", reason):
            _say(reason)

    def _run(self):
        _low_priority()
        while True:
            with self._cond:
                while True:
                    wait = wait_before_write(self.clock(), self._last_start, self.cfg.interval)
                    if self._pending is not None and wait <= 0:
                        break
                    self._cond.wait(wait if self._pending is not None else None)
                (lineage, commit, snapshot), self._pending = self._pending, None
                self._busy, self._last_start = True, self.clock()
            try:
                if self._write(lineage, commit, snapshot):
                    # Before a flush returns: the driver names only commits it heard reached the disk.
                    _told_driver("written", commit=str(commit))
            except Exception as e:  # noqa: BLE001 - whatever the reason: said, then the job ends
                self._failed(commit, e)
            finally:
                del snapshot
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, lineage, commit, snapshot) -> bool:
        """Write `commit` unless the folder holds it or a newer one of its lineage already (another
        worker wrote it as it exited); whether the folder holds it now."""
        with _locked(self.cfg.directory):
            newest = checkpointdir.newest(self.cfg.directory, lineage)
            on_disk = newest[0] if newest is not None else 0
            if self.fence is not None and not leaves_held(commit, on_disk, *self.fence()):
                return False
            if commit > on_disk:
                checkpointdir.write(self.cfg.directory, lineage, commit, snapshot, self.cfg.keep,
                                    Pacer(CPU_SHARE, DISK_RATE, lambda: self._hurry))
            return True


def leaves_held(held: int, on_disk: int, published: Optional[int], accepted: int) -> bool:
    """Whether a worker exiting with no driver writes the commit it holds (`held`): only where the
    beacon names the driver generation it accepted (`published`; None where its host sees no
    beacon of the job: the folder is another host's, never to be made here; a greater epoch: a
    newer driver owns the folder now), and only when the folder's newest (`on_disk`) is older."""
    return published == accepted and held > on_disk


@contextmanager
def _locked(directory: str):
    """Hold the job's lock on writing commits into `directory`. It lives in the driver folder,
    which only this user may enter (in a folder others can write, one could hold it for good);
    where this host sees no driver folder, no other worker writes here, and none is taken. On a
    filesystem without flock the writes stay atomic, only not one at a time."""
    try:
        fd = os.open(os.path.join(beacon.folder(directory), LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:  # no driver folder here (the write itself says what is wrong with the folder)
        fd = None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # held by a write at most: the others' flushes are bounded
            except OSError:
                pass
        yield
    finally:
        if fd is not None:
            try:  # closing alone does not free it while a child forked meanwhile (a loader's) holds a copy
                fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                pass
            os.close(fd)


def _low_priority():
    """Nice 10 for the calling thread (Linux schedules threads alone): against busy training
    threads the writer gets about a tenth of a core, which its O_DIRECT writes need (~13 ms
    of CPU per 100 MB); at nice 19 it would starve and fall seconds behind."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
    except (AttributeError, OSError):
        pass  # not Linux, or not allowed: the writer runs at the worker's priority


_writer = None
_found = None  # (commit, lineage, path, state) of the checkpoint verified last, until used
_tell = None  # the session's tell (install)
_holding = False  # this worker may have to write what it holds: it trains on between drivers (install)
_held = None  # (lineage, commit, snapshot) of the newest commit it holds, when _holding (saving)
_finishing = threading.Lock()  # finish: the heartbeat thread's, and the exit hooks


def committed(state) -> None:
    """State.commit() calls this after saving: rank 0 hands its new commit to the writer."""
    global _writer
    cfg = config()
    if cfg is None or state.backend.info().rank != 0:
        return
    if _writer is None:
        _writer = Writer(cfg)
        # A finished job's last commit is on disk, so running the same command again ends at once.
        atexit.register(finish)
    _writer.offer(state._lineage, *state._snapshot())


def flush() -> None:
    """A leaver's newest commit reaches the disk (rank 0's, within EXIT_FLUSH) before it
    says it leaves: the driver then lets it go at once."""
    if _writer is not None:
        _writer.flush(EXIT_FLUSH)


@contextmanager
def saving(state):
    """Around what replaces a state's saved copies (a commit's save, a sync): the newest commit
    this worker holds is the state's afterwards, and let go meanwhile (held through it, a commit
    would cost a second copy of the state)."""
    global _held
    if not _holding:
        yield
        return
    _held = None
    try:
        yield
    finally:  # after a sync that failed too: its saved copies are as they were
        _held = (state._lineage, *state._snapshot())


def finish(fence=None) -> None:
    """Before this process exits (at exit, or because the driver is gone): the newest commit
    offered reaches the disk, within EXIT_FLUSH seconds; later commits are not written.
    With `fence` (no driver came back within --driver-grace; Writer.fence), then the newest
    commit this worker holds too, whatever its rank, where leaves_held says, within the same
    EXIT_FLUSH. One at a time: the exit hooks of a main thread that ends meanwhile wait for the
    heartbeat thread's last writes before they end the process."""
    global _tell
    stopping.on_exit()
    with _finishing:
        if fence is not None:
            # No driver is there to hear of these writes: each word would wait its REPORT_TIMEOUT
            # while the main thread trains on past the grace.
            _tell = None
        deadline = time.monotonic() + EXIT_FLUSH
        if _writer is not None:
            _writer.flush(EXIT_FLUSH, last=True)
        held = _held
        if fence is not None and held is not None:
            last = Writer(config(), fence=fence)
            last.offer(*held)
            last.flush(max(0.0, deadline - time.monotonic()), last=True)


def reportable(commit: int) -> int:
    """The commit to tell the driver this worker holds: `commit` (in memory), or the newest
    checkpoint's when that is newer and loads (in full: checked, then kept for catch_up)."""
    found = _verified(commit)
    return found[0] if found is not None else commit


def catch_up(state) -> None:
    """Before a sync: a worker holding less than the newest checkpoint puts it into its state,
    so the state that the root syncs is one that was loaded, and a checkpoint that does not fit
    the script ends every worker here, before any of them waits in a collective. The one
    loaded for the report is used as it was (the file may have gone since)."""
    global _found
    reported = _found if _found is not None and _found[0] > state._commits else None
    found, _found = reported or _verified(state._commits), None
    if found is None:
        return
    commit, lineage_id, path, snapshot = found
    try:
        state._load_snapshot(commit, snapshot)
    except Exception as e:  # noqa: BLE001 - whatever the script's objects raise: said, then the end
        unloadable(path, e)
    state._lineage = lineage_id
    if state.backend.info().rank == 0:
        _say(f"resumed from commit {commit} ({path})")


def _verified(commit: int):
    """(commit, lineage, path, state) of the newest checkpoint of the lineage this worker
    resumes, loaded, if it is newer than `commit`; None if there is none newer."""
    global _found
    cfg = config()
    tried = None
    while True:
        newest = checkpointdir.newest(cfg.directory, cfg.lineage) if cfg is not None else None
        if newest is None or newest[0] <= commit:
            return None
        if _found is not None and _found[:3] == newest:
            return _found
        try:
            _found = (*newest, checkpointdir.load(newest[2], newest[0], newest[1]))
            return _found
        except FileNotFoundError as e:
            if newest == tried:  # still listed, still not there: not a writer's pruning
                unloadable(newest[2], e)
            tried = newest  # pruned meanwhile: its writer wrote a newer one
        except Exception as e:  # noqa: BLE001 - any reason it does not load: said, then the end
            unloadable(newest[2], e)


def unloadable(path: str, error: BaseException) -> None:
    """End this worker: the checkpoint at path exists but does not load. The job's
    driver is told (PUT /rdzv/load_failed, body "PATH: CAUSE") and ends the job with that one
    line, stopping the other workers; when it cannot be told, the line is said here. Exit code
    UNLOADABLE either way. Nothing in the folder is touched."""
    cause, path = _cause(error), printable(path)
    stopping.on_exit()
    if not _told_driver("load_failed", f"{path}: {cause}"):
        _say(f"checkpoint {path} does not load: {cause}. Nothing was deleted. Fix the script so that "
             f"it loads, or start anew on purpose with --fresh")
    raise SystemExit(exitcodes.UNLOADABLE)


def install(tell, holding: bool = False) -> None:
    """Take `tell(what, body, timeout, **query)`, the session's word to the driver
    (Session.tell): the session hands it over as it starts, as this module may not import it;
    `holding`: the worker trains on between drivers (--driver-grace), so keeps its newest commit
    at hand for finish."""
    global _tell, _holding
    _tell, _holding = tell, holding


def _told_driver(what: str, reason: str = "", **query) -> bool:
    """Whether the driver heard `reason` at /rdzv/`what` (load_failed, write_failed, written)."""
    if _tell is None:  # not started by `hvdlite run`: there is no driver to tell
        return False
    return _tell(what, reason.encode(), REPORT_TIMEOUT, **query)


def _cause(error: BaseException) -> str:
    """An exception on one line (torch's load_state_dict errors span several)."""
    return printable(" ".join(f"{type(error).__name__}: {error}".split()).rstrip("."))
