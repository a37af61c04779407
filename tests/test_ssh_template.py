"""Worker templates on SSH hosts (issue 12): a remote worker forked by its host's template
behaves like one started plainly. Real sshd hosts in namespaces (tests/sshhosts.py), real
templates, real signals."""
import os
import signal
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from hvdlite.driver.launchers.ssh import SSHHost, SSHSettings, launch
from hvdlite.driver.launchers.ssh.launcher import SSHLauncher
from hvdlite.driver.launchers.ssh.template import RemoteTemplates
from hvdlite.driver.launchers.template import SayOnce
from hvdlite.driver.output import RankOutput
from jobs import (SCRIPTS, Job, check_training_continuous, discovery, job_env, next_world,
                  skip_without_partitions, ssh_flags, wait_progress, wait_until)

PY = sys.executable
JOB = [PY, os.path.join(SCRIPTS, "elastic_job.py")]
ENV = {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}  # PYTHONPATH: this checkout


@pytest.fixture(scope="module")
def hosts(ssh_hosts):
    return ssh_hosts(2)


def procs(hosts, name, word):
    return [p for p in hosts.processes(name) if word in p[2]]


def parent(hosts, name, pid):
    return int(hosts.run(name, ["ps", "-o", "ppid=", "-p", str(pid)]).stdout)


class Remote:
    """A template on host-1 (json preloaded: quick) and the workers launched from it; ends
    every process of the test on the host, even when it fails."""

    def __init__(self, hosts, tmp_path, preload=("json",), env=None):
        self.hosts, self.tmp_path = hosts, tmp_path
        self.host = SSHHost("host-1", SSHSettings(ssh_config=hosts.ssh_config, connect_timeout=5))
        self.said = []
        self.env = dict(ENV if env is None else env)
        self.templates = RemoteTemplates(preload, SayOnce(self.said.append))
        self.workers = []

    def script(self, name, text):
        path = self.tmp_path / name
        path.write_text(textwrap.dedent(text))
        return str(path)

    def ready(self, timeout=60):
        """The template's socket, once it answered."""
        args = (self.host, [PY, "x.py"], self.env, str(self.tmp_path))
        self.templates.socket(*args, start=True)
        wait_until(lambda: self.templates.socket(*args, start=False) or self.said, timeout, "template ready")
        assert not self.said, self.said
        return self.templates.socket(*args, start=False)

    def launch(self, command, template, env=None, label="0"):
        worker = launch(self.host, command, {**self.env, **(env or {})}, str(self.tmp_path),
                        RankOutput(label), template=template)
        self.workers.append(worker)
        return worker

    def close(self):
        for worker in self.workers:
            worker.stop(grace=0.2)
        self.templates.close()
        for pid, _, _ in procs(self.hosts, "host-1", "hvdlite.template"):
            self.hosts.run("host-1", ["kill", "-9", str(pid)])
        self.host.close()


@pytest.fixture
def remote(hosts, tmp_path):
    r = Remote(hosts, tmp_path)
    try:
        yield r
    finally:
        r.close()


def output(worker, capsys):
    worker.finish_output()
    return capsys.readouterr()


# ---- one host's template, through the launcher ------------------------------------------

def test_remote_worker_forks_from_the_template_and_looks_plain(hosts, remote, capsys):
    socket_path = remote.ready()
    (template,) = [p for p in procs(hosts, "host-1", "hvdlite.template --preload")]
    secret = "s3cret-" + os.urandom(8).hex()
    script = remote.script("look.py", """
        import os, socket, sys
        print("host", socket.gethostname(), "cwd", os.getcwd(), "argv", sys.argv[1:])
        print("env", os.environ.get("HVDLITE_SECRET"), os.environ.get("ONLY_HERE"))
        print("leader", os.getpgrp() == os.getpid() == os.getsid(0))
        print("stdin", repr(sys.stdin.read()), "json" in sys.modules)
        print("oops", file=sys.stderr)
        sys.stdout.flush()
        __import__("time").sleep(2)  # while the test looks at the host's command lines
        sys.exit(3)
    """)
    worker = remote.launch([PY, script, "a b"], socket_path,
                           env={"HVDLITE_SECRET": secret, "ONLY_HERE": "yes"}, label="5")
    assert worker.started == "template" and worker.fallback is None
    assert parent(hosts, "host-1", worker.pid) == template[0]  # forked, not launched plainly
    ps = hosts.run("host-1", ["ps", "-ww", "-eo", "pid,args"]).stdout
    assert "hvdlite.template.spawn" in ps and secret not in ps  # never on a command line
    assert worker.wait(20) == 3
    out = output(worker, capsys)
    assert out.out.splitlines() == [
        f"[5]<stdout>:host host-1 cwd {remote.tmp_path} argv ['a b']",
        f"[5]<stdout>:env {secret} yes", "[5]<stdout>:leader True", "[5]<stdout>:stdin '' True"]
    assert out.err == "[5]<stderr>:oops\n"


