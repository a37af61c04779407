"""Workers as Slurm job steps, for clusters without SSH between nodes: one
`srun --overlap -N1 -n1 -w HOST` per worker, from inside the job's allocation.

- `--overlap`: without it a second step on the node waits for the first to end.
- `-N1 -n1 -w HOST` always: after a node left the allocation, a plain srun fails on the job's
  node count.
- The environment travels in srun's own environment (`--export=ALL`, whatever the batch
  script's SLURM_EXPORT_ENV says), never on a command line. munge signs the launch message but
  does not encrypt it: the environment holds a one-time claim of the job's secret, not the
  secret (private = False; driver/claims.py).
- The task prints `JOB.STEP PID` first (as the SSH launcher's shell prints its process group):
  that is how a stop reaches it. Signals go through `scancel -s SIG JOB.STEP`: SIGTERM to srun
  itself SIGKILLs the task unseen. srun is killed only when Slurm cannot end the step (the
  node died: srun waits for Slurm to notice, SlurmdTimeout, 300 s by default).
- srun exits with the task's code, or 128+N for a task killed by signal N, and says which on
  stderr ("task 0: Killed"); that line maps the code back to -N, as for a local worker. When
  Slurm declares the node failed, srun exits 0: that is LOST here, never a finished worker.
- scancel of a step on a dead node blocks for MessageTimeout (11 s at 10): signals are sent
  without waiting for scancel, so a stop takes its grace and a second, not that.
"""
import os
import re
import signal
import socket
import subprocess
import threading
import time

from hvdlite.discovery.script import DiscoveryError
from hvdlite.discovery.slurm import node_address
from hvdlite.driver.launchers.base import LaunchError, StartTimedOut
from hvdlite.driver.network import route_address
from hvdlite.worker.gpus import VISIBLE

MARK = "__hvdlite_step"
_ANNOUNCE = f'echo "{MARK} $SLURM_JOB_ID.$SLURM_STEP_ID $$"; exec "$@"'
_TASK_END = re.compile(r"^srun: error: \S+: task 0: (.*)$")
_CANCELLED = re.compile(r"^slurmstepd\S*: error: \*\*\* STEP \S+ ON \S+ CANCELLED")
_NODE_FAILED = re.compile(r"^srun: error: Node failure on (\S+)")
LOST = 255  # the exit code of a worker whose node Slurm declared failed (as the SSH launcher's)
SCANCEL_TIMEOUT = 60.0  # seconds before a scancel still waiting on slurmctld is killed
SQUEUE_TIMEOUT = 30.0  # seconds a rerun waits for slurmctld to list the running steps
KILL_WAIT = 1.0  # seconds for srun to end after scancel -s KILL before srun itself is killed


