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
longer. An evaluation on rank 0 alone that took 20 s once makes the next one wait 60 s. It
never reaches the ceiling, ROOM seconds below the collective timeout (--gloo-timeout-seconds):
the hung rank is named, its stack taken and it is killed before its peers' collective gives
up, which would blame them.

A rank that has not yet kept pace with its peers in this world (never seen catching up with a
peer it was behind) is in its first step, whose length nothing in the job predicts (loading,
compiling, a first evaluation): it gets the ceiling, as long as gloo or Horovod would have
waited for it, unless --hang-timeout is given. Pure: the time is passed in.
"""

FACTOR = 3.0  # the derived timeout: this many times the longest stall the world got past
STACK_WAIT = 2.0  # seconds the driver waits for a hung rank's stack before it acts without
# Seconds between the hang timeout's ceiling and the collective timeout: the stack's wait, a
# heartbeat late on each side, and the kill reaching the peers.
ROOM = STACK_WAIT + 2.0
FRESH = 1.5  # seconds: a worker's own beats older than this are silent (3 heartbeat intervals)


class Progress:
    """The members' collective counts as their heartbeats tell them, for one world at a time."""

    def __init__(self):
        self.calls = {}  # worker -> its last count
        self.seen = {}  # worker -> when its own beat last came
        self.vouched_at = {}  # worker -> when its stand-in last beat for it
        self.moved_at = None  # when any count last changed (None: none heard in this world)
        self.longest = 0.0  # the longest stall, any world, that ended with a count moving
        self.behind = set()  # members seen behind a peer in this world
        self.kept_pace = set()  # ... and seen caught up since: past their first step

    def new_world(self, now: float) -> None:
        """Counts start again at 0 in a new world; the stalls seen stay."""
        self.calls, self.moved_at, self.seen, self.vouched_at = {}, now, {}, {}
        self.behind, self.kept_pace = set(), set()

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

    def timeout(self, given, floor: float, top: float) -> float:
        """--hang-timeout when given, else derived from the stalls seen, below `top` (ceiling())."""
        return given if given is not None else min(top, max(floor, FACTOR * self.longest))

    def hung(self, members, now: float, timeout: float, first_step=None) -> list:
        """[(worker, its count, the count a peer waits in, the timeout it was judged by)] of the
        members its peers wait on, once no member's count moved for `timeout` (`first_step`,
        longer, for a member still in its first step); [] otherwise."""
        counts = {w: self.calls[w] for w in members if w in self.calls}
        if len(counts) < 2 or self.moved_at is None:
            return []
        top = max(counts.values())
        for w, c in counts.items():  # (judged at every tick: what the beats show of the pace)
            if c < top:
                self.behind.add(w)
            elif w in self.behind:
                self.kept_pace.add(w)
        if now - self.moved_at < timeout:
            return []
        fresh = {w for w in counts if now - self.seen[w] <= FRESH}
        held = any(w not in fresh and now - self.vouched_at.get(w, -FRESH - 1) <= FRESH for w in counts)
        named = []
        for w, c in sorted(counts.items()):
            limit = timeout if first_step is None or w in self.kept_pace else max(timeout, first_step)
            if w in fresh and (c < top or held) and now - self.moved_at >= limit:
                named.append((w, c, max(top, c + 1), limit))
        return named

    def reason(self, calls: int, top: int, timeout: float, now: float) -> str:
        """Why a rank hung() named is hung, for its one line."""
        return (f"it entered {calls} collectives in this world while a peer waits in collective {top}, "
                f"and no rank moved for {now - self.moved_at:.1f} s (hang timeout {timeout:g} s)")


def ceiling(collective_timeout: float) -> float:
    """The longest the hang timeout may be when not given: ROOM below the collective timeout
    (half of it, were that shorter)."""
    return max(collective_timeout - ROOM, collective_timeout / 2)


# What the hung line says when no stack came within STACK_WAIT.
NO_STACK = ("its heartbeat thread did not answer: the process holds its GIL (native code, or "
            "pygloo inside a collective); `py-spy dump --pid PID` on its host reads it")
EXITED = "it has exited"
