"""Preloaded worker templates (issue 12): a worker forked by a template behaves like one
started plainly. Real template processes, real forks, real signals."""
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from hvdlite import procstat
from hvdlite.driver.launchers.start import fork_first_world
from hvdlite.driver.launchers.process import LocalWorker
from hvdlite.driver.launchers.template import Templates, TemplateWorker
from hvdlite.driver.output import RankOutput
from hvdlite.template.command import Refused, plan
from hvdlite.template.spawn import MARK, TEMPLATE_DIED
from jobs import (SCRIPTS, Job, _tree, check_training_continuous, discovery, job_env, run_job,
                  wait_progress, wait_until)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYGLOO_PYTHON = os.environ.get("HVDLITE_PYGLOO_PYTHON", os.path.join(ROOT, ".venv-pygloo", "bin", "python"))
needs_pygloo = pytest.mark.skipif(not os.path.exists(PYGLOO_PYTHON),
                                  reason=f"no pygloo venv at {PYGLOO_PYTHON}")
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
ELASTIC_JOB = [sys.executable, os.path.join(SCRIPTS, "elastic_job.py")]


def alive(pid):
    return procstat.state(pid) not in procstat.GONE


def parent(pid):
    return int(procstat.stat_fields(pid)[1])


def templates_under(pid):
    """The template processes (python -m hvdlite.template) among pid's descendants, not the
    workers forked from them (which keep their command line)."""
    found = []
    for child in _tree(pid)[1:]:
        try:
            with open(f"/proc/{child}/cmdline") as f:
                if f.read().replace("\0", " ").split()[1:3] == ["-m", "hvdlite.template"]:
                    found.append(child)
        except OSError:
            pass  # it has ended meanwhile
    return [p for p in found if parent(p) not in found]


def kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Spawner:
    """Spawns workers from `templates` in a test's folder; ends every worker it spawned."""

    def __init__(self, templates, said, tmp_path):
        self.templates, self.said, self.tmp_path = templates, said, tmp_path
        self.handles = []

    def script(self, name, text):
        path = self.tmp_path / name
        path.write_text(textwrap.dedent(text))
        return str(path)

    def spawn(self, command, env=None, cwd=None, label="0"):
        handle = self.templates.spawn(command, env or ENV, cwd or str(self.tmp_path), RankOutput(label))
        self.handles.append(handle)
        return handle

    def template_pids(self):
        return [t.pid for t in self.templates.templates.values()]

    def close(self):
        for handle in self.handles:
            kill_group(handle.pid)


@pytest.fixture(scope="module")
def shared_templates():
    """One set of templates (torch preloaded: ~5 s, more on a busy machine) for the module."""
    said = []
    templates = Templates(say=said.append)
    try:
        yield templates, said
    finally:
        templates.close(kill=True)


@pytest.fixture
def spawner(shared_templates, tmp_path):
    s = Spawner(*shared_templates, tmp_path)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def own_spawner(tmp_path):
    """Templates of the test's own, light to preload, for tests that kill them."""
    said = []
    s = Spawner(Templates(("json",), say=said.append), said, tmp_path)
    try:
        yield s
    finally:
        s.close()
        s.templates.close(kill=True)


def finished(handle, capsys, timeout=60):
    code = handle.wait(timeout)
    assert code is not None, "worker did not exit"
    handle.finish_output()
    return code, capsys.readouterr()


# ---- decisions, without processes -----------------------------------------------------

