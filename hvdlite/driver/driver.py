"""The driver: serves the rendezvous, launches workers, watches them and ends the job."""
import json
import os
import queue
import secrets
import signal
import threading
import time

from hvdlite.driver.assignment import assign
from hvdlite.driver.events import EventLog
from hvdlite.driver.kvserver import KVServer
from hvdlite.driver.local import LocalWorker
from hvdlite.driver.network import NetworkError, rendezvous_address
from hvdlite.driver.ssh import SSHError, SSHHost, SSHSettings, host_config, is_local
from hvdlite.driver.output import RankOutput
from hvdlite.driver.workerenv import forwarded, worker_env

EXIT_SIGNALLED = {signal.SIGINT: 130, signal.SIGTERM: 143}
STALL = 1.0  # seconds between liveness checks that mean the driver itself was not running
EXIT_GRACE = 30.0  # seconds a worker that said it is exiting may take before it is killed


class JobError(Exception):
    """Ends the job with exit code 1 and this one-line message."""


class Worker:
    """A launched worker process and what the driver knows of it."""

    def __init__(self, key, hostname, handle, output, rank):
        self.key, self.hostname, self.handle, self.output, self.rank = \
            key, hostname, handle, output, rank
        self.started = time.monotonic()
        self.last_heartbeat = None  # monotonic time; None until the first one arrives
        self.exit_code = None
        self.stopping = False
        self.exiting_since = None  # monotonic time the worker said it is exiting

    @property
    def name(self) -> str:
        """How messages name the worker: its rank, or its slot before it has one."""
        return f"rank {self.rank}" if self.rank >= 0 else f"worker {self.key}"

    def set_rank(self, rank: int) -> None:
        self.rank = rank
        self.output.label = str(rank)


