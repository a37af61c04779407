"""How long DistributedDataParallel's backward waited for the peers, for the straggler rule.

hvdlite's own collectives time their waits (handles.wait_work); DDP's reducer waits for its
buckets' allreduces in C++, out of Python's sight, so a DDP rank's own work would read as its
whole step and no straggler could be told apart. torch's DDP logger times an iteration's
backward: its communication runs from the first bucket's allreduce to the end of the last,
overlapping the computation until that ends; the rest is the time the backward waited with its
own work done, the peers' lateness. Asked to time every iteration (sample rate 1; torch's
default is the first 10, then one in 100), the logger keeps running averages over `iteration`
of them, so average x iteration is a total. It is read at a forward (a pre-hook, at most every
READ_EVERY seconds): the logger copies its figures under the reducer's lock, which a backward
holds while it waits for its peers, so a read on the heartbeat thread would stall the heartbeat
for as long as a peer is late (1.9 s of a peer's 2 s, measured), hangs included. CPU models
only: for a CUDA one the logger waits for the last iteration's events at every forward, which
would cost the step its run-ahead.

A rank out of data in DDP's join() (torch.distributed.algorithms.join.Join) shadows its peers'
steps with its own work nil: from its first shadowing step to the end of join() it is idle, as
in hvd.join(), so the straggler rule neither names it nor measures the others against it.

Every DDP model of a worker of `hvdlite run` is watched (the boot sitecustomize wraps DDP's
_ddp_init_helper, which makes its reducer at construction and again when an elastic world
moves the model to a new group: torch/statehandlers.py)."""
import functools
import threading
import time
import weakref

from hvdlite.worker import runtime

READ_EVERY = 0.25  # seconds between reads of a model's logger (heartbeats come every 0.5 s)
_lock = threading.RLock()  # (the step's thread writes, the heartbeat's sums; a finalizer may run in either)
_models = {}  # id(model) -> [seconds its reducer's backward waited, when to read it next]
_ended = 0.0  # the seconds of reducers since replaced, and of models since gone
_shadowing = set()  # id() of the join hooks of models whose rank joined and shadows its peers


def watch(model) -> None:
    """Time `model`'s backward waits from its reducer just made."""
    global _ended
    if "join_hook" not in vars(model):  # (once per model: an elastic move makes a new reducer)
        model.join_hook = functools.partial(_join_hook, weakref.WeakMethod(model.join_hook))  # (no cycle)
    if getattr(model, "device_type", None) != "cpu":
        return
    model._set_ddp_runtime_logging_sample_rate(1)
    with _lock:
        if not _models and not _ended:
            runtime.wait_also(waited)
        old = _models.get(id(model))
        if old is not None:
            _ended += old[0]  # its new reducer's logger counts from 0
        else:
            model.register_forward_pre_hook(_read)
            weakref.finalize(model, _gone, id(model))
        _models[id(model)] = [0.0, 0.0]


def _join_hook(make, **kwargs):
    """DDP's join hook, idle from its first shadowing step (main_hook) to join()'s end (post_hook)."""
    hook = make()(**kwargs)
    main, post = hook.main_hook, hook.post_hook

    def main_hook():
        _shadowing.add(id(hook))
        try:
            main()
        except BaseException:  # a broken world: no post_hook comes, and the next world's steps are work
            _shadowing.discard(id(hook))
            raise

    def post_hook(is_last_joiner):
        _shadowing.discard(id(hook))
        post(is_last_joiner)

    hook.main_hook, hook.post_hook = main_hook, post_hook
    return hook


def idle() -> bool:
    """A model of this process shadows its peers' steps in join()."""
    return bool(_shadowing)


def _read(model, _inputs) -> None:
    """At a forward, the previous backwards' waits (each at most READ_EVERY late)."""
    now = time.monotonic()
    entry = _models.get(id(model))
    if entry is None or now < entry[1]:
        return
    figures = model._get_ddp_logging_data()
    wait = figures.get("avg_backward_comm_time", 0) - figures.get("avg_backward_compute_comm_overlap_time", 0)
    with _lock:
        entry[0], entry[1] = max(entry[0], figures.get("iteration", 0) * wait / 1e9), now + READ_EVERY


def _gone(key) -> None:
    global _ended
    with _lock:
        _ended += _models.pop(key)[0]


def waited() -> float:
    """Seconds every watched model's backward waited, since each was made, as last read
    (never less than before: the driver takes differences)."""
    with _lock:
        return _ended + sum(entry[0] for entry in _models.values())


runtime.idle_also(idle)  # (this module is imported as a worker makes its first DDP model)
