"""Elastic recovery on this machine, against torchrun measured in the same run.

    python bench/elastic.py [--trials 20] [--sizes 2 4 8] [--baseline-trials 3]

Prints, from real jobs on localhost:
- kill -9 of a worker -> the survivors' next completed allreduce (per trial the latest
  survivor to resume): median and max over --trials kills (target max <= 1 s);
- a slot coming back -> the new worker's first completed allreduce, from its launch
  (target <= 3 s), and the survivors' stall while it joins;
- kill -9 recovery at several world sizes;
- torchrun (c10d rendezvous, --max-restarts) on the same kill, and the ratio.
"""
import argparse
import glob
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LOOP = os.path.join(HERE, "scripts", "allreduce_loop.py")


class Run:
    """One job whose processes append their allreduce completions to LOG_DIR/<pid>.log."""

    def __init__(self, cmd, env_extra=None, folder=None):
        self.dir = folder or tempfile.mkdtemp(prefix="hvdlite-bench-")
        self.stop = os.path.join(self.dir, "stop")
        env = {**os.environ, "LOG_DIR": self.dir, "STOP_FILE": self.stop, **(env_extra or {})}
        self.out = open(os.path.join(self.dir, "driver.out"), "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def completions(self):
        """pid -> [(time, round, rank, size)]"""
        result = {}
        for path in glob.glob(os.path.join(self.dir, "*.log")):
            with open(path) as f:
                rows = [line.split() for line in f if line.count(" ") == 3]
            result[int(os.path.basename(path)[:-4])] = [
                (float(t), int(r), int(k), int(n)) for t, r, k, n in rows]
        return result

    def events(self):
        try:
            with open(os.path.join(self.dir, "events.jsonl")) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def wait(self, predicate, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.02)
        return False

    def close(self):
        open(self.stop, "w").close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        for pid in self.completions():  # workers lead their own groups under hvdlite
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.out.close()


def start_hvdlite(n):
    folder = tempfile.mkdtemp(prefix="hvdlite-bench-")
    return Run([sys.executable, "-m", "hvdlite.cli", "run", "--event-log",
                os.path.join(folder, "events.jsonl"), "-H", f"localhost:{n}", "--min-np", "1",
                "--blacklist-cooldown-range", "1", "1", sys.executable, LOOP], folder=folder)


def members(run):
    rounds = [e for e in run.events() if e["event"] == "round_complete"]
    return rounds[-1] if rounds else None


def pid_of(run, slot):
    return [e["pid"] for e in run.events() if e["event"] == "worker_start" and e["slot"] == slot][-1]


def kill_trial(run, n, rng):
    """Kill one member of a full world; returns (recovery, join, stall) in seconds or None."""
    if not run.wait(lambda: (members(run) or {}).get("size") == n, 60):
        return None
    world = members(run)
    victim = pid_of(run, rng.choice(sorted(world["members"])))
    time.sleep(0.3)  # let the world run a little
    killed = time.time()
    os.kill(victim, signal.SIGKILL)
    old_round = world["round"]
    survivors = [pid_of(run, s) for s in world["members"] if pid_of(run, s) != victim]

    def resumed(pid):
        return [t for t, r, _, _ in run.completions().get(pid, []) if r > old_round and t > killed]

    if not run.wait(lambda: all(resumed(p) for p in survivors), 30):
        return None
    recovery = max(min(resumed(p)) for p in survivors) - killed
    # The killed slot comes back after its 1 s cooldown; the new worker joins the survivors.
    if not run.wait(lambda: (members(run) or {}).get("size") == n
                    and members(run)["round"] > old_round + 1, 30):
        return recovery, None, None
    joined = members(run)
    newcomer = [e for e in run.events() if e["event"] == "worker_start" and e["time"] > killed][-1]
    if not run.wait(lambda: run.completions().get(newcomer["pid"]), 10):
        return recovery, None, None
    join = min(t for t, *_ in run.completions()[newcomer["pid"]]) - newcomer["time"]
    gaps = []
    for p in survivors:
        before = [t for t, r, _, _ in run.completions()[p] if r == joined["round"] - 1]
        after = [t for t, r, _, _ in run.completions()[p] if r == joined["round"]]
        if before and after:
            gaps.append(min(after) - max(before))
    return recovery, join, max(gaps) if gaps else None


def hvdlite_trials(n, trials, rng):
    run = start_hvdlite(n)
    results = []
    try:
        for _ in range(trials):
            r = kill_trial(run, n, rng)
            if r is None:
                print(f"  (size {n}: a trial did not complete; see {run.dir})", flush=True)
                break
            results.append(r)
    finally:
        run.close()
    return results


def torchrun_trials(trials):
    """Recovery of torchrun on the same kill: it restarts every worker."""
    times = []
    for _ in range(trials):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        run = Run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                   "--nproc-per-node", "3", "--max-restarts", "3", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"127.0.0.1:{port}", "--monitor-interval", "0.1", LOOP],
                  {"BASELINE": "torchrun", "OMP_NUM_THREADS": "1"})
        try:
            if not run.wait(lambda: len([p for p, c in run.completions().items() if c]) >= 3, 60):
                times.append(None)
                continue
            time.sleep(0.3)
            victim = sorted(run.completions())[-1]
            killed = time.time()
            os.kill(victim, signal.SIGKILL)
            ok = run.wait(lambda: any(t > killed and r > 0 for c in run.completions().values()
                                      for t, r, _, _ in c), 60)
            times.append(min(t for c in run.completions().values() for t, r, _, _ in c
                             if t > killed and r > 0) - killed if ok else None)
        finally:
            run.close()
    return times


def summary(values):
    values = [v for v in values if v is not None]
    if not values:
        return "no data"
    return f"median {statistics.median(values):.3f} s, max {max(values):.3f} s (n={len(values)})"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--sizes", type=int, nargs="*", default=[2, 4, 8])
    p.add_argument("--size-trials", type=int, default=3)
    p.add_argument("--baseline-trials", type=int, default=3)
    args = p.parse_args()
    rng = random.Random(0)
    print(f"hvdlite, 3 workers on localhost, {args.trials} kill -9 trials", flush=True)
    results = hvdlite_trials(3, args.trials, rng)
    print(f"  kill -9 -> survivors' next allreduce: {summary(r[0] for r in results)}")
    print(f"  slot back -> new worker's first allreduce: {summary(r[1] for r in results)}")
    print(f"  survivors' stall while it joins: {summary(r[2] for r in results)}")
    for n in args.sizes:
        sized = hvdlite_trials(n, args.size_trials, rng)
        print(f"  world of {n}: kill -9 re-form {summary(r[0] for r in sized)}; "
              f"join stall {summary(r[2] for r in sized)}", flush=True)
    baseline = torchrun_trials(args.baseline_trials)
    print(f"torchrun, 3 workers: kill -9 -> first allreduce after restart: {summary(baseline)}"
          + (f"; {sum(b is None for b in baseline)} hung past 60 s" if None in baseline else ""))
    ours = [r[0] for r in results if r[0] is not None]
    theirs = [b for b in baseline if b is not None]
    if ours and theirs:
        print(f"recovery, torchrun median / hvdlite median: "
              f"{statistics.median(theirs) / statistics.median(ours):.1f}x")


if __name__ == "__main__":
    main()
