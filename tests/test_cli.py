"""Bad input ends with one line on stderr and exit code 2, never a traceback."""
import os
import subprocess
import sys

import pytest

from hvdlite.cli import parse_settings
from hvdlite.errors import UsageError


def hvdlite(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "hvdlite.cli", *args], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args, message", [
    (["run", "--bogus", "python", "x.py"], "unrecognized"),
    (["run", "-np", "-2", "true"], "must be positive"),
    (["run", "-np", "two", "true"], "expected a number"),
    (["run", "-np", "3", "-H", "a:1,b:1", "true"], "more processes than the 2 slots"),
    (["run", "-np", "2"], "no training command"),
    (["run", "-np", "2", "python", "/nonexistent/train.py"], "training script not found"),
    (["run", "-np", "2", "/nonexistent/prog"], "not found"),
    (["run", "-H", "a:0", "true"], "positive integer"),
    (["run", "--hostfile", "/nonexistent/hosts", "true"], "hostfile"),
    (["run", "--min-np", "4", "--max-np", "2", "true"], "larger than --max-np"),
    (["run", "-np", "5", "--max-np", "2", "true"], "larger than --max-np"),
    (["run", "-np", "3", "--max-np", "2", "--min-np", "1", "true"], "-np 3 is larger than --max-np 2"),
    (["run", "-np", "1", "--min-np", "2", "-H", "localhost:4", "true"], "-np 1 is smaller than --min-np 2"),
    (["run", "--reset-limit", "-1", "--min-np", "1", "true"], "non-negative"),
    (["run", "--blacklist-cooldown-range", "5", "1", "--min-np", "1", "true"], "MIN is larger"),
    (["run", "--host-discovery-script", "x.sh", "-H", "a:1", "true"], "not both"),
    (["frobnicate"], "unknown command"),
    (["run", "--min-np", "1", "--liveness-timeout", "nan", "true"], "must be a finite number"),
    (["run", "--min-np", "1", "--start-timeout", "inf", "true"], "must be a finite number"),
    (["run", "-np", "1", "--gloo-timeout-seconds=-inf", "true"], "must be a finite number"),
    (["run", "-np", "1", "/nonexistent/train.py"], "training script not found"),
    (["run", "-np", "1", "missing.py"], "training script not found: missing.py"),
    (["run", "--blacklist", "rack", "--min-np", "1", "true"], "invalid choice"),
    (["run", "-np", "1", "--checkpoint-interval", "-1", "true"], "must be non-negative"),
    (["run", "-np", "1", "--checkpoint-keep", "0", "true"], "must be positive"),
    (["run", "-np", "1", "--checkpoint-dir", "/proc/hvdlite-ckpt", "true"], "--checkpoint-dir: cannot create"),
    (["run", "-np", "1", "--fresh", "true"], "--fresh starts anew instead of resuming from --checkpoint-dir"),
])
def test_bad_flags(args, message):
    r = hvdlite(*args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_not_executable(tmp_path):
    prog = tmp_path / "prog"
    prog.write_text("#!/bin/sh\n")
    r = hvdlite("run", "-np", "1", str(prog))
    assert r.returncode == 2 and "not executable" in r.stderr


def test_defaults():
    s = parse_settings(["-np", "3", "python", "-c", "pass"])
    assert s.hosts == [("localhost", 3)] and s.num_proc == 3 and not s.elastic
    e = parse_settings(["-np", "2", "--min-np", "1", "--max-np", "4", "python", "-c", "pass"])
    assert e.elastic and (e.min_np, e.max_np) == (1, 4)


def test_help_lists_the_commands_and_groups_the_flags():
    top = hvdlite("--help")
    assert top.returncode == 0 and "run " in top.stdout and "timeline " in top.stdout
    assert hvdlite().returncode == 2
    version = hvdlite("--version")
    assert version.returncode == 0 and version.stdout.startswith("hvdlite 0.")
    r = hvdlite("run", "--help")
    assert r.returncode == 0 and "--host-discovery-script" in r.stdout
    titles = [line[:-1] for line in r.stdout.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles == ["options", "hosts", "elastic", "remote hosts", "ray", "durable commits", "watching",
                      "start-up", "advanced", "examples", "exit codes (docs/signals.md#exit-codes)"]
    assert [line for line in r.stdout.splitlines() if line.strip().startswith("hvdlite run")]
    # Defaults are never cut inside a word (argparse wraps at spaces only).
    assert "torch, torch.optim," in " ".join(r.stdout.split())


def test_hostfile_lines_may_say_host_colon_slots(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost:2\nother slots=3\nthird\n")
    s = parse_settings(["--hostfile", str(hostfile), "python", "-c", "pass"])
    assert s.hosts == [("localhost", 2), ("other", 3), ("third", 1)] and s.num_proc == 6
    hostfile.write_text("localhost:two\n")
    r = hvdlite("run", "--hostfile", str(hostfile), "true")
    assert r.returncode == 2 and "slots for localhost must be a positive integer" in r.stderr


def test_import_numpy_backend_without_pygloo_says_what_to_do():
    probe = subprocess.run([sys.executable, "-c", "import pygloo"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("this Python has pygloo")
    r = subprocess.run([sys.executable, "-c", "import hvdlite.numpy"], capture_output=True, text=True,
                       timeout=60)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and last.startswith("ModuleNotFoundError: hvdlite.numpy needs pygloo")
    assert ("3.8-3.10 venv" if sys.version_info >= (3, 11) else "pip install pygloo") in last
    # In a job's worker (the driver sets HVDLITE_SLOT): that line alone, no traceback per worker.
    r = subprocess.run([sys.executable, "-c", "import hvdlite.numpy"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "HVDLITE_SLOT": "localhost/0"})
    assert r.returncode == 1 and r.stderr.strip() == last.split(": ", 1)[1]


def test_every_default_is_written_once():
    from hvdlite import defaults
    s = parse_settings(["--min-np", "1", "python", "-c", "pass"])
    assert (s.start_timeout, s.liveness_timeout, s.elastic_timeout, s.discovery_timeout,
            s.discovery_interval, s.collective_timeout, s.blacklist) == \
        (defaults.START_TIMEOUT, defaults.LIVENESS_TIMEOUT, defaults.ELASTIC_TIMEOUT,
         defaults.DISCOVERY_TIMEOUT, defaults.DISCOVERY_INTERVAL, defaults.COLLECTIVE_TIMEOUT,
         defaults.BLACKLIST)


def test_checkpoint_flags_reach_every_worker(tmp_path, monkeypatch):
    from hvdlite import defaults
    from hvdlite.driver.workerenv import worker_env
    from hvdlite.worker import durable
    monkeypatch.chdir(tmp_path)
    s = parse_settings(["-np", "1", "--checkpoint-dir", "ckpt/a", "python", "-c", "pass"])
    assert s.checkpoint_dir == str(tmp_path / "ckpt" / "a") and os.path.isdir(s.checkpoint_dir)
    assert (s.checkpoint_interval, s.checkpoint_keep) == (defaults.CHECKPOINT_INTERVAL, defaults.CHECKPOINT_KEEP)
    env = worker_env(s, ("127.0.0.1", 1), "secret", "localhost/0#1", "localhost/0", 1, None, False)
    assert durable.config(env) == durable.Config(s.checkpoint_dir, defaults.CHECKPOINT_INTERVAL,
                                                 defaults.CHECKPOINT_KEEP)
    assert durable.config(env).lineage is None  # resume the newest lineage in the folder
    fresh = parse_settings(["-np", "1", "--checkpoint-dir", "ckpt/a", "--fresh", "python", "-c", "pass"])
    env = worker_env(fresh, ("127.0.0.1", 1), "secret", "localhost/0#1", "localhost/0", 1, None, False)
    assert durable.config(env).lineage == fresh.checkpoint_lineage and len(fresh.checkpoint_lineage) == 20
    s.checkpoint_dir = None  # and nothing when not asked for, even from the driver's environment
    s.env = {**s.env, "HVDLITE_CHECKPOINT_DIR": "/elsewhere"}
    assert durable.config(worker_env(s, ("127.0.0.1", 1), "x", "w", "localhost/0", 1, None, False)) is None


def test_horovodrun_spellings_are_accepted():
    s = parse_settings(["--min-num-proc", "2", "--max-num-proc", "4", "--gloo-timeout-seconds", "7",
                        "--network-interfaces", "lo,eth0", "python", "-c", "pass"])
    assert (s.min_np, s.max_np, s.collective_timeout, s.network_interfaces) == (2, 4, 7.0, ["lo", "eth0"])


def test_a_py_file_runs_with_the_drivers_python_and_scripts_are_found_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("pass\n")
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:1\n")
    s = parse_settings(["--min-np", "1", "train.py", "--lr", "1"])
    assert s.command == [sys.executable, "train.py", "--lr", "1"]
    r = hvdlite("run", "--host-discovery-script", "discover.sh", "train.py")
    assert r.returncode == 2 and "chmod +x discover.sh" in r.stderr  # not executable yet
    script.chmod(0o755)
    s = parse_settings(["--host-discovery-script", "discover.sh --fast", "train.py"])
    assert s.discovery_script == f"{script} --fast"


def test_a_py_discovery_script_runs_with_the_drivers_python(tmp_path, monkeypatch):
    from hvdlite.discovery.script import discover
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("pass\n")
    (tmp_path / "discover.py").write_text("import sys\nprint('localhost:%d' % sys.version_info[0])\n")
    s = parse_settings(["--host-discovery-script", "discover.py --fast", "train.py"])
    assert s.discovery_script == f"{sys.executable} {tmp_path / 'discover.py'} --fast"
    assert discover(s.discovery_script, 10) == [("localhost", 3)]


def test_a_flag_is_never_taken_for_a_longer_one_it_begins():
    # allow_abbrev off: `--elastic 5` once ran a static job with --elastic-timeout 5.
    with pytest.raises(UsageError, match="unrecognized arguments: --elastic"):
        parse_settings(["--elastic", "5", "-np", "1", "python", "-c", "pass"])
    with pytest.raises(UsageError, match="unrecognized arguments: --checkpoint"):
        parse_settings(["--checkpoint", "ckpt", "python", "-c", "pass"])


def test_hvdlites_flags_after_the_training_command_are_named_and_go_to_the_script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("pass\n")
    notes = []
    s = parse_settings(["python3", "train.py", "-np", "2", "--min-np=1", "--lr", "1"], notes)
    assert s.num_proc == 1 and s.command[-5:] == ["-np", "2", "--min-np=1", "--lr", "1"]  # the script's
    assert notes == ["-np, --min-np=1 after the training command go to the script, not to hvdlite: "
                     "hvdlite's flags go before COMMAND"]
    notes = []  # a script's own --help, -p or -i is no mistake worth a line; flags before COMMAND are fine
    parse_settings(["-np", "1", "python3", "train.py", "--help", "-p", "1", "-i", "x"], notes)
    assert notes == []


@pytest.mark.parametrize("value, strict", [("", False), ("0", False), ("no", False), ("1", True), ("true", True)])
def test_fail_on_worker_failure_comes_from_the_flag_or_the_environment(monkeypatch, value, strict):
    monkeypatch.setenv("HVDLITE_FAIL_ON_WORKER_FAILURE", value)
    assert parse_settings(["--min-np", "1", "python", "-c", "pass"]).fail_on_worker_failure is strict
    assert parse_settings(["--fail-on-worker-failure", "--min-np", "1", "python", "-c", "pass"]).fail_on_worker_failure


def test_fail_on_worker_failure_refuses_an_environment_value_it_cannot_read(monkeypatch):
    monkeypatch.setenv("HVDLITE_FAIL_ON_WORKER_FAILURE", "maybe")
    with pytest.raises(UsageError, match="HVDLITE_FAIL_ON_WORKER_FAILURE='maybe': expected 1 or 0"):
        parse_settings(["--min-np", "1", "python", "-c", "pass"])


def test_a_script_that_is_not_executable_gets_one_error_however_it_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "noexec.sh").write_text("echo localhost:1\n")
    said = {}
    for name in ("noexec.sh", "./noexec.sh"):
        for flags in ([name], ["--min-np", "1", "--host-discovery-script", name, "true"]):
            with pytest.raises(UsageError) as e:
                parse_settings(flags)
            said[name, len(flags)] = str(e.value).replace("./noexec.sh", "noexec.sh")
    assert said["noexec.sh", 1] == said["./noexec.sh", 1] and "chmod +x noexec.sh" in said["noexec.sh", 1]
    assert said["noexec.sh", 5] == said["./noexec.sh", 5] and "'sh noexec.sh'" in said["noexec.sh", 5]


# Slot /1 fails at once; slot /0 finishes once the driver reaped /1 (its /proc entry is gone), so
# that the failure comes first however late /1 starts: a finish first would end the job.
FAILS_THEN_FINISHES = """
import os, sys, time
flag = os.environ["FAILED_PID"]
if os.environ["HVDLITE_SLOT"].endswith("/1"):
    with open(flag + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(flag + ".tmp", flag)
    sys.exit(3)
deadline = time.monotonic() + 30
while not (os.path.exists(flag) and not os.path.exists("/proc/" + open(flag).read())):
    assert time.monotonic() < deadline, "slot /1 did not fail"
    time.sleep(0.05)
"""


@pytest.mark.parametrize("strict", [False, True])
def test_a_worker_failure_fails_a_finished_job_only_when_asked(strict, tmp_path):
    # No torch, no template: workers that never call hvd.init(), one failing, one finishing.
    r = subprocess.run([sys.executable, "-m", "hvdlite.cli", "run", "-np", "2", "--min-np", "1", "--no-preload",
                        sys.executable, "-c", FAILS_THEN_FINISHES], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL, env={**os.environ, "FAILED_PID": str(tmp_path / "failed"),
                                                      "HVDLITE_FAIL_ON_WORKER_FAILURE": str(int(strict))})
    last = r.stderr.strip().splitlines()[-1]
    if strict:
        assert r.returncode == 1 and last.startswith("hvdlite: error: the job finished, but 1 worker failed "
                                                     "on the way (--fail-on-worker-failure)"), r.stderr
    else:
        assert r.returncode == 0 and "1 worker failed on the way" in last, r.stderr
