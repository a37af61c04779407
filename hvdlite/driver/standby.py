"""A standby driver: `hvdlite run --standby`, the job's own command, on another host.

While another driver holds the job's lease the standby starts nothing and decides nothing: it
asks the store who holds the lease every POLL seconds and says so in one line whenever that
changes. Once no live lease is left (the active driver's process or host was lost and its lease
lapsed, the ttl it renews, or that driver ended and released it) it goes on as a second run of
the same command does: it takes the lease and, from the journal, the live workers.
"""
import time

POLL = 0.25  # seconds between looks at the lease: a take-over starts this soon after it lapsed


def wait_for_lease(store, say, stopped=lambda: False, poll: float = POLL) -> None:
    """Return once no live lease holds the job in `store`, saying what the standby waits for;
    `stopped()` true (the driver was asked to stop) ends the wait early, too."""
    seen = None
    while not stopped():
        try:
            held = store.holder()
        except OSError as e:  # etcd unreachable (a FileStore's disk error): nothing to take yet
            held = e
        if held is None:
            if seen is not None:
                say("standby: the lease lapsed; this driver takes the job over")
            return
        if repr(held) != repr(seen):
            say(f"standby: the store does not answer ({held}); waiting" if isinstance(held, OSError)
                else f"standby: {held.owner} leads the job (lease {held.epoch}); this driver takes "
                     f"it over when that lease lapses")
            seen = held
        time.sleep(poll)
