"""A standby driver: its flags, and its wait for the job's lease."""
import threading

import pytest

from hvdlite.cli import parse_settings
from hvdlite.driver.standby import wait_for_lease
from hvdlite.driver.store import Lease
from hvdlite.driver.store.etcd import Unreachable
from hvdlite.driver.store.filestore import FileStore
from hvdlite.errors import UsageError


def test_the_flags(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    s = parse_settings(["--min-np", "1", "--checkpoint-dir", ckpt, "--standby",
                        "--driver-store", "etcd://10.0.0.1,10.0.0.2:32379/jobs/7", "true"])
    assert s.standby and s.driver_store == "etcd://10.0.0.1,10.0.0.2:32379/jobs/7"
    s = parse_settings(["--min-np", "1", "--checkpoint-dir", ckpt, "true"])
    assert not s.standby and s.driver_store is None
    for flags, said in ((["--standby"], "--standby is for a --checkpoint-dir job"),
                        (["--driver-store", "etcd://h1"], "--driver-store is for a --checkpoint-dir job"),
                        (["--checkpoint-dir", ckpt, "--driver-store", "h1:2379"], "expected etcd://HOST"),
                        (["--checkpoint-dir", ckpt, "--driver-store", "etcd://h1:port"], "'h1:port' is not HOST")):
        with pytest.raises(UsageError, match=said):
            parse_settings(["--min-np", "1", *flags, "true"])


def test_a_standby_waits_while_the_lease_is_held_and_returns_once_it_is_free(tmp_path):
    store = FileStore(str(tmp_path / "store"))
    lease = store.acquire("host-4:123", 60)
    said = []
    standby = threading.Thread(target=wait_for_lease, args=(store, said.append), kwargs={"poll": 0.01})
    standby.start()
    try:
        standby.join(0.3)
        assert standby.is_alive()
        assert said == ["standby: host-4:123 leads the job (lease 1); this driver takes it over when "
                        "that lease lapses"]
    finally:
        store.release(lease)
        standby.join(10)
    assert not standby.is_alive() and said[-1] == "standby: the lease lapsed; this driver takes the job over"
    assert store.acquire("host-5:456", 60).epoch == 2


class Flaky:
    """A store that does not answer, then names a holder, then has none."""

    def __init__(self):
        self.answers = [Unreachable("no etcd member answered"), Unreachable("no etcd member answered"),
                        Lease("a", 3), Lease("a", 3), None]

    def holder(self):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_standby_says_once_that_the_store_does_not_answer_and_waits_on():
    said = []
    wait_for_lease(Flaky(), said.append, poll=0)
    assert said == ["standby: the store does not answer (no etcd member answered); waiting",
                    "standby: a leads the job (lease 3); this driver takes it over when that lease lapses",
                    "standby: the lease lapsed; this driver takes the job over"]
    stopped = []
    wait_for_lease(Flaky(), stopped.append, stopped=lambda: True)
    assert stopped == []
