"""Elastic recovery and joining on this machine, against baselines measured in the same run.

    python bench/elastic.py [--sections kill join start] [--trials 20] [--sizes 2 4 8]
                            [--baseline-trials 3] [--join-trials 5] [--join-sizes 2 8]
                            [--modes plain default template] [--breakdown] [--ddp-trials 10]

Prints, from real jobs on localhost (section "kill"):
- kill -9 of a worker -> the survivors' next completed allreduce (per trial the latest
  survivor to resume): median and max over --trials kills (target max <= 1 s);
- a slot coming back -> the new worker's first completed allreduce, from its launch
  (target <= 3 s), and the survivors' stall while it joins;
- kill -9 recovery at several world sizes;
- torchrun (c10d rendezvous, --max-restarts) on the same kill, and the ratio.
Section "ddp": the same kill with a DistributedDataParallel step in place of the allreduce,
hvdlite's survivors moving DDP onto the re-formed world in-process against torchrun restarting
every worker (which then builds DDP again), and the ratio.
Section "join", with a Horovod-style script (init, model, DistributedOptimizer, elastic.run),
plain launches (--no-preload) against workers forked from a preloaded template (--preload):
- a slot added to discovery -> the new worker's first step at the new size, and the ratio to
  a fresh python importing torch and building an SGD optimizer (target <= 0.5x, <= 1.0 s);
- the survivors' stall while it joins, growing to 2 and to 8 ranks (target <= 0.2 s);
- with --breakdown (jobs traced with --timeline-filename), each phase of a join: discovery
  poll, launch, script start -> hvd.init, announcement, members leaving, gloo connect, state
  sync, first step.
Section "start": `hvdlite run -np 2` start -> first allreduce, against torchrun on the same
script (target <= 0.5x): each way of starting workers, and `--keep-warm` after one untimed job
that leaves the kept template (in a private XDG_RUNTIME_DIR, ended by pid at the end).
"""
import argparse
import glob
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LOOP = os.path.join(HERE, "scripts", "allreduce_loop.py")
STYLE = os.path.join(HERE, "scripts", "horovod_style.py")
FRESH = "import torch; torch.optim.SGD(torch.nn.Linear(4, 4).parameters(), lr=0.1)"
# How workers start: always fresh, the default (fresh first world, joins fork from the template
# warmed meanwhile), or every worker from the template (--preload).
MODES = {"plain": ["--no-preload"], "default": [], "template": ["--preload", "torch,torch.optim,torch._dynamo,hvdlite.torch"]}
KEEP_WARM = ["--keep-warm", "600", *MODES["template"]]  # workers fork from a kept template


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


def start_hvdlite(n, env_extra=None, script=LOOP):
    folder = tempfile.mkdtemp(prefix="hvdlite-bench-")
    return Run([sys.executable, "-m", "hvdlite.cli", "run", "--event-log",
                os.path.join(folder, "events.jsonl"), "-H", f"localhost:{n}", "--min-np", "1",
                "--blacklist-cooldown-range", "1", "1", sys.executable, script], env_extra, folder=folder)


def members(run):
    rounds = [e for e in run.events() if e["event"] == "round_complete"]
    return rounds[-1] if rounds else None


def pid_of(run, slot):
    return [e["pid"] for e in run.events() if e["event"] == "worker_start" and e["slot"] == slot][-1]


def kill_trial(run, n, rng, ready=60):
    """Kill one member of a full world (once it formed, within `ready` seconds); returns
    (recovery, join, stall) in seconds or None."""
    if not run.wait(lambda: (members(run) or {}).get("size") == n, ready):
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


def repeat(run, trial, trials, label):
    """Up to `trials` results of trial() on one job, then the job closed."""
    results = []
    try:
        for _ in range(trials):
            r = trial()
            if r is None:
                print(f"  ({label}: a trial did not complete; see {run.dir})", flush=True)
                break
            results.append(r)
    finally:
        run.close()
    return results


