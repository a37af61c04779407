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
One the last driver was removing is journaled too, and taken over as leaving: a member of the
world may be one, and the world names only workers the journal lists.

`rerun(...)` decides what a new driver does with the job its journal describes: take the
workers over, start from --checkpoint-dir (killing first the last driver's workers that never
trained), or refuse to run while workers it cannot take over may still train: a fresh start
beside them would have two generations of the job write one folder. The driver gathers the
facts (which journaled processes still run here, what launches each host) and acts.

The leadership rule: a driver decides only while it holds the newest lease and renewed it
within its time to live (`may_decide`; leadership.py acts on it). A worker's rule, that it takes
answers only from a driver whose epoch is not smaller than the greatest it accepted, is
worker/beacon.py's `accepts`.
"""
import shlex
import time
from dataclasses import dataclass
from typing import Optional

from hvdlite.driver.decisions.core import ElasticCore
from hvdlite.driver.decisions.workers import Incarnation, Phase
from hvdlite.worker.world import WorldInfo

VERSION = 1
# How a journaled worker's host is reached: this machine, a launcher that can take workers over
# (SSH), one whose workers end with the driver that launched them and can tell which still run
# (Ray: an actor dies with its owner), or one that can do neither (srun).
LOCAL, ADOPTS, ENDS, OTHER = "local", "adopts", "ends", "other"
# Seconds a rerun waits for ENDS workers to end: Ray ends the actors of a driver whose process
# died within a second; of one whose host died, once its health check gave the host up (~15 s).
ENDING_WAIT = 30.0


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
                    for inc in sorted(core.workers.values(), key=lambda inc: inc.id)],
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
        # One being removed (told to go; a member of the world may be one) stays so: its exit
        # is awaited, never judged, and it is in no world this driver forms.
        kept = Phase(w["phase"]) if w["phase"] in (Phase.GONE.value, Phase.LEAVING.value) else None
        inc = Incarnation(w["id"], w["slot"], w["host"], launched_at=now, pid=w["pid"], rank=w["rank"],
                          heard_at=now, own_at=now, answer=tuple(w["answer"]) if w["answer"] else None,
                          phase=kept or (Phase.TRAINING if member else Phase.STARTING))
        if gone and inc.id not in core.world:
            continue
        core.workers[inc.id] = inc
        if gone:
            continue
        core.phases[inc.phase][inc.id] = inc
        if inc.phase is Phase.STARTING:  # it asks the rendezvous again (it was waiting, or starting)
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


@dataclass(frozen=True)
class Rerun:
    """What a new driver does with the job the last one left (rerun())."""
    adopt: bool = False  # take the journal's workers over; else start from --checkpoint-dir
    kill: tuple = ()  # pids of the last driver's workers to kill first: they trained nothing
    refused: Optional[str] = None  # why it must not run now (one line for the user)
    gone: tuple = ()  # workers taken over whose process ended without a word: launched again, unblamed
    ending: tuple = ()  # ENDS workers that still run: ask again (up to ENDING_WAIT), then decide


def not_ended(ending) -> str:
    """The refusal when ENDS workers still run after ENDING_WAIT."""
    return (f"the last driver's workers {', '.join(ending)} still run {ENDING_WAIT:g} s after this "
            f"driver started, though their launcher ends them with it (Ray: the actors of a driver "
            f"that died); run this again once they ended, or stop them first")


def live_hosts(saved: Optional[dict]) -> set:
    """The hosts rerun() needs to know how each is reached: those of a journal's workers that
    had not ended."""
    if saved is None:
        return set()
    return {w["host"] for w in saved.get("workers", ()) if w["phase"] != Phase.GONE.value}


def in_grace(saved: Optional[dict], now: float, grace: float) -> bool:
    """Whether the workers the journal's driver left may still train (they give up after --driver-grace)."""
    return saved is not None and now < saved.get("written_at", 0.0) + grace


