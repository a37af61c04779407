"""Checkpoints on disk: one file per commit, written atomically, the newest K kept (torch-free).

A checkpoint is `DIR/commit-<N>.ckpt`: a header naming the commit and the size and place of
every part (the manifest of the file), a pickle of the state whose arrays and tensors are taken
out of band, then their raw bytes. Each array starts in the file at the same offset within a
block as it has within a page in memory, so its whole blocks go to the disk with O_DIRECT (where
the filesystem allows it) straight from the array's memory: no copy, no page cache, the GIL
released, no checksum over them; a writer thread costs the training thread ~10 ms of CPU per
100 MB, all in the kernel. A file is written under a temporary name, fsynced and renamed, so a
crash at any point leaves either the complete file or none under a checkpoint's name; a reader
also checks the sizes and the header's checksum, so a file damaged later is skipped, not
half-loaded.

Loading rebuilds torch tensors only if the file holds some: a numpy worker never imports torch.
"""
import errno
import fcntl
import io
import mmap
import os
import pickle
import re
import socket
import struct
import sys
import time
import zlib

MAGIC = b"HVDLCKP2"
_HEADER = struct.Struct("<8sQQQI")  # magic, commit, pickle bytes, buffer count, crc32 (below)
_COUNTS = struct.Struct("<QQQ")  # what the crc32 covers of the header: all but magic and itself
_PART = struct.Struct("<QH")  # bytes of an out-of-band part, its offset within a block
_NAME = re.compile(r"^commit-(\d+)\.ckpt$")
STALE_TEMP = 600.0  # seconds without a write after which another writer's temporary file is junk
ALIGN = 4096  # O_DIRECT's alignment of file offsets, memory and lengths
_STAGE = 4 << 20  # bytes of the staging buffer, and of each write() straight from memory
_BIG = 1 << 16  # bytes from which a copy into the staging buffer releases the GIL


class CorruptCheckpoint(ValueError):
    """The file is not a complete checkpoint."""


def file_name(commit: int) -> str:
    return f"commit-{commit:012d}.ckpt"


def commit_of(name: str):
    """The commit a checkpoint file name holds, or None for any other name."""
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


def to_prune(commits, keep: int) -> list:
    """The commits to delete so that the newest `keep` remain."""
    return sorted(commits, reverse=True)[max(keep, 1):]


# ---- format -----------------------------------------------------------------------------
def _tensor(dtype: str, shape: tuple, requires_grad: bool, data):
    import torch
    kind = getattr(torch, dtype)
    if len(data) == 0:
        tensor = torch.empty(shape, dtype=kind)
    else:
        tensor = torch.frombuffer(data, dtype=torch.uint8).view(kind).reshape(shape)
    return tensor.requires_grad_(requires_grad)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        torch = sys.modules.get("torch")
        # Plain dense CPU tensors go out of band as raw bytes; any other kind pickles as torch
        # pickles it. numpy arrays go out of band by themselves (protocol 5).
        if torch is not None and type(obj) is torch.Tensor and obj.layout == torch.strided \
                and obj.device.type == "cpu" and not obj.is_quantized:
            raw = obj.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
            return _tensor, (str(obj.dtype).split(".")[1], tuple(obj.shape), obj.requires_grad,
                             pickle.PickleBuffer(raw))
        return NotImplemented


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _layout(pickled: int, parts) -> list:
    """Offsets of the parts after the header (pickle first, then each (length, phase) buffer)
    and, last, the file's size (whole blocks). A buffer starts in the block after the previous
    part, `phase` bytes into it: at its memory address's offset within a page, so that its
    whole pages are whole blocks of the file, which go out by O_DIRECT from where they are."""
    offsets = [_HEADER.size + len(parts) * _PART.size]
    end = offsets[0] + pickled
    for n, phase in parts:
        offsets.append(_aligned(end) + phase)
        end = offsets[-1] + n
    offsets.append(_aligned(end))
    return offsets


def _phase(view) -> int:
    """The offset of a buffer's memory within its page (0 if empty). Out-of-band buffers
    only come from numpy arrays and tensors, so numpy is there whenever this runs."""
    if not view.nbytes:
        return 0
    import numpy
    return numpy.frombuffer(view, numpy.uint8).__array_interface__["data"][0] % ALIGN


