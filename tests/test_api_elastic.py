"""TorchState and the torch API in real elastic jobs: real workers, real gloo, real kill -9."""
import json
import os
import sys

import torch

from jobs import SCRIPTS, job_env, run_job

sys.path.insert(0, SCRIPTS)
from api_gan import replay  # noqa: E402


def test_torch_state_keeps_two_models_two_optimizers_and_a_scheduler_across_kill_9(tmp_path):
    total = 16
    r = run_job(["-H", "localhost:3", "--min-np", "1", sys.executable,
                 os.path.join(SCRIPTS, "api_state_job.py")], tmp_path, timeout=120,
                env=job_env(tmp_path, TOTAL_STEPS=total, VICTIM="localhost/1:6"))
    assert r.code == 0, r.stderr
    entries = [json.loads(line) for line in (tmp_path / "entries.jsonl").read_text().splitlines()]
    assert [(e["step"], e["size"]) for e in entries] == [(0, 3), (6, 2)]
    assert [e["code"] for e in r.of("worker_exit") if e["slot"] == "localhost/1"] == [-9]
    finals = [json.loads(p.read_text()) for p in tmp_path.glob("final.*.json")]
    assert len(finals) == 2
    expected = replay(total)
    for final in finals:
        assert torch.allclose(torch.tensor(final["state"], dtype=torch.float64), expected, atol=1e-5)
