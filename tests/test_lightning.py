"""Lightning under hvdlite run (docs/lightning.md): HvdliteStrategy trains what Lightning's own
DDP strategy trains under torchrun."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from jobs import SCRIPTS, Job

pytest.importorskip("lightning", reason="Lightning is not installed: pip install -e '.[lightning]'")
TORCHRUN = shutil.which("torchrun")


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not on PATH")
def test_hvdlite_strategy_fits_what_lightnings_ddp_fits_under_torchrun(tmp_path):
    script = os.path.join(SCRIPTS, "lightning_fit.py")
    theirs, ours = tmp_path / "torchrun", tmp_path / "hvdlite"
    theirs.mkdir(), ours.mkdir()
    done = subprocess.run([TORCHRUN, "--nproc-per-node", "2", script], capture_output=True, text=True,
                          env={**os.environ, "OUT_DIR": str(theirs), "STRATEGY": "ddp"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with Job(["-np", "2", sys.executable, script], tmp_path,
             env={"OUT_DIR": str(ours), "STRATEGY": "hvdlite"}) as job:
        result = job.finish(300)
    assert result.code == 0, result.stderr[-3000:]
    for rank in range(2):
        a, b = (json.loads((folder / f"rank{rank}.json").read_text()) for folder in (theirs, ours))
        assert a == b and b["size"] == 2 and b["samples"] == 64  # half of 64 samples, 2 epochs
