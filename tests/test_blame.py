"""Who is blamed for what (decisions/hostrule.py): a worker's failure and a launch its host
refused go by --blacklist; the driver's own trouble (a fork that failed here, workers that lost
contact with it) and the launcher's (a start that timed out) blame nobody, and the slot is
launched again after a growing pause. The elastic core driven by hand, and the executor's
and launchers' side: which trouble a failed launch was."""
import errno
import os
import signal
import stat
import time

import pytest
from hypothesis import given, settings, strategies as st

from hvdlite import exitcodes, procstat
from hvdlite.driver.decisions.cause import CAUSE_WAIT, ECHO_WAIT, Causes
from hvdlite.driver.decisions.messages import (
    DRIVER, HOST, LAUNCHER, AskRunWait, Exited, HostsFound, Launch, Launched, LaunchFailed, RunWait, Stop, Tick)
from hvdlite.driver.executor import _whose
from hvdlite.driver.launchers.base import LaunchError, StartTimedOut
from hvdlite.driver.launchers.srun import SrunWorker
from hvdlite.driver.output import RankOutput
from tests.test_core import Sim, first_world, leave


def launches(actions):
    return [a.worker for a in actions if isinstance(a, Launch)]


def test_a_failed_launch_on_a_single_host_job_blames_its_slot_while_a_worker_trains_there():
    # --blacklist auto on one host: the slot, as for a worker's failure; the host only once
    # none of its workers lives.
    sim, (a0, a1) = first_world([("a", 2)])
    sim.send(HostsFound((("a", 3),)))
    sim.send(LaunchFailed("a/2#1", "cannot start python3: exec format error", HOST))
    assert [e["key"] for e in sim.logged("blacklisted")] == ["a/2"]
    assert sim.end() is None
    leave(sim, [a0, a1])
    assert sim.world() == {"a/0": 0, "a/1": 1}


def test_the_drivers_own_fork_failing_blames_nobody_and_is_retried_after_a_pause():
    sim, (a0, b0) = first_world([("a", 1), ("b", 1)])
    sim.send(HostsFound((("a", 1), ("b", 1), ("c", 1))))
    out = sim.send(LaunchFailed("c/0#1", "BlockingIOError: [Errno 11] Resource temporarily unavailable",
                                DRIVER))
    assert not sim.logged("blacklisted") and sim.core.first_failure is None
    assert not launches(out)  # not at once: the driver is short of processes or memory
    assert sim.logged("retry_later") == [{"slot": "c/0", "whose": DRIVER, "after": "1.0s"}]
    assert launches(sim.send(Tick(), after=1.1)) == ["c/0#2"]
    sim.send(LaunchFailed("c/0#2", "OSError: [Errno 24] Too many open files", DRIVER))
    assert sim.logged("retry_later")[-1]["after"] == "2.0s"  # each time twice as long


def test_a_slow_start_is_the_launchers_trouble():
    # Ray found no room for the actor in time; srun's step did not start in time.
    sim, _ = first_world([("a", 1), ("b", 1)])
    sim.send(HostsFound((("a", 1), ("b", 1), ("n", 1))))
    sim.send(LaunchFailed("n/0#1", "cannot start a worker on Ray node n: no room for its actor", LAUNCHER))
    assert not sim.logged("blacklisted") and not sim.core.failures
    assert launches(sim.send(Tick(), after=1.1)) == ["n/0#2"]


def test_a_launch_that_never_starts_meets_the_start_deadline():
    # No pid ever came (the launch sat in a queue): the first world forms without it, and the
    # launch is stopped whenever it starts; nobody is blamed.
    sim = Sim([("a", 1), ("b", 1)], start_timeout=10.0)
    sim.send(Launched("a/0#1", 101))
    sim.ready("a/0#1")
    assert sim.core.round == 0
    out = sim.send(Tick(), after=10.5)
    assert AskRunWait("b/0#1") in out and Stop("b/0#1", 3.0) not in sim.actions
    sim.send(RunWait("b/0#1", None))  # no template it waits for: the wall clock
    assert Stop("b/0#1", 3.0) in sim.actions
    assert sim.logged("launch_overdue")[0]["worker"] == "b/0#1"
    assert sim.world() == {"a/0": 0}
    assert not sim.logged("blacklisted")
    sim.send(Launched("b/0#1", 102))  # its launch ends at last, and it is stopped
    out = sim.send(Exited("b/0#1", -15))
    assert not sim.logged("blacklisted") and not sim.core.failures
    assert launches(out + sim.send(Tick(), after=1.1)) == ["b/0#2"]
    # A launch that ends late with the host's refusal (an SSH connect timeout longer than
    # --start-timeout) still counts as the host's.
    for _ in range(22):
        for ask in [x for x in sim.send(Tick(), after=0.5) if isinstance(x, AskRunWait)]:
            sim.send(RunWait(ask.worker, None))
    assert sim.logged("launch_overdue")[-1]["worker"] == "b/0#2"
    sim.send(LaunchFailed("b/0#2", "SSH connection to b port 22 timed out after 10 s", HOST))
    assert [e["key"] for e in sim.logged("blacklisted")] == ["b"]


