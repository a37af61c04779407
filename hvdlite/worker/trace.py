"""Per-rank collective trace in Chrome's trace format (chrome://tracing, Perfetto).

Each worker appends its events as JSON lines to its own part file, FILE.parts/<worker>.jsonl
(no two processes ever write one file); `merge_parts(FILE)` joins the parts into FILE, one
JSON object `{"traceEvents": [...]}`. A collective is a "B" event when issued and an "E"
event when waited for, on the first lane (tid) of its process free at that time, so the
begin/end pairs of a lane always nest. Off (no recorder), a traced call costs one check.
"""
import atexit
import errno
import glob
import json
import os
import stat
import tempfile
import threading
import time

from hvdlite.worker import env

PARTS = ".parts"


def parts_dir(path: str) -> str:
    return path + PARTS


def _now_us() -> float:
    return time.time() * 1e6  # wall clock: processes on one host line up


def _own_folder(folder: str) -> None:
    """Make folder, or check that it is a folder of this user's and no symlink: another user
    who could plant one there would have parts written, and later deleted, where it points."""
    os.makedirs(folder, exist_ok=True)
    found = os.lstat(folder)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        raise OSError(errno.EPERM, "not a folder of this user's (a symlink, or another user's)", folder)


def _opener(flags):
    """open()'s opener: never through a symlink planted at the name (O_NOFOLLOW)."""
    return lambda name, mode: os.open(name, mode | flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)


def _is_own_folder(folder: str) -> bool:
    try:
        found = os.lstat(folder)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(found.st_mode) and found.st_uid == os.geteuid()


class Recorder:
    def __init__(self, path: str, worker: str):
        _own_folder(parts_dir(path))
        self.path = path
        self.part = os.path.join(parts_dir(path), worker.replace("/", "_").replace("#", "_") + ".jsonl")
        # A line each write (a few microseconds; a collective takes hundreds): a worker
        # killed by SIGKILL leaves all it did in the trace.
        self._file = open(self.part, "a", encoding="utf-8", buffering=1, opener=_opener(0))
        self._pid = os.getpid()
        self._busy = []  # lane -> in use
        self._lock = threading.Lock()
        self._write({"name": "process_name", "ph": "M", "pid": self._pid, "tid": 0,
                     "args": {"name": f"worker {worker}"}})

    def _write(self, event):
        self._file.write(json.dumps(event) + "\n")

    def begin(self, name: str, args: dict):
        """Start a span; returns what end() needs."""
        with self._lock:
            lane = self._busy.index(False) if False in self._busy else len(self._busy)
            if lane == len(self._busy):
                self._busy.append(True)
            self._busy[lane] = True
            self._write({"name": name, "ph": "B", "ts": _now_us(), "pid": self._pid, "tid": lane,
                         "args": args})
        return name, lane

    def end(self, token, **args) -> None:
        name, lane = token
        with self._lock:
            if self._file.closed:
                return
            self._write({"name": name, "ph": "E", "ts": _now_us(), "pid": self._pid, "tid": lane,
                         "args": args})
            self._busy[lane] = False

    def instant(self, name: str, args: dict) -> None:
        with self._lock:
            self._write({"name": name, "ph": "i", "s": "p", "ts": _now_us(), "pid": self._pid,
                         "tid": 0, "args": args})

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()


_recorder = None


def recorder():
    """The active recorder, or None when tracing is off."""
    return _recorder


def start(path: str, worker: str) -> None:
    global _recorder
    stop()
    _recorder = Recorder(os.path.abspath(path), worker)


def stop():
    """Stop recording; returns the trace file it recorded for, or None."""
    global _recorder
    rec, _recorder = _recorder, None
    if rec is None:
        return None
    rec.close()
    return rec.path


atexit.register(stop)


def start_timeline(path: str) -> None:
    """A worker's start_timeline(): record this process's part beside `path`."""
    start(path, os.environ.get(env.WORKER) or f"pid{os.getpid()}")


def stop_timeline(rank: int) -> None:
    """A worker's stop_timeline(): stop recording; rank 0 (re)writes the file from every
    part recorded so far, as Horovod writes the timeline at rank 0's path. The parts stay
    beside it, so a rank that stops later merges its part into the file rank 0 wrote."""
    path = stop()
    if path is not None and (rank == 0 or os.path.exists(path)):
        merge_parts(path, remove=False)


def collective(kind: str, name, info, nbytes: int):
    """Begin a collective's span, named by the caller's name= or else by its kind; returns
    the function that ends it."""
    return span(name or kind, op=kind, bytes=nbytes, rank=info.rank, size=info.size, round=info.round)


def span(name: str, **args):
    """begin() on the active recorder; returns a function that ends it (a no-op when off)."""
    rec = _recorder
    if rec is None:
        return _nothing
    token = rec.begin(name, args)
    return lambda **more: rec.end(token, **more)


def _nothing(**_):
    pass


def instant(name: str, **args) -> None:
    rec = _recorder
    if rec is not None:
        rec.instant(name, args)


def read_parts(path: str) -> list:
    """Every event of FILE's parts; a begin left open (a killed worker) is ended at the last
    time its process recorded anything, marked unfinished."""
    events = []
    for part in sorted(glob.glob(os.path.join(parts_dir(path), "*.jsonl"))):
        if os.path.islink(part):
            continue  # no worker's part: planted (and never opened: O_NOFOLLOW)
        with open(part, encoding="utf-8", opener=_opener(os.O_NONBLOCK)) as f:
            mine = []
            for line in f:
                try:
                    mine.append(json.loads(line))
                except ValueError:
                    break  # a line cut short by the worker's death
        events += mine + _close_open(mine)
    return events


def _close_open(events) -> list:
    open_spans, last = {}, 0.0
    for e in events:
        last = max(last, e.get("ts", 0.0))
        key = (e.get("pid"), e.get("tid"))
        if e["ph"] == "B":
            open_spans.setdefault(key, []).append(e)
        elif e["ph"] == "E" and open_spans.get(key):
            open_spans[key].pop()
    return [{"name": b["name"], "ph": "E", "ts": last, "pid": b["pid"], "tid": b["tid"],
             "args": {"unfinished": True}}
            for spans in open_spans.values() for b in reversed(spans)]


def _umask() -> int:
    """This process's umask, read without changing it (os.umask sets it, for every thread);
    0o077 where it cannot be read."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o077


def merge_parts(path: str, remove: bool = True, out: str = None) -> None:
    """Write FILE (or `out`) from FILE's parts, atomically; `remove` deletes the parts afterwards."""
    if not _is_own_folder(parts_dir(path)):
        return
    events = read_parts(path)
    out = out or path
    # mkstemp: a name nobody can plant a symlink at first (O_EXCL, random bits)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(out) + ".", suffix=".tmp", dir=os.path.dirname(out))
    try:
        os.fchmod(fd, 0o644 & ~_umask())  # as open() would have made it: never wider than the umask
        with open(fd, "w", encoding="utf-8") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    if remove:
        discard_parts(path)


def discard_parts(path: str) -> None:
    """Delete FILE's parts (those of an earlier job, or merged already)."""
    folder = parts_dir(path)
    if not _is_own_folder(folder):
        return
    for part in glob.glob(os.path.join(folder, "*.jsonl")):
        os.remove(part)
    try:
        os.rmdir(folder)
    except OSError:
        pass  # missing, or something else is in there: leave it
