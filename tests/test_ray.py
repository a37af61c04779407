"""hvdlite run --ray on a real Ray 2.60 cluster (tests/raycluster.py: a head and three one-CPU
nodes in network namespaces, one cluster for the whole module): static and elastic jobs on both
backends, workers forked from their node's template and a template killed or hung, a node
killed, added, drained and cut off, a cluster too small (with an autoscaler and without).

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
                  next_world, run_job, sizes, wait_progress, wait_until)
from raycluster import parent
from test_numpy_backend import PYTHON, check_training_continuous as check_numpy, needs_pygloo

RAY_NODES = 3
JOB = [sys.executable, os.path.join(SCRIPTS, "elastic_job.py")]
NUMPY_JOB = [PYTHON, os.path.join(SCRIPTS, "numpy_elastic_job.py")]
LIVENESS = 3.0


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
    """No process of the job (worker, or a child of one) left on any node."""
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


def test_a_killed_node_reforms_within_the_liveness_timeout(tmp_path, cluster):
    victim = cluster.node_id("n3")
    with elastic(cluster, tmp_path, TOTAL_STEPS=50, STEP_SLEEP=0.1) as job:
        wait_progress(job, tmp_path, 8, timeout=90)
        seconds, world = next_world(job, lambda: cluster.kill_node("n3"))
        r = job.finish(120)
    assert r.code == 0, r.stderr
    assert world["size"] == 2 and seconds < LIVENESS + 2.0, seconds
    assert sizes(check_training_continuous(tmp_path, 50)) == [3, 2]  # nothing lost
    assert [e["key"] for e in r.of("blacklisted")] == [victim]  # a failure counts
    assert not cluster.node_pids("n3")
    wait_no_leftovers(cluster)


@pytest.mark.parametrize("fault", ["kill_node", "partition"])
def test_a_lost_node_is_known_in_a_second_not_after_the_liveness_timeout(tmp_path, cluster, fault):
    """A node killed or cut off (no FIN) just after a probe found its frozen worker listening:
    the driver's next probe of it says so (decisions/nodeloss.py)."""
    victim = cluster.node_id("n3")
    with Job(["--ray", "--min-np", "1", "--liveness-timeout", "15", *JOB], tmp_path,
             env=ray_env(cluster, tmp_path, TOTAL_STEPS=50, STEP_SLEEP=0.1)) as job:
        wait_progress(job, tmp_path, 8, timeout=90)
        try:
            frozen_until_probed(job, cluster, "n3", victim)
            seconds, world = next_world(job, lambda: getattr(cluster, fault)("n3"))
        finally:
            cluster.freeze("n3", signal.SIGCONT)
            cluster.heal("n3")
        r = job.finish(120)
    assert r.code == 0, r.stderr
    # A hang guard against the liveness timeout (15 s) only; the figure: bench/ray.py
    assert world["size"] == 2 and seconds < 5, seconds
    assert [e["outcome"] for e in r.of("node_probed") if e["slot"].startswith(victim)][-1] == \
        ("refused" if fault == "kill_node" else "silent")


def test_workers_fork_from_their_nodes_template_whose_death_costs_no_blacklisting(tmp_path, cluster):
    n1 = cluster.node_id("n1")

    def starts_on_n1(events):
        return [e for e in events if e["event"] == "worker_start" and e["slot"].startswith(n1)]

    # --preload json: the templates start with the first world and are ready at once.
    with elastic(cluster, tmp_path, extra=("--blacklist-cooldown-range", "1", "2", "--preload", "json"),
                 TOTAL_STEPS=150, STEP_SLEEP=0.1) as job:
        wait_progress(job, tmp_path, 5, timeout=90)
        assert [e["started"] for e in job.events() if e["event"] == "worker_start"] == ["ray"] * 3
        wait_until(lambda: all(cluster.template(n) for n in cluster.names), 60, "templates")
        template = cluster.template("n1")
        # A worker killed on n1 is a failure: n1 cools down, then its slot joins, forked.
        os.kill(starts_on_n1(job.events())[0]["pid"], signal.SIGKILL)
        forked = starts_on_n1(job.wait_for(lambda events: len(starts_on_n1(events)) == 2, 60))[1]
        assert forked["started"] == "template" and parent(forked["pid"]) == template
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


def test_a_node_added_joins_the_job(tmp_path, cluster):
    cluster.stop_node("n3")
    with elastic(cluster, tmp_path, TOTAL_STEPS=60, STEP_SLEEP=0.1, RESIZE="30:3") as job:
        wait_progress(job, tmp_path, 5, timeout=90)
        cluster.start_node("n3")
        r = job.finish(150)
    assert r.code == 0, r.stderr
    assert sizes(check_training_continuous(tmp_path, 60)) == [2, 3]
    assert cluster.node_id("n3") in [e["slot"].split("/")[0] for e in r.of("worker_start")]


def test_a_drained_node_leaves_and_nothing_is_blacklisted(tmp_path, cluster):
    victim = cluster.node_id("n3")
    # 100 steps: `ray drain-node` starts in seconds, more on a loaded machine
    with elastic(cluster, tmp_path, TOTAL_STEPS=100, STEP_SLEEP=0.1) as job:
        wait_progress(job, tmp_path, 8, timeout=90)
        seconds, world = next_world(job, lambda: cluster.drain_node("n3", deadline=60))
        r = job.finish(120)
    assert r.code == 0, r.stderr
    assert world["size"] == 2
    assert not r.of("blacklisted")
    assert [e["host"] for e in r.of("host_drained")] == [victim]
    exits = [e for e in r.of("worker_exit") if e["slot"].startswith(victim)]
    assert exits and all(e.get("removed") or e.get("drained") for e in exits), exits
    assert sizes(check_training_continuous(tmp_path, 100)) == [3, 2]
    wait_no_leftovers(cluster)


def test_a_partitioned_worker_is_fenced_and_refused_after_the_heal(tmp_path, cluster):
    with elastic(cluster, tmp_path, TOTAL_STEPS=80, STEP_SLEEP=0.1) as job:
        wait_progress(job, tmp_path, 8, timeout=90)
        try:
            seconds, world = next_world(job, lambda: cluster.partition("n3"))
            # heartbeats silent for LIVENESS s, then the actor gets 2 s to answer a stop
            assert world["size"] == 2 and seconds < LIVENESS + 4.0, seconds
            time.sleep(2)
        finally:
            cluster.heal("n3")
        r = job.finish(150)
        # After the heal the cut-off worker is told it is no longer part of the job and exits.
        wait_no_leftovers(cluster, timeout=LIVENESS + 15)
    assert r.code == 0, r.stderr
    records = check_training_continuous(tmp_path, 80)
    assert sizes(records) == [3, 2]
    assert all(len(rs) == rs[0]["size"] for rs in effective_steps(records).values())


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
