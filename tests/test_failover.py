"""The driver can die and come back while training goes on (--checkpoint-dir, docs/failover.md).

One real job carries the costly checks: a second driver started beside a live one is refused,
kill -9 of the driver leaves the workers training (and printing) without one, the same command
run again takes the same processes over, and the job ends with the parameters of a fault-free
run. The rest are decisions and one small torch-free worker: in-process where they can be.
"""
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from hvdlite import exitcodes, procstat
from hvdlite.driver.decisions import adoption
from hvdlite.driver.decisions.core import ElasticCore
from hvdlite.driver.decisions.messages import Heartbeats, Log, Ready
from hvdlite.driver.decisions.policy import Policy
from hvdlite.driver.decisions.workers import Phase
from hvdlite.driver.leadership import Leadership, NotLeader
from hvdlite.driver.store.filestore import FileStore
from hvdlite.worker import beacon, checkpointdir, durable, env
from hvdlite.worker.kvclient import KVClient
from hvdlite.worker.session import Session
from jobs import (PRELOADED, SCRIPTS, Job, check_training_continuous as check_continuous, job_env, progress, run_job,
                  sizes, wait_until)
from test_core import first_world
from test_numpy_backend import JOB as NUMPY_JOB, check_training_continuous as check_numpy, needs_pygloo

JOB = [sys.executable, os.path.join(SCRIPTS, "determinism_job.py")]
ARGS = ["--liveness-timeout", "2", "-np", "2", "--min-np", "2", "--max-np", "2", "-H", "localhost:2"]
KNOBS = {"EPOCHS": "3", "WORKERS": "0"}  # 12 steps an epoch, then the epoch's own commit


def test_kill_9_of_the_driver_then_the_same_command_takes_the_live_workers_over(tmp_path):
    """What no restart can give: the same worker processes before and after, steps taken while
    no driver ran, nothing lost, every line they printed meanwhile relayed, and the final
    parameters of a run with no fault (ranks stay, so gloo sums in the same order)."""
    log_dir, reference, first, second, third = (tmp_path / name for name in ("log", "reference", "first", "second",
                                                                            "third"))
    for folder in (log_dir, reference, first, second, third):
        folder.mkdir()
    args = [*ARGS, "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", "0", *JOB]
    # The last epoch's own commit waits for the test's go: the job outlives the take-over.
    knobs = {"LOG_DIR": str(log_dir), **KNOBS, "STEP_SLEEP": "0.05", "HOLD_AT": "epoch2"}
    # The fault-free run beside it (its imports overlap the other's).
    with Job([*ARGS, *JOB], reference, {"LOG_DIR": str(reference), **KNOBS, "STEP_SLEEP": "0"}) as fault_free, \
            Job(args, first, knobs) as a:
        a.wait_for(lambda _: progress(log_dir) >= 5, 90)
        # A second driver of the same folder while the first runs: refused, the job untouched.
        beside = run_job(args, second, timeout=60, env=knobs)
        assert beside.code == exitcodes.NOT_LEADER, beside.stderr
        assert "another driver runs the job of --checkpoint-dir" in beside.stderr
        pids = {e["slot"]: e["pid"] for e in a.events() if e["event"] == "worker_start"}
        a.proc.kill()
        a.proc.wait(10)
        killed_at = progress(log_dir)
        # Past an epoch's end: its line is printed while no driver reads the pipes.
        wait_until(lambda: progress(log_dir) >= max(killed_at + 3, 14), 60, "steps while no driver runs")
        with Job(args, third, knobs) as b:
            b.wait_for(lambda events: any(e["event"] == "job_readopted" for e in events), 60)
            (log_dir / "go").touch()
            r = b.finish(120)
        done = fault_free.finish(120)
    assert done.code == 0, done.stderr[-3000:]
    expected = json.loads((reference / "final.json").read_text())
    assert r.code == 0, r.stderr[-3000:]
    assert r.of("job_adopted")[0]["pids"] == pids, "not the same worker processes"
    assert not r.of("worker_start") and not r.of("round_complete"), "a worker was started, or the world re-formed"
    assert [e["members"] for e in r.of("job_adopted")] == [{"localhost/0": 0, "localhost/1": 1}]
    assert r.of("job_readopted"), "the taken-over workers never beat to the new driver"
    assert sorted(e["code"] for e in r.of("worker_exit")) == [0, 0]
    got = json.loads((log_dir / "final.json").read_text())
    assert got["hash"] == expected["hash"], "parameters or momentum differ from the fault-free run"
    printed = (first / "driver.out").read_text() + r.stdout
    assert all(f"EPOCH {e} exactly-once" in printed for e in range(3)), printed


