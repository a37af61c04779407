"""The torch versions hvdlite supports, and the torch APIs it uses, by name: `missing()` says
which of them a torch lacks (tests/test_torch_apis.py on the installed one, bench/gpu_smoke.py
on a GPU machine's).

Supported: torch 2.11 to 2.13. Each was checked with missing(root) on its unpacked wheel, which
holds the stubs, headers and Python sources read here (CHECKED); the NCCL settings that live in
ProcessGroupNCCL.cpp alone (not in a wheel) were read in its source."""
import importlib
import inspect
import os

import torch

SUPPORTED = ((2, 11), (2, 13))
CHECKED = {"2.11.0+cu130": "git 70d99e9", "2.13.0+cpu": "git cf30153"}

# Python objects, as module:attribute.path
RUNTIME = (
    "torch.distributed:ProcessGroupGloo", "torch.distributed:ProcessGroupGloo._Options",
    "torch.distributed:ProcessGroupGloo.create_device", "torch.distributed:AllreduceOptions",
    "torch.distributed:BroadcastOptions", "torch.distributed:BarrierOptions",
    "torch.distributed:ReduceScatterOptions", "torch.distributed:AllToAllOptions",
    "torch.distributed:ReduceOp", "torch._C._distributed_c10d:AllgatherOptions",
    "torch.distributed:Backend.register_backend", "torch.distributed:init_process_group",
    "torch.distributed:destroy_process_group", "torch.distributed:new_group",
    "torch.distributed:is_initialized", "torch.distributed:get_backend",
    "torch.distributed:is_nccl_available", "torch.distributed:Store", "torch.distributed:PrefixStore",
    "torch.distributed:DistError", "torch.distributed:DistStoreError",
    "torch.nn.parallel:DistributedDataParallel._update_process_group",
    "torch.nn.parallel:DistributedDataParallel._ddp_init_helper",  # (the boot's DDP timing: ddpwait.py)
    "torch.nn.parallel:DistributedDataParallel._set_ddp_runtime_logging_sample_rate",
    "torch.nn.parallel:DistributedDataParallel._get_ddp_logging_data",
)
# Where torch has NCCL (a CUDA build): the group hvdlite makes, its options and its abort.
NCCL = ("torch.distributed:ProcessGroupNCCL", "torch.distributed:ProcessGroupNCCL.Options",
        "torch.distributed:ProcessGroupNCCL.NCCLConfig", "torch.distributed:ProcessGroupNCCL.abort")
# The same NCCL names in the stubs every wheel ships (a CPU build too), and the settings
# torch/backend.py gives (those in ProcessGroupNCCL.hpp), each as text a file holds.
STUBS = ("_C/_distributed_c10d.pyi", ("class ProcessGroupNCCL(Backend)", "class NCCLConfig:",
                                      "blocking: int", "config: ProcessGroupNCCL.NCCLConfig",
                                      "def abort(self) -> None"))
HEADER = "include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"


def _found(path: str) -> bool:
    module, _, attributes = path.partition(":")
    try:
        value = importlib.import_module(module)
        for name in attributes.split("."):
            value = getattr(value, name)
    except (ImportError, AttributeError):
        return False
    return True


def missing(root: str = None) -> list:
    """The APIs and settings a torch lacks: the installed one (its objects, and its files), or
    with `root` the files of an unpacked torch at that folder alone."""
    from hvdlite.torch import backend
    gone = []
    if root is None:
        root = os.path.dirname(torch.__file__)
        paths = RUNTIME + (NCCL if torch.distributed.is_nccl_available() else ())
        gone += [path for path in paths if not _found(path)]
        if "devices" not in inspect.signature(torch.distributed.Backend.register_backend).parameters:
            gone.append("torch.distributed:Backend.register_backend(devices=)")
    stub, texts = STUBS
    for name, wanted in ((stub, texts), (HEADER, [f'"{v}"' for v in (*backend.QUIET, backend.ERROR_HANDLING)])):
        try:
            with open(os.path.join(root, name), encoding="utf-8") as f:
                held = f.read()
        except OSError:
            gone.append(name)
            continue
        gone += [f"{name}: {text}" for text in wanted if text not in held]
    return gone


def supported(version: str = torch.__version__) -> bool:
    return SUPPORTED[0] <= tuple(int(part) for part in version.split("+")[0].split(".")[:2]) <= SUPPORTED[1]
