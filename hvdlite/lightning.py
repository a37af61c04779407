"""Lightning on hvdlite: `Trainer(strategy=HvdliteStrategy(), accelerator="cpu")` under
`hvdlite run -np N` trains with DDP on the hvdlite world (docs/lightning.md).

The strategy is Lightning's DDPStrategy with hvdlite's place for every rank: its ranks come from
hvdlite (so `devices` and `num_nodes` need not repeat what `-np` and `-H` said), and its process
group is the world hvd.init() joins, torch's default group after it (hvdlite.torch.defaultgroup).

In an elastic job `fit` runs inside @hvd.elastic.run: a commit is Lightning's own checkpoint of
the trainer, kept in memory (at every epoch's end, and every `commit_every` batches); when the
world breaks or changes, the fit in progress ends, the world re-forms, every rank takes rank
0's commit, and `fit` starts again from it, in the same process, on the new world.
Needs `pip install 'hvdlite[lightning]'`.
"""
import copy
import os

import torch
from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.strategies.launchers.launcher import _Launcher

import hvdlite.torch as hvd
from hvdlite.worker import env
from hvdlite.worker.world import WorldInfo

COMMIT = "hvdlite-last-commit"  # the ckpt_path that resumes a fit from the state's last commit


class HvdliteEnvironment(ClusterEnvironment):
    """A worker's place as `hvdlite run` gave it; ranks are the current world's once joined."""

    @property
    def creates_processes_externally(self) -> bool:
        return True  # hvdlite run starts every worker

    @property
    def main_address(self) -> str:
        return os.environ["MASTER_ADDR"]

    @property
    def main_port(self) -> int:
        return int(os.environ["MASTER_PORT"])

    @staticmethod
    def detect() -> bool:
        return env.RENDEZVOUS_ADDR in os.environ

    def _place(self) -> WorldInfo:
        return hvd.runtime.info() if hvd.is_initialized() else WorldInfo.from_env()

    def world_size(self) -> int:
        return self._place().size

    def set_world_size(self, size: int) -> None:
        pass  # hvdlite's to say

    def global_rank(self) -> int:
        return self._place().rank

    def set_global_rank(self, rank: int) -> None:
        pass  # hvdlite's to say

    def local_rank(self) -> int:
        return self._place().local_rank

    def node_rank(self) -> int:
        return self._place().cross_rank


class FitState(hvd.elastic.State):
    """What an elastic fit rolls back to: the trainer's checkpoint at the last commit."""

    def __init__(self, trainer):
        super().__init__()
        self.trainer, self.checkpoint = trainer, None

    def save(self):
        dump = self.trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        self.checkpoint = copy.deepcopy(dump)  # its tensors are the live ones

    def restore(self):
        pass  # the next fit starts from self.checkpoint

    def sync(self):
        self.checkpoint, self._commits, self._lineage = hvd.broadcast_object(
            (self.checkpoint, self._commits, self._lineage), root_rank=self.backend.info().root)


class _Commits(Callback):
    def __init__(self, state: FitState, every: int):
        self.state, self.every = state, every

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.every and (batch_idx + 1) % self.every == 0:
            self.state.commit()

    def on_train_epoch_end(self, trainer, pl_module):
        self.state.commit()


class _FitLauncher(_Launcher):
    """Runs fit inside @hvd.elastic.run in an elastic job; anything else as it is."""

    def __init__(self, strategy: "HvdliteStrategy"):
        self.strategy = strategy

    @property
    def is_interactive_compatible(self) -> bool:
        return True

    def kill(self, signum) -> None:
        pass  # hvdlite run owns the processes

    def launch(self, function, *args, trainer=None, **kwargs):
        if os.environ.get(env.ELASTIC) != "1" or function.__name__ != "_fit_impl":
            return function(*args, **kwargs)
        state = self.strategy._fit_state = FitState(trainer)
        trainer.callbacks.append(_Commits(state, self.strategy.commit_every))

        @hvd.elastic.run
        def fit(state):
            given = list(args)
            if state.checkpoint is not None:
                given[4] = COMMIT  # _fit_impl(model, train, val, datamodule, ckpt_path, ...)
            try:
                return function(*given, **kwargs)
            except BaseException:
                trainer._teardown()  # unwrap the model, end the loaders: the next fit redoes them
                raise

        return fit(state)


class HvdliteStrategy(DDPStrategy):
    """DDPStrategy on the hvdlite world. `commit_every`: in an elastic job, commit every that
    many training batches too (a lost worker costs the batches since the last commit); the
    other keyword arguments are DDPStrategy's (and so DDP's)."""

    strategy_name = "hvdlite"

    def __init__(self, commit_every: int = 0, **kwargs):
        super().__init__(cluster_environment=HvdliteEnvironment(), **kwargs)
        self.commit_every = commit_every
        self._fit_state = None

    def _configure_launcher(self) -> None:
        self._launcher = _FitLauncher(self)

    def setup_distributed(self) -> None:
        hvd.init()  # the world becomes torch's default group: DDPStrategy's own init is skipped
        super().setup_distributed()

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        if checkpoint_path == COMMIT:
            return copy.deepcopy(self._fit_state.checkpoint)
        return super().load_checkpoint(checkpoint_path, weights_only=weights_only)

    @property
    def root_device(self) -> torch.device:
        return torch.device("cpu")  # gloo's: one process per worker, whatever `devices` says

    @property
    def distributed_sampler_kwargs(self) -> dict:
        return {"num_replicas": self.world_size, "rank": self.global_rank}