@needs_pygloo
def test_numpy_workers_train_on_without_a_driver_and_are_taken_over(tmp_path):
    """The numpy backend through the driver's kill -9: the same processes train on, are taken
    over, and train what a run with no fault trains. After the take-over a rank waits in an
    allreduce, pygloo holding its GIL, past --liveness-timeout (its peer is slow): its stand-in
    process beats for it, to the new driver, so it is not taken for hung."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    args = [*ARGS, "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", "0", *NUMPY_JOB]
    knobs = job_env(tmp_path, TOTAL_STEPS=30, STEP_SLEEP=0.05, HOLD_AT=25, SLOW="localhost/0:27:4")
    with Job(args, first, knobs) as a:
        a.wait_for(lambda _: progress(tmp_path) >= 5, 90)
        pids = {e["slot"]: e["pid"] for e in a.events() if e["event"] == "worker_start"}
        a.proc.kill()
        a.proc.wait(10)
        killed_at = progress(tmp_path)
        wait_until(lambda: progress(tmp_path) >= killed_at + 3, 60, "steps while no driver runs")
        with Job(args, second, knobs) as b:
            b.wait_for(lambda events: any(e["event"] == "job_readopted" for e in events), 60)
            (tmp_path / "go").touch()
            r = b.finish(120)
    assert r.code == 0, r.stderr[-3000:]
    assert r.of("job_adopted")[0]["pids"] == pids, "not the same worker processes"
    assert not r.of("worker_start") and not r.of("round_complete"), "a worker was started, or the world re-formed"
    assert sorted(e["code"] for e in r.of("worker_exit")) == [0, 0] and not r.of("worker_unresponsive")
    assert sizes(check_numpy(tmp_path, 30)) == [2]


# ---- without a driver for the grace: today's end ------------------------------------------
ELASTIC_JOB = [sys.executable, os.path.join(SCRIPTS, "elastic_job.py")]


def test_rank_0_killed_while_no_driver_runs_its_survivor_writes_the_newest_commit_at_the_grace_end(tmp_path):
    """kill -9 of the driver, then of rank 0 while none runs; no driver comes within the grace.
    The survivor exits 75, writing the commit it holds first: rank 0's writer wrote only the
    first commit (--checkpoint-interval 600) and died with the rest. The rerun resumes from it."""
    held = 6  # every worker waits at this step, its commit made, until the test's go
    ckpt, first, second = tmp_path / "ckpt", tmp_path / "run1", tmp_path / "run2"
    first.mkdir()
    second.mkdir()
    args = [*ARGS, *PRELOADED, "--driver-grace", "3", "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "600",
            *ELASTIC_JOB]
    knobs = job_env(tmp_path, TOTAL_STEPS=10, STEP_SLEEP=0, HOLD_AT=held, NOISE=1)
    with Job(args, first, {**knobs, "RUN": "1"}) as a:
        wait_until(lambda: all((tmp_path / f"held.localhost_{i}").exists() for i in (0, 1)), 90, "both held")
        (world,) = [e for e in a.events() if e["event"] == "round_complete"]
        started = {e["slot"]: e for e in a.events() if e["event"] == "worker_start"}  # the last launch of each
        rank0, survivor = sorted(world["members"], key=world["members"].get)
        a.proc.kill()
        a.proc.wait(10)
        os.killpg(started[rank0]["pid"], signal.SIGKILL)
        (tmp_path / "go").touch()  # the survivor's next allreduce fails: it rolls back to its commit
        wait_until(lambda: procstat.identity(started[survivor]["pid"]) is None, 60, "the survivor's exit")
    word = beacon.output_path(str(ckpt), started[survivor]["worker"], "exit")
    assert open(word).read() == str(exitcodes.LOST_DRIVER)
    # Rank 0's writer wrote commit 1 at most (or was writing it when killed).
    assert checkpointdir.newest(str(ckpt))[0] == held and {c for c, _ in checkpointdir.files(str(ckpt))} <= {1, held}
    with Job(args, second, {**knobs, "RUN": "2"}) as b:
        r = b.finish(120)
    assert r.code == 0, r.stderr[-3000:]
    assert f"resumed from commit {held} (" in r.stdout + r.stderr
    records = check_continuous(tmp_path, 10)
    assert min(rec["step"] for rec in records if rec["run"] == 2) == held
    # Each rank's own generator (per-rank state) goes on from that rank's, bitwise, though rank 1
    # wrote the commit: what a fault-free run draws.
    import torch
    draws = {rank: [torch.rand(1, generator=g).item() for _ in range(10)]
             for rank, g in ((r, torch.Generator().manual_seed(100 + r)) for r in (0, 1))}
    assert all(rec["noise"] == draws[rec["rank"]][rec["step"]] for rec in records)


WORKER = """
import sys, time
from hvdlite.worker.session import session
s = session()
for i in range(400):
    print("step", i, flush=True)
    time.sleep(0.02)
