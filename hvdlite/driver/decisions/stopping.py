"""The graceful stop (docs/signals.md): a signal asks every worker to leave at its next commit;
the job ends once all have left, or --stop-timeout after the signal, resumable if a commit
is on disk. A mixin of ElasticCore: it reads and sets the core's `stopping`."""
import signal

from hvdlite import exitcodes
from hvdlite.driver.decisions.messages import Publish, StopRequested
from hvdlite.driver.decisions.workers import Phase


class GracefulStop:
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

    def _stop_overdue(self) -> bool:
        return self.stopping is not None and self._now - self.stopping[0] > self.policy.stop_timeout

    def _decide_stopping(self):
        """While stopping, nothing but the end is decided: it comes once no worker is left."""
        if not self._any_live() and not self.ended:
            self._stopped()


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