def hvdlite_trials(n, trials, rng, env_extra=None, script=LOOP, ready=60):
    run = start_hvdlite(n, env_extra, script)
    return repeat(run, lambda: kill_trial(run, n, rng, ready), trials, f"size {n}")


def torchrun_trials(trials, env_extra=None, script=LOOP, timeout=60):
    """Recovery of torchrun on the same kill: it restarts every worker."""
    times = []
    for _ in range(trials):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        run = Run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                   "--nproc-per-node", "3", "--max-restarts", "3", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"127.0.0.1:{port}", "--monitor-interval", "0.1", script],
                  {"BASELINE": "torchrun", "OMP_NUM_THREADS": "1", **(env_extra or {})})
        try:
            if not run.wait(lambda: len([p for p, c in run.completions().items() if c]) >= 3, timeout):
                times.append(None)
                continue
            time.sleep(0.3)
            victim = sorted(run.completions())[-1]
            killed = time.time()
            os.kill(victim, signal.SIGKILL)
            ok = run.wait(lambda: any(t > killed and r > 0 for c in run.completions().values()
                                      for t, r, _, _ in c), timeout)
            times.append(min(t for c in run.completions().values() for t, r, _, _ in c
                             if t > killed and r > 0) - killed if ok else None)
        finally:
            run.close()
    return times


def fresh_python():
    """Seconds a fresh interpreter takes to import torch and build an SGD optimizer."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", FRESH], check=True, timeout=120)
    return time.monotonic() - start


def start_growing(n, mode, trace=False):
    """An elastic job of the Horovod-style script on n local slots, discovery in a file;
    with `trace`, its collective trace goes to trace.json in the job's folder."""
    folder = tempfile.mkdtemp(prefix="hvdlite-bench-")
    hosts = os.path.join(folder, "hosts")
    with open(hosts, "w") as f:
        f.write(f"localhost:{n}\n")
    discover = os.path.join(folder, "discover.sh")
    with open(discover, "w") as f:
        f.write(f"#!/bin/sh\ncat {hosts}\n")
    os.chmod(discover, 0o755)
    run = Run([sys.executable, "-m", "hvdlite.cli", "run", "--event-log",
               os.path.join(folder, "events.jsonl"), "--min-np", "1", "--max-np", "16",
               "--host-discovery-script", discover, *MODES[mode],
               *(["--timeline-filename", os.path.join(folder, "trace.json")] if trace else []),
               sys.executable, STYLE], folder=folder)
    return run, hosts


def set_slots(hosts, n):
    with open(hosts + ".new", "w") as f:
        f.write(f"localhost:{n}\n")
    os.replace(hosts + ".new", hosts)
    return time.time()


def join_trial(run, hosts, n):
    """World of n-1, a slot added: (slot added -> newcomer's first step at size n,
    newcomer's process start -> that step, survivors' longest gap between steps, and for
    join_phases: when the slot was added, the newcomer's worker_start event), or None."""
    if not run.wait(lambda: (members(run) or {}).get("size") == n - 1, 120):
        return None
    old = members(run)
    survivors = [pid_of(run, s) for s in old["members"]]
    time.sleep(0.5)
    added = set_slots(hosts, n)

    def newcomer():
        starts = [e for e in run.events() if e["event"] == "worker_start" and e["time"] > added - 1]
        return starts[-1] if starts else None

    def first_step():
        new = newcomer()
        steps = [t for t, _, _, size in run.completions().get(new["pid"], []) if size == n] if new else []
        return min(steps) if steps else None

    if not run.wait(lambda: first_step() is not None, 120):
        return None
    first = first_step()
    run.wait(lambda: all(any(t >= first - 0.001 for t, *_ in run.completions().get(pid, []))
                         for pid in survivors), 30)
    gaps = []
    for pid in survivors:
        times = sorted(t for t, *_ in run.completions().get(pid, []))
        after = [i for i, t in enumerate(times) if t >= first - 0.001]
        if after and after[0] > 0:
            gaps.append(times[after[0]] - times[after[0] - 1])
    joined_round, new = members(run)["round"], newcomer()
    set_slots(hosts, n - 1)
    # The driver keys workers by slot: a slot coming back before its last worker has exited
    # would be credited with that worker's exit, so wait for it to be gone.
    run.wait(lambda: (members(run) or {}).get("size") == n - 1 and members(run)["round"] > joined_round
             and not os.path.exists(f"/proc/{new['pid']}"), 60)
    return first - added, first - new["time"], max(gaps) if gaps else None, added, new


