"""Where a job's driver listens, told through --checkpoint-dir to workers that lost theirs
(torch-free; the driver writes it, the workers read it).

With --checkpoint-dir the job's drivers keep a folder there, `.hvdlite-driver/` (0700): the
job's secret (0600, never anywhere else on disk), the store's lease and journal (the default
store), the beacon, and `output/`, where a worker whose output pipe to a dead driver broke
writes on. The beacon says where the driver that holds the lease listens and its lease's epoch;
a worker between drivers polls it and goes over to a driver whose epoch is greater than any it
accepted. It is signed with a key derived from the job's secret, as the journal is (`signed`),
so a file planted there is refused.
"""
import hashlib
import hmac
import json
import os
from typing import Optional

FOLDER = ".hvdlite-driver"
BEACON = "beacon"
SECRET = "secret"
OUTPUT = "output"


def folder(checkpoint_dir: str) -> str:
    return os.path.join(checkpoint_dir, FOLDER)


def _key(secret: str, purpose: str) -> bytes:
    return hmac.digest(secret.encode("utf-8"), b"hvdlite " + purpose.encode(), "sha256")


def signed(secret: str, purpose: str, record: dict) -> bytes:
    """`record` as JSON with an HMAC of it under a key only the job's secret gives."""
    body = json.dumps(record, sort_keys=True)
    sig = hmac.new(_key(secret, purpose), body.encode(), hashlib.sha256).hexdigest()
    return json.dumps({"body": body, "sig": sig}).encode()


def opened(secret: str, purpose: str, raw: Optional[bytes]) -> Optional[dict]:
    """The record `signed` made, or None when there is none or its signature is not the job's."""
    try:
        outer = json.loads(raw)
        body = outer["body"].encode()
        if hmac.compare_digest(hmac.new(_key(secret, purpose), body, hashlib.sha256).hexdigest(), outer["sig"]):
            return json.loads(body)
    except (TypeError, ValueError, KeyError, AttributeError):
        pass
    return None


def accepts(epoch: int, greatest: int) -> bool:
    """Whether a worker that accepted a driver of lease `greatest` takes an answer of one of
    lease `epoch`: never from an older driver (back from a pause or a partition)."""
    return epoch >= greatest


def write_private(path: str, data: bytes) -> None:
    """Replace the file at `path` with `data` at once, readable by this user only."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def publish(checkpoint_dir: str, secret: str, epoch: int, addr: str, port: int) -> None:
    """The driver holding lease `epoch` listens at addr:port."""
    write_private(os.path.join(folder(checkpoint_dir), BEACON),
                  signed(secret, BEACON, {"epoch": epoch, "addr": addr, "port": port}))


class Watch:
    """A worker's look at the beacon: `newer(epoch)` reads it only when the file changed."""

    def __init__(self, checkpoint_dir: str, secret: str):
        self.path = os.path.join(folder(checkpoint_dir), BEACON)
        self.secret, self._seen = secret, None

    def epoch(self) -> Optional[int]:
        """The lease epoch the beacon names now, read afresh; None where this host sees no beacon
        of the job (its folder is another host's, not shared with this one)."""
        try:
            with open(self.path, "rb") as f:
                record = opened(self.secret, BEACON, f.read())
        except OSError:
            return None
        return record["epoch"] if record is not None and isinstance(record.get("epoch"), int) else None

    def newer(self, epoch: int):
        """(epoch, addr, port) of a driver with a greater epoch than `epoch`, else None."""
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        if (info.st_mtime_ns, info.st_size, info.st_ino) == self._seen:
            return None
        try:
            with open(self.path, "rb") as f:
                record = opened(self.secret, BEACON, f.read())
        except OSError:
            return None
        self._seen = (info.st_mtime_ns, info.st_size, info.st_ino)
        if record is None or not isinstance(record.get("epoch"), int) or record["epoch"] == epoch \
                or not accepts(record["epoch"], epoch):
            return None
        return record["epoch"], str(record["addr"]), int(record["port"])


def output_path(checkpoint_dir: str, worker: str, stream: str) -> str:
    """Where `worker` writes `stream` once its pipe to the driver broke."""
    return os.path.join(folder(checkpoint_dir), OUTPUT, f"{worker.replace('/', '.')}.{stream}")
