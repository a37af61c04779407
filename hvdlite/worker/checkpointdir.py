"""A folder of checkpoints (`--checkpoint-dir`): names, lineages, atomic writes, pruning
(torch-free).

A checkpoint is `DIR/commit-<N>-<lineage>.ckpt`. A lineage is one training's history: an id
minted when a training starts from nothing (time first, so later ids sort higher), carried by
every sync and checkpoint that follows, and adopted by a run that resumes from its files. A
folder may hold several lineages (a run started with --fresh beside an earlier one): a run
resumes the lineage written last, or the one it was given, and prunes only its own lineage.

A name is no proof of who wrote the file: in a folder others can write, anyone can plant
`commit-999999999999-<our lineage>.ckpt`, or a lineage whose id sorts above ours. So only files
this user owns are resumed or pruned (others' are said once by the driver, and left alone);
the lineage resumed is the one whose file was written last (its mtime), not the greatest id;
and a writer prunes only what is at or below the commit it has just written, so no name above
it can push the file it wrote out.

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
    return sorted(((commit, line) for commit, line, _, _ in _listed(directory)), reverse=True)


def _listed(directory: str) -> list:
    """(commit, lineage, owner's uid, mtime) of every checkpoint file in directory."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        parsed = name_of(name)
        if parsed is None:
            continue
        try:
            info = os.lstat(os.path.join(directory, name))
        except FileNotFoundError:  # pruned meanwhile
            continue
        found.append((*parsed, info.st_uid, info.st_mtime_ns))
    return found


def own(directory: str) -> list:
    """(commit, lineage, mtime) of the checkpoint files in directory that this user owns."""
    me = os.geteuid()
    return [(commit, line, mtime) for commit, line, uid, mtime in _listed(directory) if uid == me]


def others(directory: str) -> dict:
    """{lineage: uid} of the checkpoint files in directory that another user owns."""
    me = os.geteuid()
    return {line: uid for _, line, uid, _ in _listed(directory) if uid != me}


def newest(directory: str, lineage=None):
    """(commit, lineage, path) of this user's newest file of `lineage` (None: of the lineage
    whose file was written last), or None if there is none."""
    found = own(directory)
    if lineage is None and found:
        lineage = max(found, key=lambda f: (f[2], f[1]))[1]  # a tie (a coarse clock): the id's time
    ours = sorted((commit for commit, line, _ in found if line == lineage), reverse=True)
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


def to_prune(found, lineage: str, keep: int, written: int) -> list:
    """The (commit, lineage) files to delete so that the newest `keep` of `lineage` at or
    below `written` (the commit just written) remain: never it, nor anything above it."""
    return sorted((f for f in found if f[1] == lineage and f[0] <= written), reverse=True)[max(keep, 1):]


def write(directory: str, lineage: str, commit: int, state, keep: int, pace=lambda written: None) -> str:
    """Write checkpoint `commit` of `lineage` atomically, then delete all but the newest
    `keep` of that lineage at or below it (prune)."""
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
    prune(directory, lineage, keep, commit)
    return final


def prune(directory: str, lineage: str, keep: int, written: int, now=None) -> None:
    """Delete this user's files of `lineage` but the newest `keep` at or below `written`, and
    temporary files their writers left."""
    for commit, line in to_prune([(c, line) for c, line, _ in own(directory)], lineage, keep, written):
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
