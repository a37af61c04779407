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


def test_a_script_is_told_how_far_the_job_got_and_the_demo_grows_on_it(monkeypatch):
    # The README demo's third slot comes at a commit, not at an age of the driver: a slow machine
    # (a cold first run) must not have it there from the start.
    from hvdlite.discovery.sources import ScriptHosts
    monkeypatch.delenv("HOSTS_FILE", raising=False)
    monkeypatch.delenv("DEMO_GROW_AT", raising=False)
    demo = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                        "discover_hosts.sh")
    for commit, slots in ((0, 2), (29, 2), (30, 3)):
        source = ScriptHosts(demo, 5, progress=lambda: {"HVDLITE_NEWEST_COMMIT": str(commit)})
        assert source.read() == [("localhost", slots)]
