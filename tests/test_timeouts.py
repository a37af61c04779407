"""The timeouts from one knob: --timeout-scale scales their defaults, and an order the job relies
on that they contradict is refused with one line naming both flags, before anything starts."""
import os
import subprocess
import sys

import pytest

from hvdlite import defaults, timeouts
from hvdlite.cli import parse_settings
from hvdlite.errors import UsageError

BASES = {field: base for field, (_, base) in timeouts.SCALED.items()}


@pytest.fixture(autouse=True)
def no_scale_in_the_environment(monkeypatch):
    monkeypatch.delenv("HVDLITE_TIMEOUT_SCALE", raising=False)


def refusal(argv):
    with pytest.raises(UsageError) as e:
        parse_settings([*argv, "true"])
    line = str(e.value)
    assert "\n" not in line
    return line


def test_the_defaults_are_in_order():
    timeouts.check(timeouts.resolve({}, defaults.TIMEOUT_SCALE))
    s = parse_settings(["-np", "1", "true"])
    assert {field: getattr(s, field) for field in BASES} == BASES


@pytest.mark.parametrize("scale", [0.2, 0.5, 3.0, 100.0])
def test_the_scale_scales_every_default_and_keeps_their_order(scale):
    s = parse_settings(["--timeout-scale", str(scale), "-np", "1", "true"])
    assert {field: getattr(s, field) for field in BASES} == {f: b * scale for f, b in BASES.items()}
    # A graceful stop's bound is Slurm's KillWait, and the discovery interval a rate: not scaled.
    assert (s.stop_timeout, s.discovery_interval) == (defaults.STOP_TIMEOUT, defaults.DISCOVERY_INTERVAL)


def test_a_flag_wins_over_the_scale_and_the_scale_over_the_environment(monkeypatch):
    monkeypatch.setenv("HVDLITE_TIMEOUT_SCALE", "4")
    s = parse_settings(["--start-timeout", "7", "-np", "1", "true"])
    assert (s.start_timeout, s.liveness_timeout, s.collective_timeout) == (7.0, 20.0, 120.0)
    s = parse_settings(["--timeout-scale", "2", "-np", "1", "true"])
    assert (s.start_timeout, s.liveness_timeout) == (60.0, 10.0)
    monkeypatch.setenv("HVDLITE_TIMEOUT_SCALE", "soon")
    assert refusal(["-np", "1"]).startswith("HVDLITE_TIMEOUT_SCALE: expected a number")


def test_liveness_not_shorter_than_the_collective_timeout_is_refused():
    line = refusal(["-np", "1", "--liveness-timeout", "40"])
    assert line.startswith("--liveness-timeout 40 must be shorter than --gloo-timeout-seconds 30:")
    line = refusal(["-np", "1", "--liveness-timeout", "5", "--gloo-timeout-seconds", "5"])
    assert line.startswith("--liveness-timeout 5 must be shorter than --gloo-timeout-seconds 5:")
    assert "before the driver knows which worker is gone" in line
    # Raised together with the scale, both stay in order; one given alone can leave it.
    parse_settings(["-np", "1", "--timeout-scale", "8", "true"])
    line = refusal(["-np", "1", "--timeout-scale", "0.1", "--liveness-timeout", "3"])
    assert line.startswith("--liveness-timeout 3 must be shorter than "
                           "--gloo-timeout-seconds 3 (30 x --timeout-scale 0.1):")


def test_liveness_shorter_than_two_heartbeats_is_refused():
    line = refusal(["-np", "1", "--liveness-timeout", "0.6"])
    assert line.startswith("--liveness-timeout 0.6 is shorter than two heartbeat intervals (1 s)")
    line = refusal(["-np", "1", "--timeout-scale", "0.1"])
    assert line.startswith("--liveness-timeout 0.5 (5 x --timeout-scale 0.1) is shorter than two")
    parse_settings(["-np", "1", "--liveness-timeout", "1", "true"])


def test_run_with_a_contradiction_exits_2_with_one_line_and_starts_nothing(tmp_path):
    marker = tmp_path / "started"
    env = {k: v for k, v in os.environ.items() if k != "HVDLITE_TIMEOUT_SCALE"}
    r = subprocess.run([sys.executable, "-m", "hvdlite.cli", "run", "-np", "1", "--liveness-timeout",
                        "60", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "hvdlite run: error: --liveness-timeout 60 must be shorter than --gloo-timeout-seconds 30: "
        "the survivors of a lost worker would give up their collective before the driver knows "
        "which worker is gone"]
    assert r.stdout == "" and not marker.exists()


def test_the_hang_timeout_sits_between_liveness_and_the_collective_timeout():
    line = refusal(["-np", "1", "--hang-timeout", "5"])
    assert line.startswith("--hang-timeout 5 must be longer than --liveness-timeout 5:"), line
    line = refusal(["-np", "1", "--hang-timeout", "30"])
    assert line.startswith("--hang-timeout 30 must be shorter than --gloo-timeout-seconds 30:"), line
    line = refusal(["-np", "1", "--timeout-scale", "0.2", "--hang-timeout", "8"])
    assert line.startswith("--hang-timeout 8 must be shorter than --gloo-timeout-seconds 6 (30 x --timeout-scale 0.2)")
    s = parse_settings(["-np", "1", "--hang-timeout", "12", "true"])
    assert (s.hang_timeout, s.liveness_timeout, s.collective_timeout) == (12.0, 5.0, 30.0)
    # Unset, it is derived (decisions/hangs.py) above a floor that scales, and that stays above
    # twice the liveness timeout: never a refusal the user did not ask for.
    assert (parse_settings(["-np", "1", "true"]).hang_timeout, parse_settings(["-np", "1", "true"]).hang_floor) \
        == (None, defaults.HANG_FLOOR)
    assert parse_settings(["--timeout-scale", "3", "-np", "1", "true"]).hang_floor == 3 * defaults.HANG_FLOOR
    assert parse_settings(["--liveness-timeout", "12", "-np", "1", "true"]).hang_floor == 24.0
