"""Stragglers (docs/watching.md#stragglers): a rank whose own work per collective is
--straggler-factor times the others' median is named once, and once when it recovers; the
status, /metrics and the timeline show it; --straggler-policy evict fails a persistent one.
Real workers (torch gloo): a step of 0.1 s, the slow rank sleeping 0.3 s more."""
import os
import sys
import urllib.request

from hvdlite.driver.decisions.stragglers import MIN_GAP, PERSIST, WINDOW, Stragglers
from hvdlite.timeline.story import build
from jobs import SCRIPTS, Job, run_job

SCRIPT = os.path.join(SCRIPTS, "hang_job.py")
FAST = ["--timeout-scale", "0.4"]
SLOWED = {"STEP_SLEEP": "0.1", "SLOW_SLEEP": "0.3"}


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_slowed_rank_is_named_once_and_named_recovered_with_the_gauge_labelled(tmp_path):
    port = free_port()
    env = {"LOG_DIR": str(tmp_path), "SLOW": "2:20:80", "STEPS": "140", **SLOWED}
    with Job([*FAST, "-np", "3", "--metrics-port", str(port), sys.executable, SCRIPT], tmp_path, env) as job:
        job.wait_for(lambda events: any(e["event"] == "straggler" for e in events), 60)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            metrics = answer.read().decode()
        r = job.finish(120)
    assert r.code == 0, r.stderr[-3000:]
    assert 'hvdlite_straggler{rank="2"} 1' in metrics and 'hvdlite_straggler{rank="0"} 0' in metrics, metrics
    steps = {line.split("}")[0].split('"')[1]: float(line.split()[-1])
             for line in metrics.splitlines() if line.startswith("hvdlite_step_seconds{")}
    # The gauge is the last window's figure; a straggler is one while its figure is twice the
    # others' median (the first window named may hold fast steps as well).
    assert set(steps) == {"0", "1", "2"} and steps["2"] >= 2 * (steps["0"] + steps["1"]) / 2, steps
    named, recovered = r.of("straggler"), r.of("straggler_recovered")
    assert [(e["rank"], e["slot"]) for e in named] == [(2, "localhost/2")], named
    assert [e["rank"] for e in recovered] == [2], recovered
    assert named[0]["step"] >= 2 * named[0]["median"] and recovered[0]["step"] < 2 * recovered[0]["median"]
    line = next(x for x in r.stderr.splitlines() if "straggler: rank 2" in x)
    assert line.startswith("hvdlite: straggler: rank 2 on localhost (slot localhost/2) takes "), line
    assert "straggler recovered: rank 2 on localhost" in r.stderr
    # The timeline draws its time as a straggler over its lane, from one line to the other.
    story = build(r.events)
    strip = [s for s in story.segments["localhost/2"] if s.state == "straggler"]
    assert len(strip) == 1 and strip[0].end is not None, strip


def test_evict_takes_a_persistent_straggler_out_and_the_world_goes_on_without_it(tmp_path):
    r = run_job([*FAST, "-np", "3", "--min-np", "2", "--straggler-policy", "evict", sys.executable, SCRIPT],
                tmp_path, timeout=150, env={"LOG_DIR": str(tmp_path), "SLOW": "2:10:100000", "STEPS": "250",
                                            "ELASTIC": "1", **SLOWED})
    assert r.code == 0, r.stderr[-3000:]
    evicted = r.of("straggler_evicted")
    assert [e["slot"] for e in evicted] == ["localhost/2"], evicted
    assert "localhost/2" in [e["key"] for e in r.of("blacklisted")]
    last = r.of("round_complete")[-1]
    assert last["size"] == 2 and "localhost/2" not in last["members"], last
    steps = [line.split() for line in open(tmp_path / "steps.txt")]
    assert ["0", "249", "2"] in steps, steps[-4:]


def test_a_rank_out_of_data_idles_in_join_while_the_other_steps_and_nobody_is_named(tmp_path):
    # np 2: rank 1 joins after 10 steps and idles two windows and more; rank 0 is measured
    # against nobody (against the idle rank's nil work it would be named).
    r = run_job([*FAST, "-np", "2", sys.executable, SCRIPT], tmp_path, timeout=90,
                env={"LOG_DIR": str(tmp_path), "JOIN": "1:10", "STEPS": "120", "STEP_SLEEP": "0.1"})
    assert r.code == 0, r.stderr[-3000:]
    assert r.of("straggler") == [], r.of("straggler")
    with open(os.path.join(tmp_path, "steps.txt")) as f:
        ranks = [line.split()[0] for line in f]
    assert ranks.count("0") == 120 and ranks.count("1") == 10, ranks


