"""Performs the elastic core's actions: launches and stops workers, answers the rendezvous,
writes the event log. Launches run on a thread pool and report back as events, so a slow
host (SSH connect, name lookup) never holds up a decision; once a worker runs, a thread of its
own waits for it, so that the pool's threads only ever start workers."""
import errno
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from hvdlite.driver.decisions.messages import (
    DRIVER, HOST, LAUNCHER, Answer, AskRunWait, AskStack, DropScope, EndJob, Exited, Launch, Launched,
    LaunchFailed, Log, Probe, Publish, RunWait, Stop, TemplateDied)
from hvdlite import procstat
from hvdlite.driver.launchers.adopted import AdoptedWorker
from hvdlite.driver.launchers.base import StartTimedOut, TemplateGone
from hvdlite.driver.network import ANY, advertised_address
from hvdlite.driver.output import RankOutput
from hvdlite.driver.workerenv import worker_env
from hvdlite.errors import first_line
from hvdlite.worker import beacon, env as worker_vars

LAUNCH_THREADS = 32  # workers being started at once
# This process could not fork or open a pipe: the driver's trouble, whatever host it was for.
DRIVER_ERRNOS = {errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE}
OUTPUT_DRAIN = 5.0  # seconds at the job's end for the last lines of each worker to be printed
EXCEPTION_DRAIN = 0.3  # seconds for a failed worker's last lines, which say what it raised


