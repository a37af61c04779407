"""hvdlite on a real Slurm 22.05 cluster (tests/slurmcluster.py, four nodes in namespaces, up
once for the module): jobs started inside `salloc` or `sbatch` with no host flags run on the
allocation as srun steps; a node killed outright under --no-kill costs one re-form within
hvdlite's liveness timeout, long before Slurm notices."""
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from capture import HOLD, check_the_wire, watched_job
from jobs import (SCRIPTS, Job, _tree, check_training_continuous, effective_steps, frozen_until_probed,
                  job_env, next_world, progress, run_job, sizes, slot_pid, steps_log, wait_progress, wait_until)
from slurmcluster import missing, SlurmCluster
from test_elastic import check_exactly_once_per_epoch
from hvdlite import exitcodes
from hvdlite.worker import beacon, checkpointdir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYGLOO = os.path.join(ROOT, ".venv-pygloo", "bin", "python")
WHERE = [sys.executable, os.path.join(SCRIPTS, "where.py")]
JOB = [sys.executable, os.path.join(SCRIPTS, "elastic_job.py")]
# nodes named: busy ones fail the salloc in a line ("queued and waiting for resources"), not a
# silent wait past the test's own timeouts
SALLOC = ["salloc", "--immediate=30"]
SLURMD_TIMEOUT = 10  # seconds: Slurm marks a dead node down after this (and one ping, ~1/3 of it)


@pytest.fixture(scope="module")
def cluster():
    reason = missing()
    if reason:
        pytest.skip(reason)
    c = SlurmCluster(4, slurmd_timeout=SLURMD_TIMEOUT)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(autouse=True)
def free_nodes(cluster):
    """Each test starts on free nodes: its own jobs ended, its killed nodes restarted."""
    yield
    cluster.free()


@pytest.fixture
def env(cluster):
    """The driver's environment: this cluster's slurm.conf, this checkout's hvdlite."""
    return {"SLURM_CONF": cluster.conf, "PYTHONPATH": ROOT}


def assert_nothing_left(cluster, names=None):
    deadline = time.monotonic() + 10  # slurmstepd tidies up a step just after srun returns
    while any(cluster.leftovers(n) for n in names or cluster.names):
        if time.monotonic() > deadline:
            raise AssertionError({n: cluster.leftovers(n) for n in names or cluster.names})
        time.sleep(0.1)


