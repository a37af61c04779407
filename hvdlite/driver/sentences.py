"""The driver's events as sentences for people: `sentence("worker_exit", fields)` ->
"rank 2 on host-a was killed by SIGKILL". The event log keeps the fields as they are."""
from hvdlite import exitcodes
from hvdlite.driver.decisions.messages import LISTENING, UNPROBED
from hvdlite.driver.decisions.nodeloss import LOST
from hvdlite.driver.decisions.workers import describe_exit
from hvdlite.driver.decisions.plan import host_of


def _who(f) -> str:
    """A worker by its rank when it has one, else by its slot; always with its host."""
    slot = f.get("slot", "?")
    if f.get("rank") is not None:
        return f"rank {f['rank']} on {host_of(slot)} (slot {slot})"
    return f"worker {slot}"


def _plural(n, word) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _names(items) -> str:
    return ", ".join(str(i) for i in items) or "none"


def _worker_exit(f):
    if f.get("removed"):
        return f"{_who(f)} left the job (its slot is gone or not needed)"
    if f.get("drained"):
        return f"{_who(f)} went with its drained host ({describe_exit(f.get('code', 0))})"
    if f.get("left"):
        return f"{_who(f)} left the job at a commit (SIGTERM, or the job stopping)"
    if f.get("node") in LOST:  # the driver's probe found its node dead or its process gone
        return f"{_who(f)} is taken as failed: {LOST[f['node']]}"
    code = f.get("code", 0)
    if code == 0:
        return f"{_who(f)} finished"
    if f.get("cause"):
        return f"{_who(f)} {describe_exit(code)}: {f['cause']}; starting it again"
    why = f" ({f['error']})" if f.get("error") else ""
    return f"{_who(f)} {describe_exit(code)}{why}"


def _round_complete(f):
    size = f.get("size", 0)
    start = f"world {f.get('round')} formed: " + _plural(size, "worker")
    if f.get("last"):
        return f"{start} to write commit {f.get('commit', 0)} to --checkpoint-dir before the job stops"
    if f.get("round") == 1:
        return f"{start} start{'s' if size == 1 else ''} training"  # 1 worker starts, 2 start
    if f.get("handover"):
        return (f"{start} sync{'s' if size == 1 else ''} from commit {f.get('commit', 0)}, "
                f"then the holder on a sidelined slot leaves")
    text = f"{start} go{'es' if size == 1 else ''} on from commit {f.get('commit', 0)}"
    if f.get("reformed_in") is not None:
        after = {"failure": "the failure", "a worker left": "a worker left"}.get(f.get("cause"), "the host update")
        text += f" (re-formed in {f['reformed_in']:.2f} s after {after})"
    return text


def _round_broken(f):
    if f.get("cause") == "hosts updated":  # its members left it together, at the same commit
        return (f"world {f.get('round')} re-forms for the host update; its members left it at a commit, "
                f"nobody rolls back")
    if f.get("cause") == "a worker left":  # at a commit, which the others keep
        return f"world {f.get('round')} re-forms without a worker that left it at a commit; nobody rolls back"
    return f"world {f.get('round')} broke; the survivors roll back to their last commit"


def _hosts_changed(f):
    resized = f.get("resized") or {}  # a host whose slot count changed is neither added nor removed
    parts = [f"{h} {old} -> {new} slots" for h, (old, new) in resized.items()]
    added = [h for h in f.get("added") or () if h not in resized]
    removed = [h for h in f.get("removed") or () if h not in resized]
    if added:
        parts.append(f"added {_names(added)}")
    if removed:
        parts.append(f"removed {_names(removed)}")
    return f"hosts changed: {'; '.join(parts) or f.get('kind', '?')}; now {_names(f.get('hosts', []))}"


