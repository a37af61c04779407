"""The socket the driver probes to tell this worker's lost node from a paused worker
(driver/probe.py): listening, never read. The kernel completes a connect to it while this
process is stopped or starved of CPU, and refuses one once the process is gone; nothing
answers when the node is. A thread accepts and closes what comes, so the backlog never fills.
"""
import os
import socket
import threading

# Connects waiting while this process is stopped: three per probe, and a suspect is probed
# about 17 times in 10 minutes (decisions/nodeloss.py).
BACKLOG = 128


def listen(session) -> None:
    """Listen at this host's address on the route to the driver and tell the driver where;
    without it (an error, an old driver) the liveness timeout alone decides, as before."""
    try:
        addr = session.local_address(0)
        sock = socket.create_server((addr, 0), backlog=BACKLOG)
        # A child the worker forks (a DataLoader's workers) would keep it listening once the
        # worker is gone: its probes would answer until the liveness timeout.
        os.register_at_fork(after_in_child=sock.close)
        threading.Thread(target=_drain, args=(sock,), daemon=True, name="hvdlite-probed").start()
        session.probed = (addr, sock.getsockname()[1])
    except Exception:  # noqa: BLE001 - probing is a shortcut, never a condition to run
        return
    announce(session)


def announce(session) -> None:
    """Tell the driver where the socket listens: at the start, and again to a driver that took
    the job over (worker/session.py)."""
    if getattr(session, "probed", None) is None:
        return
    addr, port = session.probed
    try:
        session.client.request("PUT", "/node/listening", timeout=5.0,
                               query={"worker": session.worker, "addr": addr, "port": str(port)})
    except Exception:  # noqa: BLE001 - probing is a shortcut, never a condition to run
        pass


def _drain(sock):
    while True:
        try:
            sock.accept()[0].close()
        except OSError:
            pass


def report_broken(session, peers) -> None:
    """Tell the driver, off this thread, that a collective failed on the connections to the
    peers at these addresses: it probes their nodes at once (decisions/nodeloss.py)."""
    def tell():
        try:
            for peer in sorted(peers):
                session.client.request("PUT", "/node/link_broken", timeout=2.0,
                                       query={"worker": session.worker, "peer": peer})
        except Exception:  # noqa: BLE001 - the heartbeats still tell the driver, later
            pass
        finally:
            session.client.close()  # this thread's connection (see links.py)
    threading.Thread(target=tell, daemon=True, name="hvdlite-link-broken").start()
