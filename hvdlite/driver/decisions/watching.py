"""Hangs and stragglers in an elastic job (hangs.py and stragglers.py say the rules): a hung
member is named, its stack asked for, and killed as failed once the stack is in or STACK_WAIT
passed; stragglers are named, and with --straggler-policy evict a persistent one is failed. A
mixin of ElasticCore: it reads the core's world and sets its `progress`, `stragglers`, `hung`."""
from hvdlite.driver.decisions.hangs import NO_STACK, STACK_WAIT, Progress, ceiling
from hvdlite.driver.decisions.messages import AskStack, Heartbeats, StackDump
from hvdlite.driver.decisions.stragglers import PERSIST
from hvdlite.driver.decisions.workers import Phase


class Watching:
    def _progress(self) -> Progress:
        """The current world's counts: a new world's start afresh."""
        if self.progress_round != self.round:
            self.progress_round = self.round
            self.progress.new_world(self._now)
            self.stragglers.new_world(self._now)
        return self.progress

    def _watch_beats(self, event: Heartbeats):
        """The members' collective counts and waits, from their own beats; the stand-ins'."""
        progress, waited, idle = self._progress(), dict(event.waited), set(event.idle)
        for worker, _ in event.vouched:
            progress.vouched(worker, self._now)
        for worker, n in event.calls:
            if worker in self.staying and self.workers[worker].phase is Phase.TRAINING:
                progress.heard(worker, n, self._now)
                if worker in waited:
                    self.stragglers.heard(worker, n, waited[worker], self._now, worker in idle)

    def _check_hangs(self):
        """A member its peers wait on that made no progress for the hang timeout is named, its
        stack asked for, and killed as failed once the stack is in or STACK_WAIT passed."""
        now, p = self._now, self.policy
        for worker, since in list(self.hung.items()):
            inc = self._current(worker)
            if inc is None or inc.killed is not None:
                del self.hung[worker]
            elif now - since > STACK_WAIT:
                self._log("worker_stack", slot=inc.slot, worker=inc.id, rank=inc.rank, missing=NO_STACK)
                self._kill_hung(inc)
        if not self.round or self.broken >= self.round:
            return  # a broken world: its members are leaving it, not hung
        # (A host update announced is no reason to look away: members leave only at their next
        # commit, and one hung before it holds its peers in a collective as in any world.)
        progress = self._progress()
        top = ceiling(p.collective_timeout)
        timeout = progress.timeout(p.hang_timeout, p.hang_floor, top)
        members = [w for w in self.staying if self.workers[w].phase is Phase.TRAINING]
        first_step = top if p.hang_timeout is None else None
        for worker, calls, waited_in, limit in progress.hung(members, now, timeout, first_step):
            inc = self.workers[worker]
            if worker not in self.hung and inc.killed is None:
                self.hung[worker] = now
                self._log("worker_hung", slot=inc.slot, worker=inc.id, rank=inc.rank,
                          reason=progress.reason(calls, waited_in, limit, now),
                          action="killing it once its stack is in")
                self._emit(AskStack(worker))

    def _check_stragglers(self):
        """Name stragglers and their recovery; with --straggler-policy evict, a straggler for
        PERSIST windows in a row is killed as failed (its slot or host blacklisted with the
        cooldown, hostrule.py) and the world re-forms without it."""
        if not self.round or self.broken >= self.round or self.disrupted is not None:
            return
        self._progress()
        members = [w for w in self.staying if self.workers[w].phase is Phase.TRAINING]
        for event, worker, step, median in self.stragglers.check(members, self._now):
            inc = self.workers[worker]
            self._log(event, slot=inc.slot, worker=inc.id, rank=inc.rank, step=round(step, 4),
                      median=round(median, 4))
        if not self.policy.straggler_evict or len(members) <= max(self.policy.min_np, 1):
            return  # never below --min-np for a slow rank: slow beats stopped
        for worker in sorted(members):
            inc = self.workers[worker]
            if self.stragglers.persistent(worker) and inc.killed is None:
                return self._kill(inc, "straggler_evicted", f"a straggler for {PERSIST} windows in a "
                                                            f"row (--straggler-policy evict)")

    def _on_stack(self, event: StackDump):
        inc = self._current(event.worker)
        if inc is not None and event.worker in self.hung:
            self._log("worker_stack", slot=inc.slot, worker=inc.id, rank=inc.rank, stack=event.stack)
            self._kill_hung(inc)

    def _kill_hung(self, inc):
        # Blamed as any worker the driver kills (hostrule.py): the driver cannot tell user code
        # that never returns from a host whose filesystem or device stopped answering, and the
        # cooldown lets the slot back once it is over.
        del self.hung[inc.id]
        self._kill(inc, None, "hung: no progress while its peers waited on it")