def test_kill_9_stop_and_sigstop_reach_the_forked_worker(hosts, remote, capsys):
    socket_path = remote.ready()
    script = remote.script("sleep.py", "import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    killed = remote.launch([PY, script], socket_path, label="0")
    stopped = remote.launch([PY, script], socket_path, label="1")
    assert killed.started == stopped.started == "template"
    hosts.run("host-1", ["kill", "-9", str(killed.pid)])
    assert killed.wait(10) == -signal.SIGKILL and not killed.template_died  # its own death: a failure
    stopped.signal(signal.SIGSTOP)
    wait_until(lambda: hosts.run("host-1", ["ps", "-o", "stat=", "-p", str(stopped.pid)]).stdout.startswith("T"),
               10, "worker stopped")
    assert stopped.wait(0.3) is None
    stopped.signal(signal.SIGCONT)
    stopped.stop(grace=1.0)
    assert stopped.poll() == -signal.SIGTERM
    wait_until(lambda: not procs(hosts, "host-1", "hvdlite.template.spawn"), 10, "spawn clients gone")


def test_a_dead_spawn_client_takes_its_worker_along(hosts, remote, capsys):
    socket_path = remote.ready()
    script = remote.script("sleep.py", "import time\ntime.sleep(300)\n")
    worker = remote.launch([PY, script], socket_path)
    (client,) = procs(hosts, "host-1", "hvdlite.template.spawn")
    hosts.run("host-1", ["kill", "-9", str(client[0])])
    assert worker.wait(10) == -signal.SIGKILL  # the client's death, as sshd reports it
    wait_until(lambda: not hosts.run("host-1", ["ps", "-p", str(worker.pid)]).stdout.count("\n") > 1,
               10, "the forked worker killed by its template")


def test_a_killed_templates_worker_is_known_to_have_died_of_it(hosts, remote, capsys):
    socket_path = remote.ready()
    script = remote.script("sleep.py", "import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    worker = remote.launch([PY, script], socket_path)
    # (its parent, not a look at command lines: a worker just forked still has the template's)
    template = parent(hosts, "host-1", worker.pid)
    hosts.run("host-1", ["kill", "-9", str(template)])
    assert worker.wait(10) == -signal.SIGKILL and worker.template_died
    assert output(worker, capsys).out == "[0]<stdout>:up\n"  # the spawn client's last line is no output


def test_without_a_template_the_spawn_client_launches_plainly(hosts, remote, capsys):
    script = remote.script("plain.py", "import os, sys\nprint('pid', os.getpid())\nsys.exit(4)\n")
    worker = remote.launch([PY, script], "/nonexistent/socket")
    assert worker.started == "ssh" and "no template at /nonexistent/socket" in worker.fallback
    assert worker.wait(20) == 4
    assert output(worker, capsys).out == f"[0]<stdout>:pid {worker.pid}\n"
    refused = remote.launch([PY, "-c", "print('c'); exit(6)"], remote.ready())  # python -c: not forkable
    assert refused.started == "ssh" and "the template refused: interpreter option -c" in refused.fallback
    assert refused.wait(20) == 6
    assert output(refused, capsys).out == "[0]<stdout>:c\n"


def test_the_template_outlives_its_lifeline_until_its_last_worker(hosts, remote, capsys):
    socket_path = remote.ready()
    done = remote.tmp_path / "done"
    script = remote.script("late.py", f"import time\ntime.sleep(2)\nopen({str(done)!r}, 'w').close()\n")
    worker = remote.launch([PY, script], socket_path)
    remote.templates.close()  # the driver's channel ends: no more forks, but the worker runs on
    assert worker.wait(30) == 0 and done.exists()
    wait_until(lambda: not procs(hosts, "host-1", "hvdlite.template"), 15, "template gone")
    assert not os.path.exists(os.path.dirname(socket_path))  # its socket folder removed


def test_a_cut_off_template_exits_once_its_heartbeat_stops(hosts, remote):
    skip_without_partitions(hosts)
    remote.ready()
    assert procs(hosts, "host-1", "hvdlite.template --preload")
    hosts.partition("host-1")
    try:
        start = time.monotonic()
        wait_until(lambda: not procs(hosts, "host-1", "hvdlite.template"), 30, "template gone")
        assert time.monotonic() - start > 5  # the heartbeat's silence, not the partition itself
    finally:
        hosts.heal("host-1")


def test_a_preload_that_fails_is_given_up_said_once(hosts, tmp_path):
    (tmp_path / "badmod.py").write_text("raise RuntimeError('broken at import')\n")
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path), ENV.get("PYTHONPATH", "")])}
    r = Remote(hosts, tmp_path, preload=("badmod",), env=env)
    try:
        args = (r.host, [PY, "x.py"], r.env, str(tmp_path))
        assert r.templates.socket(*args, start=True) is None
        wait_until(lambda: r.said, 60, "the failure said")
        for _ in range(2):
            assert r.templates.socket(*args, start=True) is None
        r.templates.warm()
        time.sleep(1)
        assert r.said == ["hvdlite: starting workers on host-1 without a preloaded template "
                          "(preloading failed: RuntimeError: broken at import)"]
    finally:
        r.close()


