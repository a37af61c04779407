"""Kept ("warm") templates (`hvdlite run --keep-warm`): a template that outlives its job and
serves the next one. Real template processes, real forks, real kill -9. Every test has its
own XDG_RUNTIME_DIR and ends every kept template it made by pid (from their logs)."""
import functools
import glob
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import sys

import pytest

from hvdlite import procstat
from hvdlite.cli import flag_or_env, parse_settings
from hvdlite.driver.launchers.kept import obtain
from hvdlite.driver.launchers.template import Templates, TemplateWorker
from hvdlite.driver.output import RankOutput
from hvdlite.errors import UsageError
from hvdlite.template import kept
import kepttemplates
from jobs import SCRIPTS, Job, wait_until
from test_template import PYGLOO_PYTHON, alive, finished, needs_pygloo, parent

UID = os.getuid()


# ---- decisions, without processes -----------------------------------------------------

def _stat(mode, uid):
    return os.stat_result((mode, 1, 1, 1, uid, 0, 0, 0, 0, 0))


@pytest.mark.parametrize("mode, uid, problem", [
    (0o40700, UID, None),
    (0o40755, UID, "is open to others (mode 755)"),
    (0o40770, UID, "is open to others (mode 770)"),
    (0o40700, UID + 1, f"belongs to uid {UID + 1}, not {UID}"),
    (0o100600, UID, "is not a directory"),
    (0o120777, UID, "is not a directory"),  # a symlink (lstat)
])
def test_directory_checks(mode, uid, problem):
    assert kept.dir_problem(_stat(mode, uid), UID) == problem


def test_path_and_identity(tmp_path):
    assert kept.runtime_dir({"XDG_RUNTIME_DIR": "/run/user/7"}, 7) == "/run/user/7/hvdlite-7"
    assert kept.runtime_dir({}, 7) == "/tmp/hvdlite-7"
    base = kept.identity(sys.executable, ["torch", "numpy"], {"PYTHONPATH": "/a"})
    assert base == kept.identity(sys.executable, ["torch", "numpy"], {"PYTHONPATH": "/a"})
    others = {kept.identity("/usr/bin/python3.99", ["torch", "numpy"], {"PYTHONPATH": "/a"}),
              kept.identity(sys.executable, ["numpy", "torch"], {"PYTHONPATH": "/a"}),
              kept.identity(sys.executable, ["torch", "numpy"], {"PYTHONPATH": "/b"}),
              kept.identity(sys.executable, ["torch", "numpy"], {})}
    venv_python = tmp_path / "bin" / "python3"
    venv_python.parent.mkdir()
    venv_python.symlink_to(os.path.realpath(sys.executable))
    others.add(kept.identity(str(venv_python), ["torch", "numpy"], {"PYTHONPATH": "/a"}))
    assert base not in others and len(others) == 5
    assert kept.socket_path("/d", base) == f"/d/warm-{base}.sock"


