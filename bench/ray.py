"""hvdlite on Ray against Ray Train 2.60, the same model and step, on one real Ray cluster in
the same run (tests/raycluster.py: a head and three one-CPU nodes in network namespaces; root).

    sudo python bench/ray.py [--steps-before 20] [--grow-wait 150]

For each side, one elastic job of 2 to 3 workers, one per node:
- start -> first step: from the command's start to rank 0's first finished step;
- kill -9 of one worker's node (every process in its namespace) -> the survivors' next step;
- a node added (Ray lists it alive) -> the first step at the new size.
hvdlite: `hvdlite run --ray --min-np 2 --max-np 3` (bench/scripts/ray_step.py). Ray Train:
TorchTrainer with ScalingConfig(num_workers=(2, 3)) and FailureConfig(max_failures=-1), a
checkpoint every 5 steps to resume from (bench/scripts/ray_train_job.py).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from raycluster import RayCluster, missing  # noqa: E402

STEP = os.path.join(HERE, "scripts", "ray_step.py")
TRAIN = os.path.join(HERE, "scripts", "ray_train_job.py")


def steps(log):
    try:
        with open(log) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def first(log, after, size=None, timeout=300.0):
    """Time of the first step logged after `after` (at `size`, if given)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for s in steps(log):
            if s["t"] > after and (size is None or s["size"] == size):
                return s["t"]
        time.sleep(0.05)
    raise TimeoutError(f"no step{'' if size is None else f' at size {size}'} within {timeout:g} s")


def measure(name, argv, cluster, args, workdir):
    log = os.path.join(workdir, f"{name}.steps")
    env = {**cluster.env, "STEP_LOG": log, "STORAGE": os.path.join(workdir, "storage"),
           "PYTHONPATH": os.pathsep.join([os.path.join(HERE, ".."), os.environ.get("PYTHONPATH", "")])}
    out = open(os.path.join(workdir, f"{name}.out"), "w")
    start = time.time()
    proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        started = first(log, start) - start
        while len(steps(log)) < args.steps_before:
            time.sleep(0.1)
        killed = time.time()
        cluster.kill_node("n3")
        recovered = first(log, killed, size=2) - killed
        time.sleep(2)
        cluster.start_node("n3")  # returns once Ray lists the node alive
        added = time.time()
        grown = first(log, added, size=3, timeout=args.grow_wait) - added
        return started, recovered, grown
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        out.close()
        for name_ in cluster.names:  # the next side starts on three fresh, idle nodes
            cluster.stop_node(name_)
            cluster.start_node(name_)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps-before", type=int, default=20, help="steps before the node is killed")
    p.add_argument("--grow-wait", type=float, default=150.0, help="seconds to wait for a grow")
    args = p.parse_args()
    reason = missing()
    if reason:
        sys.exit(f"bench/ray.py: {reason}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the cluster is torn down on the way out
    workdir = tempfile.mkdtemp(prefix="hvdlite-bench-ray-")
    t = time.time()
    cluster = RayCluster(3)
    print(f"cluster: head + 3 nodes up in {time.time() - t:.1f} s ({cluster.address}); logs in {workdir}")
    sides = {
        "hvdlite on Ray": [sys.executable, "-m", "hvdlite.cli", "run", "--ray", "--min-np", "2",
                           "--max-np", "3", "--log-level", "WARNING", sys.executable, STEP],
        "Ray Train 2.60": [sys.executable, TRAIN],
    }
    figures = {}
    try:
        for name, argv in sides.items():
            figures[name] = measure(name.split()[0].lower(), argv, cluster, args, workdir)
            print(f"{name}: start -> first step {figures[name][0]:.2f} s, node kill -9 -> next step "
                  f"{figures[name][1]:.2f} s, node added -> first step at 3 {figures[name][2]:.2f} s",
                  flush=True)
    finally:
        cluster.close()
    ours, theirs = figures["hvdlite on Ray"], figures["Ray Train 2.60"]
    print(f"\n{'':38s}{'hvdlite on Ray':>16s}{'Ray Train 2.60':>16s}{'ratio':>8s}")
    for i, what in enumerate(["start -> first step", "node kill -9 -> survivors' next step",
                              "node added -> first step at 3"]):
        print(f"{what:38s}{ours[i]:15.2f}s{theirs[i]:15.2f}s{ours[i] / theirs[i]:8.2f}")


if __name__ == "__main__":
    main()
