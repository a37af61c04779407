"""The driver's store: one lease at a time, epochs that only grow, and writes fenced by the
newest lease. Each contract test runs against every store through the `stores` fixture."""
import os
import stat

import pytest

from hvdlite.driver.store import Fenced
from hvdlite.driver.store.filestore import FileStore


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def stores(tmp_path):
    """Two handles on one store (two drivers) and the clock that expires their leases."""
    clock = Clock()

    def expire(seconds):
        clock.now += seconds

    folder = str(tmp_path / "store")
    return FileStore(folder, clock), FileStore(folder, clock), expire


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


def test_the_folder_is_the_users_alone(stores):
    a, _, _ = stores
    a.put(a.acquire("a", 5), "journal", b"x")
    assert stat.S_IMODE(os.stat(a.folder).st_mode) == 0o700
    for name in os.listdir(a.folder):
        assert stat.S_IMODE(os.stat(os.path.join(a.folder, name)).st_mode) == 0o600
