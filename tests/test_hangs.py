"""Hangs (docs/troubleshooting.md#hangs): a rank its peers wait on that makes no progress is
named with its stack, within the hang timeout; a static job ends, an elastic one re-forms.
Real workers (torch gloo); the timeouts at --timeout-scale 0.4: liveness 2 s, the hang
timeout's floor 4 s, gloo's collective timeout 12 s."""
import os
import re
import sys

import pytest

from hvdlite.driver.decisions.hangs import FACTOR, ROOM, Progress, ceiling
from jobs import SCRIPTS, run_job

SCRIPT = os.path.join(SCRIPTS, "hang_job.py")
NUMPY_PYTHON = os.path.join(os.path.dirname(SCRIPTS), "..", ".venv-pygloo", "bin", "python")
FAST = ["--timeout-scale", "0.4"]


def hang_job(tmp_path, args, timeout=60, **env):
    return run_job([*FAST, *args, sys.executable, SCRIPT], tmp_path, timeout=timeout,
                   env={"LOG_DIR": str(tmp_path), **env})


def stack_line(r):
    """The hung line, and the lines of the stack under it."""
    lines = r.stderr.splitlines()
    hung = [i for i, line in enumerate(lines) if " is hung: " in line and "error:" not in line]
    assert hung, r.stderr[-3000:]
    return lines[hung[0]], "\n".join(lines[hung[0] + 1:hung[0] + 20])


def test_a_rank_sleeping_forever_ends_a_static_job_named_with_its_stack(tmp_path):
    r = hang_job(tmp_path, ["-np", "3"], HANG="1:10")
    assert r.code == 1, r.stderr[-3000:]
    line, stack = stack_line(r)
    assert line.startswith("hvdlite: rank 1 on localhost (slot localhost/1) is hung: "), line
    # The stuck frame, by file and line: hang_job.py's `time.sleep(1)` in hang_forever().
    lineno = next(i for i, text in enumerate(open(SCRIPT), 1) if "the line the driver's stack names" in text)
    assert f'hang_job.py", line {lineno}, in hang_forever' in stack, stack
    assert "error: rank 1 on localhost is hung" in r.stderr
    # Within the hang timeout (the 4 s floor, or the 8 s ceiling were its first step still going
    # on) and the stack's wait, before gloo's 12 s would end it with a waiting rank blamed
    # instead (the line's own figure: the job's start takes seconds here, a minute under load).
    assert float(line.split("(hang timeout ")[1].split(" s)")[0]) <= ceiling(12.0), line
    assert [e["rank"] for e in r.of("worker_hung")] == [1]


def test_a_torchrun_ddp_rank_sleeping_forever_is_named_before_the_collective_timeout(tmp_path):
    """The same hang in a torchrun script (its own init_process_group, DDP's reducer calling
    the collectives): gloo numbers every collective of the group, and the heartbeats carry that
    count. It is named within the ceiling (12 s - ROOM), before gloo's 12 s: by the ceiling
    itself, or sooner where the load made a stall the job learned from."""
    r = hang_job(tmp_path, ["-np", "2"], HANG="1:10", API="ddp")
    assert r.code == 1, r.stderr[-3000:]
    line, stack = stack_line(r)
    assert line.startswith("hvdlite: rank 1 on localhost (slot localhost/1) is hung: "), line
    assert "in hang_forever" in stack, stack
    timeout = float(re.search(r"hang timeout ([\d.]+) s", line).group(1))
    assert timeout <= ceiling(12.0), line  # (its start under load: a minute)


def test_a_long_first_step_is_no_hang(tmp_path):
    """Rank 1's first step takes 6 s more while rank 0 waits: past the 4 s floor, under the 8 s
    ceiling that judges a first step; the job ends well, nobody named."""
    r = hang_job(tmp_path, ["-np", "2"], FIRST="1:6", STEPS="5")
    assert r.code == 0 and not r.of("worker_hung"), r.stderr[-3000:]


def test_a_rank_that_skipped_a_collective_is_named(tmp_path):
    r = hang_job(tmp_path, ["-np", "3"], SKIP="1:10", STEPS="20", POST="60")
    assert r.code == 1, r.stderr[-3000:]
    line, stack = stack_line(r)
    assert "rank 1 on localhost (slot localhost/1) is hung" in line, line
    assert "time.sleep(POST)" in stack, stack


def test_rank0_evaluating_alone_under_the_derived_timeout_is_not_named(tmp_path):
    """The first evaluation (3 s, under the 4 s floor) raises the derived timeout to 3 x 3 s:
    the second (5 s, over the floor) is not taken for a hang. With --hang-timeout 4, it is."""
    r = hang_job(tmp_path, ["-np", "3"], EVAL="3,5", EVAL_EVERY="10", STEPS="30")
    assert r.code == 0, r.stderr[-3000:]
    assert not r.of("worker_hung")
    (tmp_path / "fixed").mkdir()
    fixed = hang_job(tmp_path / "fixed", ["-np", "3", "--hang-timeout", "4"], EVAL="3,5",
                     EVAL_EVERY="10", STEPS="30")
    assert fixed.code == 1 and "rank 0 on localhost (slot localhost/0) is hung" in fixed.stderr, fixed.stderr[-3000:]


def test_an_elastic_job_kills_the_hung_rank_and_goes_on_without_it(tmp_path):
    r = hang_job(tmp_path, ["-np", "3", "--min-np", "2"], HANG="1:10", ELASTIC="1", STEPS="30")
    assert r.code == 0, r.stderr[-3000:]
    line, stack = stack_line(r)
    assert "rank 1 on localhost (slot localhost/1) is hung" in line and "killing it once its stack is in" in line
    assert "in hang_forever" in stack, stack
    steps = [line.split() for line in open(tmp_path / "steps.txt")]
    assert ["0", "29", "2"] in steps, steps[-5:]  # rank 0 finished in the world of two
    exits = [e for e in r.of("worker_exit") if e["slot"] == "localhost/1"]
    assert exits and exits[0]["code"] == -9


