"""A driver's journal and the take-over of a job from it (pure: no store, no clock read).

`journal(core, now)` is what a new driver needs to take the job over with nothing lost: the
hosts, the slots' launch counts (so no incarnation id is given out twice), the current world
(its members, ranks and answers), the other live workers, the commit ledger, the blacklist with
the cooldown left, the failures so far (--fail-on-worker-failure), and what heartbeat answers
publish. Monotonic times do not cross processes:
a cooldown is kept as the seconds left. The commits each worker holds are not in it: they change
every step, and the workers tell the new driver in their first heartbeats.

`adopt(policy, journal, now)` is the core of the driver that takes over: every journaled live
worker as it was, heard from now (its liveness timeout runs from the take-over), so one that
died while no driver ran is found by the executor (its process is gone) or by that timeout.

The leadership rule: a driver decides only while it holds the newest lease and renewed it
within its time to live (`may_decide`; leadership.py acts on it). A worker's rule, that it takes
answers only from a driver whose epoch is not smaller than the greatest it accepted, is
worker/beacon.py's `accepts`.
"""
from hvdlite.driver.decisions.core import ElasticCore
from hvdlite.driver.decisions.workers import Incarnation, Phase
from hvdlite.worker.world import WorldInfo

VERSION = 1


def may_decide(holds_newest: bool, renewed_at: float, now: float, ttl: float) -> bool:
    return holds_newest and now - renewed_at < ttl


def adoptable(core: ElasticCore) -> bool:
    """Whether a new driver could go on with this job: a world formed, and nothing ending it
    (a stop under way or a success is finished by nobody: the workers end at the grace's end)."""
    return core.round > 0 and not (core.ended or core.succeeded or core.stopping is not None)


def journal(core: ElasticCore, now: float) -> dict:
    live = sorted(core._live(), key=lambda inc: inc.id)
    return {
        "version": VERSION, "adoptable": adoptable(core),
        "hosts": [[h, n] for h, n in core.hosts], "launches": dict(sorted(core.launches.items())),
        "round": core.round, "updates": core.updates, "broken": core.broken, "resets": core.resets,
        "ledger": [core.ledger.newest, core.ledger.disk],
        "blacklist": _cooldowns(core.blacklist, now), "retries": _cooldowns(core.retries, now),
        "left": sorted(core.left), "drained": sorted(core.drained), "failures": list(core.failures),
        "world": {w: place.to_dict() for w, place in sorted(core.world.items())},
        "staying": sorted(core.staying),
        "workers": [{"id": inc.id, "slot": inc.slot, "host": inc.host, "pid": inc.pid, "rank": inc.rank,
                     "phase": inc.phase.value, "answer": list(inc.answer) if inc.answer else None}
                    for inc in sorted(core.workers.values(), key=lambda inc: inc.id)
                    if inc.phase is not Phase.LEAVING],  # one being removed is the old driver's
    }


def _cooldowns(blacklist, now) -> dict:
    return {key: [None if until is None else max(0.0, until - now), blacklist.count.get(key, 0)]
            for key, until in sorted(blacklist.until.items())}


def _restore(blacklist, saved, now):
    for key, (left, count) in saved.items():
        blacklist.until[key] = None if left is None else now + left
        blacklist.count[key] = count


def adopt(core: ElasticCore, saved: dict, now: float) -> ElasticCore:
    """Make the fresh `core` (built with the job's policy) the journal's job as of `now`."""
    core.hosts = [(h, n) for h, n in saved["hosts"]]
    core.slots_of = dict(core.hosts)
    core.hosts_known = bool(core.hosts)
    core.launches = dict(saved["launches"])
    core.round, core.updates, core.broken, core.resets = (saved["round"], saved["updates"], saved["broken"],
                                                          saved["resets"])
    core.ledger.newest = max(core.ledger.newest, saved["ledger"][0])
    core.ledger.disk = max(core.ledger.disk, saved["ledger"][1])
    _restore(core.blacklist, saved["blacklist"], now)
    _restore(core.retries, saved["retries"], now)
    core.left, core.drained = set(saved["left"]), set(saved["drained"])
    core.failures = list(saved["failures"])  # --fail-on-worker-failure counts those before the take-over too
    core.world = {w: WorldInfo(**place) for w, place in saved["world"].items()}
    core._now = now
    for w in saved["workers"]:
        member = w["id"] in core.world and w["phase"] == Phase.TRAINING.value
        gone = w["phase"] == Phase.GONE.value
        inc = Incarnation(w["id"], w["slot"], w["host"], launched_at=now, pid=w["pid"], rank=w["rank"],
                          heard_at=now, own_at=now, answer=tuple(w["answer"]) if w["answer"] else None,
                          phase=Phase.GONE if gone else Phase.TRAINING if member else Phase.STARTING)
        if gone and inc.id not in core.world:
            continue
        core.workers[inc.id] = inc
        if gone:
            continue
        core.phases[inc.phase][inc.id] = inc
        if not member:  # it asks the rendezvous again (it was waiting, or starting)
            core.joiners[inc.id] = inc
        core._schedule(inc)
    core.staying = {w for w in saved["staying"] if w in core.phases[Phase.TRAINING]}
    if core.round and core.broken >= core.round:
        core.broken_at, core.disrupted = now, (now, "failure")
    return core


def summary(core: ElasticCore) -> dict:
    """The job_adopted event's fields: the world taken over."""
    return {"round": core.round, "workers": len(core._live()),
            "members": {core.workers[w].slot: p.rank for w, p in core.world.items() if core.workers[w].alive},
            "pids": {inc.slot: inc.pid for inc in core._live()}}
