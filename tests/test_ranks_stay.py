"""Ranks stay put across failures (docs/elastic.md): real workers, real gloo, real kill -9.

A spare slot replaces the dead worker in a world of the same size: the survivors keep their
ranks, the spare takes the dead rank's number, and the world syncs from whichever rank holds
the newest commit (rank 1 when rank 0 died), so training goes on exactly from the last commit.
"""
import os
import signal
import sys

import pytest

from hvdlite.worker import checkpointdir
from jobs import SCRIPTS, Job, check_training_continuous, job_env, sizes, slot_pid, wait_progress

JOB = [sys.executable, os.path.join(SCRIPTS, "elastic_job.py")]
HOSTS = "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1,127.0.0.4:1"  # three train, 127.0.0.4 is the spare
SPARE = "127.0.0.4/0"


def ranks_by_slot(records):
    """slot -> the ranks its records were logged with, before and after the re-form."""
    found = {}
    for r in records:
        found.setdefault(r["slot"], set()).add(r["rank"])
    return found


@pytest.mark.parametrize("victim", ["127.0.0.1/0", "127.0.0.2/0"])  # rank 0, a middle rank
def test_a_spare_takes_the_dead_rank_and_survivors_keep_theirs(tmp_path, victim):
    ckpt = str(tmp_path / "ckpt")
    with Job(["-H", HOSTS, "--max-np", "3", "--min-np", "3", "--checkpoint-dir", ckpt,
              "--checkpoint-interval", "0", *JOB], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=30, STEP_SLEEP=0.05)) as job:
        wait_progress(job, tmp_path, 8)
        os.kill(slot_pid(job, victim), signal.SIGKILL)
        r = job.finish(120)
    assert r.code == 0, r.stderr
    records = check_training_continuous(tmp_path, 30)  # synced from the holder: no step lost
    assert sizes(records) == [3]
    before = {"127.0.0.1/0": 0, "127.0.0.2/0": 1, "127.0.0.3/0": 2}
    after = {**{slot: {rank} for slot, rank in before.items() if slot != victim}, SPARE: {before[victim]}}
    found = ranks_by_slot(records)
    assert {slot: found[slot] for slot in after} == after, found
    assert victim in found and found[victim] == {before[victim]}
    (reformed,) = r.of("round_complete")[1:]
    assert reformed["root"] == (1 if victim == "127.0.0.1/0" else 0)
    # Rank 0's writer (the spare, when rank 0 died) writes the commits it synced from the root.
    assert checkpointdir.newest(ckpt)[0] == 30
