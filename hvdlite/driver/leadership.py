"""The driver that leads a --checkpoint-dir job: its lease, journal, secret and beacon.

One driver decides at a time: the one holding the store's lease (store/). It renews the lease on
its loop (`keep`) and writes its journal under it (`record`, decisions/adoption.py says what is
in it), signed with a key derived from the job's secret; the secret itself lives only in the
driver folder of --checkpoint-dir (0600), where the next driver reads it. A renewal refused, or
a write fenced, raises NotLeader: this driver decides nothing more.

A new driver of the same job takes a new lease (a greater epoch) once the last one lapsed or
was released; a lease whose owner is a process of this host that no longer runs is released at
once (it can never renew again). Any other live lease means a driver runs this job: NotLeader.
"""
import os
import secrets
import shutil
import socket
import threading
from typing import Optional

from hvdlite import exitcodes, procstat
from hvdlite.driver.decisions.adoption import may_decide
from hvdlite.driver.store import Fenced, Lease, Store
from hvdlite.driver.store.filestore import FileStore
from hvdlite.errors import JobError
from hvdlite.worker import beacon

JOURNAL = "journal"
ENDED = {"version": 1, "adoptable": False}  # the journal of a job nobody is to take over


class NotLeader(JobError):
    """Another driver holds the job's lease."""
    exit_code = exitcodes.NOT_LEADER


def _owner() -> str:
    return f"{socket.gethostname()}:{procstat.identity(os.getpid())}"


def _private(path: str, info: os.stat_result = None) -> None:
    """Refuse a driver folder or secret another user could have written (or read, the secret)."""
    info = info or os.stat(path)
    loose = 0o022 if os.path.isdir(path) else 0o077
    if info.st_uid != os.geteuid() or info.st_mode & loose:
        raise JobError(f"{path} is owned by uid {info.st_uid} with mode {info.st_mode & 0o777:o}: a job's driver "
                       f"folder and secret must be this user's (uid {os.geteuid()}) and private; refusing it")


def _gone(owner: str) -> bool:
    """The lease's owner is a process of this host that no longer runs."""
    host, _, proc = owner.partition(":")
    return host == socket.gethostname() and proc.count(":") == 1 and procstat.identity(int(proc.split(":")[0])) != proc


