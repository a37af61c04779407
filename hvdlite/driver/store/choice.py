"""Which store a --checkpoint-dir job's drivers share: `--driver-store`.

None (the default) is the FileStore in --checkpoint-dir, for drivers on one machine or on hosts
that share a filesystem with working flock; `etcd://HOST[:PORT],...[/PREFIX]` is an etcd cluster,
for a standby driver on another host (`etcds://` over TLS, with etcdctl's ETCDCTL_ variables:
etcd.py). An etcd store keeps one job's keys under PREFIX, by default `/hvdlite` followed by the
--checkpoint-dir path, so the same command on any host finds the same job.
"""
from typing import Optional

from hvdlite.driver.store import Store
from hvdlite.driver.store.etcd import EtcdStore
from hvdlite.driver.store.filestore import FileStore
from hvdlite.errors import JobError, UsageError
from hvdlite.worker import beacon


def check(url: str) -> str:
    """`url` when it names a store this process can speak to (its TLS files load, its user has
    a password), else a UsageError saying why; nothing is asked of the store yet."""
    _etcd(url, "/", UsageError)
    return url


def _etcd(url: str, prefix: str, error) -> EtcdStore:
    try:
        return EtcdStore(url, prefix=prefix)
    except ValueError as e:
        raise error(f"--driver-store: {e}") from None


def open_store(url: Optional[str], checkpoint_dir: str) -> Store:
    """The store `url` names (check() let it through); None: the FileStore in the driver
    folder of --checkpoint-dir."""
    if url is None:
        return FileStore(beacon.folder(checkpoint_dir))
    return _etcd(url, "/hvdlite" + checkpoint_dir, JobError)  # a file check() read may be gone since