def _job_end(f):
    result = f.get("result")
    if result == "success":
        resets = f.get("resets")
        text = "job finished" + (f" after {_plural(resets, 'reset')}" if resets is not None else "")
        failed = f.get("failed") or []
        if failed:
            text += f"; {_plural(len(failed), 'worker')} failed on the way: " + "; ".join(failed)
        return text
    if result == "interrupted":
        return f"job interrupted by {f.get('signal')}"
    if result == "stopped":
        late = f" ({_names(f['late'])} reached no commit in time: killed)" if f.get("late") else ""
        if f.get("newest") is not None:
            late += f" (commit {f['newest']} did not reach the disk)"
        if f.get("resumable"):
            return f"job stopped by {f.get('signal')} at commit {f.get('commit')}{late}; its checkpoint " \
                   f"is in --checkpoint-dir: run the same command again to resume (exit {exitcodes.RESUMABLE})"
        if f.get("durable"):
            return f"job stopped by {f.get('signal')}{late}; no commit reached --checkpoint-dir, " \
                   f"nothing to resume from"
        return f"job stopped by {f.get('signal')} at commit {f.get('commit')}{late}; without " \
               f"--checkpoint-dir nothing was saved"
    return f"job failed: {f.get('reason')}"


def _job_start(f):
    if f.get("mode") != "elastic":
        return f"starting a static job of {_plural(f.get('np') or 0, 'worker')}"
    # As many workers start as the hosts have usable slots, up to --max-np: -np does not say.
    most = f", at most {f['max_np']}" if f.get("max_np") else ""
    return f"starting an elastic job: one worker per slot of the hosts found, at least {f.get('min_np')}{most}"


def _node_probed(f):
    if f.get("outcome") == LISTENING:
        return f"{_who(f)}'s node answered the probe: its process is there (stopped or slow); " \
               f"it gets --liveness-timeout"
    if f.get("outcome") == UNPROBED:
        return f"{_who(f)}'s node could not be probed (no socket of it is reachable); " \
               f"it gets --liveness-timeout"
    return f"{_who(f)}: {LOST.get(f.get('outcome'), f.get('outcome'))}"


_WHOSE = {"driver": "the driver's trouble", "launcher": "its launcher's trouble"}