@pytest.mark.skipif(not os.path.exists(NUMPY_PYTHON), reason="needs .venv-pygloo (CPython 3.8-3.10 with pygloo)")
def test_numpy_a_rank_sleeping_forever_is_named_while_pygloo_holds_its_peers(tmp_path):
    """Its peers' own heartbeats are silent inside pygloo (their counts stale, one short): their
    stand-ins' beats say they wait in a collective, so the rank still beating is the one named."""
    r = run_job([*FAST, "-np", "3", NUMPY_PYTHON, os.path.join(SCRIPTS, "numpy_hang.py")], tmp_path, timeout=60)
    assert r.code == 1, r.stderr[-3000:]
    line, stack = stack_line(r)
    assert line.startswith("hvdlite: rank 1 on localhost (slot localhost/1) is hung: "), line
    assert 'numpy_hang.py", line' in stack and "time.sleep(1)" in stack, stack


# ---- the rule, pure ----------------------------------------------------------------------
def test_the_derived_timeout_follows_the_longest_stall_the_world_got_past():
    p = Progress()
    p.new_world(0.0)
    for t in range(10):  # steps every 0.5 s
        p.heard("a", t, t * 0.5)
        p.heard("b", t, t * 0.5)
    assert p.timeout(None, 4.0, 26.0) == 4.0
    p.heard("a", 10, 4.5 + 7.0)  # a 7 s stall (an evaluation), got past
    assert p.timeout(None, 4.0, 26.0) == FACTOR * 7.0
    assert p.timeout(5.0, 4.0, 26.0) == 5.0  # --hang-timeout fixes it
    p.heard("a", 11, 11.5 + 10.0)  # a 10 s stall: 30 s derived would pass the collective timeout
    assert p.timeout(None, 4.0, ceiling(30.0)) == ceiling(30.0) == 30.0 - ROOM


def test_a_first_step_gets_the_ceiling_and_a_rank_that_kept_pace_the_timeout():
    """b's first step in this world takes 12 s while a waits: nothing in the job predicts a
    first step, so it is judged by the ceiling (26 s at a 30 s collective timeout), not by the
    10 s floor. Once b was seen behind and caught up, the floor judges it."""
    p = Progress()
    p.new_world(0.0)
    for t in range(1, 13):
        p.heard("a", 4, float(t))
        p.heard("b", 3, float(t))
        assert p.hung(["a", "b"], float(t), 10.0, first_step=26.0) == []
    p.heard("b", 4, 12.5)  # its first step done: it caught up
    p.hung(["a", "b"], 12.5, 10.0, first_step=26.0)
    p.heard("a", 5, 13.0)
    for t in range(14, 24):  # now b stops in its own code while a waits
        p.heard("a", 5, float(t))
        p.heard("b", 4, float(t))
    assert p.hung(["a", "b"], 23.0, 10.0, first_step=26.0) == [("b", 4, 5, 10.0)]
    q = Progress()
    q.new_world(0.0)
    for t in range(1, 28):
        q.heard("a", 4, float(t))
        q.heard("b", 3, float(t))
    assert q.hung(["a", "b"], 25.0, 10.0, first_step=26.0) == []
    assert q.hung(["a", "b"], 27.0, 10.0, first_step=26.0) == [("b", 3, 4, 26.0)]  # before gloo's 30 s
    assert q.hung(["a", "b"], 27.0, 10.0) == [("b", 3, 4, 10.0)]  # --hang-timeout: as given


def test_named_only_when_behind_a_peer_and_nobody_moved():
    p = Progress()
    p.new_world(0.0)
    for t in (1.0, 2.0, 3.0, 4.0, 4.9):  # heartbeats go on, the counts stay
        for w, n in zip("abc", (5, 6, 6)):
            p.heard(w, n, t)
    assert p.hung(["a", "b", "c"], 4.9, 4.0) == []  # not yet
    assert p.hung(["a", "b", "c"], 5.0, 4.0) == [("a", 5, 6, 4.0)]
    p.heard("c", 7, 5.0)  # somebody moved: a process set of some ranks only, say
    assert p.hung(["a", "b", "c"], 8.0, 4.0) == []
    q = Progress()
    q.new_world(0.0)
    for t in range(1, 61):
        for w in "abc":
            q.heard(w, 6, float(t))
    assert q.hung(list("abc"), 60.0, 4.0) == []  # all at one count: nobody waits on anybody
    assert p.hung(["a", "b", "c"], 60.0, 4.0) == []  # their own beats silent, none vouched: gone quiet


def test_a_member_held_in_pygloo_is_never_named_and_says_its_peer_is_behind():
    p = Progress()
    p.new_world(0.0)
    p.heard("a", 9, 1.0)  # then pygloo holds it: its own beats stop, its stand-in's go on
    p.heard("b", 9, 1.0)
    for t in (2.0, 4.0, 6.0):
        p.heard("b", 9, t)  # b beats on, in its own code
        p.vouched("a", t)
    assert p.hung(["a", "b"], 6.0, 4.0) == [("b", 9, 10, 4.0)]
    q = Progress()
    q.new_world(0.0)
    q.heard("a", 9, 1.0)
    q.heard("b", 9, 1.0)
    for t in (2.0, 4.0, 6.0):
        q.heard("a", 9, t)
        q.heard("b", 9, t)
    assert q.hung(["a", "b"], 6.0, 4.0) == []  # both in their own code: nobody waits
