"""Durable commits through the CLI: kill -9 of the driver and every worker mid-run, then the
same command again on the same --checkpoint-dir resumes and trains exactly what a run
without faults trains. Real workers, real gloo, real kill -9."""
import os
import re
import signal
import sys
import time

import pytest

from jobs import (SCRIPTS, Job, check_training_continuous, effective_steps, job_env, progress,
                  ssh_flags, steps_log, wait_progress, wait_until)
from test_elastic import check_exactly_once_per_epoch
from test_numpy_backend import JOB as NUMPY_JOB, check_training_continuous as check_numpy, needs_pygloo
from hvdlite.worker import checkpointdir

JOB = [sys.executable, os.path.join(SCRIPTS, "elastic_job.py")]
TOTAL = 40


def newest_written(directory) -> int:
    """The commit of the newest checkpoint of the newest lineage in directory; 0 if none."""
    newest = checkpointdir.newest(str(directory))
    return newest[0] if newest is not None else 0


def wait_written(directory, commit, timeout=60) -> int:
    """Until `commit` or a newer one is on disk; returns the newest there. A bound on what
    --checkpoint-interval 0 may lose at a crash (the commits made during the last write) holds
    the writer to a pace, which load breaks (ci19: 4 behind); what is written must stay."""
    wait_until(lambda: newest_written(directory) >= commit, timeout, f"commit {commit} on disk")
    return newest_written(directory)


def crash_then_resume(tmp_path, args, at_step, kill_hosts=lambda: None, **knobs):
    """Run 1 until rank 0 committed `at_step` and wrote it, kill -9 of the driver, every
    process under it and kill_hosts() (writes may be under way); run 2 to the end.
    Returns (the commit on disk after the crash, run 2's result)."""
    ckpt = tmp_path / "ckpt"
    flags = ["--checkpoint-dir", str(ckpt), "--checkpoint-interval", "0", *args]
    (tmp_path / "run1").mkdir()
    (tmp_path / "run2").mkdir()
    # Held at at_step + 5, run 1 cannot end while the writer catches up with at_step.
    with Job(flags, tmp_path / "run1", env=job_env(tmp_path, TOTAL_STEPS=TOTAL, RUN=1, HOLD_AT=at_step + 5,
                                                   **knobs)) as job:
        wait_progress(job, tmp_path, at_step)
        before = wait_written(ckpt, at_step)
        job.kill_everything()
        kill_hosts()
    made, written = progress(tmp_path), newest_written(ckpt)
    assert before <= written <= made  # nothing written lost, nothing uncommitted written
    with Job(flags, tmp_path / "run2", env=job_env(tmp_path, TOTAL_STEPS=TOTAL, RUN=2, **knobs)) as job:
        result = job.finish(120)
    assert result.code == 0, result.stderr
    return written, result


def check_resumed(written, result, records):
    assert re.search(rf"\[0\]<stderr>:hvdlite: resumed from commit {written} \(", result.stdout + result.stderr)
    second = [r["step"] for r in records if r["run"] == 2]
    assert min(second) == written  # nothing before the checkpoint trained again
    assert {r["run"] for rs in effective_steps(records).values() for r in rs} == {1, 2}


@pytest.mark.parametrize("args", [
    ["-H", "localhost:2", "--min-np", "1"],  # elastic
    ["-np", "2"],  # static: hvd.elastic.run without discovery or --min-np
])
def test_kill_9_of_driver_and_workers_then_the_same_command_resumes(tmp_path, args):
    written, result = crash_then_resume(tmp_path, [*args, *JOB], at_step=15, STEP_SLEEP=0.05)
    records = check_training_continuous(tmp_path, TOTAL)
    check_resumed(written, result, records)
    check_exactly_once_per_epoch(records, dataset=64)


