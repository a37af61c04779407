"""Random interleavings of everything that can happen to an elastic job, checked after every
step against the rules the core must keep (hypothesis RuleBasedStateMachine, no processes).

The workers are modelled just enough to behave like real ones: they wait in the rendezvous
(as long as it takes), train in lockstep (commits), sync from the root (or fail to), exit when
told, crash at any time, die with their template, fail to load a checkpoint, sit in a pygloo
collective of a broken world (their stand-in process beating for them), lose the driver, hang in
their own code while their peers wait in the next collective (hangs.py: named with their stack),
start on a starved machine (waiting for a CPU: never named while the time they could run stays
under --start-timeout),
straggle (stragglers.py: named, and with --straggler-policy evict failed), run out of data and
idle in hvd.join() while the others step (never named, nor the others' baseline), are paused (SIGSTOP) on
a node that answers probes, or lose their node (cut off: probes go silent).
With --checkpoint-dir the driver dies (or is paused past its lease) and a new one (the same
command, or a standby) takes the job over from the journal the old one wrote (decisions/adoption.py),
while the workers train on without a driver; the old one may come back, fenced. A driver that
dies where nobody takes over (before its first world, during a graceful stop), or that nobody
runs again within --driver-grace (a peer, rank 0 too, may die meanwhile), is run again too: the
rerun kills the workers that never trained, waits out those that may have, and resumes from the
disk (adoption.rerun), which holds the newest commit any of them held (durable.leaves_held).
Launches start, are refused by their host, fail in the driver's own fork, time out in the
launcher, or never start at all.
"""
import dataclasses
import json
import math
import os
import signal

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hvdlite import exitcodes
from hvdlite.driver.decisions import adoption
from hvdlite.driver.decisions.core import ElasticCore
from hvdlite.driver.decisions.hangs import ceiling
from hvdlite.driver.decisions.stragglers import PERSIST, WINDOW
from hvdlite.driver.decisions.ledger import Ledger
from hvdlite.driver.decisions.policy import Policy
from hvdlite.driver.decisions.workers import STARVED_CEILING, Phase, overdue_from
from hvdlite.driver.decisions.messages import (
    DRIVER, HOST, LAUNCHER, Answer, AskRunWait, AskStack, EndJob, Exited, Exiting, Heartbeats, HostsFound, Launch,
    Launched, LISTENING, REFUSED, SILENT, LaunchFailed, LeaseDoubt, Leaving, LinkBroken, LoadFailed, Log, Probe,
    Probed, Publish, Ready, RunWait, StackDump, Stop, StopRequested, TemplateDied, Tick, Written)
from hvdlite.driver.decisions.nodeloss import REPROBE
from hvdlite.worker import beacon, durable

UNIVERSE = [("a", 2), ("b", 1), ("c", 2), ("d", 1)]
WHY = {HOST: "no route to host", DRIVER: "BlockingIOError: [Errno 11] Resource temporarily unavailable",
       LAUNCHER: "srun step on a did not start within 10 s"}
STEPS = 100
EXAMPLES = int(os.environ.get("HVDLITE_STATEFUL_EXAMPLES", "100"))  # 100 x 100 = 10,000 steps


class Proc:
    """What a worker process knows of itself."""

    def __init__(self, worker):
        self.worker = worker
        self.started = False
        self.alive = True
        self.round = None  # the world it was last answered with
        self.handover = False  # that world only hands the state over: leave it once synced
        self.stuck = False  # in user code for good (its heartbeat thread goes on)
        self.held = False  # stuck in a pygloo collective: its own beats stop, its stand-in's go on
        self.waiting = None  # `after` of its unanswered rendezvous request
        self.commit = 0  # commits its training state holds
        self.exit_code = None  # how it will exit: told to go, or stopped
        self.stop_when_started = None
        self.leaving = False  # a SIGTERM came: it leaves at its next commit
        self.said_leaving = False  # it told the driver so
        self.pending = None  # rank 0: the commit its checkpoint writer has not written yet
        self.calls = 0  # collectives entered in its current world (one a commit)
        self.waited = 0.0  # seconds it waited in them
        self.idle = False  # in hvd.join(): its data ran out, it answers the others' allreduces
        self.hung = False  # in its own code for good while its peers wait in the next collective
        self.first_step_in = None  # the round whose first step it took (first_step_takes_long)
        self.paused = False  # SIGSTOP: silent, its node answers probes for it
        self.cut = False  # its node is gone: silent, and so are probes of it
        self.asked_old = False  # its rendezvous request went to a driver that is gone: asked again on resuming
        self.starved = 0.0  # seconds it waited for a CPU (what the driver reads in its /proc)
        self.remote = worker.startswith("d/")  # host d is an SSH host: no /proc of it to read


