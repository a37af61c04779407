"""Bad input ends with one line on stderr and exit code 2, never a traceback."""
import subprocess
import sys

import pytest

from hvdlite.cli import parse_settings


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
    (["run", "--reset-limit", "-1", "--min-np", "1", "true"], "non-negative"),
    (["run", "--blacklist-cooldown-range", "5", "1", "--min-np", "1", "true"], "MIN is larger"),
    (["run", "--host-discovery-script", "x.sh", "-H", "a:1", "true"], "not both"),
    (["frobnicate"], "unknown command"),
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


def test_help_exits_zero():
    r = hvdlite("run", "--help")
    assert r.returncode == 0 and "--host-discovery-script" in r.stdout