def join_trials(n, trials, mode, trace=False):
    run, hosts = start_growing(n - 1, mode, trace)
    results = repeat(run, lambda: join_trial(run, hosts, n), trials, f"{mode}, growing to {n}")
    return results, (join_phases(run, results) if trace else None)


# A join's phases, each from the event log (driver) or the newcomer's trace (worker):
PHASES = ("discovery poll", "launch decision + start", "script start -> hvd.init",
          "joiner waiting -> host update announced", "members leave their world",
          "gloo connect", "state sync", "first step")


def join_phases(run, results):
    """Seconds of each phase of PHASES per trial, from the job's events and merged trace."""
    try:
        with open(os.path.join(run.dir, "trace.json")) as f:
            trace = json.load(f)["traceEvents"]
    except (OSError, ValueError):
        return []
    events, phases = run.events(), []
    for join, _, _, added, new in results:
        def after(kind, t):
            return min((e["time"] for e in events if e["event"] == kind and e["time"] >= t), default=None)
        spans = sorted((e["ts"] / 1e6, e["ph"], e["name"]) for e in trace
                       if e.get("pid") == new["pid"] and e.get("ph") in ("B", "E"))
        rdzv = [t for t, _, name in spans if name == "rendezvous"]
        synced = [t for t, ph, name in spans if ph == "B" and name == "allreduce"]
        found = after("hosts_changed", added)
        announced = after("hosts_updated", rdzv[0]) if rdzv else None
        formed = after("round_complete", announced) if announced else None
        marks = [added, found, new["time"], *(rdzv[:1] or [None]), announced, formed,
                 rdzv[1] if len(rdzv) > 1 else None, synced[0] if synced else None, added + join]
        if None not in marks:
            phases.append([b - a for a, b in zip(marks, marks[1:])])
    return phases


def start_trial(launcher, runtime_dir=None):
    """Seconds from launching a 2-worker job of the Horovod-style script to the later of the
    two ranks' first step."""
    started = time.time()
    if launcher == "torchrun":
        run = Run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", STYLE], {"BASELINE": "torchrun", "OMP_NUM_THREADS": "1"})
    else:
        flags = KEEP_WARM if launcher == "keep-warm" else MODES[launcher]
        run = Run([sys.executable, "-m", "hvdlite.cli", "run", "-np", "2", *flags, sys.executable, STYLE],
                  {"XDG_RUNTIME_DIR": runtime_dir} if runtime_dir else None)
    try:
        if not run.wait(lambda: len([c for c in run.completions().values() if c]) >= 2, 120):
            return None
        return max(min(t for t, *_ in c) for c in run.completions().values() if c) - started
    finally:
        run.close()


def ratio(ours, theirs):
    ours, theirs = [v for v in ours if v is not None], [v for v in theirs if v is not None]
    if not ours or not theirs:
        return "no data"
    return f"{statistics.median(ours) / statistics.median(theirs):.2f}x"


