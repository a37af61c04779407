"""Run at startup by every worker `hvdlite run` starts (hvdlite/driver/torchrunenv.py puts this
folder first on PYTHONPATH): once torch loads its rendezvous handlers, env:// in an hvdlite
worker goes through hvdlite's signed rendezvous (hvdlite.torch.envstore) instead of a TCPStore;
once torch.distributed loads, a group made without a timeout (the script's own
init_process_group or new_group) gets the job's --gloo-timeout-seconds, not torch's 30 minutes,
the script's own collectives (torch.distributed's functions) are timed for the straggler
rule, and a group left at exit is destroyed; and once DDP loads, its backward's waits are
timed too. A worker forked from a template that ran this file decides again (after_fork).
Nothing is imported until torch is, but the launch's claim of the job's secret, which starts here;
then the sitecustomize this file hides runs, if any."""
import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import datetime
import os
import sys

_RENDEZVOUS = "torch.distributed.rendezvous"
_C10D = "torch.distributed.distributed_c10d"
_DDP = "torch.nn.parallel.distributed"
_TIMEOUT = "HVDLITE_COLLECTIVE_TIMEOUT"  # (hvdlite.worker.env's names: nothing of hvdlite loads here)
_RENDEZVOUS_ADDR = "HVDLITE_RENDEZVOUS_ADDR"
_TEMPLATE = "HVDLITE_TEMPLATE"
# torch.distributed's blocking collectives; those on objects (all_gather_object, ...) call these.
_COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather",
                "all_gather_single", "all_gather_into_tensor", "_all_gather_base",
                "all_gather_coalesced", "gather", "scatter", "reduce_scatter", "reduce_scatter_single",
                "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all", "all_to_all_single",
                "barrier", "monitored_barrier", "send", "recv")


def _take_over_env(module) -> None:
    torch_env = module._rendezvous_handlers["env"]

    def env_handler(url, **kwargs):
        if _RENDEZVOUS_ADDR not in os.environ:  # a process outside hvdlite's workers
            return torch_env(url, **kwargs)
        from hvdlite.torch.envstore import rendezvous
        return rendezvous(url, **kwargs)

    # register_rendezvous_handler refuses a scheme twice: replace torch's entry itself.
    module._rendezvous_handlers["env"] = env_handler


def _job_timeout(module) -> None:
    """torch reads these when a group is made with no timeout given."""
    if _TIMEOUT in os.environ:
        module.default_pg_timeout = module.default_pg_nccl_timeout = \
            datetime.timedelta(seconds=float(os.environ[_TIMEOUT]))


def _time_collectives(module) -> None:
    """A script's own collectives wait for its peers out of hvdlite's sight: the time each call
    takes counts as waited (hvdlite.worker.runtime.timed), as hvd.*'s waits do. hvdlite's own
    collectives and DDP's reducer call none of these functions. In a template too: what it
    preloads (torch._dynamo: functional collectives, DTensor) keeps references to them that its
    forked workers use."""
    if _RENDEZVOUS_ADDR not in os.environ and _TEMPLATE not in os.environ:
        return
    try:
        from hvdlite.worker.runtime import timed
    except ImportError:  # hvdlite is not on this interpreter: nothing would read the time
        return
    package = sys.modules.get("torch.distributed")  # (it takes these names once c10d has loaded)
    for name in _COLLECTIVES:
        collective = getattr(module, name, None)
        if collective is None:  # not in this torch
            continue
        setattr(module, name, timed(collective))
        if getattr(package, name, None) is collective:
            setattr(package, name, getattr(module, name))


def _time_ddp(module) -> None:
    """Every DDP model's reducer, made at construction or moved to an elastic world's group,
    has its backward's waits timed for the straggler rule (hvdlite.torch.ddpwait)."""
    cls = module.DistributedDataParallel
    make_reducer = cls._ddp_init_helper

    def _ddp_init_helper(self, *args, **kwargs):
        make_reducer(self, *args, **kwargs)
        if _RENDEZVOUS_ADDR in os.environ:
            from hvdlite.torch.ddpwait import watch
            watch(self)

    cls._ddp_init_helper = _ddp_init_helper


def _destroy_at_exit(module) -> None:
    """torch asks every script to destroy its process groups before the interpreter ends: a
    gloo group left to the end can abort the process after the script's last line ("terminate
    called without an active exception", SIGABRT), and many scripts never do. A worker's
    group left over is destroyed at exit (registered as c10d loads, it runs after the handlers
    the script registers)."""
    def destroy():
        if _RENDEZVOUS_ADDR in os.environ and module.is_initialized():
            module.destroy_process_group()
    atexit.register(destroy)


_PATCHES = {_RENDEZVOUS: (_take_over_env,), _C10D: (_job_timeout, _time_collectives, _destroy_at_exit),
            _DDP: (_time_ddp,)}


def after_fork() -> None:
    """Called in a worker forked from a template (hvdlite/template/server.py) once it has the
    worker's environment: what c10d's patches decided in the template by its environment (a
    kept template's first job's timeout) is decided again."""
    c10d = sys.modules.get(_C10D)
    if c10d is not None:
        _job_timeout(c10d)
    # OpenMP read the thread count as torch loaded in the template, which starts without one.
    torch, threads = sys.modules.get("torch"), os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


class _WhenTorchLoads(importlib.abc.MetaPathFinder):
    def __init__(self, name):
        self.name = name

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _patch(module, name)

        spec.loader.exec_module = exec_module
        return spec


def _patch(module, name) -> None:
    for patch in _PATCHES[name]:
        patch(module)


def _run_hidden() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _claim() -> None:
    """A worker launched over a readable network claims the job's secret now, in the background
    (hvdlite/worker/claim.py): the earliest moment its process has."""
    try:
        from hvdlite.worker import claim
    except ImportError:  # hvdlite is not on this interpreter: claimed where it is needed, if ever
        return
    claim.at_process_start()


if "HVDLITE_CLAIM" in os.environ:
    _claim()
for _name in _PATCHES:
    if _name in sys.modules:
        _patch(sys.modules[_name], _name)
    else:
        sys.meta_path.insert(0, _WhenTorchLoads(_name))
_run_hidden()
