"""What the elastic core knows of each launched worker, and when it gives up on one."""
import enum
import signal
from dataclasses import dataclass
from typing import Optional

from hvdlite.driver.decisions.policy import Policy

# A start is judged by the time its process could run: the seconds it waited for a CPU are not
# charged to it (a burst of process starts, a CFS quota starve a healthy worker). However starved,
# it is named once this many --start-timeout passed on the wall clock: every wait ends.
STARVED_CEILING = 10
READ_RUN_WAIT = "read_run_wait"  # overdue()'s answer: the start rule needs a fresh reading first


class Phase(enum.Enum):
    STARTING = "starting"  # launch asked for or process running; not waiting for a world yet
    WAITING = "waiting"  # in the rendezvous, for a world formed after round `after`
    TRAINING = "training"  # answered with a world and working in it
    LEAVING = "leaving"  # told to go without failing (removed from the job)
    GONE = "gone"  # exited, or never started


@dataclass
class Incarnation:
    """One launch of a slot."""
    id: str
    slot: str
    host: str
    launched_at: float
    phase: Phase = Phase.STARTING
    pid: Optional[int] = None
    after: int = -1  # while WAITING: the round it left
    commit: int = 0  # commits its training state holds, as last reported
    heard_at: Optional[float] = None  # last heartbeat, its own or its stand-in's
    own_at: Optional[float] = None  # last heartbeat of its own
    vouched: Optional[tuple] = None  # (when, round) of the last beat its stand-in sent for it
    exiting_since: Optional[float] = None
    killed: Optional[str] = None  # why the driver killed it as failed
    answer: Optional[tuple] = None  # (round, body) of its last rendezvous answer
    rank: Optional[int] = None
    left_behind: Optional[float] = None  # when the world it was left behind in broke
    overdue: bool = False  # its launch gave no process within --start-timeout: removed, yet
    # a refusal of its host that ends that launch later still counts as the host's
    leaving_since: Optional[float] = None  # when it said it got SIGTERM (it leaves once its commit is safe)
    # Its node's probes (nodeloss.py): when the last began, whether it is in flight, when a
    # survivor's link to it broke, when a probe found its process gone.
    probed_at: Optional[float] = None
    probing: bool = False
    link_broken_at: Optional[float] = None
    refused_at: Optional[float] = None
    # Seconds its process waited for a CPU while it could run, as last read (RunWait), when
    # (the start rule names a worker only on a reading taken that moment), and whether a
    # reading was asked for and has not come yet.
    starved: float = 0.0
    starved_read_at: Optional[float] = None
    reading: bool = False

    @property
    def alive(self) -> bool:
        return self.phase is not Phase.GONE

    def postpone(self, gap: float) -> None:
        """The driver did not run for `gap` seconds: what it saw of the worker moves with it."""
        for field in ("heard_at", "own_at", "left_behind", "probed_at", "link_broken_at", "refused_at"):
            if getattr(self, field) is not None:
                setattr(self, field, getattr(self, field) + gap)
        self.vouched = None if self.vouched is None else (self.vouched[0] + gap, self.vouched[1])
        self.launched_at += gap

    @property
    def name(self) -> str:
        """How messages name the worker: its rank, or its slot before it has one."""
        return f"rank {self.rank}" if self.rank is not None else f"worker {self.slot}"


def _limits(inc: Incarnation, p: Policy, broke_at: Optional[float], now: Optional[float] = None):
    """(since, limit, event, reason) of each rule that ends the live worker once more than
    `limit` seconds passed since `since`, the first to apply first; a reason's {:g} is the limit.
    The start and launch rules' event is READ_RUN_WAIT unless its CPU wait was read at `now`."""
    if inc.phase is Phase.STARTING and inc.pid is None:  # its launch never started it
        # A local launch may wait for its template's imports: the seconds that template waited
        # for a CPU do not count (RunWait), as for a start below.
        return ((inc.launched_at, p.start_timeout * STARVED_CEILING, "launch_overdue", None),
                (inc.launched_at + inc.starved, p.start_timeout,
                 "launch_overdue" if inc.starved_read_at == now else READ_RUN_WAIT, None))
    if inc.killed is not None or inc.pid is None:
        return ()
    if inc.exiting_since is not None:
        return ((inc.exiting_since, p.exit_grace, "worker_unresponsive", "still exiting after {:g} s"),)
    rules = []
    if inc.heard_at is not None:
        rules.append((inc.heard_at, p.liveness_timeout, "worker_unresponsive", "no heartbeat for {:g} s"))
    if inc.phase is Phase.STARTING and inc.answer is None:
        rules.append((inc.launched_at, p.start_timeout * STARVED_CEILING, "worker_start_timeout",
                      "not ready within {:g} s, most of them waiting for a CPU"))
        besides = f", besides {inc.starved:.1f} s waiting for a CPU" if inc.starved >= 0.05 else ""
        rules.append((inc.launched_at + inc.starved, p.start_timeout,
                      "worker_start_timeout" if inc.starved_read_at == now else READ_RUN_WAIT,
                      "not ready within {:g} s" + besides))
    if inc.phase is Phase.STARTING and inc.answer is not None:
        # Taken over (adoption.adopt) from a driver that had answered it: it asks this one as
        # it goes over to it, else it is stuck (a world does not form from less while it may
        # hold the newer commit: forming.py).
        rules.append((inc.launched_at, p.elastic_timeout, "worker_unresponsive",
                      "did not ask the driver that took the job over within --elastic-timeout {:g} s"))
    if broke_at is not None:
        rules.append((broke_at, p.elastic_timeout, "worker_stuck",
                      "still in a world that broke over --elastic-timeout {:g} s ago"))
    return rules


def overdue(inc: Incarnation, now: float, p: Policy, broke_at: Optional[float]):
    """(event, reason) when the driver must end the live worker now, else None: "launch_overdue"
    (reason None) for a launch that gave no process within --start-timeout, READ_RUN_WAIT
    (reason None) for a launch or start past --start-timeout by a reading of its CPU wait
    older than `now`, else a kill as failed. `broke_at`: when the world it is still in broke (None: it is
    in no broken world)."""
    for since, limit, event, reason in _limits(inc, p, broke_at, now):
        if now - since > limit:
            return event, None if event == READ_RUN_WAIT else reason and reason.format(limit)
    return None


def overdue_from(inc: Incarnation, p: Policy, broke_at: Optional[float]) -> Optional[float]:
    """The earliest time overdue() can name the worker while it stays as it is (None: never)."""
    return min((since + limit for since, limit, _, _ in _limits(inc, p, broke_at)), default=None)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def cannot_load(name: str, host: str, reason: str) -> str:
    """The one line that ends a job whose worker cannot load the checkpoint it found; reason is
    the worker's "PATH: CAUSE"."""
    return (f"{name} on {host} cannot load checkpoint {reason}. Nothing was deleted. Fix the script "
            f"so that it loads, or start anew on purpose with --fresh")
