"""bench/gpu_smoke.py without a GPU: it says so in one line and exits 1 at once; and its stages
are isolated: one that fails, says nothing or hangs (its children too) prints its line, is
ended with its children, and the next still runs."""
import importlib.util
import os
import subprocess
import sys
import time

import pytest
import torch

SMOKE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "gpu_smoke.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the smoke script would run")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_1():
    done = subprocess.run([sys.executable, SMOKE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""  # (no stage started)
    assert done.stderr == f"gpu_smoke: torch {torch.__version__} sees no GPU here: nothing ran\n"


def _smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", SMOKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_stage_that_fails_or_hangs_leaves_the_others_their_time(tmp_path, capsys):
    smoke = _smoke()
    pid_file = tmp_path / "child"
    hang = ("import subprocess, sys, time\n"  # a child of the stage, as a two-rank stage's peer
            f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
            "print('RESULT half done', flush=True)\n"
            "time.sleep(60)\n")
    stages = [("ok", [sys.executable, "-c", "print('noise'); print('RESULT 1.00x')"], 10),
              ("fails", [sys.executable, "-c", "print('RESULT partial'); print('Boom'); raise SystemExit(3)"], 10),
              ("silent", [sys.executable, "-c", "pass"], 10),
              ("hangs", [sys.executable, "-c", hang], 2),
              ("after", [sys.executable, "-c", "print('RESULT still ran')"], 10)]
    assert smoke.run_stages(stages, budget=60) == 3
    lines = capsys.readouterr().out.splitlines()
    assert [line.rsplit(" (", 1)[0] for line in lines] == [
        "ok             1.00x",
        "fails          FAILED exit 3; last: RESULT partial | Boom",
        "silent         FAILED no result",
        "hangs          FAILED timed out after 2 s; last: RESULT half done",
        "after          still ran"]
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{child}") and open(f"/proc/{child}/stat").read().split()[2] != "Z":
        assert time.monotonic() < deadline, "the hung stage's child was left running"
        time.sleep(0.05)
    assert smoke.run_stages([("late", [sys.executable, "-c", "pass"], 10)], budget=0) == 1
    assert capsys.readouterr().out == "late           skipped: the 0 s are spent\n"
