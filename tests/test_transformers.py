"""Hugging Face's Trainer and Accelerate under hvdlite run (docs/transformers.md): unchanged
scripts compute what they compute under torchrun; ElasticTrainer keeps the survivors of a
kill -9 in their processes, takes in a worker that joins, and trains every sample of an epoch
exactly once. One tiny GPT-2 script (scripts/hf_train.py) does it all; its jobs are few, each
checked for several things, since importing transformers costs seconds per worker."""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from jobs import SCRIPTS, Job, discovery, run_job

pytest.importorskip("transformers", reason="transformers is not installed: pip install -e '.[transformers]'")
pytest.importorskip("accelerate", reason="accelerate is not installed: pip install -e '.[transformers]'")
TORCHRUN = shutil.which("torchrun")
SCRIPT = os.path.join(SCRIPTS, "hf_train.py")
SAMPLES = 48  # hf_train.py's data set
OFFLINE = {"HF_HUB_OFFLINE": "1"}
# The elastic jobs' workers fork from a template that imported the Trainer and Accelerate: one
# import of several CPU-s a job instead of one a worker (the torchrun comparison starts them
# plainly). Not hvdlite.transformers: in an elastic job its import joins the world, which a
# template must leave to each worker.
PRELOAD = ["--preload", "torch._dynamo,transformers.trainer,accelerate"]


def finals(folder):
    return sorted((json.loads(p.read_text()) for p in folder.glob("rank*.json")), key=lambda r: r["rank"])


