"""The worker's current gloo process group and world, shared by ops, optimizer and elastic."""
from hvdlite.worker.runtime import NotInitializedError, Runtime  # noqa: F401

_current = Runtime()
activate = _current.activate
deactivate = _current.deactivate
is_initialized = _current.is_initialized
process_group = _current.group
info = _current.info
before_next = _current.before_next
run_next = _current.run_next


def fail() -> None:
    """Mark the current world's group as failed (see basics.init)."""
    _current.failed = True


def failed() -> bool:
    return _current.failed
