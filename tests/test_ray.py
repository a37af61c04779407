"""hvdlite run --ray on a real Ray 2.60 cluster (tests/raycluster.py: a head and three one-CPU
nodes in network namespaces, one cluster for the whole module): static and elastic jobs on both
backends, workers forked from their node's template and a template killed or hung, a node
killed, added, drained and cut off (faults that prove independent things share one job: each
Ray job and node restart costs tens of CPU-s), a cluster too small (with an autoscaler and
without), the driver killed and the job resumed.

After each test the cluster is reset (RayCluster.reset): a node the test killed, drained or cut
off runs a new raylet (a new Ray node, a new NodeID), and Ray lists no node of the past alive."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from capture import HOLD, check_the_wire, watched_job
from jobs import (SCRIPTS, Job, check_training_continuous, effective_steps, frozen_until_probed, job_env,
                  next_world, progress, run_job, sizes, wait_progress, wait_until)
from raycluster import parent
from test_durable import check_resumed, newest_written, wait_written
from test_elastic import check_exactly_once_per_epoch
from test_numpy_backend import PYTHON, check_training_continuous as check_numpy, needs_pygloo

RAY_NODES = 3
JOB = [sys.executable, os.path.join(SCRIPTS, "elastic_job.py")]
NUMPY_JOB = [PYTHON, os.path.join(SCRIPTS, "numpy_elastic_job.py")]
LIVENESS = 3.0
DRIVER_GONE = 10.0  # seconds until Ray ended a killed driver's actors, and their workers, on every node


@pytest.fixture
def cluster(ray_cluster):
    """The module's cluster; afterwards every node a test killed, drained or cut off runs a
    fresh raylet, and Ray lists no node of the past alive."""
    yield ray_cluster
    ray_cluster.reset()


def ray_env(cluster, tmp_path, **knobs):
    return {**job_env(tmp_path, **knobs), "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": cluster.address}


def elastic(cluster, tmp_path, command=JOB, extra=(), **knobs):
    return Job(["--ray", "--min-np", "1", "--liveness-timeout", str(LIVENESS), *extra, *command],
               tmp_path, env=ray_env(cluster, tmp_path, **knobs))


def wait_no_leftovers(cluster, timeout=15):
    """No process of the job (worker, a child of one, or actor) left on any node."""
    deadline = time.monotonic() + timeout
    while True:
        left = {n: cluster.leftovers(n) for n in cluster.names if n in cluster.procs}
        if not any(left.values()):
            return
        assert time.monotonic() < deadline, f"processes left on the nodes: {left}"
        time.sleep(0.2)


def test_static_job_runs_one_rank_per_node(tmp_path, cluster):
    r = run_job(["--ray", "-np", "3", sys.executable, os.path.join(SCRIPTS, "where.py")], tmp_path,
                timeout=120, env=ray_env(cluster, tmp_path))
    assert r.code == 0, r.stderr
    lines = sorted(line.split(":", 1)[1].split() for line in r.stdout.splitlines() if "<stdout>:" in line)
    assert [rank for rank, *_ in lines] == ["0", "1", "2"]
    assert sorted(host for _, host, *_ in lines) == ["n1", "n2", "n3"]  # each rank on its own node
    wait_no_leftovers(cluster)


@needs_pygloo
def test_static_numpy_job_across_the_nodes(tmp_path, cluster):
    r = run_job(["--ray", "-np", "3", PYTHON, os.path.join(SCRIPTS, "numpy_check.py")], tmp_path,
                timeout=120, env=ray_env(cluster, tmp_path))
    assert r.code == 0, r.stderr
    for k in range(3):
        assert f"[{k}]<stdout>:OK {k}" in r.stdout


@needs_pygloo
def test_elastic_numpy_job_across_the_nodes(tmp_path, cluster):
    with elastic(cluster, tmp_path, NUMPY_JOB, TOTAL_STEPS=30, STEP_SLEEP=0.05) as job:
        r = job.finish(120)
    assert r.code == 0, r.stderr
    assert sizes(check_numpy(tmp_path, 30)) == [3]


def test_a_killed_node_reforms_an_added_one_joins_a_drained_one_leaves_and_a_cut_one_is_fenced(tmp_path, cluster):
    """One job, four faults that prove independent things, in turn: kill -9 of node n3 (a
    failure: its NodeID is blacklisted, the world re-forms within the liveness timeout, nothing
    is lost), a new raylet there (a new Ray node) joins, Ray's drain of that node (it leaves,
    blamed for nothing), and n2 cut off: its heartbeats fall silent, the world re-forms without
    it, and after the heal its worker is told it is no longer part of the job and exits.
    RESIZE holds the job at a step until each fault's world formed, and each next fault waits
    for the job to pass that step: the job waits for a slow node, and trains no step only to
    wait."""
    victim, cut = cluster.node_id("n3"), cluster.node_id("n2")
    with elastic(cluster, tmp_path, TOTAL_STEPS=44, STEP_SLEEP=0.1, RESIZE="12:2,20:3,28:2,36:1") as job:
        wait_progress(job, tmp_path, 8, timeout=90)
        seconds, world = next_world(job, lambda: cluster.kill_node("n3"))
        assert world["size"] == 2 and seconds < LIVENESS + 2.0, seconds
        assert not cluster.node_pids("n3")
        wait_progress(job, tmp_path, 13)
        _, world = next_world(job, lambda: cluster.start_node("n3"), timeout=90)
        assert world["size"] == 3
        added = cluster.node_id("n3")
        wait_progress(job, tmp_path, 21)
        _, world = next_world(job, lambda: cluster.drain_node("n3", deadline=60), timeout=60)
        assert world["size"] == 2
        wait_progress(job, tmp_path, 29)
        try:
            seconds, world = next_world(job, lambda: cluster.partition("n2"))
            # heartbeats silent for LIVENESS s, then the actor gets 2 s to answer a stop
            assert world["size"] == 1 and seconds < LIVENESS + 4.0, seconds
            time.sleep(2)  # cut off past the re-form: it is fenced, not taken back
        finally:
            cluster.heal("n2")
        r = job.finish(120)
        # After the heal the cut-off worker is told it is no longer part of the job and exits.
        wait_no_leftovers(cluster, timeout=LIVENESS + 15)
    assert r.code == 0, r.stderr
    records = check_training_continuous(tmp_path, 44)  # nothing lost
    assert sizes(records) == [3, 2, 3, 2, 1]
    assert all(len(rs) == rs[0]["size"] for rs in effective_steps(records).values())  # nothing from the cut one
    assert [e["key"] for e in r.of("blacklisted")] == [victim, cut]  # the kill and the cut are failures, the drain none
    assert added in [e["slot"].split("/")[0] for e in r.of("worker_start")]
    assert [e["host"] for e in r.of("host_drained")] == [added]
    exits = [e for e in r.of("worker_exit") if e["slot"].startswith(added)]
    assert exits and all(e.get("removed") or e.get("drained") for e in exits), exits


def test_a_lost_node_is_known_in_a_second_not_after_the_liveness_timeout(tmp_path, cluster):
    """Node n3 killed, then node n2 cut off (no FIN), each just after a probe found its frozen
    worker listening: the driver's next probe of it says so (decisions/nodeloss.py). One job,
    the nodes one after the other; RESIZE holds the world of two until n2's fault."""
    with Job(["--ray", "--min-np", "1", "--liveness-timeout", "15", *JOB], tmp_path,
             env=ray_env(cluster, tmp_path, TOTAL_STEPS=30, STEP_SLEEP=0.1, RESIZE="20:1")) as job:
        wait_progress(job, tmp_path, 8, timeout=90)
        for name, fault, size, outcome in (("n3", cluster.kill_node, 2, "refused"),
                                           ("n2", cluster.partition, 1, "silent")):
            victim = cluster.node_id(name)
            try:
                frozen_until_probed(job, cluster, name, victim)
                seconds, world = next_world(job, lambda: fault(name))  # noqa: B023 - called at once
            finally:
                cluster.freeze(name, signal.SIGCONT)
                cluster.heal(name)
            # A hang guard against the liveness timeout (15 s) only; the figure: bench/ray.py
            assert world["size"] == size and seconds < 5, (name, seconds)
            assert [e["outcome"] for e in job.events()
                    if e["event"] == "node_probed" and e["slot"].startswith(victim)][-1] == outcome
        r = job.finish(120)
    assert r.code == 0, r.stderr


