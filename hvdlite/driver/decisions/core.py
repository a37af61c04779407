"""The elastic job as a state machine: `ElasticCore.handle(event, now)` -> actions.

One event at a time (messages.py), the time passed in, actions returned for the executor;
no threads, sockets, processes or clock reads here, so any interleaving can be replayed.

Rounds: a world ("round" r) forms when every member of the last one has left it (waiting in
the rendezvous again, or exited) or, for the first world, when every launched worker waits.
Its members are the waiting workers on usable slots; ranks stay put (plan.plan_world) and
every rank syncs the state from one that holds the newest commit. New workers are launched on free slots as discovery shows them; once all are waiting,
a host update is announced, members leave at their next commit and the world re-forms.
"""
import random
import signal
from dataclasses import dataclass
from typing import Optional

from hvdlite import exitcodes
from hvdlite.driver.decisions.blacklist import Blacklist
from hvdlite.driver.decisions.deadlines import Deadlines
from hvdlite.driver.decisions.forming import Forming, JobFailed
from hvdlite.driver.decisions.hangs import Progress
from hvdlite.driver.decisions.hostchanges import HostChanges
from hvdlite.driver.decisions.hostrule import RETRY_RANGE, HostRule
from hvdlite.driver.decisions.ledger import Ledger
from hvdlite.driver.decisions.messages import (
    DRIVER, HOST, LAUNCHER, Answer, AskRunWait, DiscoveryFailed, EndJob, Exited, Exiting, Heartbeats,
    HostsFound, Launched, LaunchFailed, Leaving, LinkBroken, LoadFailed, Log, Probed, Publish, Ready,
    LeaseDoubt, RunWait, StackDump, Stop, StopRequested, TemplateDied, Tick, WriteFailed, Written)
from hvdlite.driver.decisions.nodeloss import NodeLoss
from hvdlite.driver.decisions.policy import Policy
from hvdlite.driver.decisions.stopping import GracefulStop
from hvdlite.driver.decisions.stragglers import Stragglers
from hvdlite.driver.decisions.watching import Watching
from hvdlite.driver.decisions.workers import (
    READ_RUN_WAIT, Incarnation, Phase, cannot_load, describe_exit, overdue, overdue_from)

REMOVED = {"removed": True}


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
    steps: tuple = ()  # ((rank, step time over the last window), ...) (stragglers.py)
    stragglers: tuple = ()  # ranks straggling now