class ElasticJob(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.core = ElasticCore(Policy(min_np=1, max_np=4, elastic_timeout=20.0, start_timeout=10.0,
                                       liveness_timeout=5.0, cooldown_range=(1.0, 4.0)),
                                rng=lambda: 0.5)
        self.now = 0.0
        self.procs = {}
        self.ended = None
        self.success_allowed = False  # an exit 0 of a current incarnation was sent
        self.last_actions = []
        self.lost = 0  # the newest commit the core has said was lost
        self.disk = None  # with --checkpoint-dir: the newest commit on disk, read by new workers
        self.loads = []  # LoadFailed events sent
        self.newest = 0  # the newest commit the driver was told of (reset by commit_lost)
        self.stop_published = False  # the driver asked every worker to leave at its next commit
        self.last_world = {}  # worker -> (slot, rank) in the last world formed
        self.counts = {}  # worker -> (round, collectives its beats said, when that last changed)
        self.asked = set()  # workers the driver asked for their stack (AskStack)
        self.named_hung = set()  # workers the driver named hung
        self.straggling = set()  # workers the driver named stragglers and not recovered since
        self.probes = []  # workers the driver asked to probe, not answered yet
        self.readings = []  # workers whose CPU wait the driver asked for (AskRunWait), not read yet
        self.failed = set()  # workers the driver blamed for their failure (their host's)
        # The job's drivers (--checkpoint-dir): [lease epoch, when it last renewed] of each; the
        # last one decides, the store's newest lease is self.epoch. What the workers accepted:
        self.drivers, self.epoch, self.accepted = [[1, 0.0]], 1, 1
        self.send(HostsFound(tuple(UNIVERSE[:2])))

    @initialize(evict=st.booleans())
    def straggler_policy(self, evict):
        self.core.policy = dataclasses.replace(self.core.policy, straggler_evict=evict)

    @initialize(fail=st.booleans())
    def fail_on_worker_failure(self, fail):
        """--fail-on-worker-failure (CI): a job that finished after a worker failed exits 1."""
        self.core.policy = dataclasses.replace(self.core.policy, fail_on_worker_failure=fail)

    @initialize(durable=st.booleans(), on_disk=st.sampled_from([0, 0, 2]))
    def checkpoint_dir(self, durable, on_disk):
        """Half the jobs run with --checkpoint-dir, some on a folder an earlier run left a
        checkpoint in: rank 0's writer writes its commits in the background, and every worker
        reports the newest on disk in its rendezvous requests as one it can restore."""
        self.core.policy = dataclasses.replace(self.core.policy, durable=durable)
        self.disk = on_disk if durable else None
        self.core.ledger = Ledger(self.disk or 0)  # what the driver reads in the folder as it starts
        self.newest = self.disk or 0

    # ---- plumbing -----------------------------------------------------------------------
    def send(self, event, dt=0.0):
        self.now += dt
        inc = self.core.workers.get(getattr(event, "worker", None))
        current = inc is not None and inc.alive
        phase, killed = (inc.phase, inc.killed) if current else (None, None)
        # Heard since its probe began: the probe's silence is old news (the model answers late).
        heard_since = current and (inc.heard_at or 0.0) > (inc.probed_at or 0.0)
        if isinstance(event, Exited) and event.code == 0:
            if current and phase is not Phase.LEAVING and killed is None:
                self.success_allowed = True
        self.heard(event)
        actions = self.core.handle(event, self.now)
        self.last_actions = actions
        self.note_failures(event, actions)
        for action in actions:
            self.perform(action)
        keys = [a.fields["key"] for a in actions if isinstance(a, Log) and a.event == "blacklisted"]
        if self.core.in_doubt is not None:  # a driver that may be cut off from everything
            done = [a for a in actions if isinstance(a, Launch) or isinstance(a, Log) and a.event in
                    ("blacklisted", "round_complete") or isinstance(a, Log) and "node" in a.fields]
            assert not done, f"a driver whose leadership is in doubt decided {done} on {event}"
        # No false alarm: a probe ends only a worker whose node or process is gone.
        lost = [a.fields for a in actions if isinstance(a, Log) and a.event == "worker_exit" and "node" in a.fields]
        for fields in lost:
            proc = self.procs[fields["worker"]]
            assert isinstance(event, (Probed, Tick)) and (proc.cut or not proc.alive), f"{proc.worker} ended on {event}"
        if keys and isinstance(event, Tick):  # only a refused worker whose exit nobody reported
            assert lost and set(keys) <= {f["slot"] for f in lost} | {f["slot"].split("/")[0] for f in lost}, \
                f"{keys} blacklisted on a tick ({lost})"
        elif keys:  # no host (or slot) is blacklisted but for its own worker's failure
            # Nobody is blamed for the driver's trouble (its fork failed, workers lost it), the
            # launcher's (a start that timed out) or the job's input (65: a checkpoint that does
            # not load).
            failed = isinstance(event, LaunchFailed) and event.whose == HOST or killed is not None or \
                isinstance(event, Exited) and event.code not in (0, exitcodes.LOST_DRIVER, exitcodes.UNLOADABLE) or \
                isinstance(event, Probed) and event.outcome == SILENT
            assert current and failed and (phase is not Phase.LEAVING or inc.overdue), \
                f"{keys} blacklisted on {event} (worker {phase}, killed: {killed})"
            assert set(keys) <= {inc.slot, inc.host}, f"{keys} blacklisted for {inc.slot}'s failure"
            # --blacklist auto on a single host: the slot, and the host only once none of its
            # workers lives.
            living = [w for w, i in self.core.workers.items() if i.alive and i.host == inc.host]
            assert inc.host not in keys or len(self.core.hosts) > 1 or not living, \
                f"host {inc.host} blacklisted on {event} while {living} live there"
        if isinstance(event, Probed) and event.outcome == SILENT and current and killed is None and not heard_since \
                and self.core.in_doubt is None:
            assert not self.core.workers.get(event.worker, inc).alive, f"{event.worker} lives on after {event}"
        if isinstance(event, Tick):
            self.lost_nodes_are_probed_on()
        return actions

    def note_failures(self, event, actions):
        """The workers this event's actions blame (send() checks that each really failed): the
        one the event is about, or on a tick those whose node was found lost."""
        if not any(isinstance(a, Log) and a.event == "blacklisted" for a in actions):
            return
        if not isinstance(event, Tick):
            self.failed.add(event.worker)
            return
        for a in actions:
            if isinstance(a, Log) and a.event == "worker_exit" and "node" in a.fields and \
                    not a.fields.get("removed") and a.fields["slot"].split("/")[0] not in self.core.drained:
                self.failed.add(a.fields["worker"])

    def check_end_code(self, end):
        """How a job whose training finished (a worker exited 0) ends, unless a stop or a
        checkpoint that does not load ends it first: 0, or with --fail-on-worker-failure 1 once
        a worker failed on the way, its line counting them. Never 0 with the flag after a failure."""
        flag, failed = self.core.policy.fail_on_worker_failure, sorted(self.failed)
        assert not (flag and failed and end.code == exitcodes.FINISHED), \
            f"the job exited 0 though {failed} failed on the way (--fail-on-worker-failure)"
        if not self.success_allowed or self.stop_published or end.code == exitcodes.UNLOADABLE:
            return
        if flag and failed:
            n = len(failed)
            assert end.code == exitcodes.FAILED and f"but {n} worker{'' if n == 1 else 's'} failed" in end.error, \
                f"the job finished after {failed} failed (--fail-on-worker-failure) and ended with {end}"
        else:
            assert end.code == exitcodes.FINISHED, f"the job finished ({failed} failed) and ended with {end}"

    def lost_nodes_are_probed_on(self):
        """A worker whose node is gone, silent past probe_after, is never left unprobed for
        longer than a third of its silence (REPROBE at least), whatever an earlier probe said:
        it is known by a probe, not after the liveness timeout. (A probe in flight: the
        model answers it when it will.) Once the job ended nothing is decided any more: the
        core ignores every event, and the driver's loop returned and stops every worker."""
        if self.core.ended:
            return
        for proc in self.procs.values():
            inc = self.core.workers.get(proc.worker)
            if not proc.cut or inc is None or not inc.alive or inc.killed is not None or inc.probing \
                    or inc.exiting_since is not None or inc.phase is Phase.LEAVING or inc.heard_at is None:
                continue
            silence = self.now - inc.heard_at
            if inc.heard_at < self.now - self.core.policy.probe_after:  # the core's sum: floats
                assert inc.probed_at is not None and self.now - inc.probed_at < max(REPROBE, silence / 3), \
                    f"{proc.worker} cut off, silent {silence:.2f} s, last probed at {inc.probed_at} (now {self.now:.2f})"

    def heard(self, event):
        """What the driver is told of the commits workers hold, and of their collectives."""
        for worker, calls in event.calls if isinstance(event, Heartbeats) else ():
            round_, before, since = self.counts.get(worker, (None, None, None))
            if (round_, before) != (self.procs[worker].round, calls):
                self.counts[worker] = (self.procs[worker].round, calls, self.now)
        told = [event.commit] if isinstance(event, (Ready, Exiting, Written)) else \
            [c for _, c in event.beats] if isinstance(event, Heartbeats) else []
        self.newest = max([self.newest] + told)

    def perform(self, action):
        if isinstance(action, Log) and action.event == "worker_hung":
            self.check_hung(action.fields["worker"])
        if isinstance(action, AskStack):
            self.asked.add(action.worker)
        if isinstance(action, Log) and action.event in ("straggler", "straggler_recovered", "straggler_evicted"):
            self.check_straggler(action)
        if isinstance(action, Log) and action.event == "blacklisted":
            host = action.fields["key"].split("/")[0]
            assert host not in self.core.drained, f"{action.fields['key']} blacklisted though drained"
        if isinstance(action, Log) and action.event == "worker_start_timeout":
            self.check_start_timeout(action.fields["worker"])
        if isinstance(action, AskRunWait):
            self.readings.append(action.worker)
        if isinstance(action, Probe):
            self.probes.append(action.worker)
        elif isinstance(action, Launch):
            assert action.worker not in self.procs, "an incarnation id was used twice"
            self.procs[action.worker] = Proc(action.worker)
        elif isinstance(action, Answer):
            proc = self.procs.get(action.worker)
            if proc is None or not proc.alive:
                return
            proc.waiting = None
            if action.body.get("removed"):
                proc.exit_code = exitcodes.LEFT if proc.leaving else 0
            elif "world" in action.body:
                proc.round = action.body["world"]["round"]
                proc.calls, proc.waited = 0, 0.0
                proc.handover = action.body["world"]["handover"]
                world = action.body["world"]
                if world["rank"] == world["root"]:  # the root loads the disk when it is newer
                    proc.commit = self.said(proc)
        elif isinstance(action, Stop):
            proc = self.procs[action.worker]
            if not proc.started:
                proc.stop_when_started = -9 if action.grace == 0 else -15
            elif proc.alive:
                proc.exit_code = -9 if action.grace == 0 else -15
        elif isinstance(action, EndJob):
            load = [a for a in self.loads if a.reason in (action.error or "")]
            assert not self.loads or (action.code == exitcodes.UNLOADABLE and load), \
                f"a commit that does not load ended the job with {action}"
            assert self.ended is None, "the job ended twice"
            self.ended = action
            self.check_end_code(action)
            if "is in --checkpoint-dir" in (action.error or ""):  # a failure's end names the disk's commit
                assert action.error.endswith(f"; commit {self.disk} is in --checkpoint-dir"), (action, self.disk)
            if "training state is gone" in (action.error or ""):
                holders = [p.worker for p in self.running() if p.commit > 0
                           and self.core.workers[p.worker].killed is None]
                assert not holders, f"{action.error}, but {holders} hold it"
            if action.code == 0:
                assert self.success_allowed, "success without an exit 0 of a current incarnation"
                waiting = [p.worker for p in self.procs.values() if p.alive and p.waiting is not None]
                assert not waiting, f"the job ended with workers left waiting: {waiting}"
        elif isinstance(action, Log) and action.event == "round_complete":
            self.check_new_world(action.fields.get("last", False))
        elif isinstance(action, Log) and action.event == "commit_lost":
            self.lost = max(self.lost, action.fields["newest"])
        elif isinstance(action, Log) and action.event == "job_end" and action.fields["result"] == "stopped":
            self.check_stop_line(action.fields)
        elif isinstance(action, Publish) and action.stop:
            self.stop_published = True

    def check_start_timeout(self, worker):
        """A start that kept getting CPU time is never named by the start rule while the time
        it could run (the wall clock less its wait for a CPU) stays under --start-timeout, up to
        the ceiling's wall clock; one of another host (no reading) goes by the wall clock."""
        inc, proc, limit = self.core.workers[worker], self.procs[worker], self.core.policy.start_timeout
        wall, starved = self.now - inc.launched_at, 0.0 if proc.remote else proc.starved
        assert wall - starved > limit - 1e-9 or wall > limit * STARVED_CEILING - 1e-9, \
            f"{worker} named after {wall:.2f} s, {starved:.2f} s of them waiting for a CPU"

    def readings_answer(self):
        """The executor reads a local worker's CPU wait in its /proc at once; None for host d's."""
        readings, self.readings = self.readings, []
        for worker in readings:
            proc = self.procs[worker]
            self.send(RunWait(worker, None if proc.remote or not proc.alive else proc.starved))

    @rule(dt=st.sampled_from([2.0, 6.0, 12.0]), share=st.sampled_from([0.0, 0.05, 0.5]))
    def the_machine_starves_starting_workers(self, dt, share):
        """A burst of process starts, or a CFS quota: for dt seconds every starting worker gets
        `share` of the CPU it wants and waits on the run queue the rest of the time."""
        for proc in self.running():
            if proc.round is None and proc.waiting is None and proc.exit_code is None:
                proc.starved += dt * (1 - share)
        self.send(Tick(), dt=dt)
        self.readings_answer()

    def said(self, proc):
        """The commit a worker reports when it asks for a world: the newest it holds in memory
        or can read from --checkpoint-dir."""
        return max(proc.commit, self.disk or 0)

    def members(self):
        return [p for p in self.procs.values()
                if p.alive and p.round == self.core.round and p.waiting is None and p.exit_code is None
                and not p.stuck and not p.paused and not p.cut]

    def running(self):
        """The processes that run and can be heard (not paused, their node not cut off)."""
        return [p for p in self.procs.values() if p.started and p.alive and not p.paused and not p.cut]

    @staticmethod
    def beats(procs, stand_ins=True):
        """Their heartbeats: their own, and (numpy) their stand-ins', which alone go on while
        pygloo holds a worker in a collective."""
        return Heartbeats(tuple((p.worker, p.commit) for p in procs if not p.held),
                          tuple((p.worker, p.round or 0) for p in procs if p.held or stand_ins),
                          tuple((p.worker, p.calls) for p in procs if not p.held),
                          tuple((p.worker, p.waited) for p in procs if not p.held),
                          tuple(p.worker for p in procs if not p.held and p.idle))

    # ---- rules ---------------------------------------------------------------------------
    @rule(hosts=st.lists(st.sampled_from(UNIVERSE), unique=True, max_size=4),
          how=st.sampled_from(["", "drained", "failed"]))
    def discover(self, hosts, how):
        """Hosts come and go; a source like Ray's says how the gone ones left."""
        gone = tuple(h for h, _ in self.core.hosts if h not in dict(hosts))
        self.send(HostsFound(tuple(hosts), **({how: gone} if how else {})), dt=0.05)

    @rule(data=st.data(), how=st.sampled_from(["ok", HOST, DRIVER, LAUNCHER, "template"]))
    def launch_completes(self, data, how):
        """A launch starts its worker, fails (the host is unreachable or refuses, the driver's
        own fork fails, the launcher's start times out), or finds that the template that was to
        fork the worker died first."""
        pending = sorted(p.worker for p in self.procs.values() if not p.started and p.alive)
        if not pending:
            return
        proc = self.procs[data.draw(st.sampled_from(pending))]
        if how == "ok":
            proc.started = True
            proc.exit_code = proc.stop_when_started
            self.send(Launched(proc.worker, 1000 + len(self.procs)), dt=0.01)
        else:
            proc.alive = False
            self.send(TemplateDied(proc.worker) if how == "template" else
                      LaunchFailed(proc.worker, WHY[how], how), dt=0.01)

    @rule()
    def launch_never_starts(self):
        """A launch sits in a queue, or its launcher hangs: no pid past --start-timeout."""
        if any(not p.started and p.alive for p in self.procs.values()):
            self.send(self.beats(self.running()), dt=0.0)
            self.send(Tick(), dt=self.core.policy.start_timeout + 0.5)

    @rule()
    def driver_stops_for_a_while(self):
        """Ctrl-Z then fg, a swap storm: every running worker loses the driver (exit 75, its
        own liveness timeout) before the driver runs again."""
        gone = [p for p in self.running()]
        self.now += self.core.policy.liveness_timeout + 1.0
        for proc in gone:
            proc.alive = False
            self.send(Exited(proc.worker, exitcodes.LOST_DRIVER), dt=0.0)
        self.send(Tick(), dt=0.01)

    @rule(data=st.data(), steps=st.integers(0, 3), peer_dies=st.booleans(), paused=st.booleans(),
          on_ssh=st.booleans())
    def driver_dies_and_a_new_one_takes_over(self, data, steps, peer_dies, paused, on_ssh=False):
        """kill -9 of the driver (or it is paused past its lease: a standby takes the lease); the
        members train on without it, a peer may die meanwhile (its survivors wait for a driver);
        then a new driver takes a greater lease and the job over from the last journal. A dead
        peer of this machine is told killed (its /proc); one of an SSH host (`on_ssh`: its host
        died, say) gone without a word is launched again, nobody blamed (job.py, _lead)."""
        c = self.core
        if self.disk is None or self.ended is not None or not adoption.adoptable(c):
            return
        saved = json.loads(json.dumps(adoption.journal(c, self.now)))  # through the store: bytes
        there = {w: (c.workers[w].slot, p.rank) for w, p in c.world.items() if c.workers[w].alive}
        members = [p for p in self.members() if not p.handover]
        if not self.must_leave():
            for _ in range(steps):
                for p in members:
                    self.commit_once(p)
        victim = data.draw(st.sampled_from(sorted(p.worker for p in members))) if peer_dies and members else None
        if victim is not None:
            self.procs[victim].alive = False
        self.now += c.policy.liveness_timeout + 1.0  # the old lease lapsed
        self.drivers[-1][1] = self.now - c.policy.liveness_timeout - 1.0  # its last renewal
        self.epoch += 1
        self.drivers.append([self.epoch, self.now])
        self.probes = []  # the old driver's probes in flight answer nobody now
        self.readings = []
        if not paused:
            self.drivers.pop(-2)  # dead: it never decides again
        running = {p.worker: 1000 + i for i, p in enumerate(self.procs.values()) if p.alive and p.started}
        how = adoption.ADOPTS if on_ssh else adoption.LOCAL  # an SSH host tells which of its workers run
        decision = adoption.rerun({**saved, "command": ["train.py"], "written_at": 0.0},
                                  {} if on_ssh else running, set(running) if on_ssh else set(), set(),
                                  {h: how for h in adoption.live_hosts(saved)},
                                  ["train.py"], "here", 1.0, c.policy.liveness_timeout, "/ckpt")
        assert decision.refused is None and not decision.kill, decision
        assert decision.adopt == any(w["id"] in running for w in saved["workers"] if w["phase"] != "gone"), decision
        assert not set(decision.gone) & set(running), decision  # only a worker whose process ended is launched again
        assert not decision.adopt or (victim in decision.gone) == (
            on_ssh and victim in {w["id"] for w in saved["workers"] if w["phase"] != "gone"}), decision
        if not decision.adopt:  # every worker of it is gone: the disk holds what was written
            for p in self.procs.values():
                p.alive = False
            return self.fresh_driver()
        self.core = adoption.adopt(ElasticCore(c.policy, rng=lambda: 0.5, on_disk=self.disk), saved, self.now)
        self.accepted = self.epoch  # the workers read the beacon and go over to it
        new = self.core
        assert {w: (new.workers[w].slot, p.rank) for w, p in new.world.items() if new.workers[w].alive} == there, \
            "the world taken over is not the world that was there"
        assert new.launches == c.launches and new.round == c.round
        if victim is not None:  # its process is gone: the executor says so at once
            self.send(Exited(victim, exitcodes.LOST_DRIVER if on_ssh else -9), dt=0.01)
        self.send(self.beats(self.running()), dt=0.01)
        # A worker waiting in the rendezvous asks the new driver at once: going over to it cuts
        # the long poll to the old one, and the request is sent again there (session.py's
        # _switch, kvclient's move). A stopped one does so once it runs again.
        for p in self.procs.values():
            if p.alive and p.started and p.waiting is not None and not p.cut:
                p.asked_old = True
        self.asks_the_new_driver()
        held = [p.commit for p in self.running() if p.worker in new.workers and new.workers[p.worker].alive]
        assert new.ledger.newest >= max(held, default=0), "a commit the live workers hold was lost"

    @rule(data=st.data(), steps=st.integers(0, 2), heard=st.booleans())
    def driver_dies_where_none_takes_over(self, data, steps, heard):
        """kill -9 of the driver of a job nobody takes over (decisions/adoption.py's adoptable):
        before its first world formed, or during a graceful stop (or once training finished).
        The same command is run again (adoption.rerun decides on what the journal and /proc
        say): it never starts afresh beside a worker of the last driver's that may have trained,
        it kills those that never did, and once none runs it resumes from the disk's newest
        commit. `heard`: the members heard the stop before the driver died (they leave at their
        next commit); else they train on `steps` commits until their grace ends, and exit 75."""
        c = self.core
        if self.disk is None or self.ended is not None or adoption.adoptable(c):
            return
        live = [p for p in self.procs.values() if p.alive]
        pids = {p.worker: 1000 + i for i, p in enumerate(sorted(self.procs.values(), key=lambda p: p.worker))}
        saved = json.loads(json.dumps({**adoption.journal(c, self.now), "command": ["train.py"],
                                       "procs": {p.worker: f"{pids[p.worker]}:1" for p in live if p.started},
                                       "written_at": 0.0, "driver_host": "here"}))
        self.drivers.pop()  # dead: it never decides again
        for p in live:
            if not p.started:
                p.alive = False  # its launch died with the driver
        members = [p for p in self.members() if not p.handover]
        for _ in range(steps if not (heard and self.stop_published) and not self.must_leave() else 0):
            for p in members:
                self.commit_once(p)
        if heard and self.stop_published:
            for p in members:
                self.leave_unheard(p)

        def rerun():
            running = {p.worker: pids[p.worker] for p in self.procs.values() if p.alive}
            return running, adoption.rerun(saved, running, set(), set(), {}, ["train.py"], "here", 1.0,
                                           self.core.policy.liveness_timeout, "/ckpt")

        running, decision = rerun()
        assert not decision.adopt, f"a job nobody takes over was taken over: {saved}"
        if c.round and running:  # they may have trained: a fresh start would race them
            assert decision.refused and not decision.kill, (decision, running)
            self.grace_ends()
            running, decision = rerun()
        assert not running or not c.round, f"{sorted(running)} still run beside a fresh start"
        assert decision.refused is None and set(decision.kill) == set(running.values()), (decision, running)
        killed = [self.procs[w] for w in running]
        assert all(p.commit <= self.disk for p in killed), "a worker holding a commit the disk lacks was killed"
        for p in killed:
            p.alive = False
        self.fresh_driver()

    @rule(data=st.data(), steps=st.integers(0, 2), dies=st.sampled_from([None, "rank 0", "another"]))
    def no_driver_comes_within_the_grace(self, data, steps, dies):
        """kill -9 of the driver, and nobody runs the command again within --driver-grace: the
        members train on `steps` commits, one may die meanwhile (kill -9: rank 0, its writer's
        pending commit with it, or another), its peers wait for a driver. The grace ends (exit
        75), then the same command finds none of the workers running and resumes from the disk."""
        c = self.core
        if self.disk is None or self.ended is not None or not adoption.adoptable(c):
            return
        saved = json.loads(json.dumps({**adoption.journal(c, self.now), "command": ["train.py"],
                                       "written_at": 0.0, "driver_host": "here"}))
        self.drivers.pop()  # dead: it never decides again
        for p in self.procs.values():
            if not p.started:
                p.alive = False  # its launch died with the driver
        members = [p for p in self.members() if not p.handover]
        for _ in range(steps if not self.must_leave() else 0):
            for p in members:
                self.commit_once(p)
        ranks = {p.worker: c.world[p.worker].rank for p in members}
        victims = sorted(w for w, rank in ranks.items() if (rank == 0) == (dies == "rank 0"))
        if dies and victims:
            self.procs[data.draw(st.sampled_from(victims))].alive = False
        self.grace_ends()
        decision = adoption.rerun(saved, {}, set(), set(), {h: adoption.LOCAL for h in adoption.live_hosts(saved)},
                                  ["train.py"], "here", 1.0, c.policy.liveness_timeout, "/ckpt")
        assert decision == adoption.Rerun(), decision
        self.fresh_driver()

    def grace_ends(self):
        """No driver came within --driver-grace: every live worker exits 75 (a stopped one once it
        runs again), rank 0's writer writing its pending commit, then each the newest commit it
        holds where the folder lacks it (durable.finish). No commit any of them held is lost."""
        alive = [p for p in self.procs.values() if p.alive]
        held = max((p.commit for p in alive), default=0)
        for p in alive:
            self.flush(p)
            if durable.leaves_held(p.commit, self.disk, self.epoch, self.accepted):
                self.disk = p.commit
            p.alive = False
        assert self.disk >= held, f"commit {held} was held at the grace's end, the disk has {self.disk}"

    def leave_unheard(self, proc):
        """A worker whose driver is gone leaves at a commit as the stop asked: rank 0's writer
        writes its newest commit first; no driver hears of it."""
        self.flush(proc)
        proc.alive = False

    def fresh_driver(self):
        """The same command starts the job afresh from --checkpoint-dir: a new lease, a new secret,
        no worker of the last driver's left; worker ids start again."""
        hosts = tuple(self.core.hosts)
        self.core = ElasticCore(self.core.policy, rng=lambda: 0.5, on_disk=self.disk)
        assert self.core.ledger.newest == self.disk, "a fresh start does not resume from the disk's newest commit"
        self.procs, self.ended, self.success_allowed, self.lost, self.loads = {}, None, False, 0, []
        self.newest, self.stop_published, self.last_world, self.counts = self.disk, False, {}, {}
        self.asked, self.named_hung, self.straggling, self.probes, self.failed = set(), set(), set(), [], set()
        self.readings = []  # the last driver's, in flight, answer nobody (as its probes)
        self.epoch += 1
        self.drivers, self.accepted = [[self.epoch, self.now]], self.epoch
        self.send(HostsFound(hosts), dt=0.01)

    @rule(seconds=st.sampled_from([0.5, 2.0, 4.0]), told=st.booleans())
    def driver_is_cut_off_from_everything(self, seconds, told):
        """The driver's host is cut off for a while (shorter than its lease): its lease renewal
        fails, every worker falls silent to it, no probe is answered, a survivor may name its
        peers (a link broke on the driver's side). It blames nobody, takes no silent probe for a
        lost node, forms no world and launches nothing (send() checks) until the store answers
        again. (Longer: a standby takes the lease over, driver_dies_and_a_new_one_takes_over.)"""
        if self.ended is not None:
            return
        self.send(LeaseDoubt(True), dt=0.01)
        for _ in range(int(seconds / 0.5)):
            self.send(Tick(), dt=0.5)
            self.probes_answer_cut_off()
        survivors = sorted(p.worker for p in self.members())
        if told and len(survivors) > 1:
            self.send(LinkBroken(survivors[0], tuple(survivors[1:])), dt=0.01)
            self.probes_answer_cut_off()
        self.send(LeaseDoubt(False), dt=0.01)
        self.send(self.beats(self.running()), dt=0.01)

    def probes_answer_cut_off(self):
        """Nothing answers a probe of a driver that is cut off."""
        probes, self.probes = self.probes, []
        for worker in probes:
            self.send(Probed(worker, SILENT), dt=0.01)

    @invariant()
    def at_most_one_driver_decides(self):
        """A driver decides only while it holds the store's newest lease and renewed it within
        its time to live; an old driver back from a pause is fenced, and no worker takes its
        answers."""
        ttl = self.core.policy.liveness_timeout
        deciding = [e for e, renewed in self.drivers if adoption.may_decide(e == self.epoch, renewed, self.now, ttl)
                    or e == self.epoch]
        assert len(deciding) == 1, f"drivers of leases {deciding} decide at once"
        assert all(not beacon.accepts(e, self.accepted) for e, _ in self.drivers if e != self.epoch)

    @rule(data=st.data())
    def enters_rendezvous(self, data):
        idle = sorted(p.worker for p in self.running() if p.waiting is None and p.exit_code is None
                      and not p.stuck)
        if not idle:
            return
        proc = self.procs[data.draw(st.sampled_from(idle))]
        proc.waiting = -1 if proc.round is None else proc.round
        self.ask(proc)

    @rule()
    def world_leaves_together(self):
        """A host update or a broken collective: every member enters the rendezvous."""
        for proc in self.members():
            proc.waiting = proc.round
            self.ask(proc)

    @rule()
    def idle_workers_enter_rendezvous(self):
        for proc in self.running():
            if proc.waiting is None and proc.exit_code is None and proc.round != self.core.round \
                    and not proc.stuck:
                proc.waiting = -1 if proc.round is None else proc.round
                self.ask(proc)

    @rule()
    def launches_complete(self):
        for proc in list(self.procs.values()):
            if not proc.started and proc.alive:
                proc.started, proc.exit_code = True, proc.stop_when_started
                self.send(Launched(proc.worker, 1000 + len(self.procs)), dt=0.01)

    @rule(data=st.data())
    def asks_again(self, data):
        """A long-poll timed out: the worker repeats its request."""
        waiting = sorted(p.worker for p in self.running() if p.waiting is not None)
        if waiting:
            proc = self.procs[data.draw(st.sampled_from(waiting))]
            self.ask(proc)

    @rule(data=st.data())
    def wait_outlasts_the_elastic_timeout(self, data):
        """A worker's rendezvous wait goes on past --elastic-timeout (the members commit once
        an epoch, say): it keeps asking, heartbeating; a wait is never a failure."""
        waiting = sorted(p.worker for p in self.running() if p.waiting is not None)
        if not waiting:
            return
        proc = self.procs[data.draw(st.sampled_from(waiting))]
        for _ in range(int(self.core.policy.elastic_timeout) + 2):
            self.send(self.beats(self.running()), dt=1.0)
            self.send(Tick(), dt=0.0)
            if self.ended is not None or proc.waiting is None or not proc.alive:
                return
            self.ask(proc, dt=0.0)

    @rule(fails=st.sets(st.integers(0, 3), max_size=2))
    def syncs_from_the_root(self, fails):
        """A new world's members take the root's commit; some may fail to (they keep theirs)."""
        members = sorted(self.members(), key=lambda p: self.core.world[p.worker].rank
                         if p.worker in self.core.world else 99)
        if members:
            top = max(p.commit for p in members)
            for i, p in enumerate(members):
                if i not in fails:
                    p.commit = top

    @rule(data=st.data())
    def commits(self, data):
        """Members commit in lockstep, but a world that breaks mid-commit leaves some ranks one
        commit ahead of the others. A world that only hands the state over never commits."""
        members = sorted(p.worker for p in self.members() if not p.handover)
        if members and not any(p.hung for p in self.procs.values() if p.alive and p.round == self.core.round):
            chosen = data.draw(st.lists(st.sampled_from(members), unique=True, min_size=1))
            for w in chosen:
                self.commit_once(self.procs[w])
            if len(chosen) == len(members):
                self.at_commit([self.procs[w] for w in members])

    def commit_once(self, proc):
        proc.commit += 1
        proc.calls += 1
        if self.disk is not None and self.core.world[proc.worker].rank == 0:  # rank 0 writes, later
            proc.pending = proc.commit

    def at_commit(self, members):
        """Every member checks at its commit whether one is leaving or the job stops: the
        leavers leave, the others re-form without them."""
        if not self.stop_published and not any(p.leaving for p in members):
            return
        for p in members:
            if self.stop_published:
                self.leave(p)
            else:  # a leaver says so, then waits for the driver's word like the others
                p.waiting = p.round
                self.ask(p, rolled_back=False)

    def ask(self, proc, rolled_back=True, dt=0.01):
        """It asks for a world after proc.waiting; a leaver first writes its commit if it is
        the writer, and says it leaves."""
        if proc.leaving and not proc.said_leaving:
            self.flush(proc)
            proc.said_leaving = True
            self.send(Leaving(proc.worker), dt=0.01)
        self.send(Ready(proc.worker, proc.waiting, self.said(proc), rolled_back), dt=dt)

    def leave(self, proc):
        """A worker of a stopping job (or one never in a world, on SIGTERM) exits at once;
        rank 0's writer writes its newest commit first."""
        self.flush(proc)
        self.send(Exiting(proc.worker, proc.commit), dt=0.01)
        proc.alive = False
        self.send(Exited(proc.worker, exitcodes.LEFT), dt=0.01)

    def flush(self, proc):
        """The writer's pending commit reaches the disk (the worker exits, or its interval is
        up), and the driver hears it."""
        if proc.pending is not None:
            self.disk, commit, proc.pending = max(self.disk, proc.pending), proc.pending, None
            self.send(Written(commit, proc.worker), dt=0.01)

    @rule(data=st.data())
    def checkpoint_written(self, data):
        """Rank 0's writer writes the commit it was handed, --checkpoint-interval after the last."""
        writers = sorted(p.worker for p in self.running() if p.pending is not None)
        if writers:
            self.flush(self.procs[data.draw(st.sampled_from(writers))])

    @rule(data=st.data(), dice=st.integers(0, 3))
    def sigterm_to_a_worker(self, data, dice):
        """SIGTERM to one worker (a spot reclaim): a member leaves at its next commit, every
        rank agreeing; one between worlds says so at once (the driver answers its wait); one
        never in a world leaves at once."""
        live = sorted(p.worker for p in self.running() if p.exit_code is None and not p.leaving)
        if not live or dice:
            return
        proc = self.procs[data.draw(st.sampled_from(live))]
        proc.leaving = True
        if proc.round is None:
            self.leave(proc)
        elif proc not in self.members():
            proc.said_leaving = True
            self.send(Leaving(proc.worker), dt=0.01)

    @rule(dice=st.integers(0, 9))
    def signal_to_the_driver(self, dice):
        """SIGTERM to the driver: the job stops at every worker's next commit."""
        if dice == 0:
            self.send(StopRequested(signal.SIGTERM), dt=0.01)

    @rule(data=st.data(), code=st.sampled_from([1, -9, 75, exitcodes.UNLOADABLE]), dice=st.integers(0, 2))
    def crashes(self, data, code, dice):
        live = sorted(p.worker for p in self.running())
        if live and dice == 0:  # rarer than the rest, or few jobs would live long
            proc = self.procs[data.draw(st.sampled_from(live))]
            if code == exitcodes.LOST_DRIVER:  # its exit writes rank 0's newest commit first
                self.flush(proc)
            proc.alive = False
            self.send(Exited(proc.worker, code), dt=0.01)

    @rule(data=st.data(), code=st.sampled_from([1, -9]))
    def fails_beside_a_holder(self, data, code):
        """A worker fails on the host of a live member holding the world's newest commit: the
        host (or the slot) is blacklisted while that holder lives."""
        members = self.members()
        if not members:
            return
        top = max(p.commit for p in members)
        holder = data.draw(st.sampled_from(sorted(p.worker for p in members if p.commit == top)))
        host = holder.split("/")[0]
        others = sorted(p.worker for p in self.running() if p.worker != holder and p.worker.split("/")[0] == host)
        if others:
            proc = self.procs[data.draw(st.sampled_from(others))]
            proc.alive = False
            self.send(Exited(proc.worker, code), dt=0.01)

    @rule(data=st.data())
    def waiting_worker_falls_silent(self, data):
        """A worker waiting in the rendezvous stops heartbeating (SIGSTOP): the driver kills
        it; it may still ask for its place before it dies."""
        waiting = sorted(p.worker for p in self.running() if p.waiting is not None)
        if not waiting:
            return
        proc = self.procs[data.draw(st.sampled_from(waiting))]
        for _ in range(int(self.core.policy.liveness_timeout) + 2):
            if self.ended is not None:
                return
            self.send(self.beats([p for p in self.running() if p is not proc]), dt=1.0)
            self.send(Tick(), dt=0.0)
        if proc.alive and proc.waiting is not None:
            self.ask(proc)

    @rule(data=st.data(), dice=st.integers(0, 4))
    def gets_stuck(self, data, dice):
        """A member never leaves its broken world: stuck in user code (outside hvdlite's
        collectives, so cutting its connections does not reach it), still heartbeating."""
        members = sorted(p.worker for p in self.members())
        if members and dice == 0 and self.core.broken >= self.core.round:
            self.procs[data.draw(st.sampled_from(members))].stuck = True

    def level(self) -> bool:
        """A commit only some members entered (`commits`, half done) completes: the others enter
        it too, as healthy ranks do before any peer can go past it; each member then checks
        there whether to leave (at_commit). Whether the world is still sound, with members."""
        members = self.members()
        top = max((p.calls for p in members), default=0)
        behind = [p for p in members if p.calls < top]
        for p in behind:
            while p.calls < top:
                self.commit_once(p)
        if behind:
            self.at_commit(members)
        return self.ended is None and self.core.broken < self.core.round and bool(self.members())

    @rule(data=st.data(), stack=st.booleans(), after_a_stall=st.booleans())
    def hangs_in_its_own_code(self, data, stack, after_a_stall):
        """A member of a sound world never returns from its own code (`while True: sleep`, or
        it skipped a collective) while its heartbeat goes on; the others enter the next
        collective and wait there. `after_a_stall`: one whose first step in this world took
        long (first_step_takes_long), so the world learned a long stall."""
        if self.core.broken >= self.core.round or not self.level():
            return
        members = sorted(p.worker for p in self.members() if not p.handover)
        candidates = [w for w in members if self.procs[w].first_step_in == self.core.round] if after_a_stall else members
        if len(members) < 2 or not candidates:
            return
        self.send(self.beats(self.running()), dt=0.01)
        proc = self.procs[data.draw(st.sampled_from(candidates))]
        proc.stuck = proc.hung = True
        for p in self.members():
            p.calls += 1
        # Heartbeats go on, nobody moves: it is named before its peers' collective would time
        # out (and blame them), whatever stalls the world got past before. The first beat only
        # tells the driver of the peers' move; the ceiling counts from it, and the model's clock
        # (sums of floats) may reach it a hair short on the tick that follows, so one tick more
        # (a second here, TICK in the driver): 28 s after the peers entered, still before 30 s.
        for _ in range(int(ceiling(self.core.policy.collective_timeout)) + 2):
            if self.ended is not None:
                return
            self.send(self.beats(self.running()), dt=1.0)
            self.send(Tick(), dt=0.0)
        assert self.core.broken >= self.core.round or proc.worker in self.named_hung, \
            f"{proc.worker} hung {self.core.policy.collective_timeout:g} s, its peers' collective timeout, unnamed"
        if stack:  # else it is silent about it, or later (sends_its_stack)
            self.sends_its_stack(data)

    @rule(data=st.data(), long=st.booleans())
    def first_step_takes_long(self, data, long):
        """A member's first step in its world takes long (it loads and compiles) while the
        others wait in the next collective: up to just under the hang timeout's ceiling, past
        the floor and past what the world learned. A healthy rank, never named hung
        (check_hung); then it catches up, and the world got past a long stall."""
        if self.core.broken >= self.core.round or any(p.hung for p in self.members()) or not self.level():
            return
        members = sorted(p.worker for p in self.members() if not p.handover and p.first_step_in != self.core.round)
        if len(members) < 2:
            return
        seconds = int(ceiling(self.core.policy.collective_timeout)) - 2 if long else 3
        self.send(self.beats(self.running()), dt=0.01)
        slow = self.procs[data.draw(st.sampled_from(members))]
        slow.first_step_in = self.core.round
        for p in self.members():
            p.calls += p is not slow
        for _ in range(seconds):
            if self.ended is not None or self.core.broken >= self.core.round:
                return
            self.send(self.beats(self.running()), dt=1.0)
            self.send(Tick(), dt=0.0)
        slow.calls += 1
        self.send(self.beats(self.running()), dt=0.01)
        self.send(Tick(), dt=0.0)

    @rule(data=st.data())
    def straggles(self, data):
        """A member's own work takes longer than the others' for a while: they wait for it in
        every collective. It may recover."""
        members = sorted(p.worker for p in self.members() if not p.handover)
        if len(members) < 2 or self.core.broken >= self.core.round:
            return
        slow = self.procs[data.draw(st.sampled_from(members))]
        seconds = data.draw(st.sampled_from([3, int(WINDOW) + 2, int(WINDOW * (PERSIST + 1)) + 2]))
        even = data.draw(st.sampled_from([0, int(WINDOW) + 2]))  # then all alike again, that long
        for second in range(seconds + even):
            if self.ended is not None or self.core.broken >= self.core.round:
                return
            members = self.members()
            for p in members:
                self.commit_once(p)
                p.waited += 0.8 if p is not slow and second < seconds else 0.0
            self.at_commit(members)
            self.send(self.beats(self.running()), dt=1.0)
            self.send(Tick(), dt=0.0)

    @rule(data=st.data())
    def joins_with_uneven_data(self, data):
        """Join with uneven data: the members step alike for a window, then one runs out of data
        and idles in hvd.join() a while, answering the others' allreduces (one a second here):
        it waits all that time, or nearly (its loop's own work)."""
        members = sorted(p.worker for p in self.members() if not p.handover)
        if len(members) < 2 or self.core.broken >= self.core.round:
            return
        joined = self.procs[data.draw(st.sampled_from(members))]
        waits = data.draw(st.sampled_from([1.0, 0.9]))
        seconds = data.draw(st.sampled_from([3, int(WINDOW * 2) + 2]))
        try:
            for second in range(int(WINDOW) + 1 + seconds):  # a window of even steps first
                if self.ended is not None or self.core.broken >= self.core.round:
                    return
                members = self.members()
                joined.idle = second > WINDOW and joined in members
                for p in members:
                    self.commit_once(p)
                    p.waited += waits if p.idle else 0.0
                self.at_commit(members)
                self.send(self.beats(self.running()), dt=1.0)
                self.send(Tick(), dt=0.0)
        finally:
            joined.idle = False

    def check_straggler(self, log):
        """Named in a sound world; named recovered only after it was named; failed only with
        --straggler-policy evict, while named, and never below --min-np. While a member idles in
        join() and the others step alike, nobody is named: not it, nor one measured against it."""
        c, worker = self.core, log.fields["worker"]
        assert worker in c.world, f"{log.event} for {worker}, not a member of world {c.round}"
        idle = [p.worker for p in self.procs.values() if p.idle]
        assert log.event == "straggler_recovered" or not idle, f"{log.event} {worker} while {idle} idle in join()"
        if log.event == "straggler":
            assert worker not in self.straggling, f"{worker} named a straggler twice"
            self.straggling.add(worker)
        elif log.event == "straggler_recovered":
            assert worker in self.straggling, f"{worker} recovered without being named"
            self.straggling.discard(worker)
        else:
            assert c.policy.straggler_evict and worker in self.straggling, log
            others = [w for w in c.world if c.workers[w].alive and w != worker]
            assert len(others) >= c.policy.min_np, f"{worker} evicted below --min-np: {others}"

    @rule(data=st.data())
    def sends_its_stack(self, data):
        """A worker asked for its stack sends it, unless pygloo holds its GIL."""
        asked = sorted(w for w in self.asked if self.procs[w].alive and not self.procs[w].held)
        if asked:
            worker = data.draw(st.sampled_from(asked))
            self.asked.discard(worker)
            self.send(StackDump(worker, '  File "train.py", line 7, in <module>\n'), dt=0.01)

    def check_hung(self, worker):
        """Named hung only while a member of its world is ahead of it, and once no member's
        count moved for the hang timeout (at least the floor): never a rank merely slower."""
        c, round_ = self.core, self.core.round
        self.named_hung.add(worker)
        assert self.procs[worker].hung, f"{worker} named hung though it is healthy, merely slow once"
        assert worker in c.world and c.broken < round_, f"{worker} named hung outside a sound world"
        counts = {w: self.counts[w] for w in c.world if self.counts.get(w, (None,))[0] == round_}
        assert worker in counts, f"{worker} named hung before it said its count in world {round_}"
        assert any(n > counts[worker][1] for _, n, _ in counts.values()) or any(
            self.procs[w].held for w in c.world), f"{worker} named hung though no peer is ahead of it: {counts}"
        floor = c.policy.hang_timeout or c.policy.hang_floor
        assert all(self.now - since >= floor for _, _, since in counts.values()), \
            f"{worker} named hung at {self.now} though a count moved within {floor} s: {counts}"

    @rule(data=st.data(), ahead=st.booleans())
    def peer_dies_while_sending(self, data, ahead):
        """A member dies; a peer of it sits in a pygloo send that its reset left queued, and that
        gloo does not wake when the world breaks: pygloo holds the peer's GIL for gloo's 30 s,
        so only its stand-in process beats for it. That peer may have committed once more than
        the others (in the next step's collective, it alone got past the last one)."""
        members = sorted(p.worker for p in self.members() if not p.handover)
        if len(members) < 2:
            return
        dead, held = (self.procs[w] for w in data.draw(st.lists(st.sampled_from(members), min_size=2,
                                                                 max_size=2, unique=True)))
        if ahead:
            self.commit_once(held)
        self.send(self.beats([held]), dt=0.01)  # its last own beat says what it holds
        held.stuck = held.held = True
        dead.alive = False
        self.send(Exited(dead.worker, -9), dt=0.01)

    @rule(data=st.data())
    def stuck_member_comes_back(self, data):
        """A member slow to leave its broken world (pygloo sat out its own timeout, a long step
        of user code) comes back at last, maybe after its world re-formed without it."""
        stuck = sorted(p.worker for p in self.running() if p.stuck and p.exit_code is None)
        if stuck:
            proc = self.procs[data.draw(st.sampled_from(stuck))]
            proc.stuck, proc.held, proc.hung, proc.waiting = False, False, False, proc.round
            self.ask(proc)

    @rule(data=st.data())
    def template_dies(self, data):
        """A host's template dies: the workers forked from it die with it (-9)."""
        live = sorted(p.worker for p in self.running())
        if live:
            for w in data.draw(st.lists(st.sampled_from(live), unique=True, min_size=1)):
                self.procs[w].alive = False
                self.send(TemplateDied(w), dt=0.01)

    @rule(data=st.data())
    def launch_fails_for_a_leaving_worker(self, data):
        """A worker told to go (its host left discovery) while its launch ran: the launch fails."""
        pending = sorted(p.worker for p in self.procs.values() if not p.started and p.alive
                         and p.stop_when_started is not None)
        if pending:
            proc = self.procs[data.draw(st.sampled_from(pending))]
            proc.alive = False
            self.send(LaunchFailed(proc.worker, "no route to host"), dt=0.01)

    @precondition(lambda self: self.disk)
    @rule(data=st.data(), dice=st.integers(0, 9))
    def checkpoint_fails_to_load(self, data, dice):
        """Rank 0 of a new world cannot load the commit it reported from --checkpoint-dir."""
        ranks0 = sorted(p.worker for p in self.members() if self.core.world[p.worker].rank == 0)
        if ranks0 and dice == 0:
            event = LoadFailed(ranks0[0], f"commit-{self.disk}.pt: no class Net in module __main__")
            self.loads.append(event)
            self.send(event, dt=0.01)
            # It ends now, or once a waiting holder of a commit the disk lacks wrote it (stopping.py).
            assert self.ended is not None or self.core.failure is not None and self.core.stopping is not None, \
                "a commit that does not load did not end the job"

    @rule(data=st.data())
    def exits_as_told(self, data):
        leaving = sorted(p.worker for p in self.running() if p.exit_code is not None)
        if leaving:
            self.exits(self.procs[data.draw(st.sampled_from(leaving))])

    def exits(self, proc):
        """It exits as told: told to go (0) or stopped (-15) its exit hooks write rank 0's
        newest commit first, killed (-9) it writes nothing."""
        if proc.exit_code != -9:
            self.flush(proc)
        proc.alive = False
        self.send(Exited(proc.worker, proc.exit_code), dt=0.01)

    @rule(data=st.data(), dice=st.integers(0, 9))
    def finishes(self, data, dice):
        """Training is over on a member (ends the job: rare)."""
        leaving = sorted(p.worker for p in self.members())
        if leaving and dice == 0:
            proc = self.procs[data.draw(st.sampled_from(leaving))]
            self.flush(proc)
            proc.alive = False
            self.send(Exited(proc.worker, 0), dt=0.01)

    @rule(data=st.data())
    def finishes_while_a_peer_is_stuck(self, data):
        """The world broke with a member stuck in it (gets_stuck), and another member finishes
        its training: the job ends without waiting --elastic-timeout for the stuck one, and
        blames no slot or host for it."""
        round_ = self.core.round
        stuck = [p for p in self.procs.values() if p.alive and p.stuck and not p.hung and p.round == round_]
        done = sorted(p.worker for p in self.procs.values() if p.alive and not p.stuck and p.round == round_
                      and p.waiting is None and p.exit_code is None and not p.paused and not p.cut)
        if not stuck or not done or self.core.broken < round_:
            return
        proc = self.procs[data.draw(st.sampled_from(done))]
        self.flush(proc)
        proc.alive = False
        blamed = dict(self.core.blacklist.count)
        self.send(Exited(proc.worker, 0), dt=0.01)
        self.send(Tick(), dt=0.01)
        for p in stuck:
            assert not p.alive or p.exit_code is not None, f"{p.worker}, stuck in a broken world, holds a finished job"
            if p.alive:
                p.alive = False
                self.send(Exited(p.worker, p.exit_code), dt=0.01)
        assert self.core.blacklist.count == blamed, f"a finished job blamed {self.core.blacklist.count} (was {blamed})"

    @rule(data=st.data(), stand_ins=st.booleans())
    def heartbeats(self, data, stand_ins):
        live = sorted(p.worker for p in self.running())
        chosen = data.draw(st.lists(st.sampled_from(live), unique=True)) if live else []
        self.send(self.beats([self.procs[w] for w in chosen], stand_ins), dt=0.01)

    @rule(data=st.data(), dice=st.integers(0, 4), told=st.booleans(), beat=st.booleans())
    def node_is_cut_off(self, data, dice, told, beat):
        """A host's node goes (power, a switch port): its workers fall silent, nothing answers a
        probe, no exit is heard; a paused one's probes, LISTENING until now, go silent too. A
        survivor in their world may name them (its link broke). `beat`: they beat last just
        before; else a probe of a late beat may have found them listening since (under load)."""
        hosts = sorted({p.worker.split("/")[0] for p in self.procs.values() if p.started and p.alive and not p.cut})
        if hosts and not dice:
            self.cut_off(data.draw(st.sampled_from(hosts)), data, told, beat)

    def listening_unheard(self):
        """Hosts of workers that a probe found listening, not heard since."""
        return sorted({p.worker.split("/")[0] for p in self.procs.values() if p.started and p.alive and not p.cut
                       and (inc := self.core.workers.get(p.worker)) is not None and inc.alive and not inc.probing
                       and inc.probed_at is not None and inc.probed_at >= (inc.heard_at or 0.0)})

    @precondition(lambda self: self.listening_unheard())
    @rule(data=st.data(), told=st.booleans())
    def node_is_lost_after_a_probe_found_it_listening(self, data, told):
        """Under load: a late beat was probed, the node answered for its worker, then it died
        before the worker beat again (the lost-node tests of a CI run)."""
        self.cut_off(data.draw(st.sampled_from(self.listening_unheard())), data, told, beat=False)

    def cut_off(self, host, data, told, beat):
        lost = [p for p in self.procs.values() if p.started and p.alive and not p.cut and p.worker.split("/")[0] == host]
        if beat or any(getattr(self.core.workers.get(p.worker), "heard_at", 0.0) is None for p in lost):
            # a real worker beats from its start: never cut off before its first beat
            self.send(self.beats([p for p in lost if not p.paused]), dt=0.01)
        for p in lost:
            p.cut = True
        survivors = sorted(p.worker for p in self.members())
        if told and survivors:
            self.send(LinkBroken(data.draw(st.sampled_from(survivors)), tuple(p.worker for p in lost)), dt=0.01)

    def asks_the_new_driver(self):
        for p in self.running():
            if p.asked_old:
                p.asked_old = False
                if p.waiting is not None:
                    self.ask(p)

    @rule(data=st.data())
    def pauses_or_resumes(self, data):
        """A worker is stopped (SIGSTOP, CPU starvation) on a node that still answers, or goes on."""
        paused = sorted(p.worker for p in self.procs.values() if p.paused)
        live = sorted(p.worker for p in self.running())
        if paused and data.draw(st.booleans()):
            self.procs[data.draw(st.sampled_from(paused))].paused = False
            self.asks_the_new_driver()
        elif live:
            proc = self.procs[data.draw(st.sampled_from(live))]
            self.send(self.beats([proc]), dt=0.01)  # its last beat
            proc.paused = True

    @rule()
    def probes_answer(self):
        """The node's kernel answers a probe for a stopped process, refuses one for a dead one."""
        probes, self.probes = self.probes, []
        for worker in probes:
            proc = self.procs[worker]
            self.send(Probed(worker, SILENT if proc.cut else LISTENING if proc.alive else REFUSED), dt=0.01)

    @rule(dt=st.sampled_from([0.1, 0.5, 1.5, 1.5, 1.5, 6.0]))
    def time_passes(self, dt):
        """Cooldowns end, silent workers are probed (0.6 s) and killed (5 s), slow starts time
        out (10 s)."""
        self.probes_answer()  # within the probe's timeout (0.4 s): none is in flight at a tick ...
        self.send(Tick(), dt=dt)
        self.readings_answer()
        c = self.core
        if not c.ended and not c._stop_overdue():  # the tick ended no live worker that is overdue
            late = [(w, c._overdue(inc)) for w, inc in c.workers.items() if inc.alive and c._overdue(inc)]
            assert not late, f"overdue after the tick at {self.now:g}: {late}"
        self.probes_answer()  # ... but the tick's own

    @precondition(lambda self: any(not p.alive for p in self.procs.values()))
    @rule(data=st.data(), kind=st.sampled_from(["exit", "ready", "beat", "vouched", "launched", "failed",
                                                "template", "load"]))
    def stale_incarnation_speaks(self, data, kind):
        proc = self.procs[data.draw(st.sampled_from(sorted(w for w, p in self.procs.items() if not p.alive)))]
        before = self.signature()
        event = {"exit": Exited(proc.worker, data.draw(st.sampled_from([0, 1, -9]))),
                 "ready": Ready(proc.worker, 99, 10 ** 6), "beat": Heartbeats(((proc.worker, 10 ** 6),)),
                 "vouched": Heartbeats((), ((proc.worker, self.core.round),)),
                 "launched": Launched(proc.worker, 1), "failed": LaunchFailed(proc.worker, "x"),
                 "template": TemplateDied(proc.worker), "load": LoadFailed(proc.worker, "x")}[kind]
        actions = self.core.handle(event, self.now)
        assert self.signature() == before, f"a stale {kind} changed the job"
        assert all(isinstance(a, Answer) and a.body == {"removed": True} for a in actions), actions

    # ---- invariants ------------------------------------------------------------------------
    def signature(self):
        c = self.core
        return repr((c.hosts, c.round, sorted(c.world), c.updates, c.broken, c.resets, vars(c.ledger),
                     c.succeeded, c.ended, c.first_failure, c.short_since, sorted(c.announced),
                     sorted(c.blacklist.until.items()),
                     sorted((w, vars(i)) for w, i in c.workers.items())))

    def check_new_world(self, last=False):
        """`last`: the stop's last world, formed only to write its member's commit, wherever it sits."""
        c = self.core
        slots = [c.workers[w].slot for w in c.world]
        assert len(slots) == len(set(slots)), f"a slot twice in one world: {slots}"
        commits = {w: c.workers[w].commit for w in c.world}
        (root,) = {p.root for p in c.world.values()}
        root = next(w for w, p in c.world.items() if p.rank == root)
        assert commits[root] == max(commits.values()), f"the root does not hold the newest commit: {commits}"
        self.check_ranks_stay()
        # A member on a blacklisted or removed slot is the world's state source: the root, with a
        # newer commit than every other member, in a world that only hands it over.
        sidelined = [w for w in c.world if self.sidelined(w) and not last]
        assert not sidelined or (sidelined == [root] and c.world[root].handover and all(
            commits[w] < commits[root] for w in c.world if w != root)), \
            f"world {c.round} trains on sidelined {sidelined}: {commits}, {c.world}"
        assert all(p.handover == (bool(sidelined) or last) for p in c.world.values())
        assert len(c.world) > len(sidelined), f"world {c.round} is only on sidelined slots {sidelined}"
        killed = [w for w in c.world if c.workers[w].killed is not None]
        assert not killed, f"world {c.round} holds {killed}, which the driver is killing"
        # No commit lost while a holder lives, blacklisted or not: nobody alive outside the
        # world holds more, unless the core said so (its holder was being killed).
        start = max(commits[root], self.disk or 0)  # the root loads the disk when it is newer
        outside = [p.commit for w, p in self.procs.items() if p.alive and w not in c.world
                   and self.procs[w].started]
        lost = [a for a in self.last_actions if isinstance(a, Log) and a.event == "commit_lost"]
        assert lost or max(outside, default=0) <= max(start, self.lost), \
            f"a live holder of commit {max(outside)} was left out of a world at {start}"
        # Nor from scratch, or older, because every holder the core heard of died or left:
        # that is said (commit_lost), or the job ends; and never while the disk holds it.
        assert lost or self.newest <= max(start, self.lost), \
            f"world {c.round} starts at commit {start}; commit {self.newest} went unsaid"
        # Said or not, never older than a commit on disk or with a worker that may stay.
        reachable = [self.disk or 0] + [p.commit for w, p in self.procs.items() if p.started and p.alive
                                        and p.exit_code is None and c.workers[w].killed is None]
        assert start >= min(self.newest, max(reachable)), \
            f"world {c.round} starts at commit {start}; commit {self.newest} is still reachable"
        self.newest = start

    def check_ranks_stay(self):
        """Ranks stay put: the last world's members keep their order, and their very ranks
        whenever they all fit in the new world; a newcomer on a slot whose last worker's rank
        is free then takes that rank, so a same-size world keeps its rank -> slot order."""
        c, last = self.core, self.last_world
        ranks = {w: p.rank for w, p in c.world.items()}
        assert sorted(ranks.values()) == list(range(len(ranks))), f"ranks {ranks}"
        stayed = sorted((w for w in ranks if w in last), key=lambda w: last[w][1])
        assert sorted(stayed, key=ranks.get) == stayed, \
            f"survivors changed order: {[(w, last[w][1], ranks[w]) for w in stayed]}"
        if all(last[w][1] < len(ranks) for w in stayed):
            moved = [(w, last[w][1], ranks[w]) for w in stayed if ranks[w] != last[w][1]]
            assert not moved, f"a survivor's rank moved in world {c.round}: {moved}"
            held = {ranks[w] for w in stayed}
            for w in ranks:
                dead = {slot: rank for slot, rank in last.values() if rank not in held and rank < len(ranks)}
                slot = c.workers[w].slot
                if w not in last and slot in dead:
                    assert ranks[w] == dead[slot], \
                        f"{w} replaces rank {dead[slot]} on {slot} but got rank {ranks[w]}"
            if len(ranks) == len(last):  # a same size: the newcomers took the dead ranks
                assert {ranks[w] for w in ranks if w not in last} == \
                    {rank for w, (_, rank) in last.items() if w not in ranks}
        self.last_world = {w: (c.workers[w].slot, rank) for w, rank in ranks.items()}

    def check_stop_line(self, fields):
        """A stop's last line never names a commit the disk lacks, and says it resumes
        (exit 75) exactly when the disk holds a commit."""
        if self.disk is None:
            assert not fields["resumable"], fields
            return
        assert fields["resumable"] == (self.disk > 0), f"{fields}, disk at {self.disk}"
        assert not fields["resumable"] or fields["commit"] == self.disk, f"{fields}, disk at {self.disk}"

    def sidelined(self, worker):
        """Its slot is blacklisted or gone from discovery, or it is a leaver (SIGTERM)."""
        if self.procs[worker].leaving:
            return True
        host, index = self.core.workers[worker].slot.split("/")
        return self.core.blacklist.blocked(f"{host}/{index}", self.now) or \
            self.core.blacklist.blocked(host, self.now) or int(index) >= dict(self.core.hosts).get(host, 0)

    @invariant()
    def waiting_holders_are_never_ignored(self):
        """While the world re-forms, no waiting holder of a newer commit than the world's is
        left out, wherever it sits, unless the core said that commit was lost (its holder was
        being killed)."""
        c = self.core
        if c.ended or not c.world:
            return
        top = max(c.workers[w].commit for w in c.world)
        if self.disk is not None:  # a joiner read from disk what the world committed since it last said
            top = max([top] + [self.procs[w].commit for w in c.world])
        for w, inc in c.workers.items():
            if inc.phase is Phase.WAITING and inc.after < c.round and w not in c.world:
                assert inc.commit <= max(top, self.lost), \
                    f"{w} waits with commit {inc.commit} above the world's {top}"

    @invariant()
    def every_live_leaver_is_in_the_leavers_index(self):
        """The core releases only the leavers its index holds: one missing would wait forever."""
        c = self.core
        assert set(c.leavers) == {w for w, inc in c.workers.items() if inc.leaving_since is not None
                                  and inc.phase not in (Phase.LEAVING, Phase.GONE)}

    @invariant()
    def every_live_worker_is_due_by_its_overdue_time(self):
        """A tick looks only at the workers c.deadlines says are due: one held for later than
        its overdue time would be killed late, or never."""
        c = self.core
        for w, inc in c.workers.items():
            when = overdue_from(inc, c.policy, c._broke_at(inc)) if inc.alive else None
            assert when is None or c.deadlines.times.get(w, math.inf) <= when, \
                f"{w} overdue from {when:g}, due at {c.deadlines.times.get(w)} (now {self.now:g})"

    @invariant()
    def one_incarnation_per_slot(self):
        live = [i.slot for i in self.core.workers.values() if i.alive]
        assert len(live) == len(set(live)), f"two live processes on one slot: {live}"

    def must_leave(self):
        """Members leave their world when it broke (their connections are cut) or when a host
        update was announced after it formed (HostsUpdatedInterrupt at the next commit)."""
        places = list(self.core.world.values())
        return self.core.broken >= self.core.round or (
            bool(places) and (places[0].handover or self.core.updates > places[0].updates))

    def teardown(self):
        """Let every worker cooperate: the job must end, and a success answers everyone."""
        for proc in self.procs.values():
            proc.paused = False
        self.send(LeaseDoubt(False), dt=0.01)
        self.asks_the_new_driver()
        for _ in range(400):
            self.probes_answer()
            self.readings_answer()
            if self.ended is not None:
                return
            for proc in list(self.procs.values()):
                if not proc.alive:
                    continue
                if not proc.started:
                    proc.started, proc.exit_code = True, proc.stop_when_started
                    self.send(Launched(proc.worker, 1), dt=0.01)
                elif proc.exit_code is not None:
                    self.exits(proc)
                elif proc.waiting is None and proc.round != self.core.round and not proc.stuck and not proc.cut:
                    proc.waiting = -1 if proc.round is None else proc.round
                    self.ask(proc)
            # Every world starts with a sync from the root, a collective all members finish
            # before any of them commits, which is where a host update is noticed.
            self.syncs_from_the_root(set())
            if self.must_leave():
                self.world_leaves_together()
            members = self.members()
            if members and (self.stop_published or any(p.leaving for p in members)):
                for p in members:  # one more commit, where they leave
                    self.commit_once(p)
                self.at_commit(members)
                members = []
            if members and not any(p.waiting is not None for p in self.procs.values() if p.alive):
                self.flush(members[0])
                members[0].alive = False  # training is done
                self.send(Exited(members[0].worker, 0), dt=0.01)
            self.send(self.beats(self.running()), dt=0.0)
            self.send(Tick(), dt=0.5)
        raise AssertionError(f"the job did not end: {self.signature()}")


TestElasticJob = ElasticJob.TestCase
TestElasticJob.settings = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None)


