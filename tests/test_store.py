"""The driver's store: one lease at a time, epochs that only grow, and writes fenced by the
newest lease. Each contract test runs against every store through the `stores` fixture: the
FileStore, and the EtcdStore on the real three-member etcd test cluster."""
import os
import select
import stat
import subprocess
import sys
import time
import uuid

import pytest

from hvdlite.driver.store import Fenced
from hvdlite.driver.store.etcd import EtcdStore, parse
from hvdlite.driver.store.filestore import FileStore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture(params=["file", "etcd"])
def stores(request, tmp_path):
    """Two handles on one store (two drivers) and what expires their lease: the FileStore's
    clock moved on, or etcd's lease revoked as its expiry would (expiry by its own ttl:
    test_a_partitioned_driver_loses_its_lease_and_is_fenced_once_healed)."""
    if request.param == "file":
        clock = Clock()

        def expire(seconds):
            clock.now += seconds

        folder = str(tmp_path / "store")
        return FileStore(folder, clock), FileStore(folder, clock), expire
    url, where = request.getfixturevalue("etcd_cluster").url, prefix(request)
    a, b = EtcdStore(url, where), EtcdStore(url, where)

    def expire(seconds):
        a._revoke(a._range("leader")["lease"])

    return a, b, expire


def prefix(request):
    """A job's own keys in the shared cluster."""
    return f"/hvdlite-test/{request.node.name}-{uuid.uuid4().hex[:8]}"


def test_one_lease_at_a_time_and_a_lost_lease_writes_nothing(stores):
    a, b, expire = stores
    first = a.acquire("a", 5)
    assert first.epoch == 1 and b.acquire("b", 5) is None and b.holder() == first
    a.put(first, "journal", b"one")
    assert b.get("journal") == b"one"
    expire(6)  # a stalls past its lease: b takes over
    second = b.acquire("b", 5)
    assert second.epoch == 2
    assert not a.renew(first, 5)
    with pytest.raises(Fenced):
        a.put(first, "journal", b"stale")
    assert b.get("journal") == b"one"


def test_a_released_lease_is_taken_at_once_with_a_greater_epoch(stores):
    a, b, _ = stores
    first = a.acquire("a", 60)
    assert a.renew(first, 60)
    a.release(first)
    assert b.holder() is None
    assert b.acquire("b", 60).epoch == first.epoch + 1


def test_the_folder_is_the_users_alone(tmp_path):
    a = FileStore(str(tmp_path / "store"))
    a.put(a.acquire("a", 5), "journal", b"x")
    assert stat.S_IMODE(os.stat(a.folder).st_mode) == 0o700
    for name in os.listdir(a.folder):
        assert stat.S_IMODE(os.stat(os.path.join(a.folder, name)).st_mode) == 0o600


def test_a_lease_that_expired_with_nobody_after_it_is_still_the_newest(stores):
    a, b, expire = stores
    first = a.acquire("a", 60)
    expire(61)
    assert b.holder() is None
    assert a.renew(first, 60) and b.holder() == first and b.acquire("b", 60) is None
    a.put(first, "journal", b"still mine")
    assert b.get("journal") == b"still mine"


def test_etcd_urls():
    assert parse("etcd://h1:2379,h2,10.0.0.3:32379") == (
        ["http://h1:2379", "http://h2:2379", "http://10.0.0.3:32379"], None)
    assert parse("etcd://h1/jobs/7/") == (["http://h1:2379"], "/jobs/7")
    assert EtcdStore("etcd://h1/jobs/7", "/default").prefix == "/jobs/7/"
    assert EtcdStore("etcd://h1/", "/default").prefix == "/default/"
    for bad in ("h1:2379", "etcd://", "etcd://h1:x", "etcd://h1:0", "etcd://h1,/p", "etcd://:2379"):
        with pytest.raises(ValueError):
            parse(bad)


def test_with_a_member_killed_the_store_still_works(etcd_cluster, request):
    store = EtcdStore(etcd_cluster.url, prefix(request))
    first = etcd_cluster.names[0]  # the member every handle asks first
    etcd_cluster.kill(first)
    try:
        lease = store.acquire("a", 5)
        store.put(lease, "journal", b"x")
        assert store.get("journal") == b"x" and store.holder() == lease and store.renew(lease, 5)
    finally:
        etcd_cluster.start(first)


# A driver in host-4's network namespace: takes the lease, then renews or writes when told.
DRIVER = """
import sys
from hvdlite.driver.store import Fenced
from hvdlite.driver.store.etcd import EtcdStore, Unreachable
store = EtcdStore(sys.argv[1], sys.argv[2], timeout=0.5)
lease = store.acquire("cut", 2)
print(lease.epoch, flush=True)
for line in sys.stdin:
    try:
        if line.strip() == "renew":
            print(store.renew(lease, 2), flush=True)
        else:
            store.put(lease, "journal", b"stale")
            print("written", flush=True)
    except Fenced:
        print("fenced", flush=True)
    except Unreachable:
        print("unreachable", flush=True)
"""


def test_a_partitioned_driver_loses_its_lease_and_is_fenced_once_healed(etcd_cluster, request):
    hosts, url, where = etcd_cluster.hosts, etcd_cluster.url, prefix(request)
    driver = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{hosts.hosts['host-4'].netns}", sys.executable, "-c", DRIVER, url, where],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})

    def answer(command=None):
        if command:
            driver.stdin.write(command + "\n")
            driver.stdin.flush()
        ready, _, _ = select.select([driver.stdout], [], [], 30)
        assert ready, f"the driver did not answer {command}"
        return driver.stdout.readline().strip()

    try:
        assert answer() == "1"
        standby = EtcdStore(url, where)
        assert standby.acquire("standby", 2) is None
        hosts.partition("host-4")
        try:
            assert answer("renew") == "unreachable"
            deadline = time.monotonic() + 15
            while (lease := standby.acquire("standby", 2)) is None:  # the cut driver's ttl runs out
                assert time.monotonic() < deadline
                time.sleep(0.1)
            standby.put(lease, "journal", b"new")
        finally:
            hosts.heal("host-4")
        assert lease.epoch == 2
        assert answer("renew") == "False" and answer("put") == "fenced"
        assert standby.get("journal") == b"new" and standby.holder() == lease
    finally:
        driver.kill()
        driver.wait(10)
