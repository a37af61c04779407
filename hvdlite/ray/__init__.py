"""hvdlite on Ray for horovod.ray's users: `from hvdlite.ray import RayExecutor`.

RayExecutor is imported on first use, so that the worker processes it starts
(`python -m hvdlite.ray.worker`) load none of the driver.
"""


def __getattr__(name):
    if name in ("RayExecutor", "RaySettings", "WorkerError"):
        from hvdlite.ray import executor
        return getattr(executor, name)
    if name == "log":
        from hvdlite.ray.worker import log
        return log
    raise AttributeError(f"module 'hvdlite.ray' has no attribute {name!r}")
