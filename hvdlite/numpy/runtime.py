"""The worker's current pygloo context and world, shared by basics, ops and elastic."""
from hvdlite.worker.runtime import Runtime

_current = Runtime()
activate = _current.activate
deactivate = _current.deactivate
is_initialized = _current.is_initialized
context = _current.group
info = _current.info
query = _current.query