def test_workers_fork_from_their_nodes_template_whose_death_costs_no_blacklisting(tmp_path, cluster):
    n1 = cluster.node_id("n1")

    def starts_on_n1(events):
        return [e for e in events if e["event"] == "worker_start" and e["slot"].startswith(n1)]

    # --preload json: the templates start with the first world and are ready at once. Every
    # worker waits at step 6 for the test's go, and at step 7 for a world of 3 again: the job
    # cannot end before the forked worker joins, however long its `import torch` takes (ci15).
    with elastic(cluster, tmp_path, extra=("--blacklist-cooldown-range", "1", "2", "--preload", "json"),
                 TOTAL_STEPS=150, STEP_SLEEP=0.1, HOLD_AT=6, RESIZE="7:3") as job:
        wait_progress(job, tmp_path, 5, timeout=90)
        assert [e["started"] for e in job.events() if e["event"] == "worker_start"] == ["ray"] * 3
        wait_until(lambda: all(cluster.template(n) for n in cluster.names), 60, "templates")
        template = cluster.template("n1")
        # A worker killed on n1 is a failure: n1 cools down, then its slot joins, forked.
        os.kill(starts_on_n1(job.events())[0]["pid"], signal.SIGKILL)
        forked = starts_on_n1(job.wait_for(lambda events: len(starts_on_n1(events)) == 2, 60))[1]
        assert forked["started"] == "template" and parent(forked["pid"]) == template
        (tmp_path / "go").touch()
        job.wait_for(lambda events: any(e["event"] == "round_complete" and e["size"] == 3
                                        and e["time"] > forked["time"] for e in events), 60)
        # kill -9 of the template: its worker dies with it and is relaunched.
        os.kill(template, signal.SIGKILL)
        job.wait_for(lambda events: len(starts_on_n1(events)) == 3, 60)
        r = job.finish(150)
    assert r.code == 0, r.stderr
    (death,) = [e for e in r.of("worker_exit") if e["worker"] == forked["worker"]]
    assert death["code"] == -signal.SIGKILL and death.get("cause") == "its template died", death
    assert [e["key"] for e in r.of("blacklisted")] == [n1]  # the worker's kill only
    check_training_continuous(tmp_path, 150)
    wait_no_leftovers(cluster)  # the templates too


