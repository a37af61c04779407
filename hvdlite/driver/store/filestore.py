"""The default Store: a folder, 0700, its files 0600.

Every operation holds an exclusive flock on the folder's lock file, so drivers on one machine
(or on hosts sharing a filesystem whose flock works, NFSv4) see one lease. A lease's expiry is
wall-clock time: across hosts it needs their clocks in step, which is why a standby on another
host should use etcd.
"""
import fcntl
import json
import os
import time
from contextlib import contextmanager
from typing import Optional

from hvdlite.driver.store import Fenced, Lease, Store
from hvdlite.errors import JobError

LEASE = "lease.json"


class FileStore(Store):
    def __init__(self, folder: str, clock=time.time):
        self.folder = folder
        self.clock = clock
        os.makedirs(folder, mode=0o700, exist_ok=True)

    @contextmanager
    def _locked(self):
        fd = os.open(os.path.join(self.folder, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _read(self, name: str) -> Optional[bytes]:
        try:
            with open(os.path.join(self.folder, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _write(self, name: str, value: bytes) -> None:
        path = os.path.join(self.folder, name)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(value)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _lease(self) -> dict:
        raw = self._read(LEASE)
        if not raw:
            return {"owner": "", "epoch": 0, "expires": 0.0}
        try:
            held = json.loads(raw)
            if isinstance(held["owner"], str) and isinstance(held["epoch"], int) and \
                    isinstance(held["expires"], (int, float)):
                return held
        except (ValueError, TypeError, KeyError):
            pass
        # Never a lease this store wrote (its writes are atomic): refused, not guessed at.
        raise JobError(f"{os.path.join(self.folder, LEASE)} is not a driver lease; remove it once no "
                       f"driver of this job runs")

    def _set_lease(self, owner: str, epoch: int, expires: float) -> None:
        self._write(LEASE, json.dumps({"owner": owner, "epoch": epoch, "expires": expires}).encode())

    def acquire(self, owner, ttl):
        with self._locked():
            now = self.clock()
            held = self._lease()
            if held["owner"] and held["expires"] > now:
                return None
            lease = Lease(owner, held["epoch"] + 1)
            self._set_lease(owner, lease.epoch, now + ttl)
            return lease

    def renew(self, lease, ttl):
        with self._locked():
            if self._lease()["epoch"] != lease.epoch:
                return False
            self._set_lease(lease.owner, lease.epoch, self.clock() + ttl)
            return True

    def release(self, lease):
        with self._locked():
            if self._lease()["epoch"] == lease.epoch:
                self._set_lease("", lease.epoch, 0.0)  # the epoch stays: the next is greater

    def holder(self):
        with self._locked():
            held = self._lease()
        if held["owner"] and held["expires"] > self.clock():
            return Lease(held["owner"], held["epoch"])
        return None

    def put(self, lease, key, value):
        if key == LEASE or "/" in key or key.startswith(".") or key == "lock":
            raise ValueError(f"not a journal key: {key!r}")
        with self._locked():
            if self._lease()["epoch"] != lease.epoch:
                raise Fenced(f"lease {lease.epoch} of {lease.owner} was superseded")
            self._write(key, value)

    def get(self, key):
        with self._locked():
            return self._read(key)
