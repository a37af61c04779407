"""A Horovod user's elastic job behaves as under horovodrun: real workers, through the CLI."""
import json
import os
import signal
import stat
import subprocess
import sys

from jobs import (PRELOADED, SCRIPTS, check_training_continuous, job_env, run_job, sizes)

# The blacklisting tests fork their workers from a template (the suite is CPU-bound); the
# environment tests start them plainly, as such a job does by default.
JOB = [*PRELOADED, sys.executable, os.path.join(SCRIPTS, "elastic_job.py")]
ENV_JOB = [sys.executable, os.path.join(SCRIPTS, "horovod_env.py")]


def records(tmp_path, kind):
    return {p.name.split(".", 1)[1].rsplit(".", 1)[0]: json.loads(p.read_text())
            for p in tmp_path.glob(f"{kind}.*.json")}


def test_failure_blacklists_its_host_and_the_world_shrinks_by_it(tmp_path):
    r = run_job(["-H", "127.0.0.1:2,127.0.0.2:2", "--min-np", "1", *JOB], tmp_path,
                env=job_env(tmp_path, TOTAL_STEPS=20, FAILS="127.0.0.2/1:5"))
    assert r.code == 0, r.stderr
    assert [e["key"] for e in r.of("blacklisted")] == ["127.0.0.2"]
    assert sizes(check_training_continuous(tmp_path, 20)) == [4, 2]
    removed = [e for e in r.of("worker_exit") if e["slot"] == "127.0.0.2/0"]
    assert removed and removed[0]["code"] == 0 and removed[0].get("removed")


def test_a_failure_on_every_host_stops_the_job(tmp_path):
    r = run_job(["-H", "127.0.0.1:2,127.0.0.2:2", "--min-np", "1", *JOB], tmp_path,
                env=job_env(tmp_path, TOTAL_STEPS=40, STEP_SLEEP=0.05,
                            FAILS="127.0.0.2/1:5,127.0.0.1/1:10"))
    assert r.code == 1
    assert r.stderr.strip().splitlines()[-1] == "hvdlite: error: all hosts are blacklisted"


def test_first_world_follows_host_order_and_workers_get_horovods_environment(tmp_path):
    r = run_job(["-H", "localhost:2,127.0.0.1:2", "--min-np", "1", *ENV_JOB], tmp_path,
                env=job_env(tmp_path, TOTAL_STEPS=5))
    assert r.code == 0, r.stderr
    seen = records(tmp_path, "env")
    assert {slot: rec["rank"] for slot, rec in seen.items()} == \
        {"localhost_0": 0, "localhost_1": 1, "127.0.0.1_0": 2, "127.0.0.1_1": 3}
    for slot, rec in seen.items():
        e = rec["env"]
        assert e["HOROVOD_ELASTIC"] == "1"
        assert (int(e["HOROVOD_RANK"]), int(e["HOROVOD_SIZE"])) == (rec["rank"], 4) == \
            (int(e["HVDLITE_RANK"]), int(e["HVDLITE_SIZE"]))
        assert int(e["HOROVOD_LOCAL_RANK"]) == rec["local_rank"] and e["HOROVOD_LOCAL_SIZE"] == "2"
        assert int(e["HOROVOD_CROSS_RANK"]) == rec["cross_rank"] and e["HOROVOD_CROSS_SIZE"] == "2"
        assert e["HOROVOD_HOSTNAME"] == slot.rsplit("_", 1)[0]


def test_a_scripts_own_commits_attribute_counts_once(tmp_path):
    r = run_job(["-np", "2", "--min-np", "1", *ENV_JOB], tmp_path, env=job_env(tmp_path, TOTAL_STEPS=12))
    assert r.code == 0, r.stderr
    assert [rec["commits"] for rec in records(tmp_path, "final").values()] == [12, 12]


def test_the_design_cards_command_works_as_written(tmp_path):
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\necho localhost:2\n")
    discover.chmod(discover.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "train.py").write_text(
        "import hvdlite.torch as hvd\nhvd.init()\n"
        "print('rank', hvd.rank(), 'of', hvd.size(), flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-m", "hvdlite.cli", "run", "-np", "2", "--min-np", "1",
                             "--host-discovery-script", "discover.sh", "train.py"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    assert proc.returncode == 0, err
    assert sorted(line.split(":", 1)[1] for line in out.splitlines() if "<stdout>:" in line) == \
        ["rank 0 of 2", "rank 1 of 2"]
