"""Hangs: a rank its peers wait on that makes no progress (docs/troubleshooting.md#hangs).

Every worker's heartbeat carries how many collectives it entered in its current world
(worker/runtime.py: every rank makes as many calls per collective). A rank whose count stays
below another member's is one its peers wait on: they entered a collective it has not (it is
stuck in its own code, or skipped one). It is named hung once no member's count moved for the
hang timeout: a world that still makes progress anywhere (a process set of some ranks only)
is not hung, nor a world whose ranks all sit at one count (all in their own code, or all in
one collective: gloo's timeout is for that).

pygloo holds a numpy worker's GIL inside a collective: its own beats fall silent (their count
goes stale) while its stand-in process beats for it (worker/vouch.py). Such a member is known
to wait in a collective: it is never named, and a member still beating (so in its own code)
that made no progress beside it is one it waits on.

The timeout, unless --hang-timeout fixes it, follows the job: the floor (HANG_FLOOR scaled by
--timeout-scale), or FACTOR times the longest stall the world already got past, whichever is
longer. An evaluation on rank 0 alone that took 20 s once makes the next one wait 60 s.
Pure: the time is passed in.
"""

FACTOR = 3.0  # the derived timeout: this many times the longest stall the world got past
STACK_WAIT = 2.0  # seconds the driver waits for a hung rank's stack before it acts without
FRESH = 1.5  # seconds: a worker's own beats older than this are silent (3 heartbeat intervals)


class Progress:
    """The members' collective counts as their heartbeats tell them, for one world at a time."""

    def __init__(self):
        self.calls = {}  # worker -> its last count
        self.seen = {}  # worker -> when its own beat last came
        self.vouched_at = {}  # worker -> when its stand-in last beat for it
        self.moved_at = None  # when any count last changed (None: none heard in this world)
        self.longest = 0.0  # the longest stall, any world, that ended with a count moving

    def new_world(self, now: float) -> None:
        """Counts start again at 0 in a new world; the stalls seen stay."""
        self.calls, self.moved_at, self.seen, self.vouched_at = {}, now, {}, {}

    def heard(self, worker: str, calls: int, now: float) -> None:
        self.seen[worker] = now
        if self.calls.get(worker) == calls:
            return
        self.calls[worker] = calls
        if self.moved_at is not None:
            self.longest = max(self.longest, now - self.moved_at)
        self.moved_at = now

    def vouched(self, worker: str, now: float) -> None:
        self.vouched_at[worker] = now

    def timeout(self, given, floor: float) -> float:
        """--hang-timeout when given, else derived from the stalls seen (module doc)."""
        return given if given is not None else max(floor, FACTOR * self.longest)

    def hung(self, members, now: float, timeout: float) -> list:
        """[(worker, its count, the count a peer waits in)] of the members its peers wait on,
        once no member's count moved for `timeout`; [] otherwise."""
        counts = {w: self.calls[w] for w in members if w in self.calls}
        if len(counts) < 2 or self.moved_at is None or now - self.moved_at < timeout:
            return []
        fresh = {w for w in counts if now - self.seen[w] <= FRESH}
        held = any(w not in fresh and now - self.vouched_at.get(w, -FRESH - 1) <= FRESH for w in counts)
        top = max(counts.values())
        return [(w, c, max(top, c + 1)) for w, c in sorted(counts.items())
                if w in fresh and (c < top or held)]

    def reason(self, calls: int, top: int, now: float, timeout: float) -> str:
        """Why a rank hung() named is hung, for its one line."""
        return (f"it entered {calls} collectives in this world while a peer waits in collective {top}, "
                f"and no rank moved for {now - self.moved_at:.1f} s (hang timeout {timeout:g} s)")


# What the hung line says when no stack came within STACK_WAIT.
NO_STACK = ("its heartbeat thread did not answer: the process holds its GIL (native code, or "
            "pygloo inside a collective); `py-spy dump --pid PID` on its host reads it")
EXITED = "it has exited"