def test_every_worker_killed_while_the_driver_lives_resumes_from_the_newest_checkpoint(tmp_path):
    # The driver survives; the blacklist cooldown brings the slots back and it launches new
    # workers, which hold nothing in memory but report what they can read from DIR.
    ckpt = str(tmp_path / "ckpt")
    flags = ["-H", "localhost:2", "--min-np", "1", "--blacklist-cooldown-range", "1", "2",
             "--checkpoint-dir", ckpt, "--checkpoint-interval", "0", *JOB]
    # Held at step 20 until the kill: the job cannot end while the writer catches up with 15.
    with Job(flags, tmp_path, env=job_env(tmp_path, TOTAL_STEPS=TOTAL, STEP_SLEEP=0.05, HOLD_AT=20)) as job:
        wait_progress(job, tmp_path, 15)
        before = wait_written(ckpt, 15)
        victims = job.worker_pids()
        for pid in victims:  # at once: no worker is left to hold the state in memory
            os.killpg(pid, signal.SIGKILL)
        made = progress(tmp_path)
        (tmp_path / "go").touch()  # the relaunched workers pass step 20
        for pid in victims:
            wait_gone(pid, 10)
        written = newest_written(ckpt)
        result = job.finish(120)
    assert result.code == 0, result.stderr
    assert before <= written <= made  # nothing written lost, nothing uncommitted written
    # The world formed after the kill goes on from the checkpoint; the driver also says
    # commit_lost when heartbeats had told it of a newer commit than the one on disk.
    assert result.of("round_complete")[1]["commit"] == written
    assert all(e["resumed"] == written for e in result.of("commit_lost"))
    assert re.search(rf"\[0\]<stderr>:hvdlite: resumed from commit {written} \(", result.stdout + result.stderr)
    records = check_training_continuous(tmp_path, TOTAL)
    assert min(r["step"] for r in records if r["round"] > 1) == written  # world 1 was the killed one
    check_exactly_once_per_epoch(records, dataset=64)


def wait_gone(pid, timeout):
    """Until pid is gone (reaped by the driver, its parent), within timeout seconds."""
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not os.path.exists(f"/proc/{pid}"), f"worker {pid} outlived kill -9"


@needs_pygloo
def test_numpy_backend_resumes(tmp_path):
    written, result = crash_then_resume(tmp_path, ["-H", "localhost:2", "--min-np", "1", *NUMPY_JOB],
                                        at_step=15, STEP_SLEEP=0.05)
    check_resumed(written, result, check_numpy(tmp_path, TOTAL))


def test_a_finished_job_run_again_ends_at_once_with_its_result(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    flags = ["--checkpoint-dir", ckpt, "--checkpoint-interval", "30", "-np", "1", *JOB]
    for run in (1, 2):
        (tmp_path / f"run{run}").mkdir()
        with Job(flags, tmp_path / f"run{run}", env=job_env(tmp_path, TOTAL_STEPS=10, RUN=run)) as job:
            result = job.finish(90)
        assert result.code == 0, result.stderr
    # the interval held back every write but the first; the exit wrote the last commit
    assert [commit for commit, _ in checkpointdir.files(ckpt)] == [10, 1]
    assert "resumed from commit 10" in result.stdout + result.stderr
    assert {r["run"] for r in steps_log(tmp_path)} == {1}
    check_training_continuous(tmp_path, 10)


def test_on_ssh_hosts_every_host_dying_with_the_driver_then_the_same_command_resumes(tmp_path, ssh_hosts):
    # The test hosts share this machine's filesystem: the usual shared checkpoint folder.
    hosts = ssh_hosts(2)
    names = ["host-1", "host-2"]

    def every_host_dies():
        for name in names:
            hosts.kill_all(name)
        for name in names:  # back at once, with new processes: some may have a dead worker's pid
            hosts.start(name)
    # The rerun comes within the workers' --driver-grace: it asks their hosts, finds them gone,
    # and resumes from disk.
    written, result = crash_then_resume(
        tmp_path, [*ssh_flags(hosts), "-H", "host-1:1,host-2:1", "--min-np", "1", *JOB], at_step=15,
        kill_hosts=every_host_dies, STEP_SLEEP=0.05)
    hosts.close()
    records = check_training_continuous(tmp_path, TOTAL)
    check_resumed(written, result, records)
    check_exactly_once_per_epoch(records, dataset=64)
