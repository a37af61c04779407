"""Exceptions shared by every collective backend, named as in Horovod so its scripts run as is."""
import re
import sys


class HorovodInternalError(RuntimeError):
    """A collective failed because the world broke (a peer died, hung or was cut off)."""


class MismatchError(ValueError, RuntimeError):
    """The ranks called a collective with tensors, dtypes, root ranks or splits that disagree:
    raised on every rank alike, at once. A RuntimeError as Horovod's (its tests expect one),
    a ValueError as the script's own mistake; never a HorovodInternalError, which elastic
    training would answer with a reset that repeats the mistake."""


class HostsUpdatedInterrupt(RuntimeError):
    """The driver changed the set of hosts; every rank raises this at the same commit."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


def quiet_broken_world(echoed) -> None:
    """In a static job a HorovodInternalError that ends the script only echoes a peer's failure
    (which the peer and the driver report): print it as one line, not a traceback, and call
    `echoed` (the worker tells the driver as it exits, so that the driver names the peer)."""
    previous = sys.excepthook

    def hook(kind, error, tb):
        if not issubclass(kind, HorovodInternalError):
            return previous(kind, error, tb)
        echoed()
        # gloo's text: "[path/pair.cc:553] Connection closed by peer [addr]:port. This is ...".
        why = re.sub(r"^\[[^\]]*\]\s*", "", (str(error).strip().splitlines() or [""])[0]).split(". ")[0]
        sys.stderr.write(f"HorovodInternalError: {why[:200]} (a peer left the job: the driver "
                         f"names it and why)\n")

    sys.excepthook = hook
