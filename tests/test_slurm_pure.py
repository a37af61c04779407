"""Slurm without a cluster: hostlist and task-count formats (hvdlite/discovery/hostlist.py), the
allocation read from a job's variables, the batch-script check for --no-kill, and `hvdlite run`
in and out of an allocation. The expansion is also checked against the real `scontrol show
hostnames` (needs only the scontrol binary)."""
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from hvdlite.discovery.hostlist import SlurmFormatError, expand, tasks_per_node
from hvdlite.discovery.slurm import _directs_no_kill, allocation
from hvdlite.driver.decisions import adoption

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

# A hostlist as a structure: items, each a sequence of (text, ranges) pieces; a range is
# (low, high, width). Rendering it and expanding it must give the names it stands for.
_text = st.builds(lambda a, b: a + b, st.sampled_from("abnxz"), st.text("abcxyz-_.", max_size=2))
_range = st.tuples(st.integers(0, 120), st.integers(0, 4), st.integers(0, 2)).map(
    lambda t: (t[0], t[0] + t[1], len(str(t[0])) + t[2]))
_piece = st.tuples(_text, st.lists(_range, min_size=1, max_size=3))
_item = st.one_of(_text.map(lambda t: [(t, None)]), st.lists(_piece, min_size=1, max_size=2))


def _render(item):
    if item[0][1] is None:  # a plain name
        return item[0][0]
    out = ""
    for text, ranges in item:
        body = ",".join(f"{lo:0{w}d}" if lo == hi else f"{lo:0{w}d}-{hi:0{w}d}"
                        for lo, hi, w in ranges)
        out += f"{text}[{body}]"
    return out


def _names(item):
    if item[0][1] is None:
        return [item[0][0]]
    names = [""]
    for text, ranges in item:
        numbers = [f"{n:0{w}d}" for lo, hi, w in ranges for n in range(lo, hi + 1)]
        names = [f"{name}{text}{n}" for name in names for n in numbers]
    return names


@given(st.lists(_item, min_size=1, max_size=4), st.sampled_from([",", " ", ",,"]))
def test_hostlists_expand_to_the_names_they_stand_for(items, sep):
    assert expand(sep.join(_render(i) for i in items)) == [n for i in items for n in _names(i)]


@given(st.lists(st.tuples(st.integers(0, 99), st.integers(1, 5), st.booleans()), min_size=1,
                max_size=6))
def test_tasks_per_node_reads_every_run_length_form(runs):
    text = ",".join(f"{n}(x{k})" if k > 1 or long else f"{n}" for n, k, long in runs)
    runs = [(n, k) for n, k, _ in runs]
    assert tasks_per_node(text) == [n for n, k in runs for _ in range(k)]


def test_known_forms():
    assert expand("n[1-3,5],vm") == ["n1", "n2", "n3", "n5", "vm"]
    assert expand("n[08-10]") == ["n08", "n09", "n10"]
    assert expand("n[1-010]") == [f"n{i}" for i in range(1, 11)]  # width of the first bound
    assert expand("r[1-2]n[01-02]") == ["r1n01", "r1n02", "r2n01", "r2n02"]
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]


@pytest.mark.parametrize("bad", ["n[3-1]", "n[]", "n[1-", "n[a-b]", "n[1-2]]", "n[1-2-3]",
                                 "n[[1]]", "n[0-99999999]"])
def test_malformed_hostlists_are_one_line_errors(bad):
    with pytest.raises(SlurmFormatError) as e:
        expand(bad)
    assert "\n" not in str(e.value) and bad in str(e.value)


@pytest.mark.parametrize("bad", ["2(x3", "", "a", "2(x0)", "1,,2", "-1", "2(x3)x", "1(x99999999)"])
def test_malformed_tasks_per_node_is_one_line_error(bad):
    with pytest.raises(SlurmFormatError, match="SLURM_TASKS_PER_NODE"):
        tasks_per_node(bad)


