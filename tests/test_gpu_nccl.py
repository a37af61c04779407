"""hvdlite's NCCL path on a real GPU (torch/backend.py): a world of one on NCCL through the
whole API, and two ranks sharing one GPU on NCCL (each its own NCCL_HOSTID, the socket
transport) recovering in process when one is killed inside an allreduce. Skipped where torch
has no NCCL or sees no GPU: CI has neither (tests/test_backend.py checks the choice and the
hooks there); bench/gpu_smoke.py runs its world of one on a GPU machine."""
import datetime
import os
import sys

import pytest
import torch
import torch.distributed as dist

import gloo_harness
import hvdlite.torch as hvd
import test_gpu
from hvdlite.torch import backend
from hvdlite.worker import backends
from jobs import SCRIPTS, job_env, run_job

pytestmark = pytest.mark.skipif(backend.readiness() != backends.READY,
                                reason="torch has no NCCL or sees no GPU here (CI has neither): "
                                       "run on a GPU machine, e.g. python bench/gpu_smoke.py")


def _take_nccl():
    backend.adopt(dist.PrefixStore("nccl", gloo_harness._store), hvd.rank(), hvd.size(),
                  datetime.timedelta(seconds=60))
    assert backend.active()


def check_the_api_on_nccl():
    _take_nccl()
    test_gpu.check_collectives()
    test_gpu.check_training_and_state()
    with pytest.raises(RuntimeError, match="hvd.join\\(\\) runs on gloo only"):
        hvd.join()
    backend.leave()


def test_a_world_of_one_on_nccl_through_the_api():
    gloo_harness.run(check_the_api_on_nccl, 1, timeout=180)


def test_two_ranks_on_one_gpu_recover_in_process_on_nccl(tmp_path):
    r = run_job(["--backend", "nccl", "-H", "localhost:2", "--min-np", "1", "-np", "2",
                 "--blacklist-cooldown-range", "600", "600",
                 sys.executable, os.path.join(SCRIPTS, "nccl_recover.py")], tmp_path, timeout=240,
                env={**job_env(tmp_path), "KILL_MARK": str(tmp_path / "killed")})
    said = [line.split("<stdout>:", 1)[1].strip() for line in r.stdout.splitlines() if "recovered" in line]
    print("\n".join(said))
    assert r.code == 0, r.stderr[-3000:]
    assert said and "on nccl" in said[0]
