"""`hvdlite run` after the flags: serve the rendezvous, run the job's decisions, end cleanly.

The decision thread (this one) takes one event at a time from a queue, hands it to the
elastic core (decisions/core.py) and has the executor perform the actions it returns. HTTP
handler threads, launch threads and the discovery thread only post events.
"""
import os
import queue
import secrets
import shutil
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from hvdlite.discovery.script import DiscoveryError
from hvdlite.discovery.sources import host_source
from hvdlite.driver.claims import Claims
from hvdlite.driver.decisions import adoption
from hvdlite.driver.decisions.assignment import assign
from hvdlite.driver.decisions.cause import Causes
from hvdlite.driver.decisions.core import ElasticCore, JobView
from hvdlite.driver.decisions.hangs import EXITED, NO_STACK, STACK_WAIT, Progress, ceiling
from hvdlite.driver.decisions.stragglers import Stragglers
from hvdlite.driver.decisions.policy import Policy
from hvdlite.driver.decisions.workers import cannot_load, describe_exit
from hvdlite.driver.decisions.messages import (
    SILENT, DiscoveryFailed, Exited, Exiting, HostsFound, Launch, Launched, LaunchFailed, LeaseDoubt,
    LoadFailed, Probed, StackDump, StopRequested, Tick, WriteFailed)
from hvdlite.driver.descriptors import raise_limit
from hvdlite.driver.eventlog import EventLog
from hvdlite.driver.executor import Executor
from hvdlite.driver.jobstats import JobStats, status_line
from hvdlite.driver.kv.server import KVServer
from hvdlite.driver.launchers import Launchers
from hvdlite.driver.leadership import Leadership, NotLeader
from hvdlite.driver import standby
from hvdlite.driver.store import choice
from hvdlite.driver.metrics import MetricsServer
from hvdlite.driver.network import advertised_address, bind_address
from hvdlite.driver.probe import Prober
from hvdlite.driver.rendezvous import Rendezvous
from hvdlite.driver.terminal import StatusKeeper, is_tty
from hvdlite import defaults, exitcodes, procstat
from hvdlite.worker import beacon, checkpointdir
from hvdlite.worker.trace import discard_parts, merge_parts
from hvdlite.errors import HvdliteError, JobError, Unloadable

TICK = 0.1  # seconds between timer events
JOURNAL_EVERY = 1.0  # seconds between journal writes (the commits the ledger names move on)
ENDING_POLL = 0.5  # seconds between looks at the last driver's workers Ray is ending (adoption.ENDS)


def _pid(identity: str) -> int:
    return int(identity.split(":")[0])


