"""The torch range hvdlite supports (2.11 to 2.13) and the torch APIs it uses, by name
(hvdlite/torch/torchapis.py); and hvdlite's torch face, with a job on this machine, where the
SSH and crypto packages are missing (as on the GPU machines hvdlite first runs on)."""
import os
import sys

import torch

from hvdlite.torch import backend, torchapis
from jobs import run_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_installed_torch_is_supported_and_has_every_api_hvdlite_uses():
    assert torchapis.supported(), torch.__version__
    assert torchapis.missing() == []


def test_a_torch_out_of_the_range_or_lacking_an_api_is_told(tmp_path):
    assert [torchapis.supported(v) for v in ("2.10.1", "2.11.0+cu130", "2.13.0", "2.14.0")] == \
        [False, True, True, False]
    stub, header = tmp_path / torchapis.STUBS[0], tmp_path / torchapis.HEADER
    for path in (stub, header):
        path.parent.mkdir(parents=True, exist_ok=True)
    stub.write_text("\n".join(text for text in torchapis.STUBS[1] if text != "blocking: int"))
    header.write_text(" ".join(f'"{name}"' for name in backend.QUIET))
    assert torchapis.missing(str(tmp_path)) == [f"{torchapis.STUBS[0]}: blocking: int",
                                                f'{torchapis.HEADER}: "{backend.ERROR_HANDLING}"']


BLOCKER = '''import sys

class Blocked:
    """The SSH and crypto packages, as where they are not installed."""
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("paramiko", "setproctitle", "cryptography"):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, Blocked())
'''
SCRIPT = '''import sys
import torch
import hvdlite.torch as hvd
hvd.init()
total = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
gone = [name for name in ("paramiko", "setproctitle", "cryptography") if name in sys.modules]
print("total", total, "loaded", gone)
'''


def test_the_torch_face_and_a_local_job_run_without_the_ssh_and_crypto_packages(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)  # in the driver and its workers alike
    (tmp_path / "train.py").write_text(SCRIPT)
    r = run_job(["-np", "2", sys.executable, str(tmp_path / "train.py")], tmp_path, timeout=90,
                env={"PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])})
    assert r.code == 0, r.stderr[-3000:]
    assert sorted(line.split(":", 1)[1] for line in r.stdout.splitlines() if "total" in line) == \
        ["total 2.0 loaded []"] * 2
