"""Jobs of more workers than the driver starts at once (executor.LAUNCH_THREADS): every launch
starts, whatever the launches before it are still doing. The 64-worker job runs the numpy
backend (about 30 MB a worker) under the shared lock: `flock /work/heavy.lock pytest -s ...`
prints its figures (on 2 cores: the world formed 5.3 s after the start, re-formed 0.11 s after
the kill -9, PSS 1,669 MB in all; before the fix 32 workers started and no world formed)."""
import os
import signal
import time

from jobs import Job, job_env, next_world, slot_pid, wait_progress
from test_numpy_backend import JOB, check_training_continuous, needs_pygloo, sizes
from hvdlite.driver.executor import LAUNCH_THREADS

MANY = 64


def test_every_launch_of_a_job_larger_than_the_launch_pool_starts(tmp_path):
    # Workers that never reach the rendezvous: each keeps its launch's thread as long as it
    # lives when waiting for it shares the launch pool.
    n = LAUNCH_THREADS + 8
    with Job(["-H", f"localhost:{n}", "--min-np", str(n), "--start-timeout", "60", "sleep", "60"],
             tmp_path) as job:
        events = job.wait_for(lambda ev: sum(e["event"] == "worker_start" for e in ev) == n, 30)
        assert len({e["pid"] for e in events if e["event"] == "worker_start"}) == n


def memory_mb(pid) -> tuple:
    """(RSS, PSS) of pid and every process under it, in MB: PSS counts each shared page once
    over the processes that share it."""
    from jobs import _tree
    rss = pss = 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                fields = dict(line.split()[:2] for line in f if line.split()[0] in ("Rss:", "Pss:"))
        except OSError:
            continue  # it ended meanwhile
        rss, pss = rss + int(fields["Rss:"]), pss + int(fields["Pss:"])
    return rss / 1024, pss / 1024


@needs_pygloo
def test_64_workers_form_lose_one_to_kill_9_re_form_and_finish(tmp_path):
    started = time.time()
    with Job(["-H", f"localhost:{MANY}", "--min-np", str(MANY - 1), "--start-timeout", "300",
              "--liveness-timeout", "30", "--gloo-timeout-seconds", "60", *JOB], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=30, STEP_SLEEP=0.05)) as job:
        first = job.wait_for(lambda ev: any(e["event"] == "round_complete" for e in ev), 400)
        formed = next(e for e in first if e["event"] == "round_complete")
        assert formed["size"] == MANY
        wait_progress(job, tmp_path, 10, timeout=300)
        rss, pss = memory_mb(job.proc.pid)
        reform, world = next_world(job, lambda: os.kill(slot_pid(job, "localhost/5"), signal.SIGKILL), 120)
        assert world["size"] == MANY - 1
        r = job.finish(300)
    assert r.code == 0, r.stderr[-3000:]
    assert sizes(check_training_continuous(tmp_path, 30)) == [MANY, MANY - 1]
    assert [e["key"] for e in r.of("blacklisted")] == ["localhost/5"]
    print(f"\n{MANY} workers: world formed {formed['time'] - started:.1f} s after the start; re-formed "
          f"{reform:.2f} s after kill -9; the driver and its workers (with their stand-ins): "
          f"RSS {rss:.0f} MB, PSS {pss:.0f} MB ({pss / MANY:.1f} MB a worker)")
