"""hvdlite.numpy's part of the Horovod API through the CLI, on the pygloo venv."""
import os

import pytest

from jobs import SCRIPTS, run_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = os.environ.get("HVDLITE_PYGLOO_PYTHON", os.path.join(ROOT, ".venv-pygloo", "bin", "python"))


@pytest.mark.skipif(not os.path.exists(PYTHON), reason=f"no pygloo venv at {PYTHON} (.ci/setup.sh)")
@pytest.mark.parametrize("n", [2, 3])
def test_reducescatter_and_clear_errors_on_every_rank(tmp_path, n):
    r = run_job(["-np", str(n), "-H", f"localhost:{n}", PYTHON,
                 os.path.join(SCRIPTS, "api_numpy_check.py")], tmp_path, timeout=90,
                env={"TIMELINE_DIR": str(tmp_path)})
    assert r.code == 0, r.stderr
    for k in range(n):
        assert f"[{k}]<stdout>:OK {k}" in r.stdout
