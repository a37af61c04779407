"""Jobs across real sshd test hosts (tests/sshhosts.py): launch, host failure, partition,
driver death and unreachable hosts."""
import os
import signal
import sys
import time

import pytest

from jobs import (SCRIPTS, Job, check_training_continuous, discovery, job_env, next_world, run_job,
                  sizes, skip_without_partitions, ssh_flags, wait_progress)

JOB = [sys.executable, os.path.join(SCRIPTS, "elastic_job.py")]


@pytest.fixture(scope="module")
def hosts(ssh_hosts):
    return ssh_hosts(3)


def job_procs(hosts, name):
    return [p for p in hosts.processes(name) if "elastic_job.py" in p[2]]


def wait_gone(hosts, names, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(job_procs(hosts, n) for n in names):
            return True
        time.sleep(0.2)
    return False


def test_static_ranks_run_on_their_hosts(tmp_path, hosts):
    r = run_job([*ssh_flags(hosts), "-np", "4", "-H", "host-1:2,host-2:2", sys.executable,
                 os.path.join(SCRIPTS, "where.py")], tmp_path, timeout=60)
    assert r.code == 0, r.stderr
    lines = sorted(line.split(":", 1)[1].split() for line in r.stdout.splitlines()
                   if "<stdout>:" in line)
    assert lines == [["0", "host-1", "0", "0"], ["1", "host-1", "1", "0"],
                     ["2", "host-2", "0", "1"], ["3", "host-2", "1", "1"]]


def test_discovery_adds_then_removes_a_host(tmp_path, hosts):
    schedule = [[0, ["host-1:1", "host-2:1"]], [8, ["host-1:1", "host-2:1", "host-3:1"]],
                [24, ["host-2:1", "host-3:1"]]]
    r = run_job([*ssh_flags(hosts), *discovery(tmp_path, schedule), "--min-np", "1", *JOB], tmp_path,
                env=job_env(tmp_path, TOTAL_STEPS=40, STEP_SLEEP=0.1, RESIZE="20:3,30:2"))
    assert r.code == 0, r.stderr
    assert sizes(check_training_continuous(tmp_path, 40)) == [2, 3, 2]


def test_a_partitioned_host_is_cut_off_then_a_dead_host_is_blacklisted_and_the_survivor_finishes(tmp_path, hosts):
    # Two host faults in one job. host-3 cut off (where hosts can be partitioned): the world
    # re-forms without it within the liveness timeout, and its worker exits by itself. Then
    # every process of host-2 killed: host-2 is blacklisted, and host-1 trains to the end.
    partitions = hosts.mode == "netns"
    with Job([*ssh_flags(hosts), "-H", "host-1:1,host-2:1,host-3:1", "--min-np", "1",
              "--liveness-timeout", "3", *JOB], tmp_path, env=job_env(tmp_path, TOTAL_STEPS=60)) as job:
        try:
            wait_progress(job, tmp_path, 8)
            if partitions:
                seconds, reformed = next_world(job, lambda: hosts.partition("host-3"))
                assert seconds < 3 + 6
                assert "host-3/0" not in reformed["members"]
            wait_progress(job, tmp_path, 20)
            hosts.kill_all("host-2")
            r = job.finish(120)
            assert not partitions or wait_gone(hosts, ["host-3"], 10), "the cut-off worker did not exit by itself"
        finally:
            if partitions:
                hosts.heal("host-3")
            hosts.start("host-2")
    assert r.code == 0, r.stderr
    assert "host-2" in [e["key"] for e in r.of("blacklisted")]
    assert sizes(check_training_continuous(tmp_path, 60)) == ([3, 2, 1] if partitions else [3, 2])


def test_killed_driver_leaves_no_remote_worker(tmp_path, hosts):
    with Job([*ssh_flags(hosts), "-H", "host-1:1,host-2:1", "--min-np", "1", *JOB], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=100000)) as job:
        wait_progress(job, tmp_path, 3)
        assert job_procs(hosts, "host-1") and job_procs(hosts, "host-2")
        job.proc.send_signal(signal.SIGKILL)
        job.proc.wait(10)
        assert wait_gone(hosts, ["host-1", "host-2"], 10), "remote workers outlived the driver"


def test_unreachable_host_at_start_is_a_clear_error(tmp_path, hosts):
    start = time.monotonic()
    r = run_job([*ssh_flags(hosts), "-np", "2", "-H", "host-1:1,no-such-host.invalid:1",
                 sys.executable, os.path.join(SCRIPTS, "where.py")], tmp_path, timeout=60)
    assert r.code == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("hvdlite: error:") and "no-such-host.invalid" in last
    assert "Traceback" not in r.stderr and time.monotonic() - start < 30
    assert not job_procs(hosts, "host-1")


def test_a_host_discovered_later_reaches_a_job_that_started_local_only(tmp_path, hosts):
    # No --rendezvous-addr: the first hosts are all local, yet host-1 joins later and must
    # reach the rendezvous, and the local worker's gloo address must be reachable from it.
    schedule = [[0, ["localhost:1"]], [5, ["localhost:1", "host-1:1"]]]
    r = run_job(["--ssh-config", hosts.ssh_config, *discovery(tmp_path, schedule), "--min-np", "1",
                 *JOB], tmp_path, env=job_env(tmp_path, TOTAL_STEPS=30, STEP_SLEEP=0.1, RESIZE="15:2"))
    assert r.code == 0, r.stderr
    assert sizes(check_training_continuous(tmp_path, 30)) == [1, 2]
    assert not r.of("blacklisted")


def test_an_unreachable_host_does_not_hold_up_recovery(tmp_path, hosts):
    # host-3 drops every packet: connecting to it takes the SSH connect timeout (10 s). That
    # happens on a launch thread, so a kill -9 meanwhile re-forms the world at once.
    skip_without_partitions(hosts)
    schedule = [[0, ["host-1:1", "host-2:1"]], [5, ["host-1:1", "host-2:1", "host-3:1"]]]
    hosts.partition("host-3")
    try:
        with Job([*ssh_flags(hosts), *discovery(tmp_path, schedule), "--min-np", "1", *JOB],
                 tmp_path, env=job_env(tmp_path, TOTAL_STEPS=60, STEP_SLEEP=0.1)) as job:
            job.wait_for(lambda events: any(e["event"] == "hosts_changed" and "host-3" in e["added"]
                                            for e in events), 60)
            wait_progress(job, tmp_path, 8)
            victim = [e for e in job.events() if e["event"] == "worker_start" and e["slot"] == "host-2/0"]
            seconds, world = next_world(job, lambda: hosts.run("host-2", ["kill", "-9", str(victim[0]["pid"])]))
            launch_failed = [e for e in job.events() if e["event"] == "launch_failed"]
            r = job.finish(120)
    finally:
        hosts.heal("host-3")
    assert r.code == 0, r.stderr
    assert world["size"] == 1 and seconds < 5  # not after the 10 s connect
    assert not launch_failed, "the kill was handled only after host-3's connect gave up"
    # host-3's launch fails after its connect timeout; if the job had finished by then, that
    # worker was told to leave already, and a launch nobody needs blacklists nothing.
    (failed,) = [e for e in r.of("launch_failed") if e["slot"] == "host-3/0"]
    assert [e["key"] for e in r.of("blacklisted")] == ["host-2"] + ([] if failed.get("removed") else ["host-3"])
