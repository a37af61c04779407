"""What torchrun gives its workers beyond their place (world.py), so that a torchrun script
runs under `hvdlite run` unchanged (docs/torchrun.md).

The store behind env:// is the driver's signed rendezvous, never a TCPStore: the workers'
PYTHONPATH starts with hvdlite/torch/boot, whose sitecustomize makes torch's env:// handler
hand out hvdlite's KV store. MASTER_ADDR and MASTER_PORT name that rendezvous, and
TORCHELASTIC_USE_AGENT_STORE=True (torchrun's own value) makes a worker that did not load the
hook only ever be a store client, refused there: no rank opens an unauthenticated store.
"""
import os
import uuid

import hvdlite

BOOT = os.path.join(os.path.dirname(os.path.abspath(hvdlite.__file__)), "torch", "boot")
RUN_ID = str(uuid.uuid4())  # one per driver, as torchrun's default --rdzv-id is one per run


def torchrun_env(rendezvous: tuple, base: dict) -> dict:
    addr, port = rendezvous
    path = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOT]
    return {
        "MASTER_ADDR": addr, "MASTER_PORT": str(port), "ROLE_NAME": "default",
        # torchrun --nproc-per-node's values: no restarts (hvdlite's survivors never restart)
        # and the agent's store.
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": RUN_ID, "TORCHELASTIC_USE_AGENT_STORE": "True",
        "PYTHONPATH": os.pathsep.join([BOOT, *path]),
    }
