"""Victims that die (SIGKILL) while a world's gloo group connects, shared by the numpy and torch
twins (numpy_connect_victim.py, torch_connect_victim.py). VICTIMS="slot@round,...": that slot
dies in the connect of that round (default localhost/2@1, the first world); each appends its
slot to the file $VICTIM_MARK first. With VICTIM_LINGER=seconds a victim first closes the
sockets its pairs listen on, so that a peer connecting to it is refused at once, and dies that
much later: the driver hears of the death after the peer's connect failed."""
import os
import signal
import socket
import time

from hvdlite.worker import sockets

VICTIMS = dict(v.split("@") for v in os.environ.get("VICTIMS", "localhost/2@1").split(","))
SLOT = os.environ["HVDLITE_SLOT"]


def doomed_scope():
    """The KV scope of the group this worker dies connecting, or None."""
    return f"gloo.{VICTIMS[SLOT]}" if SLOT in VICTIMS else None


def die():
    with open(os.environ["VICTIM_MARK"], "a") as f:
        f.write(SLOT + "\n")
    linger = float(os.environ.get("VICTIM_LINGER", "0"))
    if linger:
        close_listeners()
        time.sleep(linger)
    os.kill(os.getpid(), signal.SIGKILL)


def close_listeners():
    for fd, _ in sockets.open_sockets():
        try:
            with socket.socket(fileno=os.dup(fd)) as s:
                listens = s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        except OSError:
            continue
        if listens:
            os.close(fd)