def test_module_stamps_see_a_changed_file(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("x = 1\n")
    stamps = {str(source): kept._stamp(str(source))}
    assert kept.first_changed(stamps) is None
    source.write_text("x = 22\n")
    assert kept.first_changed(stamps) == str(source)
    assert kept.first_changed({str(tmp_path / "gone.py"): (1, 1, 1)}) == str(tmp_path / "gone.py")


def test_keep_warm_flag_and_environment(monkeypatch):
    def keep_warm(flag, value):
        monkeypatch.setenv("HVDLITE_KEEP_WARM", value) if value else monkeypatch.delenv("HVDLITE_KEEP_WARM", raising=False)
        return flag_or_env(flag, "HVDLITE_KEEP_WARM", 0.0, zero=True)
    assert keep_warm(None, None) == 0.0
    assert keep_warm(None, "30") == 30.0
    assert keep_warm(5.0, "30") == 5.0
    assert keep_warm(None, "0") == 0.0
    with pytest.raises(UsageError, match="HVDLITE_KEEP_WARM"):
        keep_warm(None, "soon")
    # --no-preload outranks the variable, and is refused beside the flag.
    monkeypatch.setenv("HVDLITE_KEEP_WARM", "30")
    assert parse_settings(["--no-preload", "-np", "1", "python3", "-c", "pass"]).keep_warm == 0.0
    with pytest.raises(UsageError, match="drop --no-preload"):
        parse_settings(["--keep-warm", "5", "--no-preload", "-np", "1", "python3", "-c", "pass"])


# ---- kept templates ----------------------------------------------------------------------

class Kept:
    """A private runtime directory, a tiny module to preload, and Templates using kept ones."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        # Short: a unix socket's path has 107 bytes at most, and tmp_path is deep under xdist.
        self.run_dir = tempfile.mkdtemp(prefix="hvk-")
        self.modules = tmp_path / "modules"
        self.modules.mkdir()
        (self.modules / "kwmod.py").write_text("VALUE = 1\n")
        path = os.pathsep.join([str(self.modules), os.environ.get("PYTHONPATH", "")])
        self.env = {**os.environ, "XDG_RUNTIME_DIR": self.run_dir, "PYTHONPATH": path,
                    "PYTHONUNBUFFERED": "1"}
        self.folder = kept.runtime_dir(self.env, UID)
        self.made = []

    def templates(self, idle=30.0):
        said = []
        made = Templates(("kwmod",), say=said.append, keeper=functools.partial(obtain, idle=idle))
        self.made.append(made)
        return made, said

    def script(self, name, text):
        path = self.tmp_path / name
        path.write_text(text)
        return str(path)

    def spawn(self, templates, script, label="0"):
        return templates.spawn([sys.executable, script], self.env, str(self.tmp_path), RankOutput(label))

    def kept_pids(self):
        return kepttemplates.pids(os.path.join(self.folder, "warm-*.log"))

    def sockets(self):
        return glob.glob(os.path.join(self.folder, "warm-*.sock"))

    def close(self):
        for templates in self.made:
            templates.close(kill=True)
        kepttemplates.end(os.path.join(self.folder, "warm-*.log"))
        shutil.rmtree(self.run_dir, ignore_errors=True)


@pytest.fixture
def keep(tmp_path):
    k = Kept(tmp_path)
    try:
        yield k
    finally:
        k.close()


WHO = "import os\nprint('parent', os.getppid())\n"
# A worker whose parent a test reads: one that had already ended would have none (ci19).
WAITS_FOR_GO = "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.05)\n"


def test_first_job_starts_plainly_and_leaves_the_kept_template_for_the_next(keep):
    """Without --preload the first --keep-warm job costs what a plain one does: its workers
    import in parallel as plain processes, and the kept template starts as the job ends (it
    holds the start lock until it listens, so the next job waits for it rather than importing).
    The driver ignores its stop signals while the job closes, the kept template's start among
    it: neither the template nor the workers it forks may keep them ignored."""
    script = keep.script("who.py", WHO + "import signal\nprint('stoppable', signal.getsignal(signal.SIGTERM) "
                                         "== signal.SIG_DFL, signal.getsignal(signal.SIGINT) "
                                         "== signal.default_int_handler)\n")
    parents, drivers = [], []
    for n in range(2):
        with Job(["-np", "2", "--keep-warm", "30", sys.executable, script], keep.tmp_path, env=keep.env) as job:
            drivers.append(job.proc.pid)
            result = job.finish(120)
        assert result.code == 0, result.stderr
        parents.append({int(p) for p in re.findall(r"stdout>:parent (\d+)", result.stdout)})
        assert ("starting for later --keep-warm jobs" in result.stderr) == (n == 0), result.stderr
        assert result.stdout.count("stoppable True True") == 2, result.stdout
    (pid,) = keep.kept_pids()
    assert parents == [{drivers[0]}, {pid}]  # plain children of the driver, then forked
    os.kill(pid, signal.SIGTERM)  # `kill PID`, as the driver's line says
    wait_until(lambda: not alive(pid), 10, "the kept template ended by SIGTERM")


def test_a_command_no_template_runs_starts_plain_workers_under_keep_warm(keep):
    """`sh` under --keep-warm: plain workers, as without it (was: 'sh is not a python
    interpreter', the job failed and its hosts were blacklisted for good)."""
    with Job(["-np", "2", "--keep-warm", "30", "sh", "-c", "echo plain $$"], keep.tmp_path, env=keep.env) as job:
        result = job.finish(60)
    assert result.code == 0 and result.stdout.count("plain") == 2, result.stderr


@pytest.mark.parametrize("python, check, preload", [
    (sys.executable, None, "kwmod"),
    pytest.param(PYGLOO_PYTHON, "numpy_check.py", "kwmod,numpy,hvdlite.numpy", marks=needs_pygloo),
])
def test_second_job_forks_from_the_first_jobs_kept_template(keep, python, check, preload):
    # With the numpy backend on its own interpreter: real gloo collectives in forked workers.
    script = keep.script("who.py", WHO + (open(os.path.join(SCRIPTS, check)).read() if check else ""))
    parents = []
    for n in range(2):
        with Job(["-np", "2", "--keep-warm", "30", "--preload", preload, python, script],
                 keep.tmp_path, env=keep.env) as job:
            result = job.finish(120)
        assert result.code == 0, result.stderr
        assert not check or all(f"[{k}]<stdout>:OK {k}" in result.stdout for k in range(2)), result.stdout
        parents.append({int(p) for p in re.findall(r"stdout>:parent (\d+)", result.stdout)})
        assert "without a preloaded template" not in result.stderr
        assert ("kept template" in result.stderr) == (n == 0), result.stderr  # said once, when started
    (pid,) = keep.kept_pids()
    assert parents == [{pid}, {pid}]  # both jobs' workers forked from it, and it outlived job 1
    assert alive(pid)


def test_workers_behave_as_plain_ones(keep, capsys):
    templates, said = keep.templates()
    script = keep.script("look.py", "import os, sys, time\nprint('up', os.getpgrp() == os.getpid(), "
                                    "sorted(int(f) for f in os.listdir('/proc/self/fd')), flush=True)\n"
                                    "print('oops', file=sys.stderr)\n"
                                    "sys.exit(3) if len(sys.argv) < 2 else time.sleep(300)\n")
    handle = keep.spawn(templates, script)
    assert isinstance(handle, TemplateWorker)
    code, out = finished(handle, capsys)
    assert code == 3
    assert out.out == "[0]<stdout>:up True [0, 1, 2, 3]\n" and out.err == "[0]<stderr>:oops\n"
    handle = templates.spawn([sys.executable, script, "sleep"], keep.env, str(keep.tmp_path), RankOutput("1"))
    wait_until(lambda: "up" in capsys.readouterr().out, 30, "worker up")
    assert parent(handle.pid) in keep.kept_pids()  # asked of this one, which lives until killed
    handle.signal(signal.SIGSTOP)
    wait_until(lambda: procstat.state(handle.pid) == "T", 10, "worker stopped")
    assert handle.poll() is None
    handle.signal(signal.SIGCONT)
    os.kill(handle.pid, signal.SIGKILL)
    assert handle.wait(10) == -signal.SIGKILL
    assert len(said) == 1 and said[0].startswith("hvdlite: kept template"), said


def test_kept_template_exits_when_idle(keep):
    templates, _ = keep.templates(idle=1.0)
    handle = keep.spawn(templates, keep.script("ok.py", "pass\n"))
    assert handle.wait(30) == 0
    (pid,) = keep.kept_pids()
    templates.close()
    assert alive(pid)  # the job's end is not its end
    wait_until(lambda: not alive(pid), 15, "the kept template exited after 1 s idle")
    assert keep.sockets() == []


def test_changed_module_makes_the_next_job_fall_back_and_the_old_template_leave(keep):
    script = keep.script("ok.py", "pass\n")
    first, _ = keep.templates()
    assert first.spawn([sys.executable, script], keep.env, str(keep.tmp_path), RankOutput("0")).wait(30) == 0
    first.close()
    (old,) = keep.kept_pids()
    (keep.modules / "kwmod.py").write_text("VALUE = 2  # upgraded\n")
    second, said = keep.templates()
    handles = [keep.spawn(second, script, str(i)) for i in range(2)]
    assert [h.wait(60) for h in handles] == [0, 0]
    assert all(isinstance(h, TemplateWorker) for h in handles)
    assert [(t.kept, t.pid == old) for t in second.templates.values()] == [(False, False)]
    stale = [l for l in said if "not using a kept template" in l]
    assert stale == [f"hvdlite: not using a kept template (kept template {old} is out of date: "
                     f"{keep.modules / 'kwmod.py'} changed on disk)"], said
    assert not any("without a preloaded template" in l for l in said), said  # the job's own one served
    wait_until(lambda: not alive(old), 15, "the outdated kept template left")


@pytest.mark.parametrize("how", ["open", pytest.param("foreign", marks=pytest.mark.skipif(
    UID != 0, reason="making a directory another user owns needs root"))])
def test_unsafe_directory_is_refused_and_the_job_runs_without_it(keep, how):
    os.mkdir(keep.folder, 0o700)
    if how == "open":
        os.chmod(keep.folder, 0o755)
    else:
        os.chown(keep.folder, 4242, -1)
    templates, said = keep.templates()
    handle = keep.spawn(templates, keep.script("ok.py", "pass\n"))
    assert handle.wait(60) == 0
    problem = "is open to others (mode 755)" if how == "open" else f"belongs to uid 4242, not {UID}"
    assert said == [f"hvdlite: not using a kept template ({keep.folder} {problem})"]
    assert os.listdir(keep.folder) == []  # nothing bound or locked there


DRIVER = """
import functools, os, sys, time
from hvdlite.driver.output import RankOutput
from hvdlite.driver.launchers.kept import obtain
from hvdlite.driver.launchers.template import Templates
t = Templates(("kwmod",), keeper=functools.partial(obtain, idle=30.0))
for grace in ({}, {"HVDLITE_DRIVER_GRACE": "30"}):  # a plain job's worker, a --checkpoint-dir job's
    h = t.spawn([sys.executable, sys.argv[1]], {**os.environ, **grace}, os.getcwd(), RankOutput("0"))
    print(h.pid, flush=True)
time.sleep(300)
"""


def test_driver_kill_9_kills_its_workers_but_a_checkpoint_dir_jobs_and_the_template_serves_the_next_job(keep):
    """A dead driver's workers die with it, except a --checkpoint-dir job's: they train on for
    the job's next driver (failover.md), as plain workers do."""
    sleeper = keep.script("sleep.py", "import time\ntime.sleep(300)\n")
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, sleeper], stdout=subprocess.PIPE,
                              env=keep.env, cwd=str(keep.tmp_path), start_new_session=True, text=True)
    workers = []
    try:
        workers = [int(driver.stdout.readline()) for _ in range(2)]
        (pid,) = keep.kept_pids()
        assert [parent(w) for w in workers] == [pid, pid]
        driver.kill()
        driver.wait(10)
        wait_until(lambda: not alive(workers[0]), 10, "the dead driver's worker killed")
        assert alive(workers[1]) and alive(pid)  # both were the one hung-up client's
        templates, _ = keep.templates()
        handle = keep.spawn(templates, keep.script("waits.py", WAITS_FOR_GO))
        assert isinstance(handle, TemplateWorker) and parent(handle.pid) == pid
        (keep.tmp_path / "go").touch()
        assert handle.wait(30) == 0
    finally:
        for p in (driver.pid, *workers):
            try:
                os.killpg(p, signal.SIGKILL)
            except (TypeError, ProcessLookupError, PermissionError):
                pass
        driver.wait(10)
        driver.stdout.close()


