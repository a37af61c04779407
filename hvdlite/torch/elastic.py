"""Elastic training on the torch backend: `@run`, State, ObjectState, TorchState and
ElasticSampler. The reset protocol lives in hvdlite.worker.elastic; this binds it to torch.
"""
import copy
import math

import torch

from hvdlite.torch import basics, ops, runtime
from hvdlite.torch.optimizer import broadcast_optimizer_state, broadcast_parameters
from hvdlite.worker import elastic as core
from hvdlite.worker.elastic import run  # noqa: F401


def _broadcast_flag(value: int) -> int:
    return int(ops.broadcast(torch.tensor([value], dtype=torch.int32), root_rank=0).item())


BACKEND = core.Backend(init=basics.init, join=basics.join, shutdown=basics.shutdown, abort=basics.abort,
                       info=runtime.info, broadcast_flag=_broadcast_flag,
                       broadcast_object=ops.broadcast_object)


class State(core.State):
    """Training state that survives resets: commit() saves it, restore() goes back to it."""

    backend = BACKEND


class ObjectState(core.ObjectState, State):
    """State made of plain picklable attributes: ObjectState(epoch=0, batch=0)."""


class TorchState(ObjectState):
    """Model, optimizer, ElasticSamplers and plain attributes, saved by deep copy."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model, self.optimizer = model, optimizer
        self.samplers = {k: v for k, v in kwargs.items() if isinstance(v, ElasticSampler)}
        for name, sampler in self.samplers.items():
            setattr(self, name, sampler)
        super().__init__(**{k: v for k, v in kwargs.items() if k not in self.samplers})

    def save(self):
        super().save()
        self._saved_model = copy.deepcopy(self.model.state_dict()) if self.model else None
        self._saved_optimizer = copy.deepcopy(self.optimizer.state_dict()) if self.optimizer else None
        self._saved_samplers = {k: s.state_dict() for k, s in self.samplers.items()}

    def restore(self):
        super().restore()
        if self.model:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer:
            self.optimizer.load_state_dict(self._saved_optimizer)
        for name, sampler in self.samplers.items():
            sampler.load_state_dict(self._saved_samplers[name])

    def sync(self):
        if self.model:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        states = ops.broadcast_object({k: s.state_dict() for k, s in self.samplers.items()}, root_rank=0)
        for name, sampler in self.samplers.items():
            sampler.load_state_dict(states[name])
        super().sync()


class ElasticSampler(torch.utils.data.Sampler):
    """Splits an epoch's not yet processed samples among the current world.

    Ranks step in lockstep, so after each rank consumed k samples of its share, the world has
    consumed the first k * size samples of the split (shares are interleaved). That lets every
    rank, and so any survivor, know what the whole world processed, including dead ranks.
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed = []  # this epoch's samples finished before the current split
        self.local_done = 0  # samples this rank consumed since the current split
        self.reset()

    def set_epoch(self, epoch):
        """Start `epoch`; calling it again for the current epoch (after a reset) keeps progress."""
        if epoch != self.epoch:
            self.epoch, self.processed, self.local_done = epoch, [], 0
            self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Record that this rank finished batches 0..batch_idx of the current split."""
        self.local_done = min((batch_idx + 1) * batch_size, len(self.indices))

    def record_indices(self, indices):
        self.local_done += len(indices)

    def reset(self):
        """Re-split the remaining samples of the epoch for the current world."""
        self.size, self.rank = (basics.size(), basics.rank()) if basics.is_initialized() else (1, 0)
        done = set(self.processed)
        self.remaining = [i for i in self._order() if i not in done]
        per_rank = math.ceil(len(self.remaining) / self.size) if self.remaining else 0
        padded = (self.remaining * self.size)[:per_rank * self.size]  # repeat to split evenly
        self.shares = [padded[r::self.size] for r in range(self.size)]  # every rank's share
        self.indices = self.shares[self.rank]
        self.local_done = 0

    def _order(self):
        if not self.shuffle:
            return list(range(len(self.dataset)))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.dataset), generator=generator).tolist()

    def state_dict(self):
        consumed = self.remaining[:self.local_done * self.size]
        return {"epoch": self.epoch, "processed": self.processed + consumed}

    def load_state_dict(self, state):
        self.epoch, self.processed = state["epoch"], list(state["processed"])
        self.reset()

    def __iter__(self):
        return iter(self.indices[self.local_done:])

    def __len__(self):
        return len(self.indices) - self.local_done