# ---- the hang and finish scenarios, step by step (the search above may not meet them) ------
class Picks:
    """A stand-in for hypothesis's data(): the draws, in order."""

    def __init__(self, *picks):
        self.picks = list(picks)

    def draw(self, _strategy):
        return self.picks.pop(0)


def launched(durable=False, on_disk=0):
    """A job whose first launches completed (a failure does not fail it)."""
    job = ElasticJob()
    job.fail_on_worker_failure(fail=False)
    job.checkpoint_dir(durable=durable, on_disk=on_disk)
    job.straggler_policy(evict=False)
    job.launches_complete()
    return job


def formed(durable=False):
    job = launched(durable)
    job.idle_workers_enter_rendezvous()
    job.syncs_from_the_root(fails=set())
    return job, sorted(p.worker for p in job.members())


def test_a_long_first_step_then_a_hang_of_that_rank_named_before_the_collective_timeout():
    """A 24 s first step is no hang (check_hung would say so); the world learns it, and a later
    hang of that rank is still named before the peers' 30 s collective timeout."""
    job, (first, *_) = formed()
    job.first_step_takes_long(Picks(first), long=True)
    job.hangs_in_its_own_code(Picks(first, first), stack=True, after_a_stall=True)
    assert job.named_hung == {first}


def test_a_hang_after_a_half_done_commit_names_the_hung_rank_only():
    """Two members entered a commit the third had not (commits, half done) when one of them
    hangs: the third enters that commit too (a healthy rank), so only the hung one is behind."""
    job, (a, b, c) = formed()
    job.commits(Picks([a, b]))
    job.hangs_in_its_own_code(Picks(a), stack=False, after_a_stall=False)
    assert job.named_hung == {a}


