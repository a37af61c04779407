"""A checkpoint file's format: how one commit's state is written and read back (torch-free).

A checkpoint (named by checkpointdir.py) is a header naming the commit, the lineage and
the size, place and CRC-32 of every part (the manifest of the file), a pickle of the state
whose arrays and tensors are taken out of band, then their raw bytes. Each array starts in the
file at the same offset within a block as it has within a page in memory, so its whole blocks
go to the disk with O_DIRECT (where the filesystem allows it) straight from the array's
memory: no copy, no page cache, the GIL released. Every byte is checksummed (zlib.crc32, ~26 ms
of CPU per 100 MB here, the GIL released; blake2b takes 132, sha1 65), so a reader refuses a
damaged file rather than half-loading it.

Before a file is written its pickle is loaded once from the state's own memory (no copy)
through the same restricted unpickler a reader uses (trusted.py): a state that a checkpoint
could not bring back is refused at the write, and the older files stay. Loading rebuilds torch
tensors only if the file holds some: a numpy worker never imports torch.
"""
import errno
import fcntl
import io
import mmap
import os
import pickle
import stat
import struct
import sys
import zlib

from hvdlite.worker import rebuild, trusted

MAGIC = b"HVDLCKP3"
_OLD_MAGICS = (b"HVDLCKP2",)
LINEAGE_CHARS = 20
_HEADER = struct.Struct(f"<8sQQQ{LINEAGE_CHARS}sI")  # magic, commit, pickle bytes, buffers, lineage, crc32
_COUNTS = struct.Struct(f"<QQQ{LINEAGE_CHARS}s")  # the header's fields the crc32 covers
_PART = struct.Struct("<QHI")  # bytes of an out-of-band part, its offset within a block, its crc32
ALIGN = 4096  # O_DIRECT's alignment of file offsets, memory and lengths
_STAGE = 4 << 20  # bytes of the staging buffer, and of each write() straight from memory
_BIG = 1 << 16  # bytes from which a copy into the staging buffer releases the GIL


class CorruptCheckpoint(ValueError):
    """The file is not a complete checkpoint."""


# ---- format -----------------------------------------------------------------------------
class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        torch = sys.modules.get("torch")
        # Plain dense tensors go out of band as raw bytes, a GPU's from a host copy with the
        # device they were on; any other kind pickles as torch pickles it. numpy arrays go out
        # of band by themselves (protocol 5).
        if torch is None or type(obj) is not torch.Tensor or obj.layout != torch.strided or obj.is_quantized:
            return NotImplemented
        if obj.device.type != "cpu":
            return rebuild.on_device, (obj.detach().cpu().requires_grad_(obj.requires_grad), str(obj.device))
        raw = obj.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        return rebuild.tensor, (str(obj.dtype).split(".")[1], tuple(obj.shape), obj.requires_grad,
                                pickle.PickleBuffer(raw))


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _layout(pickled: int, parts) -> list:
    """Offsets of the parts after the header (pickle first, then each (length, phase) buffer)
    and, last, the file's size (whole blocks). A buffer starts in the block after the previous
    part, `phase` bytes into it: at its memory address's offset within a page, so that its
    whole pages are whole blocks of the file, which go out by O_DIRECT from where they are."""
    offsets = [_HEADER.size + len(parts) * _PART.size]
    end = offsets[0] + pickled
    for n, phase, *_ in parts:  # (length, phase[, crc])
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


def dump(fd: int, commit: int, lineage: str, state, direct=False, pace=lambda written: None) -> None:
    """Write `state` as checkpoint `commit` of `lineage` to the file descriptor fd, opened with
    O_DIRECT if `direct`; pace(bytes) is called after every block of writes. Raises
    trusted.Untrusted, writing nothing, if a checkpoint could not bring the state back."""
    buffers = []
    data = io.BytesIO()
    _Pickler(data, protocol=5, buffer_callback=buffers.append).dump(state)
    views = [b.raw() for b in buffers]
    trusted.loads(data.getbuffer(), views, place=False)  # what a reader will do, on the state's own memory
    seal(fd, commit, lineage, data.getbuffer(), views, direct, pace)


