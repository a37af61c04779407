"""Elastic training on the torch backend: `@run`, State, ObjectState, TorchState and
ElasticSampler. The reset protocol lives in hvdlite.worker.elastic; this binds it to torch.
"""
import torch
import torch.distributed as dist

from hvdlite.torch import basics, generators, gradients, ops, runtime
from hvdlite.torch.sampler import ElasticSampler  # noqa: F401
from hvdlite.torch.statehandlers import (  # noqa: F401
    GeneratorHandler, StateHandler, get_handler_registry, handler_for, register_handler, set_handler_registry)
from hvdlite.worker import elastic as core
from hvdlite.worker import generators as saved_generators
from hvdlite.worker.elastic import run  # noqa: F401
from hvdlite.worker.trusted import trust  # noqa: F401


def _agree_flag(value: int) -> int:
    return int(ops.allreduce_(torch.tensor([value], dtype=torch.int32), op=ops.Max).item())


def _gloo_failed(error: BaseException) -> bool:
    """A collective torch ran on the world's group failed in gloo (a peer died, hung or was cut
    off): torch raises gloo's text, "[.../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read
    error ...", as a RuntimeError or a DistError."""
    return isinstance(error, dist.DistError) or "/gloo/" in str(error).split("]", 1)[0]


BACKEND = core.Backend(init=basics.init, join=basics.join, shutdown=basics.leave, abort=basics.abort,
                       info=runtime.info, agree_flag=_agree_flag,
                       broadcast_object=ops.broadcast_object, world_broke=_gloo_failed,
                       allgather_object=ops.allgather_object, capture_generators=generators.capture,
                       put_generators=generators.put)


class State(core.State):
    """Training state that survives resets: commit() saves it, restore() goes back to it."""

    backend = BACKEND


class ObjectState(core.ObjectState, State):
    """State made of plain picklable attributes: ObjectState(epoch=0, batch=0)."""


class TorchState(ObjectState):
    """Every keyword with a state handler is kept as the object given and saved, restored and
    synced in place: models, optimizers, LR schedulers, ElasticSamplers, registered types, any
    object with state_dict() and load_state_dict() (a GradScaler, a user class), and the
    script's own generators (torch.Generator, numpy's Generator, random.Random: each rank's
    own, like the global ones). The other keywords are plain values, saved by deep copy. The
    gradients of the models' and optimizers' parameters are in the commit too (gradients.py).

    TorchState(model=gen, optimizer=opt_g, disc=disc, opt_d=opt_d, sched=scheduler,
               scaler=scaler, noise=torch.Generator().manual_seed(1), epoch=0)
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        values = dict(kwargs)
        if model is not None:
            values["model"] = model
        if optimizer is not None:
            values["optimizer"] = optimizer
        handlers = {name: handler_for(value) for name, value in values.items()}
        self._handlers = {name: h for name, h in handlers.items() if h is not None}
        for name, handler in self._handlers.items():
            object.__setattr__(self, name, handler.value)
        self._gradients = gradients.Gradients([h.value for h in self._handlers.values()])
        super().__init__(**{k: v for k, v in values.items() if k not in self._handlers})

    def __setattr__(self, name, value):
        handler = self.__dict__.get("_handlers", {}).get(name)
        if handler is not None:
            handler.set_value(value)
        super().__setattr__(name, value)

    # The generators are captured after the handlers save and put back after they restore: a
    # StatefulDataLoader's state_dict() may make its iterator, which draws from torch's generator.
    def save(self):
        for handler in self._handlers.values():
            handler.save()
        self._gradients.save()
        super().save()
        self._put_back_with_own()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        self._gradients.restore()
        super().restore()
        self._put_back_with_own()

    def _put_back_with_own(self):
        """A loader's iterator made after a restore may draw from a generator of the script's
        (its generator=) as from the global ones: generators.put_back() puts both back."""
        own = [h for h in self._handlers.values() if isinstance(h, GeneratorHandler)]
        put = self.backend.put_generators

        def put_all(states):
            put(states)
            for handler in own:
                handler.restore()
        saved_generators.saved(put_all, self._saved_generators)

    def _rank_now(self):
        return {**super()._rank_now(), "gradients": self._gradients.checksum(),
                "handlers": {name: h.current() for name, h in self._handlers.items() if h.per_rank}}

    def _every_rank_now(self):
        parts = super()._every_rank_now()
        grads = self._gradients.every_rank([part.pop("gradients") for part in parts], self.backend.allgather_object)
        for part, rank_grads in zip(parts, grads or []):
            part["grads"] = rank_grads
        return parts

    def _put_rank_saved(self, saved):
        for name, handler in self._handlers.items():
            if handler.per_rank:
                handler.load_saved(saved["handlers"][name])
                handler.restore()
        if "grads" in saved:
            self._gradients.put_rank_saved(saved["grads"])
        super()._put_rank_saved(saved)
        self._put_back_with_own()

    def _snapshot(self):
        """Rank 0's parts whichever rank takes it: each rank's own (per-rank handlers, gradients
        not reduced yet) from the commit's parts by rank, so a survivor of rank 0 writes what rank
        0 would have (durable.finish); the rest is alike on every rank (the root's after a sync)."""
        commit, snapshot = super()._snapshot()
        first = self._every_rank[0] if self._every_rank else {}
        parts = first.get("handlers", {})
        handlers = {name: parts[name] if h.per_rank and name in parts else h.saved()
                    for name, h in self._handlers.items()}
        gradients = self._gradients.saved()
        if "grads" in first:
            gradients = {**gradients, "grads": first["grads"]}
        return commit, {**snapshot, "handlers": handlers, "gradients": gradients}

    def _load_snapshot(self, commit, snapshot):
        saved = snapshot.get("handlers", {})
        if sorted(saved) != sorted(self._handlers):
            raise RuntimeError(f"hvdlite: the checkpoint holds the objects {sorted(saved)}, this "
                               f"script's TorchState holds {sorted(self._handlers)}")
        for name, handler in self._handlers.items():
            handler.load_saved(saved[name])
        self._gradients.load_saved(snapshot.get("gradients"))
        super()._load_snapshot(commit, snapshot)  # restores everything

    def sync(self):
        root = self.backend.info().root
        for name, handler in self._handlers.items():  # the same order on every rank
            with ops.syncing_from(root, f"the state handler {type(handler).__name__} of {name!r}"):
                handler.sync()
        self._gradients.sync(root)
        super().sync()  # saves everything once synced
