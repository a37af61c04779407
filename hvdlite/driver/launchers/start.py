"""How a worker's process starts, whatever launcher carries it there: plainly, or forked from
a template that imported the heavy modules already (hvdlite.template).

Workers that join a running job fork from a template (all workers with --preload). When workers
may join, a host's template starts with the first world, so that an early join need not wait
for its imports (see fork_first_world). With --keep-warm local workers fork from a kept
template once one serves (local.py).
"""
import os


def fork_first_world(local_workers: int, cores: int) -> bool:
    """Whether a host's first workers fork from its template (when workers may join, so that
    the template starts with the job). Below one worker per core they import in parallel with
    the template, on cores nobody else uses; from one per core on, their imports would share
    the cores with the template's, and one import plus forks is faster than as many imports as
    workers."""
    return local_workers >= cores


def spawn_argv(command, socket_path: str, start_timeout: float = None) -> list:
    """The argv that has the template listening at `socket_path` fork `command`; the spawn
    client starts it plainly when the template cannot, or has not answered within half of
    the launch's `start_timeout` (None: no bound), so that the plain start still starts in time."""
    answer = [] if start_timeout is None else ["--answer-timeout", f"{start_timeout / 2:g}"]
    return [command[0], "-m", "hvdlite.template.spawn", "--socket", socket_path, *answer, "--", *command]


class StartRule:
    """Whether a worker forks from its host's template, from the job's settings."""

    def __init__(self, settings):
        self.preload = tuple(settings.preload or ())
        self.preload_first = settings.preload_first
        self.keep_warm = bool(settings.keep_warm)
        self.joins_possible = settings.joins_possible
        self.cores = len(os.sched_getaffinity(0))

    def fork_locally(self, joining: bool, local_workers: int) -> bool:
        return bool(self.preload) and (joining or self.preload_first or (
            self.joins_possible and fork_first_world(local_workers, self.cores)))

    def template_remotely(self, joining: bool) -> bool:
        """Whether a launch on a remote host starts its template when none runs yet."""
        return bool(self.preload) and (joining or self.preload_first)
