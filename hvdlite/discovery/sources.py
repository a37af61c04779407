"""Where a job's hosts come from. A host source is a plug-in with:
- `read() -> [(host, slots)]`, raising DiscoveryError with a one-line reason;
- `changes`: whether the driver polls it (the hosts may change while the job runs);
- `describe()`: the line the driver prints about where its hosts come from, or "".
`host_source(settings, progress)` picks the job's source.
"""
import os

from hvdlite.discovery.script import discover
from hvdlite.discovery.slurm import SlurmHosts


class FixedHosts:
    """-H, --hostfile, or this machine."""
    changes = False  # nothing to poll

    def __init__(self, hosts):
        self.hosts = list(hosts)

    def read(self):
        return self.hosts

    def describe(self) -> str:
        return ""


class ScriptHosts:
    """Runs the script on every read; DiscoveryError says why a run gave no hosts. The script's
    environment is the driver's plus `progress()`: what the job reached (HVDLITE_NEWEST_COMMIT),
    so that a script may offer hosts as training goes rather than as time goes."""
    changes = True

    def __init__(self, script, timeout, default_slots=None, progress=dict):
        self.script, self.timeout, self.default_slots = script, timeout, default_slots
        self.progress = progress

    def read(self):
        return discover(self.script, self.timeout, self.default_slots, env={**os.environ, **self.progress()})

    def describe(self) -> str:
        return ""


def host_source(settings, progress=dict):
    """The job's source; `progress() -> {name: value}` is added to a discovery script's
    environment at each run."""
    if settings.slurm is not None:
        return SlurmHosts(settings.slurm, settings.elastic, settings.launcher)
    if settings.launcher == "ray":
        from hvdlite.discovery.raynodes import RayNodes, SlotShape
        shape = SlotShape(settings.cpus_per_slot, settings.gpus_per_slot, settings.slot_resource)
        if settings.elastic:
            return RayNodes(settings.ray_address, shape, settings.min_np or 1, settings.max_np)
        return RayNodes(settings.ray_address, shape, settings.num_proc or 1, settings.num_proc,
                        wait=settings.start_timeout)
    if settings.discovery_script:
        return ScriptHosts(settings.discovery_script, settings.discovery_timeout, settings.slots_per_host,
                           progress)
    return FixedHosts(settings.hosts)
