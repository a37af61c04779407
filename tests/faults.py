"""Randomized fault trials: one seeded elastic job with faults injected at random steps.

Faults: kill -9 of a random worker, SIGSTOP of one (the driver must evict it), and host
changes through discovery (add / remove). Each trial checks the invariants that make a
training framework trustworthy; a violated one raises AssertionError with the seed.
"""
import json
import os
import random
import signal
import sys
import time

from jobs import SCRIPTS, Job, effective_steps, replay, steps_log

HOSTS = [f"127.0.0.{i}" for i in range(1, 5)]


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "X"


def _alive(pid):
    return _state(pid) not in ("Z", "X")


def _progress(log_dir):
    try:
        return int(open(os.path.join(log_dir, "progress")).read() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def run_trial(seed, log_dir, total=60, faults=3, bound=150):
    """Returns a dict of what happened; raises AssertionError on a broken invariant."""
    rng = random.Random(seed)
    schedule = [[0, [f"{h}:1" for h in HOSTS[:3]]]]
    plan = sorted(rng.sample(range(8, total - 15), faults))
    kinds = [rng.choice(["kill", "kill", "stop", "hosts"]) for _ in plan]
    for step, kind in zip(plan, kinds):
        if kind == "hosts":  # add the spare host or drop one, decided by the seed
            current = set(schedule[-1][1])
            spare = [f"{h}:1" for h in HOSTS if f"{h}:1" not in current]
            change = current | {spare[0]} if spare and rng.random() < 0.5 else current - {rng.choice(sorted(current))}
            schedule.append([step, sorted(change) or sorted(current)])
    with open(os.path.join(log_dir, "schedule.json"), "w") as f:
        json.dump(schedule, f)
    args = ["--host-discovery-script",
            f"{sys.executable} {SCRIPTS}/discover.py {log_dir}/schedule.json {log_dir}/progress",
            "--min-np", "1", "--liveness-timeout", "3", "--blacklist-cooldown-range", "1", "2",
            sys.executable, os.path.join(SCRIPTS, "elastic_job.py")]
    env = {"LOG_DIR": log_dir, "TOTAL_STEPS": str(total), "STEP_SLEEP": "0.05"}
    injected, start, last_progress = [], time.monotonic(), 0
    with Job(args, log_dir, env) as job:
        for step, kind in zip(plan, kinds):
            if kind == "hosts":
                continue  # discovery applies it by itself at that step
            job.wait_for(lambda _: _progress(log_dir) >= step or job.proc.poll() is not None, bound)
            # Never take out the last running member: that is a failed job, not a fault.
            try:
                job.wait_for(lambda _: len(_running_workers(job)) >= 2, 15)
            except AssertionError:
                continue
            running = _running_workers(job)
            pid = rng.choice(running)
            os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            injected.append(kind)
            now = _progress(log_dir)
            assert now >= last_progress, f"seed {seed}: committed step went back"
            last_progress = now
        result = job.finish(max(1, bound - (time.monotonic() - start)))
        pids = job.worker_pids()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    orphans = [p for p in pids if _alive(p)]
    assert not orphans, f"seed {seed}: workers left behind: {orphans}"
    assert result.code == 0, f"seed {seed}: job failed:\n{result.stderr[-2000:]}"
    records = steps_log(log_dir)
    assert sorted(effective_steps(records)) == list(range(total)), f"seed {seed}: steps lost"
    finals = [json.load(open(os.path.join(log_dir, f))) for f in os.listdir(log_dir)
              if f.startswith("final.")]
    reference = [x for p in replay(records) for x in p]
    for final in finals:
        got = [x for p in final["params"] for x in p]
        assert max(abs(a - b) for a, b in zip(got, reference)) < 1e-5, \
            f"seed {seed}: parameters differ from the replay (a commit lost or applied twice)"
    return {"seed": seed, "faults": injected + ["hosts"] * kinds.count("hosts"),
            "resets": len(result.of("round_complete")) - 1, "seconds": time.monotonic() - start}


def _running_workers(job):
    """Members of the current world that are neither dead nor stopped."""
    events = job.events()
    pids = {e["slot"]: e["pid"] for e in events if e["event"] == "worker_start"}
    rounds = [e["members"] for e in events if e["event"] == "round_complete"]
    members = rounds[-1] if rounds else {}
    return [pids[slot] for slot in members if _state(pids[slot]) in ("R", "S", "D")]