def rerun(saved: Optional[dict], running: dict, elsewhere: set, exited: set, reached: dict, command: list,
          host: str, now: float, grace: float, checkpoint_dir: str) -> Rerun:
    """`saved`: the last driver's journal (None: none); `running`: worker id -> pid of its
    journaled processes that still run on this machine; `elsewhere`: the ids of those that run on
    SSH hosts (asked while in_grace()), on Ray nodes and as srun steps (asked always); `exited`:
    the ids whose process said it exits (beacon); `reached`: host -> LOCAL, ADOPTS, ENDS or OTHER
    for live_hosts(saved); `command`: this job's; `host`: this machine's name; `now`: the wall
    clock; `grace`: --driver-grace."""
    if saved is None:
        return Rerun()
    ending = tuple(sorted(w["id"] for w in saved.get("workers", ())
                          if reached.get(w["host"]) == ENDS and w["id"] in elsewhere))
    if ending:  # they end with their driver, never taken over: a fresh start waits for that
        return Rerun(ending=ending)
    if not saved.get("adoptable"):
        # Every journaled process that runs: one the last driver was taking out too, which may
        # not have heard.
        alive = sorted(running.values())
        if (alive or elsewhere) and saved.get("round", 0) > 0:
            # Its driver died while ending the job: the workers that had not heard train on.
            named = [f"pid {pid}" for pid in alive] + sorted(elsewhere)
            return Rerun(refused=f"the last driver of this job died while ending it and its workers still run "
                                 f"({', '.join(named)}): they end within --driver-grace; run "
                                 f"this again once they did, or stop them first")
        # Launched before any world formed: they trained nothing, and could never find this
        # driver (a new secret signs its beacon).
        return Rerun(kill=tuple(alive))
    if saved.get("command", command) != command:
        return Rerun(refused=f"the workers of --checkpoint-dir {checkpoint_dir} run "
                             f"{shlex.join(saved['command'])}: not this job's command; run that one to take "
                             f"them over, or stop them first")
    live = [w for w in saved["workers"] if w["phase"] != Phase.GONE.value]
    remote = sorted({w["host"] for w in live if reached[w["host"]] != LOCAL})
    # Workers on SSH hosts are taken over too; those of srun not yet, nor, from another machine,
    # those the last driver ran on its own (named localhost); those of Ray ended (above).
    others = [h for h in remote if reached[h] == OTHER]
    if saved.get("driver_host", host) != host:
        others += sorted({f"{w['host']} of {saved['driver_host']}" for w in live if reached[w["host"]] == LOCAL})
    until = saved.get("written_at", 0.0) + grace
    graced = in_grace(saved, now, grace)
    if others and graced:  # a fresh start now would race them
        return Rerun(refused=f"the last driver of this job left workers on {', '.join(others)}, which train "
                             f"on until about {time.strftime('%H:%M:%S', time.localtime(until))} "
                             f"(--driver-grace); only workers on this machine and on SSH hosts are taken "
                             f"over (docs/failover.md): run this again after that, or stop them first")
    # Past the grace, one that Slurm still lists (a stopped or exiting step) would race a fresh start too.
    late = sorted({w["host"] for w in live if reached[w["host"]] == OTHER and w["id"] in elsewhere})
    if late:
        return Rerun(refused=f"the last driver of this job left workers on {', '.join(late)} that still run "
                             f"past their --driver-grace (stopped, or ending): run this again once they "
                             f"ended, or stop them first")
    if others or remote and not graced or not any(w["id"] in running or w["id"] in elsewhere for w in live):
        return Rerun()  # every one of them ended (its grace ran out, its host died): a plain resume from disk
    # One on an SSH host gone without a word (with its host, say) is not taken over.
    return Rerun(adopt=True, gone=tuple(w["id"] for w in live if reached[w["host"]] == ADOPTS and w["id"]
                                        not in elsewhere and w["id"] not in exited))
