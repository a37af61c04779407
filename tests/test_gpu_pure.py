"""What GPUs need that runs without one: checkpoints of GPU tensors loaded where there is no
GPU, and which GPU a slot picks among those it sees (hvdlite.worker.gpus)."""
import os

import pytest
import torch

from hvdlite.worker import checkpoints, gpus, rebuild, trusted

LINEAGE = "0" * checkpoints.LINEAGE_CHARS


class _WrittenFrom:
    """A tensor as the writer pickles one of a GPU (checkpoints._Pickler): its host copy and
    the device it was on. CI has no GPU to write one from."""

    def __init__(self, tensor, device):
        self.tensor, self.device = tensor, device

    def __reduce__(self):
        return rebuild.on_device, (self.tensor, self.device)


def _write_and_load(tmp_path, state):
    path = str(tmp_path / "ckpt")
    fd, direct = checkpoints.create(path)
    try:
        checkpoints.dump(fd, 7, LINEAGE, state, direct)
    finally:
        os.close(fd)
    return checkpoints.load(path)[2]


def test_a_gpu_checkpoint_loads_onto_the_cpu_where_there_is_none_with_one_line(tmp_path, capfd):
    weight = torch.arange(6.0).view(2, 3).requires_grad_()
    state = {"weight": _WrittenFrom(weight.detach().requires_grad_(), "cuda:1"),
             "steps": _WrittenFrom(torch.tensor([3]), "cuda:0"), "plain": torch.ones(2)}
    capfd.readouterr()
    loaded = _write_and_load(tmp_path, state)
    assert torch.equal(loaded["weight"], weight) and loaded["weight"].device.type == "cpu"
    assert loaded["weight"].requires_grad and loaded["weight"].is_leaf
    assert torch.equal(loaded["steps"], torch.tensor([3])) and torch.equal(loaded["plain"], torch.ones(2))
    err = capfd.readouterr().err.strip().splitlines()
    assert err == ["hvdlite: the checkpoint holds tensors of cuda:0, cuda:1, a device this process "
                   "does not have: they are loaded onto the CPU"]


def test_the_writers_own_check_says_nothing(tmp_path, capfd):
    path = str(tmp_path / "ckpt")
    fd, direct = checkpoints.create(path)
    checkpoints.dump(fd, 1, LINEAGE, {"w": _WrittenFrom(torch.ones(1), "cuda:0")}, direct)
    os.close(fd)
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("device", ["warp:0", 7, "x" * 41])
def test_a_tensor_on_no_real_device_is_refused(device):
    with pytest.raises(trusted.Untrusted):
        rebuild.on_device(torch.ones(1), device)
    with pytest.raises(trusted.Untrusted):
        rebuild.on_device("not a tensor", "cuda:0")


@pytest.mark.parametrize("visible, local_rank, count, expected", [
    (None, 0, 1, "hvdlite: slot h/0 (local rank 0) uses GPU 0: cuda:0 of the 1 it sees"),
    ("2,3", 1, 2, "hvdlite: slot h/0 (local rank 1) uses GPU 3: cuda:1 of the 2 it sees"),
    ("GPU-ab12", 0, 1, "hvdlite: slot h/0 (local rank 0) uses GPU GPU-ab12: cuda:0 of the 1 it sees"),
    ("5", 2, 1, "hvdlite: slot h/0 (local rank 2) uses GPU 5: cuda:0 of the 1 it sees"),
    ("", 0, 0, "hvdlite: slot h/0 sees no GPU"),
])
def test_the_local_rank_picks_among_the_visible_gpus(visible, local_rank, count, expected):
    environ = {"HVDLITE_SLOT": "h/0", "HVDLITE_LOCAL_RANK": str(local_rank)}
    if visible is not None:
        environ[gpus.VISIBLE] = visible
    assert gpus.line(count, environ) == expected


def test_a_worker_that_sees_gpus_says_once_which_its_slot_uses(monkeypatch, capfd):
    from hvdlite.torch import devices
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # (no GPU in CI: torch's answers)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(devices, "_said", [])
    for name, value in (("HVDLITE_SLOT", "h/1"), ("HVDLITE_LOCAL_RANK", "1"), (gpus.VISIBLE, "2,3")):
        monkeypatch.setenv(name, value)
    devices.say_gpu()
    devices.say_gpu()  # a second init() says nothing more
    assert capfd.readouterr().err == "hvdlite: slot h/1 (local rank 1) uses GPU 3: cuda:1 of the 2 it sees\n"
