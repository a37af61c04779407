"""The elastic job as a state machine: `ElasticCore.handle(event, now)` -> actions.

One event at a time (messages.py), the time passed in, actions returned for the executor;
no threads, sockets, processes or clock reads here, so any interleaving can be replayed.

Rounds: a world ("round" r) forms when every member of the last one has left it (waiting in
the rendezvous again, or exited) or, for the first world, when every launched worker waits.
Its members are the waiting workers on usable slots, rank 0 being one that holds the newest
commit. New workers are launched on free slots as discovery shows them; once all are waiting,
a host update is announced, members leave at their next commit and the world re-forms.
"""
import enum
import random
import signal
from dataclasses import dataclass, replace
from typing import Optional

from hvdlite import defaults, exitcodes
from hvdlite.discovery.hostset import diff, reorder
from hvdlite.driver.decisions.blacklist import Blacklist
from hvdlite.driver.decisions.messages import (
    Answer, DiscoveryFailed, DropScope, EndJob, Exited, Exiting, Heartbeats, HostsFound, Launch,
    Launched, LaunchFailed, Log, Publish, Ready, Stop, StopRequested, Tick)
from hvdlite.driver.decisions.plan import (
    Candidate, best_holder, free_slots, host_of, plan_world, prospective_places)

REMOVED = {"removed": True}


class Phase(enum.Enum):
    STARTING = "starting"  # launch asked for or process running; not waiting for a world yet
    WAITING = "waiting"  # in the rendezvous, for a world formed after round `after`
    TRAINING = "training"  # answered with a world and working in it
    LEAVING = "leaving"  # told to go without failing (removed from the job)
    GONE = "gone"  # exited, or never started


@dataclass(frozen=True)
class Policy:
    """The settings the decisions depend on."""
    min_np: int = 1
    max_np: Optional[int] = None
    reset_limit: Optional[int] = None
    elastic_timeout: float = 600.0
    start_timeout: float = 30.0
    liveness_timeout: float = 5.0
    exit_grace: float = 30.0  # seconds a worker that said it is exiting may take
    stall: float = 1.0  # a gap between ticks this long means the driver itself was starved
    cooldown_range: Optional[tuple] = None
    blacklist: str = "auto"  # "host", "slot", or "auto": slot on a single-host job, else host
    stop_grace: float = 3.0  # seconds a removed worker gets between TERM and KILL
    durable: bool = False  # --checkpoint-dir: commits are on disk too
    stop_timeout: float = defaults.STOP_TIMEOUT  # seconds a graceful stop waits for commits


@dataclass
class Incarnation:
    """One launch of a slot."""
    id: str
    slot: str
    host: str
    launched_at: float
    phase: Phase = Phase.STARTING
    pid: Optional[int] = None
    after: int = -1  # while WAITING: the round it left
    commit: int = 0  # commits its training state holds, as last reported
    heard_at: Optional[float] = None  # last heartbeat
    exiting_since: Optional[float] = None
    killed: Optional[str] = None  # why the driver killed it as failed
    answer: Optional[tuple] = None  # (round, body) of its last rendezvous answer
    rank: Optional[int] = None

    @property
    def alive(self) -> bool:
        return self.phase is not Phase.GONE

    @property
    def name(self) -> str:
        """How messages name the worker: its rank, or its slot before it has one."""
        return f"rank {self.rank}" if self.rank is not None else f"worker {self.slot}"


@dataclass(frozen=True)
class JobView:
    """What the job looks like now, for status lines and metrics (read-only)."""
    round: int
    world_size: int
    target_size: int  # the world the usable slots would form (capped by --max-np)
    commit: int  # newest commit a member of the current world reported
    joining: int  # workers started or waiting that are not in the current world
    blacklisted_slots: int  # slots of the current hosts sitting out
    resets: int


class JobFailed(Exception):
    """Raised inside the core to end the job; handle() turns it into EndJob(1, message)."""


