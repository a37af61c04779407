"""hvdlite on Ray against Ray Train 2.60, the same model and step, on one real Ray cluster in
the same run (tests/raycluster.py: a head and three one-CPU nodes in network namespaces; root);
and hvdlite with its node templates against without (--no-preload), same run.

    sudo python bench/ray.py [--steps-before 20] [--grow-wait 150] [--no-ray-train] [--plain-first]
    sudo python bench/ray.py --node-loss [--trials 3] [--baseline CHECKOUT]

For each side, one elastic job of 2 to 3 workers, one per node:
- start -> first step: from the command's start to rank 0's first finished step;
- hvdlite only: a worker's join: kill -9 of the worker on n2 (after the templates serve); n2
  comes back after its blacklist cooldown (1-2 s) and its new worker is launched: from that
  launch (worker_start) to the first step at 3 workers;
- kill -9 of one worker's node (every process in its namespace) -> the survivors' next step;
- a node added (Ray lists it alive) -> the first step at the new size.
hvdlite: `hvdlite run --ray --min-np 2 --max-np 3` (bench/scripts/ray_step.py), with and without
`--no-preload`. Ray Train: TorchTrainer with ScalingConfig(num_workers=(2, 3)) and
FailureConfig(max_failures=-1), a checkpoint every 5 steps to resume from
(bench/scripts/ray_train_job.py).

--node-loss: hvdlite's side alone, a node lost two ways -> the survivors' next step (median of
--trials): kill -9 of its every process, and its link cut (every packet dropped in its
namespace: no FIN or RST reaches anyone). --baseline: the same trials, in the same run, with
the hvdlite of another checkout (one without the node probe, decisions/nodeloss.py: the
liveness timeout decides).
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from raycluster import RayCluster, missing  # noqa: E402

STEP = os.path.join(HERE, "scripts", "ray_step.py")
TRAIN = os.path.join(HERE, "scripts", "ray_train_job.py")


def records(log):
    """The JSON objects of a file, one a line (steps, events)."""
    try:
        with open(log) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def first(log, after, size=None, timeout=300.0):
    """Time of the first step logged after `after` (at `size`, if given)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for s in records(log):
            if s["t"] > after and (size is None or s["size"] == size):
                return s["t"]
        time.sleep(0.05)
    raise TimeoutError(f"no step{'' if size is None else f' at size {size}'} within {timeout:g} s")


def rejoin(cluster, log, event_log, templates):
    """kill -9 of n2's worker -> (seconds from its replacement's launch to the first step at 3)."""
    if templates:  # the templates start once the first world formed: wait until n2's serves
        deadline = time.time() + 180
        while cluster.template("n2") is None:
            if time.time() > deadline:
                raise TimeoutError("no template serves on n2")
            time.sleep(0.2)
    node = cluster.node_id("n2")

    def starts():
        return [e for e in records(event_log) if e["event"] == "worker_start" and e["slot"].startswith(node)]
    before = starts()
    os.kill(before[-1]["pid"], signal.SIGKILL)
    deadline = time.time() + 120
    while len(starts()) == len(before):
        if time.time() > deadline:
            raise TimeoutError("n2's worker was not replaced")
        time.sleep(0.05)
    new = starts()[-1]
    expected = "template" if templates else "ray"
    if new["started"] != expected:
        raise RuntimeError(f"n2's new worker started {new['started']!r}, not {expected!r}")
    launched = new["time"]
    return first(log, launched, size=3) - launched


