"""Signals in real jobs (docs/signals.md): a signal to the driver stops an elastic job at a
commit with its checkpoint written and the same command resumes exactly there; SIGTERM to one
worker shrinks the world at a commit, with no rollback and no blacklisting; a second Ctrl-C,
or the stop's time running out, stops at once; a static job says it was interrupted."""
import os
import signal
import sys
import time

import pytest

from jobs import (PRELOADED, SCRIPTS, Job, check_training_continuous, discovery, job_env, sizes, slot_pid,
                  steps_log, wait_progress, wait_until)
from test_elastic import check_exactly_once_per_epoch
from hvdlite import exitcodes
from hvdlite.worker import checkpointdir

# Every worker forks from a template (jobs.PRELOADED): one torch import a job, not one a worker.
JOB = [*PRELOADED, sys.executable, os.path.join(SCRIPTS, "elastic_job.py")]
TOTAL = 40


# SIGUSR1 to a worker is Slurm's `--signal=USR1@T`, which signals the job steps, not the driver.
STOPS = [(signal.SIGUSR1, "driver"), (signal.SIGTERM, "driver"), (signal.SIGINT, "driver"),
         (signal.SIGUSR1, "a worker")]


def test_each_signal_to_the_driver_stops_at_a_commit_and_the_same_command_resumes_there(tmp_path):
    """One chain of runs of the same command: each stopped by the next of STOPS, 6 steps after
    its start, then run again from what the stop wrote; the last run trains 10 steps more. A
    stopped run has no end of its own: however long a stop takes, it is what ends the run."""
    ckpt = tmp_path / "ckpt"
    # No periodic write within the run: the checkpoint on disk is the one the stop wrote.
    flags = ["-H", "localhost:2", "--min-np", "1", "--checkpoint-dir", str(ckpt),
             "--checkpoint-interval", "600", *JOB]
    written = 0
    for run, (sig, to) in enumerate(STOPS, 1):
        (tmp_path / f"run{run}").mkdir()
        with Job(flags, tmp_path / f"run{run}",
                 env=job_env(tmp_path, TOTAL_STEPS=10_000, RUN=run, STEP_SLEEP=0.1)) as job:
            wait_progress(job, tmp_path, written + 6)
            if to == "driver":
                job.proc.send_signal(sig)
            else:
                os.kill(slot_pid(job, "localhost/1"), sig)
            result = job.finish(60)
        assert result.code == exitcodes.RESUMABLE, (sig.name, to, result.stderr)
        stopped = result.of("job_end")[-1]
        assert stopped["result"] == "stopped" and stopped["resumable"] and not stopped["late"]
        resumed_from, written = written, checkpointdir.newest(str(ckpt))[0]
        records = steps_log(tmp_path)
        assert written == stopped["commit"] == max(r["step"] for r in records) + 1  # the last step trained is on disk
        assert min(r["step"] for r in records if r["run"] == run) == resumed_from
        assert f"job stopped by {sig.name} at commit {written}" in result.stderr
        assert not result.of("blacklisted") and all(e.get("left") for e in result.of("worker_exit"))
        assert not result.of("workers_failed")
    (tmp_path / "last").mkdir()
    total = written + 10
    with Job(flags, tmp_path / "last", env=job_env(tmp_path, TOTAL_STEPS=total, RUN=len(STOPS) + 1,
                                                   STEP_SLEEP=0.05)) as job:
        result = job.finish(120)
    assert result.code == 0, result.stderr
    records = check_training_continuous(tmp_path, total)
    assert min(r["step"] for r in records if r["run"] == len(STOPS) + 1) == written  # nothing lost, nothing again
    assert all(len({(r["run"], r["round"]) for r in rs}) == 1 for rs in _attempts(records).values())
    check_exactly_once_per_epoch(records, dataset=64)


def _attempts(records):
    """step -> every record of it, whichever attempt wrote it."""
    by_step = {}
    for r in records:
        by_step.setdefault(r["step"], []).append(r)
    return by_step


def test_sigterm_to_one_worker_shrinks_the_world_at_a_commit_without_rollback_or_blacklist(tmp_path):
    with Job(["-H", "localhost:3", "--min-np", "1", *JOB], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=TOTAL, STEP_SLEEP=0.1)) as job:
        wait_progress(job, tmp_path, 10)
        os.kill(slot_pid(job, "localhost/2"), signal.SIGTERM)
        r = job.finish(120)
    assert r.code == 0, r.stderr
    records = check_training_continuous(tmp_path, TOTAL)
    assert sizes(records) == [3, 2]
    # no rollback: no step was trained twice (a rollback redoes the steps after the last commit)
    assert all(len({rec["round"] for rec in rs}) == 1 for rs in _attempts(records).values())
    assert [(e["code"], e.get("left")) for e in r.of("worker_exit") if e["slot"] == "localhost/2"] == \
        [(exitcodes.LEFT, True)]
    assert not r.of("blacklisted") and not r.of("workers_failed")
    assert len([e for e in r.of("worker_start") if e["slot"] == "localhost/2"]) == 1  # not relaunched
    assert [e["cause"] for e in r.of("round_broken")] == ["a worker left"]
    assert "re-forms without a worker that left it at a commit; nobody rolls back" in r.stderr
    assert "roll back" not in r.stderr.replace("nobody rolls back", "")
    check_exactly_once_per_epoch(records, dataset=64)


