"""Lightning on hvdlite: `Trainer(strategy=HvdliteStrategy(), accelerator="cpu")` under
`hvdlite run -np N` trains with DDP on the hvdlite world (docs/lightning.md).

The strategy is Lightning's DDPStrategy with hvdlite's place for every rank: its ranks come from
hvdlite (so `devices` and `num_nodes` need not repeat what `-np` and `-H` said), and its process
group is the world hvd.init() joins, torch's default group after it (hvdlite.torch.defaultgroup).
Needs `pip install 'hvdlite[lightning]'`.
"""
import os

import torch
from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.pytorch.strategies import DDPStrategy

import hvdlite.torch as hvd
from hvdlite.worker import env
from hvdlite.worker.world import WorldInfo


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


class HvdliteStrategy(DDPStrategy):
    """DDPStrategy on the hvdlite world; keyword arguments are DDPStrategy's (and so DDP's)."""

    strategy_name = "hvdlite"

    def __init__(self, **kwargs):
        super().__init__(cluster_environment=HvdliteEnvironment(), **kwargs)

    def setup_distributed(self) -> None:
        hvd.init()  # the world becomes torch's default group: DDPStrategy's own init is skipped
        super().setup_distributed()

    @property
    def root_device(self) -> torch.device:
        return torch.device("cpu")  # gloo's: one process per worker, whatever `devices` says

    @property
    def distributed_sampler_kwargs(self) -> dict:
        return {"num_replicas": self.world_size, "rank": self.global_rank}
