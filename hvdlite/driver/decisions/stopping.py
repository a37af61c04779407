"""The graceful stop (docs/signals.md): a signal asks every worker to leave at its next commit;
the job ends once all have left, or --stop-timeout after the signal, resumable if a commit
is on disk. A commit newer than the disk that only workers between worlds hold (rank 0, the
writer, died) is written first by one last world of its best holder. A mixin of ElasticCore:
it reads and sets the core's `stopping`."""
import signal

from hvdlite import exitcodes
from hvdlite.driver.decisions.messages import Publish, StopRequested
from hvdlite.driver.decisions.plan import Candidate, best_holder, plan_world
from hvdlite.driver.decisions.workers import Phase


class GracefulStop:
    def _on_stop(self, event: StopRequested):
        if self.stopping is not None:
            return
        self._log("stop_requested", signal=_signal_name(event.signum), timeout=self.policy.stop_timeout)
        self._stop(event.signum)

    def _fail(self, failure):
        """The job ends on `failure` (a JobFailed): at once, or, when waiting workers hold a
        commit the disk lacks (the --min-np wait timed out after rank 0 died, say), once the
        last world wrote it, within --stop-timeout, as a stop's would."""
        if self.stopping is None and any(self._unwritten(inc) for inc in self.phases[Phase.WAITING].values()
                                         if inc.killed is None):
            self.failure = failure
            self._log("writing_before_the_end", reason=str(failure), timeout=self.policy.stop_timeout)
            self._stop(None)
            return self._decide_stopping()
        reason = str(failure)
        if self.failure is not None and self.ledger.disk:
            reason += f"; commit {self.ledger.disk} is in --checkpoint-dir"
        self._log("job_end", result="failure", reason=reason)
        self._end(failure.code, reason)

    def _stop(self, signum):
        self.stopping = (self._now, signum)
        self._emit(Publish(self.updates, self.broken, stop=True))
        for inc in self._live():
            if inc.phase is Phase.STARTING:
                self._remove(inc)  # a waiting one may hold a commit to write (_decide_stopping)

    def _stopped(self):
        """The graceful stop is over: every worker left, or the time is up."""
        signum, p = self.stopping[1], self.policy
        late = sorted(inc.name for inc in self._live())
        for inc in self._live():
            self._kill(inc, "worker_stop_timeout", f"no commit within {p.stop_timeout:g} s of the stop")
        if self.failure is not None:
            self.stopping = None  # the failure ends the job, as it would have at once
            return self._fail(self.failure)
        # Only what the writer said reached the disk is named with --checkpoint-dir.
        commit = self.ledger.disk if p.durable else self.ledger.newest
        resumable = p.durable and commit > 0
        unwritten = {"newest": self.ledger.newest} if p.durable and self.ledger.newest > commit else {}
        self._log("job_end", result="stopped", signal=_signal_name(signum), commit=commit,
                  resumable=resumable, durable=p.durable, late=late, **unwritten)
        self._end(exitcodes.RESUMABLE if resumable else 128 + signum)

    def _stop_overdue(self) -> bool:
        return self.stopping is not None and self._now - self.stopping[0] > self.policy.stop_timeout

    def _decide_stopping(self):
        """While stopping, nothing but the end is decided: it comes once no worker is left. A
        worker waiting between worlds goes, unless it holds a commit the disk lacks: then, once
        no member is left in the world, one last world of its best holder syncs, writes it and
        leaves (its write is heard before its exit)."""
        if self.ended:
            return
        holders = []
        for inc in list(self.phases[Phase.WAITING].values()):
            if inc.killed is None and self._unwritten(inc):
                holders.append(Candidate(inc.id, inc.slot, inc.host, inc.commit))
            else:
                self._remove(inc)
        if holders and not self.staying:
            best = best_holder(self.hosts, holders)
            return self._form(plan_world(self.hosts, [best], 1), holders, best.commit, last=True)
        if not self._any_live():
            self._stopped()

    def _unwritten(self, inc) -> bool:
        """Whether the waiting worker holds a commit that is neither on disk nor written by the
        current world's rank 0 (the writer) as it exits."""
        writer = [w.commit for w in self.workers.values()
                  if w.alive and w.killed is None and w.id in self.world and self.world[w.id].rank == 0]
        return self.policy.durable and inc.commit > max([self.ledger.disk] + writer)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
