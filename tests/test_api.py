"""The horovod.torch API through the CLI: every name checked on every rank (scripts/api_check.py),
at np 2, and at np 3 then np 2 after an elastic reset."""
import os
import sys

from jobs import SCRIPTS, run_job

CHECK = [sys.executable, os.path.join(SCRIPTS, "api_check.py")]


def test_every_name_on_every_rank_at_np_2(tmp_path):
    r = run_job(["-np", "2", *CHECK], tmp_path, timeout=120)
    assert r.code == 0, r.stderr
    for k in range(2):
        assert f"[{k}]<stdout>:OK {k} 2" in r.stdout


def test_every_name_at_np_3_then_after_an_elastic_reset_at_np_2(tmp_path):
    r = run_job(["-H", "localhost:3", "--min-np", "1", *CHECK], tmp_path, timeout=180,
                env={"VICTIM": "localhost/1"})
    assert r.code == 0, r.stderr
    out = r.stdout
    assert all(f"<stdout>:OK {k} 3" in out for k in range(3))
    assert all(f"<stdout>:OK {k} 2" in out for k in range(2))  # the survivors, in the new world
    assert [e["code"] for e in r.of("worker_exit") if e["slot"] == "localhost/1"] == [-9]