def test_a_launch_waiting_for_a_starved_template_is_judged_by_the_time_it_could_run():
    # The local launch waits for its template's imports on a starved machine: the seconds the
    # template waited for a CPU do not count; once its wait no longer explains the delay, the
    # launch is overdue, the launcher's trouble, nobody blamed.
    def ticks(sim, seconds, waited):
        asked = []
        for _ in range(int(seconds / 0.5)):
            for ask in [x for x in sim.send(Tick(), after=0.5) if isinstance(x, AskRunWait)]:
                asked.append(sim.now)
                sim.send(RunWait(ask.worker, waited(sim.now)))
        return asked

    sim = Sim([("a", 1), ("b", 1)], start_timeout=10.0)
    sim.send(Launched("a/0#1", 101))
    sim.ready("a/0#1")
    start = sim.now
    asked = ticks(sim, 25.0, lambda now: 0.9 * (now - start))  # 90 % of the time on the run queue
    assert len(asked) >= 2 and not sim.logged("launch_overdue")
    sim.send(Launched("b/0#1", 102))
    sim.ready("b/0#1")  # the start rule takes the template's wait along
    assert not sim.logged("launch_overdue") and sim.core.round == 1
    assert not sim.logged("worker_unresponsive")
    # The same launch on a template whose wait explains none of its delay: overdue.
    sim = Sim([("a", 1), ("b", 1)], start_timeout=10.0)
    sim.send(Launched("a/0#1", 101))
    sim.ready("a/0#1")
    ticks(sim, 12.0, lambda now: 0.2)
    assert [e["worker"] for e in sim.logged("launch_overdue")] == ["b/0#1"]
    assert not sim.logged("blacklisted")


def test_a_start_is_judged_by_the_time_it_could_run():
    # A burst of process starts starves healthy workers: the seconds one waited for a CPU (read
    # from its /proc when the wall clock says it is late) are not charged to it. One asleep in
    # its start (no wait) is named at --start-timeout, one of another host (no reading) by the
    # wall clock, and one that keeps waiting for a CPU at the ceiling, 10 x --start-timeout.
    sim = Sim([("a", 1), ("b", 1), ("c", 1), ("d", 1)], start_timeout=10.0)
    a, b, c, d = sim.launched()
    share = {a: 0.1, b: 1.0, c: 1.0, d: 0.0}  # of the CPU each gets while it waits for one
    out = sim.send(Tick(), after=10.5)
    assert sorted(x.worker for x in out if isinstance(x, AskRunWait)) == [a, b, c, d]
    assert not sim.logged("worker_start_timeout")  # not before its wait for a CPU is read
    while sim.now < 101.0:
        for ask in [x for x in out if isinstance(x, AskRunWait)]:
            wall = sim.now - sim.core.workers[ask.worker].launched_at
            sim.send(RunWait(ask.worker, None if ask.worker == c else wall * (1 - share[ask.worker])), after=0.0)
        if sim.now >= 50.0 and sim.core.workers[a].answer is None:
            sim.ready(a)  # ready after 50 s, 5 s of them running
        out = sim.send(Tick(), after=0.5)
    named = [(f["worker"], f["reason"]) for f in sim.logged("worker_start_timeout")]
    assert named == [(b, "not ready within 10 s"), (c, "not ready within 10 s"),
                     (d, "not ready within 100 s, most of them waiting for a CPU")]
    for worker in (b, c, d):
        sim.send(Exited(worker, -9))
    assert sim.world() == {"a/0": 0}
    # A's wait was read a handful of times, not at every tick.
    assert 3 <= len([x for x in sim.actions if isinstance(x, AskRunWait) and x.worker == a]) <= 10


def test_a_process_wait_for_a_cpu_is_read_from_its_threads():
    assert 0.0 <= procstat.run_wait(os.getpid()) < time.monotonic()
    assert procstat.run_wait(2 ** 22 + 1) is None  # above pid_max: no such process