def test_a_hang_in_the_first_step_is_named_at_the_ceiling_whatever_the_clock():
    """A rank that hangs before it ever kept pace is judged by the ceiling (26 s), counted from
    the beat that told of its peers' move; on this job's clock (three driver stops first) 26
    one-second ticks sum to a hair under 26 s, and it is named on the next tick, before the
    peers' 30 s timeout."""
    job = ElasticJob()
    job.checkpoint_dir(durable=False, on_disk=0)
    job.straggler_policy(evict=False)
    for _ in range(3):
        job.driver_stops_for_a_while()
    job.launches_complete()
    job.idle_workers_enter_rendezvous()
    (a, *_) = sorted(p.worker for p in job.members())
    job.hangs_in_its_own_code(Picks(a), stack=False, after_a_stall=False)
    assert job.named_hung == {a}


def test_a_node_cut_off_after_the_job_ended_is_not_probed():
    """The job ends with its workers alive (a checkpoint that does not load), then a node goes
    and the driver stops a while: nobody probes it, nor needs to."""
    job = ElasticJob()
    job.checkpoint_dir(durable=True, on_disk=2)
    job.straggler_policy(evict=False)
    job.launches_complete()
    job.idle_workers_enter_rendezvous()
    job.heartbeats(Picks(sorted(job.procs)), stand_ins=False)
    (a, *_) = sorted(p.worker for p in job.members())
    job.checkpoint_fails_to_load(Picks(a), dice=0)
    assert job.ended is not None and job.ended.code == exitcodes.UNLOADABLE, job.ended
    job.node_is_cut_off(Picks("b"), dice=0, told=False, beat=True)
    job.driver_stops_for_a_while()
    assert not job.probes


