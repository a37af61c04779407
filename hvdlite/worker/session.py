"""A worker's link to the driver: rendezvous client, heartbeats and assignments (torch-free).

Every worker heartbeats to the driver. The answer tells it how many host updates the driver
has announced and the newest round the driver saw fall apart; a worker that cannot reach the
driver for the liveness timeout exits, so a dead driver or a partition never leaves workers
behind.

With --checkpoint-dir it trains on without a driver for --driver-grace instead (rank 0 writing
its commits), polling the beacon (beacon.py) for a driver that takes the job over; it goes over
to one whose lease epoch is greater than any it accepted, and refuses answers from a driver
with a smaller one (an old driver back from a pause or a partition). A change of world in the
gap (a peer died) waits for the new driver. When the grace ends with none, it exits as above,
writing first the newest commit it holds where the folder lacks it (rank 0 may be dead: durable.finish).
"""
import atexit
import dataclasses
import ipaddress
import json
import os
import socket
import sys
import threading
import time
import traceback

from hvdlite import defaults, exitcodes
from hvdlite.worker import beacon, durable, env, exitcode, probed, rescue, stopping
from hvdlite.worker.claim import job_secret
from hvdlite.worker.errors import quiet_broken_world
from hvdlite.worker.kvclient import Heartbeats, KVClient
from hvdlite.worker.runtime import entered, idle, waited
from hvdlite.worker.world import WorldInfo

HEARTBEAT_INTERVAL = defaults.HEARTBEAT_INTERVAL
# Rank 0's view of host updates is the one every rank acts on (State.check_host_updates), so
# it hears of them sooner: a joiner waits for the members to leave their world for about
# half this, not half the normal interval. One worker per job: no load on the driver.
RANK0_HEARTBEAT_INTERVAL = 0.1
HEARTBEAT_TIMEOUT = 2.0  # seconds for one heartbeat, connecting included
STALL = 1.0  # seconds of oversleeping that mean this process was not running
BEACON_POLL = 0.05  # seconds between looks at the beacon while no driver answers
GAP_BEAT_TIMEOUT = 0.5  # seconds a heartbeat waits for its answer while the last one got none


def between_drivers(environ, secret: str):
    """(--driver-grace, a Watch of the beacon) for a worker that trains on without a driver
    until one takes the job over (elastic, with --checkpoint-dir); (0.0, None) otherwise."""
    cfg = durable.config(environ)
    grace = float(environ.get(env.DRIVER_GRACE, "0")) if cfg is not None and environ.get(env.ELASTIC) == "1" else 0.0
    return grace, beacon.Watch(cfg.directory, secret) if grace else None


class Removed(SystemExit):
    """The driver left this worker out of the new world: the process ends with code 0, or
    exitcodes.LEFT when it leaves on a SIGTERM."""

    def __init__(self):
        super().__init__(exitcodes.LEFT if stopping.requested else 0)


