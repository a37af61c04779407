"""The examples run as the README says, briefly, in elastic mode, one of them losing a worker."""
import os
import re
import signal

import sys

import pytest

from jobs import PRELOADED, Job, run_job, slot_pid

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def test_elastic_synthetic_benchmark(tmp_path):
    r = run_job(["-np", "2", "--min-np", "1", sys.executable,
                 os.path.join(EXAMPLES, "elastic_synthetic_benchmark.py"), "--num-iters", "2",
                 "--num-batches-per-iter", "2", "--batch-size", "8"], tmp_path, timeout=120)
    assert r.code == 0, r.stderr
    assert "[0]<stdout>:iter #1:" in r.stdout
    assert "total on 2 ranks" in r.stdout


def test_elastic_mnist_learns_and_survives_a_kill_9(tmp_path):
    # Its workers fork from a template that imported torch: one import instead of three.
    with Job(["-H", "localhost:3", "--min-np", "1", *PRELOADED, sys.executable,
              os.path.join(EXAMPLES, "elastic_mnist.py"), "--epochs", "3", "--samples", "1536"],
             tmp_path) as job:
        job.wait_for(lambda _: "epoch 0:" in Job.read(job.out), 90)
        os.kill([e["pid"] for e in job.events() if e["event"] == "worker_start"
                 and e["slot"] == "localhost/2"][0], signal.SIGKILL)
        r = job.finish(120)
    assert r.code == 0, r.stderr
    epochs = [line for line in r.stdout.splitlines() if "epoch" in line]
    assert "world size 3" in epochs[0] and "world size 2" in epochs[-1]
    accuracy = float(epochs[-1].split("accuracy ")[1].split("%")[0])
    assert accuracy > 90, epochs


NUMPY_PYTHON = os.path.join(os.path.dirname(EXAMPLES), ".venv-pygloo", "bin", "python")


def test_train_numpy_learns_and_survives_a_kill_9(tmp_path):
    """examples/train_numpy.py, the README's numpy job, on the pygloo venv: rank 1 killed midway,
    rank 0 goes on alone from the last commit and still finds the weights."""
    if not os.path.exists(NUMPY_PYTHON):
        pytest.skip(f"no pygloo venv at {NUMPY_PYTHON}: pygloo needs Python 3.8-3.10 (.ci/setup.sh)")
    with Job(["-np", "2", "--min-np", "1", NUMPY_PYTHON, os.path.join(EXAMPLES, "train_numpy.py")],
             tmp_path, env={"STEP_SLEEP": "0.02"}) as job:
        job.wait_for(lambda _: "step 50 " in Job.read(job.out), 90)
        os.kill(slot_pid(job, "localhost/1"), signal.SIGKILL)
        r = job.finish(120)
    assert r.code == 0, r.stderr
    steps = [line for line in r.stdout.splitlines() if "<stdout>:step" in line]
    assert "world size 2" in steps[0] and "world size 1" in steps[-1], steps
    assert "step 200 " in steps[-1]
    error = float(r.stdout.split("|w - true w| = ")[1].split()[0])
    assert error < 1e-3, r.stdout


def test_the_readmes_first_command_shows_a_re_form_and_a_join(tmp_path):
    """The README's first job, as written: a worker lost and one gained while it trains, in
    the first minute, and the job ends well."""
    with open(os.path.join(os.path.dirname(EXAMPLES), "README.md")) as f:
        first = next(line for line in f if line.startswith("python3 -m pip install"))
    command = first.split("&& ", 1)[1].split()
    assert command[:2] == ["hvdlite", "run"] and command[-2] == "python3"
    root = os.path.dirname(EXAMPLES)
    command = [os.path.join(root, word) if word.startswith("examples/") else word for word in command]
    with Job([*command[2:-2], sys.executable, command[-1]], tmp_path) as job:
        r = job.finish(120)
    assert r.code == 0, r.stderr
    assert "world 1 broke; the survivors roll back to their last commit" in r.stderr
    assert "hosts changed: localhost 2 -> 3 slots" in r.stderr
    assert [e["slot"] for e in r.of("worker_start")][-1] == "localhost/2"
    # The kill first, then the join: the third slot comes with progress (commit 30), not time.
    assert [e["size"] for e in r.of("round_complete")] == [2, 1, 2]
    # Sentences only: no raw `event key=value` line reaches the console.
    raw = [line for line in r.stderr.splitlines() if re.match(r"hvdlite: [a-z_]+ [a-z_]+=", line)]
    assert not raw, raw


def test_elastic_train_resumes_at_an_epochs_last_batch_and_a_finished_rerun_ends_at_once(tmp_path):
    """examples/elastic_train.py with --checkpoint-dir: resumed from the commit after the
    epoch's last batch (the epoch's own commit removed), its loop runs no batch and the epoch
    ends as it would have; then a rerun of the finished job ends at once, one line, exit 0."""
    folder = tmp_path / "ckpt"
    args = ["-np", "1", "--checkpoint-dir", str(folder), "--checkpoint-interval", "0", "--checkpoint-keep", "100",
            sys.executable, os.path.join(EXAMPLES, "elastic_train.py")]
    env = {"EPOCHS": "1", "DEMO_FAULTS": "0", "STEP_SLEEP": "0.3"}  # the writer keeps up (it skips commits when busy)
    for run in ("first", "at-last-batch", "finished"):
        (tmp_path / run).mkdir()
    r = run_job(args, tmp_path / "first", timeout=120, env=env)
    assert r.code == 0, r.stderr
    names = sorted(os.listdir(folder))
    last_batch, epoch_end = names[-2:]  # commits 32 (512 samples in batches of 16) and 33
    assert last_batch.startswith("commit-000000000032-"), names
    os.remove(folder / epoch_end)
    r = run_job(args, tmp_path / "at-last-batch", timeout=120, env=env)
    assert r.code == 0 and "resumed from commit 32 " in r.stderr, r.stderr
    assert "epoch 0 done" in r.stdout
    r = run_job(args, tmp_path / "finished", timeout=120, env=env)
    assert r.code == 0 and "resumed from commit 33 " in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "epoch" not in r.stdout, r.stdout + r.stderr