def trained_samples(folder):
    """The samples each epoch trained, from hf_train.py's log: of a step trained in several
    worlds (replayed after a rollback), the latest world's; epochs follow each other in order."""
    latest = {}
    for line in (folder / "samples").read_text().splitlines():
        world, step, _, _, *ids = map(int, line.split())
        if step not in latest or world > latest[step][0]:
            latest[step] = (world, [])
        if world == latest[step][0]:
            latest[step][1].extend(ids)
    flat = [i for step in sorted(latest) for i in latest[step][1]]
    return [sorted(flat[k:k + SAMPLES]) for k in range(0, len(flat), SAMPLES)]


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not on PATH")
def test_an_unchanged_trainer_script_and_accelerate_loop_compute_what_they_compute_under_torchrun(tmp_path):
    theirs, ours = tmp_path / "torchrun", tmp_path / "hvdlite"
    theirs.mkdir(), ours.mkdir()
    done = subprocess.run([TORCHRUN, "--nproc-per-node", "2", SCRIPT], capture_output=True, text=True,
                          env={**os.environ, **OFFLINE, "OUT_DIR": str(theirs)}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = run_job(["-np", "2", sys.executable, SCRIPT], tmp_path, timeout=300, env={**OFFLINE, "OUT_DIR": str(ours)})
    assert result.code == 0, result.stderr[-3000:]
    theirs, ours = finals(theirs), finals(ours)
    assert len(ours) == 2 and [r["size"] for r in ours] == [2, 2] and ours[0]["accelerate_size"] == 2
    assert theirs == ours  # parameters (Trainer's, then the Accelerate loop's), losses, steps: to the bit
    assert ours[0]["steps"] == 12  # 48 samples, 4 a batch, 2 ranks, 2 epochs: DDP, not two lone runs


def test_an_elastic_trainer_shrinks_on_a_kill_9_and_grows_in_process(tmp_path):
    """3 workers, a commit every 2 steps (4 steps an epoch). Slot 127.0.0.3/0 kills itself
    before step 4: the two survivors roll back to step 2's commit and finish epoch 0 between
    them; discovery then adds two hosts, whose workers join at the commit of step 8 and train
    the rest of epoch 1 with them (on the LR schedule of the first world, though theirs had
    4 workers). Rank 0 stays one process; every sample is trained once an epoch."""
    grown = ["127.0.0.1:1", "127.0.0.2:1", "127.0.0.4:1", "127.0.0.5:1"]
    schedule = [[0, ["127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:1"]], [7, grown]]
    env = {**OFFLINE, "OUT_DIR": str(tmp_path), "TRAINER": "elastic", "COMMIT_EVERY": "2", "KILL_STEP": "4",
           "VICTIM": "127.0.0.3/0", "GROW_STEP": "8"}
    with Job([*discovery(tmp_path, schedule), "--min-np", "1", "--start-timeout", "120", *PRELOAD, sys.executable,
              SCRIPT], tmp_path, env=env) as job:
        result = job.finish(400)
    assert result.code == 0, result.stderr[-3000:]
    assert [e["slot"] for e in result.events if e["event"] == "worker_start"].count("127.0.0.1/0") == 1
    assert {e["started"] for e in result.of("worker_start")} == {"template"}
    ranks = finals(tmp_path)
    assert [r["size"] for r in ranks] == [4] * 4 and len({r["params"] for r in ranks}) == 1
    assert [r["seen_by_accelerate"] for r in ranks] == [[4, 4, rank] for rank in range(4)]  # its cache refreshed
    assert ranks[0]["steps"] == 2 + 3 + 3 + 2  # world 3, the 2 survivors (epoch 0's rest, then 3 steps), world 4
    assert ranks[0]["epoch"] == 2.0
    assert trained_samples(tmp_path) == [list(range(SAMPLES))] * 2
    sizes = {int(line.split()[3]) for line in (tmp_path / "samples").read_text().splitlines()}
    assert sizes == {2, 3, 4}


def test_an_elastic_trainer_at_the_same_size_and_after_a_stop_ends_bitwise_as_the_fault_free_run(tmp_path):
    """The fault-free run; then the same job with a spare slot: slot 127.0.0.3/0 kills itself
    before step 3, the spare takes its rank at step 2's commit; the job is stopped (SIGTERM)
    at step 4, the last of epoch 0, with --checkpoint-dir and exits 75; its rerun resumes from
    that commit on disk, whose epoch has no sample left.
    Its final parameters and losses are the fault-free run's, to the bit; trainer.save_model
    and the Trainer's own checkpoints (every 3 steps, and at the end) are written as without hvdlite."""
    fixed = ["-np", "3", "--min-np", "3", "--max-np", "3", "--start-timeout", "120", *PRELOAD]
    env = {**OFFLINE, "TRAINER": "elastic", "COMMIT_EVERY": "2"}
    reference = tmp_path / "reference"
    reference.mkdir()
    result = run_job(["-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1", *fixed, sys.executable, SCRIPT], reference,
                     timeout=300, env={**env, "OUT_DIR": str(reference)})
    assert result.code == 0, result.stderr[-3000:]
    faulty = tmp_path / "faulty"
    faulty.mkdir()
    args = ["-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1,127.0.0.4:1", *fixed, "--checkpoint-dir",
            str(tmp_path / "ckpt"), sys.executable, SCRIPT]
    env = {**env, "OUT_DIR": str(faulty), "SAVE_DIR": str(tmp_path / "saved"), "SAVE_STRATEGY": "steps"}
    with Job(args, faulty, env={**env, "KILL_STEP": "3", "VICTIM": "127.0.0.3/0", "HOLD_STEP": "4"}) as job:
        job.wait_for(lambda _: (faulty / "held").exists(), 300)
        job.proc.send_signal(signal.SIGTERM)
        result = job.finish(120)
    assert result.code == 75, result.stderr[-3000:]
    assert "127.0.0.4/0" in {e["slot"] for e in result.events if e["event"] == "worker_start"}
    result = run_job(args, faulty, timeout=300, env=env)
    assert result.code == 0, result.stderr[-3000:]
    assert "resumed from commit" in result.stderr
    expected, got = finals(reference), finals(faulty)
    assert [r["params"] for r in got] == [r["params"] for r in expected]
    assert got[0]["log"] == expected[0]["log"] and got[0]["steps"] == 8
    assert (tmp_path / "saved" / "model.safetensors").exists() and (tmp_path / "saved" / "config.json").exists()
    checkpoints = sorted(p.name for p in (faulty / "trainer").glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-3", "checkpoint-6", "checkpoint-8"]
