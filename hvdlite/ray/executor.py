"""RayExecutor: horovod.ray's executor (0.28.1's signature and names) on hvdlite's driver.

Each run() is one hvdlite job on the Ray cluster, driven from this process: one actor and worker
process per slot (hvdlite run --ray), the function sent through the job's KV store, each rank's
result read back from it. Elastic when min_workers is given, as in horovod.ray.
"""
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import cloudpickle

from hvdlite import defaults
from hvdlite.discovery.raynodes import connect
from hvdlite.driver.eventlog import EventLog
from hvdlite.driver.job import Job
from hvdlite.driver.settings import Settings
from hvdlite.errors import HvdliteError
from hvdlite.ray.worker import SCOPE, with_executable

LOG_POLL = 0.1  # seconds between looks for values rank 0 logged for the callbacks


@dataclass
class RaySettings:
    """What create_settings makes (horovod.ray's MiniSettings): timeout_s bounds a worker's
    start and the first world's forming; the SSH and placement-group fields are kept so that
    horovod.ray code runs, and unused (actors need no SSH; slots are pinned to nodes)."""
    timeout_s: int = 30
    ssh_identity_file: Optional[str] = None
    placement_group_timeout_s: int = 100
    nics: Optional[set] = None
    verbose: int = 1
    elastic: bool = False


class WorkerError(RuntimeError):
    """A rank's function raised; `rank` and `error` (its type and message) say which and what."""

    def __init__(self, rank: int, error: str):
        super().__init__(f"rank {rank} raised {error}")
        self.rank, self.error = rank, error