def test_a_slowed_rank_of_a_torchrun_script_is_named_whether_ddp_or_its_own_dist_calls_wait(tmp_path):
    # No hvdlite import. Steps 0-39: DDP, rank 1 slowed; its peer waits in DDP's reducer, in C++,
    # timed by torch's DDP logger (hvdlite/torch/ddpwait.py). Steps 40-79: the script's own
    # dist.all_reduce, rank 0 slowed; its peer waits in that call, timed by the boot's wrapper
    # (worker/runtime.timed). Then nobody: rank 0 recovers. Untimed, both ranks' own work
    # would read the step, and nobody would be named.
    r = run_job([*FAST, "-np", "2", sys.executable, SCRIPT], tmp_path, timeout=120,
                env={"LOG_DIR": str(tmp_path), "API": "ddp", "DIST": "40", "SLOW": "1:0:40,0:40:80",
                     "STEPS": "240", "STEP_SLEEP": "0.05", "SLOW_SLEEP": "0.2"})
    assert r.code == 0, r.stderr[-3000:]
    named, recovered = r.of("straggler"), r.of("straggler_recovered")
    assert [e["rank"] for e in named] == [1, 0], named
    assert all(e["step"] >= 0.2 for e in named), named  # its SLOW_SLEEP at least: the waits taken out are the peer's
    assert [e["rank"] for e in recovered] == [1, 0], recovered


def test_evict_needs_an_elastic_job(tmp_path):
    r = run_job(["-np", "2", "--straggler-policy", "evict", "true"], tmp_path, timeout=30)
    assert r.code == 2 and "--straggler-policy evict needs an elastic job" in r.stderr, r.stderr


# ---- the rule, pure ----------------------------------------------------------------------
def feed(s, now, figures, calls):
    """One window: each worker entered `calls` collectives and worked `figures[w]` a collective."""
    for w, own in figures.items():
        t0, c0, s0 = s.latest.get(w, (now - WINDOW, 0, 0.0))
        s.heard(w, c0 + calls, s0 + WINDOW - own * calls, now)


def test_named_once_at_the_factor_and_again_when_it_recovers():
    s = Stragglers(2.0)
    s.new_world(0.0)
    for w in "abc":
        s.heard(w, 0, 0.0, 0.0)
    feed(s, WINDOW, {"a": 0.1, "b": 0.1, "c": 0.19}, 10)
    assert s.check("abc", WINDOW) == []  # under the factor
    feed(s, 2 * WINDOW, {"a": 0.1, "b": 0.1, "c": 0.2}, 10)
    assert [(e, w) for e, w, _, _ in s.check("abc", 2 * WINDOW)] == [("straggler", "c")]
    for k in range(3, 3 + PERSIST):
        feed(s, k * WINDOW, {"a": 0.1, "b": 0.1, "c": 0.4}, 10)
        assert s.check("abc", k * WINDOW) == []  # said once
    assert s.persistent("c")
    k = 3 + PERSIST
    assert s.check("abc", k * WINDOW) == []  # a window with no collective says nothing: rank 0 evaluating
    feed(s, (k + 1) * WINDOW, {"a": 0.1, "b": 0.1, "c": 0.1}, 10)
    assert [(e, w) for e, w, _, _ in s.check("abc", (k + 1) * WINDOW)] == [("straggler_recovered", "c")]


def test_the_rank_that_started_first_is_not_named_for_waiting_on_a_late_peers_start():
    """A torchrun script: a's heartbeats start at its init_process_group, which waits (outside
    any timed collective) for b, whose heartbeats start 6 s later; then both step alike, one
    collective a second. Measured from its first beat, a's wait would read as its own work."""
    s = Stragglers(2.0)
    s.new_world(0.0)
    for now in range(11):
        s.heard("a", max(0, now - 7), 0.0, now)
        if now >= 6:
            s.heard("b", max(0, now - 7), 0.0, now)
        if now in (5, 10):
            assert s.check("ab", now + 0.5) == [], now
    feed(s, 15.5, {"a": 1.0, "b": 1.0}, 5)
    assert s.check("ab", 15.5) == [] and s.steps["a"] == s.steps["b"], s.steps
    feed(s, 20.5, {"a": 1.0, "b": 2.0}, 5)  # and a real straggler is named
    assert [(e, w) for e, w, _, _ in s.check("ab", 20.5)] == [("straggler", "b")]


JOINED = """
import sys, threading, time
import torch, torch.distributed as dist
from torch.distributed.algorithms.join import Join
from hvdlite.torch import ddpwait
from hvdlite.worker import runtime
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
ddpwait.watch(model)
seen, done = [], threading.Event()
threading.Thread(target=lambda: [seen.append(runtime.idle()) or time.sleep(0.01) for _ in iter(done.is_set, True)]).start()
with Join([model]):
    for k in range(2 if rank else 6):
        time.sleep(0.1 * (k >= 2))
        model(torch.ones(2, 4)).sum().backward()
done.set()
print(any(seen), runtime.idle(), flush=True)
"""


