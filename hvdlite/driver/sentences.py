"""The driver's events as sentences for people: `sentence("worker_exit", fields)` ->
"rank 2 on host-a was killed by SIGKILL". The event log keeps the fields as they are."""
from hvdlite import exitcodes
from hvdlite.driver.decisions.core import describe_exit
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
    if f.get("left"):
        return f"{_who(f)} left the job at a commit (SIGTERM, or the job stopping)"
    code = f.get("code", 0)
    if code == 0:
        return f"{_who(f)} finished"
    why = f" ({f['error']})" if f.get("error") else ""
    return f"{_who(f)} {describe_exit(code)}{why}"


def _round_complete(f):
    size = f.get("size", 0)
    start = f"world {f.get('round')} formed: " + _plural(size, "worker")
    if f.get("round") == 1:
        return f"{start} start training"
    text = f"{start} go on from commit {f.get('commit', 0)}"
    if f.get("reformed_in") is not None:
        after = "the failure" if f.get("cause") == "failure" else "the host update"
        text += f" (re-formed in {f['reformed_in']:.2f} s after {after})"
    return text


def _hosts_changed(f):
    parts = []
    if f.get("added"):
        parts.append(f"added {_names(f['added'])}")
    if f.get("removed"):
        parts.append(f"removed {_names(f['removed'])}")
    return f"hosts changed: {'; '.join(parts) or f.get('kind', '?')}; now {_names(f.get('hosts', []))}"


def _job_end(f):
    result = f.get("result")
    if result == "success":
        resets = f.get("resets")
        return "job finished" + (f" after {_plural(resets, 'reset')}" if resets is not None else "")
    if result == "interrupted":
        return f"job interrupted by {f.get('signal')}"
    if result == "stopped":
        late = f" ({_names(f['late'])} reached no commit in time: killed)" if f.get("late") else ""
        if f.get("resumable"):
            return f"job stopped by {f.get('signal')} at commit {f.get('commit')}{late}; its checkpoint " \
                   f"is in --checkpoint-dir: run the same command again to resume (exit {exitcodes.RESUMABLE})"
        return f"job stopped by {f.get('signal')} at commit {f.get('commit')}{late}; without " \
               f"--checkpoint-dir nothing was saved"
    return f"job failed: {f.get('reason')}"


def _workers_failed(f):
    workers = f.get("workers", [])
    return f"{_plural(len(workers), 'slot')} had failed workers during the job: " + "; ".join(
        f"{w.get('slot')} {_plural(w.get('times', 1), 'time')} (first: {w.get('reason')})" for w in workers)


_SENTENCES = {
    "worker_start": lambda f: f"{_who(f)} started (pid {f.get('pid')}, {f.get('started', 'process')})",
    "worker_exit": _worker_exit,
    "launch_failed": lambda f: f"worker {f.get('slot')} could not be launched: {f.get('error')}",
    "round_complete": _round_complete,
    "round_broken": lambda f: f"world {f.get('round')} broke; the survivors roll back to their last commit",
    "hosts_changed": _hosts_changed,
    "hosts_updated": lambda f: f"workers told to re-form at their next commit: {f.get('reason')}",
    "blacklisted": lambda f: f"{f.get('key')} blacklisted ({f.get('cooldown')})",
    "whitelisted": lambda f: f"{f.get('key')} is usable again (cooldown over)",
    "worker_unresponsive": lambda f: f"{_who(f)} is unresponsive ({f.get('reason')}); killing it",
    "worker_start_timeout": lambda f: f"{_who(f)} did not start in time ({f.get('reason')}); killing it",
    "commit_lost": lambda f: f"every holder of commit {f.get('newest')} is gone; "
                             f"going on from commit {f.get('resumed')}",
    "waiting_for_workers": lambda f: f"waiting for workers: {f.get('ready')} ready, "
                                     f"--min-np {f.get('min_np')}",
    "discovery_failed": lambda f: f"host discovery failed: {f.get('error')}; retrying",
    "job_end": _job_end,
    "stop_requested": lambda f: f"{f.get('signal')}: every worker stops at its next commit (within "
                                f"{f.get('timeout'):g} s; a second signal stops them at once)",
    "worker_stop_timeout": lambda f: f"{_who(f)} reached no commit in time ({f.get('reason')}); killing it",
    "workers_failed": _workers_failed,
}


def sentence(event: str, fields: dict) -> str:
    """One line; an event without a sentence of its own is shown as `event key=value ...`."""
    say = _SENTENCES.get(event)
    if say is not None:
        return say(fields)
    return " ".join([event, *(f"{k}={v}" for k, v in fields.items())])