# ---- whole jobs ---------------------------------------------------------------------------

def events_of(job, kind):
    return [e for e in job.events() if e["event"] == kind]


def test_job_remote_join_forks_and_a_killed_forked_worker_is_seen_dead(tmp_path, hosts):
    # host-1 gets a second slot after the first world formed (its template warmed meanwhile):
    # that worker forks; kill -9 of it is a SIGKILL death and the world re-forms.
    schedule = [[0, ["host-1:1", "host-2:1"]], [6, ["host-1:2", "host-2:1"]]]
    with Job([*ssh_flags(hosts), *discovery(tmp_path, schedule), "--min-np", "1", "--preload", "json",
              *JOB], tmp_path, env=job_env(tmp_path, TOTAL_STEPS=100000, STEP_SLEEP=0.1)) as job:
        job.wait_for(lambda events: any(e["event"] == "worker_start" and e["slot"] == "host-1/1"
                                        for e in events), 90)
        wait_progress(job, tmp_path, 5)
        (joined,) = [e for e in events_of(job, "worker_start") if e["slot"] == "host-1/1"]
        assert joined["started"] == "template"
        job.wait_for(lambda events: any(e["event"] == "round_complete" and e["size"] == 3
                                        for e in events), 60)
        seconds, world = next_world(job, lambda: hosts.run("host-1", ["kill", "-9", str(joined["pid"])]))
        (death,) = [e for e in events_of(job, "worker_exit") if e["worker"] == joined["worker"]]
        assert death["code"] == -signal.SIGKILL
        assert world["size"] < 3  # re-formed without it (its host is blacklisted, as Horovod does)
        firsts = [e["started"] for e in events_of(job, "worker_start") if e["slot"] != "host-1/1"]
        assert firsts == ["ssh", "ssh"]  # the first world's workers started plainly
        assert "without a preloaded template" not in job.read(job.err)
        # the driver's death: templates, spawn clients and workers leave both hosts
        job.proc.send_signal(signal.SIGKILL)
        job.proc.wait(10)
        wait_until(lambda: not any(procs(hosts, n, "hvdlite.template") or procs(hosts, n, "elastic_job.py")
                                   for n in ("host-1", "host-2")), 30, "remote processes gone")


def test_job_whose_remote_template_is_killed_9_relaunches_its_workers_and_blacklists_nothing(tmp_path, hosts):
    # host-1's two later slots fork from its template; kill -9 of the template kills them
    # (parent-death signal). They did nothing wrong: relaunched, nothing blacklisted, and the
    # job finishes with every step applied once (the survivors hold the state). The workers
    # wait at step 2 for the world of four, at step 3 for the kill, and at step 5 for the
    # relaunched two to join again: however slow a join, the job cannot end first.
    schedule = [[0, ["host-1:1", "host-2:1"]], [1, ["host-1:3", "host-2:1"]]]
    total = 8
    with Job([*ssh_flags(hosts), *discovery(tmp_path, schedule), "--min-np", "1", "--preload", "json", *JOB],
             tmp_path, env=job_env(tmp_path, TOTAL_STEPS=total, STEP_SLEEP=0.1, RESIZE="2:4,5:4", HOLD_AT=3)) as job:
        job.wait_for(lambda events: any(e["event"] == "round_complete" and e["size"] == 4 for e in events), 240)
        forked = sorted(e["slot"] for e in events_of(job, "worker_start") if e["started"] == "template")
        assert forked == ["host-1/1", "host-1/2"]
        (template,) = [pid for pid, _, args in hosts.processes("host-1")
                       if args.split()[1:3] == ["-m", "hvdlite.template"]]
        hosts.run("host-1", ["kill", "-9", str(template)])
        (tmp_path / "go").touch()
        r = job.finish(180)
    assert r.code == 0, r.stderr
    assert not r.of("blacklisted"), r.of("blacklisted")
    died = sorted(e["slot"] for e in r.of("worker_exit") if e.get("cause") == "its template died")
    assert died == ["host-1/1", "host-1/2"], r.of("worker_exit")
    assert {"host-1/1#2", "host-1/2#2"} <= {e["worker"] for e in r.of("worker_start")}
    assert "template-died" not in r.stdout + r.stderr  # the spawn client's word is not output
    assert "without a preloaded template" not in r.stderr  # the relaunches never tried its dead socket
    check_training_continuous(tmp_path, total)


