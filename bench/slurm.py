"""hvdlite on a real Slurm cluster (tests/slurmcluster.py, needs root), against baselines in the
same run:

    python bench/slurm.py [--trials 3] [--kill-trials 1] [--baseline CHECKOUT] [--loss-only]

- start: 8 workers on 4 nodes (2 each), every one started on the launch pool of `hvdlite run`
  (executor.LAUNCH_THREADS), until every worker runs: as srun steps from inside an allocation
  (`salloc -N4 --ntasks-per-node=2`) against the SSH launcher on 4 sshd test hosts
  (tests/sshhosts.py) with fresh connections, as at a job's start. Median of --trials.
- node kill: an elastic job on 4 nodes under --no-kill (default --liveness-timeout), one
  node's every process killed -9: seconds until hvdlite's world re-formed without it, against
  the seconds until Slurm marks the node DOWN (SlurmdTimeout=30, as the notes' cluster).
- node cut: the same, the node's link cut instead (every packet dropped in its namespace, so
  no FIN or RST reaches anyone), against the same Slurm detection.
--baseline: the node kill and cut trials again, in the same run, with the hvdlite of another
checkout (one without the node probe, decisions/nodeloss.py: the liveness timeout decides).
--loss-only: no start trials.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "tests"))
from slurmcluster import SlurmCluster  # noqa: E402
from sshhosts import TestHosts  # noqa: E402

from hvdlite.driver.executor import LAUNCH_THREADS  # noqa: E402
from hvdlite.driver.launchers.ssh import SSHHost, SSHSettings, launch  # noqa: E402

WORKER = [sys.executable, "-c", "print('up', flush=True)"]
JOB = [sys.executable, os.path.join(ROOT, "tests", "scripts", "elastic_job.py")]


class Quiet:
    """A RankOutput that drops the worker's lines."""
    label = "0"

    def line(self, stream, text):
        pass


def _start_all(start, hosts):
    began = time.monotonic()
    with ThreadPoolExecutor(LAUNCH_THREADS) as pool:
        workers = list(pool.map(start, hosts))
    took = time.monotonic() - began
    for worker in workers:
        if worker.wait(30) != 0:
            raise RuntimeError("a worker failed")
        worker.finish_output()
    return took


def ssh_trial(hosts, cwd) -> float:
    conns = {name: SSHHost(name, SSHSettings(ssh_config=hosts.ssh_config)) for name in hosts.names}
    env = {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}
    try:
        return _start_all(lambda name: launch(conns[name], WORKER, env, cwd, Quiet()),
                          [n for n in hosts.names for _ in range(2)])
    finally:
        for conn in conns.values():
            conn.close()


def srun_trials(trials):
    """Inside the allocation (run by salloc): the srun launcher's start of 8 workers."""
    from hvdlite.discovery.slurm import allocation
    from hvdlite.driver.launchers.srun import SrunLauncher
    from hvdlite.driver.settings import Settings
    alloc = allocation()
    launcher = SrunLauncher(Settings(command=WORKER), say=print)
    env = dict(os.environ)
    hosts = [h for h, n in alloc.hosts for _ in range(n)]
    return [_start_all(lambda h: launcher.start(h, env, Quiet(), False), hosts)
            for _ in range(trials)]


def start_bench(cluster, trials):
    out = cluster.run(["salloc", "-N4", "--ntasks-per-node=2", sys.executable, __file__,
                       "--inner-srun", str(trials)], env={"PYTHONPATH": ROOT}, timeout=600)
    srun = json.loads(out.stdout.strip().splitlines()[-1])
    with TestHosts(4) as hosts, tempfile.TemporaryDirectory() as cwd:
        ssh = [ssh_trial(hosts, cwd) for _ in range(trials)]
    s, h = statistics.median(srun), statistics.median(ssh)
    print(f"start 8 workers on 4 nodes: srun_s={s:.3f} ssh_s={h:.3f} ratio srun/ssh={s / h:.2f}x "
          f"(median of {trials}; srun {sorted(round(x, 3) for x in srun)}, "
          f"ssh {sorted(round(x, 3) for x in ssh)})")


def _rounds(path):
    try:
        with open(path) as f:
            return [e for e in map(json.loads, f) if e["event"] == "round_complete"]
    except FileNotFoundError:
        return []


def kill_trial(cluster, victim="n4", cut=False, root=ROOT):
    """(seconds to hvdlite's re-form, to Slurm's DOWN) after the node's loss, for the hvdlite
    of checkout `root`."""
    with tempfile.TemporaryDirectory() as d:
        events = os.path.join(d, "events.jsonl")
        env = {**cluster.env, "PYTHONPATH": root, "SALLOC_NO_KILL": "", "LOG_DIR": d,
               "TOTAL_STEPS": "100000", "STEP_SLEEP": "0.1"}
        proc = subprocess.Popen(
            ["salloc", "-N4", "--no-kill", sys.executable, "-m", "hvdlite.cli", "run",
             "--event-log", events, "--min-np", "2", *JOB], env=env, cwd=d,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while not _rounds(events):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the job did not form its first world")
                time.sleep(0.1)
            time.sleep(2)
            killed = time.time()
            if cut:
                cluster.partition(victim)
            else:
                cluster.kill_node(victim)
            while len(_rounds(events)) < 2:
                if time.time() - killed > 120:
                    raise RuntimeError("no re-form within 120 s")
                time.sleep(0.05)
            reformed = _rounds(events)[1]["time"] - killed
            while not re.search(r"State=\S*DOWN", cluster.run(["scontrol", "show", "node", victim]).stdout):
                if time.time() - killed > 600:
                    raise RuntimeError("Slurm did not mark the node down within 600 s")
                time.sleep(0.25)
            down = time.time() - killed
        finally:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(10)
            if cut:
                cluster.heal(victim)
                cluster.kill_node(victim)  # its orphaned task runs on after a heal (the notes)
            cluster.start_node(victim)
    return reformed, down


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--kill-trials", type=int, default=1)
    p.add_argument("--inner-srun", type=int, help=argparse.SUPPRESS)
    p.add_argument("--baseline", help="the loss trials also with the hvdlite of this checkout")
    p.add_argument("--loss-only", action="store_true", help="no start trials")
    args = p.parse_args()
    if args.inner_srun:
        print(json.dumps(srun_trials(args.inner_srun)))
        return
    roots = {"hvdlite": os.path.abspath(ROOT), **({"baseline": os.path.abspath(args.baseline)} if args.baseline else {})}
    with SlurmCluster(4, slurmd_timeout=30) as cluster:
        if not args.loss_only:
            start_bench(cluster, args.trials)
        losses = {(how, name): [kill_trial(cluster, cut=how == "cut", root=root) for _ in range(args.kill_trials)]
                  for how in ("kill -9", "cut") for name, root in roots.items()}
    for (how, name), trials in losses.items():
        reform, down = statistics.median(k[0] for k in trials), statistics.median(k[1] for k in trials)
        print(f"node {how}, {name} ({roots[name]}): re-formed in {reform:.2f} s "
              f"({', '.join(f'{k[0]:.2f}' for k in trials)}), Slurm marked the node DOWN after "
              f"{down:.1f} s (SlurmdTimeout=30): ratio hvdlite/slurm={reform / down:.3f} "
              f"({args.kill_trials} trial(s); load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