class ElasticCore(Forming, HostRule, HostChanges, GracefulStop, Watching, NodeLoss):
    """The job's state and its events; forming.py decides worlds, hostrule.py blacklisting,
    hostchanges.py what discovery says, stopping.py the graceful stop, watching.py hangs and
    stragglers, nodeloss.py a lost node."""

    def __init__(self, policy: Policy, rng=random.random, on_disk: int = 0):
        """on_disk: the newest commit --checkpoint-dir held when the job started."""
        self.policy = policy
        self.ledger = Ledger(on_disk)  # the newest commit and where it is (ledger.py)
        self.blacklist = Blacklist(policy.cooldown_range, rng)
        self.retries = Blacklist(RETRY_RANGE, rng)  # slots waiting out trouble not their host's
        self.hosts = []  # [(name, slots)]: survivors in their old order, new hosts last
        self.slots_of = {}  # name -> slots, of self.hosts
        self.hosts_known = False
        self.drained = set()  # hosts drained on purpose: their workers' exits are no failure
        self.workers = {}  # incarnation id -> Incarnation: live ones, and the current world's
        # Indexes that keep each event's work small at thousands of workers:
        self.phases = {p: {} for p in Phase if p is not Phase.GONE}  # phase -> {id: Incarnation}
        self.staying = set()  # members of the current world that have not left it
        self.joiners = {}  # live incarnations not in a world yet (not leaving): id -> Incarnation
        self.leavers = {}  # live incarnations that said they leave (SIGTERM), not removed yet
        self.hosts_dirty = False  # hosts or blacklist changed: is every host blacklisted now?
        self.launches = {}  # slot -> how many times it was launched (fences its earlier ones)
        self.round = 0  # the current world's number; 0 before the first
        self.world = {}  # incarnation id -> WorldInfo in the current world
        self.updates = 0  # host updates announced to workers
        self.broken = 0  # newest round that fell apart
        self.broken_at = 0.0  # when it did
        self.kept = None  # the holder last said to keep the state for want of anyone to hand it to
        self.resets = 0
        self.succeeded = False
        self.ended = False
        self.first_failure = None
        self.failures = []  # why each failed worker failed, for the job's summary
        self.discovery_failing = 0  # discovery runs failed in a row
        self.discovery_error = None  # the last one's error, already said
        self.short_since = None  # when the job started waiting for --min-np workers
        self.announced = frozenset()  # joiners the last host update was announced for
        self.last_tick = None
        # Since when the driver's lease renewal fails (LeaseDoubt), else None: a driver that may
        # be cut off from everything sees every worker fall silent and no probe answered, its
        # own trouble. Until it renews again it blames nobody (hostrule.py), takes no silent
        # probe for a lost node (nodeloss.py), forms no world and launches nothing (a standby
        # may be taking the job over); its lease's time to live ends it (leadership.py).
        self.in_doubt = None
        self.disrupted = None  # (time, why) the current world was first told to re-form
        self.left = set()  # slots whose worker left at a commit (SIGTERM): not relaunched
        self.stopping = None  # (time, signal number) a graceful stop was asked for
        self.failure = None  # the JobFailed that ends the job once its last world wrote (stopping.py)
        self.progress, self.progress_round = Progress(), 0  # the current world's collective counts
        self.hung = {}  # member named hung -> when; killed once its stack is in (or STACK_WAIT)
        self.stragglers = Stragglers(policy.straggler_factor)  # the current world's step times
        self.deadlines = Deadlines()  # live workers by when workers.overdue() may name them (_schedule)
        self._now, self._out = 0.0, []
        self._handlers = {HostsFound: self._on_hosts, DiscoveryFailed: self._on_discovery_failed,
                          Launched: self._on_launched, LaunchFailed: self._on_launch_failed,
                          Ready: self._on_ready, Heartbeats: self._on_heartbeats,
                          Exiting: self._on_exiting, Exited: self._on_exited,
                          TemplateDied: self._on_template_died, LoadFailed: self._on_load_failed,
                          WriteFailed: self._on_write_failed, Leaving: self._on_leaving,
                          Written: self._on_written, Tick: self._on_tick, StopRequested: self._on_stop,
                          StackDump: self._on_stack, LinkBroken: self._on_link_broken,
                          Probed: self._on_probed, LeaseDoubt: self._on_lease_doubt,
                          RunWait: self._on_run_wait}

    # ---- entry ------------------------------------------------------------------------
    def handle(self, event, now: float) -> list:
        """Apply one event at time `now` (monotonic seconds); returns the actions to perform."""
        self._now, self._out = now, []
        worker = getattr(event, "worker", None)
        if self.ended or (worker is not None and self._current(worker) is None):
            # The job is over, or the worker is an earlier (or unknown) process: nothing it
            # says changes anything; one still waiting is told to go.
            if isinstance(event, Ready):
                known = self._ever_launched(event.worker) or self.ended
                self._emit(Answer(event.worker, 200, REMOVED) if known
                           else Answer(event.worker, 404, {"error": "unknown worker"}))
            return self._out
        try:
            self._handlers[type(event)](event)
            # Only these can free a slot (exits, host changes, cooldowns): the others need
            # no search for free slots.
            self._decide(grow=isinstance(event, (HostsFound, Exited, TemplateDied, LaunchFailed, Tick)))
        except JobFailed as e:
            self._fail(e)
        return self._out

    def view(self) -> JobView:
        members = [self.workers[w] for w in self.world if self.workers[w].alive]
        slots = [f"{h}/{i}" for h, n in self.hosts for i in range(n)]
        usable = sum(1 for slot in slots if not self._blacklisted(slot))
        ranked = [(self.workers[w].rank, w) for w in self.world if self.workers[w].alive]
        s = self.stragglers
        return JobView(self.round, len(members), min(usable, self.policy.max_np or usable),
                       max((inc.commit for inc in members), default=0), len(self.joiners),
                       len(slots) - usable, self.resets,
                       tuple(sorted((r, s.steps[w]) for r, w in ranked if w in s.steps)),
                       tuple(sorted(r for r, w in ranked if w in s.slow)))

    def _emit(self, action):
        self._out.append(action)

    def _log(self, event, **fields):
        self._emit(Log(event, fields))

    def _end(self, code, error=None):
        self.ended = True
        self._emit(EndJob(code, error))

    # ---- events -------------------------------------------------------------------------
    def _on_launched(self, event: Launched):
        inc = self._current(event.worker)
        if inc is not None:
            inc.pid = event.pid
            self._schedule(inc)
            self._log("worker_start", slot=inc.slot, worker=inc.id, pid=event.pid, started=event.started)

    def _on_launch_failed(self, event: LaunchFailed):
        inc = self._current(event.worker)
        if inc is None:
            return
        leaving = inc.phase is Phase.LEAVING and not inc.overdue
        self._set_phase(inc, Phase.GONE)
        self._log("launch_failed", slot=inc.slot, worker=inc.id, error=event.error,
                  **({"removed": True} if leaving else {}))
        if leaving or inc.host in self.drained:
            return  # nobody needs that worker any more, or its host was going away: not judged
        self._blame(inc, event.whose, f"{inc.name} on {inc.host} could not be launched: {event.error}")

    def _on_ready(self, event: Ready):
        inc = self.workers[event.worker]
        if inc.phase is Phase.LEAVING:
            return self._answer_removed(inc.id)
        if self.stopping is not None:  # it left its world: the stop decides (stopping.py)
            self._holds(inc, max(inc.commit, event.commit))
            self._set_phase(inc, Phase.WAITING)
            self.staying.discard(inc.id)
            return
        if inc.answer is not None and inc.answer[0] > event.after:
            # Its last answer got lost (the request timed out): give it again.
            return self._emit(Answer(inc.id, 200, inc.answer[1], inc.rank))
        self._set_phase(inc, Phase.WAITING)
        if inc.left_behind is not None:  # back from a world re-formed without it
            inc.left_behind, self.joiners[inc.id] = None, inc
        inc.after = max(event.after, 0)
        self._holds(inc, event.commit)
        if inc.id in self.world and event.after >= self.round:
            self.staying.discard(inc.id)
            # A member left its world: the others must not wait for it. It left at a commit
            # (a host update announced, a member leaving) or on an error it rolls back from.
            self._mark_broken(self.disrupted[1] if self.disrupted else
                              "failure" if event.rolled_back else "a worker left")

    def _on_run_wait(self, event: RunWait):
        inc = self.workers[event.worker]
        inc.reading, inc.starved_read_at = False, self._now
        if event.seconds is not None:  # a thread that waited and ended takes its count along
            inc.starved = max(inc.starved, event.seconds)
        why = self._overdue(inc)
        if why is not None and why[0] == "launch_overdue":
            self._launch_overdue(inc)
        elif why is not None and why[0] == "worker_start_timeout":
            self._kill(inc, *why)
        self._schedule(inc)

    def _launch_overdue(self, inc: Incarnation):
        """Its launch never started it (a launcher that hangs, a queue): the launcher's trouble.
        It is stopped whenever it starts; its slot is launched again."""
        self._log("launch_overdue", slot=inc.slot, worker=inc.id, after=self.policy.start_timeout)
        inc.overdue = True
        self._remove(inc)
        self._blame(inc, LAUNCHER, None)

    def _on_heartbeats(self, event: Heartbeats):
        for worker, commit in event.beats:
            inc = self._current(worker)
            if inc is not None:
                sooner, inc.heard_at, inc.own_at = self._sooner(inc), self._now, self._now
                if sooner:
                    self._schedule(inc)
                if inc.phase is Phase.TRAINING:
                    self._holds(inc, max(inc.commit, commit))
        for worker, round_number in event.vouched:
            inc = self._current(worker)
            if inc is not None:
                sooner, inc.heard_at, inc.vouched = self._sooner(inc), self._now, (self._now, round_number)
                if sooner:
                    self._schedule(inc)
        self._watch_beats(event)

    def _on_exiting(self, event: Exiting):
        inc = self._current(event.worker)
        if inc is not None and inc.exiting_since is None:
            inc.exiting_since = self._now
            self._schedule(inc)
            self._holds(inc, max(inc.commit, event.commit))

    def _on_exited(self, event: Exited):
        inc = self._current(event.worker)
        if inc is None:
            return  # an earlier process of the slot, or told twice
        drained = event.drained or inc.host in self.drained
        left = event.code == exitcodes.LEFT and inc.killed is None  # at a commit, on purpose
        # No contact with the driver for the liveness timeout: the driver's trouble (stopped,
        # starved, its network), not the host's.
        lost = event.code == exitcodes.LOST_DRIVER and inc.killed is None
        fields = {"error": event.error} if event.error else {}
        if left and (inc.phase is not Phase.LEAVING or inc.leaving_since is not None):
            fields["left"] = True  # a leaver the driver let go (_release_leavers) is one too
        elif inc.phase is not Phase.LEAVING and (drained or lost):
            fields["drained" if drained else "lost_driver"] = True
        was = self._gone(inc, event.code, **fields)
        if was is Phase.LEAVING:
            return
        if left:  # its peers re-form without it, from the same commit; nothing failed
            self.left.add(inc.slot)
            return
        if drained and event.code != 0:
            return  # taken out on purpose: not the host's fault
        if event.code == exitcodes.UNLOADABLE and inc.killed is None:
            # A checkpoint does not load and the driver did not hear why (the worker said it on
            # its stderr): the job's input, as with LoadFailed, never its host's fault.
            raise JobFailed(f"{inc.name} on {inc.host} exited with code {event.code}: a checkpoint in "
                            f"--checkpoint-dir does not load (its line above says which and why)",
                            exitcodes.UNLOADABLE)
        if event.code == 0 and inc.killed is None:
            self.succeeded = True
            return
        self._blame(inc, DRIVER if lost else HOST, f"{inc.name} on {inc.host} {describe_exit(event.code)}" +
                    (f" ({inc.killed})" if inc.killed else f" ({event.error})" if event.error else ""))

    def _on_leaving(self, event: Leaving):
        inc = self._current(event.worker)
        if inc is not None and inc.leaving_since is None and inc.phase is not Phase.LEAVING:
            inc.leaving_since = self._now
            self.leavers[inc.id] = inc
            self.left.add(inc.slot)  # not relaunched; in no world but one that takes its state
            self._log("worker_leaving", slot=inc.slot, worker=inc.id, rank=inc.rank)

    def _on_written(self, event: Written):
        self.ledger.written(event.commit)

    def _on_template_died(self, event: TemplateDied):
        inc = self._current(event.worker)
        if inc is None:
            return
        if inc.killed is not None:  # the driver was ending it as failed anyway
            return self._on_exited(Exited(inc.id, -signal.SIGKILL))
        # Not the worker's failure: its slot is free again and a new worker is launched there.
        # Nor its host's: a launch whose template died before forking it reached the host.
        self._gone(inc, -signal.SIGKILL, cause="its template died" if inc.pid is not None
                   else "its template died before forking it")

    def _on_load_failed(self, event: LoadFailed):
        # Never a fresh start over it: the job ends, its other workers are stopped unjudged.
        inc = self.workers[event.worker]
        raise JobFailed(cannot_load(inc.name, inc.host, event.reason), exitcodes.UNLOADABLE)

    def _on_write_failed(self, event: WriteFailed):
        # Training on would leave every later commit unsaved while the user counts on the
        # folder: the job ends here, said, and what is on disk stays.
        inc = self.workers[event.worker]
        raise JobFailed(f"{inc.name} on {inc.host} {event.reason}")

    def _on_lease_doubt(self, event: LeaseDoubt):
        if event.doubt and self.in_doubt is None:
            self.in_doubt = self._now
            self._log("leadership_in_doubt", action="blaming nobody, forming no world, launching nothing")
        elif not event.doubt and self.in_doubt is not None:
            self._log("leadership_back", after=f"{self._now - self.in_doubt:.1f}s")
            self.in_doubt = None

    def _on_tick(self, event: Tick):
        now, p = self._now, self.policy
        if self._stop_overdue():
            return self._stopped()
        if self.last_tick is not None and now - self.last_tick > p.stall:
            # The driver itself was not running: that silence is not the workers'.
            gap = now - self.last_tick
            for inc in self._live():
                inc.postpone(gap)
            self.broken_at += gap
        self.last_tick = now
        self._expire_blacklist()
        looked = [inc for inc in map(self.workers.get, self.deadlines.due(now)) if inc is not None and inc.alive]
        named = [inc for inc in looked if self._overdue(inc) is not None]
        if len(named) > 1:  # in _live()'s order, as a walk over every worker would take them
            order = {inc.id: i for i, inc in enumerate(self._live())}
            named.sort(key=lambda inc: order[inc.id])
        for inc in named:
            why = self._overdue(inc)  # again: one named before may have changed it
            if why is None:
                continue
            if why[0] == "launch_overdue":
                self._launch_overdue(inc)
            elif why[0] == READ_RUN_WAIT:
                # Past --start-timeout by the wall clock: first read how long it (or the template
                # its launch waits for) waited for a CPU (a starved machine's healthy worker is
                # not named), then judge (_on_run_wait).
                if not inc.reading:
                    inc.reading = True
                    self._emit(AskRunWait(inc.id))
            else:
                self._kill(inc, *why)
        for inc in looked:  # their times moved on (a heartbeat came), or came to nothing
            self._schedule(inc)
        self._check_hangs()
        self._check_stragglers()
        self._probe_suspects()

    # ---- decisions after every event ----------------------------------------------------
    def _decide(self, grow: bool):
        if self.succeeded and not self.ended:
            for inc in self._live():
                # A member of a world that broke will not train on (one stuck in its own code
                # never leaves it): stopped now, not after --elastic-timeout or --stop-timeout,
                # and not blamed. (A stop's waiting holders stay: one may have a commit to write.)
                if inc.phase is Phase.TRAINING and self._broke_at(inc) is not None or (
                        self.stopping is None and inc.phase in (Phase.STARTING, Phase.WAITING)):
                    self._remove(inc)
        if self.in_doubt is not None:
            return  # no world nor launch from a driver that may be cut off (in_doubt)
        if self.stopping is not None:
            return self._decide_stopping()
        if self.succeeded:
            if not self._any_live() and self.failures and self.policy.fail_on_worker_failure:
                n = len(self.failures)
                raise JobFailed(f"the job finished, but {n} worker{'' if n == 1 else 's'} failed on the "
                                f"way (--fail-on-worker-failure): " + "; ".join(self.failures))
            if not self._any_live():
                self._log("job_end", result="success", resets=self.resets,
                          **({"failed": list(self.failures)} if self.failures else {}))
                self._end(exitcodes.FINISHED)
            return
        if not self._any_live() and self.first_failure is not None and not self._resumable_from_disk():
            raise JobFailed(f"all workers failed; first: {self.first_failure}")
        if self.hosts_dirty:
            self.hosts_dirty = False
            if self.hosts and all(self.blacklist.permanent(h) for h, _ in self.hosts):
                raise JobFailed("all hosts are blacklisted")
        if grow:
            self._grow()
        self._release_leavers()
        self._announce_joiners()
        self._maybe_form()

    def _release_leavers(self):
        """A leaver waiting in the rendezvous goes once its commit is safe without it (on disk,
        or held by a worker that stays), or once it waited --stop-timeout for a world to hand
        it to (the next world then says the commit is lost): it exits with exitcodes.LEFT."""
        waiting = [inc for inc in self.leavers.values() if inc.phase is Phase.WAITING]
        if not waiting:
            return
        stays = [inc.commit for inc in self._live() if inc.leaving_since is None and inc.killed is None
                 and inc.phase is not Phase.LEAVING]
        for inc in waiting:
            if self.ledger.safe_without(inc.commit, stays) or self._now - inc.leaving_since > self.policy.stop_timeout:
                self._remove(inc)


    # ---- helpers ----------------------------------------------------------------------
    def _overdue(self, inc):
        """workers.overdue() for a live worker now."""
        return overdue(inc, self._now, self.policy, self._broke_at(inc))

    def _broke_at(self, inc):
        """When the world the worker is still in broke, else None. A member of a broken world that
        never left it (stuck outside hvdlite's collectives, its heartbeat thread going on) holds
        every other worker in the rendezvous."""
        if inc.id not in self.staying:
            return inc.left_behind
        return self.broken_at if self.round and self.broken >= self.round else None

    def _schedule(self, inc):
        """The worker changed in a way that may bring its overdue time forward: the tick looks
        at it then (self.deadlines)."""
        if inc.alive:
            self.deadlines.at(inc.id, overdue_from(inc, self.policy, self._broke_at(inc)))

    def _sooner(self, inc) -> bool:
        """Whether a beat heard now may bring the worker's overdue time forward: most only move
        it later. Its first one, or one after a stall moved heard_at past now (_on_tick), does."""
        return inc.heard_at is None or inc.heard_at > self._now

    def _live(self):
        return [inc for phase in self.phases.values() for inc in phase.values()]

    def _resumable_from_disk(self) -> bool:
        """With --checkpoint-dir, every worker failing after a commit need not end the job
        (Horovod's rule) while some slot is only cooling down: workers launched there read
        the newest commit from disk. The ledger's newest is the one to match, so a world
        formed from an older one says `commit_lost`, or fails if none is left."""
        if not self.policy.durable:
            return False
        permanent = self.blacklist.permanent
        return self.ledger.newest > 0 and any(
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
            self.leavers.pop(inc.id, None)
        inc.phase = phase
        if phase is Phase.GONE:  # a job of a million relaunches keeps what fencing needs only
            if inc.id not in self.world:
                del self.workers[inc.id]

    def _ever_launched(self, worker) -> bool:
        """An incarnation id this job gave out ("slot#n", n up to the slot's launches)."""
        slot, _, n = worker.rpartition("#")
        return n.isdigit() and 0 < int(n) <= self.launches.get(slot, 0)

    def _current(self, worker) -> Optional[Incarnation]:
        inc = self.workers.get(worker)
        return inc if inc is not None and inc.alive else None

    def _announce(self, reason):
        self.updates += 1
        self._disrupt("hosts updated")
        self._log("hosts_updated", updates=self.updates, reason=reason)
        self._emit(Publish(self.updates, self.broken))

    def _mark_broken(self, cause="failure"):
        if self.round and self.broken < self.round:
            self.broken, self.broken_at = self.round, self._now
            # --elastic-timeout runs for its members from now: each is looked at by then at the
            # latest (for one that needs no look then, that look finds nothing).
            stuck_from = self._now + self.policy.elastic_timeout
            for worker in self.staying:
                self.deadlines.at(worker, stuck_from)
            self._disrupt(cause)
            self._log("round_broken", round=self.round, cause=cause)
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

    def _gone(self, inc: Incarnation, code, **fields) -> Phase:
        """The worker's process ended; returns the phase it was in."""
        was = inc.phase
        self._set_phase(inc, Phase.GONE)
        self.staying.discard(inc.id)
        if was is Phase.LEAVING and not fields.get("left"):
            fields["removed"] = True
        self._log("worker_exit", slot=inc.slot, worker=inc.id, rank=inc.rank, code=code, **fields)
        if inc.id in self.world and code != 0 and not fields.get("left"):  # these close their connections
            self._mark_broken()
        return was

    def _holds(self, inc: Incarnation, commit: int):
        """The worker holds `commit` now: in the ledger, it counts for good, so that a world
        formed from less after the worker is gone says so (or fails) rather than training on
        from an older commit, or from scratch, without a word."""
        inc.commit = commit
        self.ledger.held(commit)

    def _kill(self, inc: Incarnation, event, why):
        """`event`: the log line that says so (None: said already)."""
        inc.killed = why
        if event is not None:
            self._log(event, slot=inc.slot, worker=inc.id, rank=inc.rank, reason=why, action="killing it")
        self._emit(Stop(inc.id, 0.0))
        if inc.id in self.world:
            self._mark_broken()
