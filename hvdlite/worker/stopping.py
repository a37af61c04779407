"""Leaving at a commit (torch-free): SIGTERM to an elastic worker (a spot reclaim, a pod
eviction, `scancel` of one step), or the driver's word that the job stops (a signal to it).

A SIGTERM marks this worker as leaving; at its next commit every rank agrees on it
(State.check_host_updates), the others re-form without it from that very commit, and it
exits with exitcodes.LEFT, which the driver takes for neither a failure nor a success. A worker
that is not training in a world (still starting, or between worlds) leaves at once: it holds
nothing that is not committed. A second SIGTERM ends the process at once, as if unhandled.
"""
import os
import signal
import threading

from hvdlite import exitcodes

requested = False  # a SIGTERM came: leave at the next commit
at_work = False  # run()'s function is running in a world: a commit will come


def install() -> None:
    """Handle SIGTERM as above; only the main thread may (elsewhere SIGTERM keeps killing)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_term)


def _on_term(signum, frame):
    global requested
    if requested:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    requested = True
    if not at_work:
        leave()


def leave():
    """Exit at a commit (atexit still flushes the checkpoint writer)."""
    raise SystemExit(exitcodes.LEFT)
