"""What the elastic core hears (events) and what it asks the executor to do (actions).

Workers are named by incarnation id, "host/index#generation": every launch of a slot is a
new incarnation, so whatever an earlier process of the slot still says changes nothing.
"""
from dataclasses import dataclass, field
from typing import Optional

from hvdlite.worker.world import WorldInfo

# Whose trouble a failure was (decisions/hostrule.py blames only the host's):
HOST = "host"  # the host refused or could not be reached, or its worker failed
DRIVER = "driver"  # the driver could not fork (EAGAIN, ENOMEM, EMFILE) or workers lost it
LAUNCHER = "launcher"  # a start that timed out: Ray found no room in time, a slow srun step


# ---- events -----------------------------------------------------------------------------
@dataclass(frozen=True)
class HostsFound:
    hosts: tuple  # ((name, slots), ...) in the order discovery listed them
    # Hosts the source knows left, and how (a cluster manager says; a script cannot):
    drained: tuple = ()  # taken away on purpose (a graceful drain): their workers' exits are no failure
    failed: tuple = ()  # died: their workers count as failed, even before their own exits say so


@dataclass(frozen=True)
class DiscoveryFailed:
    error: str


@dataclass(frozen=True)
class Launched:
    worker: str
    pid: int
    started: str = "process"  # how: "process", "template" (forked, preloaded) or "ssh"


@dataclass(frozen=True)
class LaunchFailed:
    worker: str
    error: str
    whose: str = HOST  # HOST, DRIVER or LAUNCHER


@dataclass(frozen=True)
class RunWait:
    """Seconds the starting worker's process waited for a CPU while it could run (its threads'
    run-queue wait: a starved machine, a CFS quota), read when the core asked (AskRunWait);
    None where the driver cannot read it (another host, a process gone)."""
    worker: str
    seconds: Optional[float]


@dataclass(frozen=True)
class Ready:
    """The worker waits in the rendezvous for a world formed after round `after`
    (-1: any), holding `commit` commits of training state."""
    worker: str
    after: int
    commit: int
    # Whether it went back to its last commit (a failure) rather than left its world at a
    # commit with its live state (a host update, a leaver, a hand-over): nobody rolls back then.
    rolled_back: bool = True


@dataclass(frozen=True)
class Leaving:
    """The worker got SIGTERM while it holds training state: it leaves at its next commit, or
    now if it waits for a world, but only once its commit is safe (docs/signals.md)."""
    worker: str


@dataclass(frozen=True)
class Written:
    """Rank 0's checkpoint writer renamed `commit` into --checkpoint-dir. Whoever wrote it,
    the file is there: not fenced by incarnation (`writer` is not `worker`)."""
    commit: int
    writer: str = ""


@dataclass(frozen=True)
class Heartbeats:
    beats: tuple  # ((worker, commits it holds), ...) heard since the last batch
    # ((worker, round), ...): beats a numpy worker's stand-in process (worker/vouch.py) sent for
    # it, which go on while pygloo holds the worker's GIL and silences its own; `round`: the
    # round of the group the worker is in or connecting, as the stand-in knows it (0: none).
    vouched: tuple = ()
    calls: tuple = ()  # ((worker, collectives it entered in its world), ...) of its own beats (hangs.py)
    waited: tuple = ()  # ((worker, seconds it waited in them), ...) (stragglers.py)
    idle: tuple = ()  # (worker, ...) whose beat said it waits in hvd.join() (stragglers.py)


@dataclass(frozen=True)
class StackDump:
    """The Python stack of the worker's main thread, which its heartbeat thread read when the
    driver asked (AskStack)."""
    worker: str
    stack: str


@dataclass(frozen=True)
class Exiting:
    """The worker said it is exiting: interpreter teardown may silence its heartbeat."""
    worker: str
    commit: int = 0  # commits its training state holds
    calls: Optional[int] = None  # collectives it entered in its last world, its last word (hangs.py)
    echo: bool = False  # a HorovodInternalError ended it: it echoes a peer's failure (cause.py)