class Executor:
    def __init__(self, settings, log, launchers, server, rendezvous, secret, post, elastic=True, *,
                 claims):
        self.settings, self.log, self.launchers = settings, log, launchers
        self.server, self.rendezvous, self.secret = server, rendezvous, secret
        self.post, self.elastic = post, elastic
        self.claims = claims  # where a launch crosses a readable network: the secret's one-time claims
        self.handles = {}  # worker -> launched handle
        self.outputs = {}  # worker -> RankOutput
        self._host_of = {}  # worker -> host it was launched on
        self.on_forget = None  # called with (worker, its last rank label) once a worker ended
        self._stop_when_started = {}  # worker -> grace: stopped while its launch was under way
        self._remote_routes = {}  # remote host -> this machine's address on the route to it
        self.prober = None  # an elastic job's driver/probe.Prober, which Probe actions go to
        self._identities = {}  # worker -> its process's identity, read once (identities)
        self.epoch = 0  # the lease this driver holds (--checkpoint-dir), told to the workers it launches
        # Warm the templates once the first world formed, if workers may join (a local one
        # started warming with the first world already).
        self._warmed = not settings.joins_possible
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(LAUNCH_THREADS, thread_name_prefix="hvdlite-launch")
        self._handlers = {Launch: self._launch, Stop: self._stop, Answer: self._answer,
                          Publish: self._publish, Log: self._log, DropScope: self._drop_scope,
                          AskStack: lambda a: self.rendezvous.ask_stack(a.worker),
                          Probe: lambda a: self.prober.probe(a.worker), AskRunWait: self._read_run_wait}

    def apply(self, actions):
        """Perform the actions; returns the EndJob among them, if any."""
        end = None
        for action in actions:
            if isinstance(action, EndJob):
                end = action
            else:
                self._handlers[type(action)](action)
        return end

    # ---- launching ----------------------------------------------------------------------
    def _launch(self, a: Launch):
        label = str(a.world.rank) if a.world is not None and not self.elastic else a.slot
        folder = None if not self.elastic else "slot." + a.slot.replace("/", ".")
        self.outputs[a.worker] = RankOutput(label, self.settings.output_dir, folder)
        self._host_of[a.worker] = a.host
        self._pool.submit(self._start, a)

    def _start(self, a: Launch):
        try:
            local = self.launchers.is_local(a.host)
            addr = advertised_address(self.server.address[0], local, lambda: self.launchers.route_to(a.host))
            if not local:
                with self._lock:
                    self._remote_routes[a.host] = addr
            env = worker_env(self.settings, (addr, self.server.address[1]), self.secret,
                             a.worker, a.slot, a.slots_on_host, a.world, self.elastic)
            if self.epoch:
                env[worker_vars.DRIVER_EPOCH] = str(self.epoch)
            if not self.launchers.private(a.host):
                env = self.claims.sealed(env, a.worker, time.monotonic(), self.launchers.claims_from(a.host))
            handle = self.launchers.launch(a.host, env, self.outputs[a.worker], a.joining, a.slots_on_host)
        except TemplateGone:  # the host answered; its template died before it forked the worker
            self._forget(a.worker)
            self.post(TemplateDied(a.worker))
            return
        except Exception as e:  # noqa: BLE001 - every launcher error fails the launch
            self._forget(a.worker)
            self.post(LaunchFailed(a.worker, _one_line(e), _whose(e)))
            return
        with self._lock:
            self.handles[a.worker] = handle
            grace = self._stop_when_started.pop(a.worker, None)
        self.post(Launched(a.worker, handle.pid, handle.started))
        threading.Thread(target=self._wait, args=(a.worker, handle, grace), daemon=True,
                         name=f"hvdlite-wait-{a.worker}").start()

    def adopt(self, worker, slot, host, pid, identity, label):
        """Take over a worker an earlier driver of the job launched (job.py): its exit, stop and
        output go through here as a launched one's do."""
        output = self.outputs[worker] = RankOutput(label, self.settings.output_dir, "slot." + slot.replace("/", "."))
        files = {stream: beacon.output_path(self.settings.checkpoint_dir, worker, stream)
                 for stream in ("stdout", "stderr")}
        word = beacon.output_path(self.settings.checkpoint_dir, worker, "exit")  # its code, said while no driver ran
        said = lambda: _said(self.rendezvous.said_code(worker), word)  # noqa: E731
        handle = AdoptedWorker(pid, identity, said, output, files) if self.launchers.is_local(host) \
            else self.launchers.for_host(host).adopt(host, pid, said, output, files, identity)  # an SSH host's
        with self._lock:
            self._host_of[worker] = host
            self.handles[worker] = handle
        threading.Thread(target=self._wait, args=(worker, handle, None), daemon=True,
                         name=f"hvdlite-wait-{worker}").start()

    def identities(self) -> dict:
        """worker -> "pid:starttime" of each running worker, as its own host tells its
        processes apart (the journal's; an SSH worker's from its launch's marker)."""
        with self._lock:
            running = [(w, h, self.launchers.is_local(self._host_of.get(w, ""))) for w, h in self.handles.items()]
        known, self._identities = self._identities, {}
        for w, handle, local in running:
            identity = known.get(w) or (procstat.identity(handle.pid) if local else getattr(handle, "identity", None))
            if identity is not None:
                self._identities[w] = identity
        return dict(self._identities)

    def _read_run_wait(self, a: AskRunWait):
        """How long a starting worker of this machine waited for a CPU (its /proc), or, while its
        launch gave no process yet, the template it waits for; None for one elsewhere: an SSH
        host's, a Ray actor's or an srun step's start is judged by the wall clock."""
        with self._lock:
            handle, host = self.handles.get(a.worker), self._host_of.get(a.worker, "")
        seconds = None
        if host and self.launchers.is_local(host):
            launcher = self.launchers.for_host(host)
            seconds = procstat.run_wait(handle.pid) if handle is not None else launcher.launch_wait()
        self.post(RunWait(a.worker, seconds))

    def _wait(self, worker, handle, grace):
        if grace is not None:
            handle.stop(grace)
        while (code := handle.wait(1.0)) is None:
            pass
        error = getattr(handle, "error", None)
        if error is None and code > 0:
            # A worker that raised: its exception's line names why (its output is read first;
            # a death by signal is not delayed).
            handle.finish_output(EXCEPTION_DRAIN)
            error = self.outputs[worker].exception
        # A local template's child (launchers/template.py), a remote one's spawn client
        # (launchers/ssh/remote.py) and a Ray slot's actor (rayslot.py) tell its death apart
        # from a kill.
        if getattr(handle, "template_died", False):
            self.post(TemplateDied(worker))
        else:
            self.post(Exited(worker, code, error, getattr(handle, "drained", False)))
        handle.finish_output(OUTPUT_DRAIN)
        self._forget(worker)

    def _forget(self, worker):
        """A worker that ended or never started: close its output files, keep nothing of it."""
        with self._lock:
            self.handles.pop(worker, None)
            self._stop_when_started.pop(worker, None)
            self._host_of.pop(worker, None)
            output = self.outputs.pop(worker, None)
        if self.prober is not None:
            self.prober.forget(worker)
        if output is not None:
            if self.on_forget is not None:
                self.on_forget(worker, output.label)
            output.close()

    def _stop(self, a: Stop):
        with self._lock:
            handle = self.handles.get(a.worker)
            if handle is None:
                if a.worker in self.outputs:  # still launching, not ended meanwhile
                    self._stop_when_started[a.worker] = a.grace
                return
        threading.Thread(target=handle.stop, args=(a.grace,), daemon=True,
                         name=f"hvdlite-stop-{a.worker}").start()

    def stop_all(self):
        """Stop every worker still running, in parallel, and flush their output."""
        with self._lock:
            handles = list(self.handles.values())
            self._stop_when_started = {w: 0.0 for w in self.outputs if w not in self.handles}
        running = [h for h in handles if h.poll() is None]
        threads = [threading.Thread(target=h.stop, daemon=True) for h in running]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        for h in handles:  # the processes ended: their pipes close, what is left is lines
            h.finish_output(OUTPUT_DRAIN)
        self._pool.shutdown(wait=False)

    # ---- the rest -----------------------------------------------------------------------
    def _answer(self, a: Answer):
        if "world" in a.body and not self._warmed:
            self._warmed = True
            self.launchers.warm()
        if a.rank is not None and a.worker in self.outputs:
            self.outputs[a.worker].label = str(a.rank)
        self.rendezvous.answer(a.worker, a.status, self._with_device_address(a))

    def _with_device_address(self, a: Answer) -> dict:
        """A local worker told the loopback address must still bind gloo where the world's
        remote members reach it: on this machine's address on the route to one of them."""
        if self.server.address[0] != ANY:
            return a.body
        with self._lock:
            if self._host_of.get(a.worker) in self._remote_routes:
                return a.body  # a remote worker: the common case at thousands, with no walk of the hosts
            route = next((self._remote_routes[h] for h in a.body.get("hosts", ()) if h in self._remote_routes), None)
        return a.body if route is None else {**a.body, "device_address": route}

    def _publish(self, a: Publish):
        self.rendezvous.publish(a.updates, a.broken, a.stop)

    def _log(self, a: Log):
        self.log.emit(a.event, **a.fields)

    def _drop_scope(self, a: DropScope):
        self.server.delete_scope(a.scope)


def _said(told, path):
    """The exit code a taken-over worker told this driver, or left in its file, or None."""
    if told is not None:
        return told
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _whose(error: Exception) -> str:
    """Whose trouble a failed launch was (decisions/hostrule.py blames the host's only)."""
    if isinstance(error, OSError) and error.errno in DRIVER_ERRNOS:
        return DRIVER
    return LAUNCHER if isinstance(error, StartTimedOut) else HOST


def _one_line(error: Exception) -> str:
    # An OSError's message alone ("[Errno 113] No route to host") does not say what failed.
    return f"{type(error).__name__}: {first_line(error)}" if isinstance(error, OSError) else first_line(error)
