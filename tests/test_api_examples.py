"""The examples run as the README says, briefly, in elastic mode, one of them losing a worker."""
import os
import signal
import sys

from jobs import Job, run_job

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def test_elastic_synthetic_benchmark(tmp_path):
    r = run_job(["-np", "2", "--min-np", "1", sys.executable,
                 os.path.join(EXAMPLES, "elastic_synthetic_benchmark.py"), "--num-iters", "2",
                 "--num-batches-per-iter", "2", "--batch-size", "8"], tmp_path, timeout=120)
    assert r.code == 0, r.stderr
    assert "[0]<stdout>:iter #1:" in r.stdout
    assert "total on 2 ranks" in r.stdout


def test_elastic_mnist_learns_and_survives_a_kill_9(tmp_path):
    with Job(["-H", "localhost:3", "--min-np", "1", sys.executable,
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