def test_a_finished_job_does_not_wait_for_a_member_stuck_in_the_broken_world():
    job, (a, b, c) = formed()
    job.crashes(Picks(c), code=1, dice=0)
    job.gets_stuck(Picks(b), dice=0)
    job.finishes_while_a_peer_is_stuck(Picks(a))
    job.send(Tick(), dt=0.5)
    assert job.ended is not None and job.ended.code == 0, job.ended


def test_a_member_finishing_during_a_stop_does_not_wait_for_one_stuck_in_the_broken_world():
    """The stop is asked for, a member dies while a peer sits in its pygloo send, and a third
    finishes: the stuck peer is stopped at once, not at --stop-timeout."""
    job, (a, b, c) = formed()
    job.signal_to_the_driver(dice=0)
    job.peer_dies_while_sending(Picks([a, c]), ahead=False)
    job.finishes_while_a_peer_is_stuck(Picks(b))
    assert job.ended is not None, job.ended


def test_a_member_idle_in_join_with_less_data_is_not_named_nor_the_baseline():
    """Two windows of join with uneven data: check_straggler says if anyone is named."""
    job, (a, *_) = formed()
    job.joins_with_uneven_data(Picks(a, 1.0, int(WINDOW * 2) + 2))
    assert job.ended is None and all(not p.idle for p in job.procs.values())


