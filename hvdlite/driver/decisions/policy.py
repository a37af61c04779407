"""The job's settings that the elastic core's decisions depend on."""
from dataclasses import dataclass
from typing import Optional

from hvdlite import defaults


@dataclass(frozen=True)
class Policy:
    """The settings the decisions depend on."""
    min_np: int = 1
    max_np: Optional[int] = None
    reset_limit: Optional[int] = None
    elastic_timeout: float = 600.0
    start_timeout: float = 30.0
    liveness_timeout: float = 5.0
    # Seconds of heartbeat silence (beats come every 0.5 s) after which the worker's node is
    # probed (nodeloss.py): a lost node is known within this and the probe's timeout.
    probe_after: float = defaults.PROBE_AFTER
    # Seconds after a break a member of the broken world is waited for while its stand-in beats
    # for it and its own heartbeat (every 0.5 s) is silent: pygloo holds its GIL inside a
    # collective of that world, maybe a send gloo never wakes before its own 30 s timeout. A
    # survivor whose connections were cut is back in milliseconds; two missed beats say it is not.
    held_grace: float = 1.0
    exit_grace: float = 30.0  # seconds a worker that said it is exiting may take
    stall: float = 1.0  # a gap between ticks this long means the driver itself was starved
    cooldown_range: Optional[tuple] = None
    blacklist: str = "auto"  # "host", "slot", or "auto": slot on a single-host job, else host
    stop_grace: float = 3.0  # seconds a removed worker gets between TERM and KILL
    durable: bool = False  # --checkpoint-dir: commits are on disk too
    stop_timeout: float = defaults.STOP_TIMEOUT  # seconds a graceful stop waits for commits
    hang_timeout: Optional[float] = None  # --hang-timeout; None: derived (hangs.py) ...
    hang_floor: float = defaults.HANG_FLOOR  # ... never below this
    collective_timeout: float = defaults.COLLECTIVE_TIMEOUT  # ... and below this (hangs.ceiling)
    straggler_factor: float = defaults.STRAGGLER_FACTOR  # stragglers.py
    # --fail-on-worker-failure: a job that finished with a worker failed on the way fails (CI)
    fail_on_worker_failure: bool = False
    straggler_evict: bool = False  # --straggler-policy evict: a persistent straggler is failed
