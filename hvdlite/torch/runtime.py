"""The worker's current gloo process group and world, shared by ops, optimizer and elastic."""
from hvdlite.worker.world import WorldInfo


class NotInitializedError(ValueError):
    """A collective or query was called before hvd.init() or after hvd.shutdown()."""


_pg = None
_info = None


def activate(pg, info: WorldInfo) -> None:
    global _pg, _info
    _pg, _info = pg, info


def deactivate():
    """Forget the current group; returns it so the caller decides its fate."""
    global _pg, _info
    pg, _pg, _info = _pg, None, None
    return pg


def is_initialized() -> bool:
    return _pg is not None


def process_group():
    if _pg is None:
        raise NotInitializedError(
            "hvdlite has not been initialized; call hvd.init() first (or again after hvd.shutdown())")
    return _pg


def info() -> WorldInfo:
    process_group()
    return _info
