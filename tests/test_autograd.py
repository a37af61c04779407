"""Gradients through the collectives on real gloo groups, against what Horovod 0.28.1's
backward of each gives, worked out by hand: rank r's loss weighs the result by (r + 1)."""
import pytest
import torch

import gloo_harness
import hvdlite.torch as hvd
from hvdlite.torch import runtime


def _world():
    info = runtime.info()
    return info.rank, info.size


def _full(shape, value):
    return torch.full(shape, float(value))


def check_allreduce_and_broadcast():
    r, n = _world()
    weights = n * (n + 1) / 2  # the sum over ranks of (r + 1)
    x = torch.ones(2, 3, requires_grad=True)
    (hvd.allreduce(x, op=hvd.Sum) * (r + 1)).sum().backward()
    assert torch.equal(x.grad, _full((2, 3), weights))  # an allreduce (Sum) of the gradient
    x = torch.ones(4, requires_grad=True)
    (hvd.allreduce(x, prescale_factor=2.0, postscale_factor=3.0) * (r + 1)).sum().backward()
    assert torch.allclose(x.grad, _full((4,), 6 * weights / n))  # same op and scaling
    a, b = torch.ones(2, requires_grad=True), torch.ones(3, dtype=torch.float64, requires_grad=True)
    ya, yb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    ((ya * (r + 1)).sum() + (yb * 2 * (r + 1)).sum()).backward()
    assert torch.equal(a.grad, _full((2,), weights)) and torch.equal(b.grad, _full((3,), 2 * weights).double())
    # broadcast: the gradient averaged over the ranks on the root, zeros elsewhere
    root = n - 1
    x = torch.ones(3, requires_grad=True)
    (hvd.broadcast(x, root) * (r + 1)).sum().backward()
    assert torch.allclose(x.grad, _full((3,), weights / n if r == root else 0.0))


def _positions(rows):
    return torch.arange(float(rows)).unsqueeze(1).expand(rows, 2)


def check_allgather():
    r, n = _world()
    rows = [k + 1 for k in range(n)]
    total, offset = sum(rows), sum(rows[:r])
    # The gradient of the gathered rows, averaged over the ranks, then this rank's rows of it.
    expected = _positions(total)[offset:offset + rows[r]] * (n + 1) / 2
    x = torch.ones(rows[r], 2, requires_grad=True)
    (hvd.allgather(x) * _positions(total) * (r + 1)).sum().backward()
    assert torch.allclose(x.grad, expected)
    a, b = torch.ones(rows[r], 2, requires_grad=True), torch.ones(1, 2, requires_grad=True)
    ga, gb = hvd.grouped_allgather([a, b])
    ((ga * _positions(total)).sum() * (r + 1) + (gb * _positions(n)).sum() * (r + 1)).backward()
    assert torch.allclose(a.grad, expected)
    assert torch.allclose(b.grad, _full((1, 2), r * (n + 1) / 2))


def check_alltoall():
    r, n = _world()
    splits = [(r + d) % 2 + 1 for d in range(n)]  # rows this rank sends rank d
    x = torch.ones(sum(splits), 2, requires_grad=True)
    out, received = hvd.alltoall(x, splits=splits)
    sources = torch.cat([torch.full((count, 2), float(src)) for src, count in enumerate(received.tolist())])
    ((sources + 1) * out * (r + 1)).sum().backward()
    # The gradient goes back the way the rows came: rows sent to d weigh (r + 1)(d + 1) there.
    expected = torch.cat([_full((count, 2), (r + 1) * (d + 1)) for d, count in enumerate(splits)])
    assert torch.equal(x.grad, expected)
    x = torch.ones(2 * n, 1, requires_grad=True)
    out = hvd.alltoall(x)  # no splits: the tensor alone
    (out * (r + 1)).sum().backward()
    assert torch.equal(x.grad, torch.cat([_full((2, 1), d + 1) for d in range(n)]))


def check_reducescatter():
    r, n = _world()
    rows = 2 * n + 1  # uneven: rank 0 gets one row more
    shares = [2 + (1 if k == 0 else 0) for k in range(n)]
    by_owner = torch.cat([_full((shares[k], 2), k + 1) for k in range(n)])
    for op, factor in ((hvd.Sum, n), (hvd.Average, 1)):
        # Horovod's backward: the gradient times the set's size for Sum, gathered from every rank.
        x = torch.ones(rows, 2, requires_grad=True)
        (hvd.reducescatter(x, op=op) * (r + 1)).sum().backward()
        assert torch.allclose(x.grad, by_owner * factor), (op, x.grad)
    x = torch.ones(rows, 2, requires_grad=True)
    (hvd.reducescatter(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5) * 3).sum().backward()
    assert torch.allclose(x.grad, _full((rows, 2), 3 * n))
    a, b = torch.ones(rows, 2, requires_grad=True), torch.ones(n, 1, requires_grad=True)
    ya, yb = hvd.grouped_reducescatter([a, b])
    ((ya * (r + 1)).sum() + (yb * 2 * (r + 1)).sum()).backward()
    assert torch.allclose(a.grad, by_owner)
    assert torch.allclose(b.grad, torch.cat([_full((1, 1), 2 * (k + 1)) for k in range(n)]))


def check_all():
    check_allreduce_and_broadcast()
    check_allgather()
    check_alltoall()
    check_reducescatter()


@pytest.mark.parametrize("size", [2, 3])
def test_gradients_through_every_collective(size):
    gloo_harness.run(check_all, size)
