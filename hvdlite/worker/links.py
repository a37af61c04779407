"""The TCP connections of the current collective group, and cutting them (torch-free).

Cutting is the one way to unblock a stuck gloo collective (see sockets.py). It happens on
abort() after a failed collective, and from the heartbeat thread as soon as the driver says
the group's round fell apart, so that no survivor waits for a gloo timeout.
"""
import contextlib
import threading

from hvdlite.worker import sockets


def broken(round_number, newest_broken) -> bool:
    # Elastic rounds count from 1; a static job's world (round 0) is never given up.
    return round_number is not None and 0 < round_number <= newest_broken


class Links:
    def __init__(self):
        self._round, self._fds = None, set()
        self._lock = threading.Lock()

    def attach(self, session, world=None):
        """The WorldInfo to join (the launch assignment unless given); from now on the
        driver's word that a round broke cuts this group's connections if it is theirs."""
        session.on_round_broken = self.on_round_broken
        return world or session.assignment()

    @contextlib.contextmanager
    def recording(self, round_number, session):
        """Remember the sockets the group formed inside this block opened (not the driver's)."""
        before = sockets.socket_fds()
        yield
        fds = sockets.tcp_fds(sockets.socket_fds() - before, exclude_peer=(session.addr, session.port))
        with self._lock:
            self._round, self._fds = round_number, fds

    def current(self):
        """(round, socket fds) of the group, for a helper process that watches them (vouch)."""
        with self._lock:
            return self._round, set(self._fds)

    def cut(self) -> None:
        """Fail every pending and future collective of the group, here and on its peers."""
        with self._lock:
            sockets.cut(self._fds)

    def on_round_broken(self, newest_broken: int) -> None:
        with self._lock:
            if broken(self._round, newest_broken):
                sockets.cut(self._fds)

    def forget(self) -> None:
        with self._lock:
            self._round, self._fds = None, set()
