"""A standby driver: `hvdlite run --standby`, the job's own command, on another host.

While another driver holds the job's lease the standby starts nothing and decides nothing: it
tries to take the lease every POLL seconds and says who holds it in one line whenever that
changes. Once a try succeeds (the active driver's process or host was lost and its lease lapsed,
the ttl it renews, or that driver ended and released it) it goes on as a second run of the same
command does: from the journal it takes the live workers over (job.py, leadership.py).
"""
import time

from hvdlite.driver.leadership import NotLeader

POLL = 0.25  # seconds between tries: a take-over starts this soon after the lease lapsed


def lead(take, store, say, stopped=lambda: False, poll: float = POLL):
    """What `take()` returns (leadership.Leadership.take) once it does not raise NotLeader;
    None when `stopped()` (the driver was asked to stop while it waited). A store that does not
    answer (OSError: etcd unreachable) is waited out too."""
    seen = None
    while not stopped():
        try:
            leader = take()
        except NotLeader:
            held = _holder(store)
        except OSError as e:
            held = e
        else:
            if seen is not None:
                say("standby: the lease lapsed; this driver takes the job over")
            return leader
        if held is not None and repr(held) != repr(seen):
            say(f"standby: the store does not answer ({held}); waiting" if isinstance(held, OSError)
                else f"standby: {held.owner} leads the job (lease {held.epoch}); this driver takes "
                     f"it over when that lease lapses")
            seen = held
        time.sleep(poll)
    return None


def _holder(store):
    try:
        return store.holder()
    except OSError as e:
        return e