@pytest.fixture
def cpu_quota(tmp_path):
    """A cgroup whose processes share 10% of one CPU (CFS quota), as a burst of process starts
    starves a job: its path (v1 or v2), emptied and removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("a CFS quota needs root: mkdir in /sys/fs/cgroup")
    for root, quota in (("/sys/fs/cgroup/cpu", {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "10000"}),
                        ("/sys/fs/cgroup", {"cpu.max": "10000 100000"})):
        group = os.path.join(root, f"hvdlite-test-{os.getpid()}")
        try:
            os.mkdir(group)
        except OSError:
            continue
        try:
            for name, value in quota.items():
                with open(os.path.join(group, name), "w") as f:
                    f.write(value)
        except OSError:
            os.rmdir(group)
            continue
        yield group
        with open(os.path.join(group, "cgroup.procs")) as f:
            leftover = f.read().split()
        for pid in leftover:  # the job stopped every worker; nothing should be left
            with open(os.path.join(root, "cgroup.procs"), "w") as f:
                f.write(pid)
        os.rmdir(group)
        assert not leftover, f"processes left in the quota: {leftover}"
        return
    pytest.skip("no cgroup with a CPU controller can be made here (cgroup v1 cpu or v2 cpu.max)")


def test_a_start_starved_by_a_cpu_quota_forms_and_a_hung_one_is_still_named_in_time(tmp_path, cpu_quota):
    # The worker on 127.0.0.1 starts under a 10% CPU quota: about 0.4 s of CPU (Python, the numpy
    # backend, the rendezvous) take it several seconds of wall clock, past --start-timeout 2. It
    # is not named: it forms a world of one and finishes. The one on 127.0.0.2 sleeps in its
    # start and is named at 2 s. (Before the start rule read the wait for a CPU: both were named
    # at 2 s, both hosts blacklisted, and the job failed.)
    from jobs import Job
    from test_numpy_backend import PYTHON, needs_pygloo
    if needs_pygloo.args[0]:
        pytest.skip(needs_pygloo.kwargs["reason"])
    start = (f'[ "$HVDLITE_SLOT" = 127.0.0.2/0 ] && exec sleep 60; echo $$ > {cpu_quota}/cgroup.procs && '
             f'exec {PYTHON} -c "import hvdlite.numpy as hvd; hvd.init()"')
    with Job(["-H", "127.0.0.1:1,127.0.0.2:1", "--min-np", "1", "--start-timeout", "2", "sh", "-c", start],
             tmp_path) as job:
        r = job.finish(60)
    assert r.code == 0, r.stderr[-3000:]
    started = {e["slot"]: e["time"] for e in r.of("worker_start")}
    (named,) = r.of("worker_start_timeout")
    assert named["slot"] == "127.0.0.2/0" and named["reason"].startswith("not ready within 2 s")
    assert named["time"] - started["127.0.0.2/0"] < 2 + 1.5  # ticks, and this machine's load
    (formed,) = r.of("round_complete")
    assert formed["size"] == 1 and formed["time"] - started["127.0.0.1/0"] > 2, \
        "the start was not slowed past --start-timeout: the test proves nothing"
    assert [e["key"] for e in r.of("blacklisted")] == ["127.0.0.2"]


def test_a_worker_that_lost_the_driver_is_not_blamed_on_its_host():
    sim, (a, b) = first_world([("a", 1), ("b", 1)])
    sim.send(Exited(b, exitcodes.LOST_DRIVER))
    assert not sim.logged("blacklisted") and not sim.core.failures
    assert sim.logged("worker_exit")[-1].get("lost_driver") is True
    assert launches(sim.send(Tick(), after=1.1)) == ["b/0#2"]


def test_a_driver_stopped_past_the_liveness_timeout_blacklists_no_host():
    # Ctrl-Z, then fg: every worker lost the driver and exited 75 meanwhile.
    sim, ids = first_world([("a", 1), ("b", 1), ("c", 1)], liveness_timeout=5.0)
    sim.send(Tick(), after=0.1)
    for worker in ids:
        sim.send(Exited(worker, exitcodes.LOST_DRIVER), after=30.0 if worker == ids[0] else 0.0)
    sim.send(Tick(), after=0.1)
    assert not sim.logged("blacklisted") and sim.end() is None
    assert sorted(launches(sim.send(Tick(), after=2.0))) == ["a/0#2", "b/0#2", "c/0#2"]


def test_whose_trouble_a_failed_launch_was():
    for code in (errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE):  # this process's fork
        assert _whose(OSError(code, os.strerror(code))) == DRIVER
    assert _whose(StartTimedOut("srun step on n1 did not start within 30 s")) == LAUNCHER
    assert _whose(LaunchError("Slurm refused a step on n1: Invalid node name")) == HOST
    assert _whose(OSError(errno.EHOSTUNREACH, "No route to host")) == HOST


def test_an_srun_step_that_does_not_start_in_time_is_the_launchers_trouble(tmp_path):
    # An srun that waits for its step (a busy slurmctld) and never runs the task.
    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\nexec sleep 60\n")
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    with pytest.raises(StartTimedOut, match="srun step on n1 did not start within 0.5 s"):
        SrunWorker("n1", ["true"], env, RankOutput("0"), 0.5)


def test_a_driver_stopped_past_the_liveness_timeout_blames_nobody_and_resumes(tmp_path):
    # Ctrl-Z, then fg: both workers lose the driver and exit 75 meanwhile (a --driver-grace as
    # short as the liveness timeout: the default one would keep them training for the driver).
    # They held the training state; the relaunched workers read it from --checkpoint-dir.
    from jobs import Job, job_env, wait_progress
    from test_durable import JOB, newest_written
    ckpt = tmp_path / "ckpt"
    with Job(["-H", "localhost:2", "--min-np", "1", "--liveness-timeout", "2", "--driver-grace", "2",
              "--checkpoint-dir", str(ckpt),
              "--checkpoint-interval", "0", *JOB], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=40, STEP_SLEEP=0.05)) as job:
        wait_progress(job, tmp_path, 10)
        os.kill(job.proc.pid, signal.SIGSTOP)
        try:
            # Each exits 75: a zombie its stopped driver cannot reap, or gone (a kept template's fork).
            for pid in job.worker_pids():
                deadline = time.monotonic() + 30
                while process_state(pid) not in ("Z", None):
                    assert time.monotonic() < deadline, f"worker {pid} did not lose the driver"
                    time.sleep(0.1)
        finally:
            os.kill(job.proc.pid, signal.SIGCONT)
        written = newest_written(ckpt)
        r = job.finish(120)
    assert r.code == 0, r.stderr[-3000:]
    assert not r.of("blacklisted")
    lost = [e for e in r.of("worker_exit") if e.get("lost_driver")]
    assert len(lost) == 2 and all(e["code"] == exitcodes.LOST_DRIVER for e in lost)
    assert r.of("round_complete")[1]["commit"] == written > 0


def process_state(pid):
    """R, S, Z ... as /proc says (the field after the command's name in parentheses); None
    once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


# ---- which failure a static job names (decisions/cause.py) ------------------------------------
def name_after(events, running=("r2",)):
    """Feed a static job's exits in order ("echo" marks one that said it echoes a broken world);
    returns what is named at each event, and at the end once nobody runs."""
    causes, named, now = Causes(), [], 0.0
    for kind, worker, *rest in events:
        if kind == "echo":
            causes.echoed(worker)
        elif kind == "exit":
            causes.failed(worker, *rest, now)
        else:
            now += worker
        named.append(causes.named(running, now))
    return named + [causes.named((), now)]


def test_a_peers_echo_that_comes_first_waits_for_the_rank_that_raised():
    named = name_after([("echo", "r0"), ("exit", "r0", 1, None), ("tick", 5.0),
                        ("exit", "r1", 1, "ValueError: boom")])
    assert named == [None, None, None, ("r1", 1, "ValueError: boom"), ("r1", 1, "ValueError: boom")]


def test_an_echo_alone_is_named_once_nobody_else_runs_or_after_its_wait():
    assert name_after([("echo", "r0"), ("exit", "r0", 1, None)])[-1] == ("r0", 1, None)
    named = name_after([("echo", "r0"), ("exit", "r0", 1, None), ("tick", ECHO_WAIT - 0.1), ("tick", 0.1)])
    assert named[2:4] == [None, ("r0", 1, None)]


def test_a_failure_without_a_reason_waits_a_moment_for_one_with_a_reason_then_is_named():
    named = name_after([("exit", "r0", -9, None), ("tick", CAUSE_WAIT / 2), ("exit", "r1", 1, "ValueError: x")])
    assert named[:3] == [None, None, ("r1", 1, "ValueError: x")]
    named = name_after([("exit", "r0", -9, None), ("tick", CAUSE_WAIT), ("exit", "r1", 1, "ValueError: x")])
    assert named[1] == ("r0", -9, None)


@settings(max_examples=100, deadline=None)
@given(st.permutations(["cause", "echo1", "echo2"]), st.lists(st.sampled_from([0.0, 0.4, 3.0]), min_size=3,
                                                              max_size=3), st.booleans())
def test_whatever_order_the_exits_come_in_the_rank_that_raised_is_named(order, gaps, says_why):
    # Each echoing peer says so before its exit (its last word to the driver comes first).
    events = []
    for who, gap in zip(order, gaps):
        events.append(("tick", gap))
        if who == "cause":
            events.append(("exit", who, 1, "ValueError: boom" if says_why else None))
        else:
            events += [("echo", who), ("exit", who, 1, None)]
    named = [n for n in name_after(events) if n is not None]
    assert named and named[0][0] == "cause"
