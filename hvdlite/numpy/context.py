"""The worker's current pygloo context and world, shared by basics, ops and elastic."""
from hvdlite.worker.runtime import Runtime

runtime = Runtime()