def test_a_nodes_template_that_hangs_costs_one_launch_its_wait_and_is_replaced(cluster):
    # A stopped template answers nobody: one launch's spawn client waits half the start timeout
    # and starts plainly. Before, the template was kept and every later launch on the node
    # waited for it again; now it is ended and forgotten, and the next launch starts another.
    # A Ray driver of its own (tests/scripts/ray_hung_template.py): this process is none.
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, "ray_hung_template.py"), cluster.node_id("n1")],
                       env=cluster.env, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.splitlines()[-1])
    hung = "the template did not answer within 5 s"  # half the launch's 10 s start timeout
    assert seen["said"] == [f"hvdlite: starting workers on {cluster.node_id('n1')} "
                            f"without a preloaded template ({hung})"], seen
    assert seen["started"] == ["ray"] * 3, seen
    assert seen["hung_gone"] and seen["after"] not in (None, seen["hung"]), seen
    wait_no_leftovers(cluster)


def test_more_slots_than_the_cluster_has_is_one_line(tmp_path, cluster):
    r = run_job(["--ray", "-np", "5", sys.executable, os.path.join(SCRIPTS, "where.py")], tmp_path,
                timeout=60, env=ray_env(cluster, tmp_path))
    assert r.code == 1, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "hvdlite: error: the Ray cluster has 3 slots of 1 CPU, fewer than the 5 the job needs, "
        "and no autoscaler to add nodes")
    assert "Traceback" not in r.stderr


def test_a_static_job_on_an_autoscaling_cluster_waits_for_its_slots(tmp_path, cluster):
    """-np 3 with two nodes: the job asks the autoscaler for 3 slots and runs 3 ranks once the
    third node came, never fewer; no node within --start-timeout is one line and an exit code."""
    cluster.stop_node("n3")
    cluster.autoscaled(True)
    try:
        argv = ["--ray", "-np", "3", sys.executable, os.path.join(SCRIPTS, "where.py")]
        r = run_job(["--start-timeout", "2", *argv], tmp_path, timeout=60, env=ray_env(cluster, tmp_path))
        assert r.code == 1, r.stderr
        assert r.stderr.strip().splitlines()[-1] == (
            "hvdlite: error: the Ray cluster has 2 slots of 1 CPU, fewer than the 3 the job needs, "
            "2 s (--start-timeout) after asking its autoscaler for them")
        waits = tmp_path / "waits"
        waits.mkdir()
        with Job(["--start-timeout", "90", *argv], waits, env=ray_env(cluster, waits)) as job:
            time.sleep(3)  # the job waits: it started no rank on the two nodes there are
            assert job.proc.poll() is None and not job.worker_pids()
            cluster.start_node("n3")
            r = job.finish(120)
    finally:
        asked = cluster.autoscaled(False)
    assert asked == [{"CPU": 1}] * 3  # the jobs asked the autoscaler for their slots
    assert r.code == 0, r.stderr
    hosts = sorted(line.split(":", 1)[1].split()[1] for line in r.stdout.splitlines() if "<stdout>:" in line)
    assert hosts == ["n1", "n2", "n3"]


