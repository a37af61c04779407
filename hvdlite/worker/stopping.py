"""Leaving at a commit (torch-free): SIGTERM to an elastic worker (a spot reclaim, a pod
eviction, `scancel` of one step), or the driver's word that the job stops (a signal to it).

A SIGTERM marks this worker as leaving; at its next commit every rank agrees on it
(State.check_host_updates), the others re-form without it from that very commit, and it
exits with exitcodes.LEFT, which the driver takes for neither a failure nor a success. A worker
that is not training in a world (still starting, or between worlds) leaves at once: it holds
nothing that is not committed. A second SIGTERM ends the process at once, as if unhandled.

SIGUSR1 to a worker announces the end of the whole allocation (Slurm's `--signal=USR1@T`
signals every job step, not the batch shell the driver runs in): the worker asks the driver
for the job's graceful stop, as a SIGUSR1 to the driver would.
"""
import os
import signal
import threading

from hvdlite import exitcodes

requested = False  # a SIGTERM came: leave at the next commit
at_work = False  # run()'s function is running in a world: a commit will come
exiting = False  # the worker is on its way out: a SIGTERM has nothing left to stop


def install(ask_stop) -> None:
    """Handle SIGTERM and SIGUSR1 as above; only the main thread may (elsewhere both keep
    their default action). `ask_stop()` asks the driver for the job's graceful stop."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_term)
        # The request runs off the handler: the main thread may be inside a collective.
        signal.signal(signal.SIGUSR1, lambda signum, frame: threading.Thread(
            target=ask_stop, daemon=True, name="hvdlite-ask-stop").start())


def _on_term(signum, frame):
    global requested
    if requested:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    requested = True
    if not at_work and not exiting:
        leave()


def on_exit() -> None:
    """The worker exits now (its exit hooks run, or it ends on purpose): a SIGTERM from the
    driver ending the job must not raise in the middle of it (an exit hook would print the
    traceback); a second one still ends the process at once."""
    global exiting
    exiting = True


def leave():
    """Exit at a commit (atexit still flushes the checkpoint writer)."""
    raise SystemExit(exitcodes.LEFT)