def test_a_second_ctrl_c_stops_at_once(tmp_path):
    # Steps of 20 s: the graceful stop would wait for the next commit up to --stop-timeout.
    with Job(["-H", "localhost:2", "--min-np", "1", *JOB], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=5, STEP_SLEEP=20)) as job:
        wait_progress(job, tmp_path, 1)
        job.proc.send_signal(signal.SIGINT)
        job.wait_for(lambda events: any(e["event"] == "stop_requested" for e in events), 10)
        job.proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        r = job.finish(30)
        took = time.monotonic() - start
    assert r.code == 128 + signal.SIGINT, r.stderr
    assert took < 10, took
    assert "job interrupted by SIGINT" in r.stderr


def test_a_worker_that_reaches_no_commit_is_killed_when_the_stop_times_out(tmp_path):
    with Job(["-H", "localhost:2", "--min-np", "1", "--stop-timeout", "2", *JOB], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=5, STEP_SLEEP=30)) as job:
        wait_progress(job, tmp_path, 1)
        start = time.monotonic()
        job.proc.send_signal(signal.SIGTERM)
        r = job.finish(30)
        took = time.monotonic() - start
    assert r.code == 128 + signal.SIGTERM, r.stderr  # no --checkpoint-dir: nothing to resume
    assert 2 <= took < 12, took
    assert sorted(e["slot"] for e in r.of("worker_stop_timeout")) == ["localhost/0", "localhost/1"]
    assert "reached no commit in time" in r.stderr and "without --checkpoint-dir nothing was saved" in r.stderr


@pytest.mark.plain_start("the whole console of a plain static job; a kept template adds its line about `-c`")
def test_ctrl_c_to_a_static_job_says_so_in_one_line(tmp_path):
    with Job(["-np", "2", sys.executable, "-c", "import time; time.sleep(60)"], tmp_path) as job:
        wait_until(lambda: len(job.worker_pids()) == 2, 30, "workers started")
        job.proc.send_signal(signal.SIGINT)
        r = job.finish(30)
    assert r.code == 128 + signal.SIGINT
    assert r.stderr.strip().splitlines() == ["hvdlite: job interrupted by SIGINT"]


@pytest.mark.parametrize("end", ["SIGTERM", "--elastic-timeout"])
def test_a_job_ending_while_the_world_re_forms_after_rank_0_died_writes_the_survivors_commit_first(tmp_path, end):
    # Only rank 0 writes, and --checkpoint-interval holds back every write after the first:
    # once rank 0 is gone, the survivor alone holds the newest commit, waiting for --min-np.
    # Rank 0 dies inside commit 40, after its collective: the survivor's commit() raised
    # (its check for host updates failed), and commit 40 is committed all the same
    # (docs/durable-commits.md).
    ckpt = tmp_path / "ckpt"
    flags = ["-H", "localhost:2", "-np", "2", "--min-np", "2", "--checkpoint-dir", str(ckpt),
             "--checkpoint-interval", "1000", *JOB]
    (tmp_path / "run1").mkdir()
    (tmp_path / "run2").mkdir()
    first_flags = [*flags[:-len(JOB)], "--elastic-timeout", "3", *JOB] if end != "SIGTERM" else flags
    with Job(first_flags, tmp_path / "run1",
             env=job_env(tmp_path, TOTAL_STEPS=60, RUN=1, STEP_SLEEP=0.02, HOLD_IN_COMMIT=40)) as job:
        job.wait_for(lambda _: (tmp_path / "held_in_commit").exists(), 60)
        os.kill(slot_pid(job, "localhost/0"), signal.SIGKILL)
        job.wait_for(lambda events: any(e["event"] == "waiting_for_workers" for e in events), 30)
        if end == "SIGTERM":
            job.proc.send_signal(signal.SIGTERM)
        first = job.finish(60)
    written = checkpointdir.newest(str(ckpt))[0]
    assert written == 40, first.stderr
    assert max(r["step"] for r in steps_log(tmp_path) if r["slot"] == "localhost/1") == 39  # none after
    assert [e["commit"] for e in first.of("round_complete") if e.get("last")] == [written]
    if end == "SIGTERM":
        assert first.code == exitcodes.RESUMABLE, first.stderr
        assert first.of("job_end")[-1]["commit"] == written
        assert f"job stopped by SIGTERM at commit {written}; its checkpoint is in --checkpoint-dir" in first.stderr
    else:
        assert first.code == 1, first.stderr
        assert f"fewer than --min-np 2 workers for --elastic-timeout 3 s; stopping the job; commit {written} " \
               f"is in --checkpoint-dir" in first.stderr
    with Job(flags, tmp_path / "run2", env=job_env(tmp_path, TOTAL_STEPS=60, RUN=2, STEP_SLEEP=0.02)) as job:
        second = job.finish(120)
    assert second.code == 0, second.stderr
    assert f"resumed from commit {written} (" in second.stdout + second.stderr
    assert min(r["step"] for r in steps_log(tmp_path) if r["run"] == 2) == written
    check_training_continuous(tmp_path, 60)


