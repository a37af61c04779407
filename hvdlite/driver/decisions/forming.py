"""When the next world forms and who is in it: launches on free slots, the host update once
every joiner waits, the world formed once every member left the last one (ranks staying put, every rank
syncing from the holder of the newest commit, a live holder on an unusable slot syncing it
before it leaves), and the wait for
--min-np workers. A mixin of ElasticCore: it reads and sets the core's rounds and workers."""
from dataclasses import replace

from hvdlite.driver.decisions.messages import Answer, DropScope, Launch
from hvdlite.driver.decisions.plan import (
    Candidate, free_slots, host_of, plan_world, prospective_places, state_source)
from hvdlite.driver.decisions.workers import Incarnation, Phase, overdue


class JobFailed(Exception):
    """Raised inside the core to end the job; handle() turns it into EndJob(code, message)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class Forming:
    def _grow(self):
        if not self.hosts_known:
            return
        live = self._live()
        limit = (self.policy.max_np or 1 << 30) - (len(live) - len(self.phases[Phase.LEAVING]))
        # A slot whose earlier process is still ending is not free yet.
        occupied = {inc.slot for inc in live}
        free = free_slots(self.hosts, occupied,
                          lambda key: key in self.left or self._blocked(key) or self._retrying(key), limit)
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
        self._schedule(inc)
        self._emit(Launch(inc.id, slot, host, self.slots_of[host], place, joining=self.round > 0))

    def _maybe_form(self):
        if self.round == 0:
            if self.phases[Phase.STARTING]:
                return  # the first world waits for every launched worker (start timeout)
        elif self.staying and not self._leave_behind():
            return  # a member is still in the current world
        # A worker being killed (silent, too slow to start, stuck) is in no world.
        candidates = [Candidate(inc.id, inc.slot, inc.host, inc.commit,
                                self.world[inc.id].rank if inc.id in self.world else None)
                      for inc in self.phases[Phase.WAITING].values() if inc.killed is None]
        # A leaver (SIGTERM) is in no world but one that takes its state before it goes.
        usable = [c for c in candidates if self._usable(c.slot) and self.workers[c.worker].leaving_since is None]
        source = state_source(self.hosts, candidates, usable)
        if len(usable) < self.policy.min_np:
            return self._check_short(len(usable), source)
        members = usable + [source] if source is not None else usable
        top = self.ledger.start(max(c.commit for c in members))
        if any(inc.commit > top for inc in self._behind()):
            return  # it comes back and joins, or is killed after --elastic-timeout and counted
        # One the last driver had answered (taken over: adoption.adopt) may hold the newer
        # commit: it asks this driver once it goes over to it, or is found gone.
        if top < self.ledger.newest and any(inc.answer is not None and inc.killed is None
                                            for inc in self.phases[Phase.STARTING].values()):
            return
        if top == 0 < self.ledger.newest:
            raise JobFailed(f"every worker holding the training state is gone (last commit "
                            f"{self.ledger.newest}); stopping rather than training from scratch")
        if self.round >= 1 and self.policy.reset_limit is not None \
                and self.resets >= self.policy.reset_limit:
            raise JobFailed(f"reset limit {self.policy.reset_limit} reached (--reset-limit); "
                            f"stopping the job")
        max_np = self.policy.max_np
        if source is not None and max_np is not None:
            max_np += 1  # the source only syncs the others, then leaves
        last_ranks = {self.workers[w].slot: place.rank for w, place in self.world.items()}
        self._form(plan_world(self.hosts, members, max_np, last_ranks), candidates, top,
                   handover=source is not None)

    def _leave_behind(self) -> bool:
        """Whether the next world may form without the members still in the broken one: true
        once the world broke over --liveness-timeout ago (a survivor whose connections were cut
        is back in milliseconds; pygloo may lose the wakeup and sit out its own 30 s), or over
        Policy.held_grace ago when each of them is held in a collective of it (_held), and the
        waiting workers hold every commit those members reported since it broke. A left-behind
        member is not failed: when it comes back it joins as any joiner."""
        if self.broken < self.round:
            return False
        since = self._now - self.broken_at
        # Asked again as each survivor comes back: the first member not held ends most asks.
        held = all(self._held(self.workers[w]) for w in self.staying)
        if since <= self.policy.liveness_timeout and not held:
            return False
        stuck = [self.workers[w] for w in self.staying]
        top = max((inc.commit for inc in self.phases[Phase.WAITING].values()
                   if inc.killed is None and overdue(inc, self._now, self.policy, None) is None), default=-1)
        # One being killed exits at once; one unheard since the break may hold a newer commit.
        if any(inc.killed is not None or inc.heard_at is None or inc.heard_at <= self.broken_at
               or inc.commit > top for inc in stuck):
            return False
        for inc in sorted(stuck, key=lambda inc: inc.slot):
            inc.left_behind = self.broken_at  # --elastic-timeout still ends it if it never returns
            self._log("member_left_behind", slot=inc.slot, worker=inc.id, rank=inc.rank, round=self.round,
                      after=round(since, 3), **({"held": "in a pygloo collective"} if held else {}))
        self.staying = set()
        return True

    def _behind(self):
        """Live members left behind in a broken world: each holds what it reported."""
        return [inc for inc in self.phases[Phase.TRAINING].values()
                if inc.left_behind is not None and inc.killed is None]

    def _held(self, inc) -> bool:
        """Its stand-in beats for it, in the group of the broken world, and has since the break,
        while its own heartbeat has been silent for Policy.held_grace: pygloo holds its GIL
        inside a collective of that world. A torch worker has no stand-in."""
        grace = self.policy.held_grace
        return inc.vouched is not None and inc.vouched[1] == self.round and inc.vouched[0] > self.broken_at \
            and self._now - max(inc.own_at or 0.0, self.broken_at) > grace

    def _form(self, plan, candidates, commit, handover=False, last=False):
        """`last`: the stop's last world, which only writes `commit` (a hand-over to nobody)."""
        handover = handover or last
        # Every holder of a newer commit died or left: said for any world, the last one of a
        # stop or failure too (its best holder may hold less than the writer that died).
        if commit < self.ledger.newest:
            self._log("commit_lost", newest=self.ledger.newest, resumed=commit)
        if self.round >= 1:
            self.resets += 1
        old_round, self.round = self.round, self.round + 1
        reformed = {}
        if self.disrupted is not None:  # how long the job went without a world to train in
            reformed = {"reformed_in": round(self._now - self.disrupted[0], 3), "cause": self.disrupted[1]}
            self.disrupted = None
        self.short_since, self.announced, self.kept = None, frozenset(), None
        self.ledger.went_on_from(commit)
        world = {}
        hosts = sorted({place.hostname for _, place in plan})
        for worker, place in plan:
            inc = self.workers[worker]
            world[worker] = replace(place, round=self.round, updates=self.updates, handover=handover)
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
        for w in self.world:  # the old world's members that are gone are kept no longer
            if w not in world and not self.workers[w].alive:
                del self.workers[w]
        self.world, self.staying = world, set(world)
        self._log("round_complete", round=self.round, size=len(world), resets=self.resets,
                  commit=commit, members={self.workers[w].slot: p.rank for w, p in world.items()},
                  root=next(iter(world.values())).root if world else 0,
                  **({"last": True} if last else {"handover": True} if handover else {}), **reformed)

    def _check_short(self, ready, source):
        if self.short_since is None:
            self.short_since = self._now
            self._log("waiting_for_workers", ready=ready, min_np=self.policy.min_np)
        if source is not None and source.worker != self.kept:
            self.kept = source.worker  # it waits in the rendezvous: no training on its slot
            self._log("state_kept", worker=source.worker, slot=source.slot, commit=source.commit,
                      reason="its slot is gone or blacklisted and no usable worker waits")
        if self._now - self.short_since > self.policy.elastic_timeout:
            kept = "" if source is None else \
                f" (commit {source.commit} was kept on {source.slot}, a slot gone or blacklisted)"
            raise JobFailed(f"fewer than --min-np {self.policy.min_np} workers for --elastic-timeout "
                            f"{self.policy.elastic_timeout:g} s; stopping the job{kept}")
