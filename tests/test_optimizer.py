"""DistributedOptimizer and the state broadcasts, on real gloo groups of 2 and 4 processes."""
import copy
import os
import platform
import resource
import warnings

import pytest
import torch

import gloo_harness
from hvdlite.torch import autograd, ops, runtime
from hvdlite.torch.compression import Compression
from hvdlite.torch.optimizer import (FUSION_THRESHOLD_ENV, DistributedOptimizer,
                                     broadcast_optimizer_state, broadcast_parameters)

BATCH = 4  # samples per rank per micro-batch


def _world():
    info = runtime.info()
    return info.rank, info.size


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8),
                               torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _global_batch(step, size):
    g = torch.Generator().manual_seed(step)
    return torch.randn(size * BATCH, 6, generator=g), torch.randn(size * BATCH, 3, generator=g)


def _loss(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def _flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _assert_replicas_identical(model):
    rank, size = _world()
    gathered = autograd.allgather(_flat_params(model).unsqueeze(0))
    assert all(torch.equal(gathered[r], gathered[0]) for r in range(size)), "replicas diverged"


def _train_and_compare(make_optimizer, steps=5, passes=1, atol=1e-5, **wrap):
    """Train a DistributedOptimizer on this rank's share of each batch and, alongside, the
    same model with the plain optimizer on the whole (concatenated) batch; compare."""
    rank, size = _world()
    model, reference = _model(), _model()
    opt = DistributedOptimizer(make_optimizer(model.parameters()), backward_passes_per_step=passes,
                               named_parameters=model.named_parameters(), **wrap)
    ref_opt = make_optimizer(reference.parameters())
    for step in range(steps):
        opt.zero_grad()
        ref_opt.zero_grad()
        for micro in range(passes):
            x, y = _global_batch(step * passes + micro, size)
            mine = slice(rank * BATCH, (rank + 1) * BATCH)
            _loss(model, x[mine], y[mine]).backward()
            _loss(reference, x, y).backward()  # gradients accumulate, not averaged over passes
        opt.step()
        ref_opt.step()
    _assert_replicas_identical(model)
    assert torch.allclose(_flat_params(model), _flat_params(reference), atol=atol), \
        (_flat_params(model) - _flat_params(reference)).abs().max()
    return model, opt


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _adam(params):
    return torch.optim.Adam(params, lr=0.01)


def check_training_matches_single_process():
    _train_and_compare(_sgd)
    _train_and_compare(_adam)
    _train_and_compare(_sgd, passes=2)
    _train_and_compare(_sgd, compression=Compression.fp16, atol=1e-2)
    _train_and_compare(_sgd, gradient_predivide_factor=2.0)
    for threshold in ("0", "200"):  # one bucket per tensor; a few buckets started mid-backward
        os.environ[FUSION_THRESHOLD_ENV] = threshold
        try:
            _train_and_compare(_adam)
        finally:
            del os.environ[FUSION_THRESHOLD_ENV]


def check_sum_and_too_many_backward_passes():
    rank, size = _world()
    model = torch.nn.Linear(3, 1, bias=False)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), op=ops.Sum,
                               backward_passes_per_step=2)
    model.weight.grad = torch.full((1, 3), float(rank))
    opt.synchronize()
    assert torch.equal(model.weight.grad, torch.full((1, 3), float(size * (size - 1) // 2)))
    opt.zero_grad()
    for _ in range(2):
        model(torch.ones(1, 3)).sum().backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        model(torch.ones(1, 3)).sum().backward()
    opt.synchronize()  # the world is still in step: every rank started the same bucket


def check_missing_gradients():
    """A parameter unused everywhere gets a zero gradient and is stepped, as Horovod's
    optimizer does (here weight decay shrinks it); one used on some ranks only gets the
    average with zeros from the others."""
    rank, size = _world()
    torch.manual_seed(0)
    used, sometimes, never = (torch.nn.Linear(2, 2) for _ in range(3))
    params = [*used.parameters(), *sometimes.parameters(), *never.parameters()]
    opt = DistributedOptimizer(torch.optim.SGD(params, lr=0.1, weight_decay=0.5))
    before = copy.deepcopy(never.state_dict())
    x = torch.ones(1, 2) * (rank + 1)
    out = used(x) + (sometimes(x) if rank == 0 else 0)
    out.sum().backward()
    expected_used = autograd.allreduce(used.weight.grad.clone())
    opt.step()
    assert torch.equal(never.weight.grad, torch.zeros(2, 2)) and torch.equal(never.bias.grad, torch.zeros(2))
    assert all(torch.allclose(p, before[k] * (1 - 0.1 * 0.5)) for k, p in never.state_dict().items())
    assert torch.allclose(used.weight.grad, expected_used)
    assert torch.allclose(sometimes.weight.grad, torch.ones(2, 2) / size)
    _assert_replicas_identical(torch.nn.ModuleList([used, sometimes]))


def check_a_late_missing_gradient_agrees_with_prepacked_ranks():
    """From the third step on, a bucket with every gradient present is sent prepacked (its
    kept buffer, one gloo call); a rank missing a gradient on such a step takes the general
    path. The layouts must agree across the two."""
    rank, size = _world()
    torch.manual_seed(0)
    used, sometimes = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt = DistributedOptimizer(torch.optim.SGD([*used.parameters(), *sometimes.parameters()], lr=0.1))
    for step in range(6):
        opt.zero_grad()
        skip = step == 4 and rank == 0
        x = torch.ones(1, 2) * (rank + 1)
        (used(x) + (0 if skip else sometimes(x))).sum().backward()
        if step == 3:  # every gradient present, the wire's guesses right: prepacked
            assert [contexts for _, contexts, _ in opt._hvd_reducer.started] == [None]
        opt.step()
        givers = range(1 if step == 4 else 0, size)
        assert torch.equal(sometimes.bias.grad, torch.full((2,), len(givers) / size)), step
        assert torch.allclose(sometimes.weight.grad, torch.full((2, 2), sum(r + 1 for r in givers) / size))
    _assert_replicas_identical(torch.nn.ModuleList([used, sometimes]))


def check_gradients_numpy_refuses_take_the_general_path():
    """Once the wire's guesses hold, a bucket goes prepacked only when numpy() takes each of
    its gradients: one that requires grad (backward with create_graph) or a sparse one
    (sparse_as_dense) goes the general way, averaged all the same."""
    rank, size = _world()
    torch.manual_seed(0)
    words, head = torch.nn.Embedding(5, 3, sparse=True), torch.nn.Linear(3, 2)
    params = [*words.parameters(), *head.parameters()]
    opt = DistributedOptimizer(torch.optim.SGD(params, lr=0.1), sparse_as_dense=True,
                               groups=[[words.weight], [head.weight, head.bias]])
    for step in range(6):
        opt.zero_grad()
        ids = torch.tensor([rank % 5, (step + rank) % 5])
        head(words(ids)).square().sum().backward(create_graph=step >= 4)
        prepacked = [contexts is None for _, contexts, _ in opt._hvd_reducer.started]
        if step >= 2:  # (words', head's)
            assert prepacked == [False, step < 4], (step, prepacked)
        expected = [autograd.allreduce(p.grad.to_dense().detach()) for p in params]
        opt.synchronize()
        assert all(not p.grad.requires_grad and torch.allclose(p.grad.to_dense(), e)
                   for p, e in zip(params, expected)), step
        assert words.weight.grad.is_sparse  # sparse again for the step, as Horovod's
        with opt.skip_synchronize():
            opt.step()
    _assert_replicas_identical(torch.nn.ModuleList([words, head]))


def check_held_gradients_survive_the_next_step():
    """A bucket's buffer is kept and packed again once no gradient view of it is alive:
    gradients a script still holds from an earlier step keep their values."""
    rank, size = _world()
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 257)  # 257 KB of gradients: a kept buffer
    opt = DistributedOptimizer(_sgd(model.parameters()))
    where = []
    for step in range(7):
        opt.zero_grad()
        model(torch.randn(4, 256) * (rank + 1)).square().sum().backward()
        opt.step()
        if step == 3:
            held = [(p.grad, p.grad.clone()) for p in model.parameters()]
        where.append(model.weight.grad.untyped_storage().data_ptr())
    assert all(torch.equal(grad, values) for grad, values in held)
    assert where[5] == where[6] != where[3], "the kept buffer was not packed again"
    _assert_replicas_identical(model)


def check_synchronize_skip_and_zero_grad():
    rank, size = _world()
    model = _model()
    opt = DistributedOptimizer(_sgd(model.parameters()))
    assert isinstance(opt, torch.optim.SGD)
    x, y = _global_batch(0, size)
    _loss(model, x[rank::size], y[rank::size]).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()  # the fused bucket already started from the gradient hooks
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    clipped = [p.grad.clone() for p in model.parameters()]
    with opt.skip_synchronize():
        opt.step()
    _assert_replicas_identical(model)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), clipped))
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    assert any("skip_synchronize" in str(w.message) for w in caught)

    opt = DistributedOptimizer(_sgd(model.parameters()))  # replaces the first one: it goes quiet
    for _ in range(2):
        opt.zero_grad()
        _loss(model, x[rank::size], y[rank::size]).backward()
        opt.step()
    _assert_replicas_identical(model)