def test_plan_runs_scripts_and_modules_of_the_same_interpreter(tmp_path):
    env, cwd = dict(ENV), str(tmp_path)
    assert plan([sys.executable, "t.py", "a"], env, cwd, sys.executable, env) == \
        ("path", "t.py", ["a"], False)
    assert plan([sys.executable, "-u", "-m", "m", "b"], env, cwd, sys.executable, env) == \
        ("module", "m", ["b"], True)
    refusals = {
        ("/bin/sh", "-c", "x"): "not a python",
        (sys.executable, "-c", "x"): "interpreter option -c",
        (sys.executable,): "interactive",
        (sys.executable, "-m"): "-m without a module",
        (PYGLOO_PYTHON, "t.py"): "another interpreter",
    }
    for argv, reason in refusals.items():
        with pytest.raises(Refused, match=reason):
            plan(list(argv), env, cwd, sys.executable, env)
    with pytest.raises(Refused, match="startup variables differ from the template.s: PYTHONPATH$"):
        plan([sys.executable, "t.py"], {**env, "PYTHONPATH": "/elsewhere"}, cwd, sys.executable, env)
    with pytest.raises(Refused, match="no directory"):
        plan([sys.executable, "t.py"], env, str(tmp_path / "missing"), sys.executable, env)


def test_preload_flags():
    from hvdlite.cli import parse_settings
    from hvdlite.template import DEFAULT_PRELOAD
    default = parse_settings(["--min-np", "1", sys.executable, "-c", "pass"])
    assert (default.preload, default.preload_first) == (DEFAULT_PRELOAD, False)  # joins only
    chosen = parse_settings(["--preload", "torch, numpy,", "-np", "1", sys.executable, "-c", "pass"])
    assert (chosen.preload, chosen.preload_first) == (("torch", "numpy"), True)
    assert parse_settings(["--no-preload", "-np", "1", sys.executable, "-c", "pass"]).preload == ()


# ---- workers from a template ------------------------------------------------------------

def test_worker_looks_like_a_plain_launch(spawner, capsys):
    script = spawner.script("look.py", """
        import atexit, os, pickle, sys, torch
        print("argv", sys.argv[1:], "cwd", os.getcwd(), "path0", sys.path[0])
        print("env", os.environ.get("ONLY_HERE"), os.environ.get("FIRST_ONLY"))
        print("leader", os.getpgrp() == os.getpid() == os.getsid(0))
        print("fds", sorted(int(f) for f in os.listdir("/proc/self/fd")))
        print("stdin", repr(sys.stdin.read()))
        print("threads", len(os.listdir("/proc/self/task")))
        print("cmdline", open("/proc/self/cmdline").read().replace(chr(0), " ").strip())
        print("parent", os.getppid())  # read here: a test that reads /proc may come after the exit
        print("oops", file=sys.stderr)
        class Config: ...
        atexit.register(lambda: print("exit work pickles", type(pickle.loads(pickle.dumps(Config()))) is Config))
        sys.exit(3)
    """)
    workdir = spawner.tmp_path / "work"
    workdir.mkdir()
    first = spawner.spawn([sys.executable, script, "x"], {**ENV, "FIRST_ONLY": "1"})
    assert finished(first, capsys)[0] == 3
    handle = spawner.spawn([sys.executable, script, "a b", "c"], {**ENV, "ONLY_HERE": "yes"}, str(workdir))
    assert isinstance(handle, TemplateWorker)
    code, out = finished(handle, capsys)
    assert code == 3
    lines = out.out.splitlines()
    assert int(lines.pop(-2).split()[-1]) in spawner.template_pids()  # forked, not launched plainly
    assert lines[0] == f"[0]<stdout>:argv ['a b', 'c'] cwd {workdir} path0 {spawner.tmp_path}"
    assert lines[1:] == ["[0]<stdout>:env yes None", "[0]<stdout>:leader True",
                         "[0]<stdout>:fds [0, 1, 2, 3]",  # 3: the listing itself
                         "[0]<stdout>:stdin ''", "[0]<stdout>:threads 1",
                         f"[0]<stdout>:cmdline {sys.executable} {script} 'a b' c",  # what ps shows
                         "[0]<stdout>:exit work pickles True"]  # the script stays __main__ (a last checkpoint)
    assert out.err == "[0]<stderr>:oops\n"


