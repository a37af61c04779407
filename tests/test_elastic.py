"""Elastic scenarios through the CLI: real workers, real gloo, real signals.

The discovery script is keyed on the job's committed progress, so host changes happen at
known steps whatever the machine's speed.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from jobs import (PRELOADED, SCRIPTS, Job, check_training_continuous, discovery, effective_steps,
                  job_env, next_world, run_connect_victims, run_job, sizes, slot_pid, steps_log, wait_progress)

PLAIN = [sys.executable, os.path.join(SCRIPTS, "elastic_job.py")]
# Every worker forks from a template (jobs.PRELOADED); the first test starts them as a job does by
# default (its first world plainly, its joiner from the template).
JOB = [*PRELOADED, *PLAIN]


@pytest.mark.plain_start("the default start: the first world plainly, the joiner from the template "
                         "warmed meanwhile")
def test_scale_up_then_down_moves_rank0_to_a_survivor(tmp_path):
    schedule = [[0, ["127.0.0.1:1", "127.0.0.2:1"]],
                [8, ["127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:1"]],
                [24, ["127.0.0.2:1", "127.0.0.3:1"]]]
    r = run_job([*discovery(tmp_path, schedule), "--min-np", "1", *PLAIN], tmp_path,
                env=job_env(tmp_path, TOTAL_STEPS=40, STEP_SLEEP=0.1, RESIZE="20:3,30:2"))
    assert r.code == 0, r.stderr
    records = check_training_continuous(tmp_path, 40)
    assert sizes(records) == [2, 3, 2]
    rank0 = [r["slot"] for rs in effective_steps(records).values() for r in rs if r["rank"] == 0]
    assert rank0[0] == "127.0.0.1/0" and rank0[-1] in ("127.0.0.2/0", "127.0.0.3/0")
    assert [e["kind"] for e in r.of("hosts_changed")] == ["added", "added", "removed"]
    removed = [e for e in r.of("worker_exit") if e["slot"] == "127.0.0.1/0"]
    assert removed and removed[0]["code"] == 0 and removed[0].get("removed")
    # By default the first world starts plainly and the joining worker forks from the
    # template warmed meanwhile (docs/internals.md, preloaded workers).
    assert "without a preloaded template" not in r.stderr
    assert {e["slot"]: e["started"] for e in r.of("worker_start")} == \
        {"127.0.0.1/0": "process", "127.0.0.2/0": "process", "127.0.0.3/0": "template"}


@pytest.mark.parametrize("hosts, victim, blacklisted", [
    # several hosts (names of this machine): the dead worker's host goes out, as in Horovod
    ("127.0.0.1:1,127.0.0.2:1,127.0.0.3:1", "127.0.0.3/0", ["127.0.0.3"]),
    # one host: only the dead worker's slot goes out, its other workers go on
    ("localhost:3", "localhost/1", ["localhost/1"]),
])
def test_kill_9_survivors_continue_from_last_commit(tmp_path, hosts, victim, blacklisted):
    with Job(["-H", hosts, "--min-np", "1", *JOB], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=40, STEP_SLEEP=0.05)) as job:
        wait_progress(job, tmp_path, 10)
        os.kill(slot_pid(job, victim), signal.SIGKILL)
        r = job.finish(120)
    assert r.code == 0, r.stderr
    records = check_training_continuous(tmp_path, 40)
    assert sizes(records) == [3, 2]
    assert [e["key"] for e in r.of("blacklisted")] == blacklisted
    check_exactly_once_per_epoch(records, dataset=64)


def check_exactly_once_per_epoch(records, dataset):
    """Within an epoch every sample is trained on once, whatever resets happened."""
    per_epoch = {}
    for rs in effective_steps(records).values():
        for indices in rs[0]["world"]:
            per_epoch.setdefault(rs[0]["epoch"], []).extend(indices)
    for epoch, seen in per_epoch.items():
        complete = epoch < max(per_epoch)
        assert len(set(seen)) == len(seen) or complete and set(seen) == set(range(dataset))
        if complete:
            assert set(seen) == set(range(dataset))


@pytest.mark.parametrize("victim", ["127.0.0.1/0", "127.0.0.2/0"])
def test_peer_dying_while_a_new_group_connects_costs_no_gloo_timeout(tmp_path, victim):
    # gloo would keep the survivor waiting five times its 30 s timeout for the dead peer to
    # connect; the survivor gives the round up as soon as the driver says it broke.
    r = run_job(["-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1", "--min-np", "1", *JOB], tmp_path,
                timeout=60, env=job_env(tmp_path, TOTAL_STEPS=20, FAILS="127.0.0.3/0:5",
                                        DIE_CONNECTING=victim))
    assert r.code == 0, r.stderr
    check_training_continuous(tmp_path, 20)
    assert [e["code"] for e in r.of("worker_exit") if e["slot"] == victim][0] == -9
    assert sizes(steps_log(tmp_path)) == [3, 1]


def test_a_collective_the_cut_misses_ends_when_the_driver_says_the_world_broke(tmp_path):
    # Rank 0 waits in a broadcast whose root is busy while rank 1 dies, and no cut reaches
    # gloo (scripts/missed_cut.py): the wait ends on the driver's word, not when the root
    # comes back 8 s later (or, with a wedged pair, at gloo's 30 s timeout).
    r = run_job(["-H", "localhost:3", "--min-np", "1", "--blacklist-cooldown-range", "0.1", "0.1",
                 sys.executable, os.path.join(SCRIPTS, "missed_cut.py")], tmp_path, timeout=90,
                env=job_env(tmp_path, BUSY=8))
    assert r.code == 0, r.stderr
    (wait,) = [json.loads(line) for line in (tmp_path / "waits.jsonl").read_text().splitlines()]
    assert wait["outcome"] == "failed" and wait["waited"] < 4.0, wait


def test_a_survivor_finishing_while_given_up_connects_still_retry_exits_cleanly(tmp_path):
    # Three worlds in a row lose a member while they connect: localhost/3 gives each connect
    # up, while gloo may still run it on its thread (here: the third, for 4 s). The survivor
    # finishes a step later; it crashed at interpreter exit (std::terminate: -6, or -11)
    # after DONE, and the job failed.
    run_connect_victims(sys.executable, "torch_connect_victim.py", tmp_path, 60, LAGGARD="localhost/3@3:4")


def test_a_survivor_whose_given_up_connect_outlasts_the_exit_wait_still_exits_cleanly(tmp_path):
    # As above, but the connect goes on past the exit's bounded wait (as one retried under a
    # --gloo-timeout-seconds above it would; here the wait is cut to 2 s, the connect takes 8):
    # the interpreter's teardown aborted the survivor after DONE. It now leaves without
    # teardown (os._exit), with its own code.
    run_connect_victims(sys.executable, "torch_connect_victim.py", tmp_path, 60,
                        LAGGARD="localhost/3@3:8", EXIT_WAIT="2")


@pytest.mark.parametrize("ending, code", [("pass", 0), ("sys.exit(3)", 3), ("sys.exit('bye')", 1),
                                          ("raise KeyError('x')", 1)])
def test_a_worker_leaving_without_teardown_keeps_its_own_exit_code(ending, code):
    # What _leave_without_teardown exits with: the code the interpreter would have exited with.
    script = ("import atexit, os, sys\nfrom hvdlite.worker import exitcode\n"
              "atexit.register(lambda: os._exit(exitcode.own()))\n" + ending + "\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert r.returncode == code, r.stderr


def test_all_workers_failing_fails_the_job_naming_the_first(tmp_path):
    fail = tmp_path / "fail.py"
    # Rank 1 fails once rank 0's process is gone (reaped: the driver has its exit), not after a
    # fixed sleep, which a loaded machine's skew between the two init() returns could outrun.
    fail.write_text("import hvdlite.torch as hvd, os, time\nhvd.init()\n"
                    "first, deadline = hvd.broadcast_object(os.getpid(), 0), time.monotonic() + 30\n"
                    "while hvd.rank() and time.monotonic() < deadline:\n"
                    "    try:\n        os.kill(first, 0)\n    except ProcessLookupError:\n        break\n"
                    "    time.sleep(0.05)\n"
                    "raise SystemExit(7)\n")
    r = run_job(["-np", "2", "--min-np", "1", sys.executable, str(fail)], tmp_path, timeout=60)
    assert r.code == 1
    assert "all workers failed; first: rank 0 on localhost exited with code 7" in r.stderr


@pytest.mark.parametrize("limit, code", [(1, 1), (2, 0)])
def test_exceptions_leave_the_others_training_until_the_reset_limit(tmp_path, limit, code):
    r = run_job(["-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1", "--min-np", "1",
                 "--reset-limit", str(limit), *JOB], tmp_path,
                env=job_env(tmp_path, TOTAL_STEPS=20, FAILS="127.0.0.2/0:4,127.0.0.3/0:8"))
    assert r.code == code, r.stderr
    if code:
        assert f"reset limit {limit} reached" in r.stderr
        return
    check_training_continuous(tmp_path, 20)
    assert [e["key"] for e in r.of("blacklisted")] == ["127.0.0.2", "127.0.0.3"]
    # The exit code is Horovod's (0: the last world finished), and the summary says who failed.
    failed = ["rank 1 on 127.0.0.2 exited with code 1 (ValueError: injected failure at step 4)",
              "rank 1 on 127.0.0.3 exited with code 1 (ValueError: injected failure at step 8)"]
    assert r.of("job_end")[-1]["failed"] == failed
    assert r.stderr.strip().splitlines()[-1] == \
        f"hvdlite: job finished after 2 resets; 2 workers failed on the way: {'; '.join(failed)}"


@pytest.mark.parametrize("cooldown", [True, False])
def test_failed_host_returns_after_cooldown_only_with_a_range(tmp_path, cooldown):
    flags = ["--blacklist-cooldown-range", "1", "2"] if cooldown else []
    grow = {"RESIZE": "30:2"} if cooldown else {}
    r = run_job(["-H", "127.0.0.1:1,127.0.0.2:1", "--min-np", "1", *flags, *JOB], tmp_path,
                env=job_env(tmp_path, TOTAL_STEPS=60, STEP_SLEEP=0.1, FAILS="127.0.0.2/0:5", **grow))
    assert r.code == 0, r.stderr
    records = check_training_continuous(tmp_path, 60)
    assert sizes(records) == ([2, 1, 2] if cooldown else [2, 1])
    assert bool(r.of("whitelisted")) == cooldown


def test_below_min_np_waits_then_fails(tmp_path):
    with Job(["-H", "127.0.0.1:1,127.0.0.2:1", "--min-np", "2", "--elastic-timeout", "3", *JOB],
             tmp_path, env=job_env(tmp_path, TOTAL_STEPS=1000)) as job:
        wait_progress(job, tmp_path, 3)
        os.kill(slot_pid(job, "127.0.0.2/0"), signal.SIGKILL)
        start = time.monotonic()
        r = job.finish(60)
    assert r.code == 1
    assert "fewer than --min-np 2 workers for --elastic-timeout 3 s" in r.stderr
    assert 3 <= time.monotonic() - start < 20
    assert r.of("waiting_for_workers")


def test_hosts_beyond_max_np_cause_no_reset(tmp_path):
    schedule = [[0, ["127.0.0.1:1", "127.0.0.2:1"]], [5, ["127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:2"]]]
    r = run_job([*discovery(tmp_path, schedule), "--min-np", "1", "--max-np", "2", *JOB], tmp_path,
                env=job_env(tmp_path, TOTAL_STEPS=30, STEP_SLEEP=0.1))
    assert r.code == 0, r.stderr
    assert [e["kind"] for e in r.of("hosts_changed")] == ["added", "added"]
    assert len(r.of("round_complete")) == 1 and not r.of("hosts_updated")
    assert sizes(steps_log(tmp_path)) == [2]


def test_sigstopped_worker_is_evicted_within_liveness_timeout(tmp_path):
    with Job(["-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1", "--min-np", "1",
              "--liveness-timeout", "2", *JOB], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=40, STEP_SLEEP=0.05)) as job:
        wait_progress(job, tmp_path, 10)
        seconds, _ = next_world(job, lambda: os.kill(slot_pid(job, "127.0.0.3/0"), signal.SIGSTOP))
        r = job.finish(120)
    assert r.code == 0, r.stderr
    unresponsive = r.of("worker_unresponsive")
    assert unresponsive and unresponsive[0]["slot"] == "127.0.0.3/0"
    assert seconds < 2 + 3
    assert sizes(check_training_continuous(tmp_path, 40)) == [3, 2]


def test_first_discovery_failure_is_fatal(tmp_path):
    r = run_job([*discovery(tmp_path, [[0, ["FAIL"]]]), *PLAIN], tmp_path, timeout=30,
                env=job_env(tmp_path))
    assert r.code == 1
    assert r.stderr.strip().splitlines()[-1] == "hvdlite: error: host discovery script exited with code 1"
    assert r.stderr.count("exited with code 1") == 1  # said once, not also as "job failed: ..."


def test_garbage_discovery_output_is_a_clear_error(tmp_path):
    r = run_job([*discovery(tmp_path, [[0, ["h1:2 h2:3"]]]), *PLAIN], tmp_path, timeout=30,
                env=job_env(tmp_path))
    assert r.code == 1
    assert "host discovery script: discovery output line 1: invalid host name" in r.stderr


def test_later_discovery_failures_and_hangs_are_retried(tmp_path):
    # Keyed on discovery's own runs: two that work, two that exit 1, two that hang past
    # --discovery-timeout, then it works again; the job waits at step 3 until it did. A healthy
    # run of the script (a Python start) must not time out too: under CI's load a start took
    # over 1 s once, and its timeout was then said a second time.
    hosts = ["127.0.0.1:1", "127.0.0.2:1"]
    schedule = [[0, hosts], [3, ["FAIL"]], [5, ["HANG"]], [7, hosts]]
    with Job([*discovery(tmp_path, schedule, runs=True), "--discovery-timeout", "2", "--min-np", "1", *JOB],
             tmp_path, env=job_env(tmp_path, TOTAL_STEPS=6, HOLD_AT=3)) as job:
        job.wait_for(lambda events: any(e["event"] == "discovery_recovered" for e in events), 90)
        go(tmp_path)
        r = job.finish(60)
    assert r.code == 0, r.stderr
    errors = [e["error"] for e in r.of("discovery_failed")]
    assert any("exited with code 1" in e for e in errors)
    assert any("timed out" in e for e in errors)
    # Each kind of failure is said once, not at each of its runs, and so is the recovery.
    said = [line for line in r.stderr.splitlines() if "host discovery" in line]
    assert len(said) == 3 and "works again" in said[-1], said
    assert r.of("discovery_recovered")[0]["failures"] >= 4
    assert sizes(steps_log(tmp_path)) == [2]


def test_a_group_that_cannot_connect_is_said_and_given_up(tmp_path):
    # Each failed connect waits the liveness timeout for the driver's word that a peer died
    # (links.told): three attempts, so 3 s rather than the default 5 s.
    r = run_job(["-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1", "--min-np", "1", "--liveness-timeout", "3",
                 *JOB], tmp_path,
                timeout=90, env=job_env(tmp_path, TOTAL_STEPS=10, CONNECT_FAILS="127.0.0.3/0"))
    assert r.code == 0, r.stderr
    said = [line for line in r.stdout.splitlines() if line.startswith("[") and "could not connect" in line] + \
        [line for line in r.stderr.splitlines() if "could not connect: Connection refused" in line]
    assert len([s for s in said if "trying the next world" in s]) == 2, said
    assert [e["code"] for e in r.of("worker_exit") if e["slot"] == "127.0.0.3/0"] == [1]
    assert [e["key"] for e in r.of("blacklisted")] == ["127.0.0.3"]
    assert sizes(check_training_continuous(tmp_path, 10)) == [2]


# ---- issue 19: nothing committed is lost, no healthy host is punished -------------------------
def joiners_wait(events):
    return any(e["event"] == "hosts_updated" and "ready to join" in e["reason"] for e in events)


def go(tmp_path):
    """Ends the HOLD_AT step of the test job."""
    (tmp_path / "go").touch()


def test_a_live_holder_on_a_blacklisted_host_hands_the_state_to_a_new_host(tmp_path):
    # Two hosts, so a failure blacklists its host. 127.0.0.1 runs the world; 127.0.0.2 joins
    # holding nothing, and 127.0.0.1/0 dies before the next commit: 127.0.0.1/1 still holds
    # every commit. It keeps its rank 1 in the next world, whose root it is (127.0.0.2 takes
    # the dead rank 0), until 127.0.0.2 has synced from it; then it leaves.
    schedule = [[0, ["127.0.0.1:2"]], [4, ["127.0.0.1:2", "127.0.0.2:1"]]]
    with Job([*discovery(tmp_path, schedule), "--min-np", "1", *JOB], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=20, STEP_SLEEP=0.05, HOLD_AT=4)) as job:
        job.wait_for(joiners_wait, 90)
        os.kill(slot_pid(job, "127.0.0.1/0"), signal.SIGKILL)
        job.wait_for(lambda events: any(e["event"] == "round_broken" for e in events), 30)
        go(tmp_path)
        r = job.finish(120)
    assert r.code == 0, r.stderr
    assert [e["key"] for e in r.of("blacklisted")] == ["127.0.0.1"]
    worlds = r.of("round_complete")
    assert worlds[1]["members"] == {"127.0.0.2/0": 0, "127.0.0.1/1": 1} and worlds[1]["handover"]
    assert worlds[1]["root"] == 1
    assert worlds[1]["commit"] == 4 and worlds[2]["members"] == {"127.0.0.2/0": 0}
    assert not r.of("commit_lost")
    removed = [e for e in r.of("worker_exit") if e["slot"] == "127.0.0.1/1"]
    assert removed[0]["code"] == 0 and removed[0].get("removed")
    records = check_training_continuous(tmp_path, 20)
    assert sizes(records) == [2, 1]  # the handover world trained no step


def test_with_no_hosts_listed_nobody_trains_and_the_elastic_timeout_ends_the_job(tmp_path):
    schedule = [[0, ["127.0.0.1:1"]], [5, []]]
    start = None
    with Job([*discovery(tmp_path, schedule), "--min-np", "1", "--elastic-timeout", "3", *JOB],
             tmp_path, env=job_env(tmp_path, TOTAL_STEPS=1000, STEP_SLEEP=0.05)) as job:
        job.wait_for(lambda events: any(e["event"] == "hosts_changed" and e["kind"] == "removed"
                                        for e in events), 90)
        start = time.monotonic()
        r = job.finish(60)
    assert r.code == 1
    (kept,) = r.of("state_kept")
    assert kept["slot"] == "127.0.0.1/0"
    assert f"--elastic-timeout 3 s; stopping the job (commit {kept['commit']} was kept on 127.0.0.1/0" \
        in r.stderr
    assert 2.5 <= time.monotonic() - start < 30
    # nothing trained after the commit at which the host left discovery
    assert max(r["step"] for r in steps_log(tmp_path)) < kept["commit"]
