"""A standby driver: its flags, its wait for the job's lease, and one real take-over through
the etcd test cluster."""
import base64
import json
import os
import signal
import sys
import threading
import time
import urllib.request

import pytest

from hvdlite import exitcodes
from hvdlite.cli import parse_settings
from hvdlite.driver.launchers.ssh.adopted import AdoptedSSHWorker
from hvdlite.driver.launchers.ssh.connection import SSHError
from hvdlite.driver.leadership import Leadership, NotLeader
from hvdlite.driver.standby import lead
from hvdlite.driver.store import Lease
from hvdlite.driver.store.etcd import EtcdStore, Unreachable
from hvdlite.driver.store.filestore import FileStore
from hvdlite.errors import UsageError
from hvdlite.worker import beacon
from jobs import SCRIPTS, Job, progress, wait_until


def test_the_flags(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    s = parse_settings(["--min-np", "1", "--checkpoint-dir", ckpt, "--standby",
                        "--driver-store", "etcd://10.0.0.1,10.0.0.2:32379/jobs/7", "true"])
    assert s.standby and s.driver_store == "etcd://10.0.0.1,10.0.0.2:32379/jobs/7"
    s = parse_settings(["--min-np", "1", "--checkpoint-dir", ckpt, "true"])
    assert not s.standby and s.driver_store is None
    with pytest.raises(UsageError, match="--standby is for an elastic --checkpoint-dir job"):
        parse_settings(["--checkpoint-dir", ckpt, "--standby", "true"])
    for flags, said in ((["--standby"], "--standby is for an elastic --checkpoint-dir job"),
                        (["--driver-store", "etcd://h1"], "--driver-store is for an elastic --checkpoint-dir"),
                        (["--checkpoint-dir", ckpt, "--driver-store", "h1:2379"], "expected etcd://HOST"),
                        (["--checkpoint-dir", ckpt, "--driver-store", "etcd://h1:port"], "'h1:port' is not HOST")):
        with pytest.raises(UsageError, match=said):
            parse_settings(["--min-np", "1", *flags, "true"])


def test_a_waiting_standby_ends_on_sigterm(tmp_path):
    """Nothing started, nothing to stop: it says why it ends and exits 128 + 15."""
    ckpt = tmp_path / "ckpt"
    FileStore(beacon.folder(str(ckpt))).acquire("elsewhere:1:2", 60)
    with Job(["--min-np", "1", "--checkpoint-dir", str(ckpt), "--standby", "true"], tmp_path) as standby:
        wait_until(lambda: "elsewhere:1:2 leads the job (lease 1)" in Job.read(standby.err), 30, "the wait")
        standby.proc.send_signal(signal.SIGTERM)
        r = standby.finish(10)
    assert r.code == 128 + signal.SIGTERM and r.stderr.strip().splitlines()[-1] == "hvdlite: job interrupted by SIGTERM", r.stderr


class Host:
    """An SSHHost that records the scripts it was asked to run; `cut`: it cannot be reached."""

    def __init__(self, cut=False):
        self.scripts, self.cut = [], cut

    def run(self, script, timeout=None):
        self.scripts.append(script)
        if self.cut:
            raise SSHError("host-1: remote command timed out after 10 s")
        return 0, "", ""


def test_a_taken_over_worker_on_an_ssh_host_ends_when_it_says_so_or_once_killed():
    said = []
    worker = AdoptedSSHWorker(Host(), 42, lambda: said[0] if said else None, output=None, files={})
    assert worker.poll() is None and worker.pid == 42
    said.append(79)
    assert worker.poll() == 79 and worker.wait(1) == 79
    host = Host()
    worker = AdoptedSSHWorker(host, 42, lambda: None, output=None, files={})
    worker.stop(grace=0.1)  # it says nothing: TERM, then KILL, and it is counted ended
    assert worker.poll() == -signal.SIGKILL
    assert [s.split(" 2>")[0] for s in host.scripts] == ["kill -s TERM -- -42", "kill -s KILL -- -42"]
    cut = AdoptedSSHWorker(Host(cut=True), 42, lambda: None, output=None, files={})
    cut.signal(signal.SIGKILL)  # its host cannot be reached: judged gone all the same
    assert cut.poll() == -signal.SIGKILL


def taker(store, owner):
    """Leadership.take's part in these tests: the store's lease, else NotLeader."""
    def take():
        return store.acquire(owner, 60) or _refuse()
    return take


def _refuse():
    raise NotLeader("held")


def test_a_standby_waits_while_the_lease_is_held_and_takes_it_once_it_is_free(tmp_path):
    store = FileStore(str(tmp_path / "store"))
    lease = store.acquire("host-4:123", 60)
    said, got = [], []
    standby = threading.Thread(target=lambda: got.append(lead(taker(store, "host-5:456"), store, said.append,
                                                               poll=0.01)))
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
    assert got == [Lease("host-5:456", 2)] and store.holder() == got[0]


class Flaky:
    """A store that does not answer, then names a holder, then has none."""

    def __init__(self):
        self.answers = [Unreachable("no etcd member answered"), Unreachable("no etcd member answered"),
                        Lease("a", 3), Lease("a", 3), None]

    def acquire(self, owner, ttl):
        if isinstance(self.answers[0], Exception):
            raise self.answers.pop(0)
        if self.answers[0] is None:
            return Lease(owner, 4)
        return None

    def holder(self):
        return self.answers.pop(0)


def test_a_standby_says_once_that_the_store_does_not_answer_and_waits_on():
    said, store = [], Flaky()
    assert lead(taker(store, "b"), store, said.append, poll=0) == Lease("b", 4)
    assert said == ["standby: the store does not answer (no etcd member answered); waiting",
                    "standby: a leads the job (lease 3); this driver takes it over when that lease lapses",
                    "standby: the lease lapsed; this driver takes the job over"]
    stopped = []
    assert lead(taker(Flaky(), "b"), Flaky(), stopped.append, stopped=lambda: True) is None and stopped == []


def test_with_the_etcd_majority_lost_nobody_decides_and_the_last_journal_stays(etcd_cluster, tmp_path):
    """Two of the three members killed under the active driver: it cannot renew and stops
    deciding once its time to live ran out, and no other driver gets a lease meanwhile; with
    the majority back, the next driver takes lease 2 and reads the journal written last."""
    ckpt, where = str(tmp_path / "ckpt"), "/hvdlite-majority" + str(tmp_path)
    active = Leadership.take(ckpt, 2.0, 0.0, EtcdStore(etcd_cluster.url, where, timeout=0.5))
    active.take_secret(adopting=False)
    active.record({"adoptable": True, "round": 7})
    assert active.flush()
    lost = etcd_cluster.names[1:]
    for name in lost:
        etcd_cluster.kill(name)
    try:
        with pytest.raises(NotLeader, match="could not renew its lease 1"):
            active.keep(2.1)  # no renewal for its time to live: no decision
        with pytest.raises(Unreachable):
            EtcdStore(etcd_cluster.url, where, timeout=0.5).acquire("another", 2.0)
    finally:
        for name in lost:
            etcd_cluster.start(name)
    deadline = time.monotonic() + 30  # the old lease lapses once a leader is back
    while True:
        try:
            nxt = Leadership.take(ckpt, 2.0, 0.0, EtcdStore(etcd_cluster.url, where))
            break
        except NotLeader:
            assert time.monotonic() < deadline, "lease 1 never lapsed"
            time.sleep(0.2)
    assert nxt.epoch == 2 and nxt.journal() == {"adoptable": True, "round": 7}


# ---- one real take-over ----------------------------------------------------------------------
JOB = [os.path.join(SCRIPTS, "determinism_job.py")]


def test_a_standby_takes_the_job_over_when_the_drivers_host_is_cut_off(etcd_cluster, tmp_path):
    """The active driver runs in host-4's network namespace, the standby in host-5's, their
    workers on host-1 and host-2 over SSH, the lease in etcd. host-4 is cut off: its lease lapses,
    the standby takes it and the same worker processes over, and they train on; the old driver
    cannot renew and stops deciding (exit NOT_LEADER) without touching them or blaming a host; the standby finishes
    the job. Nothing in etcd holds the job's secret."""
    hosts = etcd_cluster.hosts
    ckpt, log_dir, first, second = (tmp_path / name for name in ("ckpt", "log", "first", "second"))
    for folder in (log_dir, first, second):
        folder.mkdir()
    flags = ["-np", "2", "--min-np", "2", "--max-np", "2", "-H", "host-1:1,host-2:1", "--ssh-config",
             hosts.ssh_config, "--checkpoint-dir", str(ckpt),
             "--checkpoint-interval", "0", "--driver-store", etcd_cluster.url]
    # Held before step 30's commit until the standby took over: the job cannot end first.
    knobs = {"LOG_DIR": str(log_dir), "EPOCHS": "4", "WORKERS": "0", "STEP_SLEEP": "0.2", "HOLD_AT": "30"}

    def on(host):
        return ["nsenter", f"--net=/run/netns/{hosts.hosts[host].netns}"]

    active = Job([*flags, sys.executable, *JOB], first, knobs, prefix=on("host-4"))
    standby = None
    try:
        active.wait_for(lambda _: progress(log_dir) >= 3, 90)
        standby = Job([*flags, "--standby", sys.executable, *JOB], second, knobs, prefix=on("host-5"))
        wait_until(lambda: "leads the job (lease 1)" in Job.read(standby.err), 30, "the standby's wait")
        assert standby.proc.poll() is None and not standby.events()[1:], "the standby did something"
        hosts.partition("host-4")
        try:
            adopted = standby.wait_for(lambda events: any(e["event"] == "job_readopted" for e in events), 60)
            (log_dir / "go").touch()
            steps = progress(log_dir)
            wait_until(lambda: progress(log_dir) >= steps + 3, 30, "steps under the standby")
            old = active.finish(30)
        finally:
            hosts.heal("host-4")
        new = standby.finish(90)
    finally:
        for job in (active, standby):
            if job is not None:
                end(job, hosts)
    assert old.code == exitcodes.NOT_LEADER and "could not renew its lease 1" in old.stderr, old.stderr[-2000:]
    # Cut off, it took its silent probes for no lost node and blamed nobody (decisions/core.py in_doubt).
    assert not old.of("blacklisted"), old.of("blacklisted")
    assert [(e["lease"], e["members"]) for e in adopted if e["event"] == "job_adopted"] == \
        [(2, {"host-1/0": 0, "host-2/0": 1})]
    assert new.code == 0, new.stderr[-3000:]
    assert not new.of("worker_start") and sorted(e["code"] for e in new.of("worker_exit")) == [0, 0]
    assert "standby: the lease lapsed; this driver takes the job over" in new.stderr

    with open(os.path.join(beacon.folder(str(ckpt)), beacon.SECRET), "rb") as f:
        secret = f.read().strip()
    stored = b"".join(base64.b64decode(kv.get("key", "")) + base64.b64decode(kv.get("value", ""))
                      for kv in etcd_keys(etcd_cluster, "/hvdlite" + str(ckpt)))
    assert b"journal" in stored and secret not in stored and base64.b64encode(secret) not in stored


def end(job, hosts):
    """The driver's process group, then its workers on the test hosts (their pids are the
    hosts' own: Job.close would signal this machine's processes of those numbers)."""
    if job.proc.poll() is None:
        os.killpg(job.proc.pid, signal.SIGKILL)
        job.proc.wait(10)
    for e in job.events():
        if e["event"] == "worker_start":
            hosts.run(e["slot"].split("/")[0], f"kill -9 -- -{int(e['pid'])} 2>/dev/null")
    job.out.close()
    job.err.close()


def etcd_keys(cluster, prefix):
    """Every key and value under `prefix`, read straight from a member."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = json.dumps({"key": base64.b64encode(prefix.encode()).decode(),
                       "range_end": base64.b64encode(end.encode()).decode()}).encode()
    address = cluster.address[cluster.names[0]]
    request = urllib.request.Request(f"http://{address}:2379/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=5) as answer:
        return json.loads(answer.read()).get("kvs", [])
