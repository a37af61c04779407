"""Workers on the nodes of a Ray cluster: one small actor per slot, pinned to its node.

Hosts are NodeIDs (hvdlite.discovery.raynodes). The actor takes one slot's resources and starts
the usual worker process (rayslot.py), so process groups, signals and exit codes are as on SSH
hosts; the driver reads the worker's output from the actor and prints it with rank prefixes.
A node's template is kept by one more actor there, which takes no resources (raytemplate.py;
when it starts and who forks from it is as on SSH hosts, hosttemplates.py). A worker that died
with its template is relaunched, not held against its node.
Ray inlines an actor's arguments in task specs that cross the network in clear, so a worker's
environment holds a one-time claim of the job's secret, not the secret (private = False;
driver/claims.py). Workers reach the rendezvous at the address Ray knows the driver's node by. Whether a worker
lives is hvdlite's heartbeats' call first: Ray notices a dead node only after seconds, a
partitioned one after a minute. A worker cut off from the driver is fenced by its incarnation,
as on SSH hosts.
"""
import os
import threading
import time

from hvdlite.discovery.raynodes import SlotShape, connect
from hvdlite.driver.launchers.base import LaunchError, StartTimedOut
from hvdlite.driver.launchers.hosttemplates import HostTemplate, HostTemplates
from hvdlite.driver.launchers.raytemplate import NodeTemplate
from hvdlite.driver.launchers.rayslot import Slot, running
from hvdlite.driver.launchers.start import StartRule, spawn_argv
from hvdlite.driver.launchers.template import READY_TIMEOUT

LOST = 255  # exit code of a worker whose actor died before its exit status arrived
READ_WAIT = 1.0  # seconds one read of a worker's output waits for lines
CALL_TIMEOUT = 10.0  # seconds an output read may take beyond its own wait
STOP_ANSWER = 2.0  # seconds a stop waits (beyond its grace) for the actor before giving the node up


class RayLauncher:
    private = False  # Ray's task specs cross the network in clear
    # Ray ends an actor whose owner (the driver) died, and the worker dies with its actor: a
    # later driver waits for them to end (decisions/adoption.py's ENDS) and never takes them over.
    ends_with_driver = True

    def __init__(self, settings, say):
        self.ray = connect(settings.ray_address)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        self._pin = NodeAffinitySchedulingStrategy
        self.command = settings.command
        self.start_timeout = settings.start_timeout
        self.shape = SlotShape(settings.cpus_per_slot, settings.gpus_per_slot, settings.slot_resource)
        self._actor = self.ray.remote(max_concurrency=4, max_restarts=0)(Slot)
        self._template_actor = self.ray.remote(max_concurrency=2, max_restarts=0)(NodeTemplate)
        self._running = self.ray.remote(num_cpus=0, max_retries=0)(running)
        self._rule = StartRule(settings)
        self._templates = HostTemplates(settings.preload, say, self._template) if settings.preload else None
        self._route = None

    def is_local(self, host) -> bool:
        return False  # every worker runs in an actor, the driver's node's too

    def route_to(self, host) -> str:
        """The address Ray knows this driver's node by: its raylet's, which every node reaches."""
        if self._route is None:
            me = self.ray.get_runtime_context().get_node_id()
            self._route = next(n["NodeManagerAddress"] for n in self.ray.nodes() if n["NodeID"] == me)
        return self._route

    def claims_from(self, host):
        """The address Ray knows the node by (its raylet's, the one Ray found it reaches the
        cluster from), or None for a node Ray no longer lists."""
        node = next((n for n in self.ray.nodes() if n["NodeID"] == host), None)
        return frozenset({node["NodeManagerAddress"]}) if node is not None else None

    def start(self, host, env: dict, output, joining: bool, local_workers: int = 1):
        template = self._templates.serving(host, self.command, env, os.getcwd(),
                                           start=self._rule.template_remotely(joining)) \
            if self._templates else None
        socket_path = template.socket if template else None
        argv = spawn_argv(self.command, socket_path, self.start_timeout) if template else self.command
        bundle = self.shape.bundle()
        actor = self._actor.options(
            scheduling_strategy=self._pin(host, soft=False), num_cpus=bundle.pop("CPU", 0),
            num_gpus=bundle.pop("GPU", 0), resources=bundle or None).remote()
        try:
            pid, how, fallback, identity = self.ray.get(actor.start.remote(
                argv, env, os.getcwd(), template.pid if template else None, self.start_timeout),
                timeout=self.start_timeout)
        except Exception as e:  # noqa: BLE001 - whatever Ray raises, the launch failed
            self.ray.kill(actor, no_restart=True)
            if isinstance(e, self.ray.exceptions.GetTimeoutError):
                raise StartTimedOut(f"cannot start a worker on Ray node {host[:12]}: no room for its "
                                    f"actor within {self.start_timeout:g} s") from None
            why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise LaunchError(f"cannot start a worker on Ray node {host[:12]}: {why}") from None
        if fallback:
            self._templates.fell_back(host, socket_path, fallback)
        return RayWorker(self, actor, host, pid, identity, output, how)

    def _template(self, host, command, env: dict, cwd: str, preload, failed):
        actor = self._template_actor.options(scheduling_strategy=self._pin(host, soft=False),
                                             num_cpus=0).remote()
        return RayTemplate(self.ray, actor, host, command, env, cwd, preload, failed)

    def left_on_purpose(self, host) -> bool:
        """Whether Ray drained the node (or it is being drained): its workers' deaths are no failure."""
        from hvdlite.discovery.raynodes import GRACEFUL, draining_nodes
        if host in draining_nodes(self.ray):
            return True
        node = next((n for n in self.ray.nodes() if n["NodeID"] == host), None)
        return node is not None and not node["Alive"] and node.get("DeathReason") in GRACEFUL

    def running(self, host, identities) -> set:
        """Which of `identities` (PID:STARTTIME, journaled by an earlier driver) still run on
        Ray node `host`, asked there by a task that takes no resources; none when the node is
        gone or gives no answer within the start timeout (a Python process starts there first)."""
        ref = self._running.options(scheduling_strategy=self._pin(host, soft=False)).remote(sorted(identities))
        try:
            return set(self.ray.get(ref, timeout=self.start_timeout))
        except Exception:  # noqa: BLE001 - the node is gone or does not answer
            return set()

    def warm(self):
        if self._templates:
            self._templates.warm()

    def close(self):
        # The slots' actors end with their workers; ray's connection ends with the process.
        if self._templates:
            self._templates.close()