@pytest.mark.parametrize("on_ssh", [False, True])
def test_a_driver_killed_while_a_peer_dies_without_it_is_taken_over_and_the_world_re_forms(on_ssh):
    """The members commit twice without a driver, one dies; the new driver takes the world
    over, hears the death, and the survivors re-form from the newest commit: nothing lost. On
    an SSH host the dead one's slot is launched again, blamed on nobody."""
    job, (a, b, c) = formed(durable=True)
    old = job.core
    job.driver_dies_and_a_new_one_takes_over(Picks(c), steps=2, peer_dies=True, paused=True, on_ssh=on_ssh)
    assert job.core is not old and job.core.broken == job.core.round == 1
    assert bool(job.core.blacklist.count) != on_ssh  # -9: its slot (or host) sits out
    assert len(job.drivers) == 2  # the paused one is back, fenced (at_most_one_driver_decides)
    job.at_most_one_driver_decides()
    job.world_leaves_together()
    job.launches_complete()
    job.idle_workers_enter_rendezvous()
    assert job.core.round == 2 and job.lost == 0
    assert {job.procs[w].commit for w in job.core.world if job.procs[w].alive} <= {2}


@pytest.mark.parametrize("update", ["no host listed", "a host joins"])
def test_a_hang_after_a_host_update_was_announced_is_named_before_the_collective_timeout(update):
    """A host update is announced (discovery lists no host, or a new host's workers wait to
    join): the members leave only at their next commit, so one hung before it holds its peers
    in a collective as in any world, and is named before their collective timeout (the model
    found it not named: the hang check looked away from a world told to re-form)."""
    job = ElasticJob()
    job.checkpoint_dir(durable=False, on_disk=0)
    job.straggler_policy(evict=False)
    job.launches_complete()
    job.idle_workers_enter_rendezvous()
    if update == "no host listed":
        job.discover(hosts=[], how="")
    else:
        job.discover(hosts=UNIVERSE[:3], how="")
        job.launches_complete()
        job.idle_workers_enter_rendezvous()
    assert job.core.disrupted is not None and job.core.broken < job.core.round == 1
    job.first_step_takes_long(Picks("a/0#1"), long=False)
    job.hangs_in_its_own_code(after_a_stall=True, data=Picks("a/0#1"), stack=False)
    assert job.named_hung == {"a/0#1"}


