"""What discovery says: the hosts found (added, removed, resized, drained, failed) and its
failures. A mixin of ElasticCore: it updates the core's hosts and takes workers off slots that
are gone; the decisions after the event (growing, forming) are the core's."""
from hvdlite.discovery.hostset import diff, reorder
from hvdlite.driver.decisions.messages import DiscoveryFailed, HostsFound


class HostChanges:
    def _on_hosts(self, event: HostsFound):
        first, self.hosts_known = not self.hosts_known, True
        if self.discovery_failing:
            self._log("discovery_recovered", failures=self.discovery_failing)
            self.discovery_failing, self.discovery_error = 0, None
        self.drained -= {h for h, _ in event.hosts}  # back in the list: a failure counts again
        for host in set(event.drained) - self.drained:
            self.drained.add(host)
            self._log("host_drained", host=host)
        for host in event.failed:
            for inc in self._live():
                if inc.host == host and inc.killed is None:
                    self._kill(inc, "host_failed", "its host failed")
        change = diff(self.hosts, event.hosts)
        if not event.hosts and (first or change.kind is not None):
            # Said at once: otherwise the only line is "waiting for workers: 0 ready".
            self._log("discovery_empty", min_np=self.policy.min_np)
        if change.kind is None:
            return
        self.hosts = reorder(self.hosts, list(event.hosts))
        self.slots_of = dict(self.hosts)
        self.left = {slot for slot in self.left if self._slot_exists(slot)}
        self.hosts_dirty = True
        resized = {h: [old, new] for h, old, new in change.resized}
        self._log("hosts_changed", kind=change.kind, added=list(change.added),
                  removed=list(change.removed), hosts=[f"{h}:{n}" for h, n in self.hosts],
                  **({"resized": resized} if resized else {}))
        gone = sorted(self.workers[w].slot for w in self.world
                      if self.workers[w].alive and not self._slot_exists(self.workers[w].slot))
        if gone:
            self._announce(f"slots removed: {gone}")
        for inc in self._live():
            if inc.id not in self.world and not self._slot_exists(inc.slot):
                self._remove(inc)

    def _on_discovery_failed(self, event: DiscoveryFailed):
        # Said once per kind of failure, then once when a run succeeds again.
        self.discovery_failing += 1
        if event.error != self.discovery_error:
            self.discovery_error = event.error
            self._log("discovery_failed", error=event.error, action="retrying")