def check_broadcasts():
    rank, size = _world()
    root = size - 1
    torch.manual_seed(rank)  # every rank starts different
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    model(torch.randn(5, 3) * (rank + 1))  # moves BatchNorm buffers, including an int64 counter
    model[1].num_batches_tracked += rank
    broadcast_parameters(model.state_dict(), root_rank=root)
    _assert_replicas_identical(model)
    for name, tensor in model.state_dict().items():
        assert torch.equal(autograd.broadcast(tensor, root), tensor), name
    other = torch.nn.Linear(3, 4)
    broadcast_parameters(other.named_parameters(), root_rank=0)
    _assert_replicas_identical(other)

    opt = torch.optim.Adam(model.parameters(), lr=0.001 * (rank + 1), betas=(0.8, 0.9 - rank / 100))
    if rank == root:  # only the root has stepped: the others have empty state
        for _ in range(3):
            model(torch.randn(5, 3)).sum().backward()
            opt.step()
        opt.state[model[0].weight]["custom"] = 7  # a plain scalar rides along
    broadcast_optimizer_state(opt, root_rank=root)
    state = opt.state_dict()
    assert opt.param_groups[0]["lr"] == 0.001 * (root + 1)
    assert opt.param_groups[0]["betas"] == (0.8, 0.9 - root / 100)
    assert state["state"][0]["custom"] == 7 and float(state["state"][0]["step"]) == 3
    assert ops.allgather_object(repr(state)) == [repr(state)] * size
    wrapped = DistributedOptimizer(opt)
    broadcast_optimizer_state(wrapped, root_rank=0)  # works on the wrapped optimizer too
    assert wrapped.state_dict()["param_groups"] == state["param_groups"]


