"""What a job was asked to do: every knob of `hvdlite run`, with its default (hvdlite.defaults)."""
import math
import os
from dataclasses import dataclass, field, fields

from hvdlite import defaults
from hvdlite.errors import UsageError


@dataclass
class Settings:
    command: list
    num_proc: int = None
    hosts: list = None  # [(name, slots)] in order; None with a discovery script
    start_timeout: float = defaults.START_TIMEOUT
    liveness_timeout: float = defaults.LIVENESS_TIMEOUT
    driver_grace: float = defaults.DRIVER_GRACE  # with checkpoint_dir: workers train on without a driver
    collective_timeout: float = defaults.COLLECTIVE_TIMEOUT
    hang_timeout: float = None  # None: derived from the job's stalls (decisions/hangs.py) ...
    hang_floor: float = defaults.HANG_FLOOR  # ... never below this
    straggler_factor: float = defaults.STRAGGLER_FACTOR  # decisions/stragglers.py
    straggler_policy: str = "warn"  # or "evict" (elastic jobs)
    event_log: str = None
    elastic: bool = False
    min_np: int = None
    max_np: int = None
    slots_per_host: int = None
    discovery_script: str = None
    discovery_timeout: float = defaults.DISCOVERY_TIMEOUT
    discovery_interval: float = defaults.DISCOVERY_INTERVAL
    reset_limit: int = None
    cooldown_range: tuple = None
    blacklist: str = defaults.BLACKLIST
    elastic_timeout: float = defaults.ELASTIC_TIMEOUT
    stop_timeout: float = defaults.STOP_TIMEOUT  # a graceful stop's bound (docs/signals.md)
    fail_on_worker_failure: bool = False  # a finished job that had a failed worker exits 1
    output_dir: str = None
    verbose: bool = False
    log_level: str = "INFO"
    network_interfaces: list = None
    bind_address: str = None
    ssh_port: int = None
    ssh_identity_file: str = None
    ssh_accept_unknown_hosts: bool = False
    ssh_config: str = None
    launcher: str = None  # a kind of launchers.KINDS for every host; None: local or SSH by host
    ray_address: str = None  # with launcher "ray": "auto", HOST:PORT, or None ($RAY_ADDRESS, else auto)
    cpus_per_slot: float = 1.0  # what one slot takes of a Ray node ...
    gpus_per_slot: float = 0.0
    slot_resource: str = None  # ... or one unit of this Ray resource
    slurm: object = None  # the Slurm allocation (discovery.slurm.Allocation) the hosts come from
    metrics_port: int = None
    metrics_addr: str = None  # default: where the rendezvous binds
    timeline_filename: str = None  # per-rank collective trace (Chrome trace JSON)
    preload: tuple = None  # modules a worker template imports; empty: no template
    preload_first: bool = False  # the first world's workers fork from it too (--preload)
    keep_warm: float = 0.0  # seconds a kept template waits idle after the job; 0: none
    checkpoint_dir: str = None  # absolute; None: commits live only in the workers' memory
    checkpoint_interval: float = defaults.CHECKPOINT_INTERVAL
    checkpoint_keep: int = defaults.CHECKPOINT_KEEP
    checkpoint_lineage: str = None  # --fresh: the lineage this job starts; None: resume the newest
    driver_store: str = None  # --driver-store URL (store/choice.py); None: the FileStore in checkpoint_dir
    standby: bool = False  # wait for the job's lease, then take the job over (driver/standby.py)
    backend: str = None  # --backend (worker/backends.py); None: the workers' HVDLITE_BACKEND, else auto
    env: dict = field(default_factory=lambda: dict(os.environ))

    @property
    def joins_possible(self) -> bool:
        """Workers can join the running job: through discovery, or a slot back from a cooldown."""
        return bool(self.discovery_script or self.cooldown_range or self.launcher == "ray")

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            numbers = value if f.name == "cooldown_range" and value else [value]
            for number in numbers:
                if isinstance(number, float) and not math.isfinite(number):
                    raise UsageError(f"--{f.name.replace('_', '-')} must be a finite number, got {number}")