class Driver:
    def __init__(self, settings, log: EventLog):
        self.settings = settings
        self.log = log
        self.secret = secrets.token_urlsafe(32)
        self.events = queue.Queue()
        self.workers = {}  # slot key -> Worker
        self.ssh_hosts = {}  # hostname -> SSHHost, one connection per remote host
        self.lock = threading.Lock()  # guards heartbeats written by server threads
        self.updates = 0  # host updates announced to workers (elastic)
        self.broken = 0  # newest round seen to fall apart; its workers cut their connections
        self._beat_answer = (None, b"")  # ((updates, broken), its JSON)
        self.assign_handler = None  # elastic rendezvous: query -> (status, body) or a Future of it
        self.last_liveness_check = time.monotonic()
        self.server = None
        self.ssh_settings = SSHSettings(
            port=settings.ssh_port, identity_file=settings.ssh_identity_file,
            accept_unknown_hosts=settings.ssh_accept_unknown_hosts,
            **({"ssh_config": settings.ssh_config} if settings.ssh_config else {}))

    # ---- edges: server, launch, watch ------------------------------------------------
    def start_server(self, hostnames):
        remote = [host_config(h, self.ssh_settings).address for h in hostnames if not self.is_local(h)]
        addr = rendezvous_address(self.settings.bind_address, self.settings.network_interface, remote)
        self.server = KVServer(self.secret, bind=addr)
        self.server.add_route("/rdzv/", self.route)
        self.server.set_heartbeat(self.heartbeat)
        self.server.start()
        self.log.debug(f"rendezvous server at {self.server.address[0]}:{self.server.address[1]}")

    def launch(self, key: str, hostname: str, rank: int, workers_on_host: int, extra_env: dict) -> Worker:
        wenv = {**worker_env(forwarded(self.settings.env), self.server.address, self.secret,
                             self.settings, key, workers_on_host), **extra_env}
        # An elastic worker has no rank until its first world forms: label it by slot.
        output = RankOutput(str(rank), self.settings.output_dir) if rank >= 0 else \
            RankOutput(key, self.settings.output_dir, "slot." + key.replace("/", "."))
        handle = LocalWorker(self.settings.command, wenv, output) if self.is_local(hostname) \
            else self._remote_host(hostname).launch(self.settings.command, wenv, os.getcwd(), output)
        worker = Worker(key, hostname, handle, output, rank)
        self.workers[key] = worker
        self.log.emit("worker_start", slot=key, **({"rank": rank} if rank >= 0 else {}), pid=handle.pid)
        threading.Thread(target=self._watch, args=(worker,), daemon=True, name=f"watch-{key}").start()
        return worker

    def is_local(self, hostname) -> bool:
        return is_local(hostname, self.ssh_settings.ssh_config)

    def _remote_host(self, hostname):
        if hostname not in self.ssh_hosts:
            self.ssh_hosts[hostname] = SSHHost(hostname, self.ssh_settings)
        return self.ssh_hosts[hostname]

    def _watch(self, worker: Worker):
        while (code := worker.handle.wait(1.0)) is None:
            pass
        self.events.put(("exit", worker.key, code))

    def heartbeat(self, query) -> bytes:
        """A worker is alive (a heartbeat datagram, on the server's thread): the answer tells it
        the host updates and the newest broken round."""
        worker = self.workers.get(query.get("slot"))
        if worker is not None:
            with self.lock:
                worker.last_heartbeat = time.monotonic()
        state = (self.updates, self.broken)
        if self._beat_answer[0] != state:  # thousands of beats a second share one answer
            self._beat_answer = (state, json.dumps({"updates": state[0], "broken": state[1]}).encode())
        return self._beat_answer[1]

    def route(self, method, subpath, query, body):
        if subpath == "exiting" and method == "PUT":
            worker = self.workers.get(query.get("slot"))
            if worker is not None:
                with self.lock:
                    worker.exiting_since = time.monotonic()
            return 200, b""
        if subpath == "assign" and method == "GET" and self.assign_handler:
            return self.assign_handler(query)
        return 404, b"unknown rendezvous endpoint"

    def unresponsive(self, now):
        """Running workers that heartbeated once but not within the liveness timeout."""
        limit = self.settings.liveness_timeout
        gap, self.last_liveness_check = now - self.last_liveness_check, now
        with self.lock:
            if gap > STALL:  # the driver itself was starved: that silence is not the workers'
                for w in self.workers.values():
                    if w.last_heartbeat is not None:
                        w.last_heartbeat += gap
            return [w.key for w in self.workers.values()
                    if not w.stopping and w.exit_code is None and w.last_heartbeat is not None
                    and (now - w.exiting_since > EXIT_GRACE if w.exiting_since is not None
                         else now - w.last_heartbeat > limit)]

    def stop_worker(self, key, grace=3.0):
        """Stop one worker in the background; its exit arrives as an event."""
        worker = self.workers[key]
        if not worker.stopping:
            worker.stopping = True
            threading.Thread(target=worker.handle.stop, args=(grace,), daemon=True).start()

    def stop_all(self):
        running = [w for w in self.workers.values() if w.handle.poll() is None]
        threads = [threading.Thread(target=w.handle.stop, daemon=True) for w in running]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        for w in self.workers.values():
            w.handle.finish_output()

    def close(self):
        self.stop_all()
        for host in self.ssh_hosts.values():
            host.close()
        if self.server:
            self.server.stop()

    def next_event(self, timeout=0.1):
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    # ---- static job ---------------------------------------------------------------
    def run_static(self) -> int:
        s = self.settings
        slots = assign(s.hosts, s.num_proc)
        self.start_server([h for h, _ in s.hosts])
        for slot in slots:
            self.launch(f"{slot.hostname}/{slot.local_rank}", slot.hostname, slot.rank,
                        slot.local_size, slot.env())
        remaining = set(self.workers)
        while remaining:
            event = self.next_event()
            if event is None:
                continue
            kind, key, code = event
            worker = self.workers[key]
            worker.exit_code = code
            remaining.discard(key)
            self.log.emit("worker_exit", slot=key, rank=worker.rank, code=code)
            if code != 0:
                raise JobError(f"{worker.name} on {worker.hostname} {describe_exit(code)}; "
                               f"stopping the job")
        self.log.emit("job_end", result="success")
        return 0


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class _Signalled(Exception):
    def __init__(self, signum):
        self.signum = signum


def run(settings) -> int:
    # --log-level WARNING and above silences the event lines; DEBUG adds the driver's details.
    level = settings.log_level
    log = EventLog(settings.event_log, on_console=settings.elastic and level in ("DEBUG", "INFO"),
                   verbose=settings.verbose or level == "DEBUG")
    driver = Driver(settings, log)

    def on_signal(signum, frame):
        raise _Signalled(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in EXIT_SIGNALLED}
    try:
        if settings.elastic:
            from hvdlite.driver.elastic import ElasticJob
            return ElasticJob(driver, settings).run()
        return driver.run_static()
    except _Signalled as e:
        log.emit("job_end", result="interrupted", signal=signal.Signals(e.signum).name)
        return EXIT_SIGNALLED[e.signum]
    except (JobError, NetworkError, SSHError) as e:
        log.emit("job_end", result="failure", reason=str(e))
        log.error(str(e))
        return 1
    finally:
        for sig in EXIT_SIGNALLED:
            signal.signal(sig, signal.SIG_IGN)
        driver.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log.close()