def test_a_rank_shadowing_its_peers_in_ddp_join_is_idle_until_join_ends():
    """DDP's join() (uneven inputs): rank 1 runs out after 2 steps and shadows rank 0's 4 more;
    its heartbeats say idle meanwhile (hvdlite/torch/ddpwait.py), as in hvd.join(), so the rule
    neither names it nor measures rank 0 against it (its waits, untimed or timed, read as the
    others' steps or as nil). Two plain gloo processes: no job needed."""
    import subprocess
    port = str(free_port())
    ranks = [subprocess.Popen([sys.executable, "-c", JOINED, str(r), port], stdout=subprocess.PIPE, text=True)
             for r in (0, 1)]
    try:
        said = [p.communicate(timeout=150)[0].split() for p in ranks]  # (importing torch: 20 s at load 20)
    finally:
        for p in ranks:
            p.kill()
            p.wait()
    assert said == [["False", "False"], ["True", "False"]], said


def test_a_join_broken_by_its_world_leaves_the_rank_not_idle():
    """A shadowing step that fails (a peer died: gloo raises) gets no post_hook: the rank must
    not stay idle into the next world, where it steps again."""
    from hvdlite.torch import ddpwait

    class Hook:
        def main_hook(self):
            raise RuntimeError("Connection closed by peer")

        def post_hook(self, is_last_joiner):
            pass

    made = Hook()
    hook = ddpwait._join_hook(lambda: lambda **kwargs: made)
    try:
        hook.main_hook()
    except RuntimeError:
        pass
    assert not ddpwait.idle()


def test_tiny_steps_are_not_stragglers():
    s = Stragglers(2.0)
    s.new_world(0.0)
    for w in "abc":
        s.heard(w, 0, 0.0, 0.0)
    feed(s, WINDOW, {"a": 0.001, "b": 0.001, "c": 0.001 + MIN_GAP / 2}, 10)
    assert s.check("abc", WINDOW) == []



def test_a_rank_idle_in_join_is_neither_named_nor_the_baseline():
    """c ran out of data: in join() it answers one allreduce a second, waiting all of that time
    or (its loop's own overhead under load) half of it, while the others step alike."""
    for members in ("abc", "ac"):
        for waits in (1.0, 0.5):
            s = Stragglers(2.0)
            s.new_world(0.0)
            for w in members:
                s.heard(w, 0, 0.0, 0.0)
            for w in members.replace("c", ""):
                s.heard(w, 50, 0.0, WINDOW)
            s.heard("c", 5, waits * WINDOW, WINDOW, idle=True)
            assert s.check(members, WINDOW) == [], (members, waits)
            s.heard("c", 55, waits * WINDOW, 2 * WINDOW)  # stepping again: measured again
            for w in members.replace("c", ""):
                s.heard(w, 100, 0.0, 2 * WINDOW)
            assert s.check(members, 2 * WINDOW) == [] and set(s.steps) == set(members)


def test_a_timed_collective_counts_its_calls_time_once_on_every_thread():
    """worker/runtime.timed, as the boot wraps torch.distributed's collectives: a call made
    inside another (all_gather_into_tensor's all_gather_single) is not counted twice, a call that raises
    is counted and leaves the next one counted, and another thread's calls count too."""
    import threading
    import time
    from hvdlite.worker import runtime

    inner = runtime.timed(lambda: time.sleep(0.02))

    def broken():
        time.sleep(0.02)
        raise RuntimeError("the world broke")

    def counted(call):
        """(seconds counted as waited, seconds the call took)"""
        before, started = runtime.waited(), time.perf_counter()
        call()
        return runtime.waited() - before, time.perf_counter() - started

    waited, took = counted(runtime.timed(lambda: (inner(), inner())))
    assert 0.04 <= waited <= took, (waited, took)
    try:
        runtime.timed(broken)()
    except RuntimeError:
        pass
    def on_a_thread():
        thread = threading.Thread(target=inner)
        thread.start()
        thread.join()

    for call in (inner, on_a_thread):
        waited, took = counted(call)
        assert 0.02 <= waited <= took, (waited, took)


def test_a_worker_whose_python_lacks_hvdlite_still_loads_torch_distributed(tmp_path):
    """The boot sitecustomize is on every worker's PYTHONPATH, whatever interpreter the command
    runs: one without hvdlite loads torch.distributed as torch made it, untimed."""
    import subprocess
    from hvdlite.driver.torchrunenv import BOOT
    (tmp_path / "sitecustomize.py").write_text(  # (the boot runs the sitecustomize it hides)
        "import sys\n"
        "class NoHvdlite:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'hvdlite':\n"
        "            raise ImportError('no hvdlite on this interpreter')\n"
        "sys.meta_path.insert(0, NoHvdlite())\n")
    done = subprocess.run([sys.executable, "-c", "import torch.distributed as d; print(d.all_reduce.__code__.co_name)"],
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([BOOT, str(tmp_path)]),
                               "HVDLITE_RENDEZVOUS_ADDR": "127.0.0.1:1"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() != ["timed_collective"], done.stderr[-2000:]