class RayExecutor:
    @classmethod
    def create_settings(cls, timeout_s=30, ssh_identity_file=None, ssh_str=None,
                        placement_group_timeout_s=100, nics=None) -> RaySettings:
        return RaySettings(timeout_s=timeout_s, ssh_identity_file=ssh_identity_file,
                           placement_group_timeout_s=placement_group_timeout_s, nics=nics)

    def __init__(self, settings, num_workers: Optional[int] = None, num_hosts: Optional[int] = None,
                 num_workers_per_host: int = 1, cpus_per_worker: int = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[int] = None, use_current_placement_group: bool = True,
                 min_workers: int = None, max_workers: int = None, reset_limit: int = None,
                 cooldown_range: List[int] = None, elastic_timeout: int = 600,
                 override_discovery: bool = True):
        if max_workers and (not min_workers or min_workers <= 0):
            raise ValueError("max_workers needs a positive min_workers: an elastic job needs both")
        if min_workers and num_workers:
            raise ValueError("give num_workers (a fixed job) or min_workers (an elastic one), not both")
        if gpus_per_worker and not use_gpu:
            raise ValueError("gpus_per_worker is set but use_gpu is False")
        if num_workers is None and num_hosts:
            num_workers = num_hosts * num_workers_per_host  # slots are packed per node as they come
        if not num_workers and not min_workers:
            raise ValueError("give num_workers (or num_hosts) or min_workers")
        self.settings = settings
        self.num_workers, self.min_workers, self.max_workers = num_workers, min_workers, max_workers
        self.cpus_per_worker, self.use_gpu = cpus_per_worker, use_gpu
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.reset_limit, self.cooldown_range = reset_limit, cooldown_range
        self.elastic_timeout = elastic_timeout
        self.settings.elastic = min_workers is not None
        self._executable = None  # (class, args, kwargs) each worker makes for execute()
        self._env = {}
        self._job = None  # the job of a run under way, for shutdown()
        self._ray = None

    def start(self, executable_cls: type = None, executable_args: Optional[List] = None,
              executable_kwargs: Optional[Dict] = None, extra_env_vars: Optional[Dict] = None):
        """Connect to the Ray cluster ($RAY_ADDRESS, else the one on this machine)."""
        self._ray = connect(None)
        self._executable = (executable_cls, executable_args or [], executable_kwargs or {})
        self._env = dict(extra_env_vars or {})

    def run(self, fn: Callable[..., Any], args: Optional[List] = None, kwargs: Optional[Dict] = None,
            callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """fn(*args, **kwargs) on every worker; each rank's return value, in rank order.
        Every value rank 0 passes to hvdlite.ray.log() goes to every callback."""
        return self._call((fn, list(args or []), dict(kwargs or {})), callbacks)

    def execute(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """fn(executable) on every worker, the executable made from start()'s executable_cls."""
        cls, args, kwargs = self._executable or (None, [], {})
        return self._call((with_executable, [fn, cls, args, kwargs], {}), callbacks)

    def shutdown(self):
        """End a run still under way (its actors and workers with it)."""
        job = self._job
        if job is not None:
            job.close()
        self._job = None

    # ---- one job per call ---------------------------------------------------------------
    def _call(self, call, callbacks):
        if self._ray is None:
            raise RuntimeError("call start() first")
        job = _CallJob(self._job_settings(), EventLog(on_console=bool(self.settings.verbose > 1)),
                       cloudpickle.dumps(call))
        self._job = job
        done = threading.Event()
        relay = threading.Thread(target=job.relay_logs, args=(callbacks or [], done), daemon=True)
        relay.start()
        try:
            try:
                code, failure = (job.run_elastic() if self.settings.elastic else job.run_static()), None
            except HvdliteError as e:
                code, failure = e.exit_code, str(e)
            results = job.results()
        finally:
            done.set()
            relay.join(5)
            job.close()
            self._job = None
        for rank, (kind, value) in sorted(results.items()):
            if kind == "error":
                raise WorkerError(rank, value)
        if code != 0:
            raise RuntimeError(failure or f"the job failed (exit code {code})")
        return [value for _, (_, value) in sorted(results.items())]

    def _job_settings(self) -> Settings:
        elastic = self.settings.elastic
        return Settings(
            command=[sys.executable, "-m", "hvdlite.ray.worker"], launcher="ray",
            num_proc=None if elastic else self.num_workers, elastic=elastic,
            min_np=self.min_workers if elastic else self.num_workers, max_np=self.max_workers,
            reset_limit=self.reset_limit, elastic_timeout=self.elastic_timeout,
            cooldown_range=tuple(self.cooldown_range) if self.cooldown_range else None,
            start_timeout=float(self.settings.timeout_s or defaults.START_TIMEOUT),
            cpus_per_slot=float(self.cpus_per_worker), gpus_per_slot=float(self.gpus_per_worker),
            log_level="INFO" if self.settings.verbose > 1 else "WARNING",
            env={**os.environ, **{k: str(v) for k, v in self._env.items()}})


class _CallJob(Job):
    """A job whose workers run one call: it waits in the KV store when the server starts."""

    def __init__(self, settings, log, call: bytes):
        super().__init__(settings, log)
        self._call_bytes = call
        self._served = threading.Event()
        self._labels = {}  # worker -> the rank its output was labelled with last, once it ended

    def start_server(self, remote_possible: bool):
        super().start_server(True)  # the workers are on Ray nodes
        self.executor.on_forget = self._labels.__setitem__
        self.server.put(SCOPE, "call", self._call_bytes)
        self._served.set()

    def results(self) -> dict:
        """rank -> ("value", v) or ("error", "Type: message"), of every worker that finished;
        a worker's rank is the last one its output was labelled with."""
        if self.server is None or self.executor is None:
            return {}
        out = {}
        labels = {**self._labels, **{w: o.label for w, o in self.executor.outputs.items()}}
        for worker, label in labels.items():
            raw = self.server.get(SCOPE, f"result.{worker}")
            if raw is not None and label.isdigit():
                out[int(label)] = cloudpickle.loads(raw)
        return out

    def relay_logs(self, callbacks, done: threading.Event):
        """Hand each value rank 0 logged to every callback, in order, until the job ended."""
        while not self._served.wait(LOG_POLL):
            if done.is_set():
                return
        seen = 0
        while True:
            finished = done.is_set()
            while (raw := self.server.get(SCOPE, f"log.{seen + 1}")) is not None:
                seen += 1
                value = cloudpickle.loads(raw)
                for callback in callbacks:
                    callback(value)
            if finished:
                return
            done.wait(LOG_POLL)
