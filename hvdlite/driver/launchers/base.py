"""What every launcher is and gives back.

A launcher starts one worker process on a host and returns a Handle. Each kind lives in a
file of its own (local.py, ssh/, ...) and is registered by name in launchers/__init__.py;
how the process starts (plainly, or forked from a preloaded template) is start.py's concern.
"""
import signal
from typing import Optional, Protocol


class LaunchError(Exception):
    """A worker could not be started; the message is one line that says why."""


class TemplateGone(LaunchError):
    """The template that was to fork the worker died first: neither the worker's failure nor
    its host's (the host answered); the worker is launched again."""


class StartTimedOut(LaunchError):
    """The launcher did not start the worker in time (Ray found no room for its actor, srun's
    step waited): the launcher's trouble, not the host's; the slot is tried again later."""


class Handle(Protocol):
    """A started worker. Every method is safe to call after the worker ended."""
    started: str            # how it started, for the event log: "process", "template", "ssh", ...
    error: Optional[str]    # why it counts as failed without an exit status, or None

    @property
    def pid(self) -> int: ...  # the worker's process (group) id on its host

    def poll(self) -> Optional[int]:
        """Exit code, minus the signal number for a signal death, or None while running."""

    def wait(self, timeout: float) -> Optional[int]:
        """As poll, once the worker ended or `timeout` seconds passed."""

    def signal(self, sig) -> None:
        """Send `sig` to the worker's whole process group (best effort)."""

    def stop(self, grace: float = 3.0) -> None:
        """TERM the process group, KILL it after `grace` seconds, then finish the output."""

    def finish_output(self, timeout: float = 2.0) -> None:
        """Wait up to `timeout` seconds for the worker's last lines to be printed."""


class Launcher(Protocol):
    # Whether a launch reaches its host where nobody else reads it (this machine, SSH); if not,
    # it carries a one-time claim of the job's secret instead of the secret (driver/claims.py).
    private: bool

    def is_local(self, host: str) -> bool:
        """Whether workers on `host` run on this machine (and reach the driver on loopback)."""

    def route_to(self, host: str) -> str:
        """This machine's address that workers on `host` reach the driver at."""

    def claims_from(self, host: str):
        """(A launcher that is not private.) The addresses a claim from a worker on `host` may
        come from, or None where this launcher cannot know them (any is accepted)."""

    def start(self, host: str, env: dict, output, joining: bool, local_workers: int) -> Handle:
        """Start a worker on `host` with `env`; returns once its process runs. `joining`: the
        job runs already (not its first world); `local_workers`: the slots of its host."""

    def warm(self) -> None:
        """Get ready for joins (start templates) in the background."""

    def close(self) -> None: ...


def term_then_kill(handle: Handle, grace: float) -> None:
    """TERM a running worker, KILL it when it did not end within `grace` seconds."""
    if handle.poll() is None:
        handle.signal(signal.SIGTERM)
        if handle.wait(grace) is None:
            handle.signal(signal.SIGKILL)
            handle.wait(5.0)
