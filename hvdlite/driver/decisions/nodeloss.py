"""A lost node told from a paused worker, in a second: the driver probes a suspect's node.

A worker is suspect while its heartbeat is Policy.probe_after late, or once a survivor's
collective broke on its connections to it (LinkBroken) until it is heard again. The executor
probes it (Probe): a TCP connect to a socket the worker listens on, which its node's kernel
answers even while the process is stopped or starved of CPU. LISTENING (or UNPROBED: no socket
of its reachable) is no news: the worker gets the liveness timeout as before. REFUSED (the node
answered, the socket is closed, so the process is gone) or SILENT (nothing answered: a dead
node, a cut cable) ends the worker, its host blamed, without waiting for an exit its launcher
may hear of only after minutes (srun and Ray lose a node's processes with the node's daemon).
A refused one's launcher still gets EXIT_WAIT to report the exit, which says why (an
exception's line).
A suspect is probed again until it is heard from or ends, one probe at a time: a probe that
found it LISTENING may have come just before its node died (under load a late beat is probed
often, a node's processes die one by one), and it will never be heard again to say so.
"""
import signal

from hvdlite.driver.decisions.messages import HOST, REFUSED, SILENT, LinkBroken, Probe, Probed, Stop
from hvdlite.driver.decisions.workers import Phase

EXIT_WAIT = 0.5  # seconds a launcher that runs on gets to report a refused worker's exit
# Seconds between probes of one suspect: REPROBE, or a third of its silence once longer, so
# that a worker stopped for minutes keeps few connects in its accept queue (worker/probed.py).
REPROBE = 0.5
LOST = {REFUSED: "its node answered but its process is gone",
        SILENT: "its node did not answer a probe"}


class NodeLoss:
    """Mixed into ElasticCore; keeps its marks on the Incarnation (probed_at, probing,
    link_broken_at, refused_at)."""

    def _on_link_broken(self, event: LinkBroken):
        for peer in event.peers:
            inc = self._current(peer)
            # One back in the rendezvous is alive: its link broke because the world did.
            if inc is not None and inc.killed is None and inc.phase is Phase.TRAINING:
                inc.link_broken_at = self._now
                self._probe(inc, f"link from {event.worker} broke")

    def _probe_suspects(self):
        """Probe the suspects that are due, end the refused whose exit nobody reported (Tick)."""
        late = self._now - self.policy.probe_after
        for inc in self._live():
            if inc.killed is not None:
                continue
            if inc.refused_at is not None:
                if self._now - inc.refused_at > EXIT_WAIT:
                    self._lost(inc, REFUSED)
            elif inc.exiting_since is not None or inc.phase is Phase.LEAVING:
                continue
            elif inc.heard_at is not None and inc.heard_at < late:
                self._probe(inc, "heartbeat late")
            elif inc.link_broken_at is not None and inc.link_broken_at >= (inc.heard_at or 0.0):
                self._probe(inc, "its link broke, not heard since")

    def _probe(self, inc, why):
        """Probe it unless a probe is in flight, or one began since it was last heard and since
        a link to it last broke, less than the interval ago."""
        heard = inc.heard_at or inc.launched_at
        news = max(heard, inc.link_broken_at or heard)
        if inc.probing or inc.probed_at is not None and inc.probed_at >= news \
                and self._now - inc.probed_at < max(REPROBE, (self._now - heard) / 3):
            return
        inc.probed_at, inc.probing = self._now, True
        self._log("node_probe", worker=inc.id, slot=inc.slot, reason=why)
        self._emit(Probe(inc.id))

    def _on_probed(self, event: Probed):
        inc = self._current(event.worker)
        inc.probing = False
        self._log("node_probed", worker=inc.id, slot=inc.slot, outcome=event.outcome)
        if event.outcome not in LOST or inc.killed is not None or (inc.heard_at or 0.0) > inc.probed_at or \
                event.outcome == SILENT and self.in_doubt is not None:
            # Its node answers for it, or it was heard since the probe began, or a driver that
            # may be cut off heard nothing (core.in_doubt): the liveness timeout decides, as for
            # any silence, unless a later probe says otherwise.
            return
        if event.outcome == REFUSED:
            inc.refused_at = inc.refused_at or self._now
        else:
            self._lost(inc, event.outcome)

    def _lost(self, inc, outcome):
        self._emit(Stop(inc.id, 0.0))  # whatever its launcher still holds of it
        # A drained host's workers go anyway: not its fault (as their exits, core.py).
        if self._gone(inc, -signal.SIGKILL, node=outcome) is not Phase.LEAVING and inc.host not in self.drained:
            self._blame(inc, HOST, f"{inc.name} on {inc.host}: {LOST[outcome]}")
