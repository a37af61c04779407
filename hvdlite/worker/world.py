"""What a worker knows about its place in the current world (torch-free)."""
from dataclasses import dataclass, fields
import os

from hvdlite.worker import env


@dataclass(frozen=True)
class WorldInfo:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str
    round: int = 0  # rendezvous round; names the store scope of this world
    updates: int = 0  # host updates the driver had announced when this world formed
    handover: bool = False  # the world only hands the state over: leave it once synced
    again: int = 0  # times this process joined this round before (init after shutdown)
    root: int = 0  # the rank holding the newest commit: every rank syncs the state from it

    @classmethod
    def from_env(cls, environ=os.environ) -> "WorldInfo":
        try:
            return cls(
                rank=int(environ[env.RANK]), size=int(environ[env.SIZE]),
                local_rank=int(environ[env.LOCAL_RANK]), local_size=int(environ[env.LOCAL_SIZE]),
                cross_rank=int(environ[env.CROSS_RANK]), cross_size=int(environ[env.CROSS_SIZE]),
                hostname=environ.get(env.HOSTNAME, ""), round=int(environ.get(env.ROUND, "0")))
        except KeyError as e:
            raise RuntimeError(
                f"hvdlite: {e.args[0]} is not set; start this script with `hvdlite run`") from None

    @property
    def store_scope(self) -> str:
        """KV scope of this world's gloo bootstrap. A new one per round: gloo never deletes
        its keys, and a group built under an old scope would read stale addresses: so is a
        process's init() after shutdown() in the same round (every rank inits alike)."""
        return f"gloo.{self.round}" + (f".{self.again}" if self.again else "")

    def to_dict(self) -> dict:
        # Not asdict(): its deep copies cost the driver a quarter of a second per 1000-rank world.
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def env(self) -> dict:
        """The variables that hand this place to a worker: hvdlite's, Horovod's and torchrun's names."""
        ours = {
            env.HOSTNAME: self.hostname, env.RANK: str(self.rank), env.SIZE: str(self.size),
            env.LOCAL_RANK: str(self.local_rank), env.LOCAL_SIZE: str(self.local_size),
            env.CROSS_RANK: str(self.cross_rank), env.CROSS_SIZE: str(self.cross_size),
        }
        return {**ours, env.ROUND: str(self.round),
                **{env.HOROVOD[k]: v for k, v in ours.items()},
                **{name: ours[k] for name, k in env.TORCH.items()}}
