"""Stragglers: a rank whose own work takes `--straggler-factor` times the others' (docs/watching.md#stragglers).

Collectives line the ranks up, so a step takes as long by the clock on every rank: the one the
others wait for is the rank whose *own* work is long. A rank's step time here is its own work
per collective: the seconds it did not spend waiting in a collective, over the collectives it
entered. Every heartbeat carries both counts (worker/runtime.py); each WINDOW seconds the driver
takes every member's figure over the window, and names a rank whose figure is at least
`factor` times the median of the others' (and MIN_GAP longer), once, and once more when it
recovers. Nobody is measured until every member has entered a collective: before that a rank's
time is its start-up, or waiting for a slower peer's start-up outside any timed collective (a
torchrun script's init_process_group and DDP's constructor), which would read as its own work
and name the rank that started first. A window in which a rank entered no collective (an
evaluation on rank 0 alone) says nothing about it, nor one in which it was heard idle in hvd.join(): its data ran out, its own
work is nil while the others step, so it is neither named nor the others' baseline. Pure: the
time is passed in.
"""
import statistics

WINDOW = 5.0  # seconds over which a rank's step time is taken
MIN_GAP = 0.01  # seconds a straggler's step is longer than the median at least: not noise
PERSIST = 3  # windows in a row a straggler stays one before --straggler-policy evict takes it out


class Stragglers:
    """The members' step times, and which of them straggle, for one world at a time."""

    def __init__(self, factor: float):
        self.factor = factor
        self.start = {}  # worker -> (when, collectives, seconds waited) at its window's start
        self.latest = {}  # worker -> the same, as last heard
        self.window_at = None  # when the current window started
        self.steps = {}  # worker -> its step time over the last window
        self.slow = {}  # worker -> windows in a row it straggled (while it is a straggler)
        self.idle = set()  # workers heard idle in hvd.join() in the current window
        self.lined_up = False  # every member has entered a collective of this world

    def new_world(self, now: float) -> None:
        self.start, self.latest, self.steps, self.slow, self.window_at = {}, {}, {}, {}, now
        self.idle, self.lined_up = set(), False

    def heard(self, worker: str, calls: int, waited: float, now: float, idle: bool = False) -> None:
        self.latest[worker] = (now, calls, waited)
        if not self.lined_up or worker not in self.start:
            self.start[worker] = self.latest[worker]
        if idle:
            self.idle.add(worker)

    def check(self, members, now: float) -> list:
        """At each window's end: [(event, worker, its step, the others' median)], event
        "straggler" when it became one, "straggler_recovered" when it no longer is."""
        if self.window_at is None or now - self.window_at < WINDOW:
            return []
        self.window_at, steps, idle, self.idle = now, {}, self.idle, set()
        if not self.lined_up:  # measured from the next window on, once every member is in step
            self.lined_up = all(self.latest.get(w, (0, 0))[1] > 0 for w in members)
            return []
        for w in members:
            if w in idle:  # (a straggler stays one until it steps again)
                self.start[w] = self.latest[w]
            elif w in self.start and self.latest[w][1] > self.start[w][1]:
                (t0, c0, s0), (t1, c1, s1) = self.start[w], self.latest[w]
                steps[w] = max(0.0, (t1 - t0) - (s1 - s0)) / (c1 - c0)
                self.start[w] = self.latest[w]
        self.steps.update(steps)
        said = []
        for w, step in sorted(steps.items()):
            others = [s for o, s in steps.items() if o != w]
            if not others:
                continue
            median = statistics.median(others)
            if step >= self.factor * median and step - median >= MIN_GAP:
                self.slow[w] = self.slow.get(w, 0) + 1
                if self.slow[w] == 1:
                    said.append(("straggler", w, step, median))
            elif self.slow.pop(w, None) is not None:
                said.append(("straggler_recovered", w, step, median))
        return said

    def persistent(self, worker: str) -> bool:
        """A straggler for PERSIST windows in a row."""
        return self.slow.get(worker, 0) >= PERSIST
