"""The errors that end `hvdlite run`: each is one line for the user and has an exit code."""
from hvdlite import exitcodes


class HvdliteError(Exception):
    """Ends the command with this one-line message and `exit_code`."""
    exit_code = 1


class UsageError(HvdliteError):
    """Bad flags or an impossible request."""
    exit_code = 2


class JobError(HvdliteError):
    """The job cannot go on."""


class Unloadable(JobError):
    """A worker cannot load the checkpoint it found in --checkpoint-dir."""
    exit_code = exitcodes.UNLOADABLE


def first_line(error: Exception) -> str:
    """The first line of an error's message, or its type's name when it has none."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
