"""hvdlite: Horovod-style elastic distributed training on torch.distributed gloo."""
__version__ = "0.1.0"

# A worker launched over a readable network claims the job's secret as its process starts
# (worker/claim.py): a token read off the wire has the least time to be used first.
import os as _os  # noqa: E402 - after the version

from hvdlite.worker import env as _env  # noqa: E402

if _os.environ.get(_env.CLAIM):
    from hvdlite.worker import claim as _claim
    _claim.claim_at_start()
