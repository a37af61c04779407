"""A folder of checkpoints (`--checkpoint-dir`): names, lineages, atomic writes, pruning
(torch-free).

A checkpoint is `DIR/commit-<N>-<lineage>.ckpt`. A lineage is one training's history: an id
minted when a training starts from nothing (time first, so later ids sort higher), carried by
every sync and checkpoint that follows, and adopted by a run that resumes from its files. A
folder may hold several lineages (a run started with --fresh beside an earlier one): a run
resumes the newest lineage, or the one it was given, and prunes only its own files, never
below its newest one. So another run's files are never deleted, and never mixed in.

A file is written under a temporary name, fsynced and renamed, so a crash at any point leaves
either the complete file or none under a checkpoint's name.
"""
import os
import re
import secrets
import socket
import time

from hvdlite.worker import checkpoints
from hvdlite.worker.checkpoints import LINEAGE_CHARS, CorruptCheckpoint

STALE_TEMP = 600.0  # seconds without a write after which another writer's temporary file is junk
# Files of hvdlite before lineages have no lineage in their names: listed (lineage ""), so
# that they are refused with a reason rather than silently passed over.
_NAME = re.compile(rf"^commit-(\d+)(?:-([0-9a-f]{{{LINEAGE_CHARS}}}))?\.ckpt$")


def new_lineage() -> str:
    """A new lineage id: milliseconds since the epoch, then random bits."""
    return f"{int(time.time() * 1000):012x}{secrets.token_hex((LINEAGE_CHARS - 12) // 2)}"


def file_name(commit: int, lineage: str) -> str:
    return f"commit-{commit:012d}-{lineage}.ckpt" if lineage else f"commit-{commit:012d}.ckpt"


def name_of(name: str):
    """(commit, lineage) of a checkpoint file's name, or None for any other name."""
    match = _NAME.match(name)
    return (int(match.group(1)), match.group(2) or "") if match else None


def files(directory: str) -> list:
    """(commit, lineage) of every checkpoint file in directory, the highest commit first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted((found for found in map(name_of, names) if found is not None), reverse=True)


def newest(directory: str, lineage=None):
    """(commit, lineage, path) of the newest file of `lineage` (None: of the newest lineage in
    the folder), or None if there is none."""
    found = files(directory)
    if lineage is None and found:
        lineage = max(line for _, line in found)
    ours = [commit for commit, line in found if line == lineage]
    if not ours:
        return None
    return ours[0], lineage, os.path.join(directory, file_name(ours[0], lineage))


def load(path: str, commit: int, lineage: str):
    """The state in the file at path, which its name says is `commit` of `lineage`;
    CorruptCheckpoint or trusted.Untrusted if it does not load."""
    found_commit, found_lineage, state = checkpoints.load(path)
    if (found_commit, found_lineage) != (commit, lineage):
        raise CorruptCheckpoint(f"it holds commit {found_commit} of lineage {found_lineage}, "
                                f"not what its name says")
    return state


def to_prune(found, lineage: str, keep: int) -> list:
    """The (commit, lineage) files to delete so that the newest `keep` of `lineage` remain."""
    return sorted((f for f in found if f[1] == lineage), reverse=True)[max(keep, 1):]


def write(directory: str, lineage: str, commit: int, state, keep: int, pace=lambda written: None) -> str:
    """Write checkpoint `commit` of `lineage` atomically, then delete all but the newest
    `keep` of that lineage."""
    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, file_name(commit, lineage))
    # Random bits: in a folder others can write, nobody can plant a file at the name first.
    temp = os.path.join(directory, f".{file_name(commit, lineage)}.{socket.gethostname()}.{os.getpid()}."
                                   f"{secrets.token_hex(8)}.tmp")
    fd, direct = checkpoints.create(temp)  # outside the try: what is at the name is not ours
    try:
        try:
            checkpoints.dump(fd, commit, lineage, state, direct, pace)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, final)
    except BaseException:
        _remove(temp)
        raise
    _fsync_dir(directory)
    prune(directory, lineage, keep)
    return final


def prune(directory: str, lineage: str, keep: int, now=None) -> None:
    for commit, line in to_prune(files(directory), lineage, keep):
        _remove(os.path.join(directory, file_name(commit, line)))
    now = time.time() if now is None else now
    for name in os.listdir(directory):
        if name.endswith(".tmp") and name.startswith(".commit-"):
            path = os.path.join(directory, name)
            try:
                if now - os.lstat(path).st_mtime > STALE_TEMP:  # its writer died mid-write
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
