"""Randomized fault injection (a short run; `python bench/faults.py` runs 100 trials)."""
import os
import signal
import sys
import time

import pytest

from faults import LocalHosts, SSHHosts, _alive, run_trial
from jobs import PRELOADED, SCRIPTS, Job, skip_without_partitions


@pytest.mark.parametrize("seed", range(3))  # three trials keep CI under 25 min; the bench runs 100
def test_random_faults_lose_no_commit(tmp_path, seed):
    # Every worker forks from a template: one import a trial (the bench starts them as by default).
    run_trial(seed, str(tmp_path), hosts=LocalHosts(PRELOADED))


@pytest.fixture(scope="module")
def trial_hosts(ssh_hosts):
    hosts = ssh_hosts(4)
    skip_without_partitions(hosts)
    return SSHHosts(hosts)


# Seeds whose plans include a partition among their faults.
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_faults_with_partitions_over_ssh_lose_no_commit(tmp_path, seed, trial_hosts):
    result = run_trial(seed, str(tmp_path), hosts=trial_hosts)
    assert "partition" in result["faults"]


def test_driver_killed_every_worker_exits_within_10s(tmp_path):
    with Job(["-H", "127.0.0.1:1,127.0.0.2:1", "--min-np", "1",
              sys.executable, os.path.join(SCRIPTS, "elastic_job.py")], tmp_path,
             env={"LOG_DIR": str(tmp_path), "TOTAL_STEPS": "100000"}) as job:
        job.wait_for(lambda ev: any(e["event"] == "round_complete" for e in ev), 60)
        pids = job.worker_pids()
        job.proc.send_signal(signal.SIGKILL)
        job.proc.wait(10)
        killed = time.monotonic()
        while any(_alive(p) for p in pids) and time.monotonic() - killed < 10:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), "workers outlived the driver by 10 s"
