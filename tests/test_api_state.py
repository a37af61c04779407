"""TorchState's handler registry without processes: what is kept in place, saved and restored."""
import pytest
import torch

from hvdlite.torch import elastic
from hvdlite.torch.statehandlers import StateHandler


def _params(*modules):
    return torch.cat([p.detach().flatten().clone() for m in modules for p in m.state_dict().values()])


def _objects():
    torch.manual_seed(0)
    gen, disc = torch.nn.Linear(3, 2), torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    opt_g = torch.optim.Adam(gen.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.5, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt_d, step_size=1, gamma=0.5)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt_g)
    return gen, disc, opt_g, opt_d, sched, plateau


def _step(gen, disc, opt_g, opt_d, sched):
    x = torch.randn(4, 3)
    for opt, loss in ((opt_g, gen(x).pow(2).sum()), (opt_d, disc(gen(x).detach()).pow(2).sum())):
        opt.zero_grad()
        loss.backward()
        opt.step()
    sched.step()


def test_every_handled_keyword_is_restored_in_place():
    gen, disc, opt_g, opt_d, sched, plateau = _objects()
    state = elastic.TorchState(model=gen, optimizer=opt_g, disc=disc, opt_d=opt_d, sched=sched,
                               plateau=plateau, epoch=0, history=[1])
    assert (state.model, state.optimizer, state.disc, state.opt_d, state.sched, state.plateau) == \
        (gen, opt_g, disc, opt_d, sched, plateau)
    _step(gen, disc, opt_g, opt_d, sched)
    state.save()  # what commit() does locally (commit() also needs a world)
    committed = _params(gen, disc)
    committed_lr = opt_d.param_groups[0]["lr"]
    committed_adam = opt_g.state_dict()["state"][0]["exp_avg"].clone()
    for _ in range(3):
        _step(gen, disc, opt_g, opt_d, sched)
    state.epoch = 5
    state.history.append(2)
    assert not torch.equal(_params(gen, disc), committed)
    state.restore()
    assert torch.equal(_params(gen, disc), committed)
    assert opt_d.param_groups[0]["lr"] == committed_lr == sched.get_last_lr()[0]
    assert torch.equal(opt_g.state_dict()["state"][0]["exp_avg"], committed_adam)
    assert state.epoch == 0 and state.history == [1]
    assert state.disc is disc and state.opt_d is opt_d and state.sched is sched  # the same objects


def test_assigning_a_handled_attribute_commits_the_new_object():
    gen, disc, opt_g, opt_d, sched, _ = _objects()
    state = elastic.TorchState(gen, opt_g)
    replacement = torch.nn.Linear(3, 2)
    state.model = replacement
    before = _params(replacement)
    with torch.no_grad():
        replacement.weight.add_(1)
    state.restore()
    assert state.model is replacement and torch.equal(_params(replacement), before)


class Counter:
    def __init__(self):
        self.n = 0


class CounterHandler(StateHandler):
    def save(self):
        self.saved = self.value.n

    def restore(self):
        self.value.n = self.saved

    def sync(self):
        pass


def test_users_register_their_own_types():
    registry = elastic.get_handler_registry()
    try:
        elastic.register_handler(Counter, CounterHandler)
        counter = Counter()
        state = elastic.TorchState(counter=counter)
        counter.n = 7
        state.restore()
        assert state.counter is counter and counter.n == 0
        elastic.set_handler_registry([])  # nothing handled: plain deep-copied values
        plain = elastic.TorchState(counter=counter)
        counter.n = 9
        plain.restore()
        assert plain.counter is not counter and plain.counter.n == 0
    finally:
        elastic.set_handler_registry(registry)
    assert elastic.get_handler_registry() == registry
    with pytest.raises(TypeError):
        StateHandler(1)  # save, restore and sync are the subclass's to write


class Progress:
    """A user class that follows the state_dict protocol, and nothing else."""

    def __init__(self):
        self.seen = []

    def state_dict(self):
        return {"seen": list(self.seen)}

    def load_state_dict(self, state):
        self.seen = list(state["seen"])


def test_any_object_with_a_state_dict_and_the_scripts_own_generators_are_restored_in_place():
    """A GradScaler, a user class, a second optimizer, and generators the script made: the
    objects the script holds go back to the commit, and the generators draw what they drew."""
    import random

    import numpy as np
    model = torch.nn.Linear(3, 1)
    second = torch.optim.Adam(model.parameters(), lr=0.1)
    scaler, progress = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1), Progress()
    own = {"g": torch.Generator().manual_seed(1), "n": np.random.default_rng(2), "r": random.Random(3),
           "mt": np.random.Generator(np.random.MT19937(4))}
    state = elastic.TorchState(model, second=second, scaler=scaler, progress=progress, **own)
    assert all(getattr(state, name) is value for name, value in own.items())

    def draws():
        return (torch.rand(2, generator=own["g"]).tolist(), own["n"].random(), own["r"].random(),
                own["mt"].random())

    def step():
        scaler.scale(model(torch.ones(3)).sum()).backward()
        scaler.step(second)
        scaler.update()
        progress.seen.append(len(progress.seen))
    step()
    state.save()
    committed = (scaler.get_scale(), list(progress.seen), second.state_dict()["state"][0]["exp_avg"].clone())
    expected = draws()
    step()
    step()
    assert scaler.get_scale() != committed[0]
    state.restore()
    assert (state.scaler, state.progress, state.second) == (scaler, progress, second)
    assert scaler.get_scale() == committed[0] and progress.seen == committed[1]
    assert torch.equal(second.state_dict()["state"][0]["exp_avg"], committed[2])
    assert draws() == expected


@pytest.mark.parametrize("zeroed", ["none", "zeros", "held"])
def test_the_gradients_are_the_commits_after_a_restore(zeroed):
    """Zeroed after step (to None, or to zeros) or held across the commit (accumulation): a
    restore puts back what the commit held, in place where it holds a tensor."""
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = elastic.TorchState(model, optimizer)
    model(torch.ones(3)).sum().backward()
    if zeroed != "held":
        optimizer.step()
        optimizer.zero_grad(set_to_none=zeroed == "none")
    state.save()
    committed = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    grads = [p.grad for p in model.parameters()]
    model(torch.full((3,), 2.0)).sum().backward()
    state.restore()
    for p, grad, before in zip(model.parameters(), committed, grads):
        assert (p.grad is None) if grad is None else (torch.equal(p.grad, grad) and p.grad is before)


def test_a_sparse_gradient_comes_back_as_the_commit_held_it():
    """An embedding's (sparse=True): replaced, not copied into (a sparse copy_ keeps the
    later step's rows)."""
    embedding = torch.nn.Embedding(5, 3, sparse=True)
    state = elastic.TorchState(embedding, torch.optim.SparseAdam(embedding.parameters()))
    embedding(torch.tensor([1, 2])).sum().backward()
    state.save()
    embedding(torch.tensor([3])).sum().backward()
    state.restore()
    assert embedding.weight.grad.coalesce().indices().tolist() == [[1, 2]]