def join_section(args):
    print("joining, Horovod-style script (init, model, DistributedOptimizer, elastic.run)", flush=True)
    fresh = []
    for n in args.join_sizes:
        for mode in args.modes:
            fresh.append(fresh_python())
            results, phases = join_trials(n, args.join_trials, mode, args.breakdown)
            fresh.append(fresh_python())
            joins = [r[0] for r in results]
            print(f"  {mode:8s} growing to {n}: slot added -> first step at {n}: {summary(joins)}"
                  f" ({ratio(joins, fresh)} of a fresh python); from process start "
                  f"{summary(r[1] for r in results)}; survivors' stall {summary(r[2] for r in results)}",
                  flush=True)
            for i, name in enumerate(PHASES if phases else ()):
                print(f"    {name:40s} {summary(p[i] for p in phases)}", flush=True)
    print(f"  fresh python importing torch + building SGD: {summary(fresh)}")


def start_section(args):
    print("start of `hvdlite run -np 2` -> first allreduce, Horovod-style script", flush=True)
    times = {launcher: [] for launcher in ("torchrun", *MODES, "keep-warm")}
    runtime_dir = tempfile.mkdtemp(prefix="hvdlite-bench-run-")  # 0700; ours alone
    try:
        start_trial("keep-warm", runtime_dir)  # untimed: leaves the kept template
        for _ in range(args.start_trials):
            for launcher in times:  # interleaved, so that load changes hit every launcher alike
                times[launcher].append(start_trial(launcher, runtime_dir))
    finally:
        end_kept_templates(runtime_dir)
    for launcher, values in times.items():
        versus = "" if launcher == "torchrun" else f" ({ratio(values, times['torchrun'])} of torchrun)"
        print(f"  {launcher:9s} {summary(values)}{versus}", flush=True)


def end_kept_templates(runtime_dir):
    """Kill the kept templates started in `runtime_dir` (their pids are in their logs)."""
    for log in glob.glob(os.path.join(runtime_dir, "hvdlite-*", "warm-*.log")):
        with open(log) as f:
            for pid in re.findall(r"kept template (\d+) serves", f.read()):
                try:
                    os.killpg(int(pid), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
    shutil.rmtree(runtime_dir, ignore_errors=True)


def summary(values):
    values = [v for v in values if v is not None]
    if not values:
        return "no data"
    return f"median {statistics.median(values):.3f} s, max {max(values):.3f} s (n={len(values)})"


def kill_section(args):
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


def ddp_section(args):
    print(f"DDP step, 3 workers on localhost, {args.ddp_trials} kill -9 trials", flush=True)
    ours = [r[0] for r in hvdlite_trials(3, args.ddp_trials, random.Random(0), {"DDP": "1"})]
    print(f"  hvdlite (in-process): kill -9 -> survivors' next DDP step: {summary(ours)}", flush=True)
    theirs = torchrun_trials(args.baseline_trials, {"DDP": "1"})
    print(f"  torchrun (restarts every worker): kill -9 -> first DDP step: {summary(theirs)}")
    ours, theirs = [v for v in ours if v is not None], [v for v in theirs if v is not None]
    if ours and theirs:
        print(f"  recovery, torchrun median / hvdlite median: "
              f"{statistics.median(theirs) / statistics.median(ours):.1f}x")


SECTIONS = {"kill": kill_section, "join": join_section, "start": start_section, "ddp": ddp_section}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sections", nargs="*", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--sizes", type=int, nargs="*", default=[2, 4, 8])
    p.add_argument("--size-trials", type=int, default=3)
    p.add_argument("--baseline-trials", type=int, default=3)
    p.add_argument("--join-trials", type=int, default=5)
    p.add_argument("--join-sizes", type=int, nargs="*", default=[2, 8])
    p.add_argument("--modes", nargs="*", choices=MODES, default=list(MODES),
                   help="how workers start in section join (default: every way)")
    p.add_argument("--breakdown", action="store_true",
                   help="trace the join jobs and print each join's phases")
    p.add_argument("--start-trials", type=int, default=3)
    p.add_argument("--ddp-trials", type=int, default=10)
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    for name in args.sections:
        SECTIONS[name](args)


if __name__ == "__main__":
    main()
