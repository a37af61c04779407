"""Tensors off the host (GPUs) through every collective: staged through host memory and their
results put back on their device (hvdlite.torch.devices). CI has no GPU, so the checks of
the collectives, the optimizer and the broadcasts run here with every tensor taken as off the
host: each is copied, sent from its copy and put back, which a missing or wrong copy back
fails. tests/test_gpu.py runs on CUDA tensors where a GPU is at hand."""
import pytest
import torch

import gloo_harness
import test_autograd
import test_ops
import test_optimizer
from hvdlite.torch import devices, ops, runtime

def _everything_off_host(tensors):
    """Every tensor taken as off the host."""
    listed = [tensors] if torch.is_tensor(tensors) else list(tensors) if isinstance(tensors, (list, tuple)) else []
    staged.extend(t for t in listed if torch.is_tensor(t))
    return [t for t in listed if torch.is_tensor(t)]


staged = []  # every tensor staged in this process


def check_staged():
    devices.off_host = _everything_off_host
    test_ops.check_allreduce()
    test_ops.check_grouped_and_async()
    test_ops.check_allgather()
    test_ops.check_broadcast()
    test_autograd.check_all()
    test_optimizer.check_training_matches_single_process()
    test_optimizer.check_broadcasts()
    assert len(staged) > 100, "the checks took the staged path"
    # Host tensors beside one off the host stay where they are, each result in its own tensor.
    devices.off_host = lambda tensors: [t for t in tensors if t.dtype == torch.float64]
    mixed = [torch.ones(3), torch.ones(2, dtype=torch.float64)]
    summed = ops.grouped_allreduce_(mixed, op=ops.Sum)
    assert summed[0] is mixed[0] and summed[1] is mixed[1]
    assert all(torch.equal(t, torch.full_like(t, runtime.info().size)) for t in mixed)
    ops.barrier()


@pytest.mark.parametrize("size", [2, 3])
def test_every_collective_through_host_copies(size):
    gloo_harness.run(check_staged, size, timeout=120)


def test_only_tensors_off_the_host_are_staged():
    on, off = torch.ones(2), torch.empty(2, device="meta")  # meta: a device other than the host's
    assert devices.off_host(on) == [] and devices.off_host([on, on]) == []
    assert devices.off_host(off) == [off] and devices.off_host((on, off, 3)) == [off]
    assert devices.off_host(None) == [] and devices.off_host(7) == []