def test_a_terminated_driver_exits_quietly_and_leaves_no_worker(tmp_path, cluster):
    with elastic(cluster, tmp_path, TOTAL_STEPS=100000, STEP_SLEEP=0.1) as job:
        wait_progress(job, tmp_path, 3, timeout=90)
        job.proc.send_signal(signal.SIGTERM)
        r = job.finish(60)
    assert r.code == 143, r.stderr
    assert "SIGTERM received" not in r.stdout + r.stderr  # Ray's native stack dump
    wait_no_leftovers(cluster)


@pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump is not installed (.ci/install-ssh.sh)")
def test_the_secret_never_crosses_the_network_and_a_token_read_off_it_is_refused(tmp_path, cluster):
    """A capture on the cluster's bridge through a real job's actor calls, rendezvous and
    training: none of the secret's forms; the token the actor's task spec shows, replayed from
    a node, is refused and the driver says so once."""
    def start(folder):
        return Job(["--ray", "-np", "2", sys.executable, HOLD, str(folder)], tmp_path,
                   env=ray_env(cluster, tmp_path))
    check_the_wire(*watched_job(start, cluster.bridge.name, tmp_path, cluster.netns["n3"]))
    wait_no_leftovers(cluster)


def test_a_torchrun_script_runs_unchanged_on_the_nodes(tmp_path, cluster):
    """docs/torchrun.md: env://, DDP and dist.* with one rank per node, through the signed store."""
    r = run_job(["--ray", "-np", "3", sys.executable, os.path.join(SCRIPTS, "train_ddp.py")], tmp_path,
                timeout=180, env={**ray_env(cluster, tmp_path), "OUT_DIR": str(tmp_path)})
    assert r.code == 0, r.stderr
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(3)]
    assert {k["store"] for k in ranks} == {"KVStore"} and len({k["params"] for k in ranks}) == 1
    wait_no_leftovers(cluster)


def test_a_killed_driver_leaves_nothing_on_the_nodes_and_the_same_command_resumes_from_the_disk(tmp_path, cluster):
    """kill -9 of an elastic --checkpoint-dir job's driver: Ray ends its actors, and every worker
    with its actor, on every node within DRIVER_GONE s; the same command, run again at once,
    resumes from the newest commit on disk (not refused for --driver-grace, as where workers
    train on): nothing lost, each epoch's samples once, nothing left on the nodes at its end."""
    total, ckpt = 30, tmp_path / "ckpt"
    argv = ["--ray", "--min-np", "1", "--liveness-timeout", str(LIVENESS), "--checkpoint-dir", str(ckpt),
            "--checkpoint-interval", "0", *JOB]
    for run in ("run1", "run2"):
        (tmp_path / run).mkdir()
    # Held at step 15, run 1 cannot end while the writer catches up with 10 and Ray ends its actors.
    with Job(argv, tmp_path / "run1", env=ray_env(cluster, tmp_path, TOTAL_STEPS=total, RUN=1, STEP_SLEEP=0.1,
                                                  HOLD_AT=15)) as job:
        wait_progress(job, tmp_path, 10, timeout=90)
        before = wait_written(ckpt, 10)
        job.proc.kill()
        job.proc.wait(10)
        wait_no_leftovers(cluster, timeout=DRIVER_GONE)
    written = newest_written(ckpt)
    assert before <= written <= progress(tmp_path)  # nothing written lost, nothing uncommitted written
    with Job(argv, tmp_path / "run2", env=ray_env(cluster, tmp_path, TOTAL_STEPS=total, RUN=2, STEP_SLEEP=0.05)) as job:
        result = job.finish(150)
    assert result.code == 0, result.stderr
    records = check_training_continuous(tmp_path, total)
    check_resumed(written, result, records)
    check_exactly_once_per_epoch(records, dataset=64)
    wait_no_leftovers(cluster)