SENTENCES = {
    "job_start": _job_start,
    "worker_start": lambda f: f"{_who(f)} started (pid {f.get('pid')}, {f.get('started', 'process')})",
    "worker_exit": _worker_exit,
    "launch_failed": lambda f: f"worker {f.get('slot')} could not be launched: {f.get('error')}",
    "round_complete": _round_complete,
    "round_broken": _round_broken,
    "hosts_changed": _hosts_changed,
    "hosts_updated": lambda f: f"workers told to re-form at their next commit: {f.get('reason')}",
    "blacklisted": lambda f: f"{f.get('key')} blacklisted ({f.get('cooldown')})",
    "host_drained": lambda f: f"{f.get('host')} is being taken away on purpose (drained): "
                              f"its workers leave, nothing is blacklisted",
    "host_failed": lambda f: f"{_who(f)}: its host failed; killing it",
    "whitelisted": lambda f: f"{f.get('key')} is usable again (cooldown over)",
    "worker_unresponsive": lambda f: f"{_who(f)} is unresponsive ({f.get('reason')}); killing it",
    "member_left_behind": lambda f: f"{_who(f)} is still in world {f.get('round')} after {f.get('after', 0):.0f} s; "
                                    f"world {(f.get('round') or 0) + 1} forms without it (it joins when it is back)",
    "worker_hung": lambda f: f"{_who(f)} is hung: {f.get('reason')}; {f.get('action')}",
    "worker_stack": lambda f: f"stack of {_who(f)}, main thread, innermost last:\n{f.get('stack', '').rstrip()}"
                              if f.get("stack") else f"{_who(f)} sent no stack: {f.get('missing')}",
    "straggler": lambda f: f"straggler: {_who(f)} takes {f.get('step', 0) * 1000:.0f} ms of its own work "
                           f"per collective, the others' median {f.get('median', 0) * 1000:.0f} ms",
    "straggler_recovered": lambda f: f"straggler recovered: {_who(f)} takes {f.get('step', 0) * 1000:.0f} ms "
                                     f"per collective, the others' median {f.get('median', 0) * 1000:.0f} ms",
    "straggler_evicted": lambda f: f"{_who(f)} is evicted: {f.get('reason')}; killing it",
    "worker_stuck": lambda f: f"{_who(f)} never left its broken world ({f.get('reason')}); killing it",
    "state_kept": lambda f: f"worker {f.get('slot')} keeps commit {f.get('commit')} without training "
                            f"({f.get('reason')}); waiting for hosts",
    "worker_start_timeout": lambda f: f"{_who(f)} did not start in time ({f.get('reason')}); killing it",
    "commit_lost": lambda f: f"every holder of commit {f.get('newest')} is gone; "
                             f"going on from commit {f.get('resumed')}",
    "waiting_for_workers": lambda f: f"waiting for workers: {f.get('ready')} ready, "
                                     f"--min-np {f.get('min_np')}",
    "descriptors_exhausted": lambda f: f"out of file descriptors (limit {f.get('limit')}): "
                                       f"{_plural(f.get('refused', 0), 'connection')} refused or "
                                       f"dropped, the oldest not signed first; raise `ulimit -n`",
    "launch_token_reused": lambda f: f"refused a second use of worker {f.get('worker')}'s one-time "
                                     f"launch token, from {f.get('sender')}; the first use, which "
                                     f"got the job's secret, came from {f.get('first')}: if that is "
                                     f"not the worker's host, whoever read its launch holds the "
                                     f"job's secret",
    "launch_token_elsewhere": lambda f: f"refused worker {f.get('worker')}'s one-time launch token "
                                        f"from {f.get('sender')}, not its host's address "
                                        f"({f.get('host')}): whoever read its launch tried to use it "
                                        f"(or the host reaches this driver from an address its "
                                        f"launcher does not name)",
    "discovery_failed": lambda f: f"host discovery failed: {f.get('error')}; retrying quietly "
                                  f"until it works again",
    "discovery_recovered": lambda f: f"host discovery works again, after "
                                     f"{_plural(f.get('failures', 0), 'failed run')}",
    "job_end": _job_end,
    "discovery_empty": lambda f: f"host discovery lists no hosts: no worker can start until it "
                                 f"lists at least --min-np {f.get('min_np')} slots",
    "node_probe": lambda f: f"{_who(f)} is silent ({f.get('reason')}); probing its node",
    "node_probed": _node_probed,
    "launch_overdue": lambda f: f"worker {f.get('slot')} gave no process within --start-timeout "
                                f"{f.get('after', 0):g} s of its launch; launching it again later",
    "retry_later": lambda f: f"worker {f.get('slot')} is launched again in {f.get('after')} "
                             f"({_WHOSE.get(f.get('whose'), f.get('whose'))}, not its host's: "
                             f"nothing is blacklisted)",
    "stop_requested": lambda f: f"{f.get('signal')}: every worker stops at its next commit (within "
                                f"{f.get('timeout'):g} s; a second signal stops them at once)",
    "worker_leaving": lambda f: f"{_who(f)} got SIGTERM: it leaves at a commit, once another worker "
                                f"or the disk holds its commit",
    "writing_before_the_end": lambda f: f"the job ends ({f.get('reason')}); first its newest commit is "
                                        f"written to --checkpoint-dir (within {f.get('timeout'):g} s)",
    "leadership_in_doubt": lambda f: f"this driver could not renew its lease (the store does not answer: it "
                                     f"may be the one cut off): {f.get('action')} until it does",
    "leadership_back": lambda f: f"this driver renewed its lease again, after {f.get('after')}",
    "job_adopted": lambda f: f"took the job over from its last driver (lease {f.get('lease')}): world "
                             f"{f.get('round')}, {_plural(f.get('workers', 0), 'live worker')}, ranks "
                             f"{_names(f'{s}={r}' for s, r in sorted((f.get('members') or {}).items()))}",
    "job_readopted": lambda f: f"every taken-over worker answered, {f.get('after', 0):.2f} s after this "
                               f"driver started",
    "worker_stop_timeout": lambda f: f"{_who(f)} reached no commit in time ({f.get('reason')}); killing it",
}


def sentence(event: str, fields: dict) -> str:
    """One line; an event without a sentence of its own is shown as `event key=value ...`."""
    say = SENTENCES.get(event)
    if say is not None:
        return say(fields)
    return " ".join([event, *(f"{k}={v}" for k, v in fields.items())])
