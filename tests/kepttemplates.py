"""The kept templates a test session or a test started (`--keep-warm`): found by the line each
writes to its log as it starts serving, ended with the workers they still have."""
import glob
import os
import re
import signal


def pids(pattern: str) -> list:
    """The kept templates whose logs match the glob `pattern` (`FOLDER/warm-*.log`)."""
    found = []
    for log in glob.glob(pattern):
        with open(log) as f:
            found += [int(p) for p in re.findall(r"kept template (\d+) serves", f.read())]
    return found


def end(pattern: str) -> None:
    for pid in pids(pattern):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmd:
                if b"hvdlite.template" not in cmd.read():
                    continue  # it left after its idle time; the pid is another's now
            os.killpg(pid, signal.SIGKILL)  # its own session: it and its forks
        except OSError:
            pass
