"""hvdlite on real CUDA tensors: 2-4 ranks sharing the machine's GPUs over gloo, the data
staged through host memory (hvdlite.torch.devices). Skipped where torch sees no GPU: CI has
none (tests/test_devices.py checks the staging there with host tensors taken as off the host);
run them on a GPU machine (bench/gpu_smoke.py runs the NCCL path)."""
import os

import pytest
import torch

import gloo_harness
import hvdlite.torch as hvd
from hvdlite.torch import runtime
from hvdlite.worker import checkpoints

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="torch sees no GPU here (a CPU build, or no device): "
                                       "run on a GPU machine, python -m pytest tests/test_gpu.py")


def _on_slot_gpu():
    """(rank, size, this rank's GPU), as a Horovod script picks it from its local rank."""
    info = runtime.info()
    device = torch.device("cuda", info.local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return info.rank, info.size, device


def check_collectives():
    rank, size, gpu = _on_slot_gpu()
    every = size * (size + 1) // 2  # sum over ranks of (rank + 1)
    base = torch.arange(6.0, device=gpu).view(2, 3)
    mine = base * (rank + 1)
    summed = hvd.allreduce(mine, op=hvd.Sum)
    assert summed.device == gpu and torch.equal(summed, base * every)
    assert torch.allclose(hvd.allreduce(mine), base * every / size)
    in_place = mine.clone()
    assert hvd.allreduce_(in_place, op=hvd.Sum) is in_place and torch.equal(in_place, base * every)
    ints = torch.tensor([rank, 7], device=gpu)
    grouped = hvd.grouped_allreduce([mine, ints], op=hvd.Sum)
    assert [t.device for t in grouped] == [gpu, gpu] and grouped[1].tolist() == [size * (size - 1) // 2, 7 * size]
    handle = hvd.allreduce_async(mine, op=hvd.Max)
    assert torch.equal(hvd.synchronize(handle), base * size)

    root = size - 1
    sent = torch.full((4,), float(rank), device=gpu)
    assert hvd.broadcast_(sent, root) is sent and torch.equal(sent, torch.full((4,), float(root), device=gpu))
    assert hvd.broadcast(torch.tensor([rank], device=gpu), 0).device == gpu
    gathered = hvd.allgather(torch.full((rank + 1, 2), float(rank), device=gpu))
    assert gathered.device == gpu and gathered.shape == (every, 2)
    out, received = hvd.alltoall(torch.arange(float(size), device=gpu), splits=[1] * size)
    assert out.device == gpu and out.tolist() == [float(rank)] * size and received.tolist() == [1] * size
    scattered = hvd.reducescatter(torch.ones(size * 2, device=gpu), op=hvd.Sum)
    assert scattered.device == gpu and torch.equal(scattered, torch.full((2,), float(size), device=gpu))
    assert hvd.broadcast_object({"rank": rank}, root_rank=0) == {"rank": 0}

    x = torch.ones(3, device=gpu, requires_grad=True)
    (hvd.allreduce(x, op=hvd.Sum) * (rank + 1)).sum().backward()
    assert x.grad.device == gpu and torch.equal(x.grad, torch.full((3,), float(every), device=gpu))
    hvd.barrier()


def check_collectives_and_join():
    check_collectives()
    rank, size, gpu = _on_slot_gpu()
    if rank == 0:
        hvd.join()  # joins first: the others' allreduces get its zeros
    else:
        assert torch.equal(hvd.allreduce(torch.ones(1, device=gpu), op=hvd.Sum), torch.full((1,), float(size - 1), device=gpu))
        hvd.join()
    hvd.barrier()


def check_training_and_state():
    rank, size, gpu = _on_slot_gpu()
    torch.manual_seed(rank)  # every rank starts different
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1)).to(gpu)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0)
    for step in range(3):
        opt.zero_grad()
        model(torch.randn(16, 4, device=gpu) * (rank + 1)).pow(2).mean().backward()
        opt.step()
    state.save()  # (a commit saves so too, and tells the driver: no driver in the harness)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert flat.device == gpu and torch.equal(hvd.allgather(flat[None]), flat.expand(size, -1))
    assert all(v.device == gpu for s in opt.state_dict()["state"].values() for v in s.values() if torch.is_tensor(v))
    with torch.no_grad():
        model[0].weight.add_(1)
    state.restore()
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in model.parameters()]), flat)
    hvd.barrier()


@pytest.mark.parametrize("size", [2, 3, 4])
def test_collectives_on_gpu_tensors(size):
    gloo_harness.run(check_collectives_and_join, size, timeout=180)


@pytest.mark.parametrize("size", [2, 4])
def test_training_commit_and_restore_on_the_gpu(size):
    gloo_harness.run(check_training_and_state, size, timeout=180)


def test_a_gpu_checkpoint_loads_onto_the_slots_gpu(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("HVDLITE_LOCAL_RANK", str(1))
    slot = 1 % torch.cuda.device_count()
    weight = torch.arange(4.0, device="cuda:0").requires_grad_()
    path = str(tmp_path / "ckpt")
    fd, direct = checkpoints.create(path)
    checkpoints.dump(fd, 1, "0" * checkpoints.LINEAGE_CHARS, {"w": weight, "n": torch.ones(1)}, direct)
    os.close(fd)
    loaded = checkpoints.load(path)[2]
    assert loaded["w"].device == torch.device("cuda", slot) and loaded["w"].requires_grad
    assert torch.equal(loaded["w"].cpu(), weight.detach().cpu()) and loaded["n"].device.type == "cpu"
    assert "loaded onto the CPU" not in capfd.readouterr().err


def test_the_capability_queries_say_cuda():
    assert hvd.cuda_built() is (torch.version.hip is None) and hvd.rocm_built() is (torch.version.hip is not None)