def test_module_mode_and_uncaught_exception(spawner, capsys):
    spawner.script("mod_main.py", """
        import atexit, pickle, sys
        print("argv0", sys.argv[0].endswith("mod_main.py"), sys.argv[1:])
        class Config: ...
        atexit.register(lambda: print("exit work pickles", type(pickle.loads(pickle.dumps(Config()))) is Config))
        def fail():
            raise ValueError("bad input")
        fail()
    """)
    handle = spawner.spawn([sys.executable, "-m", "mod_main", "z"])
    code, out = finished(handle, capsys)
    assert code == 1
    assert out.out == "[0]<stdout>:argv0 True ['z']\n[0]<stdout>:exit work pickles True\n"
    err = out.err.splitlines()
    assert err[0] == "[0]<stderr>:Traceback (most recent call last):"
    assert "mod_main.py" in err[1]  # the user's code first, none of the template's frames
    assert err[-1] == "[0]<stderr>:ValueError: bad input"
    assert "hvdlite" not in out.err


def test_missing_script_exits_2_as_python_does(spawner, capsys):
    code, out = finished(spawner.spawn([sys.executable, "missing.py"]), capsys)
    assert code == 2
    assert "can't open file" in out.err and "missing.py" in out.err


def test_a_script_named_by_a_relative_path_runs_under_its_absolute_path_as_python_does(spawner, capsys):
    """Python 3.9+ gives a script named on its command line an absolute __file__ (the
    directory joined, not normalised; argv[0] as given): its tracebacks, a hung rank's stack and
    a script that changes directory before it opens files beside itself rely on it."""
    spawner.script("where.py", "import sys\nprint(__file__, sys.argv[0])\n")
    handle = spawner.spawn([sys.executable, "./where.py"])
    assert isinstance(handle, TemplateWorker), spawner.said
    code, out = finished(handle, capsys)
    named = os.path.join(str(spawner.tmp_path), "./where.py") if sys.version_info >= (3, 9) else "./where.py"
    assert code == 0 and out.out == f"[0]<stdout>:{named} ./where.py\n", out

def test_kill_9_and_sigstop(spawner, capsys):
    script = spawner.script("sleep.py", "import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    handle = spawner.spawn([sys.executable, script])
    wait_until(lambda: "up" in capsys.readouterr().out, 30, "worker up")
    handle.signal(signal.SIGSTOP)
    wait_until(lambda: procstat.state(handle.pid) == "T", 10, "worker stopped")
    assert handle.poll() is None and handle.wait(0.3) is None
    handle.signal(signal.SIGCONT)
    os.kill(handle.pid, signal.SIGKILL)
    assert handle.wait(10) == -signal.SIGKILL
    assert not handle.template_died  # its own death, not its template's


def test_proc_state_reads_past_a_command_name_that_looks_like_fields():
    # Every side that watches a process (template children, the vouch helper, Ray slots) reads
    # its state through procstat, which must not be fooled by ") Z " inside the name.
    child = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                              "open('/proc/self/comm', 'w').write('a) Z 1 (b')\n"
                              "print('named', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"named\n"
        assert procstat.state(child.pid) in ("R", "S") and not procstat.exiting(child.pid)  # running or asleep, never the name's "Z"
        os.kill(child.pid, signal.SIGSTOP)
        wait_until(lambda: procstat.state(child.pid) in procstat.STOPPED, 10, "child stopped")
        os.kill(child.pid, signal.SIGKILL)
        wait_until(lambda: procstat.state(child.pid) == "Z", 10, "child a zombie")
        assert procstat.exiting(child.pid)
    finally:
        child.kill()
        child.wait()
    assert procstat.state(child.pid) == "X" and procstat.stat_fields(child.pid) is None


def stand_in_template(tmp_path, then="time.sleep(60)"):
    """(socket path, process) of a stand-in for a template that takes one spawn request, says
    `took it` and never answers: it runs `then` (Python, `conn` its client) instead."""
    path = str(tmp_path / "socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    stand_in = subprocess.Popen([sys.executable, "-c", "import socket, sys, time\n"
                                 "listener = socket.socket(fileno=int(sys.argv[1]))\n"
                                 "conn, _ = listener.accept(); conn.recv(1 << 16)\n"
                                 f"print('took it', flush=True)\n{then}", str(listener.fileno())],
                                pass_fds=(listener.fileno(),), stdout=subprocess.PIPE)
    listener.close()
    return path, stand_in