class Leadership:
    def __init__(self, checkpoint_dir: str, store: Store, lease: Lease, ttl: float, now: float):
        self.checkpoint_dir, self.store, self.lease, self.ttl = checkpoint_dir, store, lease, ttl
        self.folder = beacon.folder(checkpoint_dir)
        self.renewed = self.tried = now
        self.secret = None
        self._written = None
        # The journal goes to the store on a thread of its own: a write (an fsync, a round trip
        # to etcd) never holds up a decision. The newest journal wins over one not written yet.
        self._cond = threading.Condition()
        self._pending = None
        self._busy = False
        self._lost = None  # why a write was refused: the next keep() stops the driver
        threading.Thread(target=self._write, daemon=True, name="hvdlite-journal").start()

    @classmethod
    def take(cls, checkpoint_dir: str, ttl: float, now: float, store: Store = None) -> "Leadership":
        """The job's lease for this process, or NotLeader naming the driver that holds it."""
        folder = beacon.folder(checkpoint_dir)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        _private(folder)
        os.chmod(folder, 0o700)
        store = store or FileStore(folder)
        owner = _owner()
        lease = store.acquire(owner, ttl)
        if lease is None:
            held = store.holder()
            if held is not None and _gone(held.owner):
                store.release(held)  # its process ended: it cannot renew, nor decide, again
                lease = store.acquire(owner, ttl)
        if lease is None:
            held = store.holder()
            who = f"{held.owner}, lease {held.epoch}" if held else "a driver"
            raise NotLeader(f"another driver runs the job of --checkpoint-dir {checkpoint_dir} ({who}); "
                            f"stop it first, or let it end: its lease lapses {ttl:g} s after it stops")
        return cls(checkpoint_dir, store, lease, ttl, now)

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    def journal(self) -> Optional[dict]:
        """The last driver's journal, or None when there is none. One that does not verify with
        the secret here is refused: starting afresh could race the workers it names."""
        raw = self.store.get(JOURNAL)
        if raw is None:
            return None
        secret = self._read_secret()
        saved = beacon.opened(secret, JOURNAL, raw) if secret is not None else None
        if saved is None:
            raise JobError(f"the driver journal of --checkpoint-dir {self.checkpoint_dir} does not verify with the "
                           f"job's secret in {self.folder} (changed, or another job's); once no worker of this "
                           f"job runs, remove {self.folder} to resume from the checkpoints")
        return saved

    def take_secret(self, adopting: bool) -> str:
        """The job's secret: the last driver's when adopting its workers, else a new one (and
        an earlier job's output files go: its worker ids come again)."""
        secret = self._read_secret() if adopting else None
        if secret is None:
            secret = secrets.token_urlsafe(32)
            beacon.write_private(os.path.join(self.folder, beacon.SECRET), secret.encode())
            shutil.rmtree(os.path.join(self.folder, beacon.OUTPUT), ignore_errors=True)
            self.secret = secret
            self.record(ENDED)  # the last journal was signed with the secret just replaced
            self.flush()
        self.secret = secret
        return secret

    def _read_secret(self) -> Optional[str]:
        path = os.path.join(self.folder, beacon.SECRET)
        try:
            with open(path, "rb") as f:
                _private(path, os.fstat(f.fileno()))
                return f.read().decode().strip() or None
        except FileNotFoundError:
            return None

    def publish(self, addr: str, port: int) -> None:
        """The beacon: where this driver listens, for workers that lost theirs."""
        beacon.publish(self.checkpoint_dir, self.secret, self.epoch, addr, port)

    def keep(self, now: float, force: bool = False) -> None:
        """Renew the lease when a quarter of its time to live passed (or now, `force`): before
        any decision is acted on after a pause (the loop calls this first). NotLeader once it
        is lost."""
        if self._lost is not None:
            raise NotLeader(self._lost)
        if not force and now - self.tried < self.ttl / 4:
            return
        self.tried = now
        try:
            held = self.store.renew(self.lease, self.ttl)
        except Exception:  # noqa: BLE001 - the store unreachable: its time to live decides
            if not may_decide(True, self.renewed, now, self.ttl):
                raise NotLeader(f"this driver could not renew its lease {self.epoch} for {self.ttl:g} s; "
                                f"it stops deciding (another driver may take the job over)") from None
            return
        if not held:
            raise NotLeader(f"this driver lost its lease {self.epoch}: another driver took the job over; "
                            f"it stops deciding")
        self.renewed = now

    @property
    def in_doubt(self) -> bool:
        """Its last renewal failed (the store did not answer): it may be cut off from everything
        (decisions/core.py's in_doubt says what it then does not decide)."""
        return self.renewed < self.tried

    def record(self, journal: dict) -> None:
        """Have the journal written if it changed (in the background); a write a newer lease
        fenced makes the next keep() raise NotLeader."""
        with self._cond:
            if journal != self._written:
                self._pending = journal
                self._cond.notify_all()

    def _write(self):
        while True:
            with self._cond:
                while self._pending is None:
                    self._cond.wait()
                journal, self._pending, self._busy = self._pending, None, True
            try:
                self.store.put(self.lease, JOURNAL, beacon.signed(self.secret, JOURNAL, journal))
                written = journal
            except Fenced:
                self._lost = (f"this driver lost its lease {self.epoch}: another driver took the job over; "
                              f"it stops deciding")
                written = None
            except Exception:  # noqa: BLE001 - the store unreachable: the next journal tries again
                written = None
            with self._cond:
                self._written = written if written is not None else self._written
                self._busy = False
                self._cond.notify_all()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until the journal recorded last is written (or refused)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout)

    def release(self) -> None:
        """Give the lease up, leaving the journal as it is (for the next driver to take over)."""
        try:
            self.store.release(self.lease)
        except Exception:  # noqa: BLE001 - the store unreachable: the lease lapses by itself
            pass

    def end(self) -> None:
        """The job ended: nobody is to take it over; the lease is free at once."""
        self.record(ENDED)
        self.flush()
        if self._lost is None:
            self.release()
