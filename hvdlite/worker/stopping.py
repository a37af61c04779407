"""Leaving at a commit (torch-free): SIGTERM to an elastic worker (a spot reclaim, a pod
eviction, `scancel` of one step), or the driver's word that the job stops (a signal to it).

A SIGTERM marks this worker as leaving; at its next commit every rank agrees on it
(State.check_host_updates), the others re-form without it from that very commit, and it
exits with exitcodes.LEFT, which the driver takes for neither a failure nor a success. It goes
through the rendezvous first and says it leaves (PUT /rdzv/leaving): when nobody else holds its
commit, nor the disk, the driver has it hand the state over in one more world before it goes.
A worker between worlds inside run() says so at once, and the driver answers its wait; one
that never was in a world leaves at once: it holds nothing the disk lacks. A second SIGTERM
ends the process at once, as if unhandled.

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
holding = False  # inside run(): it may hold the only copy of the newest commit
exiting = False  # the worker is on its way out: a SIGTERM has nothing left to stop
_tell = None  # tell(what): PUT /rdzv/<what> to the driver


def install(tell) -> None:
    """Handle SIGTERM and SIGUSR1 as above; only the main thread may (elsewhere both keep
    their default action). `tell("stop")` asks the driver for the job's graceful stop,
    `tell("leaving")` says this worker leaves."""
    global _tell
    if threading.current_thread() is threading.main_thread():
        _tell = tell
        signal.signal(signal.SIGTERM, _on_term)
        signal.signal(signal.SIGUSR1, lambda signum, frame: _off_handler("stop"))


def _off_handler(what):
    # The request runs off the handler: the main thread may be inside a collective.
    threading.Thread(target=_tell, args=(what,), daemon=True, name=f"hvdlite-tell-{what}").start()


def _on_term(signum, frame):
    global requested
    if requested:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    requested = True
    if at_work or exiting:
        return
    if holding:  # the driver answers its wait: go, or one more world that takes its state
        return _off_handler("leaving")
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
