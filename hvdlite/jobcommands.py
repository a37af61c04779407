"""The job's command lines as the driver runs them, checked before the job starts: the training
command every worker runs and the host discovery command (`hvdlite run`'s COMMAND and
--host-discovery-script). A mistake in either would otherwise fail in every worker, or in every
discovery run."""
import os
import re
import shlex
import shutil
import sys

from hvdlite.errors import UsageError


def training_command(command) -> list:
    """The command as the workers run it. A first word naming a .py file runs it with the
    driver's Python (the same interpreter path on remote hosts)."""
    program = command[0]
    if program.endswith(".py") and shutil.which(program) is None:
        if not os.path.isfile(program):
            raise UsageError(f"training script not found: {program}")
        return [sys.executable, *command]
    if os.sep in program:
        if not os.path.isfile(program):
            raise UsageError(f"training command not found: {program}")
        _executable(program, "training command", f"`sh {program}`, `python3 {program}`")
    elif shutil.which(program) is None:
        if os.path.isfile(program):
            # Not executable is said first, as for ./program: writing ./program alone would not do.
            _executable(program, "training command", f"`sh {program}`, `python3 {program}`")
            raise UsageError(f"{program} is in this folder, not on PATH: write ./{program}")
        raise UsageError(f"training command not found on PATH: {program}")
    # `python script.py`: a missing script would only fail inside every worker.
    if os.path.basename(program).startswith("python") and len(command) > 1:
        script = command[1]
        if not script.startswith("-") and not os.path.isfile(script):
            raise UsageError(f"training script not found: {script}")
    return list(command)


def discovery_command(script: str) -> str:
    """The discovery command line, its first word found in the current folder when it names a
    file there rather than a program on PATH (`discover.sh` as well as `./discover.sh`); a
    first word naming a .py file that is not a program on PATH runs with the driver's Python."""
    first = re.match(r"\s*(\S+)", script)
    if first is None:
        raise UsageError("--host-discovery-script is empty")
    word = first.group(1)
    rest = script[first.end():]
    if word.endswith(".py") and shutil.which(word) is None and os.path.isfile(word):
        # As for the training command: a .py file runs with the driver's Python.
        return f"{shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(word))}{rest}"
    if shutil.which(word) is not None or not os.path.isfile(word):
        return script
    _executable(word, "host discovery script", f"--host-discovery-script 'sh {word}'")
    return script if os.sep in word else shlex.quote(os.path.abspath(word)) + rest


def _executable(path: str, what: str, instead: str) -> None:
    """The one error for a file that cannot be run as it is named (`x.sh` and `./x.sh` alike)."""
    if not os.access(path, os.X_OK):
        raise UsageError(f"{what} {path} is not executable: run `chmod +x {path}` (it then needs a "
                         f"#! line), or name its interpreter: {instead}")
