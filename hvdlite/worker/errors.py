"""Exceptions shared by every collective backend, named as in Horovod so its scripts run as is."""


class HorovodInternalError(RuntimeError):
    """A collective failed because the world broke (a peer died, hung or was cut off)."""


class HostsUpdatedInterrupt(RuntimeError):
    """The driver changed the set of hosts; every rank raises this at the same commit."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync
