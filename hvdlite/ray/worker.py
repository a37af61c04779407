"""The process RayExecutor starts in each slot: it runs the call the driver put in the job's
KV store and puts back what it returned or raised.

`log(value)` hands a value to the callbacks of RayExecutor.run, from rank 0 only. This module
runs on the nodes, on whatever Python runs the workers: hvdlite.worker and cloudpickle only.
"""
import os
import sys
import traceback

import cloudpickle

from hvdlite.worker import env
from hvdlite.worker.claim import job_secret
from hvdlite.worker.kvclient import KVClient

SCOPE = "hvdlite.ray"  # the KV scope of the call, its results and rank 0's logged values
_kv = None


def _client() -> KVClient:
    global _kv
    if _kv is None:
        _kv = KVClient(os.environ[env.RENDEZVOUS_ADDR], int(os.environ[env.RENDEZVOUS_PORT]),
                       job_secret(os.environ))
    return _kv


def _rank() -> int:
    """This worker's rank in its current world, whichever backend formed it."""
    for name in ("hvdlite.torch.runtime", "hvdlite.numpy.basics"):
        module = sys.modules.get(name)
        runtime = getattr(module, "_current", None) or getattr(module, "runtime", None)
        if runtime is not None and runtime.is_initialized():
            return runtime.info().rank
    return int(os.environ.get(env.RANK, "0"))


def log(value) -> None:
    """Give `value` to every callback passed to RayExecutor.run (rank 0's values only)."""
    if _rank() == 0:
        n = _client().add(SCOPE, "logged", 1)
        _client().put(SCOPE, f"log.{n}", cloudpickle.dumps(value))


def with_executable(fn, cls, args, kwargs):
    """What RayExecutor.execute runs: fn on an instance of start()'s executable_cls, or None."""
    return fn(cls(*args, **kwargs) if cls is not None else None)


def main() -> int:
    kv = _client()
    call = kv.wait(SCOPE, "call", timeout=float(os.environ.get(env.START_TIMEOUT, "30")))
    fn, args, kwargs = cloudpickle.loads(call)
    try:
        outcome = ("value", fn(*args, **kwargs))
    except Exception as e:  # noqa: BLE001 - whatever the function raised goes back to the caller
        traceback.print_exc()
        outcome = ("error", f"{type(e).__name__}: {e}".strip())
    kv.put(SCOPE, f"result.{os.environ[env.WORKER]}", cloudpickle.dumps(outcome))
    return 0 if outcome[0] == "value" else 1


if __name__ == "__main__":
    sys.exit(main())