def test_allocation_from_the_job_variables():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_TASKS_PER_NODE": "2(x3),1"}
    alloc = allocation(env)
    assert alloc.job_id == "7" and alloc.hosts == [("n1", 2), ("n2", 2), ("n3", 2), ("n4", 1)]
    assert alloc.tasks == 7
    assert allocation({**env, "SLURM_STEP_ID": "0"}) is None  # inside a step: not ours to drive
    assert allocation({}) is None
    with pytest.raises(SlurmFormatError, match="counts 2 nodes.*names 4"):
        allocation({**env, "SLURM_TASKS_PER_NODE": "2(x2)"})
    with pytest.raises(SlurmFormatError, match="SLURM_TASKS_PER_NODE is not"):
        allocation({"SLURM_JOB_ID": "7", "SLURM_NODELIST": "n1"})


def test_hosts_command_on_a_malformed_variable_prints_one_line_and_fails():
    env = {**os.environ, "PYTHONPATH": ROOT, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]",
           "SLURM_TASKS_PER_NODE": "2(x"}
    env.pop("SLURM_STEP_ID", None)
    proc = subprocess.run([sys.executable, "-m", "hvdlite.slurm", "hosts"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "SLURM_TASKS_PER_NODE='2(x'" in proc.stderr


def test_no_kill_directives_in_a_batch_script():
    assert _directs_no_kill("#!/bin/bash\n#SBATCH -N 4 --no-kill --requeue\nhvdlite run x\n")
    assert _directs_no_kill("#!/bin/sh\n\n#SBATCH -k\n")
    assert not _directs_no_kill("#!/bin/sh\n#SBATCH -N 4 --no-kill=off\n")
    assert not _directs_no_kill("#!/bin/sh\necho hi\n#SBATCH --no-kill\n")  # after a command
    assert not _directs_no_kill("#!/bin/sh\n# SBATCH --no-kill\n")  # not a directive
    assert not _directs_no_kill("#!/bin/sh\n#SBATCH -N 2 # --no-kill\n")


@pytest.fixture(scope="module")
def scontrol_conf(tmp_path_factory):
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol is not installed (run .ci/install-slurm.sh as root)")
    conf = tmp_path_factory.mktemp("slurmconf") / "slurm.conf"
    conf.write_text("ClusterName=formats\nSlurmctldHost=localhost\n")  # all `show hostnames` needs
    return str(conf)


@settings(max_examples=60, deadline=None)
@given(st.lists(_item, min_size=1, max_size=3))
def test_expansion_matches_scontrol_show_hostnames(scontrol_conf, items):
    # (the generated lists end items with a bracket: scontrol rejects `a[1-2]b`)
    hostlist = ",".join(_render(i) for i in items)
    proc = subprocess.run(["scontrol", "show", "hostnames", hostlist], capture_output=True,
                          text=True, timeout=30, env={**os.environ, "SLURM_CONF": scontrol_conf})
    assert proc.stdout.split() == expand(hostlist), proc.stderr


# ---- the CLI inside and outside an allocation (no cluster: the job's variables are set here) ----
from hvdlite.cli import parse_settings  # noqa: E402
from hvdlite.errors import UsageError  # noqa: E402

CMD = [sys.executable, "-c", "pass"]
JOB_VARS = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2),1"}


@pytest.fixture
def in_allocation(monkeypatch):
    if shutil.which("srun") is None:
        pytest.skip("srun is not installed (run .ci/install-slurm.sh as root)")
    for name, value in JOB_VARS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    return monkeypatch


def test_outside_an_allocation_nothing_changes(monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)
    s = parse_settings(CMD)
    assert (s.launcher, s.slurm, s.hosts, s.num_proc) == (None, None, [("localhost", 1)], 1)


def test_inside_an_allocation_the_job_runs_on_it_as_srun_steps(in_allocation):
    s = parse_settings(CMD)
    assert s.launcher == "srun" and s.hosts == [("n1", 2), ("n2", 2), ("n3", 1)]
    assert s.num_proc == 5 and s.slurm.job_id == "7"  # -np defaults to every task
    s = parse_settings(["--launcher", "ssh", *CMD])
    assert s.launcher == "ssh" and s.hosts == [("n1", 2), ("n2", 2), ("n3", 1)]


def test_host_flags_or_a_step_or_launcher_local_keep_the_old_rules(in_allocation):
    s = parse_settings(["-H", "a:1", *CMD])
    assert (s.launcher, s.slurm, s.hosts) == (None, None, [("a", 1)])
    s = parse_settings(["--launcher", "local", *CMD])
    assert (s.launcher, s.slurm, s.hosts) == ("local", None, [("localhost", 1)])
    in_allocation.setenv("SLURM_STEP_ID", "0")
    s = parse_settings(CMD)
    assert (s.launcher, s.slurm) == (None, None)
    with pytest.raises(UsageError, match="--launcher srun: not inside a Slurm allocation"):
        parse_settings(["--launcher", "srun", *CMD])


def test_bad_requests_in_an_allocation(in_allocation):
    with pytest.raises(UsageError, match="-np 6 asks for more processes than the 5 tasks of Slurm "
                                         r"allocation 7 \(3 nodes, 5 tasks\)"):
        parse_settings(["-np", "6", *CMD])
    in_allocation.setenv("SLURM_TASKS_PER_NODE", "2(x")
    with pytest.raises(UsageError, match=r"SLURM_TASKS_PER_NODE='2\(x'"):
        parse_settings(CMD)
    parse_settings(["-H", "a:1", *CMD])  # a job with its own hosts does not read the variables
    in_allocation.setenv("SLURM_TASKS_PER_NODE", "2(x2),1")
    in_allocation.setenv("PATH", "/nonexistent")
    with pytest.raises(UsageError, match="srun not found on PATH"):
        parse_settings(CMD)


# ---- a rerun after the driver of srun steps died (decisions/adoption.py's rerun) -----------
def _journal(adoptable=True):
    workers = [{"id": f"n{k}/0#1", "host": f"n{k}", "phase": "training"} for k in (1, 2)]
    return {"adoptable": adoptable, "round": 1, "command": ["train.py"], "written_at": 100.0,
            "driver_host": "here", "workers": workers}


@pytest.mark.parametrize("adoptable", [True, False])  # False: its driver died ending the job
def test_a_rerun_refuses_while_a_step_of_the_last_driver_runs_past_its_grace(adoptable):
    """srun steps are not taken over: a rerun refuses while they may train (their grace), and
    after it while Slurm still lists one (stopped, or writing its last commit: a fresh start
    beside it would race that commit); once none runs, it resumes from the disk."""
    def rerun(now, steps):
        return adoption.rerun(_journal(adoptable), {}, steps, set(), {"n1": adoption.OTHER, "n2": adoption.OTHER},
                              ["train.py"], "here", now, 5.0, "/ckpt")

    if adoptable:
        assert "left workers on n1, n2, which train on until" in rerun(101.0, set()).refused
        assert rerun(106.0, {"n1/0#1"}).refused.startswith(
            "the last driver of this job left workers on n1 that still run past their --driver-grace")
    else:
        assert "its workers still run (n1/0#1)" in rerun(106.0, {"n1/0#1"}).refused
    assert rerun(106.0, set()) == adoption.Rerun()


def test_a_refused_step_names_slurms_reason_though_srun_closed_its_stdout_first(tmp_path):
    # srun's stdout may end before its stderr says why the step was refused (read in either
    # order by two pumps): the reason is srun's, not "srun exited with code 1".
    from hvdlite.driver.launchers.base import LaunchError
    from hvdlite.driver.launchers.srun import SrunWorker
    fake = tmp_path / "srun"
    fake.write_text("#!/bin/sh\nexec 1>&-\nsleep 0.3\n"
                    "echo 'srun: error: Unable to create step for job 7: Requested node configuration "
                    "is not available' >&2\nexit 1\n")
    fake.chmod(0o755)

    class Output:
        label, lines = "0", []

        def line(self, stream, text):
            self.lines.append((stream, text))

    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    with pytest.raises(LaunchError, match="^Slurm refused a step on n3: Unable to create step for job 7: "
                                          "Requested node configuration is not available$"):
        SrunWorker("n3", ["true"], env, Output(), 10.0)