class Job:
    def __init__(self, settings, log: EventLog, stats=None):
        self.settings, self.log = settings, log
        self.stats = stats or JobStats()
        self.metrics = None
        # SimpleQueue: its put may run inside its own get, as the signal handler's does (a
        # Queue's lock is not reentrant: a signal landing inside get() deadlocked the stop).
        self.events = queue.SimpleQueue()
        self.secret = secrets.token_urlsafe(32)
        self.launchers = Launchers(settings)
        self.rendezvous = Rendezvous(self.events.put)
        self.server = None
        self.executor = None
        self.prober = None
        self.leader = None  # with --checkpoint-dir: this driver's lease and journal (leadership.py)
        self.not_leader = False  # another driver took the job over: its workers are left alone
        self.stopping = threading.Event()

    def start_server(self, remote_possible: bool):
        addr = bind_address(self.settings.bind_address, self.settings.network_interfaces, remote_possible)
        limit = raise_limit()  # the connection caps follow it
        self.server = KVServer(self.secret, bind=addr, on_exhausted=lambda n: self.log.emit(
            "descriptors_exhausted", refused=n, limit=limit))
        self.server.add_route("/rdzv/", self.rendezvous.route)
        self.server.set_heartbeat(self.rendezvous.heartbeat)
        claims = Claims(self.secret, self.settings.start_timeout, self.log.announce)
        self.server.set_claims(claims)
        self.server.start()
        self.log.debug(f"rendezvous server at {self.server.address[0]}:{self.server.address[1]}")
        if self.settings.metrics_port:
            where = self.settings.metrics_addr or self.server.address[0]
            try:
                self.metrics = MetricsServer(self.stats, where, self.settings.metrics_port)
            except OSError as e:
                raise JobError(f"--metrics-port: cannot serve metrics on {where}:"
                               f"{self.settings.metrics_port}: {e.strerror or e}") from None
            self.metrics.start()
            self.log.debug(f"metrics at http://{where}:{self.metrics.address[1]}/metrics")
        self.executor = Executor(self.settings, self.log, self.launchers, self.server,
                                 self.rendezvous, self.secret, self.events.put, self.settings.elastic,
                                 claims=claims)
        if self.settings.elastic:  # a lost node told from a paused worker (decisions/nodeloss.py)
            self.prober = self.executor.prober = Prober(self.events.put, defaults.PROBE_TIMEOUT)
            self.server.add_route("/node/", self.prober.route)

    def next_event(self, timeout):
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    # ---- elastic ---------------------------------------------------------------------
    def run_elastic(self, store=None) -> int:
        """Run the job; with --checkpoint-dir as its leader, taking the job over from the
        journal in `store` (default: the FileStore in --checkpoint-dir) when the last driver
        left live workers behind."""
        s = self.settings
        source = host_source(s, progress=lambda: {"HVDLITE_NEWEST_COMMIT": str(self.stats.summary().commits)})
        first = source.read()  # a first failure is fatal (DiscoveryError)
        self._describe(source)
        saved = self._lead(store) if s.checkpoint_dir else None
        self.start_server(source.changes or any(not self.launchers.is_local(h) for h, _ in first))
        if self.leader is not None:
            self.rendezvous.set_epoch(self.leader.epoch)
            self.executor.epoch = self.leader.epoch
        if source.changes:
            threading.Thread(target=self._poll_hosts, args=(source,), daemon=True,
                             name="hvdlite-discovery").start()
        strangers = checkpointdir.others(s.checkpoint_dir) if s.checkpoint_dir else {}
        if strangers:
            named = ", ".join(f"{line or '(unnamed)'} of uid {uid}" for line, uid in sorted(strangers.items()))
            self.log.say(f"{s.checkpoint_dir} also holds checkpoints another user wrote (lineage {named}): "
                         f"this job never resumes nor deletes them")
        core = ElasticCore(Policy(
            min_np=s.min_np, max_np=s.max_np, reset_limit=s.reset_limit,
            elastic_timeout=s.elastic_timeout, start_timeout=s.start_timeout,
            liveness_timeout=s.liveness_timeout, cooldown_range=s.cooldown_range,
            blacklist=s.blacklist, durable=bool(s.checkpoint_dir), stop_timeout=s.stop_timeout,
            hang_timeout=s.hang_timeout, hang_floor=s.hang_floor, collective_timeout=s.collective_timeout,
            straggler_factor=s.straggler_factor, straggler_evict=s.straggler_policy == "evict",
            fail_on_worker_failure=s.fail_on_worker_failure),
            on_disk=on_disk(s))
        unheard = self._adopt(core, saved) if saved is not None else set()
        if self.leader is not None:  # workers between drivers come here
            self.leader.publish(self._reachable(first), self.server.address[1])
        event, last_tick, journaled = found(first), time.monotonic(), None
        while True:
            now = time.monotonic()
            actions = []
            if self.leader is not None:
                # Before any decision: a driver that lost its lease makes none. A node is taken
                # for lost on a silent probe only with the lease just renewed: the driver may be
                # the one cut off (decisions/core.py's in_doubt).
                self.leader.keep(now, force=isinstance(event, Probed) and event.outcome == SILENT)
                if self.leader.in_doubt != (core.in_doubt is not None):
                    actions += core.handle(LeaseDoubt(self.leader.in_doubt), now)
            actions += core.handle(event, now) if event is not None else []
            beats = self.rendezvous.drain_heartbeats()
            if beats is not None:
                actions += core.handle(beats, now)
                if unheard:
                    self._heard_adopted(unheard, beats, core)
            ticked = now - last_tick >= TICK
            if ticked:
                last_tick = now
                actions += core.handle(Tick(), now)
            end = self.executor.apply(actions)
            if ticked or end is not None:
                self.stats.on_view(core.view(), time.time())
            # At once when a world formed or broke or a worker came or went, else each second.
            changed = (core.round, core.broken, len(core.workers), len(self.executor.handles))
            if self.leader is not None and end is None and (
                    journaled is None or journaled[0] != changed or now - journaled[1] >= JOURNAL_EVERY):
                journaled = (changed, now)
                self.leader.record({**adoption.journal(core, now), "procs": self.executor.identities(),
                                    "written_at": time.time(), "command": s.command,
                                    "driver_host": socket.gethostname()})
            if end is not None:
                if end.error:
                    self.log.error(end.error)  # the core logged job_end already
                return end.code
            event = self.next_event(TICK)

    def _reachable(self, hosts) -> str:
        """The server's address as the workers on `hosts` reach it: bound to every interface,
        this machine's address on the route to the first remote host (this machine's own
        workers reach it too), else loopback."""
        remote = [h for h, _ in hosts if not self.launchers.is_local(h)]
        return advertised_address(self.server.address[0], not remote, lambda: self.launchers.route_to(remote[0]))

    def _lead(self, store):
        """Take the job's lease; the last driver's journal when its workers live on, else None.
        The job's secret is that driver's when its workers are taken over, else a new one."""
        s = self.settings
        store = store or choice.open_store(s.driver_store, s.checkpoint_dir)

        def take():
            return Leadership.take(s.checkpoint_dir, s.liveness_timeout, time.monotonic(), store)

        try:
            self.leader = standby.lead(take, store, self.log.say, stopped=lambda: not self.events.empty()) \
                if s.standby else take()
        except NotLeader:
            self.not_leader = True
            raise
        if self.leader is None:  # a standby asked to stop while it waited
            raise _Signalled(self.events.get().signum)
        saved = self.leader.journal()
        procs = saved.get("procs", {}) if saved is not None else {}
        hosts = {w["id"]: w["host"] for w in saved.get("workers", ())} if saved is not None else {}
        reached = {h: adoption.LOCAL if self.launchers.is_local(h) else adoption.ADOPTS
                   if hasattr(self.launchers.for_host(h), "adopt") else adoption.ENDS
                   if getattr(self.launchers.for_host(h), "ends_with_driver", False) else adoption.OTHER
                   for h in adoption.live_hosts(saved)}
        # A process listed without its worker (one the last driver was removing) is looked for here.
        running = {w: _pid(identity) for w, identity in procs.items()
                   if (w not in hosts or self.launchers.is_local(hosts[w])) and procstat.runs(identity)}
        exited = {w for w in procs
                  if s.checkpoint_dir and os.path.exists(beacon.output_path(s.checkpoint_dir, w, "exit"))}

        def decide():
            now = time.time()  # one clock reading: what is asked over SSH and what rerun() judges agree
            elsewhere = self._running_elsewhere(saved, procs, reached, adoption.in_grace(saved, now, s.driver_grace)) \
                if saved is not None else set()
            return adoption.rerun(saved, running, elsewhere, exited, reached, s.command, socket.gethostname(),
                                  now, s.driver_grace, s.checkpoint_dir)
        decision, waited_until = decide(), time.monotonic() + adoption.ENDING_WAIT
        while decision.ending and time.monotonic() < waited_until:  # Ray is ending them
            time.sleep(ENDING_POLL)
            decision = decide()
        if decision.ending:
            raise JobError(adoption.not_ended(decision.ending))
        if decision.refused is not None:
            raise JobError(decision.refused)
        for pid in decision.kill:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if decision.adopt:  # one gone is launched again, unblamed (_adopt)
            saved["procs"] = {w: p for w, p in procs.items() if w not in decision.gone}
        else:
            saved = None
        self.secret = self.leader.take_secret(adopting=saved is not None)
        return saved

    def _running_elsewhere(self, saved, procs, reached, graced) -> set:
        """The journal's workers on other hosts whose processes run, as each host's launcher
        tells (every host at once; none of a host that cannot be reached): on SSH hosts (pid and
        start time) while their grace lasts; on Ray nodes (pid and start time) and as srun steps
        always (Ray ends a dead driver's workers only in its own time; Slurm lists a step that
        outlives its grace, a stopped one say: a fresh start must not run beside either)."""
        remote = {}  # host -> identity -> worker
        for w in saved.get("workers", ()):
            how = reached.get(w["host"])
            if w["id"] in procs and (how == adoption.ADOPTS and graced or how == adoption.ENDS or
                                     how == adoption.OTHER and hasattr(self.launchers.for_host(w["host"]), "running")):
                remote.setdefault(w["host"], {})[procs[w["id"]]] = w["id"]
        with ThreadPoolExecutor(max(1, len(remote))) as pool:
            found = pool.map(lambda host: self.launchers.for_host(host).running(host, remote[host]), remote)
        return {remote[host][identity] for host, there in zip(remote, found) for identity in there}

    def _adopt(self, core, saved):
        """Make `core` the journal's job and take its live workers over."""
        now = time.monotonic()
        adoption.adopt(core, saved, now)
        procs = saved.get("procs", {})
        unseen = []
        for inc in core._live():
            if inc.id not in procs:  # launched as the last driver died (nobody knows its process), or
                unseen.append(inc.id)  # an SSH worker gone without a word (_lead)
                continue
            inc.pid = _pid(procs[inc.id])
            self.executor.adopt(inc.id, inc.slot, inc.host, inc.pid, procs.get(inc.id),
                                str(inc.rank) if inc.rank is not None else inc.slot)
            if os.path.exists(beacon.output_path(self.settings.checkpoint_dir, inc.id, "exit")):
                # It began to exit while no driver ran (its training finished, say): it gets the
                # exit's grace, not the liveness timeout, to end.
                self.events.put(Exiting(inc.id, 0, None))
        for worker in unseen:  # as a worker that lost its driver: its slot is launched again, unblamed
            self.events.put(Exited(worker, exitcodes.LOST_DRIVER))
        self.rendezvous.publish(core.updates, core.broken)
        self.log.announce("job_adopted", lease=self.leader.epoch, after=round(procstat.age(os.getpid()), 3),
                          **adoption.summary(core))
        return {inc.id for inc in core._live()} - set(unseen)

    def _heard_adopted(self, unheard, beats, core):
        """Say once when every worker taken over that lives has beaten here: the take-over's time."""
        unheard.difference_update([w for w, _ in beats.beats] + [w for w in unheard if core._current(w) is None])
        if not unheard:
            self.log.announce("job_readopted", after=round(procstat.age(os.getpid()), 3))

    def _poll_hosts(self, source):
        # Never dies: a failing, hanging or crashing discovery run is reported and retried.
        while not self.stopping.wait(self.settings.discovery_interval):
            try:
                self.events.put(found(source.read()))
            except DiscoveryError as e:
                self.events.put(DiscoveryFailed(str(e)))
            except Exception as e:  # noqa: BLE001 - reported, then the next run is tried
                self.events.put(DiscoveryFailed(f"{type(e).__name__}: {e}"))

    def _describe(self, source):
        for line in source.describe().splitlines():
            self.log.say(line)

    # ---- static ----------------------------------------------------------------------
    def run_static(self) -> int:
        s = self.settings
        source = host_source(s)
        hosts = source.read()
        self._describe(source)
        self.start_server(any(not self.launchers.is_local(h) for h, _ in hosts))
        places = assign(hosts, s.num_proc)
        running, started, commits = {}, set(), {}  # commits: worker -> newest it reported
        progress = Progress()  # every rank's collectives, for hangs (decisions/hangs.py)
        stragglers = Stragglers(s.straggler_factor)  # and their step times (decisions/stragglers.py)
        causes = Causes()  # which failed exit to name (decisions/cause.py)
        for place in places:
            slot = f"{place.hostname}/{place.local_rank}"
            running[f"{slot}#1"] = place
            self.executor.apply([Launch(f"{slot}#1", slot, place.hostname, place.local_size, place)])
        placed = dict(running)
        stragglers.new_world(time.monotonic())
        while running:
            event = self.next_event(TICK)
            beats = self.rendezvous.drain_heartbeats()
            commits.update(beats.beats if beats is not None else ())
            now = time.monotonic()
            for worker, calls in beats.calls if beats is not None else ():
                progress.heard(worker, calls, now)
            for worker, _ in beats.vouched if beats is not None else ():
                progress.vouched(worker, now)
            for (worker, calls), (_, waited) in zip(beats.calls, beats.waited) if beats is not None else ():
                stragglers.heard(worker, calls, waited, now, worker in beats.idle)
            for kind, worker, step, median in stragglers.check(started & running.keys(), now):
                self.log.announce(kind, slot=worker.split("#")[0], worker=worker, rank=placed[worker].rank,
                                  step=round(step, 4), median=round(median, 4))
            if isinstance(event, Exiting) and event.calls is not None:
                progress.heard(event.worker, event.calls, now)
            if isinstance(event, Exiting) and event.echo:
                causes.echoed(event.worker)
            top = ceiling(s.collective_timeout)
            timeout = progress.timeout(s.hang_timeout, s.hang_floor, top)
            # (an exited rank's peers may wait on it too)
            hung = progress.hung(started, now, timeout, top if s.hang_timeout is None else None)
            if hung:
                self._end_hung(hung, placed, running, progress.reason(*hung[0][1:], now))
            # One world of every rank: what the status of an elastic job says, for /metrics.
            members = len(started & running.keys())
            self.stats.on_view(JobView(round=1 if members else 0, world_size=members,
                                       target_size=s.num_proc, commit=max(commits.values(), default=0),
                                       joining=len(running) - members, blacklisted_slots=0, resets=0,
                                       steps=tuple(sorted((placed[w].rank, t) for w, t in stragglers.steps.items())),
                                       stragglers=tuple(sorted(placed[w].rank for w in stragglers.slow))),
                               time.time())
            if isinstance(event, Launched):
                started.add(event.worker)
                self.log.emit("worker_start", slot=event.worker.split("#")[0], worker=event.worker,
                              rank=running[event.worker].rank, pid=event.pid, started=event.started)
            elif isinstance(event, LaunchFailed):
                raise JobError(f"rank {running[event.worker].rank} could not be launched: {event.error}")
            elif isinstance(event, LoadFailed) and event.worker in running:
                place = running[event.worker]
                raise Unloadable(cannot_load(f"rank {place.rank}", place.hostname, event.reason))
            elif isinstance(event, WriteFailed) and event.worker in running:
                place = running[event.worker]
                raise JobError(f"rank {place.rank} on {place.hostname} {event.reason}")
            elif isinstance(event, Exited):
                place = running.pop(event.worker)
                self.log.emit("worker_exit", slot=event.worker.split("#")[0], worker=event.worker,
                              rank=place.rank, code=event.code)
                if event.code != 0:
                    causes.failed(event.worker, event.code, event.error, now)
            self._end_failed(causes.named(running.keys(), now), placed)
        self._end_failed(causes.named((), time.monotonic()), placed)
        self.log.emit("job_end", result="success")
        return 0

    def _end_hung(self, hung, placed, running, reason):
        """Name the first hung rank, with its stack, and end the static job: its peers would
        wait out the collective timeout, and then blame themselves."""
        worker = hung[0][0]
        place, live = placed[worker], worker in running
        who = {"slot": worker.split("#")[0], "worker": worker, "rank": place.rank}
        self.log.announce("worker_hung", **who, reason=reason, action="stopping the job")
        if live:
            self.rendezvous.ask_stack(worker)
        stack, deadline = None, time.monotonic() + STACK_WAIT
        while live and stack is None and time.monotonic() < deadline:
            event = self.next_event(deadline - time.monotonic())
            if isinstance(event, StackDump) and event.worker == worker:
                stack = event.stack
        self.log.announce("worker_stack", **who, **({"stack": stack} if stack else
                                                    {"missing": NO_STACK if live else EXITED}))
        raise JobError(f"rank {place.rank} on {place.hostname} is hung: {reason}; stopping the job")

    @staticmethod
    def _end_failed(named, placed):
        """End the static job on the failure decisions/cause.py names, if it names one."""
        if named is not None:
            worker, code, error = named
            why = f" ({error})" if error else ""
            raise JobError(f"rank {placed[worker].rank} on {placed[worker].hostname} {describe_exit(code)}"
                           f"{why}; stopping the job")

    def close(self):
        self.stopping.set()
        if self.not_leader:  # the workers are the leading driver's
            self.launchers.close()
            if self.server is not None:
                self.server.stop()
            return
        if self.executor is not None:
            self.executor.stop_all()
        if self.leader is not None:
            # Refused before it started anything (_lead): the journal stays for the next driver.
            self.leader.end() if self.executor is not None else self.leader.release()
        if self.metrics is not None:
            self.metrics.stop()
        if self.settings.timeline_filename:
            merge_parts(self.settings.timeline_filename)
        self.launchers.close()
        self.rendezvous.close()
        if self.prober is not None:
            self.prober.close()
        if self.server is not None:
            self.server.stop()


