"""Which slots are usable, and what a failure blacklists: the failed slot (a single-host job,
--blacklist slot), or its whole host (several hosts, --blacklist host), as Horovod does. A mixin
of ElasticCore: it reads the core's hosts and workers and adds to its blacklist."""
from hvdlite.driver.decisions.plan import host_of


class HostRule:
    def _slot_exists(self, slot):
        host, index = slot.rsplit("/", 1)
        return int(index) < self.slots_of.get(host, 0)

    def _blocked(self, key):
        return self.blacklist.blocked(key, self._now)

    def _blacklisted(self, slot):
        return self._blocked(slot) or self._blocked(host_of(slot))

    def _usable(self, slot):
        return self._slot_exists(slot) and not self._blacklisted(slot)

    def _host_rule(self) -> bool:
        rule = self.policy.blacklist
        return rule == "host" or (rule == "auto" and len(self.hosts) > 1)

    def _blacklist_failed(self, inc):
        if self._host_rule():
            return self._blacklist(inc.host)
        self._blacklist(inc.slot)
        if not any(w.alive for w in self.workers.values() if w.host == inc.host):
            self._blacklist(inc.host)  # every worker of the host failed

    def _blacklist(self, key):
        until = self.blacklist.add(key, self._now)
        self.hosts_dirty = True
        self._log("blacklisted", key=key,
                  cooldown="permanent" if until is None else f"{until - self._now:.1f}s")

    def _expire_blacklist(self):
        for key in self.blacklist.expire(self._now):
            self._log("whitelisted", key=key)
            self.hosts_dirty = True
