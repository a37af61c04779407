"""Random interleavings of everything that can happen to an elastic job, checked after every
step against the rules the core must keep (hypothesis RuleBasedStateMachine, no processes).

The workers are modelled just enough to behave like real ones: they wait in the rendezvous,
train in lockstep (commits), sync from rank 0 (or fail to), exit when told, crash at any time.
"""
import dataclasses
import os

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hvdlite.driver.decisions.core import ElasticCore, Phase, Policy
from hvdlite.driver.decisions.messages import (
    Answer, EndJob, Exited, Heartbeats, HostsFound, Launch, Launched, LaunchFailed, Log, Ready,
    Stop, Tick)

UNIVERSE = [("a", 2), ("b", 1), ("c", 2), ("d", 1)]
STEPS = 100
EXAMPLES = int(os.environ.get("HVDLITE_STATEFUL_EXAMPLES", "100"))  # 100 x 100 = 10,000 steps


class Proc:
    """What a worker process knows of itself."""

    def __init__(self, worker):
        self.worker = worker
        self.started = False
        self.alive = True
        self.round = None  # the world it was last answered with
        self.waiting = None  # `after` of its unanswered rendezvous request
        self.commit = 0  # commits its training state holds
        self.exit_code = None  # how it will exit: told to go, or stopped
        self.stop_when_started = None


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
        self.send(HostsFound(tuple(UNIVERSE[:2])))

    @initialize(durable=st.booleans())
    def checkpoint_dir(self, durable):
        """Half the jobs run with --checkpoint-dir: rank 0's every commit reaches the disk, and
        every worker reports it in its rendezvous requests as one it can restore."""
        self.core.policy = dataclasses.replace(self.core.policy, durable=durable)
        self.disk = 0 if durable else None

    # ---- plumbing -----------------------------------------------------------------------
    def send(self, event, dt=0.0):
        self.now += dt
        if isinstance(event, Exited) and event.code == 0:
            inc = self.core.workers.get(event.worker)
            if inc is not None and inc.alive and inc.phase is not Phase.LEAVING and inc.killed is None:
                self.success_allowed = True
        actions = self.core.handle(event, self.now)
        self.last_actions = actions
        for action in actions:
            self.perform(action)
        return actions

    def perform(self, action):
        if isinstance(action, Log) and action.event == "blacklisted":
            host = action.fields["key"].split("/")[0]
            assert host not in self.core.drained, f"{action.fields['key']} blacklisted though drained"
        if isinstance(action, Launch):
            assert action.worker not in self.procs, "an incarnation id was used twice"
            self.procs[action.worker] = Proc(action.worker)
        elif isinstance(action, Answer):
            proc = self.procs.get(action.worker)
            if proc is None or not proc.alive:
                return
            proc.waiting = None
            if action.body.get("removed"):
                proc.exit_code = 0
            elif "world" in action.body:
                proc.round = action.body["world"]["round"]
                if action.body["world"]["rank"] == 0:  # rank 0 loads the disk when it is newer
                    proc.commit = self.said(proc)
        elif isinstance(action, Stop):
            proc = self.procs[action.worker]
            if not proc.started:
                proc.stop_when_started = -9 if action.grace == 0 else -15
            elif proc.alive:
                proc.exit_code = -9 if action.grace == 0 else -15
        elif isinstance(action, EndJob):
            assert self.ended is None, "the job ended twice"
            self.ended = action
            if action.code == 0:
                assert self.success_allowed, "success without an exit 0 of a current incarnation"
                waiting = [p.worker for p in self.procs.values() if p.alive and p.waiting is not None]
                assert not waiting, f"the job ended with workers left waiting: {waiting}"
        elif isinstance(action, Log) and action.event == "round_complete":
            self.check_new_world()
        elif isinstance(action, Log) and action.event == "commit_lost":
            self.lost = max(self.lost, action.fields["newest"])

    def said(self, proc):
        """The commit a worker reports when it asks for a world: the newest it holds in memory
        or can read from --checkpoint-dir."""
        return max(proc.commit, self.disk or 0)

    def members(self):
        return [p for p in self.procs.values()
                if p.alive and p.round == self.core.round and p.waiting is None and p.exit_code is None]

    def running(self):
        return [p for p in self.procs.values() if p.started and p.alive]

    # ---- rules ---------------------------------------------------------------------------
    @rule(hosts=st.lists(st.sampled_from(UNIVERSE), unique=True, max_size=4),
          how=st.sampled_from(["", "drained", "failed"]))
    def discover(self, hosts, how):
        """Hosts come and go; a source like Ray's says how the gone ones left."""
        gone = tuple(h for h, _ in self.core.hosts if h not in dict(hosts))
        self.send(HostsFound(tuple(hosts), **({how: gone} if how else {})), dt=0.05)

    @rule(data=st.data(), ok=st.booleans())
    def launch_completes(self, data, ok):
        pending = sorted(p.worker for p in self.procs.values() if not p.started and p.alive)
        if not pending:
            return
        proc = self.procs[data.draw(st.sampled_from(pending))]
        if ok:
            proc.started = True
            proc.exit_code = proc.stop_when_started
            self.send(Launched(proc.worker, 1000 + len(self.procs)), dt=0.01)
        else:
            proc.alive = False
            self.send(LaunchFailed(proc.worker, "no route to host"), dt=0.01)

    @rule(data=st.data())
    def enters_rendezvous(self, data):
        idle = sorted(p.worker for p in self.running() if p.waiting is None and p.exit_code is None)
        if not idle:
            return
        proc = self.procs[data.draw(st.sampled_from(idle))]
        proc.waiting = -1 if proc.round is None else proc.round
        self.send(Ready(proc.worker, proc.waiting, self.said(proc)), dt=0.01)

    @rule()
    def world_leaves_together(self):
        """A host update or a broken collective: every member enters the rendezvous."""
        for proc in self.members():
            proc.waiting = proc.round
            self.send(Ready(proc.worker, proc.waiting, self.said(proc)), dt=0.01)

    @rule()
    def idle_workers_enter_rendezvous(self):
        for proc in self.running():
            if proc.waiting is None and proc.exit_code is None and proc.round != self.core.round:
                proc.waiting = -1 if proc.round is None else proc.round
                self.send(Ready(proc.worker, proc.waiting, self.said(proc)), dt=0.01)

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
            self.send(Ready(proc.worker, proc.waiting, self.said(proc)), dt=0.01)

    @rule(fails=st.sets(st.integers(0, 3), max_size=2))
    def syncs_from_rank0(self, fails):
        """A new world's members take rank 0's commit; some may fail to (they keep theirs)."""
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
        commit ahead of the others."""
        members = sorted(p.worker for p in self.members())
        if members:
            for w in data.draw(st.lists(st.sampled_from(members), unique=True, min_size=1)):
                self.procs[w].commit += 1
                if self.disk is not None and self.core.world[w].rank == 0:  # rank 0 writes
                    self.disk = max(self.disk, self.procs[w].commit)

    @rule(data=st.data(), code=st.sampled_from([1, -9, 75]), dice=st.integers(0, 2))
    def crashes(self, data, code, dice):
        live = sorted(p.worker for p in self.running())
        if live and dice == 0:  # rarer than the rest, or few jobs would live long
            proc = self.procs[data.draw(st.sampled_from(live))]
            proc.alive = False
            self.send(Exited(proc.worker, code), dt=0.01)

    @rule(data=st.data())
    def exits_as_told(self, data):
        leaving = sorted(p.worker for p in self.running() if p.exit_code is not None)
        if leaving:
            proc = self.procs[data.draw(st.sampled_from(leaving))]
            proc.alive = False
            self.send(Exited(proc.worker, proc.exit_code), dt=0.01)

    @rule(data=st.data(), dice=st.integers(0, 9))
    def finishes(self, data, dice):
        """Training is over on a member (ends the job: rare)."""
        leaving = sorted(p.worker for p in self.members())
        if leaving and dice == 0:
            proc = self.procs[data.draw(st.sampled_from(leaving))]
            proc.alive = False
            self.send(Exited(proc.worker, 0), dt=0.01)

    @rule(data=st.data())
    def heartbeats(self, data):
        live = sorted(p.worker for p in self.running())
        chosen = data.draw(st.lists(st.sampled_from(live), unique=True)) if live else []
        self.send(Heartbeats(tuple((w, self.procs[w].commit) for w in chosen)), dt=0.01)

    @rule(dt=st.sampled_from([0.1, 0.5, 1.5, 1.5, 1.5, 6.0]))
    def time_passes(self, dt):
        """Cooldowns end, silent workers are killed (5 s), slow starts time out (10 s)."""
        self.send(Tick(), dt=dt)

    @precondition(lambda self: any(not p.alive for p in self.procs.values()))
    @rule(data=st.data(), kind=st.sampled_from(["exit", "ready", "beat", "launched", "failed"]))
    def stale_incarnation_speaks(self, data, kind):
        proc = self.procs[data.draw(st.sampled_from(sorted(w for w, p in self.procs.items() if not p.alive)))]
        before = self.signature()
        event = {"exit": Exited(proc.worker, data.draw(st.sampled_from([0, 1, -9]))),
                 "ready": Ready(proc.worker, 99, 10 ** 6), "beat": Heartbeats(((proc.worker, 10 ** 6),)),
                 "launched": Launched(proc.worker, 1), "failed": LaunchFailed(proc.worker, "x")}[kind]
        actions = self.core.handle(event, self.now)
        assert self.signature() == before, f"a stale {kind} changed the job"
        assert all(isinstance(a, Answer) and a.body == {"removed": True} for a in actions), actions

    # ---- invariants ------------------------------------------------------------------------
    def signature(self):
        c = self.core
        return repr((c.hosts, c.round, sorted(c.world), c.updates, c.broken, c.resets, c.commit_high,
                     c.succeeded, c.ended, c.first_failure, c.short_since, sorted(c.announced),
                     sorted(c.blacklist.until.items()),
                     sorted((w, vars(i)) for w, i in c.workers.items())))

    def check_new_world(self):
        c = self.core
        slots = [c.workers[w].slot for w in c.world]
        assert len(slots) == len(set(slots)), f"a slot twice in one world: {slots}"
        for w in c.world:
            slot = c.workers[w].slot
            host = slot.split("/")[0]
            assert not c.blacklist.blocked(slot, self.now) and not c.blacklist.blocked(host, self.now), \
                f"world {c.round} holds blacklisted {slot}"
        commits = {w: c.workers[w].commit for w in c.world}
        rank0 = next(w for w, p in c.world.items() if p.rank == 0)
        assert commits[rank0] == max(commits.values()), f"rank 0 does not hold the newest commit: {commits}"
        # No commit lost while a holder lives: nobody alive outside the world holds more,
        # unless the core said so.
        outside = [p.commit for w, p in self.procs.items() if p.alive and w not in c.world
                   and self.procs[w].started and not self.blacklisted(w)]
        lost = [a for a in self.last_actions if isinstance(a, Log) and a.event == "commit_lost"]
        assert lost or max(outside, default=0) <= max(commits[rank0], self.lost), \
            f"a live holder of commit {max(outside)} was left out of a world at {commits[rank0]}"

    def blacklisted(self, worker):
        slot = self.core.workers[worker].slot
        return self.core.blacklist.blocked(slot, self.now) or \
            self.core.blacklist.blocked(slot.split("/")[0], self.now)

    @invariant()
    def waiting_holders_are_never_ignored(self):
        """While the world re-forms, no waiting holder of a newer commit than the world's is
        left out, unless its slot is blacklisted or discovery removed it and the commit is
        handed over."""
        c = self.core
        if c.ended or not c.world:
            return
        top = max(c.workers[w].commit for w in c.world)
        if self.disk is not None:  # a joiner read from disk what the world committed since it last said
            top = max([top] + [self.procs[w].commit for w in c.world])
        for w, inc in c.workers.items():
            if inc.phase is Phase.WAITING and inc.after < c.round and w not in c.world:
                assert inc.commit <= top or self.blacklisted(w), \
                    f"{w} waits with commit {inc.commit} above the world's {top}"

    @invariant()
    def one_incarnation_per_slot(self):
        live = [i.slot for i in self.core.workers.values() if i.alive]
        assert len(live) == len(set(live)), f"two live processes on one slot: {live}"

    def must_leave(self):
        """Members leave their world when it broke (their connections are cut) or when a host
        update was announced after it formed (HostsUpdatedInterrupt at the next commit)."""
        places = list(self.core.world.values())
        return self.core.broken >= self.core.round or (
            bool(places) and self.core.updates > places[0].updates)

    def teardown(self):
        """Let every worker cooperate: the job must end, and a success answers everyone."""
        for _ in range(400):
            if self.ended is not None:
                return
            for proc in list(self.procs.values()):
                if not proc.alive:
                    continue
                if not proc.started:
                    proc.started, proc.exit_code = True, proc.stop_when_started
                    self.send(Launched(proc.worker, 1), dt=0.01)
                elif proc.exit_code is not None:
                    proc.alive = False
                    self.send(Exited(proc.worker, proc.exit_code), dt=0.01)
                elif proc.waiting is None and proc.round != self.core.round:
                    proc.waiting = -1 if proc.round is None else proc.round
                    self.send(Ready(proc.worker, proc.waiting, self.said(proc)), dt=0.01)
            # Every world starts with a sync from rank 0, a collective all members finish
            # before any of them commits, which is where a host update is noticed.
            self.syncs_from_rank0(set())
            if self.must_leave():
                self.world_leaves_together()
            members = self.members()
            if members and not any(p.waiting is not None for p in self.procs.values() if p.alive):
                members[0].alive = False  # training is done
                self.send(Exited(members[0].worker, 0), dt=0.01)
            self.send(Heartbeats(tuple((p.worker, p.commit) for p in self.running())), dt=0.0)
            self.send(Tick(), dt=0.5)
        raise AssertionError(f"the job did not end: {self.signature()}")


TestElasticJob = ElasticJob.TestCase
TestElasticJob.settings = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None)
