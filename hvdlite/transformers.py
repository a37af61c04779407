"""Hugging Face's Trainer on hvdlite, elastic in-process (docs/transformers.md).

`ElasticTrainer` is `transformers.Trainer` with one difference, in an elastic `hvdlite run` job
only: its training loop runs inside @hvd.elastic.run. Everything the loop carries from one
optimizer step to the next is in a TorchState (model, optimizer, LR scheduler, the data's place,
the Trainer's state, every rank's generators), committed every `commit_every` optimizer steps
and at each epoch's end. When a worker dies the survivors roll back to the last commit, the
world re-forms, and the same Trainer loop starts again from the commit, in the same processes,
with the same model, optimizer and loader objects (DDP moves onto the new world in place); a
worker that joins is synced at the next commit. Outside an elastic job it is the Trainer.

Import it before making TrainingArguments: in an elastic job the import joins the hvdlite
world, which becomes torch's default group, so that Accelerate finds it instead of making an
env:// group of its own (one that a re-form could not resize).
Needs `pip install 'hvdlite[transformers]'`.
"""
import dataclasses
import math
import os

from hvdlite.worker import env

if os.environ.get(env.TEMPLATE):  # a forked worker would find it imported and never join below
    raise ImportError("hvdlite.transformers joins the world when a worker imports it, so it cannot be "
                      "preloaded: preload transformers.trainer,accelerate instead")

import torch.distributed as dist
from accelerate.data_loader import BatchSamplerShard
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedDataParallelKwargs
from transformers import Trainer, TrainerCallback, TrainerState
from transformers.trainer_utils import has_length

import hvdlite.torch as hvd


def _elastic() -> bool:
    return os.environ.get(env.ELASTIC) == "1"


if _elastic():
    hvd.init()  # before TrainingArguments make Accelerate's PartialState: see the module's doc


def refresh_accelerate() -> None:
    """Make Accelerate's cached world the current one. PartialState and AcceleratorState keep
    num_processes and process_index, read once from torch.distributed, in dicts every instance
    shares; after a re-form they would name the old world (TrainingArguments.world_size,
    Accelerator.gather, the loaders' shards read them)."""
    now = {"num_processes": dist.get_world_size(), "process_index": dist.get_rank(),
           "local_process_index": hvd.local_rank()}
    for shared in (PartialState._shared_state, AcceleratorState._shared_state):
        if shared:  # made already
            shared.update(now)


class _Progress(TrainerCallback):
    """Puts the committed loss bookkeeping back once the loop has reset it, and places each
    optimizer step in its epoch by the samples the world trained (the Trainer's own count
    starts over when a resumed epoch's loader holds only the batches left)."""

    def __init__(self, trainer: "ElasticTrainer"):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if self.trainer.elastic_state is not None:
            self.trainer._put_progress()

    def on_step_end(self, args, state, control, **kwargs):
        sampler = self.trainer._sampler
        if self.trainer.elastic_state is not None:
            trained = len(sampler.processed) + self.trainer._batches_done * args.train_batch_size * sampler.size
            state.epoch = sampler.epoch + min(trained, len(sampler.dataset)) / len(sampler.dataset)


@dataclasses.dataclass
class _ElasticDDPKwargs(DistributedDataParallelKwargs):
    """DDP's constructor runs collectives (a check of shapes, a broadcast): a worker that joins
    a running job builds its model while its peers sync the state in run(), and the two would
    not match. run() broadcasts the root's parameters on every world instead. (Accelerate takes
    only its own handler classes as Accelerator(kwargs_handlers=...): this one replaces the
    Trainer's after.)"""

    init_sync: bool = True


