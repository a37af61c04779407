"""Preloaded worker templates: a process per host and interpreter that has imported torch
(and what --preload names) and forks workers on request, so a joining worker skips the
seconds of `import torch`. `python -m hvdlite.template` is the template (server.py, child.py),
hvdlite.driver.launchers.template the driver's side (launchers/hosttemplates.py on remote
hosts: SSH hosts and Ray nodes), wire.py their frames, command.py which commands it can run,
spawn.py the client a remote worker's launch runs to have its host's template fork it.
"""
# torch._dynamo is what the first optimizer imports (~1.5 s); modules not installed on the
# worker's interpreter (torch under the numpy backend) are skipped.
DEFAULT_PRELOAD = ("torch", "torch.optim", "torch._dynamo", "hvdlite.torch", "numpy", "hvdlite.numpy")