class Session:
    def __init__(self, environ=os.environ):
        try:
            self.addr = environ[env.RENDEZVOUS_ADDR]
            self.port = int(environ[env.RENDEZVOUS_PORT])
        except KeyError as e:
            raise RuntimeError(
                f"hvdlite: {e.args[0]} is not set; start this script with `hvdlite run`") from None
        secret = job_secret(environ)
        self.environ = environ
        self.worker = environ.get(env.WORKER, "")  # this launch's incarnation id
        self.elastic = environ.get(env.ELASTIC) == "1"
        self.echo = False  # a HorovodInternalError ends the script: told as it exits
        if not self.elastic:
            quiet_broken_world(lambda: setattr(self, "echo", True))
        self.liveness_timeout = float(environ.get(env.LIVENESS_TIMEOUT, defaults.LIVENESS_TIMEOUT))
        self.epoch = int(environ.get(env.DRIVER_EPOCH, "0"))  # the greatest driver lease accepted
        # Seconds to train on without a driver: a successor finds the live workers through the
        # beacon in --checkpoint-dir (0: exit after the liveness timeout, as without one).
        self.grace, self._watch = between_drivers(environ, secret)
        if self.grace:
            rescue.install(durable.config(environ).directory, self.worker)
        self.client = KVClient(self.addr, self.port, secret)
        # Signed datagrams with a short timeout: cheap for the driver at thousands of workers,
        # and a partition is noticed within the liveness timeout.
        self._beats = Heartbeats(self.client, timeout=HEARTBEAT_TIMEOUT)
        self.commits = 0  # commits the training state holds, told to the driver in heartbeats
        self.device_address = None  # where to bind gloo, when the driver says
        self.updates = 0  # host updates announced by the driver, as last heard
        self.interval = HEARTBEAT_INTERVAL  # seconds between heartbeats
        self.broken = 0  # newest round the driver saw fall apart, as last heard
        self.stopping = False  # the driver said the job stops: leave at the next commit
        self.kept = False  # it left its last world at a commit, keeping its state (no rollback)
        self.stack_asked = False  # the driver asked for the main thread's stack and got it
        self.on_round_broken = None  # callback(round), called on every heartbeat answer
        self.probed = None  # (addr, port) the driver probes this worker's node at (probed.py)
        self._joins = {}  # round -> times this process was given a place in it
        durable.install(self.tell, holding=bool(self.grace))  # its checkpoints' word to the driver goes through here
        self._heartbeat = threading.Thread(target=self._beat, daemon=True, name="hvdlite-heartbeat")
        self._heartbeat.start()
        atexit.register(self._say_goodbye)
        if self.elastic:
            stopping.install(self._tell_off_thread)
            probed.listen(self)

    def tell(self, what: str, body: bytes = b"", timeout: float = 5.0, **query) -> bool:
        """PUT /rdzv/`what` for this worker (rendezvous.py lists them); whether the driver
        heard it."""
        try:
            status, _ = self.client.request("PUT", f"/rdzv/{what}", body, query={"worker": self.worker, **query},
                                            timeout=timeout)
            return status == 200
        except Exception:  # noqa: BLE001 - the driver may be gone: the caller says what then
            return False

    def _tell_off_thread(self, what: str):
        """Runs on a thread of its own per signal (stopping.install)."""
        try:
            self.tell(what)
        finally:
            # This thread's KV connection: left to the thread's end, it leaks as a connect
            # thread's did (links.py).
            self.client.close()

    def _say_goodbye(self):
        stopping.on_exit()
        # Interpreter teardown (a full garbage collection of torch) can hold the GIL for
        # seconds, silencing the heartbeat: tell the driver this is an exit, not a hang.
        try:
            self.client.request("PUT", "/rdzv/exiting", query={"worker": self.worker, "commit": str(self.commits),
                                                               "calls": str(entered()), "code": str(exitcode.own()),
                                                               **({"echo": "1"} if self.echo else {})},
                                timeout=2)
        except Exception:  # noqa: BLE001 - the driver may be gone; exiting regardless
            self._leave_word(exitcode.own())

    def _leave_word(self, code: int) -> None:
        """No driver hears this exit: its code goes into the driver folder, for the driver that
        takes the job over (a worker that finished its training while none ran is no failure)."""
        if self.grace:
            path = beacon.output_path(durable.config(self.environ).directory, self.worker, "exit")
            try:
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                beacon.write_private(path, str(code).encode())
            except OSError:
                pass

    def local_address(self, rank: int) -> str:
        """The address peers reach this worker, `rank` of its group, at: the one the driver
        named for the current world (a local worker of a world with remote members), else this
        host's address on the route to the driver; on loopback, one address per rank."""
        if self.device_address:
            return self.device_address
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((self.addr, self.port))
            return loopback_by_rank(s.getsockname()[0], rank)

    def assignment(self, after_round=None, commit=0) -> WorldInfo:
        """This worker's place in the next world (see _assignment), told apart from its
        earlier places in the same round (a static job's init() after shutdown())."""
        info = self._assignment(after_round, commit)
        again = self._joins.get(info.round, 0)
        self._joins[info.round] = again + 1
        return dataclasses.replace(info, again=again) if again else info

    def _assignment(self, after_round, commit) -> WorldInfo:
        """This worker's place in the next world.

        A static job's worker has it in its environment. An elastic worker blocks in the
        driver's rendezvous until a round after `after_round` (None: any round) includes it;
        that GET is the barrier that tells the driver the worker is ready. The commit it
        reports is the newest it holds in memory (`commit`) or can load from --checkpoint-dir.

        The wait has no deadline of its own: waiting is never a failure. The driver ends it
        (a place, removal, or the job's end with the --min-np message after --elastic-timeout),
        and a worker that loses the driver exits on the liveness timeout (_beat).
        """
        if not self.elastic:
            return WorldInfo.from_env(self.environ)
        commit = durable.reportable(commit)
        query = {"worker": self.worker, "after": str(-1 if after_round is None else after_round),
                 "commit": str(commit), "kept": str(int(self.kept))}
        while True:  # each request is a long-poll the server answers 408 at its cap
            try:
                status, body = self.client.request("GET", "/rdzv/assign", query=query, timeout=70)
            except ConnectionError:
                if not self.grace:
                    raise
                time.sleep(BEACON_POLL)  # no driver: held until one takes over (or the grace ends: _beat)
                continue
            if status == 200:
                answer = json.loads(body)
                if not beacon.accepts(answer.get("epoch", 0), self.epoch):
                    continue  # a driver that lost its lease: ask the one that holds it
                if answer.get("removed"):
                    raise Removed()
                info = WorldInfo(**answer["world"])
                self.device_address = answer.get("device_address")
                self.interval = heartbeat_interval(info.rank)
                self.environ.update(info.env())  # scripts reading HOROVOD_RANK see the new world
                return info
            if status != 408:
                raise RuntimeError(f"hvdlite: rendezvous failed: HTTP {status} {body[:200]!r}")

    def hear(self) -> None:
        """Ask the driver now, with a heartbeat of its own, which round broke last: the
        heartbeat thread may not have run for a while (pygloo holds the GIL while it connects)."""
        beats = Heartbeats(self.client, timeout=HEARTBEAT_TIMEOUT)
        try:
            self._take(beats.beat(self.worker, self.commits, calls=entered(), waited=waited(), idle=idle()))  # no answer: what was heard stands
        finally:
            beats.close()

    def _take(self, body) -> bool:
        """Take in the driver's answer to a heartbeat; False when there was none."""
        try:
            if body is None:
                return False
            answer = json.loads(body)
            if not beacon.accepts(answer.get("epoch", 0), self.epoch):
                return False  # a driver that lost its lease decides nothing for this worker
            self.epoch = answer.get("epoch", 0)
            self.updates, self.broken = answer["updates"], max(self.broken, answer["broken"])
            self.stopping = bool(answer.get("stop"))
            asked = self.worker in answer.get("stacks", ())
        except (ValueError, KeyError, TypeError):
            return False
        if asked and not self.stack_asked:  # the driver named this rank hung (docs/troubleshooting.md#hangs)
            self.stack_asked = self.tell("stack", main_stack().encode("utf-8"), timeout=HEARTBEAT_TIMEOUT)
        if self.on_round_broken is not None:
            self.on_round_broken(self.broken)
        return True

    def _beat(self):
        last_contact, answered = time.monotonic(), True
        lost = None  # when the driver stopped answering, while it does not
        while True:
            sent = time.monotonic()
            # Between drivers a beat waits less, so that the beacon is looked at often even when
            # the old driver's host swallows datagrams (a partition, a stopped driver).
            timeout = GAP_BEAT_TIMEOUT if self.grace and not answered else HEARTBEAT_TIMEOUT
            body = self._beats.beat(self.worker, self.commits, calls=entered(), waited=waited(), idle=idle(),
                                    timeout=timeout)
            starved = time.monotonic() - sent - timeout
            if body is None and starved > STALL:  # its wait ended, then the GIL was held elsewhere
                last_contact += starved
            answered = self._take(body)
            if answered:  # else no contact this time; the liveness timeout decides
                last_contact, lost = time.monotonic(), None
            elif self.grace:
                rescue.check()  # a dead driver's pipes: the output goes on into files
                if lost is None and time.monotonic() - last_contact > self.liveness_timeout:
                    lost = last_contact
                    _say(f"lost contact with the driver at {self.addr}:{self.port}; training on without "
                         f"it for up to {self.grace:g} s (--driver-grace) until a driver takes the job over")
            newer = self._watch.newer(self.epoch) if self._watch is not None and not answered else None
            if newer is not None:  # a driver took over during this beat: go over to it, as _wait does, rather
                self._switch(*newer)  # than exit with the last write fenced out by its beacon (commit lost)
                continue
            if time.monotonic() - last_contact > max(self.liveness_timeout, self.grace):
                # The process's outcome from now on, though its main thread may end meanwhile
                # (its last steps, while the lines and writes below wait): its exit hooks exit 75 too.
                exitcode.note(exitcodes.LOST_DRIVER)
                _say(f"lost contact with the driver at {self.addr}:{self.port} for "
                     f"{max(self.liveness_timeout, self.grace):g} s; exiting").join(STALL)
                try:
                    # Rank 0's newest commit offered reaches the disk first; between drivers any
                    # worker's newest held, into its own driver generation's folder only.
                    durable.finish((lambda: (self._watch.epoch(), self.epoch)) if self._watch else None)
                    self._leave_word(exitcodes.LOST_DRIVER)
                    rescue.finish()
                finally:
                    os._exit(exitcodes.LOST_DRIVER)
            asleep, interval = time.monotonic(), self.interval
            self._wait(interval, not answered)
            overslept = time.monotonic() - asleep - interval
            if overslept > STALL:  # this process was starved, not its link: don't count it
                last_contact += overslept

    def _wait(self, interval: float, unanswered: bool):
        """Sleep until the next heartbeat; while the driver does not answer, look at the
        beacon meanwhile, and go over to a newer driver at once."""
        if self._watch is None or not unanswered:
            return time.sleep(interval)
        end = time.monotonic() + interval
        while True:
            newer = self._watch.newer(self.epoch)
            if newer is not None:
                return self._switch(*newer)
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(BEACON_POLL, left))

    def _switch(self, epoch: int, addr: str, port: int):
        """Go over to the driver holding lease `epoch` at addr:port (on the heartbeat thread;
        every KV connection reconnects there at its next request)."""
        self.epoch, self.addr, self.port = epoch, addr, port
        rescue.move()  # the new driver relays the files; the old one may hold the pipes unread (stopped)
        self.client.move(addr, port)
        self._beats.close()
        self._beats = Heartbeats(self.client, timeout=HEARTBEAT_TIMEOUT)
        _say(f"the driver at {addr}:{port} (lease {epoch}) takes this worker over")
        probed.announce(self)  # where it probes this worker's node


