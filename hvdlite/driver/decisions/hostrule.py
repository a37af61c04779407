"""Which slots are usable, and the one place that blames: a failure that was the host's
blacklists the failed slot (a single-host job, --blacklist slot) or its whole host (several
hosts, --blacklist host), as Horovod does; the driver's own trouble or the launcher's blames
nobody, and the slot waits a growing pause before it is launched again. A mixin of
ElasticCore: it reads the core's hosts and workers and adds to its blacklist and retries."""
from hvdlite.driver.decisions.messages import DRIVER, HOST
from hvdlite.driver.decisions.plan import host_of

# Seconds a slot waits before it is launched again after trouble that was not its host's: the
# n-th time 1 * 2**n (as the blacklist's cooldown), at most 30, so that a driver short of
# processes or a busy cluster is not asked again at once, nor forever at full speed.
RETRY_RANGE = (1.0, 30.0)


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

    def _blame(self, inc, whose, failure):
        """Every failure goes through here: `whose` (messages.py) says whose trouble it was;
        `failure` says what failed, for the job's summary when it was the host's."""
        if self.in_doubt is not None:
            whose = DRIVER  # its lease renewal fails: it may be the one cut off (core.in_doubt)
        if whose == HOST:
            self.failures.append(failure)
            if self.first_failure is None:
                self.first_failure = failure
            return self._blacklist_failed(inc)
        until = self.retries.add(inc.slot, self._now)
        self._log("retry_later", slot=inc.slot, whose=whose, after=f"{until - self._now:.1f}s")

    def _retrying(self, slot) -> bool:
        return self.retries.blocked(slot, self._now)

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