class ElasticTrainer(Trainer):
    """transformers.Trainer, elastic in-process under `hvdlite run --min-np/--max-np ...`.

    commit_every: commit every that many optimizer steps (and at each epoch's end); a lost
    worker costs the steps since the last commit. By default a tenth of an epoch of the first
    world, rounded up: a failure loses at most about a tenth of an epoch, for about ten copies
    of the model and optimizer state an epoch. Every other argument is the Trainer's."""

    def __init__(self, *args, commit_every: int = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.commit_every = commit_every
        self.elastic_state = None  # the TorchState, while an elastic train() runs
        self._sampler = None  # the ElasticSampler behind the training loader
        self._loader = None  # the prepared training loader, kept across re-forms
        self._batches_done = 0  # micro-batches trained since the sampler's split
        self._lr_plan = None  # the step count this process's LR scheduler was made for
        self._committed_step = None  # the global step of this process's last commit
        self.add_callback(_Progress(self))

    # -- what an elastic job changes in the Trainer's setup --------------------------------

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        given = self.accelerator.ddp_handler
        if _elastic() and given is not None:
            self.accelerator.ddp_handler = _ElasticDDPKwargs(init_sync=False, **given.to_kwargs())

    def _get_train_sampler(self, train_dataset=None):
        if not _elastic():
            return super()._get_train_sampler(train_dataset)
        if self._sampler is None:
            shuffle = self.args.train_sampling_strategy != "sequential"
            seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
            self._sampler = hvd.elastic.ElasticSampler(train_dataset or self.train_dataset, shuffle=shuffle, seed=seed)
        return self._sampler

    def get_train_dataloader(self):
        if self._loader is not None:
            return self._loader  # the same loader on every world: its sampler re-splits itself
        loader = super().get_train_dataloader()
        if _elastic():
            # ElasticSampler splits the data among the ranks already, in equal shares: Accelerate's
            # own shard of its batches must pass them all through (as the Trainer does for its
            # rank-aware BatchRebalanceSampler), and not fill a short last batch from the first
            # samples of the share (even_batches), which would train them twice in the epoch.
            shard = getattr(loader, "batch_sampler", None)
            if isinstance(shard, BatchSamplerShard):
                shard.num_processes, shard.process_index, shard.even_batches = 1, 0, False
        return loader

    # -- the elastic loop -------------------------------------------------------------------

    def _inner_training_loop(self, batch_size=None, args=None, resume_from_checkpoint=None, trial=None,
                             ignore_keys_for_eval=None):
        if not _elastic():
            return super()._inner_training_loop(batch_size, args, resume_from_checkpoint, trial, ignore_keys_for_eval)
        if resume_from_checkpoint is not None:
            raise ValueError("ElasticTrainer: resume an elastic job from hvdlite's commits (hvdlite run "
                             "--checkpoint-dir), not from a Trainer checkpoint (resume_from_checkpoint)")
        if args.auto_find_batch_size:
            raise ValueError("ElasticTrainer: auto_find_batch_size is not supported in an elastic job")
        if not has_length(self.train_dataset):
            raise ValueError("ElasticTrainer: an elastic job splits the epoch's samples among the workers: "
                             "train_dataset needs a length (an IterableDataset has none)")
        self.elastic_state = self._prepare_once(args, trial)
        inner = super()._inner_training_loop

        @hvd.elastic.run
        def train(state):
            refresh_accelerate()
            self._take_plan(state)
            self.commit_every = state.commit_every
            self.state = TrainerState(**state.trainer_state)
            if not self._sampler.remaining:  # committed at an epoch's end: the loop starts at the next
                self._sampler.set_epoch(self._sampler.epoch + 1)
            return inner(batch_size, args, None, trial, ignore_keys_for_eval)

        try:
            return train(self.elastic_state)
        finally:
            self.elastic_state = None

    def _prepare_once(self, args, trial):
        """Make the loader, the DDP model, the optimizer and the LR scheduler as the Trainer
        makes them, once: every world after the first goes on with the same objects."""
        loader = self.get_train_dataloader()
        epochs, per_epoch, *_, max_steps = super().set_initial_training_values(args, loader)
        super()._init_training_state(max_steps, per_epoch, epochs, None, trial)
        model, self._loader = super()._prepare_for_training(max_steps, loader, None)
        self._lr_plan = max_steps
        if self.commit_every is None:
            self.commit_every = max(1, math.ceil(per_epoch / 10))
        objects = {"model": model, "optimizer": self.optimizer, "lr_scheduler": self.lr_scheduler,
                   "sampler": self._sampler}
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None:
            objects["scaler"] = scaler  # kept in place by its state_dict (statehandlers.handler_for)
        # commit_every and the LR plan are the first world's on every rank: a worker that joins
        # would compute them for its own world
        return hvd.elastic.TorchState(**objects, trainer_state=dataclasses.asdict(self.state),
                                      lr_plan=max_steps, commit_every=self.commit_every, progress=self._progress())

    def _take_plan(self, state):
        """Every rank steps its LR scheduler on the first world's plan: a worker that joined (or
        a job resumed from disk on another world) made its scheduler for its own step count."""
        if self._lr_plan != state.lr_plan:
            synced, self.lr_scheduler = self.lr_scheduler, None
            rates = [group["lr"] for group in self.optimizer.param_groups]  # the synced ones
            self.create_scheduler(num_training_steps=state.lr_plan)  # sets the rates of its step 0
            self.lr_scheduler.load_state_dict(synced.state_dict())
            for group, rate in zip(self.optimizer.param_groups, rates):
                group["lr"] = rate
            state.lr_scheduler, self._lr_plan = self.lr_scheduler, state.lr_plan
            self.callback_handler.lr_scheduler = self.lr_scheduler

    def _progress(self) -> dict:
        return {"tr_loss": float(self._tr_loss) if hasattr(self, "_tr_loss") else 0.0,
                "total_loss": getattr(self, "_total_loss_scalar", 0.0),
                "last_logged": getattr(self, "_globalstep_last_logged", 0),
                "first_step": getattr(self, "_initial_global_step", 0), "flos": self.current_flos}

    def _put_progress(self):
        progress = self.elastic_state.progress
        self._tr_loss.fill_(progress["tr_loss"])
        self._total_loss_scalar, self._globalstep_last_logged = progress["total_loss"], progress["last_logged"]
        self._initial_global_step, self.current_flos = progress["first_step"], progress["flos"]

    def commit(self):
        """Commit now (a collective: every rank at the same optimizer step)."""
        state = self.elastic_state
        self._sampler.record_batch(self._batches_done - 1, self.args.train_batch_size)
        state.trainer_state, state.progress = dataclasses.asdict(self.state), self._progress()
        state.commit()
        self._committed_step = self.state.global_step

    # The Trainer's loop, entered again on every world: it goes on from the state's commit.

    def set_initial_training_values(self, args, dataloader):
        values = super().set_initial_training_values(args, dataloader)
        if self.elastic_state is None:
            return values
        epochs, _, examples, samples, total_batch, _, _ = values
        sampler, accumulate = self._sampler, args.gradient_accumulation_steps
        whole = math.ceil(math.ceil(len(sampler.dataset) / sampler.size) / args.train_batch_size)
        per_epoch = math.ceil(whole / accumulate)  # this world's optimizer steps in a whole epoch
        left = math.ceil(len(dataloader) / accumulate)  # those left in the sampler's epoch
        done = self.elastic_state.trainer_state["global_step"]
        if args.max_steps > 0:
            max_steps = args.max_steps
            epochs = sampler.epoch + 1 + math.ceil(max(0, max_steps - done - left) / per_epoch)
        else:
            max_steps = done + left + (epochs - sampler.epoch - 1) * per_epoch
        return epochs, per_epoch, examples, samples, total_batch, whole, max_steps

    def _init_training_state(self, max_steps, num_update_steps_per_epoch, num_train_epochs,
                             resume_from_checkpoint, trial):
        if self.elastic_state is None:
            return super()._init_training_state(max_steps, num_update_steps_per_epoch, num_train_epochs,
                                                resume_from_checkpoint, trial)
        self.state.compute_steps(self.args, max_steps)
        self.state.init_training_references(self, max_steps, num_train_epochs, trial)
        return self._sampler.epoch, 0

    def _prepare_for_training(self, max_steps, train_dataloader, resume_from_checkpoint):
        if self.elastic_state is None:
            return super()._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)
        return self.model_wrapped, self._loader  # prepared once; the state's sync moved DDP onto this world

    def _run_epoch(self, **kwargs):
        if self.elastic_state is None:
            return super()._run_epoch(**kwargs)
        self._sampler.set_epoch(kwargs["epoch"])  # the epoch's samples not trained yet, on this world
        self._batches_done = 0
        batches = len(kwargs["train_dataloader"])
        kwargs.update(steps_in_epoch=batches,
                      num_update_steps_per_epoch=math.ceil(batches / self.args.gradient_accumulation_steps))
        super()._run_epoch(**kwargs)
        self.commit()  # at the epoch's end, its logs and checkpoint written

    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        self._batches_done += 1
        return loss

    def _maybe_log_save_evaluate(self, *args, **kwargs):
        super()._maybe_log_save_evaluate(*args, **kwargs)
        step = self.state.global_step
        if self.elastic_state is not None and step % self.commit_every == 0 and step != self._committed_step:
            self.commit()  # at an optimizer step's end (and again at the epoch's end: once more an epoch)