def test_sigterm_to_the_only_holder_while_a_joiner_starts_hands_the_state_over_before_it_leaves(tmp_path):
    # One slot, then two: the joiner takes 3 s to start, and rank 0, alone with the state,
    # gets SIGTERM meanwhile. No --checkpoint-dir: its memory is the only copy.
    schedule = [[0, ["localhost:1"]], [10, ["localhost:2"]]]
    with Job([*discovery(tmp_path, schedule), "--min-np", "1", "--max-np", "2", *JOB], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=TOTAL, STEP_SLEEP=0.1, START_SLEEP="localhost/1:3")) as job:
        job.wait_for(lambda events: any(e["event"] == "worker_start" and e["slot"] == "localhost/1"
                                        for e in events), 60)
        os.kill(slot_pid(job, "localhost/0"), signal.SIGTERM)
        r = job.finish(120)
    assert r.code == 0, r.stderr
    assert all(e["commit"] > 0 for e in r.of("round_complete")[1:]), r.of("round_complete")
    assert r.of("worker_leaving")
    held = max(rec["step"] for rec in steps_log(tmp_path) if rec["slot"] == "localhost/0") + 1
    assert held >= 10 and [e["commit"] for e in r.of("round_complete")[1:]] == [held, held]
    assert r.of("round_complete")[1]["handover"]
    assert [(e["code"], e.get("left")) for e in r.of("worker_exit") if e["slot"] == "localhost/0"] == \
        [(exitcodes.LEFT, True)]
    check_training_continuous(tmp_path, TOTAL)  # every step once: nothing trained again from 0


def test_a_stop_while_workers_start_on_a_folder_with_a_checkpoint_is_resumable(tmp_path):
    ckpt = tmp_path / "ckpt"
    flags = ["-H", "localhost:2", "--min-np", "1", "--checkpoint-dir", str(ckpt), *JOB]
    (tmp_path / "run1").mkdir()
    (tmp_path / "run2").mkdir()
    with Job(flags, tmp_path / "run1", env=job_env(tmp_path, TOTAL_STEPS=5)) as job:
        assert job.finish(90).code == 0
    # A requeued job, signalled again while its workers start: what the folder holds stays
    # resumable.
    with Job(flags, tmp_path / "run2", env=job_env(tmp_path, TOTAL_STEPS=10, START_SLEEP="*:5")) as job:
        wait_until(lambda: len(job.worker_pids()) == 2, 30, "workers started")
        job.proc.send_signal(signal.SIGTERM)
        r = job.finish(60)
    assert r.code == exitcodes.RESUMABLE, r.stderr
    assert "job stopped by SIGTERM at commit 5; its checkpoint is in --checkpoint-dir" in r.stderr
    assert "without --checkpoint-dir" not in r.stderr


def test_sigterm_between_worlds_tells_the_driver_instead_of_leaving_with_the_state(monkeypatch):
    from hvdlite.worker import stopping
    told = []
    monkeypatch.setattr(stopping, "_tell", told.append)
    monkeypatch.setattr(stopping, "requested", False)
    monkeypatch.setattr(stopping, "at_work", False)
    monkeypatch.setattr(stopping, "holding", True)  # inside run(), waiting for a world
    stopping._on_term(signal.SIGTERM, None)  # no SystemExit: the driver answers its wait
    wait_until(lambda: told == ["leaving"], 5, "the driver told")
    monkeypatch.setattr(stopping, "requested", False)
    monkeypatch.setattr(stopping, "holding", False)  # never in a world: nothing to hand over
    with pytest.raises(SystemExit) as e:
        stopping._on_term(signal.SIGTERM, None)
    assert e.value.code == exitcodes.LEFT