"""


def test_a_worker_trains_on_without_a_driver_for_the_grace_then_exits_75(tmp_path):
    """No driver ever answers (a port nobody serves): it goes on printing past the liveness
    timeout, for --driver-grace, then exits 75 as a worker without --checkpoint-dir does at
    the liveness timeout (its newest commit is written first: durable.finish, as before)."""
    environ = {**os.environ, env.RENDEZVOUS_ADDR: "127.0.0.1", env.RENDEZVOUS_PORT: "9", env.SECRET: "s" * 32,
               env.WORKER: "localhost/0#1", env.ELASTIC: "1", env.LIVENESS_TIMEOUT: "1",
               env.DRIVER_GRACE: "3", env.CHECKPOINT_DIR: str(tmp_path)}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", WORKER], env=environ, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    assert done.returncode == exitcodes.LOST_DRIVER, done.stderr
    assert "training on without it for up to 3 s" in done.stderr and "for 3 s; exiting" in done.stderr
    assert took >= 3 and done.stdout.count("step") > 60, (took, done.stdout.count("step"))
    # Its code is left for a driver that takes the job over, as is that of one that finished.
    word = beacon.output_path(str(tmp_path), "localhost/0#1", "exit")
    assert open(word).read() == str(exitcodes.LOST_DRIVER)
    finished = subprocess.run([sys.executable, "-c", "from hvdlite.worker.session import session; session()"],
                              env={**environ, env.WORKER: "localhost/1#1"}, timeout=60)
    assert finished.returncode == 0
    assert open(beacon.output_path(str(tmp_path), "localhost/1#1", "exit")).read() == "0"


def test_a_last_write_goes_only_into_its_own_generations_folder_once_and_after_a_live_writer(tmp_path):
    """What the grace's end writes (durable.finish with a fence), in-process: nothing where this
    host sees no beacon of the job (another host's folder: none is made), nor into a folder a
    newer driver took over; a commit the folder holds already is not written again, and a
    survivor waits for the lock a live rank 0's write holds, then finds its commit there."""
    lineage, secret = "0" * 20, "s" * 32
    watch = beacon.Watch(str(tmp_path), secret)

    def last_write(commit, accepted, timeout=10.0):
        writer = durable.Writer(durable.Config(str(tmp_path), interval=0, keep=2),
                                fence=lambda: (watch.epoch(), accepted))
        writer.offer(lineage, commit, {"c": commit})
        return writer.flush(timeout, last=True)

    assert last_write(3, accepted=1) and os.listdir(tmp_path) == []  # no beacon here: nothing made
    os.makedirs(beacon.folder(str(tmp_path)))
    beacon.publish(str(tmp_path), secret, 2, "127.0.0.1", 1)
    assert last_write(3, accepted=1) and checkpointdir.newest(str(tmp_path)) is None  # a newer driver's
    assert last_write(3, accepted=2) and checkpointdir.newest(str(tmp_path))[0] == 3
    first = os.stat(checkpointdir.newest(str(tmp_path))[2]).st_ino
    assert last_write(3, accepted=2) and os.stat(checkpointdir.newest(str(tmp_path))[2]).st_ino == first
    with durable._locked(str(tmp_path)):  # rank 0's writer, writing commit 4
        assert not last_write(4, accepted=2, timeout=0.3)
        checkpointdir.write(str(tmp_path), lineage, 4, {"c": 4}, keep=2)
        written = os.stat(checkpointdir.newest(str(tmp_path))[2]).st_ino
    assert last_write(4, accepted=2) and os.stat(checkpointdir.newest(str(tmp_path))[2]).st_ino == written


def test_a_process_forked_during_a_write_does_not_keep_the_commits_lock(tmp_path):
    """A DataLoader's workers are forked (Linux's default) while rank 0's writer may be writing:
    each child holds a copy of the lock's descriptor, so closing the writer's own did not free
    the lock until the child ended (a persistent loader's: never), and every later write (rank 0's
    next, a survivor's last) waited on it for good."""
    os.makedirs(beacon.folder(str(tmp_path)))
    with durable._locked(str(tmp_path)):
        child = os.fork()
        if child == 0:  # a loader's worker: lives on past the write
            time.sleep(30)
            os._exit(0)
    try:
        fd = os.open(os.path.join(beacon.folder(str(tmp_path)), durable.LOCK), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while the child holds the lock
        finally:
            os.close(fd)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


class _Exited(Exception):
    pass


def test_a_driver_that_publishes_during_the_last_beat_of_the_grace_takes_the_worker_over(tmp_path, monkeypatch):
    """A rerun whose beacon appears during a worker's last beat of the grace (between its last
    look at the beacon and the grace's end): the worker goes over to it. Exiting instead, its
    last write fenced out by that beacon, it would lose the commit it held (rank 0 dead) while
    the new driver, finding no worker left, resumes from the older one on disk."""
    secret, ckpt = "s" * 32, str(tmp_path)
    os.makedirs(beacon.folder(ckpt))
    beacon.publish(ckpt, secret, 1, "127.0.0.1", 1)
    monkeypatch.setenv(env.CHECKPOINT_DIR, ckpt)
    monkeypatch.setattr(durable, "_held", ("0" * 20, 6, {"c": 6}))
    monkeypatch.setattr(durable, "_writer", None)
    monkeypatch.setattr("hvdlite.worker.session.rescue.check", lambda: None)
    monkeypatch.setattr("hvdlite.worker.session.os._exit", lambda code: (_ for _ in ()).throw(_Exited(code)))
    worker = Session.__new__(Session)
    worker.grace, worker.liveness_timeout, worker.interval = 0.3, 0.1, 0.01
    worker.worker, worker.commits, worker.epoch, worker.addr, worker.port = "localhost/1#1", 6, 1, "127.0.0.1", 1
    worker._watch, worker._take = beacon.Watch(ckpt, secret), lambda body: body is not None
    worker._leave_word = lambda code: None
    start, switched = time.monotonic(), []

    class Beats:  # a dead driver's: no answer; the rerun publishes during the beat past the grace
        def beat(self, *args, **kwargs):
            if time.monotonic() - start > worker.grace and not switched:
                beacon.publish(ckpt, secret, 2, "127.0.0.1", 2)
            return None
    worker._beats = Beats()

    def switch(epoch, addr, port):
        switched.append(epoch)
        raise _Exited("switched")
    worker._switch = switch
    with pytest.raises(_Exited):
        worker._beat()
    assert switched == [2] or checkpointdir.newest(ckpt) is not None, "commit 6 lost: exited fenced out, unwritten"


def test_any_rank_takes_the_snapshot_rank_0_would_write():
    """A survivor of rank 0 writes rank 0's own parts (its per-rank objects, its gradients not
    reduced yet), as the commit's parts by rank hold them; its own would differ."""
    import torch
    from hvdlite.torch.elastic import TorchState
    model = torch.nn.Linear(2, 1)
    state = TorchState(model, noise=torch.Generator().manual_seed(1), step=3)
    own = state._snapshot()[1]
    state._every_rank = [{"generators": "rank 0's", "handlers": {"noise": "rank 0's"}, "grads": "rank 0's"},
                         {"generators": "rank 1's", "handlers": {"noise": "rank 1's"}, "grads": "rank 1's"}]
    snapshot = state._snapshot()[1]
    assert snapshot["handlers"]["noise"] == snapshot["gradients"]["grads"] == "rank 0's" != own["handlers"]["noise"]
    assert snapshot["handlers"]["model"] is own["handlers"]["model"] and snapshot["values"] == {"step": 3}


# ---- the journal and the take-over, in-process ----------------------------------------------
def test_the_journal_gives_a_new_driver_the_world_that_was_there():
    sim, ids = first_world([("a", 2), ("b", 1)], durable=True, cooldown_range=(10.0, 10.0))
    sim.send(Heartbeats(tuple((w, 7) for w in ids)))
    sim.core.blacklist.add("c", sim.now)
    saved = json.loads(json.dumps(adoption.journal(sim.core, sim.now)))
    new = adoption.adopt(ElasticCore(sim.core.policy), saved, 500.0)
    assert {w: (new.workers[w].slot, p.rank) for w, p in new.world.items()} == \
        {w: (sim.core.workers[w].slot, p.rank) for w, p in sim.core.world.items()}
    assert all(new.workers[w].phase is Phase.TRAINING for w in ids) and new.staying == set(ids)
    assert new.launches == sim.core.launches and new.round == 1 and new.ledger.newest == 7
    assert new.blacklist.blocked("c", 505.0) and not new.blacklist.blocked("c", 511.0)
    # A member that lost its peer while no driver ran asks the new one: the world re-forms.
    out = new.handle(Ready(ids[0], 1, 7, True), 500.1)
    assert any(isinstance(a, Log) and a.event == "round_broken" for a in out)


def test_a_driver_whose_lease_was_taken_decides_nothing_and_workers_refuse_it(tmp_path):
    """A driver paused past its lease (or cut off) while another took the job over: its next
    renewal and journal write raise NotLeader, and a worker that accepted the newer driver
    refuses the old one's answers."""
    clock = [1000.0]
    store = FileStore(str(tmp_path / "store"), clock=lambda: clock[0])
    old = Leadership.take(str(tmp_path), ttl=2.0, now=0.0, store=store)
    old.take_secret(adopting=False)
    old.record({"round": 1})
    assert old.flush()
    with pytest.raises(NotLeader, match="another driver runs the job"):
        Leadership.take(str(tmp_path), ttl=2.0, now=0.0, store=store)  # its owner (this process) lives
    clock[0] += 3.0  # the old driver did not renew: its lease lapsed
    new = Leadership.take(str(tmp_path), ttl=2.0, now=3.0, store=store)
    assert new.epoch == old.epoch + 1 and new.journal() == {"round": 1}
    with pytest.raises(NotLeader):
        old.keep(10.0)
    old.record({"round": 2})  # a journal write of the fenced driver: refused by the store
    assert old.flush()
    with pytest.raises(NotLeader):
        old.keep(10.1)
    assert new.journal() == {"round": 1}
    assert not adoption.may_decide(False, 9.0, 10.0, 2.0) and not beacon.accepts(old.epoch, new.epoch)

    worker = Session.__new__(Session)
    worker.epoch, worker.broken, worker.worker, worker.stack_asked, worker.on_round_broken = new.epoch, 0, "w", False, None
    assert not worker._take(json.dumps({"updates": 5, "broken": 3, "epoch": old.epoch}).encode())
    assert worker.broken == 0
    assert worker._take(json.dumps({"updates": 5, "broken": 3, "epoch": new.epoch}).encode()) and worker.broken == 3


def test_the_secret_stays_in_a_0600_file_and_a_planted_beacon_is_refused(tmp_path):
    earlier = beacon.output_path(str(tmp_path), "localhost/0#1", "stdout")
    os.makedirs(os.path.dirname(earlier))
    open(earlier, "w").close()  # an earlier job's: a new job's worker of that id must not append to it
    lead = Leadership.take(str(tmp_path), ttl=2.0, now=0.0)
    secret = lead.take_secret(adopting=False)
    assert not os.path.exists(earlier)
    lead.publish("127.0.0.1", 1234)
    folder = beacon.folder(str(tmp_path))
    assert os.stat(folder).st_mode & 0o777 == 0o700
    assert os.stat(os.path.join(folder, beacon.SECRET)).st_mode & 0o777 == 0o600
    assert all(secret.encode() not in open(os.path.join(folder, name), "rb").read()
               for name in os.listdir(folder) if name != beacon.SECRET)
    assert beacon.Watch(str(tmp_path), secret).newer(0) == (lead.epoch, "127.0.0.1", 1234)
    beacon.publish(str(tmp_path), "not the job's secret", 99, "10.0.0.9", 1)
    assert beacon.Watch(str(tmp_path), secret).newer(0) is None


def test_a_request_waiting_on_a_stopped_driver_goes_to_the_new_one_at_once():
    """A survivor waits in the rendezvous (a long-poll) on a driver that is stopped, not dead:
    its connection is open and silent. The switch cuts it and asks the new address."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    client = KVClient("127.0.0.1", silent.getsockname()[1], "s" * 32)
    failed = []

    def ask():
        try:
            client.request("GET", "/rdzv/assign", timeout=60)
        except ConnectionError as e:
            failed.append(str(e))
    waiting = threading.Thread(target=ask, daemon=True)
    waiting.start()
    time.sleep(0.2)
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nobody listens there: the new address refuses at once
    client.move("127.0.0.1", port)
    waiting.join(5)
    silent.close()
    assert failed and f"127.0.0.1:{port}" in failed[0], failed


def test_a_lease_left_by_a_dead_driver_of_this_host_is_taken_at_once(tmp_path):
    """kill -9 leaves the lease live for its time to live; its owner, a process of this host
    that no longer runs (pid and start time), can never renew it: the rerun need not wait."""
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    owner = f"{socket.gethostname()}:{procstat.identity(gone.pid)}"
    gone.kill()
    gone.wait()
    store = FileStore(str(tmp_path / "store"))
    assert store.acquire(owner, ttl=600.0).epoch == 1
    assert Leadership.take(str(tmp_path), ttl=600.0, now=0.0, store=store).epoch == 2


def test_a_rerun_refuses_while_the_last_drivers_workers_on_other_hosts_may_train(tmp_path):
    """Only workers on this machine and on SSH hosts are taken over: a fresh start beside an srun
    step's would race them (two generations writing one folder), so the rerun says so and ends
    until their grace is over."""
    from hvdlite.driver.eventlog import EventLog
    from hvdlite.driver.job import Job as Driver
    from hvdlite.driver.settings import Settings
    from hvdlite.errors import JobError
    last = Leadership.take(str(tmp_path), ttl=2.0, now=0.0)
    last.take_secret(adopting=False)
    last.record({"adoptable": True, "written_at": time.time(), "procs": {},
                 "workers": [{"id": "far/0#1", "host": "far", "phase": "training"}]})
    assert last.flush()
    last.store.release(last.lease)
    rerun = Driver(Settings(command=["true"], elastic=True, checkpoint_dir=str(tmp_path), driver_grace=60.0,
                            launcher="srun"),
                   EventLog(on_console=False))
    with pytest.raises(JobError, match="left workers on far, which train on until about"):
        rerun._lead(None)


def test_a_rerun_on_another_machine_refuses_while_the_last_drivers_own_workers_may_train(tmp_path):
    """The last driver's workers on its own machine (localhost to it) are not this machine's:
    taking them for gone would start a second generation beside them."""
    from hvdlite.driver.eventlog import EventLog
    from hvdlite.driver.job import Job as Driver
    from hvdlite.driver.settings import Settings
    from hvdlite.errors import JobError
    last = Leadership.take(str(tmp_path), ttl=2.0, now=0.0)
    last.take_secret(adopting=False)
    last.record({"adoptable": True, "written_at": time.time(), "procs": {}, "driver_host": "elsewhere",
                 "workers": [{"id": "localhost/0#1", "host": "localhost", "phase": "training"}]})
    assert last.flush()
    last.store.release(last.lease)
    rerun = Driver(Settings(command=["true"], elastic=True, checkpoint_dir=str(tmp_path), driver_grace=60.0),
                   EventLog(on_console=False))
    with pytest.raises(JobError, match="left workers on localhost of elsewhere, which train on until about"):
        rerun._lead(None)


def test_a_worker_that_exited_unreaped_is_not_taken_for_a_live_one():
    """kill -9 of a driver leaves its workers' zombies to PID 1, which may reap them late or never:
    a rerun took such workers over as live (and the job failed on their 'deaths')."""
    from hvdlite import procstat
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while procstat.state(pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert procstat.state(pid) == "Z" and procstat.identity(pid) is None
        assert procstat.identity(os.getpid()) is not None
    finally:
        os.waitpid(pid, 0)
