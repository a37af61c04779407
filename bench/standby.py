"""A cut of the active driver's host, with a standby on another host: python bench/standby.py [--pairs 1]

Needs root: five network-namespace sshd test hosts (tests/sshhosts.py) with a three-member etcd
cluster on host-1..host-3 (tests/etcdcluster.py). The 2-worker job (tests/scripts/
determinism_job.py, --checkpoint-dir, --driver-store etcd) runs its workers on host-1 and host-2
over SSH and its driver on host-4, which is cut off (every packet dropped) once rank 0 reached
step 10. Each pair runs it twice:
- standby: a `--standby` driver waits on host-5. Measured: the time from the cut until it took
  the workers over (job_adopted) and every one beat to it (job_readopted), and the steps the
  workers committed in that time;
- today: --driver-grace equal to --liveness-timeout, as hvdlite was: the workers exit 75 once the
  driver is silent for that long, and the same command, run on host-5 once they did (a
  supervisor's restart), starts new ones from the disk. Measured: the time from the cut until the
  resumed training's first commit.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")
sys.path.insert(0, os.path.join(ROOT, "tests"))
from etcdcluster import EtcdCluster  # noqa: E402
from sshhosts import TestHosts  # noqa: E402
from failover import events, wait  # noqa: E402 (bench/, this script's folder)

JOB = [sys.executable, os.path.join(SCRIPTS, "determinism_job.py")]
CUT_AT = 10  # rank 0's step


def progress(folder):
    """(step, mtime) of rank 0's last commit."""
    path = os.path.join(folder, "log", "progress")
    try:
        with open(path) as f:
            return int(f.read() or 0), os.stat(path).st_mtime
    except (OSError, ValueError):
        return 0, 0.0


class Trial:
    def __init__(self, hosts, cluster, folder):
        self.hosts, self.folder, self.procs = hosts, folder, []
        self.flags = ["-np", "2", "--min-np", "2", "--max-np", "2", "-H", "host-1:1,host-2:1", "--ssh-config",
                      hosts.ssh_config, "--checkpoint-dir", os.path.join(folder, "ckpt"), "--checkpoint-interval",
                      "0", "--driver-store", cluster.url]
        os.makedirs(os.path.join(folder, "log"))

    def start(self, host, name, extra=()):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, SCRIPTS]), "LOG_DIR": os.path.join(self.folder, "log"),
               "EPOCHS": "6", "WORKERS": "0", "STEP_SLEEP": "0.2"}
        out = open(os.path.join(self.folder, f"{name}.out"), "w")
        self.procs.append(subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.hosts.hosts[host].netns}", sys.executable, "-m", "hvdlite.cli", "run",
             "--event-log", os.path.join(self.folder, f"{name}.jsonl"), *self.flags, *extra, *JOB],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
        return self.procs[-1]

    def workers(self):
        return [(e["slot"].split("/")[0], e["pid"]) for name in ("active", "rerun")
                for e in events(self.folder, name) if e["event"] == "worker_start"]

    def alive(self):
        return [w for w in self.workers() if self.hosts.run(w[0], f"kill -0 {int(w[1])}").returncode == 0]

    def end(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        for host, pid in self.workers():
            self.hosts.run(host, f"kill -9 -- -{int(pid)} 2>/dev/null")


def trial(hosts, cluster, folder, standby: bool) -> dict:
    t = Trial(hosts, cluster, folder)
    try:
        t.start("host-4", "active", () if standby else ("--driver-grace", "5"))
        wait(lambda: progress(folder)[0] >= CUT_AT, 180, "step 10")
        if standby:
            t.start("host-5", "rerun", ("--standby",))
            wait(lambda: any("leads the job" in line for line in open(os.path.join(folder, "rerun.out"))), 60,
                 "the standby's wait")
        hosts.partition("host-4")
        cut, (step, _) = time.time(), progress(folder)
        try:
            if standby:
                done = wait(lambda: [e for e in events(folder, "rerun") if e["event"] == "job_readopted"], 120,
                            "the take-over")
                adopted = [e for e in events(folder, "rerun") if e["event"] == "job_adopted"][0]["time"]
                return {"adopted": adopted - cut, "readopted": done[0]["time"] - cut,
                        "steps": progress(folder)[0] - step}
            wait(lambda: not t.alive(), 120, "the workers' exit 75")
            exited = time.time()
            rerun = t.start("host-5", "rerun", ("--driver-grace", "5", "--standby"))  # once the lease lapsed
            _, before = progress(folder)
            first = wait(lambda: progress(folder)[1] > before and progress(folder)[1], 180, "the resumed training")
            assert rerun.poll() is None
            return {"exited": exited - cut, "resumed": first - cut}
        finally:
            hosts.heal("host-4")
    finally:
        t.end()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--kinds", nargs="+", choices=["standby", "today"], default=["standby", "today"])
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/standby.py needs root (network namespaces)")
    hosts = TestHosts(5)
    try:
        cluster = EtcdCluster(hosts)
        try:
            runs = {"standby": [], "today": []}
            with tempfile.TemporaryDirectory(prefix="hvdlite-bench-standby-") as tmp:
                for pair in range(args.pairs):
                    for kind in args.kinds:
                        result = trial(hosts, cluster, os.path.join(tmp, f"{kind}{pair}"), kind == "standby")
                        runs[kind].append(result)
                        print(kind, {k: round(v, 2) for k, v in result.items()}, "load",
                              open("/proc/loadavg").read().split()[0], flush=True)
            if not all(runs.values()):
                return
            took_over = statistics.median(r["readopted"] for r in runs["standby"])
            resumed = statistics.median(r["resumed"] for r in runs["today"])
            print(f"cut -> training under a new driver: standby {took_over:.2f} s (median), today "
                  f"{resumed:.2f} s; ratio {took_over / resumed:.2f}x; steps committed while the "
                  f"standby took over: {[r['steps'] for r in runs['standby']]}")
        finally:
            cluster.close()
    finally:
        hosts.close()


if __name__ == "__main__":
    main()
