"""Randomized fault trials: one seeded elastic job with faults injected at random steps.

Faults: kill -9 of a random worker, SIGSTOP of one (the driver must evict it), host changes
through discovery (add / remove) and, on sshd test hosts in network namespaces, a partition
of a worker's host (healed once the world re-formed without it). Each trial checks the
invariants that make a training framework trustworthy; a violated one raises AssertionError
with the seed.
"""
import json
import os
import random
import signal
import sys
import time

from hvdlite import procstat
from jobs import SCRIPTS, Job, effective_steps, flat, progress, replay, ssh_flags, steps_log

LEFTOVER_WAIT = 10.0  # seconds the job's workers may take to be gone after the driver


def _alive(pid):
    return procstat.state(pid) not in procstat.GONE


def _host(slot):
    return slot.rsplit("/", 1)[0]


def _wait(predicate, timeout):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.1)
    return predicate()


class LocalHosts:
    """Hosts as loopback addresses of this machine: workers are local processes, started with
    `flags` (the tests fork them from a template: the suite is CPU-bound)."""
    names = [f"127.0.0.{i}" for i in range(1, 5)]
    faults = ["kill", "kill", "stop", "hosts"]

    def __init__(self, flags=()):
        self.flags = list(flags)

    def state(self, slot, pid):
        return procstat.state(pid)

    def signal(self, slot, pid, sig):
        os.kill(pid, sig)

    def leftovers(self, pids):
        """The job's workers still alive LEFTOVER_WAIT seconds after the call."""
        _wait(lambda: not any(_alive(p) for p in pids), LEFTOVER_WAIT)
        return [p for p in pids if _alive(p)]


class SSHHosts:
    """sshd test hosts (tests/sshhosts.py) in network namespaces, which adds partitions.
    Worker pids in the event log are pids inside their host's pid namespace."""
    faults = ["kill", "stop", "partition", "hosts"]

    def __init__(self, hosts):
        if hosts.mode != "netns":
            raise ValueError(f"partition trials need namespace hosts: {hosts.fallback_reason}")
        self.hosts, self.names = hosts, hosts.names
        self.flags = ssh_flags(hosts)

    def state(self, slot, pid):
        out = self.hosts.run(_host(slot), ["ps", "-o", "stat=", "-p", str(pid)]).stdout.strip()
        return out[:1] or "X"

    def signal(self, slot, pid, sig):
        self.hosts.run(_host(slot), ["kill", f"-{sig.name[3:]}", str(pid)], check=True)

    def partition(self, host):
        self.hosts.partition(host)

    def heal(self, host):
        self.hosts.heal(host)

    def leftovers(self, pids):
        def workers():
            return [(name, pid) for name in self.names for pid, _, args in self.hosts.processes(name)
                    if "elastic_job.py" in args]
        _wait(lambda: not workers(), LEFTOVER_WAIT)
        return workers()


def run_trial(seed, log_dir, hosts=None, total=60, faults=3, bound=150):
    """Returns a dict of what happened; raises AssertionError on a broken invariant."""
    hosts = hosts or LocalHosts()
    rng = random.Random(seed)
    schedule = [[0, [f"{h}:1" for h in hosts.names[:3]]]]
    plan = sorted(rng.sample(range(8, total - 15), faults))
    kinds = [rng.choice(hosts.faults) for _ in plan]
    for step, kind in zip(plan, kinds):
        if kind == "hosts":  # add the spare host or drop one, decided by the seed
            current = set(schedule[-1][1])
            spare = [f"{h}:1" for h in hosts.names if f"{h}:1" not in current]
            change = current | {spare[0]} if spare and rng.random() < 0.5 else current - {rng.choice(sorted(current))}
            schedule.append([step, sorted(change) or sorted(current)])
    with open(os.path.join(log_dir, "schedule.json"), "w") as f:
        json.dump(schedule, f)
    args = [*hosts.flags, "--host-discovery-script",
            f"{sys.executable} {SCRIPTS}/discover.py {log_dir}/schedule.json {log_dir}/progress",
            "--min-np", "1", "--liveness-timeout", "3", "--blacklist-cooldown-range", "1", "2",
            sys.executable, os.path.join(SCRIPTS, "elastic_job.py")]
    env = {"LOG_DIR": log_dir, "TOTAL_STEPS": str(total), "STEP_SLEEP": "0.05"}
    injected, start, last_progress = [], time.monotonic(), 0
    with Job(args, log_dir, env) as job:
        for step, kind in zip(plan, kinds):
            if kind == "hosts":
                continue  # discovery applies it by itself at that step
            job.wait_for(lambda _: progress(log_dir) >= step or job.proc.poll() is not None, bound)
            # Never take out the last holder of the training state: that is a lost job, not a
            # fault. Two running members, and the world has trained a step since it formed
            # (so every member finished syncing from rank 0 and holds the state).
            try:
                job.wait_for(lambda events: len(_running_workers(job, hosts)) >= 2
                             and _trained_since_formed(events, log_dir), 15)
            except AssertionError:
                continue
            slot, pid = rng.choice(_running_workers(job, hosts))
            if kind == "partition":
                _partition_until_evicted(job, hosts, slot, bound)
            else:
                hosts.signal(slot, pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            injected.append(kind)
            now = progress(log_dir)
            assert now >= last_progress, f"seed {seed}: committed step went back"
            last_progress = now
        result = job.finish(max(1, bound - (time.monotonic() - start)))
        pids = job.worker_pids()
    orphans = hosts.leftovers(pids)
    assert not orphans, f"seed {seed}: workers left behind: {orphans}"
    assert result.code == 0, f"seed {seed}: job failed:\n{result.stderr[-2000:]}"
    records = steps_log(log_dir)
    assert sorted(effective_steps(records)) == list(range(total)), f"seed {seed}: steps lost"
    finals = [json.load(open(os.path.join(log_dir, f))) for f in os.listdir(log_dir)
              if f.startswith("final.")]
    reference = flat(replay(records))
    for final in finals:
        got = flat(final["params"])
        assert max(abs(a - b) for a, b in zip(got, reference)) < 1e-5, \
            f"seed {seed}: parameters differ from the replay (a commit lost or applied twice)"
    return {"seed": seed, "faults": injected + ["hosts"] * kinds.count("hosts"),
            "resets": len(result.of("round_complete")) - 1, "seconds": time.monotonic() - start}


def _partition_until_evicted(job, hosts, slot, bound):
    """Cut the slot's host off until a world without that slot has formed (or the job ended)."""
    def evicted(events):
        rounds = [e["members"] for e in events if e["event"] == "round_complete"]
        return job.proc.poll() is not None or slot not in rounds[-1]
    hosts.partition(_host(slot))
    try:
        job.wait_for(evicted, bound)
    finally:
        hosts.heal(_host(slot))


def _trained_since_formed(events, log_dir):
    rounds = [e for e in events if e["event"] == "round_complete"]
    return bool(rounds) and progress(log_dir) > rounds[-1]["commit"]


def _running_workers(job, hosts):
    """(slot, pid) of the current world's members that are neither dead nor stopped."""
    events = job.events()
    pids = {e["slot"]: e["pid"] for e in events if e["event"] == "worker_start"}
    rounds = [e["members"] for e in events if e["event"] == "round_complete"]
    members = rounds[-1] if rounds else {}
    return [(slot, pids[slot]) for slot in members if hosts.state(slot, pids[slot]) in ("R", "S", "D")]
