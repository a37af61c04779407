"""A helper process that heartbeats for a worker whose collectives hold the GIL (pygloo).

While pygloo waits in a collective the worker's own heartbeat thread cannot run, and the
driver would take a rank waiting for a slow peer for a hung one. This process beats in its
place as long as the worker exists and is not stopped (SIGSTOP), so a frozen worker is still
evicted after the liveness timeout; it exits as soon as the worker is gone. The worker's own
thread keeps beating too: it is the one that hears round changes and host updates.

Run as `python -m hvdlite.worker.vouch PID` with the worker's environment.
"""
import os
import subprocess
import sys
import time

from hvdlite.worker import env
from hvdlite.worker.kvclient import KVClient, KVError
from hvdlite.worker.session import HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT


def start(environ) -> subprocess.Popen:
    """Start the helper for this process (environ: the worker's, with the driver's address)."""
    return subprocess.Popen([sys.executable, "-m", "hvdlite.worker.vouch", str(os.getpid())],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=environ)


def _running(pid: int) -> bool:
    """False once the worker is gone (or a zombie), or while it is stopped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("T", "t", "Z", "X")


def main(pid: int) -> None:
    environ = os.environ
    client = KVClient(environ[env.RENDEZVOUS_ADDR], int(environ[env.RENDEZVOUS_PORT]),
                      environ[env.SECRET], timeout=HEARTBEAT_TIMEOUT)
    query = {"slot": environ.get(env.SLOT, "")}
    while os.getppid() == pid:
        if _running(pid):
            try:
                client.request("PUT", "/rdzv/heartbeat", query=query)
            except (OSError, KVError):
                pass  # no contact this time; the worker's own liveness check decides
        time.sleep(HEARTBEAT_INTERVAL)


if __name__ == "__main__":
    main(int(sys.argv[1]))