def _copy(target, source):
    target[:] = source


def _copy_without_gil(target, source):
    # numpy copies with the GIL released (a memoryview assignment holds it): the training
    # thread is not held up. Out-of-band buffers only come from numpy arrays and tensors, so
    # numpy is there whenever this runs.
    import numpy
    numpy.copyto(numpy.frombuffer(target, numpy.uint8), numpy.frombuffer(source, numpy.uint8))


class _Blocks:
    """Writes a file in whole ALIGN blocks: the small parts and the ends of big ones through a
    page-aligned staging buffer, the whole pages of big ones straight from their memory. With
    O_DIRECT the bytes go to the disk without the page cache's copy, which costs the CPU
    several times more."""

    def __init__(self, fd: int, direct: bool, pace):
        self.fd, self.direct, self.pace = fd, direct, pace
        self.used, self.position = 0, 0  # bytes staged; bytes of the file written or staged
        self.stage = mmap.mmap(-1, _STAGE)
        self.view = memoryview(self.stage)

    def put(self, data) -> None:
        """Stage data (copied)."""
        data = memoryview(data).cast("B")
        copy = _copy_without_gil if data.nbytes >= _BIG else _copy
        self.position += data.nbytes
        while data.nbytes:
            n = min(_STAGE - self.used, data.nbytes)
            copy(self.view[self.used:self.used + n], data[:n])
            self.used, data = self.used + n, data[n:]
            if self.used == _STAGE:
                self._flush()

    def put_in_place(self, data) -> None:
        """Write data, whose memory starts as far into a page as the file's position is into
        a block: its whole blocks straight from its memory (not copied)."""
        data = memoryview(data).cast("B")
        head = min(-self.position % ALIGN, data.nbytes)
        self.put(data[:head])
        body = (data.nbytes - head) // ALIGN * ALIGN
        if body:
            self._flush()  # the file's position is on a block boundary now
            for start in range(head, head + body, _STAGE):
                chunk = data[start:min(start + _STAGE, head + body)]
                self._write(chunk)
                self.pace(chunk.nbytes)
            self.position += body
        self.put(data[head + body:])

    def pad_to(self, position: int) -> None:
        """Zeros up to position."""
        while self.position < position:
            n = min(position - self.position, _STAGE - self.used)
            self.put(bytes(n))

    def _flush(self) -> None:
        self._write(self.view[:self.used])
        self.pace(self.used)
        self.used = 0

    def _write(self, view) -> None:
        while view.nbytes:
            try:
                view = view[os.write(self.fd, view):]
            except OSError as e:
                if e.errno != errno.EINVAL or not self.direct:
                    raise
                # The filesystem wants another alignment for O_DIRECT: go through the page cache.
                fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                self.direct = False

    def close(self) -> None:
        self.pad_to(_aligned(self.position))
        self._flush()
        self.view.release()
        self.stage.close()


def dump(fd: int, commit: int, state, direct=False, pace=lambda written: None) -> None:
    """Write `state` (any picklable object) as checkpoint `commit` to the file descriptor fd,
    opened with O_DIRECT if `direct`; pace(bytes) is called after every block of writes."""
    buffers = []
    data = io.BytesIO()
    _Pickler(data, protocol=5, buffer_callback=buffers.append).dump(state)
    views = [b.raw() for b in buffers]
    parts = [(v.nbytes, _phase(v)) for v in views]
    table = b"".join(_PART.pack(*part) for part in parts)
    counts = (commit, data.getbuffer().nbytes, len(views))
    crc = zlib.crc32(_COUNTS.pack(*counts) + table + data.getbuffer())
    blocks = _Blocks(fd, direct, pace)
    blocks.put(_HEADER.pack(MAGIC, *counts, crc) + table)
    blocks.put(data.getbuffer())
    for view, offset in zip(views, _layout(counts[1], parts)[1:]):
        blocks.pad_to(offset)
        blocks.put_in_place(view)
    blocks.close()  # on an error, the staging buffer goes with the garbage


def _read_exactly(f, n: int):
    data = bytearray(n)
    view, got = memoryview(data), 0
    while got < n:
        k = f.readinto(view[got:])
        if not k:
            raise CorruptCheckpoint("the file ends early")
        got += k
    return data