def test_a_driver_killed_before_the_first_world_is_rerun_from_the_disk_and_its_workers_killed():
    """The workers it launched trained nothing and could never find the rerun's driver (a new
    secret): the rerun kills them and starts afresh from the disk's commit 2."""
    job = ElasticJob()
    job.checkpoint_dir(durable=True, on_disk=2)
    job.straggler_policy(evict=False)
    job.launch_completes(Picks("a/0#1"), how="ok")
    old = job.procs
    job.driver_dies_where_none_takes_over(Picks(), steps=0, heard=False)
    assert all(not p.alive for p in old.values()) and job.core.round == 0 and job.core.ledger.newest == 2
    job.launches_complete()
    job.idle_workers_enter_rendezvous()
    job.syncs_from_the_root(fails=set())
    assert job.core.round == 1 and {p.commit for p in job.members()} == {2}


def test_a_driver_killed_before_the_first_world_while_taking_a_worker_out_leaves_none_behind():
    """Discovery dropped host b as the first world waited: its worker was being stopped when
    the driver died. The rerun kills it too (the model
    found it left running beside the fresh start)."""
    job = ElasticJob()
    job.checkpoint_dir(durable=True, on_disk=2)
    job.straggler_policy(evict=False)
    job.launches_complete()
    job.discover(hosts=UNIVERSE[:1], how="")
    old = job.procs
    assert old["b/0#1"].alive and old["b/0#1"].exit_code == -15
    job.driver_dies_where_none_takes_over(Picks(), steps=0, heard=False)  # it checks what rerun() kills
    assert all(not p.alive for p in old.values()) and job.core.round == 0


@pytest.mark.parametrize("heard", [False, True])
def test_a_driver_killed_during_a_graceful_stop_is_rerun_from_the_disk_once_its_workers_ended(heard):
    """Its workers train on (they missed the stop) or leave at their next commit (they heard
    it): the rerun refuses while one runs, and then resumes from the disk, which holds rank 0's
    newest commit."""
    job, members = formed(durable=True)
    job.commits(Picks(members))
    job.signal_to_the_driver(dice=0)
    (root,) = [p for p in job.members() if job.core.world[p.worker].rank == 0]
    job.driver_dies_where_none_takes_over(Picks(), steps=2, heard=heard)
    assert job.disk == root.commit == (1 if heard else 3) and job.core.ledger.newest == job.disk
    job.launches_complete()
    job.idle_workers_enter_rendezvous()
    job.syncs_from_the_root(fails=set())
    assert job.core.round == 1 and {p.commit for p in job.members()} == {job.disk}


def test_rank_0_killed_while_no_driver_runs_loses_no_commit_at_the_grace_end():
    """The members commit twice without a driver, then rank 0 dies with its writer's pending
    commit; nobody runs the command again within the grace. Its survivors write the commit they
    hold as they exit 75 (rank 0's writer alone left the disk at commit 0), and the rerun resumes
    from it."""
    job, members = formed(durable=True)
    (root,) = [w for w in members if job.core.world[w].rank == 0]
    job.no_driver_comes_within_the_grace(Picks(root), steps=2, dies="rank 0")
    assert job.disk == 2 and job.core.ledger.newest == 2 and job.core.round == 0
    job.launches_complete()
    job.idle_workers_enter_rendezvous()
    job.syncs_from_the_root(fails=set())
    assert job.core.round == 1 and {p.commit for p in job.members()} == {2}