def end(proc):
    """TERM the job's process group, KILL it if it lingers."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def measure(name, argv, cluster, args, workdir, templates=None):
    """(start, join or None, node kill, node added) in seconds; `templates`: an hvdlite side,
    with or without them (None: Ray Train)."""
    log = os.path.join(workdir, f"{name}.steps")
    event_log = os.path.join(workdir, f"{name}.events")
    if templates is not None:
        argv = [argv[0], *argv[1:4], "--event-log", event_log, *argv[4:]]
    env = {**cluster.env, "STEP_LOG": log, "STORAGE": os.path.join(workdir, "storage"),
           "PYTHONPATH": os.pathsep.join([os.path.join(HERE, ".."), os.environ.get("PYTHONPATH", "")])}
    out = open(os.path.join(workdir, f"{name}.out"), "w")
    start = time.time()
    proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        started = first(log, start) - start
        joined = None if templates is None else rejoin(cluster, log, event_log, templates)
        stepped = len(records(log))
        while len(records(log)) < stepped + args.steps_before:
            time.sleep(0.1)
        killed = time.time()
        cluster.kill_node("n3")
        recovered = first(log, killed, size=2) - killed
        time.sleep(2)
        cluster.start_node("n3")  # returns once Ray lists the node alive
        added = time.time()
        grown = first(log, added, size=3, timeout=args.grow_wait) - added
        return started, joined, recovered, grown
    finally:
        end(proc)
        out.close()
        for name_ in cluster.names:  # the next side starts on three fresh, idle nodes
            cluster.stop_node(name_)
            cluster.start_node(name_)


def node_loss(argv, cluster, args, workdir, root, cut):
    """Seconds from the loss of n3 (kill -9, or its link cut) to the survivors' next step, for
    the hvdlite of checkout `root`."""
    log = os.path.join(workdir, f"loss-{time.time():.0f}.steps")
    env = {**cluster.env, "STEP_LOG": log, "PYTHONPATH": root}
    start = time.time()
    with open(log + ".out", "w") as out:  # cwd: `-m hvdlite.cli` imports from it before PYTHONPATH
        proc = subprocess.Popen(argv, env=env, cwd=workdir, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        first(log, start)
        stepped = len(records(log))
        while len(records(log)) < stepped + args.steps_before:
            time.sleep(0.1)
        lost = time.time()
        if cut:
            cluster.partition("n3")
        else:
            cluster.kill_node("n3")
        return first(log, lost, size=2) - lost
    finally:
        end(proc)
        cluster.reset()  # n3 healed and started again, every node idle


def node_losses(cluster, args, workdir, hvdlite):
    roots = {"hvdlite": os.path.abspath(os.path.join(HERE, ".."))}
    if args.baseline:
        roots["baseline"] = os.path.abspath(args.baseline)
    argv = hvdlite + [sys.executable, STEP]
    figures = {}
    for how in ("kill -9", "cut"):
        for name, root in roots.items():
            seconds = [node_loss(argv, cluster, args, workdir, root, how == "cut") for _ in range(args.trials)]
            figures[how, name] = statistics.median(seconds)
            print(f"node {how}, {name} ({root}): survivors' next step after "
                  f"{', '.join(f'{x:.2f}' for x in seconds)} s", flush=True)
    print(f"\n{'node loss -> survivors next step':34s}" + "".join(f"{n:>12s}" for n in roots))
    for how in ("kill -9", "cut"):
        print(f"{how:34s}" + "".join(f"{figures[how, n]:11.2f}s" for n in roots) +
              f"   (median of {args.trials}; load {os.getloadavg()[0]:.2f})")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps-before", type=int, default=20, help="steps before the node is killed")
    p.add_argument("--grow-wait", type=float, default=150.0, help="seconds to wait for a grow")
    p.add_argument("--no-ray-train", action="store_true", help="hvdlite's sides only")
    p.add_argument("--plain-first", action="store_true", help="run --no-preload before templates")
    p.add_argument("--node-loss", action="store_true", help="only a node lost (kill -9, cut), hvdlite alone")
    p.add_argument("--trials", type=int, default=3, help="--node-loss: trials of each loss")
    p.add_argument("--baseline", help="--node-loss: also with the hvdlite of this checkout")
    args = p.parse_args()
    reason = missing()
    if reason:
        sys.exit(f"bench/ray.py: {reason}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the cluster is torn down on the way out
    workdir = tempfile.mkdtemp(prefix="hvdlite-bench-ray-")
    t = time.time()
    cluster = RayCluster(3)
    print(f"cluster: head + 3 nodes up in {time.time() - t:.1f} s ({cluster.address}); logs in {workdir}")
    hvdlite = [sys.executable, "-m", "hvdlite.cli", "run", "--ray", "--min-np", "2", "--max-np", "3",
               "--blacklist-cooldown-range", "1", "2", "--log-level", "WARNING"]
    sides = {  # name -> (argv, templates)
        "hvdlite, templates": (hvdlite + [sys.executable, STEP], True),
        "hvdlite, --no-preload": (hvdlite + ["--no-preload", sys.executable, STEP], False),
        "Ray Train 2.60": ([sys.executable, TRAIN], None),
    }
    if args.no_ray_train:
        del sides["Ray Train 2.60"]
    if args.plain_first:  # the first side meets colder caches: compare both orders
        sides = {"hvdlite, --no-preload": sides.pop("hvdlite, --no-preload"), **sides}
    figures = {}
    try:
        if args.node_loss:
            return node_losses(cluster, args, workdir, hvdlite)
        for name, (argv, templates) in sides.items():
            slug = "".join(c if c.isalnum() else "-" for c in name)
            figures[name] = measure(slug, argv, cluster, args, workdir, templates)
            print(f"{name}: " + ", ".join(f"{what} {value:.2f} s" for what, value in zip(WHAT, figures[name])
                                          if value is not None), flush=True)
    finally:
        cluster.close()
    table(figures, "hvdlite, templates", "hvdlite, --no-preload")
    if "Ray Train 2.60" in figures:
        table(figures, "hvdlite, templates", "Ray Train 2.60")


WHAT = ["start -> first step", "a worker's join -> step at 3", "node kill -9 -> survivors' next step",
        "node added -> first step at 3"]


def table(figures, ours, theirs):
    print(f"\n{'':38s}{ours:>24s}{theirs:>24s}{'ratio':>8s}")
    for what, a, b in zip(WHAT, figures[ours], figures[theirs]):
        if a is not None and b is not None:
            print(f"{what:38s}{a:23.2f}s{b:23.2f}s{a / b:8.2f}")


if __name__ == "__main__":
    main()
