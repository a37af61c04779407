"""Bitwise recovery (scripts/determinism_job.py): a job whose workers are replaced at the same
world size ends with the parameters and momentum of a run with no fault, and a resized job
trains every sample of every epoch exactly once. Real workers, real gloo, real kill -9."""
import json
import os
import random
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from hvdlite.torch import generators
from hvdlite.worker import checkpoints
from jobs import SCRIPTS, Job, discovery, progress, run_job, slot_pid, wait_progress

JOB = [sys.executable, os.path.join(SCRIPTS, "determinism_job.py")]
SAME_SIZE = ["-H", "localhost:3", "-np", "2", "--min-np", "2", "--max-np", "2",
             "--blacklist-cooldown-range", "600", "600"]


def draws():
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_the_generators_come_back_from_a_checkpoint_file_and_draw_as_before(tmp_path):
    """Through the checked unpickler as they are (no trusted class needed)."""
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.randn()  # numpy's state holds a cached gaussian now
    captured = generators.capture()
    expected = draws()
    fd, direct = checkpoints.create(str(tmp_path / "c"))
    with os.fdopen(fd, "wb"):
        checkpoints.dump(fd, 7, "lineage", {"ranks": [captured]}, direct)
    commit, _, state = checkpoints.load(str(tmp_path / "c"))
    draws()
    generators.put(state["ranks"][0])
    assert commit == 7 and draws() == expected


def final(log_dir):
    with open(os.path.join(log_dir, "final.json")) as f:
        return json.load(f)


def reference(tmp_path, args=SAME_SIZE, **env):
    log_dir = tmp_path / "reference"
    log_dir.mkdir()
    r = run_job([*args, *JOB], log_dir, timeout=120, env={"LOG_DIR": str(log_dir), **env})
    assert r.code == 0, r.stderr[-3000:]
    return final(log_dir)


def member(job, rank):
    rounds = [e["members"] for e in job.events() if e["event"] == "round_complete"]
    return next(slot for slot, r in rounds[-1].items() if r == rank)


@pytest.mark.parametrize("loader, victim", [("elastic_sampler", 1), ("elastic_sampler", 0), ("stateful", 0)])
def test_kill_9_replaced_at_the_same_size_is_bitwise_the_fault_free_run(tmp_path, loader, victim):
    """A DataLoader with worker processes over an ElasticSampler, or torchdata's
    StatefulDataLoader held in the state (its place each rank's own); rank 0 holds the
    durable writer and was the sync's source before ranks stayed put."""
    env = {"LOADER": loader}
    expected = reference(tmp_path, **env)
    log_dir = tmp_path / "faulty"
    log_dir.mkdir()
    with Job([*SAME_SIZE, *JOB], log_dir, {"LOG_DIR": str(log_dir), **env}) as job:
        wait_progress(job, log_dir, 20)  # mid-epoch (12 steps an epoch): a rollback re-enters it
        os.kill(slot_pid(job, member(job, victim)), signal.SIGKILL)
        r = job.finish(120)
    assert r.code == 0, r.stderr[-3000:]
    assert len(r.of("round_complete")) >= 2, "the kill did not re-form the world"
    got = final(log_dir)
    assert got["epochs"] == [True] * 3
    assert got["hash"] == expected["hash"], "parameters or momentum differ from the fault-free run"


def test_a_resized_run_trains_every_sample_exactly_once_each_epoch(tmp_path):
    log_dir = tmp_path
    schedule = [[0, ["localhost:2"]], [5, ["localhost:3"]], [14, ["localhost:1"]], [20, ["localhost:2"]]]
    r = run_job([*discovery(tmp_path, schedule), "--min-np", "1", *JOB], log_dir, timeout=180,
                env={"LOG_DIR": str(log_dir), "STEP_SLEEP": "0.1"})
    assert r.code == 0, r.stderr[-3000:]
    assert sorted({e["size"] for e in r.of("round_complete")}) == [1, 2, 3]
    assert final(log_dir)["epochs"] == [True] * 3


def test_graceful_stop_then_rerun_from_the_checkpoint_dir_is_bitwise_the_fault_free_run(tmp_path):
    args = [*SAME_SIZE, "--checkpoint-dir", str(tmp_path / "ckpt")]
    expected = reference(tmp_path)
    log_dir = tmp_path / "stopped"
    log_dir.mkdir()
    with Job([*args, *JOB], log_dir, {"LOG_DIR": str(log_dir)}) as job:
        wait_progress(job, log_dir, 20)
        job.proc.send_signal(signal.SIGTERM)
        r = job.finish(60)
    assert r.code == 75, r.stderr[-3000:]
    assert progress(log_dir) < 36, "the job ended before the stop"
    rerun = tmp_path / "rerun"
    rerun.mkdir()
    r = run_job([*args, *JOB], rerun, timeout=120, env={"LOG_DIR": str(log_dir)})
    assert r.code == 0, r.stderr[-3000:]
    assert "resumed from commit" in r.stderr
    assert final(log_dir)["hash"] == expected["hash"]


def test_bench_quick_finds_every_run_equal_and_every_epoch_exactly_once(tmp_path):
    """bench/determinism.py --quick: one kill -9, one SIGTERM leaver, one resize with a kill."""
    bench = os.path.join(os.path.dirname(SCRIPTS), "..", "bench", "determinism.py")
    done = subprocess.run([sys.executable, bench, "--quick", "--dir", str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.split("epochs exactly-once")[-1].splitlines()[1:4]}
    assert rows == {"kill": ["1", "0", "2", "0"], "term": ["1", "0", "2", "0"], "resize": ["-", "-", "2", "0"]}
