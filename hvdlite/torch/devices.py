"""Where a collective's tensors travel. In a world that took NCCL (torch/backend.py), the
global set's collectives of CUDA tensors go to it as they are. Elsewhere they run on gloo over
host memory: a tensor on another device (a GPU) is copied to the host when the collective is
issued, and its results come back onto that device once it is done: into the caller's own
tensors for the in-place forms, as new tensors on the device for the others. Host tensors pass
untouched, so a CPU job takes no step more than one check of its first argument."""
import functools
import inspect
import sys

import torch

from hvdlite.torch import backend
from hvdlite.torch.handles import Handle
from hvdlite.worker import gpus

HOST = torch.device("cpu")


_said = []


def say_gpu() -> None:
    """Say once, where this process sees GPUs, which one its slot uses (worker/gpus.py)."""
    if not _said and torch.cuda.is_available():
        _said.append(True)
        print(gpus.line(torch.cuda.device_count()), file=sys.stderr, flush=True)


def off_host(tensors) -> list:
    """The tensors among `tensors` (a tensor, or a list or tuple of them) not in host memory."""
    if torch.is_tensor(tensors):
        return [] if tensors.is_cpu else [tensors]
    if isinstance(tensors, (list, tuple)):
        return [t for t in tensors if torch.is_tensor(t) and not t.is_cpu]
    return []


def staged(issue):
    """Wrap a collective's issue function (its tensors, or a list of them, first; a Handle
    back) so that it takes tensors on any device: see the module's text. The other positional
    arguments that hold the same tensors (broadcast's `result`) are staged alike. It takes a
    `process_set` argument: NCCL is the global set's alone."""
    at = list(inspect.signature(issue).parameters).index("process_set") - 1  # in *args

    @functools.wraps(issue)
    def call(tensors, *args, **kwargs):
        away = off_host(tensors)
        if not away or backend.takes(away, 1 if torch.is_tensor(tensors) else len(tensors),
                                     args[at] if at < len(args) else kwargs["process_set"]):
            return issue(tensors, *args, **kwargs)
        device = away[0].device
        hosted = {id(t): (t, t.detach().to(HOST, copy=True)) for t in away}  # id -> (it, its host copy)
        handle = issue(_to_host(tensors, hosted), *(_to_host(a, hosted) for a in args), **kwargs)
        # (the copies are held with their ids: a freed one's id could name a new result)
        back = {id(copy): (mine, copy) for mine, copy in hosted.values()}
        return Handle([handle], lambda: _back(handle.wait(), back, device))
    return call


def _to_host(value, hosted):
    if torch.is_tensor(value):
        return hosted.setdefault(id(value), (value, value))[1]  # (a host tensor stays where it is)
    if isinstance(value, (list, tuple)) and any(torch.is_tensor(v) for v in value):
        return type(value)(_to_host(v, hosted) for v in value)
    return value


def _back(result, back, device):
    """The result with its host tensors on `device`: a host copy of a caller's tensor is
    written back into that tensor (the in-place forms), any other is copied to the device."""
    if torch.is_tensor(result):
        mine, copy = back.get(id(result), (None, None))
        if copy is not result:
            return result.to(device)
        if mine is not result:
            mine.detach().copy_(result)
        return mine
    if isinstance(result, (list, tuple)):
        return type(result)(_back(r, back, device) for r in result)
    return result
