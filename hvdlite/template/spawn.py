"""`python -m hvdlite.template.spawn --socket PATH [--answer-timeout S] -- PYTHON script.py args...`

The SSH launcher (and a Ray slot's actor) runs this on a remote host in place of the worker
command, started as the worker would be (environment, working directory, stdin from
/dev/null). It hands the host's template its stdout, stderr, environment and directory to fork
the worker with, then ends as the worker ends: the same exit code, or death by the same
signal, so the SSH session reports what a plain launch would. If this process dies, the
template kills the worker's process group.

Before any output of the worker, one line `MARK PID:START template` (written by the forked
worker) tells the driver the process group to signal, and the start time that tells that
process from a later one of the same pid (procstat.identity). When the template cannot fork it
(not running, refused), this process says `MARK PID:START plain REASON` and becomes the worker
itself (exec keeps both). When
the template dies, before it forked the worker or after (taking the worker along), this
process's last line is TEMPLATE_DIED: the driver launches the worker again without holding
the template's death against it or its host. A template that does not answer the request
within S seconds (hung, stopped) is given up: this process hangs up (a template that wakes
later kills what it forks for it, as for any client gone) and starts the worker plainly
(`plain` says why), within the launch's own start timeout, which would fail the launch and
blacklist the host.
Torch-free and quick to start: it runs on every remote join.
"""
import os
import resource
import signal
import socket
import sys

from hvdlite import procstat
from hvdlite.template import wire

MARK = "__hvdlite_pgid__"
TEMPLATE_DIED = f"{MARK} template-died"
NO_ANSWER = "the template did not answer within"  # how a `plain` reason starts when it hung
REFUSED = "the template refused"  # ... when it serves, but not this command
USAGE = "usage: python -m hvdlite.template.spawn --socket PATH [--answer-timeout SECONDS] -- COMMAND..."


def mark() -> str:
    """This process's word in its marker: PID:START."""
    return procstat.identity(os.getpid()) or str(os.getpid())


def marked(word: str):
    """(the process group, the identity of its leader or None) a marker's word names."""
    pgid, _, start = word.partition(":")
    return int(pgid), word if start else None


def plain(command, reason: str) -> int:
    """Become the worker, as the launcher would have started it without a template."""
    os.write(1, f"{MARK} {mark()} plain {' '.join(reason.split())}\n".encode())
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; a plain exec does not
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvp(command[0], command)
    except OSError as e:
        sys.stderr.write(f"hvdlite: cannot run {command[0]}: {e.strerror}\n")
    return 127


def mirror(code: int) -> None:
    """End as the worker ended: its exit code, or the signal that killed it."""
    if code >= 0:
        os._exit(code)
    sig = -code
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the worker's core, not this process's
    try:
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL and SIGSTOP cannot be caught: default already
        pass
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal that does not end a process by default


def request(command) -> dict:
    return {"op": "spawn", "id": 0, "argv": list(command), "env": dict(os.environ),
            "cwd": os.getcwd(), "mark": MARK}


def _arguments(argv):
    """(socket path, answer timeout or None, command), or None if argv is not as USAGE says."""
    answer = None
    if argv[2:3] == ["--answer-timeout"] and len(argv) > 4:
        try:
            answer = float(argv[3])
        except ValueError:
            return None
        argv = argv[:2] + argv[4:]
    if len(argv) < 4 or argv[0] != "--socket" or argv[2] != "--":
        return None
    return argv[1], answer, argv[3:]


def main(argv) -> int:
    parsed = _arguments(argv)
    if parsed is None:
        sys.stderr.write(USAGE + "\n")
        return 2
    path, answer, command = parsed
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        wire.send(conn, request(command), fds=(1, 2))
    except OSError as e:
        conn.close()
        return plain(command, f"no template at {path}: {e.strerror or e}")
    reader = wire.Reader(conn)
    conn.settimeout(answer)  # for `started` or `refused`; the worker's exit may take days
    while True:
        try:
            more = reader.read_once()
        except socket.timeout:
            conn.close()
            return plain(command, f"{NO_ANSWER} {answer:g} s")
        except OSError:
            more = False
        for header, _, _ in reader.frames():
            if header.get("op") == "started":
                conn.settimeout(None)
            if header.get("op") == "refused":
                conn.close()
                return plain(command, f"{REFUSED}: {header.get('reason')}")
            if header.get("op") == "exit":
                mirror(header["code"])
        if not more:
            break
    # The template died, and its children with it (parent-death signal): -9, as on this machine.
    # Whether it forked the worker first is not known here: a child it forked may have printed
    # its marker and died before the template said `started`.
    os.write(1, f"{TEMPLATE_DIED}\n".encode())
    mirror(-signal.SIGKILL)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
