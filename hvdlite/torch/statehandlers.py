"""State handlers: how TorchState saves, restores and syncs each kind of object it holds.

A handler keeps the very object the script holds and works on it in place (load_state_dict),
so the script's own references stay valid across commits, rollbacks and syncs. The registry
maps types to handler classes, first match wins; set_handler_registry() replaces it, as in
Horovod, and register_handler() puts a user type in front.
"""
import abc
import copy
import contextlib
import random
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim import lr_scheduler

from hvdlite.torch import generators as torch_generators, ops, runtime
from hvdlite.torch.optimizer import broadcast_parameters, send_optimizer_state
from hvdlite.torch.sampler import ElasticSampler
from hvdlite.worker import generators

StatefulDataLoader = NodesLoader = None
with contextlib.suppress(ImportError):  # torchdata is optional
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.nodes import Loader as NodesLoader


class StateHandler(abc.ABC):
    """Subclass and implement save, restore and sync for `self.value`.

    per_rank: the value is each rank's own (a data loader's place in its rank's share), not
    the same on every rank: sync leaves it alone, and every commit gathers every rank's
    current(), so that a process taking a rank goes on from that rank's (TorchState)."""

    per_rank = False

    def __init__(self, value):
        self.value = value

    @property
    def root_rank(self) -> int:
        """The rank to sync from: the one holding the newest commit, not always rank 0 (ranks
        stay put across failures, docs/elastic.md)."""
        return runtime.info().root

    @abc.abstractmethod
    def save(self):
        """Remember the value's current state (commit)."""

    @abc.abstractmethod
    def restore(self):
        """Put the value back to the remembered state, in place."""

    @abc.abstractmethod
    def sync(self):
        """Make the value equal self.root_rank's on every rank, in place (a collective)."""

    def current(self):
        """What save() would remember now, without remembering it (per_rank handlers)."""
        raise NotImplementedError

    def saved(self):
        """What save() remembered, picklable, for a checkpoint: by default `self._saved`.
        It must not change once saved (a background writer reads it)."""
        return self._saved

    def load_saved(self, saved):
        """Take a checkpoint's saved(); restore() then puts it into the value."""
        self._saved = saved

    def set_value(self, value):
        """The script assigned a new object to the attribute: hold it, and commit it as is."""
        self.value = value
        self.save()


class StateDictHandler(StateHandler):
    """Any object with state_dict()/load_state_dict(); synced as one pickled object."""

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self):
        self.value.load_state_dict(ops.broadcast_object(self.value.state_dict(), root_rank=self.root_rank))


class ModelStateHandler(StateDictHandler):
    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=self.root_rank)  # in fused broadcasts


class DistributedModelHandler(ModelStateHandler):
    """A DistributedDataParallel model: a new world's sync gives it a new reducer on the
    world's default group (defaultgroup.py) before syncing it; the model object stays the
    script's. New on every rank, as torch's unpickling makes it: a survivor's reducer has its
    buckets rebuilt in the order its gradients came, a new process's has not yet, and the two
    would sum each other's gradients in other places (torch's _update_process_group keeps the
    buckets). A comm hook the script registered must be registered again (on_reset)."""

    def sync(self):
        model = self.value
        if model.process_group is not dist.group.WORLD:
            model._update_process_group(dist.group.WORLD)
            params, expect_sparse = model._build_params_for_reducer()
            model._ddp_init_helper(params, expect_sparse, model._build_debug_param_to_name_mapping(params),
                                   model.static_graph)
            if model.static_graph:
                model.reducer._set_static_graph()
        super().sync()


class OptimizerStateHandler(StateDictHandler):
    def sync(self):
        send_optimizer_state(self.value, root_rank=self.root_rank)


class SamplerStateHandler(StateDictHandler):
    def save(self):
        self._saved = self.value.state_dict()  # fresh lists already: no deep copy needed