class ElasticCore:
    def __init__(self, policy: Policy, rng=random.random):
        self.policy = policy
        self.blacklist = Blacklist(policy.cooldown_range, rng)
        self.hosts = []  # [(name, slots)]: survivors in their old order, new hosts last
        self.slots_of = {}  # name -> slots, of self.hosts
        self.hosts_known = False
        self.workers = {}  # incarnation id -> Incarnation, every one ever launched
        # Indexes that keep each event's work small at thousands of workers:
        self.phases = {p: {} for p in Phase if p is not Phase.GONE}  # phase -> {id: Incarnation}
        self.staying = set()  # members of the current world that have not left it
        self.joiners = {}  # live incarnations not in a world yet (not leaving): id -> Incarnation
        self.hosts_dirty = False  # hosts or blacklist changed: is every host blacklisted now?
        self.launches = {}  # slot -> how many times it was launched
        self.round = 0  # the current world's number; 0 before the first
        self.world = {}  # incarnation id -> WorldInfo in the current world
        self.updates = 0  # host updates announced to workers
        self.broken = 0  # newest round that fell apart
        self.resets = 0
        self.commit_high = 0  # newest commit any waiting worker held
        self.succeeded = False
        self.ended = False
        self.first_failure = None
        self.short_since = None  # when the job started waiting for --min-np workers
        self.announced = frozenset()  # joiners the last host update was announced for
        self.last_tick = None
        self.disrupted = None  # (time, why) the current world was first told to re-form
        self.left = set()  # slots whose worker left at a commit (SIGTERM): not relaunched
        self.stopping = None  # (time, signal number) a graceful stop was asked for
        self._now, self._out = 0.0, []
        self._handlers = {HostsFound: self._on_hosts, DiscoveryFailed: self._on_discovery_failed,
                          Launched: self._on_launched, LaunchFailed: self._on_launch_failed,
                          Ready: self._on_ready, Heartbeats: self._on_heartbeats,
                          Exiting: self._on_exiting, Exited: self._on_exited, Tick: self._on_tick,
                          StopRequested: self._on_stop}

    # ---- entry ------------------------------------------------------------------------
    def handle(self, event, now: float) -> list:
        """Apply one event at time `now` (monotonic seconds); returns the actions to perform."""
        self._now, self._out = now, []
        worker = getattr(event, "worker", None)
        if self.ended or (worker is not None and self._current(worker) is None):
            # The job is over, or the worker is an earlier (or unknown) process: nothing it
            # says changes anything; one still waiting is told to go.
            if isinstance(event, Ready):
                known = event.worker in self.workers or self.ended
                self._emit(Answer(event.worker, 200, REMOVED) if known
                           else Answer(event.worker, 404, {"error": "unknown worker"}))
            return self._out
        try:
            self._handlers[type(event)](event)
            # Only these can free a slot (exits, host changes, cooldowns): the others need
            # no search for free slots.
            self._decide(grow=isinstance(event, (HostsFound, Exited, LaunchFailed, Tick)))
        except JobFailed as e:
            self._emit(Log("job_end", {"result": "failure", "reason": str(e)}))
            self._end(1, str(e))
        return self._out

    def view(self) -> JobView:
        members = [self.workers[w] for w in self.world if self.workers[w].alive]
        slots = [f"{h}/{i}" for h, n in self.hosts for i in range(n)]
        usable = sum(1 for slot in slots if not self._blacklisted(slot))
        return JobView(self.round, len(members), min(usable, self.policy.max_np or usable),
                       max((inc.commit for inc in members), default=0), len(self.joiners),
                       len(slots) - usable, self.resets)

    def _emit(self, action):
        self._out.append(action)

    def _log(self, event, **fields):
        self._emit(Log(event, fields))

    def _end(self, code, error=None):
        self.ended = True
        self._emit(EndJob(code, error))

    # ---- events -------------------------------------------------------------------------
    def _on_hosts(self, event: HostsFound):
        self.hosts_known = True
        change = diff(self.hosts, event.hosts)
        if change.kind is None:
            return
        self.hosts = reorder(self.hosts, list(event.hosts))
        self.slots_of = dict(self.hosts)
        self.left = {slot for slot in self.left if self._slot_exists(slot)}
        self.hosts_dirty = True
        self._log("hosts_changed", kind=change.kind, added=list(change.added),
                  removed=list(change.removed), hosts=[f"{h}:{n}" for h, n in self.hosts])
        gone = sorted(self.workers[w].slot for w in self.world
                      if self.workers[w].alive and not self._slot_exists(self.workers[w].slot))
        if gone:
            self._announce(f"slots removed: {gone}")
        for inc in self._live():
            if inc.id not in self.world and not self._slot_exists(inc.slot):
                self._remove(inc)

    def _on_discovery_failed(self, event: DiscoveryFailed):
        self._log("discovery_failed", error=event.error, action="retrying")

    def _on_launched(self, event: Launched):
        inc = self._current(event.worker)
        if inc is not None:
            inc.pid = event.pid
            self._log("worker_start", slot=inc.slot, worker=inc.id, pid=event.pid, started=event.started)

    def _on_launch_failed(self, event: LaunchFailed):
        inc = self._current(event.worker)
        if inc is None:
            return
        self._set_phase(inc, Phase.GONE)
        self._log("launch_failed", slot=inc.slot, worker=inc.id, error=event.error)
        if self.first_failure is None:
            self.first_failure = f"{inc.name} on {inc.host} could not be launched: {event.error}"
        self._blacklist(inc.host)  # the host cannot be reached or refused us

    def _on_ready(self, event: Ready):
        inc = self.workers[event.worker]
        if inc.phase is Phase.LEAVING:
            return self._answer_removed(inc.id)
        if self.stopping is not None:  # it left its world: out of the job, like a waiting one
            inc.commit = max(inc.commit, event.commit)
            self._set_phase(inc, Phase.WAITING)
            return self._remove(inc)
        if inc.answer is not None and inc.answer[0] > event.after:
            # Its last answer got lost (the request timed out): give it again.
            return self._emit(Answer(inc.id, 200, inc.answer[1], inc.rank))
        self._set_phase(inc, Phase.WAITING)
        inc.after, inc.commit = max(event.after, 0), event.commit
        self.commit_high = max(self.commit_high, event.commit)
        if inc.id in self.world and event.after >= self.round:
            self.staying.discard(inc.id)
            self._mark_broken()  # a member left its world: the others must not wait for it

    def _on_heartbeats(self, event: Heartbeats):
        for worker, commit in event.beats:
            inc = self._current(worker)
            if inc is not None:
                inc.heard_at = self._now
                if inc.phase is Phase.TRAINING:
                    inc.commit = max(inc.commit, commit)

    def _on_exiting(self, event: Exiting):
        inc = self._current(event.worker)
        if inc is not None and inc.exiting_since is None:
            inc.exiting_since = self._now
            inc.commit = max(inc.commit, event.commit)

    def _on_exited(self, event: Exited):
        inc = self._current(event.worker)
        if inc is None:
            return  # an earlier process of the slot, or told twice
        was = inc.phase
        self._set_phase(inc, Phase.GONE)
        self.staying.discard(inc.id)
        left = event.code == exitcodes.LEFT and inc.killed is None  # at a commit, on purpose
        fields = {"removed": True} if was is Phase.LEAVING else {"left": True} if left else {}
        if event.error:
            fields["error"] = event.error
        self._log("worker_exit", slot=inc.slot, worker=inc.id, rank=inc.rank, code=event.code, **fields)
        if inc.id in self.world and event.code != 0 and not left:  # these close their connections
            self._mark_broken()
        if was is Phase.LEAVING:
            return
        if left:  # its peers re-form without it, from the same commit; nothing failed
            self.left.add(inc.slot)
            return
        if event.code == 0 and inc.killed is None:
            self.succeeded = True
            return
        if self.first_failure is None:
            self.first_failure = f"{inc.name} on {inc.host} {describe_exit(event.code)}" + \
                (f" ({inc.killed})" if inc.killed else f" ({event.error})" if event.error else "")
        self._blacklist_failed(inc)

    def _on_stop(self, event: StopRequested):
        if self.stopping is not None:
            return
        self.stopping = (self._now, event.signum)
        self._log("stop_requested", signal=_signal_name(event.signum), timeout=self.policy.stop_timeout)
        self._emit(Publish(self.updates, self.broken, stop=True))
        for inc in self._live():
            if inc.phase in (Phase.STARTING, Phase.WAITING):
                self._remove(inc)

    def _stopped(self):
        """The graceful stop is over: every worker left, or the time is up."""
        signum, p = self.stopping[1], self.policy
        late = sorted(inc.name for inc in self._live())
        for inc in self._live():
            self._kill(inc, "worker_stop_timeout", f"no commit within {p.stop_timeout:g} s of the stop")
        commit = max([0] + [inc.commit for inc in self.workers.values()])
        resumable = p.durable and commit > 0
        self._log("job_end", result="stopped", signal=_signal_name(signum), commit=commit,
                  resumable=resumable, late=late)
        self._end(exitcodes.RESUMABLE if resumable else 128 + signum)

    def _on_tick(self, event: Tick):
        now, p = self._now, self.policy
        if self.stopping is not None and now - self.stopping[0] > p.stop_timeout:
            return self._stopped()
        if self.last_tick is not None and now - self.last_tick > p.stall:
            # The driver itself was not running: that silence is not the workers'.
            gap = now - self.last_tick
            for inc in self._live():
                inc.heard_at = None if inc.heard_at is None else inc.heard_at + gap
                inc.launched_at += gap
        self.last_tick = now
        for key in self.blacklist.expire(now):
            self._log("whitelisted", key=key)
            self.hosts_dirty = True
        for inc in self._live():
            if inc.killed is not None or inc.pid is None:
                continue
            if inc.exiting_since is not None:
                if now - inc.exiting_since > p.exit_grace:
                    self._kill(inc, "worker_unresponsive", f"still exiting after {p.exit_grace:g} s")
            elif inc.heard_at is not None and now - inc.heard_at > p.liveness_timeout:
                self._kill(inc, "worker_unresponsive", f"no heartbeat for {p.liveness_timeout:g} s")
            elif inc.phase is Phase.STARTING and inc.answer is None \
                    and now - inc.launched_at > p.start_timeout:
                self._kill(inc, "worker_start_timeout", f"not ready within {p.start_timeout:g} s")

    # ---- decisions after every event ----------------------------------------------------
    def _decide(self, grow: bool):
        if self.stopping is not None:
            if not self._any_live() and not self.ended:
                self._stopped()
            return
        if self.succeeded:
            for inc in self._live():
                if inc.phase in (Phase.STARTING, Phase.WAITING):
                    self._remove(inc)
            if not self._any_live():
                self._log("job_end", result="success", resets=self.resets)
                self._end(0)
            return
        if not self._any_live() and self.first_failure is not None and not self._resumable_from_disk():
            raise JobFailed(f"all workers failed; first: {self.first_failure}")
        if self.hosts_dirty:
            self.hosts_dirty = False
            if self.hosts and all(self.blacklist.permanent(h) for h, _ in self.hosts):
                raise JobFailed("all hosts are blacklisted")
        if grow:
            self._grow()
        self._announce_joiners()
        self._maybe_form()

    def _grow(self):
        if not self.hosts_known:
            return
        live = self._live()
        limit = (self.policy.max_np or 1 << 30) - (len(live) - len(self.phases[Phase.LEAVING]))
        # A slot whose earlier process is still ending is not free yet.
        occupied = {inc.slot for inc in live}
        free = free_slots(self.hosts, occupied, lambda key: key in self.left or self._blocked(key), limit)
        places = prospective_places(self.hosts, self._blocked, self.policy.max_np) if free else {}
        for slot in free:
            self._launch(slot, places.get(slot))

    def _announce_joiners(self):
        """Once every worker launched for a running job waits to join, tell the members."""
        if not self.round or not self.joiners:
            return
        joining = frozenset(self.joiners)
        if joining != self.announced \
                and all(inc.phase is Phase.WAITING for inc in self.joiners.values()):
            self.announced = joining
            self._announce(f"workers ready to join: {sorted(self.workers[w].slot for w in joining)}")

    def _launch(self, slot, place):
        n = self.launches.get(slot, 0) + 1
        self.launches[slot] = n
        host = host_of(slot)
        inc = Incarnation(f"{slot}#{n}", slot, host, launched_at=self._now)
        self.workers[inc.id] = inc
        self.phases[Phase.STARTING][inc.id] = inc
        self.joiners[inc.id] = inc
        self._emit(Launch(inc.id, slot, host, self.slots_of[host], place, joining=self.round > 0))

    def _maybe_form(self):
        if self.round == 0:
            if self.phases[Phase.STARTING]:
                return  # the first world waits for every launched worker (start timeout)
        elif self.staying:
            return  # a member is still in the current world
        waiting = list(self.phases[Phase.WAITING].values())
        candidates = [Candidate(inc.id, inc.slot, inc.host, inc.commit,
                                self.world[inc.id].rank if inc.id in self.world else None)
                      for inc in waiting]
        usable = [c for c in candidates if self._usable(c.slot)]
        allowed = [c for c in candidates if not self._blacklisted(c.slot)]
        if allowed and max((c.commit for c in usable), default=-1) < max(c.commit for c in allowed):
            # Every holder of the newest commit sits on a slot discovery took away: keep the
            # best of them in until the others have synced from it.
            usable.append(best_holder(self.hosts, allowed))
        if len(usable) < self.policy.min_np:
            return self._check_short(len(usable))
        top = max(c.commit for c in usable)
        if top < self.commit_high:
            if top == 0:
                raise JobFailed(f"every worker holding the training state is gone (last commit "
                                f"{self.commit_high}); stopping rather than training from scratch")
            self._log("commit_lost", newest=self.commit_high, resumed=top)
        if self.round >= 1 and self.policy.reset_limit is not None \
                and self.resets >= self.policy.reset_limit:
            raise JobFailed(f"reset limit {self.policy.reset_limit} reached (--reset-limit); "
                            f"stopping the job")
        self._form(plan_world(self.hosts, usable, self.policy.max_np), candidates, top)

    def _form(self, plan, candidates, commit):
        if self.round >= 1:
            self.resets += 1
        old_round, self.round = self.round, self.round + 1
        reformed = {}
        if self.disrupted is not None:  # how long the job went without a world to train in
            reformed = {"reformed_in": round(self._now - self.disrupted[0], 3), "cause": self.disrupted[1]}
            self.disrupted = None
        self.short_since, self.announced, self.commit_high = None, frozenset(), commit
        world = {}
        hosts = sorted({place.hostname for _, place in plan})
        for worker, place in plan:
            inc = self.workers[worker]
            world[worker] = replace(place, round=self.round, updates=self.updates)
            self._set_phase(inc, Phase.TRAINING)
            self.joiners.pop(worker, None)
            inc.rank = place.rank
            inc.answer = (self.round, {"world": world[worker].to_dict(), "hosts": hosts})
            self._emit(Answer(worker, 200, inc.answer[1], place.rank))
        for c in candidates:
            if c.worker not in world:  # beyond --max-np, or on a slot that is gone
                self._remove(self.workers[c.worker])
        if old_round:
            self._emit(DropScope(f"gloo.{old_round}"))
        self.world, self.staying = world, set(world)
        leaving = sorted(self.workers[w].slot for w in world
                         if not self._usable(self.workers[w].slot))
        if leaving and len(world) > len(leaving):
            self._announce(f"state handed over, slots removed: {leaving}")
        self._log("round_complete", round=self.round, size=len(world), resets=self.resets,
                  commit=commit, members={self.workers[w].slot: p.rank for w, p in world.items()},
                  **reformed)

    # ---- helpers ----------------------------------------------------------------------
    def _live(self):
        return [inc for phase in self.phases.values() for inc in phase.values()]

    def _resumable_from_disk(self) -> bool:
        """With --checkpoint-dir, every worker failing after a commit need not end the job
        (Horovod's rule) while some slot is only cooling down: workers launched there read
        the newest commit from disk. The newest commit any worker reported becomes the one to
        match, so a world formed from an older one says `commit_lost`, or fails if none is left."""
        if not self.policy.durable:
            return False
        self.commit_high = max([self.commit_high] + [w.commit for w in self.workers.values()])
        permanent = self.blacklist.permanent
        return self.commit_high > 0 and any(
            not permanent(f"{h}/{i}") and not permanent(h) for h, n in self.hosts for i in range(n))

    def _any_live(self):
        return any(self.phases.values())

    def _set_phase(self, inc, phase):
        if inc.phase is not Phase.GONE:
            del self.phases[inc.phase][inc.id]
        if phase is not Phase.GONE:
            self.phases[phase][inc.id] = inc
        if phase in (Phase.LEAVING, Phase.GONE):
            self.joiners.pop(inc.id, None)
        inc.phase = phase

    def _current(self, worker) -> Optional[Incarnation]:
        inc = self.workers.get(worker)
        return inc if inc is not None and inc.alive else None

    def _announce(self, reason):
        self.updates += 1
        self._disrupt("hosts updated")
        self._log("hosts_updated", updates=self.updates, reason=reason)
        self._emit(Publish(self.updates, self.broken))

    def _mark_broken(self):
        if self.round and self.broken < self.round:
            self.broken = self.round
            self._disrupt("failure")
            self._log("round_broken", round=self.round)
            self._emit(Publish(self.updates, self.broken))

    def _disrupt(self, why):
        if self.round and self.disrupted is None:
            self.disrupted = (self._now, why)

    def _answer_removed(self, worker):
        self._emit(Answer(worker, 200, REMOVED))

    def _remove(self, inc: Incarnation):
        """Take a worker out of the job: a waiting one is told so and exits 0, others are stopped."""
        was = inc.phase
        self._set_phase(inc, Phase.LEAVING)
        if was is Phase.WAITING:
            self._answer_removed(inc.id)
        else:
            self._emit(Stop(inc.id, self.policy.stop_grace))

    def _kill(self, inc: Incarnation, event, why):
        inc.killed = why
        self._log(event, slot=inc.slot, worker=inc.id, rank=inc.rank, reason=why, action="killing it")
        self._emit(Stop(inc.id, 0.0))
        if inc.id in self.world:
            self._mark_broken()

    def _check_short(self, ready):
        if self.short_since is None:
            self.short_since = self._now
            self._log("waiting_for_workers", ready=ready, min_np=self.policy.min_np)
        elif self._now - self.short_since > self.policy.elastic_timeout:
            raise JobFailed(f"fewer than --min-np {self.policy.min_np} workers for --elastic-timeout "
                            f"{self.policy.elastic_timeout:g} s; stopping the job")

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


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