def test_a_dead_kept_templates_socket_is_replaced(keep):
    script = keep.script("who.py", WHO)
    first, _ = keep.templates()
    assert keep.spawn(first, script).wait(30) == 0
    first.close()
    (old,) = keep.kept_pids()
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: not alive(old), 10, "the kept template killed")
    assert len(keep.sockets()) == 1  # left behind: nobody listens on it
    second, said = keep.templates()
    handle = keep.spawn(second, script)
    assert handle.wait(30) == 0
    new = [pid for pid in keep.kept_pids() if pid != old]
    assert len(new) == 1 and alive(new[0]) and len(keep.sockets()) == 1
    assert said == [l for l in said if l.startswith(f"hvdlite: kept template {new[0]} started")]


def test_drivers_starting_at_once_share_one_kept_template(keep):
    script = keep.script("waits.py", WAITS_FOR_GO)
    parents, codes = [], []

    def job():
        templates, _ = keep.templates()
        handle = keep.spawn(templates, script)
        parents.append(parent(handle.pid))
        codes.append(handle.wait(60))
    threads = [threading.Thread(target=job) for _ in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: len(parents) == 3, 60, "three workers spawned")
    (keep.tmp_path / "go").touch()
    for t in threads:
        t.join(120)
    assert codes == [0, 0, 0]
    assert set(parents) == set(keep.kept_pids()) and len(keep.kept_pids()) == 1