def seal(fd: int, commit: int, lineage: str, pickled, views, direct=False, pace=lambda written: None) -> None:
    """Write a checkpoint of these pickle bytes and out-of-band buffers, checksummed."""
    parts = [(v.nbytes, _phase(v), zlib.crc32(v)) for v in views]
    table = b"".join(_PART.pack(*part) for part in parts)
    counts = (commit, pickled.nbytes, len(views), lineage.encode())
    crc = zlib.crc32(_COUNTS.pack(*counts) + table + pickled)
    blocks = _Blocks(fd, direct, pace)
    blocks.put(_HEADER.pack(MAGIC, *counts, crc) + table)
    blocks.put(pickled)
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
    """(counts, buffer parts, crc, layout) from the header; checks the file's size."""
    head = f.read(_HEADER.size)
    if head[:8] in _OLD_MAGICS:
        raise CorruptCheckpoint("written by an older hvdlite, in a format this one does not read")
    if len(head) < _HEADER.size:
        raise CorruptCheckpoint("no header")
    magic, commit, pickled, count, lineage, crc = _HEADER.unpack(head)
    if magic != MAGIC:
        raise CorruptCheckpoint("not an hvdlite checkpoint")
    if _HEADER.size + count * _PART.size + pickled > size:
        raise CorruptCheckpoint("the file ends early")
    parts = list(_PART.iter_unpack(_read_exactly(f, count * _PART.size))) if count else []
    layout = _layout(pickled, parts)
    if layout[-1] != size:
        raise CorruptCheckpoint("the file's size does not match its header")
    return (commit, pickled, count, lineage), parts, crc, layout


def _open(path: str):
    """The regular file at path, opened to read. FileNotFoundError only if nothing has that
    name any more (a writer pruned it); a name that cannot be opened (a dangling symlink, no
    permission) or is no regular file is CorruptCheckpoint. O_NONBLOCK: a FIFO's open would
    wait for a writer for good."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if not os.path.lexists(path):
            raise
        raise CorruptCheckpoint("it cannot be opened: it is a symbolic link to nothing") from None
    except OSError as e:
        raise CorruptCheckpoint(f"it cannot be opened: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CorruptCheckpoint("it is not a regular file")
    return open(fd, "rb", buffering=0)


def load(path: str):
    """(commit, lineage, state) of the checkpoint at path, every byte checked against its
    checksum and nothing untrusted called; CorruptCheckpoint or trusted.Untrusted if not."""
    with _open(path) as f:
        counts, parts, crc, layout = _read_manifest(f, os.fstat(f.fileno()).st_size)
        data = _read_exactly(f, counts[1])
        if zlib.crc32(_COUNTS.pack(*counts) + b"".join(_PART.pack(*p) for p in parts) + data) != crc:
            raise CorruptCheckpoint("the header's checksum does not match")
        buffers = []
        for index, (offset, (n, _, part_crc)) in enumerate(zip(layout[1:], parts)):
            f.seek(offset)
            buffers.append(_read_exactly(f, n))
            if zlib.crc32(buffers[-1]) != part_crc:
                raise CorruptCheckpoint(f"the checksum of array {index} ({n} bytes) does not match")
    try:
        lineage = counts[3].decode("ascii")
    except UnicodeDecodeError:
        raise CorruptCheckpoint("its lineage is not an id") from None
    return counts[0], lineage, trusted.loads(data, buffers)


def create(path):
    """(fd, O_DIRECT or not) of a new file at path: never an existing file or a symlink planted
    there (O_EXCL, O_NOFOLLOW); O_DIRECT where the filesystem takes it (not tmpfs)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | direct)
            return fd, True
        except OSError:
            pass
    return fd, False