def _say(line: str) -> threading.Thread:
    """Write the line on a thread of its own: the heartbeat thread must go on (look at the
    beacon, end the grace) while stderr is a full pipe to a stopped driver, or a print blocked
    on it holds the stream."""
    def write():
        try:  # stderr may be a pipe to a dead driver
            sys.stderr.write(f"hvdlite: {line}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
    said = threading.Thread(target=write, daemon=True, name="hvdlite-say")
    said.start()
    return said


def loopback_by_rank(address: str, rank: int) -> str:
    """`address`, or when it is IPv4 loopback (the driver and so every peer are on this
    host) 127.0.0.1 + rank: all of 127/8 reaches this host.

    Gloo's full mesh connects to the ranks in order, and pygloo's gloo makes the pair whose
    address compares lower wait for the other to connect. With addresses that rise with the
    rank, every rank connects to the ranks below it and waits for the ones above, so no rank
    waits on one that is itself waiting; with one shared address the ports decide, at random,
    and the waits chain (a 31-rank mesh took 0.36-0.49 s instead of 0.20-0.22 s here).
    """
    parsed = ipaddress.ip_address(address)
    if parsed.version != 4 or not parsed.is_loopback or rank > (1 << 24) - 3 \
            or not sys.platform.startswith("linux"):  # elsewhere only 127.0.0.1 may be up
        return address
    return str(ipaddress.IPv4Address((127 << 24) + 1 + rank))


_TEMPLATE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "template", "")


def main_stack() -> str:
    """The main thread's Python stack as traceback prints it, read from this (another) thread:
    no debugger needed. A thread that holds the GIL for good (pygloo inside a collective) keeps
    this one from running at all; the driver says so when no stack comes."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return "(the main thread has ended)\n"
    frames = traceback.extract_stack(frame)
    # A worker forked from a template runs under the template's frames: from the user's code
    # on, its stack reads as a plain worker's.
    template = [i for i, f in enumerate(frames) if f.filename.startswith(_TEMPLATE)]
    return "".join(traceback.format_list(frames[template[-1] + 1:] if template else frames))


def heartbeat_interval(rank: int) -> float:
    """Seconds between an elastic worker's heartbeats in a world where it has `rank`."""
    return RANK0_HEARTBEAT_INTERVAL if rank == 0 else HEARTBEAT_INTERVAL


_session = None


def session() -> Session:
    """The process's one session, created on first use."""
    global _session
    if _session is None:
        _session = Session()
    return _session
