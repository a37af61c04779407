"""Where a job's drivers keep their journal and their leader lease: a Store.

One driver decides at a time: the one holding the lease. Every lease ever granted for a job
has a greater epoch than the one before, and every write carries its lease: a store refuses it
(Fenced) once a newer lease exists, so a driver that lost its lease (paused, partitioned, then
back) cannot overwrite its successor's journal. The values are opaque bytes: the caller signs
them and never stores the job's secret in them.

Two stores share these rules: FileStore (filestore.py), a folder in --checkpoint-dir, the
default for one machine or a shared filesystem; EtcdStore (etcd.py), a consensus store for
standby drivers on other hosts.
"""
import dataclasses
from typing import Optional


class Fenced(Exception):
    """A newer lease was granted: this driver decides nothing more."""


@dataclasses.dataclass(frozen=True)
class Lease:
    owner: str  # who holds it: a driver's own id (host, pid, start time)
    epoch: int  # the fencing token: greater for every lease granted


class Store:
    def acquire(self, owner: str, ttl: float) -> Optional[Lease]:
        """A new lease for `owner`, valid for `ttl` seconds unless renewed; None while
        another owner's lease is live."""
        raise NotImplementedError

    def renew(self, lease: Lease, ttl: float) -> bool:
        """Extend `lease` by `ttl` seconds; False once a newer lease exists (it is lost)."""
        raise NotImplementedError

    def release(self, lease: Lease) -> None:
        """Give `lease` up at once (a driver that ends its job), if it is still the newest."""
        raise NotImplementedError

    def holder(self) -> Optional[Lease]:
        """The live lease, if any."""
        raise NotImplementedError

    def put(self, lease: Lease, key: str, value: bytes) -> None:
        """Write `value` under `key` while `lease` is the newest; raises Fenced otherwise."""
        raise NotImplementedError

    def get(self, key: str) -> Optional[bytes]:
        """The value last put under `key`, or None."""
        raise NotImplementedError