@dataclass(frozen=True)
class Exited:
    worker: str
    code: int  # exit status, minus the signal number for a signal death
    error: Optional[str] = None  # why, when the launcher knows more (a lost SSH connection)
    drained: bool = False  # the launcher knows its host was drained on purpose: no failure


@dataclass(frozen=True)
class TemplateDied:
    """The template the worker was forked from died, and took the worker with it (the
    parent-death signal), or died before it forked the worker (no Launched came): neither the
    worker nor its host did anything wrong."""
    worker: str


@dataclass(frozen=True)
class LoadFailed:
    """The worker cannot load the commit it reported (a damaged file, a class the script no
    longer defines, a changed shape); `reason` names the file and the cause, in one line."""
    worker: str
    reason: str


@dataclass(frozen=True)
class WriteFailed:
    """Rank 0 could not write a checkpoint to --checkpoint-dir (a class the script did not
    trust, a full disk, no permission); `reason` says which commit, where and why, in one line."""
    worker: str
    reason: str


@dataclass(frozen=True)
class StopRequested:
    """A signal asked the job to stop gracefully: every worker leaves at its next commit."""
    signum: int


@dataclass(frozen=True)
class Tick:
    """Time passed: timeouts, cooldowns and liveness are due for a check."""


@dataclass(frozen=True)
class LeaseDoubt:
    """The driver's lease renewal failed (`doubt`: the store did not answer, so the driver may
    be cut off from everything) or went through again (not `doubt`)."""
    doubt: bool


# ---- actions ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    worker: str
    slot: str
    host: str
    slots_on_host: int
    world: Optional[WorldInfo]  # the place Horovod would announce at launch; None beyond max-np
    joining: bool = False  # the job runs already: a join or a replacement, not the first world


@dataclass(frozen=True)
class Stop:
    worker: str
    grace: float  # seconds between TERM and KILL


@dataclass(frozen=True)
class Answer:
    """Answer the worker's rendezvous request (now, or its next one)."""
    worker: str
    status: int
    body: dict
    rank: Optional[int] = None  # its rank in the world the answer gives, for output labels


@dataclass(frozen=True)
class Publish:
    """What heartbeat answers tell workers: host updates announced, newest broken round, and
    whether the job is stopping (every worker leaves at its next commit)."""
    updates: int
    broken: int
    stop: bool = False


@dataclass(frozen=True)
class AskStack:
    """Ask the worker, in its heartbeat answers, for its main thread's stack (a StackDump)."""
    worker: str


@dataclass(frozen=True)
class AskRunWait:
    """Read how long the starting worker waited for a CPU, answer with RunWait."""
    worker: str


@dataclass(frozen=True)
class Log:
    event: str
    fields: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DropScope:
    """A world everyone left: its gloo bootstrap keys are garbage, and so are its process
    sets' (scopes under it)."""
    scope: str


@dataclass(frozen=True)
class EndJob:
    code: int
    error: Optional[str] = None


# ---- a silent worker's node (nodeloss.py) -------------------------------------------------
# What a probe of a worker's listening socket found (driver/probe.py):
LISTENING = "listening"  # the kernel took the connection: the process is there, maybe stopped
REFUSED = "refused"  # the node answered, the socket is closed: the process is gone
SILENT = "silent"  # nothing answered within the probe timeout: the node is gone or cut off
UNPROBED = "unprobed"  # no socket of the worker's was ever reachable from the driver: no word


@dataclass(frozen=True)
class LinkBroken:
    """A collective of `worker` failed on its connections to `peers` (the workers at the
    address those connections led to)."""
    worker: str
    peers: tuple


@dataclass(frozen=True)
class Probed:
    worker: str  # the worker whose node was probed
    outcome: str  # LISTENING, REFUSED, SILENT or UNPROBED


@dataclass(frozen=True)
class Probe:
    """Probe the node of the worker: connect to the socket it listens on, answer with Probed."""
    worker: str
