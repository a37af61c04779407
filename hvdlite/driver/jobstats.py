"""Numbers about a running job, for the status line and /metrics: fed the driver's events and
the core's JobView with the time passed in (no clock read here), read as a Summary."""
import threading
from collections import deque
from dataclasses import dataclass

from hvdlite.driver.decisions.core import JobView

RECOVERY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RATE_WINDOW = 10.0  # seconds of commits steps/s is measured over


@dataclass(frozen=True)
class Summary:
    view: JobView
    steps_per_second: float
    commits: int  # newest commit the job reached (never goes down)
    failures: int  # workers that exited failed or could not be launched
    recoveries: tuple  # re-formation seconds of every world after the first, oldest first
    last_event: float  # time of the last event (as passed in), or None


EMPTY_VIEW = JobView(round=0, world_size=0, target_size=0, commit=0, joining=0,
                     blacklisted_slots=0, resets=0)


class JobStats:
    """Written by the decision thread, read by the status line and metrics threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._view = EMPTY_VIEW
        self._samples = deque()  # (time, commit) within RATE_WINDOW, commit never decreasing
        self._commits = 0
        self._failures = 0
        self._recoveries = []
        self._last_event = None

    def on_event(self, event: str, fields: dict, t: float) -> None:
        with self._lock:
            self._last_event = t
            failed = (event == "worker_exit" and fields.get("code", 0) != 0 and not fields.get("removed")
                      and not fields.get("left")) or event == "launch_failed"
            if failed:
                self._failures += 1
            if event == "round_complete" and fields.get("reformed_in") is not None:
                self._recoveries.append(fields["reformed_in"])

    def on_view(self, view: JobView, t: float) -> None:
        with self._lock:
            self._view = view
            if self._samples and view.commit < self._samples[-1][1]:
                self._samples.clear()  # a rollback: the rate starts again from here
            if not self._samples or view.commit != self._samples[-1][1] or t - self._samples[-1][0] >= 1:
                self._samples.append((t, view.commit))
            while len(self._samples) > 2 and t - self._samples[1][0] >= RATE_WINDOW:
                self._samples.popleft()
            self._commits = max(self._commits, view.commit)

    def summary(self) -> Summary:
        with self._lock:
            rate = 0.0
            if len(self._samples) >= 2:
                (t0, c0), (t1, c1) = self._samples[0], self._samples[-1]
                rate = (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0
            return Summary(self._view, rate, self._commits, self._failures,
                           tuple(self._recoveries), self._last_event)


def status_line(s: Summary, now: float, width: int = 120) -> str:
    """The live line a terminal shows under the events."""
    v = s.view
    parts = [f"world {v.world_size}/{v.target_size}", f"{s.steps_per_second:.1f} steps/s",
             f"commit {v.commit}"]
    if v.joining:
        parts.append(f"{v.joining} joining")
    if v.blacklisted_slots:
        parts.append(f"{v.blacklisted_slots} blacklisted")
    if v.stragglers:
        parts.append("straggler" + ("s" if len(v.stragglers) > 1 else "") + " rank " +
                     ", ".join(str(r) for r in v.stragglers))
    parts.append(f"{v.resets} resets")
    if s.last_event is not None:
        parts.append(f"last event {_ago(now - s.last_event)} ago")
    line = "hvdlite: " + parts[0]
    for part in parts[1:]:  # what does not fit the terminal is left off, whole
        if len(line) + 3 + len(part) > width:
            break
        line += " | " + part
    return line


def _ago(seconds: float) -> str:
    seconds = max(seconds, 0)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def prometheus_text(s: Summary) -> str:
    """Prometheus' text exposition format (version 0.0.4)."""
    v = s.view
    out = []

    def metric(name, kind, help_text, value):
        out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {_number(value)}"])

    metric("hvdlite_world_size", "gauge", "Workers in the current world.", v.world_size)
    metric("hvdlite_target_world_size", "gauge",
           "Workers the usable slots would make (capped by --max-np).", v.target_size)
    metric("hvdlite_world_round", "gauge", "Number of the current world (0 before the first).", v.round)
    metric("hvdlite_joining_workers", "gauge", "Workers started or waiting to join a world.", v.joining)
    metric("hvdlite_blacklisted_slots", "gauge", "Slots of the current hosts sitting out.",
           v.blacklisted_slots)
    metric("hvdlite_resets_total", "counter", "Times the world re-formed.", v.resets)
    metric("hvdlite_worker_failures_total", "counter",
           "Workers that exited failed or could not be launched.", s.failures)
    metric("hvdlite_newest_commit", "gauge", "Newest commit (training step) the job reached.", s.commits)
    metric("hvdlite_steps_per_second", "gauge",
           f"Commits per second over the last {RATE_WINDOW:g} s.", round(s.steps_per_second, 3))
    name = "hvdlite_step_seconds"
    out += [f"# HELP {name} Each rank's own work per collective (its step time, not waiting in "
            f"collectives) over the last straggler window.", f"# TYPE {name} gauge"]
    out += [f'{name}{{rank="{rank}"}} {_number(round(seconds, 6))}' for rank, seconds in v.steps]
    name = "hvdlite_straggler"
    out += [f"# HELP {name} 1 for a rank named a straggler now (--straggler-factor).", f"# TYPE {name} gauge"]
    out += [f'{name}{{rank="{rank}"}} {int(rank in v.stragglers)}' for rank, _ in v.steps]
    name = "hvdlite_recovery_seconds"
    out += [f"# HELP {name} Seconds from a failure or host update to the next world.",
            f"# TYPE {name} histogram"]
    for bound in RECOVERY_BUCKETS:
        out.append(f'{name}_bucket{{le="{bound:g}"}} {sum(1 for r in s.recoveries if r <= bound)}')
    out += [f'{name}_bucket{{le="+Inf"}} {len(s.recoveries)}',
            f"{name}_sum {_number(round(sum(s.recoveries), 6))}", f"{name}_count {len(s.recoveries)}"]
    return "\n".join(out) + "\n"


def _number(value) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
