"""A process's state as /proc/PID/stat tells it, for whoever watches a process it cannot wait
for: the driver (a template's child, a starting worker's wait for a CPU), the worker's vouch
helper (its worker) and a Ray slot's actor (its node's template). Standard library only: it
runs on every side.

The command name (field 2) is in parentheses and may hold spaces or ")", so the fields are read
after the last ")".
"""
import os

GONE = ("Z", "X")  # zombie or dead: exited, whether or not anybody reaped it
STOPPED = ("T", "t")  # stopped by a signal or traced
PF_EXITING = 0x4  # in the flags (field 9): set as the process starts to exit


def stat_fields(pid: int):
    """The fields after the command name, state first (field 3 onwards), or None when there
    is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return fields_of(f.read())
    except OSError:
        return None


def fields_of(stat: str):
    """stat_fields of a /proc/PID/stat line read elsewhere (on another host), or None."""
    try:
        return stat.rsplit(")", 1)[1].split() or None
    except IndexError:
        return None


def state(pid: int) -> str:
    """The state letter ("R", "S", "T", "Z", ...); "X" when there is no such process."""
    fields = stat_fields(pid)
    return fields[0] if fields else "X"


def exiting(pid: int) -> bool:
    """The process is gone, a zombie, or on its way out (PF_EXITING is set before it closes its
    descriptors)."""
    fields = stat_fields(pid)
    return fields is None or fields[0] in GONE or bool(int(fields[6]) & PF_EXITING)


def identity(pid: int, stat: str = None):
    """"PID:STARTTIME" (field 22, clock ticks since boot): one process, as a pid given out
    again is another; None when there is no such process or it exited (a zombie nobody reaped:
    an orphan's, where PID 1 reaps slowly or never). From `stat`, its /proc/PID/stat line as
    read on another host, when given."""
    fields = stat_fields(pid) if stat is None else fields_of(stat)
    return f"{pid}:{fields[19]}" if fields and len(fields) > 19 and fields[0] not in GONE else None


def runs(name: str) -> bool:
    """Whether the process an identity ("PID:STARTTIME") names still runs on this host; False
    for a name of another form (an srun step's JOB.STEP)."""
    pid = name.partition(":")[0]
    return pid.isdigit() and identity(int(pid)) == name


def age(pid: int) -> float:
    """Seconds since the process started (its start time and the uptime both count from boot;
    10 ms steps)."""
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - int(stat_fields(pid)[19]) / os.sysconf("SC_CLK_TCK")


def run_wait(pid: int):
    """Seconds the process waited for a CPU while it could run, since it started: the most any
    of its live threads waited (/proc/PID/task/TID/schedstat's second field, nanoseconds on
    the run queue; a CFS quota's throttled time counts, measured here). None when there is no
    such process or the kernel keeps no such count."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    waits = []
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                waits.append(int(f.read().split()[1]))
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return max(waits) / 1e9 if waits else None