def wchan(hosts, name, pid):
    """What the host's process waits in ("poll_schedule_timeout" for select, ...)."""
    return hosts.run(name, ["cat", f"/proc/{pid}/wchan"]).stdout


def test_job_whose_remote_template_dies_before_forking_a_joiner_relaunches_it_and_blacklists_nothing(
        tmp_path, hosts):
    # host-1's template is stopped (SIGSTOP), so the spawn client of host-1's new slot hands it
    # the request and waits; then the template is killed -9: it died before forking. The host
    # answered and the worker did nothing: relaunched, nothing blacklisted, every step once.
    # The workers wait at step 25 for the relaunched worker's world of three.
    schedule = [[0, ["host-1:1", "host-2:1"]], [20, ["host-1:2", "host-2:1"]]]
    total, stopped = 30, None
    with Job([*ssh_flags(hosts), *discovery(tmp_path, schedule), "--min-np", "1", "--preload", "json", *JOB],
             tmp_path, env=job_env(tmp_path, TOTAL_STEPS=total, STEP_SLEEP=0.1, HOLD_AT=10,
                                   RESIZE="25:3")) as job:
        try:
            wait_progress(job, tmp_path, 10, 120)
            # the template warmed once the first world formed, and serves (waits in its select)
            wait_until(lambda: [pid for pid, _, args in hosts.processes("host-1")
                                if args.split()[1:3] == ["-m", "hvdlite.template"]
                                and "poll_schedule_timeout" in wchan(hosts, "host-1", pid)], 60, "host-1's template ready")
            (template,) = [pid for pid, _, args in hosts.processes("host-1")
                           if args.split()[1:3] == ["-m", "hvdlite.template"]]
            time.sleep(1.0)  # its `ready` reaches the driver
            hosts.run("host-1", ["kill", "-STOP", str(template)])
            stopped = template
            (tmp_path / "go").touch()
            # The client waits for the answer in a poll bounded at 5 s: kill -9 well within it.
            wait_until(lambda: [pid for pid, _, _ in procs(hosts, "host-1", "hvdlite.template.spawn")
                                if "poll_schedule_timeout" in wchan(hosts, "host-1", pid)], 60, "spawn client sent")
            hosts.run("host-1", ["kill", "-9", str(template)])
            stopped = None
            r = job.finish(180)
        finally:
            if stopped is not None:  # a stopped template would never exit by itself
                hosts.run("host-1", ["kill", "-9", str(stopped)])
    assert r.code == 0, r.stderr
    assert not r.of("blacklisted"), r.of("blacklisted")
    (died,) = [e for e in r.of("worker_exit") if e.get("cause", "").startswith("its template died")]
    assert died["worker"] == "host-1/1#1" and died["cause"] == "its template died before forking it", died
    assert not r.of("launch_failed"), r.of("launch_failed")
    assert "host-1/1#2" in {e["worker"] for e in r.of("worker_start")}
    assert any(e["size"] == 3 for e in r.of("round_complete")), r.of("round_complete")
    assert "template-died" not in r.stdout + r.stderr  # the spawn client's word is not output
    check_training_continuous(tmp_path, total)


def ssh_launcher(hosts, command, said):
    """A job's SSH launcher of `command` with --preload json, saying into `said`."""
    settings = SimpleNamespace(command=command, ssh_port=None, ssh_identity_file=None,
                               ssh_accept_unknown_hosts=False, ssh_config=hosts.ssh_config,
                               preload=("json",), preload_first=False, keep_warm=None, joins_possible=True)
    return SSHLauncher(settings, SayOnce(said.append))