def test_a_rerun_after_a_driver_died_ending_the_job_refuses_while_an_ssh_worker_of_it_runs():
    """Its workers on an SSH host (asked over SSH: `elsewhere`) are as much the job's as those
    here: a fresh start beside one still training would make two writers of one lineage."""
    job, members = formed(durable=True)
    job.commits(Picks(members))
    job.signal_to_the_driver(dice=0)
    saved = json.loads(json.dumps({**adoption.journal(job.core, job.now), "command": ["train.py"],
                                   "written_at": 0.0, "driver_host": "here"}))
    assert not saved["adoptable"] and adoption.live_hosts(saved)
    on_ssh = sorted(members)[:1]
    decision = adoption.rerun(saved, {}, set(on_ssh), set(), {}, ["train.py"], "here", 1.0, 60.0, "/ckpt")
    assert decision.refused and on_ssh[0] in decision.refused and not decision.kill, decision
    assert adoption.rerun(saved, {}, set(), set(), {}, ["train.py"], "here", 1.0, 60.0, "/ckpt") == adoption.Rerun()

def test_a_driver_cut_off_from_everything_blames_nobody_and_forms_no_world():
    """Its lease renewal fails: every worker falls silent to it, its probes go unanswered, a
    survivor names its peers and the SSH channel of one breaks (exit 255). It kills nobody for
    silence, blames no host, forms no world, launches nothing (send() checks each event); back,
    its workers live on unblamed and the world re-forms without the one that exited."""
    job, (a, b, c) = formed()
    job.send(LeaseDoubt(True), dt=0.01)
    for _ in range(6):  # 3 s: past probe_after, short of --liveness-timeout's 5 s
        job.send(Tick(), dt=0.5)
        job.probes_answer_cut_off()
    job.send(LinkBroken(a, (b, c)), dt=0.01)
    job.probes_answer_cut_off()
    job.procs[c].alive = False
    job.send(Exited(c, 255), dt=0.01)
    for _ in range(3):  # its slot's retry pause (1 s) passes: still no launch
        job.send(Tick(), dt=0.5)
        job.probes_answer_cut_off()
    assert job.core.round == 1 and not job.core.blacklist.count and not job.core.failures
    job.send(LeaseDoubt(False), dt=0.01)
    job.send(job.beats(job.running()), dt=0.01)
    job.time_passes(dt=1.5)
    assert all(job.core.workers[w].alive and job.core.workers[w].killed is None for w in (a, b))
    job.world_leaves_together()
    job.time_passes(dt=6.0)  # the slot of the one that exited waits its retry, then is launched
    job.launches_complete()
    job.idle_workers_enter_rendezvous()
    assert job.core.round == 2 and not job.core.blacklist.count and not job.core.failures



def holder_unheard_while_it_waits(how):
    """The model's falsifying example (replay database of 5703a64), by hand: the one member,
    on b, commits past the disk; b is drained and a listed (a/0, a/1 start): the member leaves
    its world and waits with its commit (state_kept: no usable worker waits). Its node is cut
    off (`how`: "cut"), or it is stopped (SIGSTOP: "paused"); the driver is killed and the same
    command takes the job over."""
    job = ElasticJob()
    job.checkpoint_dir(durable=True, on_disk=2)
    job.straggler_policy(evict=False)
    job.discover(hosts=[("b", 1)], how="")
    job.launches_complete()
    job.idle_workers_enter_rendezvous()
    job.syncs_from_the_root(fails=set())
    (holder,) = [p.worker for p in job.members()]
    job.commits(Picks([holder]))
    for proc in [p for p in job.procs.values() if p.exit_code is not None]:
        job.exits(proc)  # a's first workers, stopped as a was unlisted
    job.time_passes(6.0)  # their slots' cooldown
    job.discover(hosts=[("a", 2)], how="drained")
    job.launches_complete()  # a/0#2, a/1#2 start
    job.world_leaves_together()
    assert job.core.phases[Phase.WAITING].keys() == {holder} and job.procs[holder].commit == 3
    if how == "cut":
        job.node_is_cut_off(Picks("b"), dice=0, told=False, beat=True)
    else:
        job.pauses_or_resumes(Picks(holder))
    job.driver_dies_and_a_new_one_takes_over(Picks(), steps=0, peer_dies=False, paused=False)
    job.idle_workers_enter_rendezvous()  # a/0#2, a/1#2 ask the new driver: commit 2, from the disk
    return job, holder


@pytest.mark.parametrize("how", ["cut", "paused"])
def test_a_driver_taking_over_forms_no_world_from_less_before_a_waiting_holder_asked_it(how):
    """A worker that waited in the last driver's rendezvous asks the new one once it goes over
    to it (at once, or once it runs again), or it is found gone: until then the new driver
    forms no world from a commit older than the newest. (It formed one at once from the disk
    when a fresh worker asked first, the live holder's newer commit lost: the model found it.)
    Its node gone, a probe finds it so and the world forms from the disk, saying the commit is
    lost; stopped, its node answers the probe, and once it runs it hands its commit over."""
    job, holder = holder_unheard_while_it_waits(how)
    assert job.core.round == 1, "a world formed before the holder asked"
    if how == "cut":
        job.time_passes(1.5)  # its probe: silent
        assert job.core.round == 2 and holder not in job.core.world and job.lost == 3
        assert job.procs[holder].exit_code == -9
    else:
        job.time_passes(1.5)  # its probe: its node answers for it
        assert job.core.round == 1
        job.pauses_or_resumes(Picks(True, holder))  # it runs again and asks
        assert job.core.round == 2 and job.core.world[holder].handover and job.lost == 0


def test_a_worker_waiting_in_the_last_drivers_rendezvous_asks_the_new_one_and_the_job_ends():
    """The model's other falsifying example ("the job did not end"): members that waited in the
    rendezvous when the driver died never asked the new one in the model (their long poll was
    left on the dead driver), so nobody answered them. A real worker's request is cut as it
    goes over to the new driver and sent there again (session.py's _switch, kvclient's move):
    the model now does so, and the new driver takes it into the next world."""
    job, (a, b, c) = formed(durable=True)
    job.enters_rendezvous(Picks(a))
    job.driver_dies_and_a_new_one_takes_over(Picks(), steps=0, peer_dies=False, paused=True)
    assert job.core.workers[a].phase is Phase.WAITING
    job.world_leaves_together()
    assert job.core.round == 2 and set(job.core.world) == {a, b, c}
    job.teardown()
    assert job.ended is not None and job.ended.code == exitcodes.FINISHED


def beat_and_tick(job, seconds):
    """The running workers beat and the driver ticks every 0.5 s (a longer gap is its own
    stall); the worker_unresponsive lines logged meanwhile."""
    named = []
    for _ in range(int(seconds / 0.5)):
        job.send(job.beats(job.running()))
        job.time_passes(0.5)
        named += [(a.fields["worker"], a.fields["reason"]) for a in job.last_actions
                  if isinstance(a, Log) and a.event == "worker_unresponsive"]
    return named


def test_a_worker_taken_over_that_never_asks_the_new_driver_is_ended_after_the_elastic_timeout():
    """A member stuck in its own code, left behind by the next world, is ended --elastic-timeout
    after its world broke (worker_stuck); the journal does not carry that over, and the driver
    that takes the job over gave it no bound at all. One the last driver had answered that does
    not ask the new one is now ended --elastic-timeout after the take-over (and no world waits
    for it longer while it may hold the newest commit: forming.py)."""
    job, (a, b, c) = formed(durable=True)
    job.crashes(Picks(c), code=1, dice=0)
    job.gets_stuck(Picks(a), dice=0)
    job.world_leaves_together()  # b asks; a is stuck in its own code, beating
    assert not beat_and_tick(job, 7.0)  # past the liveness timeout: a is left behind
    assert job.core.round == 2 and a not in job.core.world and job.core.workers[a].left_behind is not None
    job.driver_dies_and_a_new_one_takes_over(Picks(), steps=0, peer_dies=False, paused=True)
    took = job.now
    assert not beat_and_tick(job, 19.5)
    assert beat_and_tick(job, 1.5) == [(a, "did not ask the driver that took the job over within "
                                           "--elastic-timeout 20 s")]
    assert job.now - took > 20 and job.procs[a].exit_code == -9


def test_a_cpu_reading_the_last_driver_asked_for_answers_nobody_after_a_fresh_start():
    """A falsifying example of a 300-example run (seed 11): the last driver asked for a
    starting worker's CPU wait, then died where nobody takes over; the rerun starts afresh.
    The reading in flight, as its probes, answers nobody (the model answered it to the new
    driver, for a worker it never had)."""
    job = launched(durable=True)
    job.driver_stops_for_a_while()
    job.driver_stops_for_a_while()
    job.launches_complete()
    job.enters_rendezvous(Picks("a/0#2"))
    job.wait_outlasts_the_elastic_timeout(Picks("a/0#2"))
    job.driver_dies_where_none_takes_over(Picks(), heard=False, steps=0)
    job.teardown()
    assert job.ended is not None


def test_a_driver_killed_while_removing_a_member_is_taken_over_awaiting_its_exit():
    """The model's falsifying example (seed 15): a member waiting in the rendezvous got SIGTERM
    and was let go (removed: told so, its exit awaited) when the driver died. The journal left
    it out of the workers but kept it in the world, so the new driver's world named a worker it
    did not know (a KeyError in _maybe_form). It is taken over as leaving: the others re-form
    without it, its exit is not judged, and the job ends."""
    job, (a, b, c) = formed(durable=True)
    job.enters_rendezvous(Picks(a))
    job.sigterm_to_a_worker(Picks(a), dice=0)
    assert job.core.workers[a].phase is Phase.LEAVING and a in job.core.world
    job.driver_dies_and_a_new_one_takes_over(Picks(), steps=0, peer_dies=False, paused=False)
    assert job.core.workers[a].phase is Phase.LEAVING
    job.exits_as_told(Picks(a))
    assert a not in job.core.workers or not job.core.workers[a].alive
    job.world_leaves_together()
    assert job.core.round == 2 and set(job.core.world) == {b, c} and not job.core.failures
    job.teardown()
    assert job.ended is not None and job.ended.code == exitcodes.FINISHED


@pytest.mark.parametrize("how", ["joined", "mid_commit"])
def test_the_last_world_of_a_failure_says_the_dead_writers_newer_commit_is_lost(how):
    """Rank 0 holds a newer commit than the others (they stepped while it idled in hvd.join(),
    from commit 2 they never synced: the model's falsifying example; or the world broke
    mid-commit), a member enters the rendezvous, and rank 0 exits 65 (a checkpoint that does
    not load). The job ends, but first the last world of the best holder left writes its older
    commit: it said nothing of the newer one, gone with the writer (only a world formed by the
    forming rule said commit_lost)."""
    job = launched(durable=True, on_disk=2)
    job.idle_workers_enter_rendezvous()
    a, b, c = sorted(job.procs)
    if how == "joined":
        job.joins_with_uneven_data(Picks(a, 1.0, 3))
    else:
        job.syncs_from_the_root(fails=set())
        job.commits(Picks([a, b, c]))
        job.commits(Picks([a]))
        job.heartbeats(Picks(sorted(job.procs)), stand_ins=False)
    held = {w: p.commit for w, p in job.procs.items()}
    assert held[a] > held[b] == held[c] > 2 and job.core.ledger.newest == held[a], held
    job.enters_rendezvous(Picks(b))
    job.idle_workers_enter_rendezvous()
    job.crashes(Picks(a), code=exitcodes.UNLOADABLE, dice=0)
    job.teardown()  # the last world forms (check_new_world) and the job ends
    assert job.lost == held[a] and job.ended.code == exitcodes.UNLOADABLE, (job.lost, job.ended)