def on_disk(settings) -> int:
    """The newest commit --checkpoint-dir holds of the lineage the job resumes, by the files'
    names: a stop before any worker reported it still says it is there."""
    newest = checkpointdir.newest(settings.checkpoint_dir, settings.checkpoint_lineage) \
        if settings.checkpoint_dir else None
    return newest[0] if newest is not None else 0


def found(hosts) -> HostsFound:
    """The event of a source's read: the hosts, and how the ones that left went, if it knows."""
    return HostsFound(tuple(hosts), tuple(getattr(hosts, "drained", ())), tuple(getattr(hosts, "failed", ())))


class _Signalled(Exception):
    def __init__(self, signum):
        self.signum = signum


def run(settings) -> int:
    # --log-level WARNING and above silences the event lines; DEBUG adds the driver's details.
    level = settings.log_level
    stats = JobStats()
    on_console = settings.elastic and level in ("DEBUG", "INFO")
    log = EventLog(settings.event_log, on_console=on_console,
                   verbose=settings.verbose or level == "DEBUG", listeners=[stats.on_event])
    job = Job(settings, log, stats)
    # Each run's first line: `hvdlite timeline` tells runs appended to one log apart by it.
    log.emit("job_start", mode="elastic" if settings.elastic else "static", np=settings.num_proc,
             min_np=settings.min_np, max_np=settings.max_np)
    if settings.timeline_filename:
        discard_parts(settings.timeline_filename)  # an earlier job's
    # On a terminal, an elastic job's state stays in view under its events.
    status = StatusKeeper(lambda: status_line(stats.summary(), time.time(),
                                              shutil.get_terminal_size().columns - 1)).start() \
        if on_console and is_tty() else None

    stopping = []

    def on_signal(signum, frame):
        if settings.elastic and not stopping:
            stopping.append(signum)
            job.events.put(StopRequested(signum))
            return
        raise _Signalled(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in exitcodes.STOP_SIGNALS}
    try:
        return job.run_elastic() if settings.elastic else job.run_static()
    except _Signalled as e:
        log.announce("job_end", result="interrupted", signal=signal.Signals(e.signum).name)
        return 128 + e.signum
    except HvdliteError as e:
        job.not_leader = job.not_leader or isinstance(e, NotLeader)
        log.emit("job_end", result="failure", reason=str(e))
        log.error(str(e))
        return e.exit_code
    finally:
        for sig in exitcodes.STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        job.close()
        if status is not None:
            status.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log.close()
