"""A lost node told from a paused worker, in a second: the driver probes a suspect's node.

A worker is suspect when a survivor's collective broke on its connections to it (LinkBroken)
or when its heartbeat is Policy.probe_after late. The executor then probes it (Probe): a TCP
connect to a socket the worker listens on, which its node's kernel answers even while the
process is stopped or starved of CPU. LISTENING (or UNPROBED: no socket of its reachable) is no
news: the worker gets the liveness timeout as before. REFUSED (the node answered, the socket is
closed, so the process is gone) or SILENT (nothing answered: a dead node, a cut cable) ends the
worker, its host blamed, without waiting for an exit its launcher may hear of only after
minutes (srun and Ray lose a node's processes with the node's daemon). A refused one's
launcher still gets EXIT_WAIT to report the exit, which says why (an exception's line). One
probe per suspicion: a worker is probed again only once heard since.
"""
import signal

from hvdlite.driver.decisions.messages import HOST, REFUSED, SILENT, LinkBroken, Probe, Probed, Stop
from hvdlite.driver.decisions.workers import Phase

EXIT_WAIT = 0.5  # seconds a launcher that runs on gets to report a refused worker's exit
LOST = {REFUSED: "its node answered but its process is gone",
        SILENT: "its node did not answer a probe"}


class NodeLoss:
    """Mixed into ElasticCore; `probed`: worker -> when its node was last probed; `refused`:
    worker -> when a probe found its process gone."""

    def _on_link_broken(self, event: LinkBroken):
        for peer in event.peers:
            inc = self._current(peer)
            # One back in the rendezvous is alive: its link broke because the world did.
            if inc is not None and inc.killed is None and inc.phase is Phase.TRAINING:
                self._probe(inc, f"link from {event.worker} broke")

    def _probe_late(self):
        """Probe the workers whose heartbeat is late, end the refused whose exit nobody
        reported (Tick)."""
        for worker, at in list(self.refused.items()):
            inc = self._current(worker)
            if inc is None or inc.killed is not None:
                del self.refused[worker]
            elif self._now - at > EXIT_WAIT:
                del self.refused[worker]
                self._lost(inc, REFUSED)
        late = self._now - self.policy.probe_after
        for inc in self._live():
            if inc.heard_at is not None and inc.heard_at < late and inc.killed is None \
                    and inc.exiting_since is None and inc.phase is not Phase.LEAVING:
                self._probe(inc, "heartbeat late")

    def _probe(self, inc, why):
        if self.probed.get(inc.id, -1.0) < (inc.heard_at or inc.launched_at):
            self.probed[inc.id] = self._now
            self._log("node_probe", worker=inc.id, slot=inc.slot, reason=why)
            self._emit(Probe(inc.id))

    def _on_probed(self, event: Probed):
        inc = self._current(event.worker)
        self._log("node_probed", worker=inc.id, slot=inc.slot, outcome=event.outcome)
        if event.outcome not in LOST or inc.killed is not None \
                or (inc.heard_at or 0.0) > self.probed.get(inc.id, 0.0):
            # Its node answers for it, or it was heard since the probe began: the liveness
            # timeout decides, as for any silence.
            return
        if event.outcome == REFUSED:
            self.refused.setdefault(inc.id, self._now)
        else:
            self._lost(inc, event.outcome)

    def _lost(self, inc, outcome):
        self._emit(Stop(inc.id, 0.0))  # whatever its launcher still holds of it
        # A drained host's workers go anyway: not its fault (as their exits, core.py).
        if self._gone(inc, -signal.SIGKILL, node=outcome) is not Phase.LEAVING and inc.host not in self.drained:
            self._blame(inc, HOST, f"{inc.name} on {inc.host}: {LOST[outcome]}")