def test_a_spawn_client_whose_template_dies_before_forking_says_so_on_stdout(tmp_path):
    # A template that took the request and died before forking (here: one that never answers,
    # killed -9). The driver must tell this from a host that is gone: the client's last line.
    path, stand_in = stand_in_template(tmp_path)
    client = subprocess.Popen([sys.executable, "-m", "hvdlite.template.spawn", "--socket", path, "--",
                               sys.executable, "-c", "print('worker ran')"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    try:
        assert stand_in.stdout.readline() == b"took it\n"
        stand_in.kill()
        out, err = client.communicate(timeout=30)
    finally:
        stand_in.kill()
        client.kill()
        stand_in.wait()
    assert client.returncode == -signal.SIGKILL
    assert out.decode().splitlines() == [TEMPLATE_DIED], (out, err)


def test_a_spawn_client_whose_template_never_answers_starts_the_worker_plainly_within_its_bound(tmp_path):
    # A hung template (here: one that takes the request and never answers). Without a bound
    # the client waited for ever, and the launch's start timeout failed the launch.
    path, stand_in = stand_in_template(tmp_path, "conn.settimeout(30)\n"
                                       "print('hung up' if conn.recv(1) == b'' else 'more', flush=True)\n"
                                       "time.sleep(60)")
    start = time.monotonic()
    client = subprocess.Popen([sys.executable, "-m", "hvdlite.template.spawn", "--socket", path,
                               "--answer-timeout", "1", "--", sys.executable, "-c", "print('worker ran')"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    try:
        out, err = client.communicate(timeout=30)
        assert stand_in.stdout.readline() == b"took it\n"
        assert stand_in.stdout.readline() == b"hung up\n"  # a template that wakes kills what it forks for it
    finally:
        stand_in.kill()
        client.kill()
        stand_in.wait()
    assert client.returncode == 0 and time.monotonic() - start < 20, (out, err)
    marker, ran = out.decode().splitlines()
    assert re.fullmatch(rf"{MARK} {client.pid}:\d+ plain the template did not answer within 1 s", marker), (out, err)
    assert ran == "worker ran"


def test_stop_ends_the_process_group_with_the_workers_children(spawner, capsys):
    script = spawner.script("tree.py", """
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stop() must fall back to KILL
        child = subprocess.Popen(["sleep", "300"])
        print("child", child.pid, flush=True)
        time.sleep(300)
    """)
    handle = spawner.spawn([sys.executable, script])
    seen = []
    wait_until(lambda: seen.append(capsys.readouterr().out) or "child" in "".join(seen), 30, "child up")
    grandchild = int("".join(seen).split("child ")[1].split()[0])
    assert alive(grandchild)
    start = time.monotonic()
    handle.stop(grace=0.5)
    assert handle.poll() == -signal.SIGKILL and time.monotonic() - start < 10
    wait_until(lambda: not alive(grandchild), 10, "the worker's child gone")


def test_children_get_their_own_random_state(spawner, capsys):
    script = spawner.script("rand.py", "import random, numpy\nprint(random.random(), numpy.random.rand())\n")
    handles = [spawner.spawn([sys.executable, script], label=str(i)) for i in range(2)]
    for handle in handles:
        assert handle.wait(60) == 0
        handle.finish_output()
    lines = sorted(capsys.readouterr().out.splitlines())
    assert [line[:12] for line in lines] == ["[0]<stdout>:", "[1]<stdout>:"]
    assert len(set(line[12:] for line in lines)) == 2
    assert all(isinstance(h, TemplateWorker) for h in handles)


def test_a_forked_workers_own_collectives_are_timed_under_its_jobs_timeout(tmp_path, capsys):
    """The boot sitecustomize patches c10d as torch loads: in a template, whose environment
    has no job address and (kept) another job's timeout, it timed nothing, and every forked
    worker's dist.* calls went unwatched for stragglers and hangs. Each fork decides again."""
    from hvdlite.driver.torchrunenv import BOOT
    said = []
    # Functional collectives keep their own reference to c10d's all_reduce as they load (in the
    # template, with torch._dynamo): timed there too.
    s = Spawner(Templates(("torch.distributed._functional_collectives",), say=said.append), said, tmp_path)
    try:
        script = s.script("c10d.py", """
            import torch.distributed as dist
            from torch.distributed import _functional_collectives as fc, distributed_c10d as c10d
            timed = [f.__code__.co_name == "timed_collective" for f in (dist.all_reduce, c10d.all_reduce,
                                                                         fc.legacy_allreduce)]
            print(*timed, c10d.default_pg_timeout.total_seconds())
        """)
        env = {**ENV, "PYTHONPATH": os.pathsep.join([BOOT, os.environ.get("PYTHONPATH", "")]),
               "HVDLITE_RENDEZVOUS_ADDR": "127.0.0.1"}
        for timeout in ("7", "9"):  # two jobs' workers from one template
            handle = s.spawn([sys.executable, script], {**env, "HVDLITE_COLLECTIVE_TIMEOUT": timeout})
            assert isinstance(handle, TemplateWorker)
            code, out = finished(handle, capsys)
            assert code == 0 and out.out.split(":", 1)[1] == f"True True True {timeout}.0\n", out
    finally:
        s.close()
        s.templates.close(kill=True)


def test_a_forked_worker_runs_on_its_own_thread_count(spawner, capsys):
    """OpenMP reads OMP_NUM_THREADS as torch loads, in the template: a worker forked from one
    started without it ran on every core where its job gave it one thread (hvdlite does for
    several workers on a host, as torchrun does), and its numbers were not torchrun's."""
    from hvdlite.driver.torchrunenv import BOOT
    script = spawner.script("threads.py", "import os, torch\nprint(torch.get_num_threads())\n")
    env = {**ENV, "PYTHONPATH": os.pathsep.join([BOOT, os.environ.get("PYTHONPATH", "")])}
    before = set(spawner.template_pids())
    for threads in ("1", "2"):  # from one template: a host's count changes as workers join
        handle = spawner.spawn([sys.executable, script], {**env, "OMP_NUM_THREADS": threads})
        assert isinstance(handle, TemplateWorker), spawner.said  # (torch's own settings refused none)
        code, out = finished(handle, capsys)
        assert code == 0 and out.out == f"[0]<stdout>:{threads}\n", out
    assert len(set(spawner.template_pids()) - before) <= 1


OPENBLAS_THREADS = """
import ctypes, glob, os, numpy
found = glob.glob(os.path.join(os.path.dirname(numpy.__file__), os.pardir, "numpy.libs", "lib*openblas*"))
lib = ctypes.CDLL(found[0]) if found else None
names = ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads")
print(next((getattr(lib, n)() for n in names if lib is not None and hasattr(lib, n)), "unknown"))
"""


def test_a_forked_worker_runs_numpy_on_its_own_openblas_thread_count(tmp_path, capsys):
    """numpy's OpenBLAS reads OPENBLAS_NUM_THREADS as numpy loads (every template preloads
    it): a worker forked from a template started without it, or with another count, ran its
    numpy on the template's threads, not its own (a plain one runs on its own)."""
    said = []
    s = Spawner(Templates(("numpy",), say=said.append), said, tmp_path)
    try:
        script = s.script("openblas.py", OPENBLAS_THREADS)
        for threads in ("2", "1"):  # with more than one core, the first template's count is not 1
            handle = s.spawn([sys.executable, script], {**ENV, "OPENBLAS_NUM_THREADS": threads})
            assert isinstance(handle, TemplateWorker), said
            code, out = finished(handle, capsys)
            assert code == 0, out.err
            if out.out == "[0]<stdout>:unknown\n":
                pytest.skip("this numpy has no OpenBLAS of its own to ask")
        assert out.out == "[0]<stdout>:1\n", out
    finally:
        s.close()
        s.templates.close(kill=True)

def test_a_forked_worker_runs_on_its_own_torch_settings_read_as_torch_loads(tmp_path, capsys):
    """torch reads hundreds of its settings from the environment as it loads (TORCH_*,
    TORCHDYNAMO_*, TORCHINDUCTOR_*, PYTORCH_*: torch._dynamo.config's TORCH_COMPILE_DISABLE
    among them), in the template: a job with TORCH_COMPILE_DISABLE=1 forked from a kept
    template started without it compiled. compiled.py reads it at import as torch does, and
    sets a default of its own as torch._dynamo does (TORCHINDUCTOR_CACHE_DIR): no worker's."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "compiled.py").write_text("import os\nDISABLE = os.environ.get('TORCH_COMPILE_DISABLE', '0')\n"
                                         "os.environ.setdefault('TORCHINDUCTOR_CACHE_DIR', '/tmp/cache')\n")
    said = []
    s = Spawner(Templates(("compiled",), say=said.append), said, tmp_path)
    try:
        script = s.script("disabled.py", "import compiled\nprint(compiled.DISABLE)\n")
        env = {**ENV, "PYTHONPATH": os.pathsep.join([str(modules), ENV.get("PYTHONPATH", "")])}
        for disable in ("0", "1"):
            handle = s.spawn([sys.executable, script], {**env, "TORCH_COMPILE_DISABLE": disable})
            assert isinstance(handle, TemplateWorker), said
            code, out = finished(handle, capsys)
            assert code == 0 and out.out == f"[0]<stdout>:{disable}\n", out
    finally:
        s.close()
        s.templates.close(kill=True)

def test_a_hung_workers_stack_starts_at_the_users_code_as_a_plain_workers_does(spawner, capsys):
    """The stack the driver prints for a hung rank (session.main_stack, read from another
    thread): none of the template's frames, which pushed the hung frame out of view."""
    script = spawner.script("stacked.py", """
        import threading
        from hvdlite.worker.session import main_stack
        def hang():
            seen = []
            reader = threading.Thread(target=lambda: seen.append(main_stack()))
            reader.start()
            reader.join()
            print(seen[0].replace("\\n", "|"))
        hang()
    """)
    code, out = finished(spawner.spawn([sys.executable, script]), capsys)
    assert code == 0, out.err
    frames = out.out.split(":", 1)[1].split("|")
    assert "stacked.py" in frames[0] and "in <module>" in frames[0] and "in hang" in frames[2], frames
    assert "hvdlite/template" not in out.out and "runpy" not in out.out, out.out


def test_a_workers_garbage_collections_walk_none_of_what_its_template_preloaded(spawner, capsys):
    """A full collection walks every object the collector tracks, holding the GIL: in a worker
    that walked torch, dynamo and the rest the template preloaded, Trainer.train's gc.collect()
    silenced the heartbeat thread for 5 s under load, and the driver killed all three healthy
    workers of a job (tests/test_transformers.py in CI). The worker tracks only its own."""
    script = spawner.script("tracked.py", "import gc\nprint(len(gc.get_objects()))\n")
    code, out = finished(spawner.spawn([sys.executable, script]), capsys)
    assert code == 0, out.err
    tracked = int(out.out.split(":", 1)[1])
    import gc
    assert tracked < len(gc.get_objects()) / 10  # this process imported torch: it tracks more


def test_commands_a_template_cannot_run_start_plainly_said_once(spawner, capsys):
    for _ in range(2):
        handle = spawner.spawn(["/bin/sh", "-c", "echo plain; exit 4"])
        assert type(handle) is LocalWorker
        code, out = finished(handle, capsys)
        assert code == 4 and out.out == "[0]<stdout>:plain\n"
    assert len([line for line in spawner.said if "/bin/sh is not a python interpreter" in line]) == 1


@pytest.mark.parametrize("module, reason", [
    ("import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n",
     "preloading started Python threads"),
    ("raise RuntimeError('broken at import')\n", "preloading failed: RuntimeError: broken at import"),
    # it joins the world at import: a worker forked from a template that preloaded it never would
    ("import hvdlite.transformers\n", "ImportError: hvdlite.transformers joins the world when a worker imports it"),
    # a torch op at import starts torch's OpenMP pool, which does not stop for fork
    ("import torch\ntorch.set_num_threads(2)\ntorch.ones(1 << 22).add_(1)\n",
     "native threads that keep running across fork"),
])
def test_unusable_preload_falls_back_to_plain_launches_said_once(tmp_path, capsys, module, reason):
    (tmp_path / "badmod.py").write_text(module)
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    said = []
    templates = Templates(("badmod",), say=said.append)
    try:
        for _ in range(2):
            handle = templates.spawn([sys.executable, "-m", "json.tool", "--help"], env,
                                     str(tmp_path), RankOutput("0"))
            assert type(handle) is LocalWorker
            assert handle.wait(60) == 0
            handle.finish_output()
    finally:
        templates.close(kill=True)
    assert len(said) == 1 and reason in said[0], said


def test_template_death_kills_its_workers_and_the_next_spawn_restarts_it(own_spawner):
    spawner = own_spawner
    script = spawner.script("sleep.py", "import time\ntime.sleep(300)\n")
    handle = spawner.spawn([sys.executable, script])
    (template_pid,) = spawner.template_pids()
    os.kill(template_pid, signal.SIGKILL)
    assert handle.wait(15) == -signal.SIGKILL
    assert handle.template_died  # which the driver does not hold against the worker
    assert not alive(handle.pid)
    again = spawner.spawn([sys.executable, script])
    assert isinstance(again, TemplateWorker)
    assert spawner.template_pids() != [template_pid]
    again.stop(grace=1)
    assert again.poll() in (-signal.SIGTERM, -signal.SIGKILL)


DRIVER = """
import os, sys, time
from hvdlite.driver.output import RankOutput
from hvdlite.driver.launchers.template import Templates
t = Templates(("json",))
h = t.spawn([sys.executable, sys.argv[1]], dict(os.environ), os.getcwd(), RankOutput("0"))
print(h.pid, t.templates[next(iter(t.templates))].pid, flush=True)
time.sleep(300)
"""


def test_workers_outlive_a_killed_driver_as_plain_ones_do(tmp_path):
    """Driver death: the template forks no more but waits for its workers, which end on
    their own (hvdlite workers when they lose the driver), then exits."""
    marker = tmp_path / "done"
    worker = tmp_path / "worker.py"
    worker.write_text(f"import time\ntime.sleep(2)\nopen({str(marker)!r}, 'w').close()\n")
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(worker)], stdout=subprocess.PIPE,
                              env=ENV, start_new_session=True, text=True)
    pids = []
    try:
        pids = [int(p) for p in driver.stdout.readline().split()]
        assert len(pids) == 2, "driver did not start a worker"
        worker_pid, template_pid = pids
        driver.kill()
        driver.wait(10)
        assert alive(worker_pid) and alive(template_pid)
        wait_until(marker.exists, 30, "the worker finished after its driver died")
        wait_until(lambda: not alive(template_pid), 30, "template exited after its last worker")
    finally:
        for pid in [driver.pid, *pids]:
            kill_group(pid)
        driver.wait(10)
        driver.stdout.close()


@needs_pygloo
def test_numpy_backend_worker_comes_from_a_template_on_its_own_interpreter(spawner, capsys):
    script = spawner.script("np.py", """
        import os, sys, hvdlite.numpy
        with open(f"/proc/{os.getppid()}/cmdline") as f:  # its template's, read while both live
            parent = f.read().replace(chr(0), " ").split()[0]  # setproctitle joins argv
        print(sys.executable, sys.prefix, "torch" in sys.modules, parent)
    """)
    handle = spawner.spawn([PYGLOO_PYTHON, script])
    assert isinstance(handle, TemplateWorker)
    code, out = finished(handle, capsys)
    assert code == 0, out.err
    home = os.path.dirname(os.path.dirname(PYGLOO_PYTHON))
    assert out.out == f"[0]<stdout>:{PYGLOO_PYTHON} {home} False {PYGLOO_PYTHON}\n"


# ---- a whole job through the driver -------------------------------------------------------

# The template's words as ps shows them (setproctitle, set up there, joins its argv into one string).
PARENT = "import os\nprint('parent', open(f'/proc/{os.getppid()}/cmdline').read().replace(chr(0), ' ').split()[1:3])\n"


@pytest.mark.parametrize("python, check", [
    (sys.executable, "static_check.py"),
    pytest.param(PYGLOO_PYTHON, "numpy_check.py", marks=needs_pygloo),
])
def test_static_job_with_preloading(tmp_path, python, check):
    script = tmp_path / "check.py"
    script.write_text(PARENT + open(os.path.join(SCRIPTS, check)).read())
    r = run_job(["-np", "2", "--preload", "torch,numpy", python, str(script)], tmp_path)
    assert r.code == 0, r.stderr
    for k in range(2):
        assert f"[{k}]<stdout>:OK {k}" in r.stdout
        assert f"[{k}]<stdout>:parent ['-m', 'hvdlite.template']" in r.stdout
    assert "without a preloaded template" not in r.stderr


# A growing job's default starts (its first world plainly, its joiner forked from the template
# warmed meanwhile): test_elastic.py's first test, in the same job as its other checks.
@pytest.mark.parametrize("local_workers, cores, forked", [(1, 2, False), (3, 4, False), (2, 2, True), (7, 2, True)])
def test_first_world_forks_from_the_template_from_one_worker_per_core(local_workers, cores, forked):
    assert fork_first_world(local_workers, cores) is forked


CORES = len(os.sched_getaffinity(0))


@pytest.mark.plain_start("the job's own template, a child of its driver")
@pytest.mark.parametrize("slots", [1, CORES] if CORES > 1 else [CORES])
def test_when_workers_may_join_the_template_starts_with_the_job(tmp_path, slots):
    # Below one worker per core the first world starts plainly beside the template's imports;
    # from one per core on it forks from the template. Either way the template runs before
    # the first world forms, so an early join does not wait for its imports.
    schedule = [[0, [f"127.0.0.1:{slots}"]]]
    with Job([*discovery(tmp_path, schedule), "--min-np", "1", *ELASTIC_JOB], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=5, STEP_SLEEP=0.05)) as job:
        wait_until(lambda: templates_under(job.proc.pid), 30, "a template process under the driver")
        formed = [e for e in job.events() if e["event"] == "round_complete"]
        result = job.finish(120)
    assert result.code == 0, result.stderr
    if slots < CORES:
        assert not formed, "the template started only once the first world formed"
    assert {e["started"] for e in result.of("worker_start")} == {"template" if slots >= CORES else "process"}
    assert "without a preloaded template" not in result.stderr


def test_a_template_killed_9_costs_its_workers_a_relaunch_and_blacklists_nothing(tmp_path):
    # Every worker of this one-host job forks from the template (--preload), so kill -9 of it
    # kills them all. They did nothing wrong: they are relaunched (from a new template) and
    # resume from --checkpoint-dir; no slot is blacklisted, and the job finishes.
    flags = ["-H", "localhost:2", "--min-np", "1", "--preload", "torch", "--checkpoint-dir",
             str(tmp_path / "ckpt"), "--checkpoint-interval", "0", *ELASTIC_JOB]
    with Job(flags, tmp_path, env=job_env(tmp_path, TOTAL_STEPS=30, STEP_SLEEP=0.05)) as job:
        wait_progress(job, tmp_path, 8)
        (template,) = templates_under(job.proc.pid)
        os.kill(template, signal.SIGKILL)
        r = job.finish(180)
    assert r.code == 0, r.stderr
    assert not r.of("blacklisted")
    died = [e["slot"] for e in r.of("worker_exit") if e.get("cause") == "its template died"]
    assert sorted(died) == ["localhost/0", "localhost/1"]
    assert {"localhost/0#2", "localhost/1#2"} <= {e["worker"] for e in r.of("worker_start")}
    assert {e["started"] for e in r.of("worker_start")} == {"template"}
    check_training_continuous(tmp_path, 30)