def templates_on(hosts, name):
    return [pid for pid, _, args in hosts.processes(name) if args.split()[1:3] == ["-m", "hvdlite.template"]]


@pytest.fixture
def host_1_launcher(hosts, tmp_path):
    """(launcher of a script that prints `up` and sleeps, what it said, its workers) with
    host-1's template ready; every process of the test ends on the host, even on failure."""
    script = tmp_path / "up.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    said, workers = [], []
    launcher = ssh_launcher(hosts, [PY, str(script)], said)
    try:
        workers.append(launcher.start("host-1", ENV, RankOutput("0"), joining=True))  # plain; starts the template
        wait_until(lambda: launcher._templates.templates["host-1"].socket, 60, "host-1's template ready")
        wait_until(lambda: len(templates_on(hosts, "host-1")) == 1, 30, "only this launcher's template")
        yield launcher, said, workers
    finally:
        for worker in workers:
            worker.stop(grace=0.2)
        launcher.close()
        # One still starting (a shell yet) exits by itself: its lifeline is closed.
        for pid in templates_on(hosts, "host-1"):
            hosts.run("host-1", ["kill", "-9", str(pid)])
        wait_until(lambda: not templates_on(hosts, "host-1"), 30, "host-1's templates gone")


def test_a_remote_template_that_hangs_costs_a_launch_its_bound_then_it_starts_plainly(hosts, host_1_launcher):
    # A stopped template answers nobody. Without a bound the spawn client waited until the
    # launch's start timeout failed the launch, and the host was blacklisted.
    launcher, said, workers = host_1_launcher
    (template,) = templates_on(hosts, "host-1")
    hosts.run("host-1", ["kill", "-STOP", str(template)])
    workers.append(launcher.start("host-1", ENV, RankOutput("1"), joining=True))
    hung = "the template did not answer within 5 s"  # half the launch's 10 s start timeout
    assert workers[-1].started == "ssh" and workers[-1].fallback == hung
    assert workers[-1].wait(0.5) is None  # it runs
    assert said == [f"hvdlite: starting workers on host-1 without a preloaded template ({hung})"]
    # Forgotten: the next launch does not wait for it again, it starts plainly at once
    # while a new template starts.
    start = time.monotonic()
    workers.append(launcher.start("host-1", ENV, RankOutput("2"), joining=True))
    assert workers[-1].fallback is None and time.monotonic() - start < 5
    wait_until(lambda: len(templates_on(hosts, "host-1")) == 2, 30, "a new template beside the stopped one")


def test_a_dead_remote_templates_socket_is_forgotten_at_once(hosts, host_1_launcher):
    # Before, the next launch tried the dead template's socket for up to a second (the
    # heartbeat's poll), "Connection refused" was said and the worker started plainly anyway.
    launcher, said, workers = host_1_launcher
    workers.append(launcher.start("host-1", ENV, RankOutput("1"), joining=True))
    assert workers[-1].started == "template"
    # The forked worker shows the template's command line until it has renamed itself.
    wait_until(lambda: len(templates_on(hosts, "host-1")) == 1, 30, "the forked worker renamed")
    (template,) = templates_on(hosts, "host-1")
    hosts.run("host-1", ["kill", "-9", str(template)])
    assert workers[-1].wait(10) == -signal.SIGKILL and workers[-1].template_died
    workers.append(launcher.start("host-1", ENV, RankOutput("2"), joining=True))
    assert workers[-1].started == "ssh" and workers[-1].fallback is None and not said, said


def test_job_whose_remote_template_cannot_preload_runs_plainly_said_once(tmp_path, hosts):
    (tmp_path / "badmod.py").write_text("raise RuntimeError('broken at import')\n")
    env = job_env(tmp_path, TOTAL_STEPS=40, STEP_SLEEP=0.1)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    with Job([*ssh_flags(hosts), "-H", "host-1:1,host-2:1", "--min-np", "1", "--preload", "badmod", *JOB],
             tmp_path, env=env) as job:
        r = job.finish(120)
    assert r.code == 0, r.stderr
    for name in ("host-1", "host-2"):
        said = [line for line in r.stderr.splitlines()
                if line.startswith(f"hvdlite: starting workers on {name} without a preloaded template")]
        assert said == [f"hvdlite: starting workers on {name} without a preloaded template "
                        "(preloading failed: RuntimeError: broken at import)"], r.stderr
    assert [e["started"] for e in r.of("worker_start")] == ["ssh", "ssh"]