def check_all():
    check_training_matches_single_process()
    check_sum_and_too_many_backward_passes()
    check_missing_gradients()
    check_a_late_missing_gradient_agrees_with_prepacked_ranks()
    check_gradients_numpy_refuses_take_the_general_path()
    check_held_gradients_survive_the_next_step()
    check_synchronize_skip_and_zero_grad()
    check_broadcasts()


@pytest.mark.parametrize("size", [2, 4])
def test_distributed_optimizer(size):
    gloo_harness.run(check_all, size)


def check_steps_keep_their_memory():
    """A step frees its gradients together (the reduced ones replace them). malloc must keep
    that memory for the next backward, not hand it back to the OS to fault it in again page by
    page: without fusion.expect_freed, 1,100-1,520 faults a step here, with it 13-19."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])
    # In buckets of one layer (1 MB): a bucket freed tells malloc less than the step frees.
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                               num_groups=8)
    x = torch.randn(128, 512)

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    for _ in range(5):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        step()
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10
    assert faults < 200, f"{faults:.0f} page faults a step (8 MB of gradients is 2,048 pages)"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the heap trimming measured is glibc's")
def test_steps_keep_their_memory():
    gloo_harness.run(check_steps_keep_their_memory, 2)


def test_wrapper_shares_the_optimizer():
    model = _model()
    base = torch.optim.Adam(model.parameters(), lr=0.5)
    torch.optim.lr_scheduler.StepLR(base, step_size=1)  # puts a plain `step` on the instance
    opt = DistributedOptimizer(base, named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.Adam) and type(opt).__name__ == "Adam"
    assert opt.param_groups is base.param_groups and opt.state is base.state
    opt.param_groups[0]["lr"] = 0.25
    assert base.state_dict()["param_groups"][0]["lr"] == 0.25
    with pytest.raises(runtime.NotInitializedError):
        opt.step()  # ours, not the scheduler's patch of the plain step
    torch.optim.lr_scheduler.StepLR(opt, step_size=1)  # a scheduler made after wrapping
    with pytest.raises(runtime.NotInitializedError):
        opt.step()


def test_wrapper_rejects_bad_arguments():
    model = _model()
    named = list(model.named_parameters())
    for kwargs in ({"named_parameters": named[:-1]}, {"named_parameters": named + named[:1]},
                   {"named_parameters": [p for _, p in named]}, {"op": ops.Max},
                   {"op": ops.Sum, "gradient_predivide_factor": 2.0},
                   {"backward_passes_per_step": 0}):
        with pytest.raises(ValueError):
            DistributedOptimizer(_sgd(model.parameters()), **kwargs)


def test_step_before_init_raises_clear_error():
    model = _model()
    opt = DistributedOptimizer(_sgd(model.parameters()))  # noqa: F841 - its hooks live while it does
    with pytest.raises(runtime.NotInitializedError, match=r"hvd\.init\(\)"):
        _loss(model, *_global_batch(0, 1)).backward()
    with pytest.raises(runtime.NotInitializedError):
        broadcast_parameters(model.state_dict(), root_rank=0)