class SrunLauncher:
    private = False  # srun's launch message is signed, not encrypted

    def __init__(self, settings, say):
        self.command = settings.command
        self.start_timeout = settings.start_timeout
        self.env = settings.env
        self._nodes = {}  # host -> Slurm's NodeAddr
        self._lock = threading.Lock()

    def is_local(self, host) -> bool:
        return False  # every worker is a step, the driver's own node's too

    def _node(self, host) -> str:
        with self._lock:
            if host not in self._nodes:
                try:
                    self._nodes[host] = node_address(host, self.env)
                except DiscoveryError as e:
                    raise LaunchError(str(e)) from None
            return self._nodes[host]

    def route_to(self, host) -> str:
        return route_address(self._node(host))

    def claims_from(self, host):
        """What Slurm's NodeAddr of `host` resolves to: its workers reach this driver at
        route_to(host), this machine's address toward that NodeAddr, so from it (None where it
        does not resolve here)."""
        try:
            found = socket.getaddrinfo(self._node(host), None, type=socket.SOCK_DGRAM)
        except OSError:
            return None
        return frozenset(info[4][0] for info in found)

    def start(self, host, env: dict, output, joining: bool, local_workers: int = 1):
        return SrunWorker(host, self.command, env, output, self.start_timeout)

    def running(self, host, identities) -> set:
        """Which of `identities` (JOB.STEP, the journal's) Slurm still lists as running steps,
        in one squeue; none when Slurm cannot be asked (a rerun then goes by --driver-grace)."""
        try:
            out = subprocess.run(["squeue", "-h", "-s", "-o", "%i"], env=self.env, stdin=subprocess.DEVNULL,
                                 capture_output=True, text=True, timeout=SQUEUE_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            return set()
        return set(identities) & set(out.stdout.split()) if out.returncode == 0 else set()

    def warm(self):
        pass  # no templates: each step starts its worker plainly

    def close(self):
        pass


class SrunWorker:
    """One worker as the single task of its own job step; the methods of base.Handle."""
    started = "srun"
    error = None

    def __init__(self, host, command, env, output, start_timeout):
        self.host, self.output = host, output
        self.step = self.task_pid = None  # "JOB.STEP" and the task's pid on its node
        self._signal = None  # the task ended by a signal, per srun's report
        self._marked = threading.Event()
        self._early = []  # srun's own lines before the task ran: why a step was refused
        argv = ["srun", "--overlap", "-N1", "-n1", "-w", host, "--quiet", "--mpi=none",
                "--export=ALL", "sh", "-c", _ANNOUNCE, "sh", *command]
        try:
            # (the step's GPUs are slurmd's to make visible, from --gpus-per-task or --gres)
            self.proc = subprocess.Popen(argv, env={k: v for k, v in env.items() if k != VISIBLE},
                                         stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         start_new_session=True)
        except FileNotFoundError:
            raise LaunchError("srun not found on PATH") from None
        self._pumps = [threading.Thread(target=self._pump, args=(name, pipe), daemon=True,
                                        name=f"srun-output-{output.label}-{name}")
                       for name, pipe in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr))]
        for t in self._pumps:
            t.start()
        self._await_start(start_timeout)

    @property
    def pid(self) -> int:
        return self.task_pid

    @property
    def identity(self):
        """The journal's name of this worker's process: its step (SrunLauncher.running)."""
        return self.step

    def _pump(self, stream, pipe):
        with pipe:
            for raw in iter(pipe.readline, b""):
                text = raw.decode("utf-8", "replace")
                if stream == "stdout" and not self._marked.is_set() and text.startswith(MARK + " "):
                    words = text.split()
                    self.step, self.task_pid = words[1], int(words[2])
                    self._marked.set()
                    continue
                if stream == "stderr":
                    if _NODE_FAILED.match(text):
                        self.error = f"Slurm declared node {self.host} failed"
                    end = _TASK_END.match(text.rstrip("\n"))
                    if end:  # the driver reports the exit itself
                        if not end.group(1).startswith("Exited with exit code"):
                            self._signal = end.group(1)
                        continue
                    if _CANCELLED.match(text):  # our own stop
                        continue
                    # Before the task's mark: srun's own reason. (Not _marked: stdout's end sets
                    # it too, and may be read before these lines.)
                    if self.step is None and text.startswith("srun: "):
                        self._early.append(text.strip())
                self.output.line(stream, text)
        if stream == "stdout":
            self._marked.set()  # srun ended before the task ran: _await_start says why

    def _await_start(self, timeout):
        if not self._marked.wait(timeout):
            self._kill_srun()
            raise StartTimedOut(f"srun step on {self.host} did not start within {timeout:g} s")
        if self.step is None:
            code = self.wait(5.0)
            for t in self._pumps:
                t.join(1.0)
            why = (self._early[-1][len("srun: "):].replace("error: ", "", 1) if self._early
                   else f"srun exited with code {code}")
            raise LaunchError(f"Slurm refused a step on {self.host}: {why}")

    def poll(self):
        code = self.proc.poll()
        if code is not None and code > 128 and self._signal is not None:
            return -(code - 128)
        if code == 0 and self.error:
            return LOST
        return code

    def wait(self, timeout: float):
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        for t in self._pumps:  # the task's last status line decides the code
            t.join(1.0)
        return self.poll()

    def signal(self, sig) -> None:
        """Through Slurm, to every process of the step (best effort, without waiting)."""
        if self.step is None or self.proc.poll() is not None:
            return
        try:
            scancel = subprocess.Popen(
                ["scancel", "--quiet", "-s", signal.Signals(sig).name[3:], self.step],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
        except OSError:
            return
        threading.Thread(target=_reap, args=(scancel,), daemon=True, name="scancel-reap").start()

    def stop(self, grace: float = 3.0) -> None:
        """scancel TERM, KILL after `grace`; srun itself is killed when the step outlives that
        (its node is gone and Slurm has not noticed yet)."""
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            if self.wait(grace) is None:
                self.signal(signal.SIGKILL)
                if self.wait(KILL_WAIT) is None:
                    self.error = f"the step on {self.host} did not end: node unreachable?"
                    self._kill_srun()
        self.finish_output()

    def _kill_srun(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            pass

    def finish_output(self, timeout: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        for t in self._pumps:
            t.join(max(0.0, deadline - time.monotonic()))


def _reap(proc):
    try:
        proc.wait(SCANCEL_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
