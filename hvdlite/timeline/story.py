"""What the event log says happened, per slot and over time (pure: records in, Story out).

A slot's lane: `joining` from its worker's start until a world takes it in (starting up and
waiting in the rendezvous: the log does not tell the two apart), `member` while it is in a
world, then its exit. Blacklisting is drawn over the lanes of the slots it takes out, and a
straggler's time (from `straggler` to its recovery or exit) over its own lane. A static
job's workers are members, with their rank, from their start: its one world is every rank.

One event log may hold several runs (a killed job, then the same command resuming it from
--checkpoint-dir): `runs()` tells them apart, at each `job_start` or after a `job_end`.
"""
import signal
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Segment:
    start: float
    end: Optional[float]  # None: still open at the end of the log
    state: str  # "joining", "member", "blacklisted" or "straggler"
    label: str = ""


@dataclass
class Mark:
    time: float
    kind: str  # "start", "exit", "failure", "hosts", "broken"
    label: str
    slot: Optional[str] = None  # None: the whole job


@dataclass
class Story:
    start: float
    end: float
    slots: list  # lane order: by host as first seen, then slot index
    segments: dict = field(default_factory=dict)  # slot -> [Segment]
    marks: list = field(default_factory=list)
    sizes: list = field(default_factory=list)  # [(time, world size)], a step function
    recoveries: list = field(default_factory=list)  # [(start, end, cause)]
    result: str = ""
    mode: str = ""  # "static" or "elastic" when the log says (job_start), else ""
    worlds: int = 0  # worlds formed
    run: int = 1  # which run of the event log, from 1

    @property
    def failures(self) -> int:
        return sum(1 for m in self.marks if m.kind == "failure")


def exit_label(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"


def _slot_order(slot):
    host, _, index = slot.rpartition("/")
    return host, int(index) if index.isdigit() else 0


def _valid(records):
    return [r for r in records if isinstance(r.get("time"), (int, float)) and "event" in r]


def runs(records) -> list:
    """A Story per run of the job in the records, oldest first."""
    records = _valid(records)
    if not records:
        raise ValueError("the event log has no events")
    groups, ended = [[]], False
    for r in records:
        if groups[-1] and (r["event"] == "job_start" or ended):
            groups.append([])
        groups[-1].append(r)
        ended = r["event"] == "job_end"
    stories = [build(group) for group in groups]
    for number, story in enumerate(stories, 1):
        story.run = number
    return stories


def build(records) -> Story:
    """The story of the records of one run (event log lines as dicts, in order of time)."""
    records = _valid(records)
    if not records:
        raise ValueError("the event log has no events")
    story = Story(start=records[0]["time"], end=records[-1]["time"], slots=[])
    first = records[0]
    story.mode = first.get("mode", "") if first["event"] == "job_start" else ""
    # Logs written before job_start existed: a static job's worker_start carries its rank.
    static = story.mode == "static" or not story.mode and not any(
        r["event"] == "round_complete" for r in records) and any(
        r["event"] == "worker_start" and r.get("rank") is not None for r in records)
    if static:
        story.mode = "static"
        story.worlds = 1
    hosts = []  # in order of appearance
    member = set()
    blacklisted = {}  # key -> segments opened for it

    def lane(slot):
        if slot not in story.segments:
            story.segments[slot] = []
            host = _slot_order(slot)[0]
            if host not in hosts:
                hosts.append(host)
        return story.segments[slot]

    def close(slot, t, states=("joining", "member")):
        for seg in story.segments.get(slot, []):
            if seg.end is None and seg.state in states:
                seg.end = t

    for r in records:
        t, event = r["time"], r["event"]
        slot = r.get("slot")
        if event == "worker_start" and slot:
            close(slot, t)
            if static:
                lane(slot).append(Segment(t, None, "member", f"rank {r.get('rank')}"))
                member.add(slot)
                story.sizes.append((t, len(member)))
            else:
                lane(slot).append(Segment(t, None, "joining"))
            story.marks.append(Mark(t, "start", f"started ({r.get('started', 'process')})", slot))
        elif event == "round_complete":
            members = r.get("members", {})
            for s, rank in members.items():
                close(s, t)
                lane(s).append(Segment(t, None, "member", f"rank {rank}"))
            for s in member - set(members):
                close(s, t)
                lane(s).append(Segment(t, None, "joining"))
            member = set(members)
            story.worlds += 1
            story.sizes.append((t, r.get("size", len(members))))
            if r.get("reformed_in") is not None:
                story.recoveries.append((t - r["reformed_in"], t, r.get("cause", "")))
        elif event == "worker_exit" and slot:
            close(slot, t, ("joining", "member", "straggler"))
            if static and slot in member:
                member.discard(slot)
                story.sizes.append((t, len(member)))
            member.discard(slot)
            code = r.get("code", 0)
            failed = code != 0 and not r.get("removed")
            label = "removed" if r.get("removed") else exit_label(code)
            story.marks.append(Mark(t, "failure" if failed else "exit", label, slot))
            lane(slot)
        elif event == "launch_failed" and slot:
            close(slot, t)
            story.marks.append(Mark(t, "failure", f"launch failed: {r.get('error', '')}", slot))
        elif event in ("worker_unresponsive", "worker_hung") and slot:
            story.marks.append(Mark(t, "broken", "unresponsive" if event == "worker_unresponsive" else "hung", slot))
        elif event == "straggler" and slot:
            lane(slot).append(Segment(t, None, "straggler", f"{r.get('step', 0) * 1000:.0f} ms a collective, "
                                                            f"the others {r.get('median', 0) * 1000:.0f} ms"))
        elif event == "straggler_recovered" and slot:
            close(slot, t, ("straggler",))
        elif event == "round_broken":
            # a host update ends a world with nobody rolling back: not a break
            what = "re-forms for hosts" if r.get("cause") == "hosts updated" else "broke"
            story.marks.append(Mark(t, "broken", f"world {r.get('round')} {what}"))
        elif event == "hosts_changed":
            resized = r.get("resized") or {}
            change = [f"{h} {old}->{new}" for h, (old, new) in resized.items()] + \
                [f"+{h}" for h in r.get("added", []) if h not in resized] + \
                [f"-{h}" for h in r.get("removed", []) if h not in resized]
            story.marks.append(Mark(t, "hosts", " ".join(change) or r.get("kind", "hosts")))
        elif event == "blacklisted" and r.get("key"):
            blacklisted.setdefault(r["key"], []).append(Segment(t, None, "blacklisted", r.get("cooldown", "")))
        elif event == "whitelisted" and r.get("key"):
            for seg in blacklisted.get(r["key"], []):
                if seg.end is None:
                    seg.end = t
        elif event == "job_end":
            story.result = r.get("result", "")
    story.slots = sorted(story.segments, key=lambda s: (hosts.index(_slot_order(s)[0]), _slot_order(s)[1]))
    for key, segs in blacklisted.items():
        covered = [s for s in story.slots if s == key or _slot_order(s)[0] == key]
        for s in covered:
            story.segments[s].extend(Segment(b.start, b.end, b.state, b.label) for b in segs)
    return story