def sbatch(cluster, tmp_path, flags, command, env, timeout=120):
    """Run `command` as a batch script (on the first node, as Slurm does) and wait for it;
    returns (exit code, the script's output). Polled here: `sbatch --wait` looks every 10 s."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n" + "".join(f"#SBATCH {f}\n" for f in flags) +
                      " ".join(command) + "\n")
    out = tmp_path / "slurm.out"
    job_id = cluster.run(["sbatch", "--parsable", "-o", str(out), "-D", str(tmp_path), str(script)],
                         env=env).stdout.strip()
    deadline = time.monotonic() + timeout
    while True:
        record = cluster.run(["scontrol", "show", "job", "-o", job_id]).stdout
        state = re.search(r"JobState=(\S+)", record).group(1)
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            break
        if time.monotonic() > deadline:
            cluster.run(["scancel", job_id], check=False)
            raise AssertionError(f"batch job {job_id} still {state} after {timeout} s")
        time.sleep(0.1)
    code = int(re.search(r"ExitCode=(\d+):", record).group(1))
    return code, out.read_text() if out.exists() else record


def driver(*args):
    return " ".join([sys.executable, "-m", "hvdlite.cli", "run", *args])


def run_in(via, cluster, tmp_path, flags, command, env):
    """A static job with no host flags in `salloc FLAGS` or an sbatch script with FLAGS:
    (exit code, everything it printed)."""
    if via == "salloc":
        r = run_job(command, tmp_path, timeout=120, env=env, prefix=["salloc", *flags])
        return r.code, r.stdout + r.stderr
    return sbatch(cluster, tmp_path, flags, [driver(*command)], env)


@pytest.mark.parametrize("nodes, per_node, via", [(2, 2, "salloc"), (4, 1, "sbatch")])
def test_torch_static_job_with_no_host_flags(tmp_path, cluster, env, nodes, per_node, via):
    files = tmp_path / "out"
    tasks = nodes * per_node
    code, out = run_in(via, cluster, tmp_path, [f"-N{nodes}", f"--ntasks-per-node={per_node}"],
                       ["--output-filename", str(files), *WHERE], env)
    assert code == 0, out
    assert "Slurm allocation" in out and f"({nodes} nodes, {tasks} tasks)" in out
    assert "workers started as srun steps" in out
    lines = sorted((line.split(":", 1)[1].split() for line in out.splitlines()
                    if "<stdout>:" in line), key=lambda w: int(w[0]))
    assert [(int(w[0]), w[1]) for w in lines] == [(k, f"n{k // per_node + 1}") for k in range(tasks)]
    for k in range(tasks):  # --output-filename: each rank's lines in its own file too
        assert (files / f"rank.{k}" / "stdout").read_text().split()[:2] == [str(k), f"n{k // per_node + 1}"]
    assert_nothing_left(cluster)


@pytest.mark.skipif(not os.path.exists(PYGLOO), reason=f"no pygloo venv at {PYGLOO} (.ci/setup.sh)")
@pytest.mark.parametrize("nodes, via", [(2, "sbatch"), (4, "salloc")])
def test_numpy_static_job_with_no_host_flags(tmp_path, cluster, env, nodes, via):
    check = [PYGLOO, os.path.join(SCRIPTS, "numpy_check.py")]
    code, out = run_in(via, cluster, tmp_path, [f"-N{nodes}", "--ntasks-per-node=1"], check, env)
    assert code == 0, out
    for k in range(nodes):
        assert f"[{k}]<stdout>:OK {k}" in out
    assert_nothing_left(cluster)


def test_discovery_command_prints_the_allocation(tmp_path, cluster, env):
    r = cluster.run(["salloc", "-N3", "-n5", sys.executable, "-m", "hvdlite.slurm", "hosts"],
                    env=env, check=False, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["n1:2", "n2:2", "n3:1"]  # SLURM_TASKS_PER_NODE=2(x2),1


def test_bad_requests_in_an_allocation_are_one_line_errors(tmp_path, cluster, env):
    def run(prefix, *args):
        proc = cluster.run(["salloc", "-N2", *prefix, sys.executable, "-m", "hvdlite.cli", "run",
                            *args], env=env, check=False, timeout=90, cwd=str(tmp_path))
        errors = [line for line in proc.stderr.splitlines() if line.startswith("hvdlite")]
        assert "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
        return proc.returncode, errors[0]

    code, line = run([], "-np", "3", *WHERE)
    assert code == 2 and "-np 3 asks for more processes than the 2 tasks of Slurm allocation" in line
    code, line = run(["env", "PATH=/nonexistent"], *WHERE)
    assert code == 2 and "srun not found on PATH" in line
    # n3 is not in the allocation: Slurm refuses the step, and 22.05 refuses the concurrent one on
    # n1 too about half the time ("Requested node configuration is not available", 5 of 12 by
    # hand): the first refusal read is named
    code, line = run([], "--launcher", "srun", "-H", "n1:1,n3:1", *WHERE)
    assert code == 1 and re.search(r"Slurm refused a step on n[13]: ", line), line  # srun's reason, when read in time
    assert_nothing_left(cluster)


def test_an_elastic_job_without_no_kill_is_warned(tmp_path, cluster, env):
    """The warning is the driver's, at the job's start: the worker can be `true`."""
    warning = "shows no --no-kill: one node's failure cancels the whole allocation"
    args = ["--min-np", "1", "true"]
    r = run_job(args, tmp_path, timeout=120, env=env, prefix=["salloc", "-N1"])
    assert r.code == 0, r.stderr
    assert sum(warning in line for line in r.stderr.splitlines()) == 1
    code, out = sbatch(cluster, tmp_path, ["-N1", "--no-kill"], [driver(*args)], env)
    assert code == 0, out
    assert "Slurm allocation" in out and warning not in out


@pytest.mark.parametrize("fault", ["kill_node", "partition"])
def test_a_lost_node_is_known_in_a_second_not_after_the_liveness_timeout(tmp_path, cluster, env, fault):
    """Every process of a node killed (srun hears nothing: slurmd died too), or its link cut
    (no FIN), just after a probe found its frozen worker listening: the driver's next probe of
    the node says so (decisions/nodeloss.py)."""
    liveness = 15  # far above the probe's second
    jenv = {**env, "SALLOC_NO_KILL": "", **job_env(tmp_path, TOTAL_STEPS=100000, STEP_SLEEP=0.1)}
    with Job(["--min-np", "2", "--liveness-timeout", str(liveness), *JOB], tmp_path, env=jenv,
             prefix=[*SALLOC, "-w", "n[2-4]", "--no-kill"]) as job:
        wait_progress(job, tmp_path, 8)
        try:
            frozen_until_probed(job, cluster, "n4", "n4/")
            seconds, world = next_world(job, lambda: getattr(cluster, fault)("n4"))
        finally:  # the cut node's orphaned task ends with the job (free_nodes checks it)
            cluster.freeze("n4", signal.SIGCONT)
            cluster.heal("n4")
        wait_progress(job, tmp_path, progress(tmp_path) + 5)
        os.kill(_tree(job.proc.pid)[1], signal.SIGTERM)  # salloc's child: the driver
        r = job.finish(60)
    assert r.code == 143, r.stderr
    assert world["size"] == 2 and not any(m.startswith("n4/") for m in world["members"])
    # A hang guard against the liveness timeout (15 s) only; the figure: bench/slurm.py
    assert seconds < 5, f"re-formed after {seconds:.1f} s"
    assert [e["outcome"] for e in r.of("node_probed") if e["slot"].startswith("n4/")][-1] == \
        ("refused" if fault == "kill_node" else "silent")


def test_a_killed_node_costs_one_reform_long_before_slurm_notices(tmp_path, cluster, env):
    liveness = 3.0
    # SALLOC_NO_KILL: salloc's --no-kill in a form the job can see (22.05 shows it nowhere)
    jenv = {**env, "SALLOC_NO_KILL": "", **job_env(tmp_path, TOTAL_STEPS=100000, STEP_SLEEP=0.2)}
    with Job(["--min-np", "2", "--liveness-timeout", str(liveness), "--discovery-interval", "1",
              *JOB], tmp_path, env=jenv, prefix=[*SALLOC, "-w", "n[2-4]", "--no-kill"]) as job:
        wait_progress(job, tmp_path, 8)
        job_id = _job_id(job)
        seconds, world = next_world(job, lambda: cluster.kill_node("n4"))
        listed = _nodelist(cluster, job_id)
        assert seconds < liveness + 3, f"re-formed after {seconds:.1f} s"
        assert world["size"] == 2 and not any(m.startswith("n4/") for m in world["members"])
        assert listed == "n[2-4]", "Slurm had noticed the dead node already: this proves nothing"
        events = job.wait_for(lambda events: any(
            e["event"] == "hosts_changed" and "n4" in e["removed"] for e in events),
            SLURMD_TIMEOUT * 3 + 20)
        assert _nodelist(cluster, job_id) == "n[2-3]"
        wait_progress(job, tmp_path, progress(tmp_path) + 10)  # training goes on after the shrink
        driver_pid = _tree(job.proc.pid)[1]  # salloc's child
        os.kill(driver_pid, signal.SIGTERM)
        r = job.finish(60)
    assert r.code == 143, r.stderr
    assert [e for e in events if e["event"] == "hosts_changed"][-1]["hosts"] == ["n2:1", "n3:1"]
    assert "shows no --no-kill" not in r.stderr
    records = steps_log(tmp_path)
    done = sorted(effective_steps(records))
    assert done == list(range(len(done))), "a committed step was lost"
    assert sizes(records)[:2] == [3, 2]
    assert_nothing_left(cluster, ["n2", "n3"])


def _job_id(job):
    return [line.split()[3] for line in job.read(job.err).splitlines() if "Slurm allocation" in line][0]


@contextlib.contextmanager
def allocation(cluster, tmp_path, *flags):
    """An allocation held by `salloc FLAGS` for the block, as a user's interactive salloc shell
    holds it: yields the environment its shell has. Drivers run in it as this test's children,
    so the death of one leaves the allocation be."""
    told = tmp_path / "allocation.env"
    holder = subprocess.Popen(["salloc", *flags, "sh", "-c", f'env > "{told}.part" && mv "{told}.part" "{told}"'
                                                         " && exec sleep 600"],
                              env=cluster.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(told.exists, 60, "the allocation")
        yield dict(line.split("=", 1) for line in told.read_text().splitlines()
                   if line.startswith(("SLURM_", "SALLOC_")))
    finally:
        if told.exists():  # salloc ends once Slurm revoked it
            job_id = [line for line in told.read_text().splitlines() if line.startswith("SLURM_JOB_ID=")][0]
            cluster.run(["scancel", job_id.split("=")[1]], check=False)
        else:
            holder.send_signal(signal.SIGINT)  # a request still pending is withdrawn
        try:
            holder.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait(10)


def test_sigterm_to_one_step_shrinks_the_world_then_usr1_stops_it_and_a_killed_driver_leaves_the_steps_to_their_grace(
        tmp_path, cluster, env):
    """SIGTERM to one worker's step shrinks the world, with no rollback and no blacklisting;
    then `scancel -s USR1 JOB`, which signals the job's steps and not the shell the driver runs
    in (as `#SBATCH --signal=USR1@90` does before the allocation ends), stops the job at a
    commit; the same command resumes exactly there. Then kill -9 of that driver (docs/slurm.md):
    its srun clients and steps live on, the same command run at once is refused in one line
    while they may train, and again past the grace while one still runs (rank 0, stopped here:
    a fresh start beside it would race its last commit); they exit 75, rank 0's newest commit
    on disk, and the same command resumes from it: nothing lost, nothing trained twice."""
    ckpt, total, grace = tmp_path / "ckpt", 60, 5
    flags = ["--min-np", "1", "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "600",
             "--driver-grace", str(grace), *JOB]  # the grace: the liveness timeout's 5 s
    runs = [tmp_path / f"run{k}" for k in range(1, 6)]
    for folder in runs:
        folder.mkdir()
    with allocation(cluster, tmp_path, "-N2", "--no-kill") as alloc:
        jenv, job_id = {**env, **alloc, "SALLOC_NO_KILL": ""}, alloc["SLURM_JOB_ID"]

        def job(k, **knobs):
            return Job(flags, runs[k - 1], env={**jenv, **job_env(tmp_path, TOTAL_STEPS=total, RUN=k, **knobs)})

        with job(1, STEP_SLEEP=0.1) as first:
            wait_progress(first, tmp_path, 8)
            step = _step_of(cluster, "n2")
            # 22.05's scancel says "Invalid job id specified" for a signalled step, and delivers it
            _, world = next_world(first, lambda: cluster.run(["scancel", "-s", "TERM", step], check=False))
            wait_progress(first, tmp_path, progress(tmp_path) + 2)  # the world of one trains
            cluster.run(["scancel", "-s", "USR1", job_id], check=False)
            first = first.finish(60)
        assert world["size"] == 1
        assert first.code == exitcodes.RESUMABLE, first.stderr
        assert not first.of("blacklisted")
        assert not first.of("rolled_back") and not first.of("rollback")
        assert sizes(steps_log(tmp_path)) == [2, 1]
        stopped = first.of("job_end")[-1]
        written = checkpointdir.newest(str(ckpt))[0]
        assert stopped["result"] == "stopped" and written == stopped["commit"] > 0

        second = job(2, STEP_SLEEP=0.1)  # resumes there; its close() would kill the workers it names
        try:
            wait_progress(second, tmp_path, written + 5)
            sruns = _tree(second.proc.pid)[1:]
        finally:
            second.proc.kill()
            second.proc.wait(10)
            second.out.close()
            second.err.close()
        killed, killed_at = time.time(), progress(tmp_path)
        events = second.events()
        members = [e for e in events if e["event"] == "round_complete"][-1]["members"]
        root_slot = next(slot for slot, rank in members.items() if rank == 0)
        root = slot_pid(second, root_slot)
        assert len(_steps(cluster, job_id)) == len(members) and all(map(_alive, sruns)), \
            "the srun clients or steps died with the driver"
        wait_until(lambda: progress(tmp_path) > killed_at + 2, 30, "steps while no driver runs")
        os.kill(root, signal.SIGSTOP)  # rank 0 outlives the grace: its newest commits only it holds
        try:
            # At once, and past the grace (the other ended then; the journal may be a little
            # younger than their last heartbeat): refused while one may train, or still runs.
            at_once = run_job(flags, runs[2], timeout=60, env={**jenv, **job_env(tmp_path, RUN=3)})
            wait_until(lambda: len(_steps(cluster, job_id)) == 1 and time.time() > killed + grace, 30,
                       "the other's end")
            late = run_job(flags, runs[3], timeout=60, env={**jenv, **job_env(tmp_path, RUN=4)})
        finally:
            os.kill(root, signal.SIGCONT)
        assert at_once.code == exitcodes.FAILED and _one_error(at_once) and \
            "the last driver of this job left workers on n" in at_once.stderr, at_once.stderr
        assert late.code == exitcodes.FAILED and _one_error(late) and \
            f"left workers on {root_slot.split('/')[0]} that still run past their --driver-grace" in late.stderr, \
            late.stderr
        wait_until(lambda: not _steps(cluster, job_id), 30, "rank 0's step's end")
        wait_until(lambda: not any(_alive(p) for p in sruns), 10, "the srun clients' end")
        words = {w: open(beacon.output_path(str(ckpt), w, "exit")).read()
                 for w in (e["worker"] for e in events if e["event"] == "worker_start")}
        assert set(words.values()) == {str(exitcodes.LOST_DRIVER)}, words
        on_disk = checkpointdir.newest(str(ckpt))[0]
        # (progress is written as a commit begins: rank 0 may have stopped inside that one)
        assert progress(tmp_path) - 1 <= on_disk and on_disk >= killed_at + 2, "rank 0's newest commit is not on disk"

        with job(5, STEP_SLEEP=0.02) as last:
            last = last.finish(120)
    assert last.code == 0, last.stderr
    records = check_training_continuous(tmp_path, total)
    for run, commit in ((2, written), (5, on_disk)):  # nothing lost, nothing again
        assert min(r["step"] for r in records if r["run"] == run) == commit
    check_exactly_once_per_epoch(records, dataset=64)
    assert_nothing_left(cluster)


def _steps(cluster, job_id):
    """The running srun steps (JOB.STEP) of the job (a node cut and killed by an earlier test
    may leave its job's step listed for a while)."""
    return cluster.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"]).stdout.split()


def _alive(pid):
    """Whether the process runs (a zombie nobody reaped has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _one_error(result):
    errors = [line for line in result.stderr.splitlines() if line.startswith("hvdlite: error:")]
    return len(errors) == 1 and "Traceback" not in result.stderr


def _nodelist(cluster, job_id):
    record = cluster.run(["scontrol", "show", "job", "-o", job_id]).stdout
    return re.search(r"(?:^|\s)NodeList=(\S+)", record).group(1)


def _step_of(cluster, node):
    """JOB.STEP of the running step on `node` (squeue -s)."""
    out = cluster.run(["squeue", "-s", "-h", "-o", "%i %N"]).stdout.split("\n")
    steps = [line.split()[0] for line in out if line.endswith(" " + node)
             and line.split()[0].split(".")[1].isdigit()]
    assert steps, out
    return steps[-1]


@pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump is not installed (.ci/install-ssh.sh)")
def test_the_secret_never_crosses_the_network_and_a_token_read_off_it_is_refused(tmp_path, cluster, env):
    """A capture on the cluster's bridge through a real job's launches, rendezvous and training:
    none of the secret's forms; the token the launch message shows, replayed from a node, is
    refused and the driver says so once."""
    def start(folder):
        return Job([sys.executable, HOLD, str(folder)], tmp_path, env=env,
                   prefix=["salloc", "-N2", "--ntasks-per-node=1"])
    check_the_wire(*watched_job(start, cluster.bridge.name, tmp_path, cluster.netns["n3"]))
    assert_nothing_left(cluster)


def test_a_torchrun_script_runs_unchanged_as_srun_steps(tmp_path, cluster, env):
    """docs/torchrun.md: env://, DDP and dist.* on the allocation, through the signed store."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, out = run_in("salloc", cluster, tmp_path, ["-N2", "--ntasks-per-node=2"],
                       [sys.executable, os.path.join(SCRIPTS, "train_ddp.py")], {**env, "OUT_DIR": str(out_dir)})
    assert code == 0, out
    ranks = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(4)]
    assert [r["env"]["GROUP_RANK"] for r in ranks] == ["0", "0", "1", "1"]
    assert {r["store"] for r in ranks} == {"KVStore"} and len({r["params"] for r in ranks}) == 1
    assert_nothing_left(cluster)
