import os
import time

import pytest

from hvdlite.discovery.script import MAX_OUTPUT, DiscoveryError, discover


def script(tmp_path, body):
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_parses_hosts(tmp_path):
    assert discover(script(tmp_path, "echo a:2; echo; echo b:1; echo a:2\n"), 5) == [("a", 2), ("b", 1)]


def test_slots_per_host_default(tmp_path):
    assert discover(script(tmp_path, "echo a; echo b:3\n"), 5, default_slots=2) == [("a", 2), ("b", 3)]


@pytest.mark.parametrize("body, message", [
    ("echo oops >&2; exit 3\n", "exited with code 3: oops"),
    ("echo 'a:2 b:3'\n", "invalid"),
    ("echo a:-1\n", "positive integer"),
    ("printf 'a:\\377\\n'\n", "not UTF-8"),
    (f"head -c {MAX_OUTPUT + 10} /dev/zero | tr '\\\\0' a\n", "more than"),
])
def test_bad_scripts_give_one_line(tmp_path, body, message):
    with pytest.raises(DiscoveryError, match=message) as e:
        discover(script(tmp_path, body), 5)
    assert "\n" not in str(e.value)


def test_hanging_script_is_killed_with_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    start = time.monotonic()
    with pytest.raises(DiscoveryError, match="timed out"):
        discover(script(tmp_path, f"sleep 30 & echo $! > {pidfile}; wait\n"), 0.5)
    assert time.monotonic() - start < 5
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}") \
            and open(f"/proc/{pid}/stat").read().split()[2] != "Z":
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