class RayTemplate(HostTemplate):
    """One node's template, kept by its actor (raytemplate.py); `pid` once it is ready."""

    def __init__(self, ray, actor, host: str, command, env: dict, cwd: str, preload, failed):
        self.ray, self.actor, self.pid = ray, actor, None
        super().__init__(host[:12], command, env, cwd, preload, failed)

    def _run(self, argv, env: dict, cwd: str) -> None:
        errors = self.ray.exceptions
        try:
            header = self.ray.get(self.actor.start.remote(argv, env, cwd, READY_TIMEOUT),
                                  timeout=READY_TIMEOUT + CALL_TIMEOUT)
        except Exception:  # noqa: BLE001 - the node is gone or unreachable: its workers report it
            header = None
        if header is not None and header.get("op") != "ready":
            self._failed(header.get("reason", "template unusable"))
        if header is None or header.get("op") != "ready":
            self.close()
            self.finished = True
            return
        self.pid, self.socket = header["pid"], header["socket"]
        while not self._closed:  # until the template exits or its actor dies
            try:
                if self.ray.get(self.actor.wait.remote(READ_WAIT), timeout=READ_WAIT + CALL_TIMEOUT):
                    break
            except errors.ActorDiedError:
                break
            except (errors.ActorUnavailableError, errors.GetTimeoutError):
                time.sleep(READ_WAIT)
        self.socket, self.finished = None, True

    def close(self) -> None:
        """End the actor, and with it the template (and any worker still forked from it)."""
        self._closed = True
        self.ray.kill(self.actor, no_restart=True)


class RayWorker:
    """A worker process started by a slot's actor; the Handle of Ray launches (base.py)."""
    error = None
    drained = False  # the worker went with a node Ray drained

    def __init__(self, launcher: RayLauncher, actor, host: str, pid: int, identity, output, started: str):
        self.launcher, self.ray, self.actor, self.host = launcher, launcher.ray, actor, host
        self._pid, self.output, self.started = pid, output, started
        self.identity = identity  # PID:STARTTIME on its node: journaled (executor.identities)
        self.template_died = False  # it died with the template it was forked from
        self._code = None
        self._ended = threading.Event()
        self._unreachable = False  # the last read of its output got no answer
        self._pump = threading.Thread(target=self._read, daemon=True, name=f"ray-output-{output.label}")
        self._pump.start()

    @property
    def pid(self) -> int:
        return self._pid

    def _read(self):
        """Print the worker's output until it exits; then free its actor's resources."""
        errors = self.ray.exceptions
        while True:
            try:
                lines, code, self.template_died = self.ray.get(self.actor.read.remote(READ_WAIT),
                                                               timeout=READ_WAIT + CALL_TIMEOUT)
            except errors.ActorDiedError as e:
                self._finish(LOST, f"its Ray actor died: {_one_line(e)}")
                break
            except (errors.ActorUnavailableError, errors.GetTimeoutError):
                # The node does not answer (dead or cut off): heartbeats decide, and a stop
                # meanwhile gives the node up at once.
                self._unreachable = True
                if self._ended.wait(0.5):
                    break
                continue
            self._unreachable = False
            for stream, text in lines:
                self.output.line(stream, text)
            if code is not None:
                self._finish(code, None)
                break
        self.ray.kill(self.actor, no_restart=True)

    def _finish(self, code, error):
        if self._code is None:
            if error is not None:
                self.drained = self.launcher.left_on_purpose(self.host)
                self.error = error + (" (its node was drained)" if self.drained else "")
            self._code = code
        self._ended.set()

    def poll(self):
        return self._code

    def wait(self, timeout: float):
        self._ended.wait(timeout)
        return self._code

    def signal(self, sig) -> None:
        self.actor.signal.remote(int(sig))  # best effort: an unreachable actor drops it

    def stop(self, grace: float = 3.0) -> None:
        if self._code is None:
            code = None
            if not self._unreachable:
                try:
                    code = self.ray.get(self.actor.stop.remote(grace), timeout=grace + STOP_ANSWER)
                except Exception:  # noqa: BLE001 - the actor is unreachable or gone
                    pass
            if code is None or self.wait(grace + 5.0) is None:
                # Unreachable: end the actor (its worker dies with it, once Ray reaches the node);
                # if the worker lives on behind a partition, its incarnation is refused.
                self.ray.kill(self.actor, no_restart=True)
                self._finish(LOST if code is None else code,
                             None if code is not None else "its Ray node did not answer; actor killed")
        self.finish_output()

    def finish_output(self, timeout: float = 2.0) -> None:
        self._pump.join(timeout)


def _one_line(error) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return lines[0][:200] if lines else type(error).__name__
