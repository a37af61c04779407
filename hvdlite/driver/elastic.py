"""An elastic job: rounds of rendezvous over a changing set of hosts.

Everything runs on the driver's main thread, one event at a time (worker ready, worker
exit, discovery result), so the registry needs no locks; the server's thread only posts
events and hands back a Future of the answer, which the main thread completes.
"""
import json
import threading
import time
from concurrent.futures import Future
from dataclasses import replace

from hvdlite.discovery.hostset import diff, reorder
from hvdlite.discovery.script import DiscoveryError, discover
from hvdlite.driver.blacklist import Blacklist
from hvdlite.driver.driver import JobError, describe_exit
from hvdlite.driver.registry import Candidate, best_survivor, free_slots, plan_world
from hvdlite.worker import env

DISCOVERY_INTERVAL = 1.0
PENDING, MEMBER, REMOVED, EXITED = "pending", "member", "removed", "exited"


def host_of(key: str) -> str:
    return key.rsplit("/", 1)[0]


class ElasticJob:
    def __init__(self, driver, settings):
        self.driver, self.settings, self.log = driver, settings, driver.log
        self.blacklist = Blacklist(settings.cooldown_range)
        self.hosts = []  # [(name, slots)]: survivors in their old order, new hosts last
        self.round = 0  # number of the current world; 0 before the first one
        self.members = {}  # slot key -> WorldInfo in the current world
        self.state = {}  # slot key -> PENDING | MEMBER | REMOVED | EXITED
        self.ready = {}  # slot key -> (round it left, commits it holds)
        self.answers = {}  # slot key -> (round, JSON answer) for the waiting GET
        self.waiting = {}  # slot key -> (after, Future) of the GET waiting for an answer
        self.answered = threading.Lock()  # answers and waiting: the server's thread reads them
        self.resets = 0
        self.succeeded = False
        self.first_failure = None
        self.announced = frozenset()  # pending workers the last host update was announced for
        self.short_since = None  # when the job started waiting for min-np workers
        self.stopping = threading.Event()
        driver.assign_handler = self.handle_assign

    # ---- HTTP side (server threads) ---------------------------------------------------
    def handle_assign(self, query):
        try:
            key, after, commit = query["slot"], int(query["after"]), int(query.get("commit", 0))
        except (KeyError, ValueError):
            return 400, b"expected slot, after and commit"
        if key not in self.state:
            return 404, b"unknown slot"
        self.driver.events.put(("ready", key, after, commit))
        with self.answered:
            if self.answers.get(key, (-1, None))[0] > after:
                return 200, self.answers[key][1]
            future = Future()  # the server answers 408 and cancels it after its long-poll cap
            self.waiting[key] = (after, future)
            return future

    def _answer(self, key, payload: dict):
        """Record a worker's answer and hand it to its waiting GET (hold self.answered)."""
        self.answers[key] = (self.round, json.dumps(payload).encode())
        after, future = self.waiting.get(key, (None, None))
        if future is not None and self.round > after:
            del self.waiting[key]
            if future.set_running_or_notify_cancel():
                future.set_result((200, self.answers[key][1]))

    # ---- main loop ------------------------------------------------------------------
    def run(self) -> int:
        try:
            first = self.discover()
        except DiscoveryError as e:
            raise JobError(str(e)) from None
        self.apply_hosts(first)
        self.driver.start_server([h for h, _ in first] or ["localhost"])
        threading.Thread(target=self._discovery_loop, daemon=True, name="discovery").start()
        try:
            while True:
                event = self.driver.next_event()
                if event is not None:
                    getattr(self, f"on_{event[0]}")(*event[1:])
                result = self.tick()
                if result is not None:
                    return result
        finally:
            self.stopping.set()

    def discover(self):
        """The current hosts: the discovery script's answer, or the fixed -H/--hostfile list."""
        s = self.settings
        if not s.discovery_script:
            return s.hosts
        return discover(s.discovery_script, s.discovery_timeout, s.slots_per_host)

    def _discovery_loop(self):
        while not self.stopping.wait(DISCOVERY_INTERVAL):
            try:
                self.driver.events.put(("hosts", self.discover()))
            except DiscoveryError as e:
                self.driver.events.put(("discovery_failed", str(e)))

    # ---- events ---------------------------------------------------------------------
    def on_hosts(self, hosts):
        self.apply_hosts(hosts)

    def on_discovery_failed(self, message):
        self.log.emit("discovery_failed", error=message, action="retrying")

    def apply_hosts(self, hosts):
        change = diff(self.hosts, hosts)
        if change.kind is None:
            return
        self.hosts = reorder(self.hosts, hosts)
        self.log.emit("hosts_changed", kind=change.kind, added=list(change.added),
                      removed=list(change.removed), hosts=[f"{h}:{n}" for h, n in self.hosts])
        gone = [k for k in self.members if not self._slot_exists(k)]
        if gone:
            self.announce(f"slots removed: {gone}")
        for key, state in list(self.state.items()):
            if state == PENDING and not self._slot_exists(key):
                self._remove(key)

    def on_ready(self, key, after, commit):
        if self.state.get(key) in (REMOVED, EXITED):
            return
        self.ready[key] = (max(after, 0), commit)
        if key in self.members and after >= self.round:
            self.mark_broken()

    def on_exit(self, key, code):
        was = self.state[key]
        self.state[key] = EXITED
        self.ready.pop(key, None)
        worker = self.driver.workers[key]
        worker.exit_code = code
        self.log.emit("worker_exit", slot=key, rank=worker.rank, code=code,
                      **({"removed": True} if was == REMOVED else {}))
        if key in self.members and code != 0:  # a clean exit closes its connections itself
            self.mark_broken()
        if was == REMOVED:
            return
        if code == 0:
            self.succeeded = True
            return
        if self.first_failure is None:
            self.first_failure = f"{worker.name} on {worker.hostname} {describe_exit(code)}"
        self._blacklist(key)
        host = worker.hostname
        if not any(self.state[k] != EXITED for k in self.state if host_of(k) == host):
            self._blacklist(host)

    # ---- periodic decisions ---------------------------------------------------------
    def tick(self):
        now = time.monotonic()
        for key in self.blacklist.expire(now):
            self.log.emit("whitelisted", key=key)
        for key in self.driver.unresponsive(now):
            self.log.emit("worker_unresponsive", slot=key, rank=self.driver.workers[key].rank,
                          action="killing it")
            self.driver.stop_worker(key, grace=0)
            if key in self.members:
                self.mark_broken()
        for key, state in self.state.items():
            started = self.driver.workers[key].started if key in self.driver.workers else now
            if state == PENDING and key not in self.ready and now - started > self.settings.start_timeout:
                self.log.emit("worker_start_timeout", slot=key, action="killing it")
                self.driver.stop_worker(key, grace=0)
        alive = [k for k, st in self.state.items() if st != EXITED]
        if self.succeeded:
            self._end_round_with_success()
            if not alive:
                self.log.emit("job_end", result="success", resets=self.resets)
                return 0
            return None
        if not alive and self.state:
            raise JobError("all workers failed; first: "
                           + (self.first_failure or "none could be launched"))
        self.grow(now)
        self.maybe_form_round(now)
        return None

    def maybe_form_round(self, now):
        if self.round == 0:
            waiting = [k for k, st in self.state.items() if st == PENDING]
            if not waiting:
                return self._check_short(now, 0)
            if not all(k in self.ready for k in waiting):
                return None
        else:
            left = [k for k in self.members if k in self.ready and self.ready[k][0] >= self.round
                    or self.state[k] == EXITED]
            if not left or len(left) < len(self.members):
                return None
        ready = [Candidate(k, host_of(k), commit, self._previous_rank(k))
                 for k, (_, commit) in self.ready.items()]
        candidates = [c for c in ready if self._usable(c.key, now)]
        if not any(c.previous_rank is not None for c in candidates) \
                and any(c.previous_rank is not None for c in ready):
            # Every worker holding the training state sits on a slot discovery took away: keep
            # the best of them until others have synced from it, or the state would be lost.
            candidates.append(best_survivor(ready))
        if self.round and ready and not any(c.previous_rank is not None for c in ready):
            # Only new workers are left: a world of them would silently start training over.
            raise JobError("all workers holding the training state failed; first: "
                           + str(self.first_failure))
        if self.hosts and all(self.blacklist.permanent(h) for h, _ in self.hosts):
            raise JobError("all hosts are blacklisted")
        if len(candidates) < self.settings.min_np:
            return self._check_short(now, len(candidates))
        if self.round >= 1 and self.settings.reset_limit is not None \
                and self.resets >= self.settings.reset_limit:
            raise JobError(f"reset limit {self.settings.reset_limit} reached "
                           f"(--reset-limit); stopping the job")
        self.form_round(plan_world(self.hosts, candidates, self.settings.max_np))
        return None

    def form_round(self, plan):
        if self.round >= 1:
            self.resets += 1
        self.round += 1
        self.short_since = None
        self.announced = frozenset()  # those workers are members now
        members = {}
        with self.answered:
            for key, slot in plan:
                members[key] = replace(slot, round=self.round, updates=self.driver.updates)
                self._answer(key, {"world": members[key].to_dict()})
                self.driver.workers[key].set_rank(slot.rank)
                self.state[key] = MEMBER
                self.ready.pop(key)
        for key in list(self.ready):  # ready, but beyond --max-np
            self._remove(key)
        if self.members:  # everyone has left the last world: its bootstrap keys are garbage
            self.driver.server.delete_scope(next(iter(self.members.values())).store_scope)
        self.members = members
        leaving = [k for k in members if not self._slot_exists(k)]
        if leaving and len(members) > len(leaving):
            self.announce(f"state handed over, slots removed: {leaving}")
        self.log.emit("round_complete", round=self.round, size=len(members), resets=self.resets,
                      members={k: w.rank for k, w in members.items()})

    def grow(self, now):
        """Launch workers for free slots; announce them once all are ready to join."""
        alive = {k for k, st in self.state.items() if st in (PENDING, MEMBER)}
        limit = (self.settings.max_np or 1 << 30) - len(alive)
        blocked = lambda key: self.blacklist.blocked(key, now)  # noqa: E731
        # A dead member's slot stays taken until its world re-forms: the slot names the
        # worker in the barrier, and a new worker there would pose as the dead one.
        for key in free_slots(self.hosts, alive | set(self.members), blocked, limit):
            self.launch(key)
        pending = frozenset(k for k, st in self.state.items() if st == PENDING)
        if self.round and pending and pending != self.announced and pending <= set(self.ready):
            self.announced = pending
            self.announce(f"workers ready to join: {sorted(pending)}")

    def launch(self, key):
        host = host_of(key)
        self.state[key] = PENDING
        with self.answered:
            self.answers.pop(key, None)  # a former worker's answer, not this one's
        try:
            self.driver.launch(key, host, -1, dict(self.hosts)[host], {
                env.ELASTIC: "1", env.ELASTIC_TIMEOUT: str(self.settings.elastic_timeout)})
        except Exception as e:  # the launcher's errors (SSH) take the host out
            self.state[key] = EXITED
            self.log.emit("launch_failed", slot=key, error=str(e))
            self._blacklist(host)

    def announce(self, reason):
        self.driver.updates += 1
        self.log.emit("hosts_updated", updates=self.driver.updates, reason=reason)

    def mark_broken(self):
        if self.round and self.driver.broken < self.round:
            self.driver.broken = self.round
            self.log.emit("round_broken", round=self.round)

    # ---- helpers --------------------------------------------------------------------
    def _check_short(self, now, ready):
        if self.short_since is None:
            self.short_since = now
            self.log.emit("waiting_for_workers", ready=ready, min_np=self.settings.min_np)
        elif now - self.short_since > self.settings.elastic_timeout:
            raise JobError(f"fewer than --min-np {self.settings.min_np} workers for "
                           f"--elastic-timeout {self.settings.elastic_timeout:g} s; stopping the job")
        return None

    def _end_round_with_success(self):
        for key, state in list(self.state.items()):
            if key in self.ready or state == PENDING:
                self._remove(key)

    def _remove(self, key):
        """Take a worker out of the job; a waiting one is told so and exits 0."""
        self.state[key] = REMOVED
        with self.answered:
            if self.ready.pop(key, None) is not None:
                self._answer(key, {"removed": True})
                return
        self.driver.stop_worker(key)

    def _slot_exists(self, key):
        host, index = key.rsplit("/", 1)
        return int(index) < dict(self.hosts).get(host, 0)

    def _usable(self, key, now):
        return self._slot_exists(key) and not self.blacklist.blocked(key, now) \
            and not self.blacklist.blocked(host_of(key), now)

    def _blacklist(self, key):
        until = self.blacklist.add(key, time.monotonic())
        self.log.emit("blacklisted", key=key,
                      cooldown="permanent" if until is None else f"{until - time.monotonic():.1f}s")

    def _previous_rank(self, key):
        world = self.members.get(key)
        return None if world is None else world.rank
