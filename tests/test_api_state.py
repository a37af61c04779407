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
