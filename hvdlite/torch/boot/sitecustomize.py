"""Run at startup by every worker `hvdlite run` starts (hvdlite/driver/torchrunenv.py puts this
folder first on PYTHONPATH): once torch loads its rendezvous handlers, env:// in an hvdlite
worker goes through hvdlite's signed rendezvous (hvdlite.torch.envstore) instead of a TCPStore.
Nothing is imported until torch is; then the sitecustomize this file hides runs, if any."""
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_MODULE = "torch.distributed.rendezvous"


def _take_over_env(module) -> None:
    torch_env = module._rendezvous_handlers["env"]

    def env_handler(url, **kwargs):
        if "HVDLITE_RENDEZVOUS_ADDR" not in os.environ:  # a process outside hvdlite's workers
            return torch_env(url, **kwargs)
        from hvdlite.torch.envstore import rendezvous
        return rendezvous(url, **kwargs)

    # register_rendezvous_handler refuses a scheme twice: replace torch's entry itself.
    module._rendezvous_handlers["env"] = env_handler


class _WhenTorchLoads(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _take_over_env(module)

        spec.loader.exec_module = exec_module
        return spec


def _run_hidden() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if _MODULE in sys.modules:
    _take_over_env(sys.modules[_MODULE])
else:
    sys.meta_path.insert(0, _WhenTorchLoads())
_run_hidden()
