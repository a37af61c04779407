"""Attacks on the driver's failover (docs/failover.md) from other sides than test_failover.py.

One real job carries the costly checks: its driver is killed (kill -9), a rerun with another
script is refused without touching the job, the same command takes the workers over, that
driver is killed too, and a third takes them over again; nothing committed is lost or trained
twice, the workers are never restarted, and the job's secret is in no other file, no event log,
no output and no command line. Then bad input to the driver's folder (in-process, or a
one-worker job), a worker printing while its driver is stopped, and a driver killed while it
ended the job or before its first world: a rerun must never start a second generation of
workers beside the first, nor leave the first behind.
"""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from hvdlite import exitcodes
from hvdlite.driver.leadership import Leadership
from hvdlite.errors import JobError
from hvdlite.worker import beacon, env
from jobs import SCRIPTS, Job, progress, run_job, wait_until

JOB = [sys.executable, os.path.join(SCRIPTS, "determinism_job.py")]
ARGS = ["--liveness-timeout", "2", "-np", "2", "--min-np", "2", "--max-np", "2", "-H", "localhost:2"]


def _readopted(events):
    return any(e["event"] == "job_readopted" for e in events)


@pytest.fixture(scope="module")
def two_takeovers(tmp_path_factory):
    """The job, its three drivers and a refused rerun; what the checks need, once."""
    tmp = tmp_path_factory.mktemp("two_takeovers")
    log_dir, first, other, second, third = (tmp / n for n in ("log", "first", "other", "second", "third"))
    for folder in (log_dir, first, other, second, third):
        folder.mkdir()
    ckpt = tmp / "ckpt"
    flags = [*ARGS, "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "0"]
    knobs = {"LOG_DIR": str(log_dir), "EPOCHS": "3", "WORKERS": "0", "STEP_SLEEP": "0.05", "HOLD_AT": "epoch2"}
    seen = {}
    with Job([*flags, *JOB], first, knobs) as a:
        a.wait_for(lambda _: progress(log_dir) >= 5, 120)
        seen["pids"] = {e["slot"]: e["pid"] for e in a.events() if e["event"] == "worker_start"}
        secret = (ckpt / beacon.FOLDER / beacon.SECRET).read_text().strip()
        seen["cmdlines"] = [open(f"/proc/{p}/cmdline", "rb").read() for p in seen["pids"].values()]
        a.proc.kill()
        a.proc.wait(10)
        # Another script with the same folder: not this job's command.
        seen["other"] = run_job([*flags, sys.executable, "-c", "print('another script')"], other, timeout=60, env=knobs)
        seen["alive_after_other"] = all(os.path.exists(f"/proc/{p}") for p in seen["pids"].values())
        with Job([*flags, *JOB], second, knobs) as b:
            b.wait_for(_readopted, 60)
            # The epoch lines printed while no driver ran, relayed by this driver; then it dies too.
            wait_until(lambda: "EPOCH 1 exactly-once" in Job.read(b.out), 60, "epoch 1's line relayed")
            b.proc.kill()
            b.proc.wait(10)
            seen["printed"] = [Job.read(a.out), Job.read(b.out)]
            seen["events"] = a.events() + b.events()
            with Job([*flags, *JOB], third, knobs) as c:
                c.wait_for(_readopted, 60)
                (log_dir / "go").touch()
                seen["third"] = c.finish(120)
        seen["printed"].append(seen["third"].stdout)
        seen["events"] += seen["third"].events
    seen["secret"], seen["ckpt"], seen["log_dir"], seen["tmp"] = secret, ckpt, log_dir, tmp
    return seen


def test_a_driver_killed_twice_loses_nothing_and_restarts_no_worker(two_takeovers):
    s = two_takeovers
    r = s["third"]
    assert r.code == 0, r.stderr[-3000:]
    assert r.of("job_adopted")[0]["pids"] == s["pids"] and not r.of("worker_start")
    assert sorted(e["code"] for e in r.of("worker_exit")) == [0, 0]
    steps = [json.loads(line)["step"] for line in (s["log_dir"] / "losses.jsonl").read_text().splitlines()]
    assert steps == list(range(steps[0], steps[0] + len(steps))) and len(steps) == 36, steps
    assert json.loads((s["log_dir"] / "final.json").read_text())["epochs"] == [True, True, True]


def test_a_rerun_with_another_script_is_refused_and_leaves_the_job_alone(two_takeovers):
    """It would take the workers of another script over (or, refused after taking the lease,
    write an ended journal: the next rerun would start afresh beside the live workers)."""
    other = two_takeovers["other"]
    assert other.code != 0 and "another script" not in other.stdout, other.stderr
    assert "not this job's command" in other.stderr and "Traceback" not in other.stderr, other.stderr
    assert two_takeovers["alive_after_other"]


def test_the_secret_is_in_one_0600_file_only(two_takeovers):
    s = two_takeovers
    secret = s["secret"].encode()
    assert all(secret not in cmdline for cmdline in s["cmdlines"])
    found = [str(p) for p in s["tmp"].rglob("*") if p.is_file() and secret in p.read_bytes()]
    assert found == [str(s["ckpt"] / beacon.FOLDER / beacon.SECRET)], found
    assert all(s["secret"] not in json.dumps(e) for e in s["events"])


def test_a_line_printed_while_no_driver_ran_is_printed_once(two_takeovers):
    printed = "".join(two_takeovers["printed"])
    assert [printed.count(f"EPOCH {e} exactly-once") for e in range(3)] == [1, 1, 1], printed


# ---- bad input in the driver's folder ------------------------------------------------------
WORKER = "import hvdlite.torch as hvd; hvd.init(); print('trained', flush=True)"


def _run(ckpt):
    return subprocess.run([sys.executable, "-m", "hvdlite.cli", "run", "-np", "1", "--min-np", "1",
                           "--checkpoint-dir", str(ckpt), sys.executable, "-c", WORKER],
                          capture_output=True, text=True, timeout=120)


def test_a_broken_lease_file_or_a_changed_journal_gets_one_line_not_a_fresh_start(tmp_path):
    ckpt = tmp_path / "ckpt"
    done = _run(ckpt)
    assert done.returncode == 0 and "trained" in done.stdout, done.stderr
    folder = ckpt / beacon.FOLDER
    journal = (folder / "journal").read_bytes()
    lease = (folder / "lease.json").read_bytes()
    (folder / "lease.json").write_bytes(b'{"owner": "x", "epo')
    done = _run(ckpt)
    assert done.returncode == 1 and "is not a driver lease" in done.stderr and "Traceback" not in done.stderr, \
        done.stderr
    (folder / "lease.json").write_bytes(lease)
    # The journal changed (one byte of its body): it names workers that may live; not guessed at.
    (folder / "journal").write_bytes(journal.replace(b"false", b"true "))
    done = _run(ckpt)
    assert done.returncode == 1 and "trained" not in done.stdout, done.stderr
    assert "does not verify" in done.stderr and "Traceback" not in done.stderr, done.stderr
    shutil.rmtree(folder)  # as the line says: afresh from the checkpoints
    assert _run(ckpt).returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the folder to another user needs root")
def test_a_driver_folder_or_secret_another_user_could_write_is_refused(tmp_path):
    """Whoever could write the folder could have planted the secret and a journal (and so be
    adopted, or read everything the job sends): refused in one line, never chmod-ed and used."""
    folder = tmp_path / beacon.FOLDER
    folder.mkdir(mode=0o700)
    planted = folder / beacon.SECRET
    planted.write_text("planted")
    for mode, owner in ((0o777, 0), (0o700, 65534)):
        os.chmod(folder, mode)
        os.chown(folder, owner, owner)
        with pytest.raises(JobError, match="must be this user's"):
            Leadership.take(str(tmp_path), ttl=2.0, now=0.0)
    os.chown(folder, 0, 0)
    os.chmod(folder, 0o700)
    os.chmod(planted, 0o644)  # a secret others can read
    lead = Leadership.take(str(tmp_path), ttl=2.0, now=0.0)
    with pytest.raises(JobError, match="must be this user's"):
        lead.take_secret(adopting=True)


# ---- a worker that prints a lot while its driver is stopped (Ctrl-Z, SIGSTOP) ------------------
PRINTER = """
import time
from hvdlite.worker.session import session
s = session()
for i in range(600):
    print(f"{i:06d} " + "x" * 2000, flush=True)
    time.sleep(0.001)
print("the end", flush=True)
"""


def test_a_worker_whose_print_blocked_on_a_stopped_driver_trains_on_under_the_next_one(tmp_path):
    """The stopped driver is played by this test: it holds the read end of the worker's stdout
    and never reads, and it answers nothing (a port nobody serves). The worker's print blocks
    once the pipe is full; a new driver's beacon appears and the worker goes over to it: the
    blocked print completes, and the output goes on into the file the new driver relays: every
    line once, in order (what the pipe held first, then the print under way, then the rest, the
    last made as the worker exits)."""
    secret = "s" * 32
    environ = {**os.environ, env.RENDEZVOUS_ADDR: "127.0.0.1", env.RENDEZVOUS_PORT: "9", env.SECRET: secret,
               env.WORKER: "localhost/0#1", env.ELASTIC: "1", env.LIVENESS_TIMEOUT: "1",
               env.DRIVER_GRACE: "30", env.CHECKPOINT_DIR: str(tmp_path)}
    worker = subprocess.Popen([sys.executable, "-c", PRINTER], env=environ, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        with open(f"/proc/{worker.pid}/wchan") as wchan:  # 64 KB: about 32 lines
            wait_until(lambda: "pipe_write" in (wchan.seek(0) or wchan.read()), 10, "a print blocked on the pipe")
        os.mkdir(beacon.folder(str(tmp_path)), 0o700)
        beacon.publish(str(tmp_path), secret, 1, "127.0.0.1", 9)  # the next driver (also silent)
        wait_until(lambda: worker.poll() is not None, 20,
                   "the worker's print blocked on the stopped driver's pipe after it went over to another")
        assert worker.returncode == 0
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
        worker.stdout.close()
    with open(beacon.output_path(str(tmp_path), "localhost/0#1", "stdout"), "rb") as f:
        *lines, end, rest = f.read().split(b"\n")
    assert [int(line[:6]) for line in lines] == list(range(600)) and all(len(line) == 2007 for line in lines)
    assert (end, rest) == (b"the end", b""), "the last print, made as the worker exited, did not reach the file"


def test_a_worker_whose_stderr_is_full_and_unread_still_ends_at_its_grace(tmp_path):
    """The stopped driver holds the worker's stderr unread, no new driver comes: a print to
    stderr blocks, and so would the heartbeat thread's own line about the lost driver; the
    grace still ends the worker (exit 75) instead of leaving it hung."""
    environ = {**os.environ, env.RENDEZVOUS_ADDR: "127.0.0.1", env.RENDEZVOUS_PORT: "9", env.SECRET: "s" * 32,
               env.WORKER: "localhost/0#1", env.ELASTIC: "1", env.LIVENESS_TIMEOUT: "1",
               env.DRIVER_GRACE: "2", env.CHECKPOINT_DIR: str(tmp_path)}
    printer = "import sys\nfrom hvdlite.worker.session import session\ns = session()\n" \
              "while True:\n    print('x' * 2000, file=sys.stderr, flush=True)\n"
    worker = subprocess.Popen([sys.executable, "-c", printer], env=environ,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_until(lambda: worker.poll() is not None, 20, "the worker hung on its full stderr past its grace")
        assert worker.returncode == exitcodes.LOST_DRIVER
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
        worker.stderr.close()


# ---- the driver killed during a graceful stop -------------------------------------------------
def _journal(ckpt):
    try:
        return json.loads(json.loads((ckpt / beacon.FOLDER / "journal").read_bytes())["body"])
    except (OSError, ValueError):
        return {}


def test_a_rerun_never_starts_afresh_beside_the_workers_of_a_driver_killed_while_stopping(tmp_path):
    """SIGTERM, the stop journaled (not adoptable), kill -9 before the workers heard of it (they
    are SIGSTOPped meanwhile): they train on for --driver-grace, writing commits. A rerun
    that started afresh now would train a second generation into the same folder: it waits
    for them, or refuses, but starts no worker beside them."""
    log_dir, first, second = (tmp_path / n for n in ("log", "first", "second"))
    for folder in (log_dir, first, second):
        folder.mkdir()
    ckpt = tmp_path / "ckpt"
    args = [*ARGS, "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "0", *JOB]
    knobs = {"LOG_DIR": str(log_dir), "EPOCHS": "3", "WORKERS": "0", "STEP_SLEEP": "0.05", "HOLD_AT": "epoch2"}
    with Job(args, first, knobs) as a:
        a.wait_for(lambda _: progress(log_dir) >= 5, 120)
        pids = [e["pid"] for e in a.events() if e["event"] == "worker_start"]
        try:
            for pid in pids:
                os.killpg(pid, signal.SIGSTOP)
            a.proc.send_signal(signal.SIGTERM)
            wait_until(lambda: _journal(ckpt).get("adoptable") is False, 30, "the stop journaled")
            a.proc.kill()
            a.proc.wait(10)
        finally:
            for pid in pids:
                os.killpg(pid, signal.SIGCONT)
        with Job(args, second, knobs) as b:
            code = None
            try:
                code = b.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
            started = [e for e in b.events() if e["event"] == "worker_start"]
            alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
            err = Job.read(b.err)
            for pid in pids:
                os.killpg(pid, signal.SIGKILL)
    assert not (started and alive), f"a fresh world {started} beside the old workers {alive}:\n{err}"
    assert code not in (None, 0) and "still run" in err and "Traceback" not in err, (code, err)


@pytest.mark.plain_start("the driver is killed between its launches and the first world: a plain "
                         "start's imports keep that window open, forks close it in a blink")
def test_the_workers_of_a_driver_killed_before_the_first_world_are_not_left_behind(tmp_path):
    """Killed after its launches, before a world formed: its journal is not adoptable (round
    0). The rerun starts its own workers; the old ones, which could never find it (its beacon is
    signed with a new secret), must not live on beside them for --driver-grace."""
    log_dir, first, second = (tmp_path / n for n in ("log", "first", "second"))
    for folder in (log_dir, first, second):
        folder.mkdir()
    ckpt = tmp_path / "ckpt"
    args = [*ARGS, "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "0", *JOB]
    knobs = {"LOG_DIR": str(log_dir), "EPOCHS": "1", "WORKERS": "0", "STEP_SLEEP": "0"}
    with Job(args, first, knobs) as a:
        wait_until(lambda: len(_journal(ckpt).get("procs", {})) == 2, 60, "the launches journaled")
        old = [e["pid"] for e in a.events() if e["event"] == "worker_start"]
        a.proc.kill()
        a.proc.wait(10)
        assert _journal(ckpt)["round"] == 0, "the world formed before the kill: nothing tested"
        r = run_job(args, second, timeout=120, env=knobs)
        left = [p for p in old if os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"]
    assert r.code == 0, r.stderr[-3000:]
    assert not left, f"the first driver's workers {left} outlived the rerun's job"