def _read_manifest(f, size: int):
    """(commit, pickle length, buffer parts, crc, layout) from the header; checks the file's size."""
    head = f.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise CorruptCheckpoint("no header")
    magic, commit, pickled, count, crc = _HEADER.unpack(head)
    if magic != MAGIC:
        raise CorruptCheckpoint("not an hvdlite checkpoint")
    if _HEADER.size + count * _PART.size + pickled > size:
        raise CorruptCheckpoint("the file ends early")
    parts = list(_PART.iter_unpack(_read_exactly(f, count * _PART.size))) if count else []
    layout = _layout(pickled, parts)
    if layout[-1] != size:
        raise CorruptCheckpoint("the file's size does not match its header")
    return commit, pickled, parts, crc, layout


def read_commit(path: str) -> int:
    """The commit of the checkpoint at path, checking only its header and size (cheap)."""
    with open(path, "rb") as f:
        return _read_manifest(f, os.fstat(f.fileno()).st_size)[0]


def load(path: str):
    """(commit, state) of the checkpoint at path; CorruptCheckpoint if it is not complete."""
    with open(path, "rb", buffering=0) as f:
        commit, pickled, parts, crc, layout = _read_manifest(f, os.fstat(f.fileno()).st_size)
        data = _read_exactly(f, pickled)
        covered = _COUNTS.pack(commit, pickled, len(parts)) + b"".join(_PART.pack(*p) for p in parts)
        if zlib.crc32(covered + data) != crc:
            raise CorruptCheckpoint("the header's checksum does not match")
        buffers = []
        for offset, (n, _) in zip(layout[1:], parts):
            f.seek(offset)
            buffers.append(_read_exactly(f, n))
    return commit, pickle.loads(data, buffers=buffers)


# ---- a directory of checkpoints ---------------------------------------------------------
def commits(directory: str) -> list:
    """The commits of the checkpoint files in directory, newest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted((c for c in map(commit_of, names) if c is not None), reverse=True)


def newest_commit(directory: str) -> int:
    """The commit of the newest complete-looking checkpoint in directory; 0 if none."""
    for commit in commits(directory):
        try:
            if read_commit(os.path.join(directory, file_name(commit))) == commit:
                return commit
        except (OSError, CorruptCheckpoint):
            continue
    return 0


def load_newest(directory: str, warn=None):
    """(commit, path, state) of the newest checkpoint that loads, or None. Each file that
    does not load is skipped, and said through warn(message)."""
    for commit in commits(directory):
        path = os.path.join(directory, file_name(commit))
        try:
            found, state = load(path)
        except FileNotFoundError:
            continue  # pruned meanwhile by a newer writer
        except Exception as e:  # noqa: BLE001 - any damage: fall back to the next older one
            if warn is not None:
                warn(f"checkpoint {path} does not load ({type(e).__name__}: {e}); trying an older one")
            continue
        if found == commit:
            return commit, path, state
    return None


def write(directory: str, commit: int, state, keep: int, pace=lambda written: None) -> str:
    """Write checkpoint `commit` atomically, then delete all but the newest `keep`."""
    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, file_name(commit))
    temp = os.path.join(directory, f".{file_name(commit)}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        fd, direct = _create(temp)
        try:
            dump(fd, commit, state, direct, pace)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, final)
    except BaseException:
        _remove(temp)
        raise
    _fsync_dir(directory)
    prune(directory, keep)
    return final


def _create(path):
    """(fd, O_DIRECT or not) of a new file: O_DIRECT where the filesystem takes it (not tmpfs)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        try:
            return os.open(path, flags | direct, 0o644), True
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o644), False


def prune(directory: str, keep: int, now=None) -> None:
    for commit in to_prune(commits(directory), keep):
        _remove(os.path.join(directory, file_name(commit)))
    now = time.time() if now is None else now
    for name in os.listdir(directory):
        if name.endswith(".tmp") and name.startswith(".commit-"):
            path = os.path.join(directory, name)
            try:
                if now - os.stat(path).st_mtime > STALE_TEMP:  # its writer died mid-write
                    _remove(path)
            except FileNotFoundError:
                pass


def _remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
