"""Running `hvdlite run` from tests: bounded in time, every process ended even on failure."""
import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest
import torch

from scripts.jobdata import batch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")
# Flags that fork every worker of a job from a template that imported torch: one import a job
# instead of one a worker, for jobs whose proof does not hang on how a worker started (the suite
# is CPU-bound). torch.optim's first optimizer imports torch._dynamo, as costly as torch itself:
# preloaded too (the launches wait for the template's imports, judged by the time it could run).
PRELOADED = ["--preload", "torch,torch.optim,torch._dynamo,hvdlite.torch"]


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str
    events: list

    def of(self, kind):
        return [e for e in self.events if e["event"] == kind]


class Job:
    """A driver started in its own session; `finish()` waits, `close()` ends it for sure."""

    def __init__(self, args, tmp_path, env=None, nofile=None, prefix=()):
        """nofile: the driver runs under `ulimit -n nofile` (its soft and hard limit);
        `prefix`: what runs the driver, e.g. salloc and its flags."""
        self.event_log = os.path.join(tmp_path, "events.jsonl")
        self.out = open(os.path.join(tmp_path, "driver.out"), "w+")
        self.err = open(os.path.join(tmp_path, "driver.err"), "w+")
        cmd = [*prefix, sys.executable, "-m", "hvdlite.cli", "run", "--event-log", self.event_log, *args]
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=self.err, stdin=subprocess.DEVNULL,
                                     env={**os.environ, **(env or {})}, start_new_session=True,
                                     preexec_fn=None if nofile is None else lambda: resource.setrlimit(
                                         resource.RLIMIT_NOFILE, (nofile, nofile)))

    def events(self):
        try:
            with open(self.event_log) as f:
                # Only whole lines: the driver may be writing the last one as it is read (ci18).
                return [json.loads(line) for line in f if line.endswith("\n") and line.strip()]
        except FileNotFoundError:
            return []

    def wait_for(self, predicate, timeout):
        """Poll the event log until predicate(events) holds; returns the events."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = self.events()
            if predicate(events):
                return events
            if self.proc.poll() is not None:
                events = self.events()  # the lines the driver wrote as it ended
                if predicate(events):
                    return events
                raise AssertionError(f"driver exited early:\n{self.read(self.err)}")
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting; events: {[e['event'] for e in self.events()]}")

    def finish(self, timeout) -> Result:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"job did not end within {timeout} s:\n{self.read(self.err)[-3000:]}"
                                 f"\n{self.stacks()}") from None
        return Result(code, self.read(self.out), self.read(self.err), self.events())

    def stacks(self) -> str:
        """Python and native stacks of the driver and its local workers: what a hang waits on."""
        dumps = []
        for pid in _tree(self.proc.pid):
            try:
                dump = subprocess.run(["py-spy", "dump", "--native", "--pid", str(pid)],
                                      capture_output=True, text=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                continue  # no py-spy, or it could not attach: report the other processes
            if dump.returncode == 0:
                dumps.append(f"--- stacks of pid {pid}\n{dump.stdout}")
        return "\n".join(dumps)

    @staticmethod
    def read(f):
        """Through a file object of its own: the driver's shares f's offset, and a seek there
        would move where the driver writes next (over what it wrote)."""
        with open(f.name) as own:
            return own.read()

    def worker_pids(self):
        return [e["pid"] for e in self.events() if e["event"] == "worker_start"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for pid in self.worker_pids():  # workers lead their own process groups
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.out.close()
        self.err.close()

    def kill_everything(self):
        """kill -9 of the driver and every process under it (workers, templates) at once."""
        pids = _tree(self.proc.pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)
        return pids

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _tree(pid) -> list:
    """pid and its live descendants."""
    pids = [pid]
    for p in pids:
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    pids += [int(c) for c in f.read().split()]
        except OSError:
            pass  # it has ended meanwhile
    return pids


def discovery(tmp_path, schedule, runs=False):
    """Flags for discovery keyed on the job's progress (scripts/discover.py), or with `runs`
    on how many times discovery ran."""
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps(schedule))
    key = f"{tmp_path}/discovery-runs --runs" if runs else f"{tmp_path}/progress"
    return ["--host-discovery-script", f"{sys.executable} {SCRIPTS}/discover.py {path} {key}"]


def job_env(tmp_path, **knobs):
    return {"LOG_DIR": str(tmp_path), **{k: str(v) for k, v in knobs.items()}}


def progress(log_dir):
    """The step rank 0 of the test job last committed."""
    try:
        with open(os.path.join(log_dir, "progress")) as f:
            return int(f.read() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def wait_progress(job, tmp_path, step, timeout=60):
    job.wait_for(lambda _: progress(tmp_path) >= step, timeout)


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {what}")
        time.sleep(0.02)


def ssh_flags(hosts):
    """Flags that run a job on sshd test hosts (tests/sshhosts.py)."""
    return ["--ssh-config", hosts.ssh_config, "--rendezvous-addr", hosts.driver_address]


def skip_without_partitions(hosts):
    """Partitions (nftables inside a host's namespace) need namespace hosts, not the fallback."""
    if hosts.mode != "netns":
        pytest.skip(f"partitions need network namespaces: {hosts.fallback_reason}")


def next_world(job, fault, timeout=30):
    """Inject `fault()`; returns (seconds until the next world formed, its round_complete event)."""
    def rounds(events):
        return [e for e in events if e["event"] == "round_complete"]
    before = len(rounds(job.events()))
    start = time.time()
    fault()
    reformed = rounds(job.wait_for(lambda events: len(rounds(events)) > before, timeout))[before]
    return reformed["time"] - start, reformed


def frozen_until_probed(job, nodes, name, prefix, timeout=30):
    """Stop every process of node `name` (tests/sshhosts.py) until the driver's probe of its
    worker (slot starting with `prefix`) found it listening: a fault of the node next is known
    only by a later probe (under load a late beat is often probed just before a node dies).
    The caller thaws it (nodes.freeze(name, signal.SIGCONT))."""
    nodes.freeze(name)
    job.wait_for(lambda events: any(e["event"] == "node_probed" and e["slot"].startswith(prefix)
                                    and e["outcome"] == "listening" for e in events), timeout)


def slot_pid(job, slot):
    return [e["pid"] for e in job.events() if e["event"] == "worker_start" and e["slot"] == slot][-1]


def run_job(args, tmp_path, timeout=120, env=None, prefix=()) -> Result:
    with Job(args, tmp_path, env, prefix=prefix) as job:
        return job.finish(timeout)


VICTIMS = ["localhost/1", "localhost/2", "localhost/0"]  # killed mid-connect in rounds 1, 2, 3


def run_connect_victims(python, script, tmp_path, timeout, **env) -> Result:
    """Four slots; three worlds in a row lose a member while their group connects (see
    scripts/connect_victims.py). localhost/3 must live through all three and finish alone."""
    r = run_job(["-H", "localhost:4", "--min-np", "1", "--blacklist-cooldown-range", "600", "600",
                 python, os.path.join(SCRIPTS, script)], tmp_path, timeout=timeout,
                env={"VICTIM_MARK": str(tmp_path / "victims"), "VICTIM_LINGER": "1",
                     "VICTIMS": ",".join(f"{slot}@{n}" for n, slot in enumerate(VICTIMS, 1)), **env})
    assert r.code == 0, r.stderr
    assert (tmp_path / "victims").read_text().split() == VICTIMS
    assert [line.split("DONE ")[1] for line in r.stdout.splitlines() if "DONE" in line] == ["0 1"]
    assert [(e["slot"], e["code"]) for e in r.of("worker_exit")] == \
        [(slot, -9) for slot in VICTIMS] + [("localhost/3", 0)]
    return r


def steps_log(log_dir):
    with open(os.path.join(log_dir, "steps.jsonl")) as f:
        return [json.loads(line) for line in f]


def effective_steps(records):
    """For each step, the records of its last attempt (the highest round that logged it, of the
    latest run when a job was run again on its --checkpoint-dir)."""
    by_step = {}
    for r in records:
        by_step.setdefault(r["step"], []).append(r)
    result = {}
    for step, rs in sorted(by_step.items()):
        last = max(_attempt(r) for r in rs)
        result[step] = [r for r in rs if _attempt(r) == last]
    return result


def _attempt(record):
    return record.get("run", 0), record["round"]


def sizes(records):
    """World size of every effective step, run-length encoded."""
    runs = []
    for step, rs in effective_steps(records).items():
        size = rs[0]["size"]
        if not runs or runs[-1][0] != size:
            runs.append([size, 0])
        runs[-1][1] += 1
    return [s for s, _ in runs]


def finals(tmp_path):
    return [json.loads(p.read_text()) for p in tmp_path.glob("final.*.json")]


def flat(params):
    """Parameters as one list, whether logged per tensor (torch job) or as one vector (numpy)."""
    return [x for p in params for x in (p if isinstance(p, list) else [p])]


def check_training_continuous(tmp_path, total, reference=None, tolerance=1e-5):
    """Every step applied exactly once: each finished worker's parameters equal `reference`
    (a replay of the logged steps; by default the torch job's replay)."""
    records = steps_log(tmp_path)
    assert sorted(effective_steps(records)) == list(range(total))
    final = finals(tmp_path)
    assert final, "no worker finished"
    expected = flat(replay(records)) if reference is None else reference(records)
    for f in final:
        assert flat(f["params"]) == pytest.approx(expected, abs=tolerance)
    return records


def replay(records):
    """Parameters a single process gets by applying every effective step once."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, rs in effective_steps(records).items():
        optimizer.zero_grad()
        grads = []
        for indices in rs[0]["world"]:
            model.zero_grad()
            x, y = batch(indices)
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, *gs in zip(model.parameters(), *grads):
            p.grad = sum(gs) / len(gs)
        optimizer.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]