class LoaderStateHandler(StateDictHandler):
    """torchdata's StatefulDataLoader: its place and its workers' datasets' states (those that
    keep one), each rank's own. A state loaded waits for the loop to make the next iterator
    (after the script's set_epoch), and a save meanwhile saves it as it is: the loader's own
    state_dict() would make that iterator at once. The first iterator made after a restore
    drew its base seed from torch's generator, a draw the uninterrupted run made before the
    commit: the generators are put back to the commit's right after (as ElasticSampler does)."""

    per_rank = True

    def __init__(self, value):
        super().__init__(value)
        self._pending = None  # the state loaded, until the loader makes its next iterator
        make_iterator = value._get_iterator  # where a StatefulDataLoader draws the seed

        def get_iterator():
            iterator = make_iterator()
            if self._pending is not None:
                self._pending = None
                generators.put_back()
            return iterator
        value._get_iterator = get_iterator

    def current(self):
        return self._pending if self._pending is not None else copy.deepcopy(self.value.state_dict())

    def save(self):
        self._saved = self.current()

    def restore(self):
        self._pending = copy.deepcopy(self._saved)
        self.value.load_state_dict(copy.deepcopy(self._pending))

    def sync(self):
        """Each rank's own, not synced (a rank taken over gets its part of the commit); the
        loop a reset re-enters goes on from the loader's place, not from the epoch's start."""
        if self._pending is None:
            self._saved = copy.deepcopy(self.value.state_dict())
            self.restore()


class RankStateDictHandler(StateDictHandler):
    """An object with state_dict()/load_state_dict() that is each rank's own (torchdata.nodes'
    Loader: its place in its rank's share): it travels with the commit's parts by rank."""

    per_rank = True

    def current(self):
        return copy.deepcopy(self.value.state_dict())

    def sync(self):
        """Each rank's own: a rank taken over gets its part of the commit (TorchState)."""


class GeneratorHandler(StateHandler):
    """A generator the script made (torch.Generator on any device, numpy's Generator,
    random.Random): each rank's own, captured with every commit like the global generators
    and put back in place on a rollback, a sync into a rank taken over, and a resume."""

    per_rank = True

    def __init__(self, value):
        super().__init__(value)
        self._saved = self.current()

    def current(self):
        if isinstance(self.value, torch.Generator):
            return torch_generators.state_of(self.value)
        if isinstance(self.value, random.Random):
            return generators.random_state(self.value)
        return copy.deepcopy(self.value.bit_generator.state)  # numpy: a dict (arrays in some)

    def save(self):
        self._saved = self.current()

    def restore(self):
        if isinstance(self.value, torch.Generator):
            torch_generators.put_state(self.value, self._saved)
        elif isinstance(self.value, random.Random):
            generators.put_random_state(self.value, self._saved)
        else:
            self.value.bit_generator.state = copy.deepcopy(self._saved)

    def sync(self):
        """Each rank's own, not synced."""


# Every scheduler of torch 2.x derives from LRScheduler (Horovod 0.28 names only the old
# _LRScheduler and so misses them).
_handler_registry = [
    (DistributedDataParallel, DistributedModelHandler),
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (lr_scheduler.LRScheduler, StateDictHandler),
    (ElasticSampler, SamplerStateHandler),
    (torch.Generator, GeneratorHandler),
    (random.Random, GeneratorHandler),
] + ([(StatefulDataLoader, LoaderStateHandler), (NodesLoader, RankStateDictHandler)]
     if StatefulDataLoader is not None else [])


def get_handler_registry():
    """The (type, handler class) pairs TorchState consults, in order."""
    return list(_handler_registry)


def set_handler_registry(registry):
    global _handler_registry
    _handler_registry = [(kind, handler) for kind, handler in registry]


def register_handler(kind, handler):
    """Handle instances of `kind` with `handler` (a StateHandler subclass), before all others."""
    set_handler_registry([(kind, handler)] + [(k, h) for k, h in _handler_registry if k is not kind])


def handler_for(value):
    """A handler for `value`, or None if it is a plain value (deep-copied by ObjectState):
    the registry's first match; else a generator of numpy's (numpy imported by the script);
    else any object with state_dict() and load_state_dict() (a GradScaler, a user class),
    kept in place and synced from the root like a scheduler."""
    for kind, handler in _handler_registry:
        if isinstance(value, kind):
            return handler(value)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.random.Generator):
        return GeneratorHandler(value)
    if not isinstance(value, type) and callable(getattr(value, "state_dict", None)) \
            and callable(getattr(value, "load_state_dict", None)):
        return StateDictHandler(value)
    return None
