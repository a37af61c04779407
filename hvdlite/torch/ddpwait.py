"""How long DistributedDataParallel's backward waited for the peers, for the straggler rule.

hvdlite's own collectives time their waits (handles.wait_work); DDP's reducer waits for its
buckets' allreduces in C++, out of Python's sight, so a DDP rank's own work would read as its
whole step and no straggler could be told apart. torch's DDP logger times an iteration's
backward: its communication runs from the first bucket's allreduce to the end of the last,
overlapping the computation until that ends; the rest is the time the backward waited with its
own work done, the peers' lateness. Asked to time every iteration (sample rate 1; torch's
default is the first 10, then one in 100), the logger keeps running averages over `iteration`
of them, so average x iteration is a total. It is read on the heartbeat thread (the logger
copies its figures under the reducer's lock), never on the step's path. CPU models only: for a
CUDA one the logger waits for the last iteration's events at every forward, which would cost
the step its run-ahead.

Every DDP model of a worker of `hvdlite run` is watched (the boot sitecustomize wraps DDP's
_ddp_init_helper, which makes its reducer at construction and again when an elastic world
moves the model to a new group: torch/statehandlers.py)."""
import threading
import weakref

from hvdlite.worker import runtime

_lock = threading.Lock()  # (watch() runs on the step's thread, waited() on the heartbeat's)
_models = {}  # id(model) -> [weakref to the model, seconds its reducer's backward waited]
_ended = 0.0  # the seconds of reducers since replaced, and of models since gone


def watch(model) -> None:
    """Time `model`'s backward waits from its reducer just made."""
    global _ended
    if getattr(model, "device_type", None) != "cpu":
        return
    model._set_ddp_runtime_logging_sample_rate(1)
    with _lock:
        if not _models and not _ended:
            runtime.wait_also(waited)
        old = _models.get(id(model))
        if old is not None and old[0]() is model:
            _ended += old[1]  # its new reducer's logger counts from 0
        _models[id(model)] = [weakref.ref(model), 0.0]


def waited() -> float:
    """Seconds every watched model's backward waited, since each was made (never less than
    last read: the driver takes differences)."""
    global _ended
    with _lock:
        for key, entry in list(_models.items()):
            model = entry[0]()
            if model is None:
                _ended += entry[1]
                del _models[key]
                continue
            try:
                figures = model._get_ddp_logging_data()
            except (AttributeError, RuntimeError):  # (no logger: a model torch.compile's DDP runs)
                figures = {}
            wait = figures.get("avg_backward_comm_time", 0) - figures.get("avg_backward_compute_comm_overlap_time", 0)
            entry[1] = max(entry[1], figures.get("iteration", 0) * wait / 1e9)
            del model
        return _ended + sum(entry[1] for entry in _models.values())
