"""Where an elastic job's hosts come from: a fixed list (-H, --hostfile) or a discovery script."""
from hvdlite.discovery.script import discover


class FixedHosts:
    def __init__(self, hosts):
        self.hosts = list(hosts)
        self.changes = False  # nothing to poll

    def read(self):
        return self.hosts


class ScriptHosts:
    """Runs the script on every read; DiscoveryError says why a run gave no hosts."""

    def __init__(self, script, timeout, default_slots=None):
        self.script, self.timeout, self.default_slots = script, timeout, default_slots
        self.changes = True

    def read(self):
        return discover(self.script, self.timeout, self.default_slots)
